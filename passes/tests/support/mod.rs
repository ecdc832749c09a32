//! Test support for the passes' suite: modules built from configs, random weights written to a
//! real safetensors checkpoint (so recipes are applied by the runtime's own loader), workloads
//! of token ids, the reference interpreter's logits for a workload, and the top-k gaps that
//! tell whether a workload is safe to compare across graph forms.

#![allow(dead_code)] // each test binary uses a different subset
#![allow(clippy::result_large_err)] // PassError is the crate's error type, returned as is

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use glmc_ir::{Module, Node, Op};
use glmc_models::builder::{BuildOptions, LogitRows};
use glmc_models::ModelConfig;
use glmc_passes::{pipeline, AttentionChoice, PassError, PassManager, PipelineOptions, PIPELINE};
use glmc_runtime::{
    phase_inputs, prefill_inputs, Checkpoint, InterpError, Interpreter, Sampling, SequenceCache,
    Tensor, TraceFn, WeightSource,
};

// ---------------------------------------------------------------------------------------------
// Configs and modules

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("passes/ has a parent")
        .to_path_buf()
}

/// A shipped config, `models/<file>`.
pub fn shipped(file: &str) -> ModelConfig {
    let path = glmc_models::shipped_config_path(file);
    ModelConfig::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The builder's module for `config` (expanded MLA, separate projections, the indexer), with
/// the logits of every prefill position, which translation validation compares.
pub fn build(config: &ModelConfig) -> Module {
    let options = BuildOptions {
        logits: LogitRows::All,
        ..Default::default()
    };
    glmc_models::builder::build(config, &options)
        .unwrap_or_else(|e| panic!("building {}: {e}", config.name))
}

/// The oracle fixture directories, sorted by case name.
pub fn oracle_fixtures() -> Vec<PathBuf> {
    let root = repo_root().join("tests/oracle/fixtures");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.join("config.json").is_file() && p.join("model.safetensors").is_file())
        .collect();
    dirs.sort();
    dirs
}

/// The pipeline (`glmc_passes::pipeline`) with every pass but `name` disabled: one pass of the
/// real pipeline, as `glmc compile` configures it, run by the real `PassManager` (which
/// verifies the module after it).
pub fn single_pass(name: &str, choice: AttentionChoice) -> PassManager {
    let disabled = PIPELINE
        .iter()
        .filter(|p| **p != name)
        .map(|p| p.to_string())
        .collect();
    pipeline(&PipelineOptions {
        attention: choice,
        disabled,
        ..Default::default()
    })
    .expect("every name comes from PIPELINE")
}

/// Runs one pass of the pipeline on a copy of `module`; returns the result and "changed".
pub fn apply(
    name: &str,
    choice: AttentionChoice,
    module: &Module,
) -> Result<(Module, bool), PassError> {
    let mut m = module.clone();
    let records = single_pass(name, choice).run(&mut m)?;
    assert_eq!(records.len(), 1, "one pass runs");
    assert_eq!(records[0].name, name);
    Ok((m, records[0].changed))
}

/// The module after each pass of the pipeline (`PIPELINE` order, whatever passes it holds),
/// each applied on top of the previous: `(pass name, module, changed)`, starting with
/// `("builder", module, false)`.
pub fn stages(module: &Module, choice: AttentionChoice) -> Vec<(&'static str, Module, bool)> {
    stages_of(module, choice, &PIPELINE)
}

