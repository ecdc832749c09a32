//! `glmc bench`: the model on GPU 0, measured. Per attention path it compiles and loads the
//! model once, then times a prefill and decode steps at every batch size and context, each step
//! against the roofline measured in the same run (copy bandwidth and bf16 `mma.sync` rate) and
//! against the cost model's prediction (`glmc compile --report`'s).
//!
//! How a context is stated: every KV cache and indexer state, all sequences and positions, is
//! filled with random rows on the GPU ([`CudaExecutor::fill_states`]), and a decode step at
//! context `C` runs each sequence's token at position `C - 1`. A decode step reads the same bytes
//! and does the same FLOPs whatever the cached rows hold, and a 32k-token context costs no 32k
//! prefill. Every timed step repeats the same call (same ids, same positions), so each one does
//! the same work; the token ids are random, different per sequence, from the seed.
//!
//! What is timed: each step from its first launch until the GPU finished the last (host wall
//! time, inputs already uploaded, no result read back), and between CUDA events around the
//! whole step; then a few steps with events around every launch, whose per-launch times sum to
//! less than the step: the difference is launch overhead and gaps.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use glmc_codegen::cost::{function_cost, Cost};
use glmc_codegen::expr::Poly;
use glmc_codegen::{nvcc, Limits, Target};
use glmc_ir::{Function, Op};
use glmc_models::builder::{BuildOptions, LogitRows};
use glmc_models::ModelConfig;
use glmc_passes::plan_memory::{decode_bindings, prefill_bindings, Bindings};
use glmc_runtime::cuda::{
    ceiling, random_fill, CallTiming, CudaError, CudaExecutor, Gpu, LaunchMode, Timing,
};
use glmc_runtime::{
    phase_inputs, prefill_inputs, Checkpoint, PhaseKind, RandomWeights, Sampling, Tensor,
};
use serde_json::{json, Value};

use crate::cli::{AttentionArg, BenchArgs, DeviceArg, PipelineArgs};
use crate::compile::{build, dtype_choice, Built};
use crate::model_source::load_config;

/// The JSON's `schema`; bench/README.md documents its fields.
pub const SCHEMA: &str = "glmc-bench/1";
/// Steps timed launch by launch, after the plain timed steps.
const KERNEL_STEPS: u64 = 3;
/// Bytes of the copy that measures the bandwidth: far past the L2 (50 MB on an H200).
const COPY_BYTES: usize = 2 << 30;

/// What the command line asks for, checked against the model before any GPU work.
#[derive(Debug)]
struct Plan {
    batches: Vec<u64>,
    contexts: Vec<u64>,
    prefill: u64,
    attentions: Vec<Option<AttentionArg>>,
    limits: Limits,
}

fn plan(args: &BenchArgs, config: &ModelConfig) -> anyhow::Result<Plan> {
    if args.device != DeviceArg::Cuda {
        bail!("glmc bench measures a GPU: pass --device cuda (the CPU interpreter is the reference, not a benchmark target; bench/compile.sh times it)");
    }
    let positions = config.max_position_embeddings;
    if args.batch.contains(&0) {
        bail!("--batch 0: a decode step holds at least one sequence; give batch sizes of 1 or more, e.g. --batch 1,8,64");
    }
    if args.context.contains(&0) {
        bail!("--context 0: a decode step reads at least its own token; give contexts of 1 or more, e.g. --context 1024,8192");
    }
    if let Some(c) = args.context.iter().find(|&&c| c > positions) {
        bail!(
            "--context {c} is past the model's {positions} positions (max_position_embeddings of {}): give contexts of at most {positions}",
            args.model.display()
        );
    }
    if args.prefill > positions {
        bail!(
            "--prefill {} is past the model's {positions} positions (max_position_embeddings of {}): give at most {positions} tokens",
            args.prefill,
            args.model.display()
        );
    }
    if args.steps == 0 {
        bail!("--steps 0: give at least one timed decode step");
    }
    if args.prefill > 0 && args.prefill_steps == 0 {
        bail!("--prefill-steps 0 with --prefill {}: give at least one timed prefill, or --prefill 0 to time none", args.prefill);
    }
    let sorted = |v: &[u64]| {
        let mut v = v.to_vec();
        v.sort_unstable();
        v.dedup();
        v
    };
    let (batches, contexts) = (sorted(&args.batch), sorted(&args.context));
    let mut attentions: Vec<Option<AttentionArg>> = Vec::new();
    for a in &args.attention {
        if !attentions.contains(&Some(*a)) {
            attentions.push(Some(*a));
        }
    }
    if attentions.is_empty() {
        attentions.push(None);
    }
    let max_context = contexts.last().copied().unwrap_or(1).max(args.prefill);
    Ok(Plan {
        limits: Limits {
            max_prefill_tokens: args.prefill.max(1),
            max_batch: batches.last().copied().unwrap_or(1),
            max_context,
        },
        batches,
        contexts,
        prefill: args.prefill,
        attentions,
    })
}

