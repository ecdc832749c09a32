//! `glmc run`: prefill a prompt, then decode one token at a time through the `decode` graph and
//! the caches, on the CPU reference interpreter or on the GPU, each next token taken from the
//! graph's `next_token` (greedy at temperature 0). Several prompts are a batch: each is
//! prefilled into a cache slot of its own, then every step decodes all unfinished sequences in
//! one call. With `--tp N` the N ranks' graphs run together, their collectives simulated between
//! threads; `--trace` records every rank, its entries tagged with the rank, so `compare-trace`
//! lines each rank up with a TP=1 trace. On GPUs `--tp N` runs each rank's artifact on its own
//! GPU with NCCL (see `tp_run`), and traces the same way. On the GPU, `run` compiles the model for the GPU
//! present (nvcc's output cached by content hash, so a second run does not call it), or runs an
//! artifact directory of `glmc compile` as it is.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use glmc_codegen::artifact::{Manifest, MANIFEST_VERSION};
use glmc_codegen::{nvcc, Limits, Target};
use glmc_models::builder::{BuildOptions, LogitRows, Sampler};
use glmc_models::ModelConfig;
use glmc_passes::AttentionChoice;
use glmc_runtime::cuda::tp::{RankArtifact, TpExecutor};
use glmc_runtime::cuda::{random_fill, CudaExecutor, Gpu};
use glmc_runtime::trace::{check_finite, Fault, TraceHeader, TraceLayout, TraceWriter};
use glmc_runtime::{
    generate_batch, Checkpoint, Generator, InterpExecutor, RandomWeights, Sampling, WeightSource,
};
use tokenizers::Tokenizer;

use crate::cli::{DeviceArg, RunArgs};
use crate::compile::{build, Built};
use crate::tp_run::{self, Processes};

pub fn run(args: &RunArgs) -> anyhow::Result<()> {
    if args.no_cuda_graphs && args.device != DeviceArg::Cuda {
        bail!("--no-cuda-graphs chooses how the GPU runs decode steps: it needs --device cuda (the CPU interpreter has no CUDA graphs)");
    }
    if args.model.join("manifest.ron").is_file() {
        return run_artifact(args);
    }
    // Every position's logits only when they are written out; generation needs the last.
    let logits = match args.dump_logits {
        Some(_) => LogitRows::All,
        None => LogitRows::Last,
    };
    let options = BuildOptions {
        logits,
        sampler: sampler(args),
    };
    let built = build(&args.model, &options, &args.pipeline, None)?;
    // `dir` holds tokenizer.json and generation_config.json, which random weights do not replace.
    let (weights, dir) = match args.random_weights {
        Some(seed) => (
            Weights::Random(RandomWeights::new(seed, built.config.dtype)),
            args.model.is_dir().then(|| args.model.clone()),
        ),
        None => {
            let dir = weights_dir(args)?;
            let checkpoint = Checkpoint::open(&dir)?;
            // Every tensor is checked before any compute, so a bad checkpoint fails in a
            // second, not after a long prefill.
            crate::checkpoint::check(&built, &checkpoint)?;
            (Weights::Checkpoint(Arc::new(checkpoint)), Some(dir))
        }
    };
    let (tokenizer, prompts) = prompts(args, dir.as_deref())?;
    let batch = Batch::of(args, &prompts)?;
    let limits = batch.limits(args);
    batch.fits(args.max_batch, args.max_context, &limits)?;
    warn_if_dense_changes_outputs(&built, batch.context as usize - 1);
    let eos = eos_ids(&built.config, dir.as_deref())?;
    let ranks = glmc_passes::partition(&built.module, args.tp)?;
    let layout = trace_layout(args, &built.module)?;
    let fault = Fault::from_env();
    let mut generator = match args.device {
        DeviceArg::Cpu => {
            let exec = InterpExecutor::tensor_parallel(&ranks, weights.source())
                .with_max_context(limits.max_context as usize)
                .with_fault(fault);
            Generator::with_executor(Box::new(exec))?
        }
        DeviceArg::Cuda if args.tp > 1 => {
            let exec = tp_group(&built, &ranks, &weights, limits, args)?;
            Generator::with_executor(Box::new(exec))?
        }
        DeviceArg::Cuda => {
            let mut exec = cuda_executor(&built, &weights, limits, args)?;
            if observes(args) {
                exec.observe(&built.module)?;
            }
            let exec = exec.with_fault(fault).with_graphs(!args.no_cuda_graphs);
            Generator::with_executor(Box::new(exec))?
        }
    };
    let traced = (built.module.name.as_str(), layout);
    generate_and_print(
        args,
        &mut generator,
        &prompts,
        &eos,
        tokenizer.as_ref(),
        traced,
    )
}