/// [`stages`] over the passes `names` only (in the order given).
pub fn stages_of(
    module: &Module,
    choice: AttentionChoice,
    names: &[&'static str],
) -> Vec<(&'static str, Module, bool)> {
    let mut out = vec![("builder", module.clone(), false)];
    for &name in names {
        let prev = &out.last().expect("non-empty").1;
        let (m, changed) = apply(name, choice, prev).unwrap_or_else(|e| panic!("{name}: {e}"));
        out.push((name, m, changed));
    }
    out
}

/// The first line where two dumps differ, for assertion messages that fit on a screen.
pub fn first_difference(a: &str, b: &str) -> Option<String> {
    let (la, lb): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    (0..la.len().max(lb.len())).find_map(|i| {
        let (x, y) = (la.get(i).copied(), lb.get(i).copied());
        (x != y).then(|| format!("line {}:\n  {x:?}\n  {y:?}", i + 1))
    })
}

// ---------------------------------------------------------------------------------------------
// Random numbers

/// SplitMix64: small, deterministic, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform(); // (0, 1]
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// FNV-1a, so each tensor's values depend on its name and the seed only (not on the order in
/// which tensors are visited).
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

// ---------------------------------------------------------------------------------------------
// Weights

/// A checkpoint the interpreter reads weights from through their recipes: random weights in a
/// temporary directory, or an oracle fixture's real ones.
pub struct Weights {
    checkpoint: Checkpoint,
    /// Keeps the temporary checkpoint directory alive.
    _dir: Option<tempfile::TempDir>,
}

impl WeightSource for Weights {
    fn weight(
        &self,
        name: &str,
        recipe: &glmc_ir::Recipe,
        dtype: glmc_ir::DType,
    ) -> Result<Tensor, InterpError> {
        self.checkpoint.weight(name, recipe, dtype)
    }
}

impl Weights {
    /// The HF checkpoint in `dir` (`model.safetensors`).
    pub fn open(dir: &Path) -> Weights {
        Weights {
            checkpoint: Checkpoint::open(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())),
            _dir: None,
        }
    }

    /// A random f32 tensor for every recipe leaf (HF tensor name → its leaf shape) of every
    /// weight node of `module`, written as `model.safetensors` in a temporary directory.
    /// Deterministic in `seed`; each tensor depends only on the seed and its name.
    pub fn random(module: &Module, seed: u64) -> Weights {
        let leaves = recipe_leaves(module);
        let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = leaves
            .iter()
            .map(|(name, shape)| {
                let mut rng = Rng::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ fnv1a(name));
                let values = init_values(name, shape, &mut rng);
                let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                (
                    name.clone(),
                    shape.iter().map(|&d| d as usize).collect(),
                    bytes,
                )
            })
            .collect();
        let views = tensors.iter().map(|(name, shape, bytes)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                    .expect("consistent tensor view");
            (name.clone(), view)
        });
        let dir = tempfile::tempdir().expect("a temporary directory");
        safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors"))
            .expect("writing model.safetensors");
        Weights {
            checkpoint: Checkpoint::open(dir.path()).expect("opening the random checkpoint"),
            _dir: Some(dir),
        }
    }
}

/// Every checkpoint tensor any weight node's recipe reads, with its leaf shape. Two recipes
/// that read one tensor with different shapes are a bug in the builder or a pass.
pub fn recipe_leaves(module: &Module) -> BTreeMap<String, Vec<u64>> {
    let mut leaves: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for f in &module.functions {
        for node in f.graph.node_weights() {
            if let Op::Weight { recipe } = &node.op {
                for (name, shape) in recipe.leaves() {
                    if let Some(old) = leaves.insert(name.clone(), shape.clone()) {
                        assert_eq!(old, shape, "tensor {name} is read with two shapes");
                    }
                }
            }
        }
    }
    leaves
}

/// Values like the oracle fixtures' (tests/oracle/README.md): norms U(0.5, 1.5), the indexer's
/// k_norm bias N(0, 0.5), the router's correction bias N(0, 0.3), embeddings N(0, 1), linear
/// weights N(0, 1/fan_in) with lm_head and the router ×2.
fn init_values(name: &str, shape: &[u64], rng: &mut Rng) -> Vec<f32> {
    let n: u64 = shape.iter().product();
    let gen: Box<dyn FnMut(&mut Rng) -> f64> = if name.ends_with("norm.weight") {
        Box::new(|r| 0.5 + r.uniform())
    } else if name.ends_with("k_norm.bias") {
        Box::new(|r| 0.5 * r.normal())
    } else if name.ends_with("e_score_correction_bias") {
        Box::new(|r| 0.3 * r.normal())
    } else if name.ends_with("embed_tokens.weight") {
        Box::new(|r| r.normal())
    } else {
        let fan_in = *shape.last().expect("a linear weight has a shape") as f64;
        let mut std = fan_in.powf(-0.5);
        if name == "lm_head.weight" || name.ends_with("mlp.gate.weight") {
            std *= 2.0;
        }
        Box::new(move |r| std * r.normal())
    };
    let mut gen = gen;
    (0..n).map(|_| gen(rng) as f32).collect()
}