/// Where the weights come from.
enum Weights {
    Checkpoint(Checkpoint),
    Random(RandomWeights),
}

/// The GPU's ceilings, measured in this run.
#[derive(Clone, Copy, Debug)]
struct Ceilings {
    copy_gbs: f64,
    mma_tflops: f64,
}

impl Ceilings {
    fn measure(gpu: &Gpu, mma_cubin: &[u8]) -> anyhow::Result<Ceilings> {
        let mut kernels = gpu.load(mma_cubin, LaunchMode::Plain)?;
        Ok(Ceilings {
            copy_gbs: ceiling::copy_gbs(gpu, COPY_BYTES)?,
            mma_tflops: ceiling::mma_tflops(gpu, &mut kernels)?,
        })
    }

    /// The roofline time of `cost`: its bytes at the copy bandwidth or its FLOPs at the MMA
    /// rate, whichever takes longer.
    fn seconds(&self, cost: &Cost) -> f64 {
        (cost.bytes / (self.copy_gbs * 1e9)).max(cost.flops / (self.mma_tflops * 1e12))
    }
}

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let config = load_config(&args.model)?.config;
    let plan = plan(args, &config)?;
    let (weights, seed, weights_text) = match args.random_weights {
        Some(seed) => (
            Weights::Random(RandomWeights::new(seed, dtype_choice(&config, args.dtype))),
            seed,
            format!("random, seed {seed}"),
        ),
        None => {
            let dir = match &args.weights {
                Some(d) => d.clone(),
                None if args.model.is_dir() => args.model.clone(),
                None => bail!(
                    "{}: a model.ron carries no weights; pass --weights DIR (an HF checkpoint directory) or --random-weights SEED",
                    args.model.display()
                ),
            };
            let text = format!("checkpoint {}", dir.display());
            (Weights::Checkpoint(Checkpoint::open(&dir)?), 0, text)
        }
    };

    let gpu = match Gpu::open(0) {
        Err(CudaError::NoDriver) => bail!(
            "glmc bench measures a GPU and found no NVIDIA driver (libcuda could not be loaded): run it on a machine with an NVIDIA GPU (scripts/bench-gpu.sh runs it on the H200 test host)"
        ),
        gpu => gpu?,
    };
    let (major, minor) = gpu.compute_capability()?;
    let Some(target) = Target::for_gpu(major, minor) else {
        bail!("this GPU is sm_{major}{minor}; glmc compiles for sm_90 (H100/H200) and sm_120 (RTX PRO 6000 Blackwell)");
    };
    let (gpu_name, gpu_memory) = gpu.describe()?;
    let Some(compiler) = nvcc::find(args.nvcc.as_deref())? else {
        bail!("glmc bench compiles kernels for this GPU and found no CUDA compiler: pass --nvcc PATH, set GLMC_NVCC, or put nvcc on PATH (scripts/cuda-toolchain.sh installs the pinned nvcc 13.0)");
    };
    let cache = nvcc::default_cache_dir();
    let mma = nvcc::compile(&compiler, ceiling::MMA_SOURCE, target, cache.as_deref())?;
    let generator = nvcc::compile(&compiler, random_fill::SOURCE, target, cache.as_deref())?;
    let before = Ceilings::measure(&gpu, &mma.cubin)?;
    println!(
        "glmc bench {} on {gpu_name} ({}): copy {:.0} GB/s, bf16 mma.sync {:.0} TFLOP/s measured",
        config.name,
        target.name(),
        before.copy_gbs,
        before.mma_tflops
    );

    let mut runs = Vec::new();
    for attention in &plan.attentions {
        let gpu_side = GpuSide {
            target,
            weights: &weights,
            seed,
            generator: &generator.cubin,
            ceilings: before,
        };
        runs.push(bench_attention(args, &plan, *attention, &gpu_side)?);
    }
    // Measured again after the model, so a clock that drifted during the run shows; the
    // rooflines use the first measurement.
    let after = Ceilings::measure(&gpu, &mma.cubin)?;
    let dtype = dtype_choice(&config, args.dtype);
    let doc = json!({
        "schema": SCHEMA,
        "tool": "glmc",
        "version": env!("CARGO_PKG_VERSION"),
        "command": command_line(),
        "date": utc_now(),
        "model": config.name,
        "model_file": args.model.display().to_string(),
        "dtype": dtype.to_string(),
        "weights": weights_text,
        "contexts_stated_by": "random cache rows (no prefill)",
        "device": {
            "name": gpu_name,
            "memory_bytes": gpu_memory,
            "target": target.name(),
            "nvcc": compiler.version,
        },
        "ceilings": {
            "copy_gbs": before.copy_gbs,
            "mma_tflops": before.mma_tflops,
            "copy_gbs_after": after.copy_gbs,
            "mma_tflops_after": after.mma_tflops,
            "copy_bytes": COPY_BYTES,
            "cost_model_gbs": target.memory_bandwidth_gbs(),
            "cost_model_tflops": target.mma_bf16_tflops(),
        },
        "settings": {
            "steps": args.steps,
            "prefill_steps": args.prefill_steps,
            "warmup": args.warmup,
            "kernel_steps": KERNEL_STEPS,
        },
        "runs": runs,
    });
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&doc).context("serialising the results")?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// What every attention path's run shares: the GPU's target, the weights, the seed of the ids
/// and cache rows, the random generator's cubin, and the ceilings measured.
struct GpuSide<'a> {
    target: Target,
    weights: &'a Weights,
    seed: u64,
    generator: &'a [u8],
    ceilings: Ceilings,
}

