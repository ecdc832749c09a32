//! Argument definitions.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(
    name = "glmc",
    version,
    about = "A compiler for the GLM-5 model family (glm_moe_dsa)"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Build and verify the model's graph and write the artifact (IR dumps, manifest) to a directory.
    Compile(CompileArgs),
    /// Print the model's IR.
    Dump(DumpArgs),
    /// Convert an HF checkpoint's config.json (model_type glm_moe_dsa) into a model.ron.
    ImportHf(ImportHfArgs),
    /// Run the model on the CPU reference interpreter: prefill a prompt, then decode token by token.
    Run(RunArgs),
    /// Compare two `run --trace` files and print the first node where they part: exit 0 when
    /// they agree, 1 when they part, 2 on bad input. B may be a `--tp N` trace with A a TP=1
    /// one: each rank is lined up with A, a rank's block of a split value with its slice.
    CompareTrace(CompareTraceArgs),
    /// Check an HF checkpoint against its config.json before serving it: the config as glmc reads
    /// it, the tensors, the attention path, and every inconsistency (exit 2 when it cannot run).
    Inspect(InspectArgs),
    /// Measure the model on the GPU: decode step latency and tokens/s per batch and context,
    /// prefill tokens/s, per-kernel times against the roofline measured in the same run.
    Bench(BenchArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AttentionArg {
    /// Sparse when the model has a DSA indexer (what it was trained with), dense otherwise.
    Auto,
    /// Dense causal attention; drops the indexer. Differs from a sparse-trained model once the
    /// context exceeds index_topk.
    Dense,
    /// Top-k sparse attention through the indexer.
    Sparse,
}

/// The activation and dense-weight dtype `--dtype` picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DTypeArg {
    /// The f32 validation mode: every op runs its f32 kernel with FP32 FMA only (no tensor
    /// cores, no TF32), so the compiled model can be held to the float64 oracle.
    F32,
    /// bfloat16, what GLM-5 is served in; prefill matmuls run on the tensor cores where their
    /// shapes allow.
    Bf16,
}

/// What `--dtype` says in every command's help.
pub const DTYPE_HELP: &str = "Activation and dense-weight dtype the graph is built for \
(the router and the logits stay f32 either way); the checkpoint's weights, whatever it stores, \
are rounded to it. Default: the model's own dtype, the config's `dtype` (bf16 for GLM-5; a \
config.json's float32 or float64 gives f32)";

/// How the graph is built and optimised; shared by compile, dump and run.
#[derive(Args, Clone, Debug)]
pub struct PipelineArgs {
    #[arg(long, value_enum, help = DTYPE_HELP)]
    pub dtype: Option<DTypeArg>,
    /// Optimisation level: -O0 runs no optimisation pass (select-attention still applies), -O1 all.
    #[arg(short = 'O', default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub opt_level: u8,
    /// Skip a pass by name (repeatable): fuse-mla-projections, fuse-mlp-projections,
    /// select-attention, absorb-mla, fuse-elementwise, fuse-cache-update, fuse-lm-head-argmax,
    /// lower-moe, cse, dce (`glmc dump --after '.*'` shows each one's effect).
    #[arg(long = "disable-pass", value_name = "NAME")]
    pub disable_pass: Vec<String>,
    /// Override the config's `attention` choice.
    #[arg(long, value_enum)]
    pub attention: Option<AttentionArg>,
}

/// The largest sizes a compiled artifact serves; its arena and caches are sized for them.
#[derive(Args, Clone, Debug)]
pub struct LimitsArgs {
    /// Most tokens in one prefill chunk (longer prompts are prefilled in chunks).
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_prefill_tokens: u64,
    /// Most sequences in one decode step, and sequences the caches hold.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_batch: u64,
    /// Most tokens of context per sequence (default: the model's max_position_embeddings, at
    /// most 32768).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_context: Option<u64>,
}

/// What `--target` says in every command's help.
pub const TARGET_HELP: &str = "GPU architecture: sm90, sm90a (H100/H200), sm120 or sm120a (RTX PRO 6000 Blackwell). \
sm120a cubins use the block-scaled fp8/fp4 mma and do not run on sm_121 (GB10); plain sm120 ones do";