/// Random token ids in `0..vocab`.
pub fn random_ids(vocab: u64, n: usize, seed: u64) -> Vec<i64> {
    let mut rng = Rng::new(seed ^ 0x1d5_1d5);
    (0..n).map(|_| rng.below(vocab) as i64).collect()
}

/// The vocabulary size of a module (rows of the embedding table).
pub fn vocab(module: &Module) -> u64 {
    let f = module.function("prefill").expect("a prefill function");
    f.graph
        .node_weights()
        .find(|n| n.name == "model.embed_tokens.weight")
        .and_then(|n| n.outputs[0].shape[0].as_const())
        .expect("an embedding table")
}

// ---------------------------------------------------------------------------------------------
// Workloads

/// One sequence: prefilled chunk by chunk (chunked prefill continues at the cache's length),
/// then one decode token per decode step.
#[derive(Clone, Debug, PartialEq)]
pub struct Sequence {
    pub chunks: Vec<Vec<i64>>,
    pub decode: Vec<i64>,
}

impl Sequence {
    pub fn prefill_len(&self) -> usize {
        self.chunks.iter().map(Vec::len).sum()
    }

    /// Tokens the last query of the sequence sees (its context).
    pub fn context(&self) -> usize {
        self.prefill_len() + self.decode.len()
    }
}

/// Sequences prefilled one by one, then decoded together as one batch (sequence `i` is row `i`
/// of every decode call), so decode runs with `b = sequences.len()` rows at different positions.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    pub sequences: Vec<Sequence>,
}

impl Workload {
    /// Prefill `ids` in one call, then decode `decode`.
    pub fn single(ids: &[i64], decode: &[i64]) -> Workload {
        Workload {
            sequences: vec![Sequence {
                chunks: vec![ids.to_vec()],
                decode: decode.to_vec(),
            }],
        }
    }

    /// Two random sequences: A of `len_a` tokens prefilled at once, B prefilled in two chunks of
    /// `chunks_b` tokens; then `decode` decode steps with both in one batch.
    pub fn random(
        vocab: u64,
        len_a: usize,
        chunks_b: (usize, usize),
        decode: usize,
        seed: u64,
    ) -> Workload {
        let ids = random_ids(vocab, len_a + chunks_b.0 + chunks_b.1 + 2 * decode, seed);
        let (a, rest) = ids.split_at(len_a);
        let (b0, rest) = rest.split_at(chunks_b.0);
        let (b1, rest) = rest.split_at(chunks_b.1);
        let (da, db) = rest.split_at(decode);
        Workload {
            sequences: vec![
                Sequence {
                    chunks: vec![a.to_vec()],
                    decode: da.to_vec(),
                },
                Sequence {
                    chunks: vec![b0.to_vec(), b1.to_vec()],
                    decode: db.to_vec(),
                },
            ],
        }
    }

    /// The longest context any query sees.
    pub fn max_context(&self) -> usize {
        self.sequences
            .iter()
            .map(Sequence::context)
            .max()
            .unwrap_or(0)
    }