/// Compiles and loads the model for one attention path and measures every point of `plan`.
fn bench_attention(
    args: &BenchArgs,
    plan: &Plan,
    attention: Option<AttentionArg>,
    side: &GpuSide,
) -> anyhow::Result<Value> {
    let GpuSide {
        target,
        weights,
        seed,
        generator,
        ceilings,
    } = *side;
    let pipeline = PipelineArgs {
        dtype: args.dtype,
        opt_level: 1,
        disable_pass: Vec::new(),
        attention,
    };
    let start = Instant::now();
    let options = BuildOptions {
        logits: LogitRows::Last,
        ..BuildOptions::default()
    };
    let built = build(&args.model, &options, &pipeline, None)?;
    let path = attention_name(&built);
    let compiled = glmc_runtime::cuda::compile(
        &built.module,
        &built.config,
        built.config.dtype,
        target,
        plan.limits,
        args.nvcc.as_deref(),
    )?;
    let compile_s = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let mut exec = match weights {
        Weights::Random(r) => {
            CudaExecutor::load_random(&compiled.manifest, &compiled.cubin, r, generator)?
        }
        Weights::Checkpoint(c) => {
            crate::checkpoint::check(&built, c)?;
            CudaExecutor::load(&compiled.manifest, &compiled.cubin, c)?
        }
    };
    exec.fill_states(generator, seed)?;
    let load_s = start.elapsed().as_secs_f64();
    println!("attention {path}: compiled in {compile_s:.1} s, loaded in {load_s:.1} s");
    println!("  {}", Row::HEADER);
    let vocab = built.config.vocab_size;
    let mut prefill = Vec::new();
    if plan.prefill > 0 {
        let f = phase_function(&built, PhaseKind::Prefill)?;
        let n = plan.prefill;
        let ids = token_ids(seed, 0, n, vocab);
        let positions: Vec<i64> = (0..n as i64).collect();
        let inputs = prefill_inputs(&ids, &positions, &Sampling::default(), 0, 0);
        let bindings = prefill_bindings(n, 0);
        let point = measure(
            &mut exec,
            PhaseKind::Prefill,
            &inputs,
            args.warmup,
            args.prefill_steps,
        )?;
        let v = point_json(f, &bindings, n, n, &point, ceilings, target);
        println!("  {}", Row::of("prefill", &v));
        prefill.push(v);
    }
    let mut decode = Vec::new();
    let f = phase_function(&built, PhaseKind::Decode)?;
    for &context in &plan.contexts {
        for &batch in &plan.batches {
            let ids = token_ids(seed, context, batch, vocab);
            let positions = vec![context as i64 - 1; batch as usize];
            let inputs = phase_inputs(&ids, &positions, &Sampling::default(), 0, batch as usize);
            let bindings = decode_bindings(batch, context);
            let point = measure(
                &mut exec,
                PhaseKind::Decode,
                &inputs,
                args.warmup,
                args.steps,
            )?;
            let v = point_json(f, &bindings, batch, context, &point, ceilings, target);
            println!("  {}", Row::of("decode", &v));
            decode.push(v);
        }
    }
    Ok(json!({
        "attention": path,
        "compile_s": compile_s,
        "load_s": load_s,
        "limits": {
            "max_prefill_tokens": plan.limits.max_prefill_tokens,
            "max_batch": plan.limits.max_batch,
            "max_context": plan.limits.max_context,
        },
        "prefill": prefill,
        "decode": decode,
    }))
}