#[derive(Args)]
pub struct CompileArgs {
    /// A model.ron, or an HF checkpoint directory (its config.json is imported on the fly).
    pub model: PathBuf,
    #[arg(long, help = TARGET_HELP)]
    pub target: String,
    /// The CUDA compiler (default: $GLMC_NVCC, else nvcc on PATH). Without one, compile writes
    /// kernels.cu but no cubin.
    #[arg(long, value_name = "PATH")]
    pub nvcc: Option<PathBuf>,
    #[command(flatten)]
    pub limits: LimitsArgs,
    /// Output directory; replaced as a whole, never left half-written. Default: `<model name>.glmc`.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Print, per phase and layer kind, which attention form and which dense/sparse path was chosen, and why.
    #[arg(long)]
    pub explain: bool,
    /// Print a memory report, also written to report.txt: per phase the activation arena, peak
    /// live bytes, largest intermediate, weights and KV cache bytes (prefill: 8192 tokens from an
    /// empty cache; decode: batch 64 at a 131072-token context).
    #[arg(long)]
    pub report: bool,
    /// Tensor parallelism over --tp ranks: the degree must divide the heads, the intermediate
    /// sizes and the vocabulary (exit 2 otherwise), and --report adds per-rank memory, the
    /// collectives per decode step and what fits on which GPU. Besides the single-device
    /// artifact, each rank's is written to DIR/rank0 .. DIR/rank{N-1}, which `glmc run DIR
    /// --device cuda --tp N` runs.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub tp: u64,
    /// Print each pass's wall time and whether it changed the module (stderr; never in the artifact).
    #[arg(long)]
    pub time_passes: bool,
    /// Build for greedy runs that need no logits: `next_token` is the argmax, the logits are no
    /// result, and lm_head fuses with the argmax (`fuse-lm-head-argmax`). Such an artifact
    /// neither samples nor writes logits.
    #[arg(long)]
    pub greedy: bool,
    #[command(flatten)]
    pub pipeline: PipelineArgs,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PhaseArg {
    Prefill,
    Decode,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// The canonical text form (a summary for deep models unless --full).
    Text,
    /// Graphviz.
    Dot,
    /// The module as RON.
    Ron,
}

#[derive(Args)]
pub struct DumpArgs {
    /// A model.ron, or an HF checkpoint directory.
    pub model: PathBuf,
    /// Only this entry function (default: both).
    #[arg(long, value_enum)]
    pub phase: Option<PhaseArg>,
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
    /// Print every layer; by default runs of identical layers are printed once, with an op histogram.
    #[arg(long)]
    pub full: bool,
    /// Print the module after every pass whose name matches this regex (whole name), headed by
    /// the pass name and whether it changed anything.
    #[arg(long, value_name = "REGEX", conflicts_with = "lowered")]
    pub after: Option<String>,
    /// Print the launch schedule (kernels, grids, arena slices) instead of the IR; needs --target.
    #[arg(long, requires = "target")]
    pub lowered: bool,
    #[arg(long, help = TARGET_HELP)]
    pub target: Option<String>,
    /// Tensor parallelism: print rank --rank's graph of --tp ranks (after tp-partition), or
    /// with --lowered its launch schedule, collectives included.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..), conflicts_with = "after")]
    pub tp: u64,
    /// The rank whose graph --tp prints, 0..TP.
    #[arg(long, default_value_t = 0)]
    pub rank: u64,
    /// The graph of a greedy run that needs no logits (see `glmc compile --greedy`).
    #[arg(long)]
    pub greedy: bool,
    #[command(flatten)]
    pub limits: LimitsArgs,
    #[command(flatten)]
    pub pipeline: PipelineArgs,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    /// The reference interpreter (multi-threaded): computes in f32, with the weights rounded
    /// to the model's dtype.
    Cpu,
    /// GPU 0: the model is compiled for it on the fly (needs a CUDA compiler, see --nvcc) and
    /// run from its artifact.
    Cuda,
}

#[derive(Args)]
pub struct RunArgs {
    /// A model.ron (with --weights), an HF checkpoint directory (config.json + safetensors), or
    /// an artifact directory of `glmc compile -o DIR` (--device cuda, with --weights or
    /// --random-weights).
    pub model: PathBuf,
    /// The checkpoint directory holding model.safetensors or model.safetensors.index.json
    /// (default: MODEL when it is a checkpoint directory).
    #[arg(long)]
    pub weights: Option<PathBuf>,
    /// Run on random weights made from SEED instead of a checkpoint (MODEL's own weights, if
    /// any, are ignored): the same model on every device, of any size, without files.
    #[arg(long, value_name = "SEED", conflicts_with = "weights")]
    pub random_weights: Option<u64>,
    /// The prompt as comma-separated token ids, e.g. 3,17,42. Repeat the flag for a batch:
    /// each prompt is a sequence of its own, and all are decoded together, one decode call per
    /// step.
    #[arg(long, value_name = "IDS", value_parser = parse_prompt_ids, conflicts_with = "prompt", required_unless_present = "prompt")]
    pub prompt_ids: Vec<PromptIds>,
    /// The prompt as text, tokenized with the checkpoint's tokenizer.json. Repeat the flag for a
    /// batch, as with --prompt-ids.
    #[arg(long)]
    pub prompt: Vec<String>,
    #[arg(long, default_value_t = 16)]
    pub max_new_tokens: usize,
    /// Most sequences decoded together, the cache slots (default: the number of prompts). A
    /// model is compiled for it; an artifact must have been compiled for at least this many.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_batch: Option<u64>,
    /// Tokens of context each sequence's caches hold (default: the longest prompt plus
    /// --max-new-tokens). A model is compiled for it; an artifact must have been compiled for at
    /// least this many.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_context: Option<u64>,
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: DeviceArg,
    /// With --device cuda: the CUDA compiler (default: $GLMC_NVCC, else nvcc on PATH).
    #[arg(long, value_name = "PATH")]
    pub nvcc: Option<PathBuf>,
    /// With --device cuda: launch each decode step kernel by kernel instead of replaying its
    /// CUDA graph (the same values; for comparing the two, or profiling single kernels).
    #[arg(long)]
    pub no_cuda_graphs: bool,
    /// Tensor parallelism: run the model as --tp ranks (tp-partition's graphs), their
    /// collectives simulated between threads on the CPU, or with --device cuda one GPU per rank
    /// with NCCL (over several hosts with --world-size).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub tp: u64,
    /// With --device cuda --tp N: how long a call (prefill or decode step) may wait for its
    /// collectives, and the ranks for each other, before the group is aborted and the run
    /// exits 2 naming the ranks still busy.
    #[arg(long, value_name = "SECS", default_value_t = 60.0, value_parser = parse_timeout)]
    pub collective_timeout: f64,
    /// With --device cuda --tp N over several hosts: this process's index, 0..--world-size
    /// (default: $RANK, else 0). Process 0 makes the group's NCCL id.
    #[arg(long, value_name = "N")]
    pub rank: Option<u64>,
    /// With --device cuda --tp N over several hosts: the number of processes, one per host,
    /// each driving N / WORLD_SIZE GPUs (default: $WORLD_SIZE, else 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub world_size: Option<u64>,
    /// With --world-size above 1: the host of process 0, where the others fetch the group's
    /// NCCL id (default: $MASTER_ADDR).
    #[arg(long, value_name = "HOST")]
    pub master_addr: Option<String>,
    /// With --world-size above 1: the TCP port process 0 listens on (default: $MASTER_PORT,
    /// else 29500).
    #[arg(long, value_name = "PORT")]
    pub master_port: Option<u16>,
    /// Sampling temperature; 0 (the default) is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus sampling: sample from the smallest set of tokens whose probability reaches P.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write tokens (i64 [T]), logits (f32 [T, vocab], row i = after token i) and generated
    /// (i64 [N]) to this safetensors file.
    #[arg(long, value_name = "FILE")]
    pub dump_logits: Option<PathBuf>,
    /// Write the L2 norm and first values of every named intermediate, per layer and position
    /// (on the GPU, each node is read back after its kernel: slow, for debugging). With --tp N,
    /// every rank's, each entry tagged with its rank, for compare-trace against a TP=1 trace.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Stop at the first node that produces NaN or an infinity and name it, with its layer and
    /// the call (on the GPU, each node is read back after its kernel: slow, for debugging).
    #[arg(long)]
    pub check_finite: bool,
    #[command(flatten)]
    pub pipeline: PipelineArgs,
}

/// One prompt of `--prompt-ids`: its token ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromptIds(pub Vec<u64>);

fn parse_timeout(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s > 0.0 && s.is_finite() => Ok(s),
        _ => Err(format!(
            "`{text}` is not a timeout: give a positive number of seconds, e.g. 60"
        )),
    }
}