/// What `--trace` records beyond each value's own digest: block digests of the values that
/// tensor parallelism splits (see `TraceWriter::create`), at TP=1 so that the ranks' traces of
/// a `--tp N` run line up with it, and at TP=N for each rank's block.
fn trace_layout(args: &RunArgs, module: &glmc_ir::Module) -> anyhow::Result<TraceLayout> {
    if args.trace.is_none() {
        return Ok(TraceLayout::default());
    }
    let split = glmc_passes::split_layout(module)?;
    Ok(TraceLayout {
        units: split.units,
        split: split.axes,
    })
}

/// `glmc run DIR` of an artifact `glmc compile -o DIR` wrote: its manifest, cubin and IR, with
/// the weights of --weights or --random-weights (an artifact holds none).
fn run_artifact(args: &RunArgs) -> anyhow::Result<()> {
    let dir = &args.model;
    if args.device != DeviceArg::Cuda {
        bail!(
            "{} is an artifact directory, which runs on the GPU it was compiled for: pass --device cuda, or give the model (its model.ron or checkpoint directory) to run on the CPU",
            dir.display()
        );
    }
    let processes = match args.tp {
        1 => None,
        _ => Some(Processes::from_args(args, |v| std::env::var(v).ok())?),
    };
    // An artifact of `glmc compile --tp N` holds each rank's in rankR/: this process runs its
    // own ranks'.
    let first_rank = processes
        .as_ref()
        .map_or(0, |p| p.placement(args.tp).first_rank);
    let rank_dirs: Vec<PathBuf> = match &processes {
        None => vec![dir.clone()],
        Some(p) => {
            let placement = p.placement(args.tp);
            (placement.first_rank..placement.first_rank + placement.gpus.len())
                .map(|r| dir.join(format!("rank{r}")))
                .collect()
        }
    };
    if !rank_dirs[0].join("manifest.ron").is_file() {
        bail!(
            "{} holds no rank artifacts (rank0/ …): it was compiled without --tp; recompile it with glmc compile --tp {}",
            dir.display(),
            args.tp
        );
    }
    let p = &args.pipeline;
    if p.dtype.is_some() || p.opt_level != 1 || !p.disable_pass.is_empty() || p.attention.is_some()
    {
        bail!(
            "--dtype, -O, --disable-pass and --attention choose how a model is compiled, and {} is compiled already: pass them to glmc compile, or run the model",
            dir.display()
        );
    }
    let manifests = rank_dirs
        .iter()
        .enumerate()
        .map(|(i, d)| read_manifest(d, args.tp, (first_rank + i) as u64))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let manifest = manifests[0].clone();
    let weights = match (args.random_weights, &args.weights) {
        (Some(seed), _) => Weights::Random(RandomWeights::new(seed, manifest.config.dtype)),
        (None, Some(w)) => Weights::Checkpoint(Arc::new(Checkpoint::open(w)?)),
        (None, None) => bail!(
            "{} is an artifact directory, which holds no weights: pass --weights DIR (the checkpoint of {}, with model.safetensors or model.safetensors.index.json) or --random-weights SEED",
            dir.display(),
            manifest.model
        ),
    };
    let mut artifacts = rank_dirs
        .iter()
        .zip(manifests)
        .map(|(d, manifest)| {
            let cubin = read_cubin(d, &manifest)?;
            // A rank's IR, with its `tp=` marks, names its nodes in a trace.
            let ir = match (&processes, observes(args)) {
                (Some(_), true) => Some(artifact_ir(d)?),
                _ => None,
            };
            Ok(RankArtifact {
                manifest,
                cubin,
                ir,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let cubin = artifacts[0].cubin.clone();
    let (tokenizer, prompts) = prompts(args, args.weights.as_deref())?;
    let limits = &manifest.limits;
    for (flag, asked, compiled, what) in [
        ("--max-batch", args.max_batch, limits.max_batch, "sequences"),
        (
            "--max-context",
            args.max_context,
            limits.max_context,
            "tokens of context",
        ),
    ] {
        if let Some(asked) = asked.filter(|&a| a > compiled) {
            bail!(
                "{flag} {asked} is more than the {compiled} {what} the artifact {} was compiled for: lower {flag}, or recompile with glmc compile {flag} {asked}",
                dir.display()
            );
        }
    }
    let batch = Batch::of(args, &prompts)?;
    if batch.longest > limits.max_prefill_tokens {
        bail!(
            "the prompt has {} tokens, the artifact was compiled for prefills of at most {}: recompile with a larger --max-prefill-tokens",
            batch.longest,
            limits.max_prefill_tokens
        );
    }
    batch.fits(args.max_batch, args.max_context, limits)?;
    let greedy_build = manifest
        .phases
        .iter()
        .all(|p| p.results.iter().all(|(name, _)| name != "logits"));
    if greedy_build && (args.temperature != 0.0 || args.dump_logits.is_some()) {
        bail!(
            "{} was compiled with --greedy: it returns no logits and always takes the most likely token, so it neither samples (--temperature) nor writes logits (--dump-logits); recompile it without --greedy",
            dir.display()
        );
    }
    let eos = eos_ids(&manifest.config, args.weights.as_deref())?;
    let traced = (manifest.model.as_str(), TraceLayout::default());
    if let Some(processes) = &processes {
        tp_run::check_host(args, processes)?;
        let random = match &weights {
            Weights::Random(r) => {
                let target: Target = manifest.target.parse()?;
                random_generator(args.nvcc.as_deref(), target)?.map(|cubin| (*r, cubin))
            }
            Weights::Checkpoint(_) => None,
        };
        let artifacts = std::mem::take(&mut artifacts);
        let exec = tp_run::start(
            args,
            processes,
            artifacts,
            tp_run::group_weights(weights.shared(), random),
        )?;
        let mut generator = Generator::with_executor(Box::new(exec))?;
        return generate_and_print(
            args,
            &mut generator,
            &prompts,
            &eos,
            tokenizer.as_ref(),
            traced,
        );
    }
    let mut exec = match &weights {
        Weights::Checkpoint(c) => CudaExecutor::load(&manifest, &cubin, c.as_ref())?,
        Weights::Random(r) => {
            let target: Target = manifest.target.parse()?;
            match random_generator(args.nvcc.as_deref(), target)? {
                Some(generator) => CudaExecutor::load_random(&manifest, &cubin, r, &generator)?,
                // Without a compiler for the generator kernel the same weights are made on
                // the host: slower, identical.
                None => CudaExecutor::load(&manifest, &cubin, r)?,
            }
        }
    };
    if observes(args) {
        exec.observe(&artifact_ir(dir)?)?;
    }
    let exec = exec
        .with_fault(Fault::from_env())
        .with_graphs(!args.no_cuda_graphs);
    let mut generator = Generator::with_executor(Box::new(exec))?;
    // The artifact's IR is optimised but not the builder's, so there is no split layout to
    // read: its trace lines up with others of one device.
    generate_and_print(
        args,
        &mut generator,
        &prompts,
        &eos,
        tokenizer.as_ref(),
        traced,
    )
}

/// The IR an artifact directory (or a rank's, `rankR/`) was lowered from, which `--trace` and
/// `--check-finite` name the GPU's nodes by.
fn artifact_ir(dir: &Path) -> anyhow::Result<glmc_ir::Module> {
    let ir = dir.join("ir/module.txt");
    let text = std::fs::read_to_string(&ir).with_context(|| {
        format!(
            "reading {}, which --trace and --check-finite name the GPU's nodes by: recompile the artifact",
            ir.display()
        )
    })?;
    glmc_ir::parse_module(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}: recompile the artifact", ir.display()))
}

/// The sampler the run's graph is built with: greedy, with no logits to return (so `lm_head`
/// fuses with the argmax), where the temperature is 0 and nothing reads the logits (neither
/// --dump-logits nor --trace or --check-finite, which see every node); with --tp the ranks each
/// hold part of the vocabulary, which the fused argmax does not combine.
fn sampler(args: &RunArgs) -> Sampler {
    let greedy = args.temperature == 0.0 && args.dump_logits.is_none() && !observes(args);
    if greedy && args.tp == 1 {
        Sampler::Greedy
    } else {
        Sampler::TopP
    }
}

/// Whether the run shows every node to its hook.
fn observes(args: &RunArgs) -> bool {
    args.trace.is_some() || args.check_finite
}

/// The tokenizer, when the prompts are text, and each prompt's token ids.
type Prompts = (Option<Tokenizer>, Vec<Vec<u64>>);

fn prompts(args: &RunArgs, dir: Option<&Path>) -> anyhow::Result<Prompts> {
    if args.prompt.is_empty() {
        let ids = args.prompt_ids.iter().map(|p| p.0.clone()).collect();
        return Ok((None, ids));
    }
    let Some(dir) = dir else {
        bail!(
            "--prompt TEXT needs the tokenizer.json of a checkpoint directory, and {} is not one: give token ids with --prompt-ids, or the checkpoint with --weights",
            args.model.display()
        );
    };
    let tok = load_tokenizer(dir)?;
    let mut prompts = Vec::with_capacity(args.prompt.len());
    for text in &args.prompt {
        let enc = tok
            .encode(text.as_str(), true)
            .map_err(|e| anyhow::anyhow!("tokenizing the prompt: {e}"))?;
        prompts.push(enc.get_ids().iter().map(|&i| i as u64).collect());
    }
    Ok((Some(tok), prompts))
}

/// What a run's prompts need of the caches.
struct Batch {
    sequences: u64,
    /// Tokens of the longest prompt: the largest prefill.
    longest: u64,
    /// Tokens of context the longest sequence reaches, with one to spare.
    context: u64,
}

impl Batch {
    fn of(args: &RunArgs, prompts: &[Vec<u64>]) -> anyhow::Result<Batch> {
        if prompts.len() > 1 && (args.dump_logits.is_some() || args.trace.is_some()) {
            bail!(
                "--dump-logits and --trace record one sequence, and {} prompts were given: give one --prompt-ids or --prompt",
                prompts.len()
            );
        }
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        Ok(Batch {
            sequences: prompts.len() as u64,
            longest: longest as u64,
            context: (longest + args.max_new_tokens + 1) as u64,
        })
    }

    /// Refuses a batch of more sequences than `max_batch` or a context past `max_context`,
    /// each the run's flag when given, else the artifact's limit when `artifact` (a model is
    /// sized for the run).
    fn fits(
        &self,
        max_batch: Option<u64>,
        max_context: Option<u64>,
        artifact: &glmc_codegen::Limits,
    ) -> anyhow::Result<()> {
        let n = self.sequences;
        match max_batch {
            Some(b) if n > b => bail!(
                "{n} prompts were given, more than --max-batch {b}: raise --max-batch, or give fewer prompts"
            ),
            None if n > artifact.max_batch => bail!(
                "{n} prompts were given, the artifact was compiled for {} sequences: recompile with a larger --max-batch, or give fewer prompts",
                artifact.max_batch
            ),
            _ => {}
        }
        let c = self.context;
        match max_context {
            Some(t) if c > t => bail!(
                "the prompt and --max-new-tokens reach {c} tokens, more than --max-context {t}: raise --max-context, or generate fewer tokens"
            ),
            None if c > artifact.max_context => bail!(
                "the prompt and --max-new-tokens reach {c} tokens, the artifact was compiled for {} tokens of context: recompile with a larger --max-context, or generate fewer tokens",
                artifact.max_context
            ),
            _ => {}
        }
        Ok(())
    }

    /// The limits a model is compiled or run for: the flags, else what the prompts need.
    fn limits(&self, args: &RunArgs) -> glmc_codegen::Limits {
        glmc_codegen::Limits {
            max_prefill_tokens: self.longest,
            max_batch: args.max_batch.unwrap_or(self.sequences),
            max_context: args.max_context.unwrap_or(self.context),
        }
    }
}

/// Prefills the prompts, generates, and writes what `args` asks for: the trace (also when a
/// node stops the run, so it shows what led there; `traced` is the model's name and what the
/// trace records of split values), the logits and the output, one line per sequence (prefixed
/// with its index when there are several).
fn generate_and_print(
    args: &RunArgs,
    generator: &mut Generator,
    prompts: &[Vec<u64>],
    eos: &[u64],
    tokenizer: Option<&Tokenizer>,
    traced: (&str, TraceLayout),
) -> anyhow::Result<()> {
    let sampling = Sampling {
        temperature: args.temperature,
        top_p: args.top_p,
        seed: args.seed,
    };
    sampling.validate()?;
    let (model, layout) = traced;
    // --trace records one sequence (`Batch::of` refuses more).
    let header = TraceHeader {
        model: model.to_string(),
        prompt: prompts.first().cloned().unwrap_or_default(),
        tp: args.tp,
    };
    let mut trace = args
        .trace
        .as_deref()
        .map(|path| TraceWriter::create(path, header, layout))
        .transpose()?;
    let check = args.check_finite;
    let mut hook = |call, rank, node: &glmc_ir::Node, outputs: &[&glmc_runtime::Tensor]| {
        if let Some(t) = trace.as_mut() {
            t.record(call, rank, node, outputs);
        }
        if check {
            check_finite(call, (args.tp > 1).then_some(rank), node, outputs)?;
        }
        Ok(())
    };
    let generations = generate_batch(
        generator,
        prompts,
        args.max_new_tokens,
        &sampling,
        eos,
        &mut hook,
    );
    if let Some(t) = trace {
        t.finish()?;
    }
    let generations = generations?;
    if let (Some(path), [generation]) = (&args.dump_logits, &generations[..]) {
        generation
            .write_safetensors(path)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let several = generations.len() > 1;
    for (i, generation) in generations.iter().enumerate() {
        let text = match tokenizer {
            Some(tok) => {
                let ids: Vec<u32> = generation.generated.iter().map(|&i| i as u32).collect();
                tok.decode(&ids, true)
                    .map_err(|e| anyhow::anyhow!("decoding the output: {e}"))?
            }
            None => {
                let ids: Vec<String> = generation.generated.iter().map(u64::to_string).collect();
                ids.join(" ")
            }
        };
        if several {
            println!("[{i}] {text}");
        } else {
            println!("{text}");
        }
    }
    Ok(())
}

/// Where `run` takes the weights from.
enum Weights {
    // Shared, so a tensor-parallel group's rank threads read it too.
    Checkpoint(Arc<Checkpoint>),
    Random(RandomWeights),
}

impl Weights {
    fn source(&self) -> &(dyn WeightSource + Sync) {
        match self {
            Weights::Checkpoint(c) => c.as_ref(),
            Weights::Random(r) => r,
        }
    }

    fn shared(&self) -> Arc<dyn WeightSource + Send + Sync> {
        match self {
            Weights::Checkpoint(c) => c.clone(),
            Weights::Random(r) => Arc::new(*r),
        }
    }
}

/// An artifact directory's manifest, checked to be of this glmc and, for `tp` above 1, a rank
/// of a group of `tp`.
fn read_manifest(dir: &Path, tp: u64, rank: u64) -> anyhow::Result<Manifest<ModelConfig>> {
    let path = dir.join("manifest.ron");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let manifest: Manifest<ModelConfig> = ron::from_str(&text).map_err(|e| {
        anyhow::anyhow!(
            "{}: not a manifest this glmc reads ({e}): recompile the artifact with glmc compile",
            path.display()
        )
    })?;
    if manifest.version != MANIFEST_VERSION {
        bail!(
            "{}: manifest version {}, this glmc reads version {MANIFEST_VERSION}: recompile the artifact with this glmc",
            path.display(),
            manifest.version
        );
    }
    if manifest.tp.degree != tp {
        bail!(
            "{}: the artifact is rank {} of --tp {}, the run asks for --tp {tp}: run it with --tp {}, or recompile with glmc compile --tp {tp}",
            path.display(),
            manifest.tp.rank,
            manifest.tp.degree,
            manifest.tp.degree
        );
    }
    // A copied or swapped rank directory would run another rank's shards without a word.
    if manifest.tp.rank != rank {
        bail!(
            "{}: the artifact is rank {} of --tp {tp}, where rank {rank} belongs: recompile with glmc compile --tp {tp}",
            path.display(),
            manifest.tp.rank
        );
    }
    Ok(manifest)
}

/// The cubin `manifest` (of artifact directory `dir`) names.
fn read_cubin(dir: &Path, manifest: &Manifest<ModelConfig>) -> anyhow::Result<Vec<u8>> {
    let path = dir.join("manifest.ron");
    let Some(cubin_name) = &manifest.cubin else {
        bail!(
            "{}: the artifact has kernels.cu but no cubin (it was compiled without a CUDA compiler): recompile it with --nvcc PATH or GLMC_NVCC set",
            path.display()
        );
    };
    let cubin_path = dir.join(cubin_name);
    std::fs::read(&cubin_path).with_context(|| {
        format!(
            "reading {} (manifest.ron's cubin): recompile the artifact",
            cubin_path.display()
        )
    })
}

/// The random-weight generator compiled for `target`, when a CUDA compiler is found; without
/// one the same weights are made on the host (slower, identical).
fn random_generator(nvcc_flag: Option<&Path>, target: Target) -> anyhow::Result<Option<Vec<u8>>> {
    let Some(compiler) = nvcc::find(nvcc_flag)? else {
        return Ok(None);
    };
    let cache = nvcc::default_cache_dir();
    let generator = nvcc::compile(&compiler, random_fill::SOURCE, target, cache.as_deref())?;
    Ok(Some(generator.cubin))
}

/// The target of the GPU present (GPU 0; a group's GPUs are alike).
fn gpu_target() -> anyhow::Result<Target> {
    let (major, minor) = Gpu::open(0)?.compute_capability()?;
    let Some(target) = Target::for_gpu(major, minor) else {
        bail!(
            "this GPU is sm_{major}{minor}; glmc compiles for sm_90 (H100/H200) and sm_120 (RTX PRO 6000 Blackwell)"
        );
    };
    Ok(target)
}

/// This process's ranks of `ranks` (the model's graphs of a group of `--tp`) compiled for the
/// GPUs present, sized for this run, and started with their weights.
fn tp_group(
    built: &Built,
    ranks: &[glmc_ir::Module],
    weights: &Weights,
    limits: Limits,
    args: &RunArgs,
) -> anyhow::Result<TpExecutor> {
    let processes = Processes::from_args(args, |v| std::env::var(v).ok())?;
    tp_run::check_host(args, &processes)?;
    let target = gpu_target()?;
    check_positions(built, limits)?;
    let placement = processes.placement(args.tp);
    let mut artifacts = Vec::with_capacity(placement.gpus.len());
    for rank in &ranks[placement.first_rank..placement.first_rank + placement.gpus.len()] {
        // The ranks' kernels are alike, so nvcc's cache serves every rank after the first.
        let compiled = glmc_runtime::cuda::compile(
            rank,
            built.config.clone(),
            built.config.dtype,
            target,
            limits,
            args.nvcc.as_deref(),
        )?;
        artifacts.push(RankArtifact {
            manifest: compiled.manifest,
            cubin: compiled.cubin,
            // Each rank's executor shows its nodes by this module's names and `tp=` marks.
            ir: observes(args).then(|| rank.clone()),
        });
    }
    let random = match weights {
        Weights::Random(r) => random_generator(args.nvcc.as_deref(), target)?.map(|c| (*r, c)),
        Weights::Checkpoint(_) => None,
    };
    tp_run::start(
        args,
        &processes,
        artifacts,
        tp_run::group_weights(weights.shared(), random),
    )
}

/// Refuses a run whose context passes the model's positions.
fn check_positions(built: &Built, limits: Limits) -> anyhow::Result<()> {
    let positions = built.config.max_position_embeddings;
    if limits.max_context > positions {
        bail!(
            "the run needs {} tokens of context (--max-context, or the prompt and --max-new-tokens), past the model's {positions} positions",
            limits.max_context
        );
    }
    Ok(())
}

/// Compiles the built model for the GPU present, sized for this run (`limits`: each prompt in
/// one prefill, the batch and context of `--max-batch` and `--max-context`), and loads it with
/// its weights.
fn cuda_executor(
    built: &Built,
    weights: &Weights,
    limits: Limits,
    args: &RunArgs,
) -> anyhow::Result<CudaExecutor> {
    let target = gpu_target()?;
    check_positions(built, limits)?;
    let compiled = glmc_runtime::cuda::compile(
        &built.module,
        &built.config,
        built.config.dtype,
        target,
        limits,
        args.nvcc.as_deref(),
    )?;
    Ok(match weights {
        Weights::Checkpoint(c) => {
            CudaExecutor::load(&compiled.manifest, &compiled.cubin, c.as_ref())?
        }
        Weights::Random(r) => {
            let cache = nvcc::default_cache_dir();
            let generator = nvcc::compile(
                &compiled.compiler,
                random_fill::SOURCE,
                target,
                cache.as_deref(),
            )?;
            CudaExecutor::load_random(&compiled.manifest, &compiled.cubin, r, &generator.cubin)?
        }
    })
}

fn weights_dir(args: &RunArgs) -> anyhow::Result<PathBuf> {
    match &args.weights {
        Some(dir) => Ok(dir.clone()),
        None if args.model.is_dir() => Ok(args.model.clone()),
        None => bail!(
            "{}: a model.ron carries no weights; pass --weights DIR, an HF checkpoint directory with model.safetensors or model.safetensors.index.json, or --random-weights SEED",
            args.model.display()
        ),
    }
}

fn load_tokenizer(dir: &Path) -> anyhow::Result<Tokenizer> {
    let path = dir.join("tokenizer.json");
    if !path.exists() {
        bail!("{}: no tokenizer.json, which --prompt TEXT needs; give token ids with --prompt-ids instead", dir.display());
    }
    Tokenizer::from_file(&path)
        .map_err(|e| anyhow::anyhow!("{}: not a usable tokenizer.json: {e}", path.display()))
}

/// The config's EOS ids plus those of generation_config.json, when the checkpoint has one.
fn eos_ids(config: &ModelConfig, dir: Option<&Path>) -> anyhow::Result<Vec<u64>> {
    let mut eos = config.eos_token_ids.clone();
    let Some(path) = dir.map(|d| d.join("generation_config.json")) else {
        return Ok(eos);
    };
    if let Ok(text) = std::fs::read_to_string(&path) {
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}:{}:{}: {e}", path.display(), e.line(), e.column()))?;
        match &json["eos_token_id"] {
            serde_json::Value::Number(n) => eos.extend(n.as_u64()),
            serde_json::Value::Array(ids) => {
                eos.extend(ids.iter().filter_map(serde_json::Value::as_u64))
            }
            _ => {}
        }
    }
    eos.sort();
    eos.dedup();
    Ok(eos)
}

/// Forcing dense attention on a model trained sparse is exact only while every query's context
/// fits in index_topk; past that the outputs change with no error, so say so.
fn warn_if_dense_changes_outputs(built: &Built, context: usize) {
    let Some(indexer) = &built.config.indexer else {
        return;
    };
    if built.attention == AttentionChoice::Dense && context as u64 > indexer.index_topk {
        eprintln!(
            "warning: attention forced dense on a model trained with sparse attention; the context reaches {context} tokens, past index_topk={}, so from there on the outputs differ from the model's",
            indexer.index_topk
        );
    }
}