/// `dense` or `sparse`: the path the built graph takes (`auto` resolved by the passes).
fn attention_name(built: &Built) -> &'static str {
    let sparse_op = built.module.functions.iter().any(|f| {
        f.canonical_order().into_iter().any(|n| {
            matches!(
                f.node(n).op,
                Op::MlaAttend { sparse: true, .. } | Op::MlaAttendAbsorbed { sparse: true, .. }
            )
        })
    });
    if sparse_op {
        "sparse"
    } else {
        "dense"
    }
}

fn phase_function(built: &Built, kind: PhaseKind) -> anyhow::Result<&Function> {
    built
        .module
        .function(kind.name())
        .with_context(|| format!("the built module has no @{} (a glmc bug)", kind.name()))
}

/// `n` token ids in `0..vocab` for the point keyed `key`, from `seed` (splitmix64): distinct
/// sequences get distinct tokens.
fn token_ids(seed: u64, key: u64, n: u64, vocab: u64) -> Vec<i64> {
    (0..n)
        .map(|i| {
            let mut z = seed
                .wrapping_add(key.wrapping_mul(0x2545_F491_4F6C_DD1D))
                .wrapping_add((i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) % vocab) as i64
        })
        .collect()
}

/// One point's timings: the plain steps, then the steps timed launch by launch.
struct Measured {
    plain: Vec<CallTiming>,
    per_launch: Vec<CallTiming>,
    /// Decode only: the step replayed from its CUDA graph, as `glmc run` runs it.
    graph: Vec<CallTiming>,
}