fn parse_prompt_ids(text: &str) -> Result<PromptIds, String> {
    text.split(',')
        .map(|id| {
            id.trim().parse::<u64>().map_err(|e| {
                format!(
                    "`{id}` is not a token id ({e}): give comma-separated integers, e.g. 3,17,42"
                )
            })
        })
        .collect::<Result<_, _>>()
        .map(PromptIds)
}

#[derive(Args)]
pub struct CompareTraceArgs {
    pub a: PathBuf,
    pub b: PathBuf,
    /// Relative tolerance on norms and values.
    #[arg(long, default_value_t = 1e-3)]
    pub rtol: f64,
}

#[derive(Args)]
pub struct ImportHfArgs {
    /// An HF checkpoint directory or its config.json.
    pub path: PathBuf,
    /// Where to write the model.ron.
    #[arg(short, long)]
    pub output: PathBuf,
}

#[derive(Args)]
pub struct InspectArgs {
    /// An HF checkpoint directory (config.json + model.safetensors or its sharded index).
    pub checkpoint: PathBuf,
    /// Check against the graph of this attention choice instead of the config's.
    #[arg(long, value_enum)]
    pub attention: Option<AttentionArg>,
}

#[derive(Args)]
pub struct BenchArgs {
    /// A model.ron (with --weights or --random-weights) or an HF checkpoint directory.
    pub model: PathBuf,
    /// Only `cuda`: a benchmark measures the GPU (GPU 0).
    #[arg(long, value_enum, default_value = "cuda")]
    pub device: DeviceArg,
    /// The CUDA compiler (default: $GLMC_NVCC, else nvcc on PATH).
    #[arg(long, value_name = "PATH")]
    pub nvcc: Option<PathBuf>,
    /// The checkpoint directory (default: MODEL when it is one).
    #[arg(long)]
    pub weights: Option<PathBuf>,
    /// Random weights made on the GPU from SEED instead of a checkpoint; SEED also draws the
    /// token ids and the caches' contents.
    #[arg(long, value_name = "SEED", conflicts_with = "weights")]
    pub random_weights: Option<u64>,
    /// Decode batch sizes, comma-separated: each runs at every --context.
    #[arg(long, value_name = "N,...", value_delimiter = ',', num_args = 1.., default_value = "1,8,64")]
    pub batch: Vec<u64>,
    /// Decode contexts in tokens (the step's own token included), comma-separated. Every
    /// sequence's cache is filled with random rows up to the context, not prefilled.
    #[arg(long, value_name = "T,...", value_delimiter = ',', num_args = 1.., default_value = "1024,8192,32768")]
    pub context: Vec<u64>,
    /// Tokens of the prefill that is timed (one sequence, from an empty cache); 0 times none.
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub prefill: u64,
    /// Attention paths to measure, comma-separated (each compiles and loads the model once);
    /// default: the config's.
    #[arg(long, value_name = "A,...", value_enum, value_delimiter = ',', num_args = 1..)]
    pub attention: Vec<AttentionArg>,
    #[arg(long, value_enum, help = DTYPE_HELP)]
    pub dtype: Option<DTypeArg>,
    /// Timed decode steps per batch and context (after the warm-up steps).
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub steps: u64,
    /// Timed prefills.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub prefill_steps: u64,
    /// Untimed steps before each measurement.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub warmup: u64,
    /// Write every measurement to this JSON file (schema glmc-bench/1, bench/README.md).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}