    /// The same workload cut so that no context exceeds `max_context`: each sequence keeps a
    /// prefix of its prefill (chunk structure kept, empty chunks dropped) and all its decode
    /// tokens. `None` when the decode steps alone do not fit.
    pub fn truncated(&self, max_context: usize) -> Option<Workload> {
        let mut sequences = Vec::new();
        for s in &self.sequences {
            let keep = max_context.checked_sub(s.decode.len()).filter(|&k| k > 0)?;
            let mut left = keep.min(s.prefill_len());
            let mut chunks = Vec::new();
            for c in &s.chunks {
                let take = left.min(c.len());
                if take > 0 {
                    chunks.push(c[..take].to_vec());
                }
                left -= take;
            }
            sequences.push(Sequence {
                chunks,
                decode: s.decode.clone(),
            });
        }
        Some(Workload { sequences })
    }
}

/// Logits rows, one `Vec` per query row.
pub type Rows = Vec<Vec<f32>>;

/// Prefill on all of `ids`, then decode 2 more tokens (the first and the last of `ids` again:
/// fixed, so that two graphs see the same inputs whatever their logits); every logits row.
pub fn logits(module: &Module, weights: &dyn WeightSource, ids: &[i64]) -> Rows {
    let decode = [ids[0], ids[ids.len() - 1]];
    run(module, weights, &Workload::single(ids, &decode))
        .unwrap_or_else(|e| panic!("running {}: {e}", module.name))
}

/// Runs `workload` on the reference interpreter; every logits row: each sequence's prefill
/// rows in order, then each decode step's rows (one per sequence).
pub fn run(
    module: &Module,
    weights: &dyn WeightSource,
    workload: &Workload,
) -> Result<Rows, InterpError> {
    run_traced(module, weights, workload, &mut |_, _| {})
}

pub fn run_traced(
    module: &Module,
    weights: &dyn WeightSource,
    workload: &Workload,
    trace: &mut TraceFn<'_>,
) -> Result<Rows, InterpError> {
    run_on(&mut Interpreter::new(), module, weights, workload, trace)
}