fn measure(
    exec: &mut CudaExecutor,
    kind: PhaseKind,
    inputs: &[Tensor],
    warmup: u64,
    steps: u64,
) -> anyhow::Result<Measured> {
    let mut timed = |timing: Timing, n: u64| {
        // The first replay of a size captures its graph: one warm-up at least takes it.
        let warmup = if timing == Timing::Graph {
            warmup.max(1)
        } else {
            warmup
        };
        for _ in 0..warmup {
            exec.time(kind, inputs, timing)?;
        }
        (0..n)
            .map(|_| exec.time(kind, inputs, timing))
            .collect::<Result<Vec<_>, _>>()
    };
    let plain = timed(Timing::Step, steps)?;
    let per_launch = timed(Timing::PerLaunch, KERNEL_STEPS)?;
    let graph = match kind {
        PhaseKind::Decode => timed(Timing::Graph, steps)?,
        PhaseKind::Prefill => Vec::new(),
    };
    Ok(Measured {
        plain,
        per_launch,
        graph,
    })
}

/// Median, min, mean and max of `xs` (not empty).
fn stats(xs: &[f64]) -> Value {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    json!({
        "median": median,
        "min": v[0],
        "mean": v.iter().sum::<f64>() / n as f64,
        "max": v[n - 1],
    })
}

/// Per node, in launch order: its launches' mean times summed, and its kernels.
struct NodeTime {
    node: String,
    op: String,
    kernels: Vec<String>,
    launches: usize,
    seconds: f64,
}

fn node_times(per_launch: &[CallTiming]) -> Vec<NodeTime> {
    let mut nodes: Vec<NodeTime> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let Some(first) = per_launch.first() else {
        return nodes;
    };
    for (i, l) in first.launches.iter().enumerate() {
        let mean = per_launch
            .iter()
            .filter_map(|c| c.launches.get(i).map(|x| x.seconds))
            .sum::<f64>()
            / per_launch.len() as f64;
        let at = *index.entry(l.node.clone()).or_insert_with(|| {
            nodes.push(NodeTime {
                node: l.node.clone(),
                op: l.op.clone(),
                kernels: Vec::new(),
                launches: 0,
                seconds: 0.0,
            });
            nodes.len() - 1
        });
        let n = &mut nodes[at];
        if !n.kernels.contains(&l.kernel) {
            n.kernels.push(l.kernel.clone());
        }
        n.launches += 1;
        n.seconds += mean;
    }
    nodes
}

/// A matmul node's GEMM shape: rows, heads, N, K and the weight's dtype, for `torch.matmul` on
/// the same shapes (bench/peers).
fn gemm_shape(f: &Function, node: &str, bindings: &Bindings) -> Option<Value> {
    let n = f.find(node)?;
    if !matches!(
        f.node(n).op,
        Op::Matmul {} | Op::MatmulRope { .. } | Op::MatmulHeads {}
    ) {
        return None;
    }
    let w = f.value_type(*f.operands(n).get(1)?);
    let dims: Vec<u64> = w
        .shape
        .iter()
        .map(|d| d.as_const())
        .collect::<Option<_>>()?;
    let (heads, cols, k) = match dims.as_slice() {
        [h, n, k] => (*h, *n, *k),
        [n, k] => (1, *n, *k),
        _ => return None,
    };
    let rows = Poly::from_dim(f.node(n).outputs[0].shape.first()?).eval(bindings)?;
    Some(json!({
        "rows": rows,
        "heads": heads,
        "n": cols,
        "k": k,
        "dtype": w.dtype.to_string(),
    }))
}

