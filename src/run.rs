//! `glmc run`: prefill a prompt, then decode one token at a time through the `decode` graph and
//! the caches, on the CPU reference interpreter, each next token taken from the graph's
//! `next_token` (greedy at temperature 0). With `--tp N` the N ranks' graphs run together,
//! their collectives simulated between threads; `--trace` records rank 0, whose whole values
//! (after each collective) carry the single-device names.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use glmc_codegen::artifact::Manifest;
use glmc_codegen::{lower_module, nvcc, render, Limits, Target};
use glmc_models::builder::{BuildOptions, LogitRows};
use glmc_passes::AttentionChoice;
use glmc_runtime::cuda::{random_fill, CudaExecutor, Gpu};
use glmc_runtime::trace::TraceWriter;
use glmc_runtime::{generate, Checkpoint, Generator, RandomWeights, Sampling, WeightSource};
use tokenizers::Tokenizer;

use crate::cli::{DeviceArg, RunArgs};
use crate::compile::{build, Built};

pub fn run(args: &RunArgs) -> anyhow::Result<()> {
    // Every position's logits only when they are written out; generation needs the last.
    let logits = match args.dump_logits {
        Some(_) => LogitRows::All,
        None => LogitRows::Last,
    };
    let built = build(&args.model, &BuildOptions { logits }, &args.pipeline, None)?;
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
            (Weights::Checkpoint(checkpoint), Some(dir))
        }
    };

    let tokenizer = match (&args.prompt, &dir) {
        (Some(_), Some(dir)) => Some(load_tokenizer(dir)?),
        (Some(_), None) => bail!(
            "--prompt TEXT needs the tokenizer.json of a checkpoint directory, and {} is a model.ron: give token ids with --prompt-ids",
            args.model.display()
        ),
        (None, _) => None,
    };
    let prompt: Vec<u64> = match (&args.prompt, &tokenizer) {
        (Some(text), Some(tok)) => {
            let enc = tok
                .encode(text.as_str(), true)
                .map_err(|e| anyhow::anyhow!("tokenizing the prompt: {e}"))?;
            enc.get_ids().iter().map(|&i| i as u64).collect()
        }
        _ => args.prompt_ids.clone(),
    };
    warn_if_dense_changes_outputs(&built, prompt.len() + args.max_new_tokens);

    let sampling = Sampling {
        temperature: args.temperature,
        top_p: args.top_p,
        seed: args.seed,
    };
    sampling.validate()?;
    let eos = eos_ids(&built, dir.as_deref())?;
    let ranks = glmc_passes::partition(&built.module, args.tp)?;
    let mut generator = match args.device {
        DeviceArg::Cpu => Generator::tensor_parallel(&ranks, weights.source())?,
        DeviceArg::Cuda => {
            if args.tp > 1 {
                bail!("--tp on the GPU needs NCCL execution, which glmc does not have yet: use --device cpu --tp N");
            }
            if args.trace.is_some() {
                bail!("--trace records nodes on the CPU only for now: run it with --device cpu");
            }
            let context = prompt.len() + args.max_new_tokens + 1;
            let exec = cuda_executor(&built, &weights, prompt.len(), context, args)?;
            Generator::with_executor(Box::new(exec))?
        }
    };
    let mut trace = args.trace.as_deref().map(TraceWriter::create).transpose()?;
    let mut hook = |call, node: &glmc_ir::Node, outputs: &[&glmc_runtime::Tensor]| {
        if let Some(t) = trace.as_mut() {
            t.record(call, node, outputs);
        }
    };
    let generation = generate(
        &mut generator,
        &prompt,
        args.max_new_tokens,
        &sampling,
        &eos,
        &mut hook,
    )?;
    if let Some(t) = trace {
        t.finish()?;
    }
    if let Some(path) = &args.dump_logits {
        generation
            .write_safetensors(path)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    match &tokenizer {
        Some(tok) => {
            let ids: Vec<u32> = generation.generated.iter().map(|&i| i as u32).collect();
            let text = tok
                .decode(&ids, true)
                .map_err(|e| anyhow::anyhow!("decoding the output: {e}"))?;
            println!("{text}");
        }
        None => {
            let ids: Vec<String> = generation.generated.iter().map(u64::to_string).collect();
            println!("{}", ids.join(" "));
        }
    }
    Ok(())
}

/// Where `run` takes the weights from.
enum Weights {
    Checkpoint(Checkpoint),
    Random(RandomWeights),
}

impl Weights {
    fn source(&self) -> &(dyn WeightSource + Sync) {
        match self {
            Weights::Checkpoint(c) => c,
            Weights::Random(r) => r,
        }
    }
}

/// Compiles the built model for the GPU present, sized for this run (one sequence, the prompt in
/// one prefill, `context` tokens), and loads it with its weights.
fn cuda_executor(
    built: &Built,
    weights: &Weights,
    prompt: usize,
    context: usize,
    args: &RunArgs,
) -> anyhow::Result<CudaExecutor> {
    let (major, minor) = Gpu::open(0)?.compute_capability()?;
    let Some(target) = Target::for_gpu(major, minor) else {
        bail!(
            "this GPU is sm_{major}{minor}; glmc compiles for sm_90 (H100/H200) and sm_120 (RTX PRO 6000 Blackwell)"
        );
    };
    let positions = built.config.max_position_embeddings;
    if context as u64 > positions {
        bail!(
            "the prompt and --max-new-tokens reach {context} tokens, past the model's {positions} positions"
        );
    }
    let limits = Limits {
        max_prefill_tokens: prompt as u64,
        max_batch: 1,
        max_context: context as u64,
    };
    let lowered = lower_module(&built.module, target, limits)?;
    let manifest = Manifest::new(
        &built.module,
        built.config.dtype,
        &lowered,
        Vec::new(),
        &built.config,
    );
    if !manifest.complete {
        bail!(
            "{} cannot run on the GPU yet: glmc has no kernels for {} (they land with the next codegen issues); use --device cpu",
            built.module.name,
            manifest.missing_ops.join(", ")
        );
    }
    let compiler = nvcc::find(args.nvcc.as_deref())?.ok_or_else(|| {
        anyhow::anyhow!(
            "--device cuda compiles kernels for this GPU and found no CUDA compiler: pass --nvcc PATH, set GLMC_NVCC, or put nvcc on PATH (scripts/cuda-toolchain.sh installs the pinned nvcc 13.0)"
        )
    })?;
    let source = render::render(&lowered.kernels)?;
    let cache = nvcc::default_cache_dir();
    let compiled = nvcc::compile(&compiler, &source, target, cache.as_deref())?;
    Ok(match weights {
        Weights::Checkpoint(c) => CudaExecutor::load(&manifest, &compiled.cubin, c)?,
        Weights::Random(r) => {
            let generator =
                nvcc::compile(&compiler, random_fill::SOURCE, target, cache.as_deref())?;
            CudaExecutor::load_random(&manifest, &compiled.cubin, r, &generator.cubin)?
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
fn eos_ids(built: &Built, dir: Option<&Path>) -> anyhow::Result<Vec<u64>> {
    let mut eos = built.config.eos_token_ids.clone();
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