/// Runs every rank's module of one tensor-parallel group on its own thread, their collectives
/// meeting through one communicator group; each rank's logits rows, by rank.
pub fn run_ranks(
    modules: &[Module],
    weights: &Weights,
    workload: &Workload,
) -> Result<Vec<Rows>, InterpError> {
    let comms = glmc_runtime::Communicator::group(modules.len());
    std::thread::scope(|scope| {
        let handles: Vec<_> = modules
            .iter()
            .zip(comms)
            .map(|(m, comm)| {
                scope.spawn(move || {
                    let mut interp = Interpreter::new().with_communicator(comm);
                    run_on(&mut interp, m, weights, workload, &mut |_, _| {})
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank's thread panicked"))
            .collect()
    })
}

fn run_on(
    interp: &mut Interpreter,
    module: &Module,
    weights: &dyn WeightSource,
    workload: &Workload,
    trace: &mut TraceFn<'_>,
) -> Result<Rows, InterpError> {
    let mut rows = Vec::new();
    each_call(interp, module, weights, workload, trace, &mut |_, out| {
        push_rows(&mut rows, &out[0])
    })?;
    Ok(rows)
}

/// Every call's `next_token` ids of `workload` (greedy), on the reference interpreter: each
/// sequence's prefill chunks in order, then each decode step's ids (one per sequence).
pub fn next_tokens(
    module: &Module,
    weights: &dyn WeightSource,
    workload: &Workload,
) -> Result<Vec<i64>, InterpError> {
    let mut ids = Vec::new();
    each_call(
        &mut Interpreter::new(),
        module,
        weights,
        workload,
        &mut |_, _| {},
        &mut |f, out| {
            let k = f
                .results
                .iter()
                .position(|(n, _)| n == "next_token")
                .expect("a next_token result");
            ids.extend_from_slice(out[k].as_i64().expect("i64 tokens"));
        },
    )?;
    Ok(ids)
}

/// Runs `workload` (greedy: its prefills one sequence and chunk at a time, then its decode
/// steps as one batch) and hands each call's function and results to `on_call`.
fn each_call(
    interp: &mut Interpreter,
    module: &Module,
    weights: &dyn WeightSource,
    workload: &Workload,
    trace: &mut TraceFn<'_>,
    on_call: &mut dyn FnMut(&glmc_ir::Function, Vec<Tensor>),
) -> Result<(), InterpError> {
    let prefill = module.function("prefill").expect("a prefill function");
    let decode = module.function("decode").expect("a decode function");
    let mut caches: Vec<SequenceCache> = vec![SequenceCache::new(); workload.sequences.len()];
    let greedy = Sampling::default();
    for (s, cache) in workload.sequences.iter().zip(&mut caches) {
        let mut pos = 0i64;
        for chunk in &s.chunks {
            let n = chunk.len() as i64;
            let positions: Vec<i64> = (pos..pos + n).collect();
            let inputs = prefill_inputs(chunk, &positions, &greedy, 0, 0);
            on_call(
                prefill,
                interp.run_traced(module, prefill, weights, &mut [cache], &inputs, trace)?,
            );
            pos += n;
        }
    }
    let steps = workload.sequences.first().map_or(0, |s| s.decode.len());
    assert!(
        workload.sequences.iter().all(|s| s.decode.len() == steps),
        "every sequence of a batch decodes the same number of steps"
    );
    for step in 0..steps {
        let ids: Vec<i64> = workload.sequences.iter().map(|s| s.decode[step]).collect();
        let positions: Vec<i64> = workload
            .sequences
            .iter()
            .map(|s| (s.prefill_len() + step) as i64)
            .collect();
        let mut refs: Vec<&mut SequenceCache> = caches.iter_mut().collect();
        let inputs = phase_inputs(&ids, &positions, &greedy, 0, ids.len());
        on_call(
            decode,
            interp.run_traced(module, decode, weights, &mut refs, &inputs, trace)?,
        );
    }
    Ok(())
}

fn push_rows(rows: &mut Rows, logits: &Tensor) {
    let width = *logits.shape().last().expect("logits [n, vocab]");
    let data = logits.as_f32().expect("f32 logits");
    rows.extend(data.chunks(width.max(1)).map(<[f32]>::to_vec));
}

/// `max|a − b| / max|a|` over every element; infinite when the shapes differ or a value is not
/// finite.
pub fn rel_error(a: &Rows, b: &Rows) -> f64 {
    if a.len() != b.len() || a.iter().zip(b).any(|(x, y)| x.len() != y.len()) {
        return f64::INFINITY;
    }
    let mut diff = 0f64;
    let mut scale = 0f64;
    for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
        if !x.is_finite() || !y.is_finite() {
            return f64::INFINITY;
        }
        diff = diff.max((*x as f64 - *y as f64).abs());
        scale = scale.max((*x as f64).abs());
    }
    if scale == 0.0 {
        diff
    } else {
        diff / scale
    }
}

// ---------------------------------------------------------------------------------------------
// Top-k gaps

/// The smallest relative gap `(v_k − v_{k+1}) / max|v|` seen at every top-k boundary a run
/// depends on (tests/oracle/README.md, check (b)); infinite when there was nothing to check.
/// Two graph forms of one function differ by f32 rounding, which can flip a top-k choice only
/// where such a gap is of that order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gaps {
    /// DSA indexer: rows with more causal keys than `index_topk`.
    pub indexer: f64,
    /// Router: the expert top-k among the kept groups' selection scores.
    pub router: f64,
    /// Router: the group top-k (group-limited routing only).
    pub group: f64,
}

impl Gaps {
    pub fn min(&self) -> f64 {
        self.indexer.min(self.router).min(self.group)
    }
}

/// The relative gap at the `k` boundary of `values` (any order); infinite when there are at most
/// `k` values.
fn gap_at(values: &[f64], k: usize) -> f64 {
    if values.len() <= k {
        return f64::INFINITY;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| b.partial_cmp(a).expect("no NaN"));
    let scale = v.iter().fold(0f64, |m, x| m.max(x.abs()));
    if scale == 0.0 {
        return 0.0;
    }
    (v[k - 1] - v[k]) / scale
}

/// Runs `workload` (like [`run`]) and measures the top-k gaps of every indexer and router call.
pub fn run_with_gaps(
    module: &Module,
    weights: &dyn WeightSource,
    workload: &Workload,
) -> Result<(Rows, Gaps), InterpError> {
    let k = glmc_passes::select_attention::index_topk(module).map(|k| k as usize);
    let mut gaps = Gaps {
        indexer: f64::INFINITY,
        router: f64::INFINITY,
        group: f64::INFINITY,
    };
    // Outputs of the nodes the gaps are computed from, by node name.
    let mut seen: HashMap<String, Held> = HashMap::new();
    let rows = run_traced(
        module,
        weights,
        workload,
        &mut |node: &Node, outs: &[&Tensor]| {
            let name = node.name.as_str();
            match &node.op {
                Op::Concat { .. } if name.ends_with(".indexer.q") => {
                    seen.insert(name.to_string(), Held::of(outs[0]));
                }
                Op::CacheUpdate { .. } if name.ends_with(".indexer.cache.k") => {
                    seen.insert(name.to_string(), Held::of(outs[0]));
                }
                Op::Matmul {} if name.ends_with(".mlp.gate") => {
                    seen.insert(name.to_string(), Held::of(outs[0]));
                }
                Op::Weight { .. } if name.ends_with(".mlp.gate.e_score_correction_bias") => {
                    seen.insert(name.to_string(), Held::of(outs[0]));
                }
                Op::DsaScore { .. } => {
                    let k = k.expect("a dsa.score implies a dsa.topk");
                    let p = name
                        .strip_suffix(".scores")
                        .expect("indexer scores are named <indexer>.scores");
                    let gap = indexer_gap(
                        &Held::of(outs[0]),
                        &seen[&format!("{p}.q")],
                        &seen[&format!("{p}.cache.k")],
                        k,
                    );
                    gaps.indexer = gaps.indexer.min(gap);
                }
                Op::MoeRoute {
                    n_group,
                    top_k,
                    topk_group,
                    ..
                } => {
                    let p = name
                        .strip_suffix(".router")
                        .expect("routers are named <mlp>.router");
                    let logits = &seen[&format!("{p}.gate")].data;
                    let bias = &seen[&format!("{p}.gate.e_score_correction_bias")].data;
                    let (router, group) = router_gaps(
                        logits,
                        bias,
                        *n_group as usize,
                        *topk_group as usize,
                        *top_k as usize,
                    );
                    gaps.router = gaps.router.min(router);
                    gaps.group = gaps.group.min(group);
                }
                _ => {}
            }
        },
    )?;
    Ok((rows, gaps))
}

/// A traced output as f64.
struct Held {
    shape: Vec<usize>,
    data: Vec<f64>,
}

impl Held {
    fn of(t: &Tensor) -> Held {
        Held {
            shape: t.shape().to_vec(),
            data: to_f64(t),
        }
    }
}

/// The smallest gap of one `dsa.score` call: `scores [n, t]` (−inf past each row's position),
/// `q [n, Hi, D]`, `keys [(b,) t, D]`.
///
/// Keys whose every head's dot product is <= 0 score exactly 0 after the ReLU and tie; the
/// tie is broken by key index, the same in every form, unless one of those dot products is
/// within rounding of 0. So when the boundary falls inside such a run of exact zeros, the
/// "gap" is the margin by which the zero keys' dot products stay below 0 (relative to the
/// row's largest dot product).
fn indexer_gap(scores: &Held, q: &Held, keys: &Held, k: usize) -> f64 {
    let (n, t) = (scores.shape[0], scores.shape[1]);
    let (heads, dim) = (q.shape[1], q.shape[2]);
    let batched = keys.shape.len() == 3;
    let key = |i: usize, j: usize| {
        let b = if batched { i } else { 0 };
        let off = (b * t + j) * dim;
        &keys.data[off..off + dim]
    };
    let dot = |i: usize, h: usize, j: usize| -> f64 {
        let off = (i * heads + h) * dim;
        q.data[off..off + dim]
            .iter()
            .zip(key(i, j))
            .map(|(a, b)| a * b)
            .sum()
    };
    let mut min_gap = f64::INFINITY;
    for i in 0..n {
        let row = &scores.data[i * t..(i + 1) * t];
        let finite: Vec<f64> = row.iter().copied().filter(|x| x.is_finite()).collect();
        let mut gap = gap_at(&finite, k);
        if gap == 0.0 && boundary_value(&finite, k) == Some(0.0) {
            let valid: Vec<usize> = (0..t).filter(|&j| row[j].is_finite()).collect();
            let scale = valid
                .iter()
                .flat_map(|&j| (0..heads).map(move |h| (h, j)))
                .map(|(h, j)| dot(i, h, j).abs())
                .fold(0f64, f64::max);
            gap = valid
                .iter()
                .filter(|&&j| row[j] == 0.0)
                .map(|&j| {
                    let most = (0..heads).map(|h| dot(i, h, j)).fold(f64::MIN, f64::max);
                    if scale > 0.0 {
                        -most / scale
                    } else {
                        0.0
                    }
                })
                .fold(f64::INFINITY, f64::min);
        }
        min_gap = min_gap.min(gap);
    }
    min_gap
}

/// The `k`-th largest of `values`, when there are more than `k`.
fn boundary_value(values: &[f64], k: usize) -> Option<f64> {
    if values.len() <= k {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| b.partial_cmp(a).expect("no NaN"));
    Some(v[k - 1])
}

/// The router's gaps for `logits [n, E]`: `(expert top-k gap, group top-k gap)`, computed as
/// `moe.route` selects: `choice = sigmoid(logits) + bias`, groups scored by the sum of their
/// two best choices, the best `topk_group` groups kept, then the best `top_k` experts of those.
fn router_gaps(
    logits: &[f64],
    bias: &[f64],
    n_group: usize,
    topk_group: usize,
    top_k: usize,
) -> (f64, f64) {
    let e = bias.len();
    let group = e / n_group;
    let (mut router, mut groups) = (f64::INFINITY, f64::INFINITY);
    for row in logits.chunks(e) {
        let choice: Vec<f64> = row
            .iter()
            .zip(bias)
            .map(|(&l, &b)| 1.0 / (1.0 + (-l).exp()) + b)
            .collect();
        let mut kept: Vec<usize> = (0..n_group).collect();
        if topk_group < n_group {
            let scores: Vec<f64> = choice
                .chunks(group)
                .map(|g| {
                    let mut g = g.to_vec();
                    g.sort_by(|a, b| b.partial_cmp(a).expect("no NaN"));
                    g.iter().take(2).sum()
                })
                .collect();
            groups = groups.min(gap_at(&scores, topk_group));
            kept.sort_by(|&a, &b| {
                scores[b]
                    .partial_cmp(&scores[a])
                    .expect("no NaN")
                    .then(a.cmp(&b))
            });
            kept.truncate(topk_group);
        }
        let candidates: Vec<f64> = kept
            .iter()
            .flat_map(|&g| choice[g * group..(g + 1) * group].iter().copied())
            .collect();
        router = router.min(gap_at(&candidates, top_k));
    }
    (router, groups)
}

fn to_f64(t: &Tensor) -> Vec<f64> {
    t.as_f32().expect("f32").iter().map(|&x| x as f64).collect()
}

/// Token ids stored in an oracle fixture's `oracle.safetensors` (`tokens`: prompt then generated).
pub fn fixture_tokens(dir: &Path) -> Vec<i64> {
    let path = dir.join("oracle.safetensors");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("a safetensors file");
    let view = st.tensor("tokens").expect("a tokens tensor");
    assert_eq!(view.dtype(), safetensors::Dtype::I64);
    view.data()
        .chunks(8)
        .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
        .collect()
}