/// One point's record: the step's timings, its roofline and prediction, and every node's.
fn point_json(
    f: &Function,
    bindings: &Bindings,
    rows: u64,
    context: u64,
    m: &Measured,
    ceilings: Ceilings,
    target: Target,
) -> Value {
    let host: Vec<f64> = m.plain.iter().map(|c| c.host_seconds).collect();
    let gpu: Vec<f64> = m.plain.iter().map(|c| c.gpu_seconds).collect();
    let step = stats(&host);
    let step_median = step["median"].as_f64().unwrap_or(f64::NAN);
    let costs = function_cost(f, bindings);
    let by_node: HashMap<&str, Cost> = costs.iter().map(|c| (c.node.as_str(), c.cost)).collect();
    let total = Cost {
        bytes: costs.iter().map(|c| c.cost.bytes).sum(),
        flops: costs.iter().map(|c| c.cost.flops).sum(),
    };
    let roofline = ceilings.seconds(&total);
    let roofline_ops: f64 = costs.iter().map(|c| ceilings.seconds(&c.cost)).sum();
    let predicted: f64 = costs.iter().map(|c| c.cost.seconds(target)).sum();
    let nodes = node_times(&m.per_launch);
    let sum_kernels: f64 = nodes.iter().map(|n| n.seconds).sum();
    let launches: usize = nodes.iter().map(|n| n.launches).sum();
    let kernels: Vec<Value> = nodes
        .iter()
        .map(|n| {
            let cost = by_node.get(n.node.as_str());
            let roof = cost.map(|c| ceilings.seconds(c));
            json!({
                "node": n.node,
                "op": n.op,
                "kernels": n.kernels,
                "launches": n.launches,
                "time_s": n.seconds,
                "bytes": cost.map(|c| c.bytes),
                "flops": cost.map(|c| c.flops),
                "gbs": cost.map(|c| c.bytes / n.seconds / 1e9),
                "tflops": cost.map(|c| c.flops / n.seconds / 1e12),
                "roofline_s": roof,
                "roofline_fraction": roof.map(|r| r / n.seconds),
                "gemm": gemm_shape(f, &n.node, bindings),
            })
        })
        .collect();
    json!({
        "rows": rows,
        "context": context,
        "step_s": step,
        "gpu_step_s": stats(&gpu),
        "tokens_per_s": rows as f64 / step_median,
        "launches": launches,
        "sum_kernels_s": sum_kernels,
        "launch_overhead_s": step_median - sum_kernels,
        "graph_step_s": (!m.graph.is_empty())
            .then(|| stats(&m.graph.iter().map(|c| c.host_seconds).collect::<Vec<_>>())),
        "bytes": total.bytes,
        "flops": total.flops,
        "roofline_s": roofline,
        "roofline_ops_s": roofline_ops,
        "roofline_fraction": roofline / step_median,
        "predicted_s": predicted,
        "kernels": kernels,
    })
}

/// The table printed as the run goes.
struct Row;

impl Row {
    const HEADER: &'static str = "phase     rows  context    step ms     tok/s  kernels ms  launches  overhead ms  graph ms  roofline ms  of roofline  predicted ms";

    fn of(phase: &str, v: &Value) -> String {
        let ms = |key: &str| v[key].as_f64().unwrap_or(f64::NAN) * 1e3;
        format!(
            "{phase:<8}{:>6}  {:>7}  {:>9.3}  {:>8.1}  {:>10.3}  {:>8}  {:>11.3}  {:>8.3}  {:>11.3}  {:>10.1}%  {:>12.3}",
            v["rows"],
            v["context"],
            v["step_s"]["median"].as_f64().unwrap_or(f64::NAN) * 1e3,
            v["tokens_per_s"].as_f64().unwrap_or(f64::NAN),
            ms("sum_kernels_s"),
            v["launches"],
            ms("launch_overhead_s"),
            v["graph_step_s"]["median"].as_f64().unwrap_or(f64::NAN) * 1e3,
            ms("roofline_s"),
            v["roofline_fraction"].as_f64().unwrap_or(f64::NAN) * 100.0,
            ms("predicted_s"),
        )
    }
}

/// The command as it was run, for the record.
fn command_line() -> String {
    let mut words: Vec<String> = std::env::args().collect();
    if let Some(first) = words.first_mut() {
        *first = PathBuf::from(&*first)
            .file_name()
            .map_or("glmc".into(), |n| n.to_string_lossy().into_owned());
    }
    words.join(" ")
}

/// `2026-12-02T10:11:12Z`, from the system clock.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_civil() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_788), (2026, 12, 1));
    }

    #[test]
    fn token_ids_differ_per_sequence_and_stay_in_the_vocabulary() {
        let ids = token_ids(1, 1024, 8, 154_880);
        assert!(ids.iter().all(|&i| (0..154_880).contains(&i)));
        let mut distinct = ids.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 8);
        assert_ne!(ids, token_ids(1, 8192, 8, 154_880));
        assert_eq!(ids, token_ids(1, 1024, 8, 154_880));
    }

    /// The renderer's fixture (bench/fixtures/schema-fixture-glmc.json) has the fields a real
    /// point has, so render.py's tests test the schema glmc writes.
    #[test]
    fn the_schema_fixture_has_the_fields_glmc_writes() {
        let pipeline = PipelineArgs {
            dtype: None,
            opt_level: 1,
            disable_pass: Vec::new(),
            attention: None,
        };
        let options = BuildOptions {
            logits: LogitRows::Last,
            ..BuildOptions::default()
        };
        let built = build(
            std::path::Path::new("models/tiny-sparse.ron"),
            &options,
            &pipeline,
            None,
        )
        .unwrap();
        let f = built.module.function("decode").unwrap();
        let launch = |node: &str, op: &str| glmc_runtime::cuda::LaunchTime {
            node: node.into(),
            op: op.into(),
            kernel: "k".into(),
            seconds: 1e-6,
        };
        let timing = CallTiming {
            host_seconds: 1e-3,
            gpu_seconds: 9e-4,
            launches: vec![
                launch("model.layers.0.self_attn.o_proj", "matmul"),
                launch("model.layers.0.self_attn.q_heads+rope", "reshape"),
            ],
        };
        let m = Measured {
            plain: vec![timing.clone()],
            per_launch: vec![timing.clone()],
            graph: vec![timing],
        };
        let ceilings = Ceilings {
            copy_gbs: 4000.0,
            mma_tflops: 600.0,
        };
        let b = decode_bindings(2, 16);
        let point = point_json(f, &b, 2, 16, &m, ceilings, Target::Sm90a);
        let text = std::fs::read_to_string("bench/fixtures/schema-fixture-glmc.json").unwrap();
        let fixture: Value = serde_json::from_str(&text).unwrap();
        let keys = |v: &Value| {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        let fixture_point = &fixture["runs"][0]["decode"][0];
        assert_eq!(keys(&point), keys(fixture_point));
        assert_eq!(keys(&point["step_s"]), keys(&fixture_point["step_s"]));
        assert_eq!(
            keys(&point["kernels"][0]),
            keys(&fixture_point["kernels"][0])
        );
        let gemm = &point["kernels"][0]["gemm"];
        assert_eq!(keys(gemm), keys(&fixture_point["kernels"][0]["gemm"]));
        assert_eq!(
            (gemm["rows"].as_u64(), gemm["heads"].as_u64()),
            (Some(2), Some(1))
        );
        assert_eq!(point["kernels"][1]["gemm"], Value::Null);
        assert_eq!(fixture["schema"], SCHEMA);
    }

    #[test]
    fn stats_of_an_even_count_take_the_middle_pair() {
        let s = stats(&[4.0, 1.0, 3.0, 2.0]);
        assert_eq!(s["median"], 2.5);
        assert_eq!(s["min"], 1.0);
        assert_eq!(s["max"], 4.0);
        assert_eq!(s["mean"], 2.5);
    }
}
