//! `fuse-elementwise` on whole models: snapshots of the tiny sparse model before and after the
//! pass, translation validation with the reference interpreter (random weights on the tiny
//! configs, the real weights of the `sparse` oracle fixture), and the pass manager catching a
//! broken fused graph.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use glmc_ir::{print_module, DType, Module, Op, Recipe};
use glmc_models::builder::{build, BuildOptions, LogitRows};
use glmc_models::{import_hf, shipped_config_path, ModelConfig};
use glmc_passes::absorb_mla::AbsorbMla;
use glmc_passes::fuse_elementwise::FuseElementwise;
use glmc_passes::fuse_mla_projections::FuseMlaProjections;
use glmc_passes::select_attention::SelectAttention;
use glmc_passes::{AttentionChoice, Pass, PassError, PassManager};
use glmc_runtime::{
    phase_inputs, prefill_inputs, Checkpoint, InterpError, Interpreter, Sampling, SequenceCache,
    Tensor, WeightSource,
};

// ---------------------------------------------------------------------------------------------
// Modules

fn load(file: &str) -> ModelConfig {
    ModelConfig::load(&shipped_config_path(file)).expect("shipped config loads")
}

/// The passes that run before `fuse-elementwise` in the pipeline.
fn before_pass() -> PassManager {
    let mut pm = PassManager::new();
    pm.add(FuseMlaProjections);
    pm.add(SelectAttention {
        choice: AttentionChoice::Auto,
    });
    pm.add(AbsorbMla);
    pm
}

/// The module as `fuse-elementwise` gets it in the pipeline, and as it leaves it.
fn before_and_after(config: &ModelConfig) -> (Module, Module) {
    let all = BuildOptions {
        logits: LogitRows::All,
        ..Default::default()
    };
    let mut before = build(config, &all).expect("the builder's module verifies");
    before_pass()
        .run(&mut before)
        .expect("the earlier passes run");
    let mut after = before.clone();
    let mut pm = PassManager::new();
    pm.add(FuseElementwise);
    let records = pm
        .run(&mut after)
        .expect("fuse-elementwise runs and verifies");
    assert!(records[0].changed, "the pass reports a change");
    (before, after)
}

fn histogram(m: &Module, function: &str) -> BTreeMap<&'static str, usize> {
    let mut h = BTreeMap::new();
    for n in m.function(function).unwrap().graph.node_weights() {
        *h.entry(n.op.name()).or_default() += 1;
    }
    h
}

// ---------------------------------------------------------------------------------------------
// Snapshots

#[test]
fn tiny_sparse_before() {
    let (before, _) = before_and_after(&load("tiny-sparse.ron"));
    insta::assert_snapshot!(print_module(&before));
}

#[test]
fn tiny_sparse_after() {
    let (_, after) = before_and_after(&load("tiny-sparse.ron"));
    insta::assert_snapshot!(print_module(&after));
}

#[test]
fn tiny_sparse_fusion_counts() {
    // 4 layers, each: 2 residual adds + norms, 1 swiglu (dense MLP or shared expert), 3 ropes
    // into matmuls (q_pe, indexer q_pe where the layer has an indexer, k_pe); layer 2 shares
    // layer 1's indexer, so it has no indexer query.
    let (before, after) = before_and_after(&load("tiny-sparse.ron"));
    for phase in ["prefill", "decode"] {
        let (b, a) = (histogram(&before, phase), histogram(&after, phase));
        let get = |h: &BTreeMap<&str, usize>, k: &str| h.get(k).copied().unwrap_or(0);
        assert_eq!(get(&a, "add.rmsnorm"), 8, "{phase}: {a:?}");
        assert_eq!(get(&a, "add"), get(&b, "add") - 8, "{phase}");
        assert_eq!(get(&a, "rmsnorm"), get(&b, "rmsnorm") - 8, "{phase}");
        assert_eq!(get(&a, "swiglu"), 4, "{phase}");
        assert_eq!(get(&a, "silu") + get(&a, "mul"), 0, "{phase}");
        assert_eq!(get(&a, "matmul.rope"), 11, "{phase}: {a:?}");
        assert_eq!(get(&a, "rope"), get(&b, "rope") - 11, "{phase}");
        assert_eq!(get(&a, "matmul"), get(&b, "matmul") - 11, "{phase}");
        assert_eq!(get(&a, "slice"), get(&b, "slice"), "{phase}");
    }
    // A second run finds nothing left to fuse.
    let mut again = after.clone();
    assert!(!FuseElementwise.run(&mut again).unwrap());
    assert_eq!(print_module(&again), print_module(&after));
}

#[test]
fn fused_nodes_keep_the_names_readers_know() {
    let (_, after) = before_and_after(&load("tiny-sparse.ron"));
    let f = after.function("decode").unwrap();
    let op_of = |name: &str| {
        f.node(f.find(name).unwrap_or_else(|| panic!("{name}")))
            .op
            .clone()
    };
    assert!(matches!(
        op_of("model.layers.1.post_attention_layernorm"),
        Op::AddRmsNorm { .. }
    ));
    assert!(matches!(op_of("model.norm"), Op::AddRmsNorm { .. }));
    assert!(f.find("model.layers.1.attn_residual").is_none());
    assert_eq!(op_of("model.layers.0.mlp.act_mul_up"), Op::Swiglu {});
    assert_eq!(
        op_of("model.layers.1.mlp.shared_experts.act_mul_up"),
        Op::Swiglu {}
    );
    // The ropes' names now name the slices that read rotated columns.
    for (rope, matmul, period, start, end) in [
        ("model.layers.1.self_attn.q_pe", "model.layers.1.self_attn.q_b_proj", 16, 8, 16),
        (
            "model.layers.1.self_attn.indexer.q_pe",
            "model.layers.1.self_attn.indexer.wq_b",
            16,
            0,
            8,
        ),
        (
            "model.layers.1.self_attn.k_pe",
            "model.layers.1.self_attn.[q_a_proj;kv_a_proj_with_mqa;indexer.wk;indexer.weights_proj]",
            32 + 24 + 16 + 2,
            32 + 16,
            32 + 24,
        ),
    ] {
        assert!(matches!(op_of(rope), Op::Slice { .. }), "{rope}");
        // The projection's value changed (rotated columns), so its name did too.
        assert!(f.find(matmul).is_none(), "{matmul}");
        let matmul = &format!("{matmul}+rope");
        match op_of(matmul) {
            Op::MatmulRope {
                period: p,
                start: s,
                end: e,
                interleaved: true,
                ..
            } => assert_eq!((p, s, e), (period, start, end), "{matmul}"),
            other => panic!("{matmul} is {other:?}"),
        }
    }
    // So did the values between a projection and the rotated slice; the other slices keep
    // theirs (their columns are untouched).
    for name in ["q_heads", "indexer.q_heads", "kv_a_proj_with_mqa"] {
        let name = format!("model.layers.1.self_attn.{name}");
        assert!(f.find(&name).is_none(), "{name}");
        assert!(f.find(&format!("{name}+rope")).is_some(), "{name}+rope");
    }
    for name in [
        "q_nope",
        "compressed_kv",
        "q_a_proj",
        "indexer.wk",
        "indexer.q_nope",
    ] {
        assert!(matches!(
            op_of(&format!("model.layers.1.self_attn.{name}")),
            Op::Slice { .. }
        ));
    }
    // The indexer key's rope reads a layernorm, not a matmul, and stays.
    assert!(matches!(
        op_of("model.layers.1.self_attn.indexer.k_pe"),
        Op::Rope { .. }
    ));
}

// ---------------------------------------------------------------------------------------------
// Translation validation

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Random checkpoint tensors by HF name, made into weights through their recipes, so a module
/// whose passes concatenated, sliced or reshaped weights reads the same numbers as the original.
struct RandomCheckpoint {
    leaves: HashMap<String, Tensor>,
}

impl RandomCheckpoint {
    fn for_module(m: &Module) -> RandomCheckpoint {
        let mut leaves = HashMap::new();
        for f in &m.functions {
            for n in f.graph.node_weights() {
                if let Op::Weight { recipe } = &n.op {
                    for (name, shape) in recipe.leaves() {
                        leaves
                            .entry(name.clone())
                            .or_insert_with(|| random_leaf(&name, &shape));
                    }
                }
            }
        }
        RandomCheckpoint { leaves }
    }

    fn eval(&self, recipe: &Recipe) -> Result<Tensor, String> {
        let e = |e: glmc_runtime::TensorError| e.to_string();
        let dims = |s: &[u64]| s.iter().map(|&d| d as usize).collect::<Vec<_>>();
        match recipe {
            Recipe::Tensor { name, shape } => {
                let t = self.leaves.get(name).ok_or(format!("no leaf {name}"))?;
                assert_eq!(t.shape(), dims(shape), "{name}");
                Ok(t.clone())
            }
            Recipe::Stack { pattern, count, .. } => {
                let members = (0..*count)
                    .map(|k| {
                        let name = Recipe::stack_member(pattern, k);
                        self.leaves.get(&name).cloned().ok_or(name)
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Tensor::stack(&members).map_err(e)
            }
            Recipe::Slice {
                src,
                axis,
                start,
                end,
            } => self
                .eval(src)?
                .slice(*axis as usize, *start as usize, *end as usize)
                .map_err(e),
            Recipe::Concat { axis, parts } => {
                let parts = parts
                    .iter()
                    .map(|p| self.eval(p))
                    .collect::<Result<Vec<_>, _>>()?;
                Tensor::concat(*axis as usize, &parts).map_err(e)
            }
            Recipe::Reshape { src, shape } => self.eval(src)?.reshape(dims(shape)).map_err(e),
            Recipe::Transpose { src, perm } => self.eval(src)?.transpose(&dims(perm)).map_err(e),
        }
    }
}

impl WeightSource for RandomCheckpoint {
    fn weight(&self, name: &str, recipe: &Recipe, _dtype: DType) -> Result<Tensor, InterpError> {
        self.eval(recipe)
            .map_err(|_| InterpError::MissingWeight { name: name.into() })
    }
}

/// Norm weights near 1, biases small, linear weights scaled by fan-in, embeddings O(1).
fn random_leaf(name: &str, shape: &[u64]) -> Tensor {
    let mut rng = Rng::new(fnv(name));
    let numel: u64 = shape.iter().product();
    let fan_in = *shape.last().unwrap_or(&1) as f32;
    let value = |rng: &mut Rng| -> f32 {
        if name.ends_with("norm.weight") {
            1.0 + 0.5 * rng.unit()
        } else if name.ends_with("bias") {
            0.3 * rng.unit()
        } else if name.contains("embed_tokens") {
            rng.unit() * 1.7
        } else {
            rng.unit() * (3.0 / fan_in).sqrt()
        }
    };
    let data = (0..numel).map(|_| value(&mut rng)).collect();
    Tensor::f32(shape.iter().map(|&d| d as usize).collect(), data).unwrap()
}

/// Every logits tensor of a short session: a prefill per prompt (each its own sequence), then
/// `steps` batched decode steps over all sequences with the given next tokens.
fn session(
    m: &Module,
    weights: &dyn WeightSource,
    prompts: &[Vec<i64>],
    next: &[Vec<i64>],
) -> Vec<Tensor> {
    let greedy = Sampling::default();
    let mut interp = Interpreter::new();
    let mut caches: Vec<SequenceCache> = prompts.iter().map(|_| SequenceCache::new()).collect();
    let mut logits = Vec::new();
    for (p, cache) in prompts.iter().zip(&mut caches) {
        let positions: Vec<i64> = (0..p.len() as i64).collect();
        let mut out = interp
            .run(
                m,
                m.function("prefill").unwrap(),
                weights,
                &mut [cache],
                &prefill_inputs(p, &positions, &greedy, 0, 0),
            )
            .unwrap_or_else(|e| panic!("prefill: {e}"));
        logits.push(out.swap_remove(0));
    }
    for step in next {
        let positions: Vec<i64> = caches.iter().map(|c| c.len() as i64).collect();
        let mut refs: Vec<&mut SequenceCache> = caches.iter_mut().collect();
        let mut out = interp
            .run(
                m,
                m.function("decode").unwrap(),
                weights,
                &mut refs,
                &phase_inputs(step, &positions, &greedy, 0, step.len()),
            )
            .unwrap_or_else(|e| panic!("decode: {e}"));
        logits.push(out.swap_remove(0));
    }
    logits
}

/// `max |a − b| / max |b|`.
fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.shape(), b.shape());
    let (a, b) = (a.as_f32().unwrap(), b.as_f32().unwrap());
    let num = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).abs())
        .fold(0.0, f64::max);
    let den = b.iter().map(|&y| (y as f64).abs()).fold(0.0, f64::max);
    num / den.max(1e-30)
}

fn assert_same_logits(before: &[Tensor], after: &[Tensor], what: &str) {
    assert_eq!(before.len(), after.len());
    for (k, (b, a)) in before.iter().zip(after).enumerate() {
        let rel = rel_err(a, b);
        assert!(
            rel <= 1e-5,
            "{what}: logits {k} differ by {rel:e} (relative)"
        );
        assert!(
            b.as_f32().unwrap().iter().all(|x| x.is_finite()),
            "{what}: logits {k} are not finite"
        );
    }
}

fn random_ids(rng: &mut Rng, n: usize, vocab: u64) -> Vec<i64> {
    (0..n).map(|_| (rng.next_u64() % vocab) as i64).collect()
}

fn validate_random(file: &str) {
    let config = load(file);
    let (before, after) = before_and_after(&config);
    let weights = RandomCheckpoint::for_module(&before);
    let mut rng = Rng::new(fnv(file));
    // One prompt longer than the tiny sparse model's index_topk (8), so sparse selection is
    // active, and one shorter; three batched decode steps after them.
    let prompts = vec![
        random_ids(&mut rng, 11, config.vocab_size),
        random_ids(&mut rng, 5, config.vocab_size),
    ];
    let next: Vec<Vec<i64>> = (0..3)
        .map(|_| random_ids(&mut rng, 2, config.vocab_size))
        .collect();
    let b = session(&before, &weights, &prompts, &next);
    let a = session(&after, &weights, &prompts, &next);
    assert_eq!(a.len(), 5);
    assert_same_logits(&b, &a, file);
}

#[test]
fn translation_validation_tiny_sparse() {
    validate_random("tiny-sparse.ron");
}

#[test]
fn translation_validation_tiny_dense() {
    // Dense attention keeps prefill expanded, so the q_pe rope fuses next to a q_nope slice that
    // mla.attend (not matmul.heads) reads.
    validate_random("tiny-dense.ron");
}

// ---------------------------------------------------------------------------------------------
// The `sparse` oracle fixture, real weights

fn fixture(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/oracle/fixtures")
        .join(case)
}

/// A tensor of `oracle.safetensors`, as f64 (tokens are I64, logits F64).
fn oracle_tensor(dir: &Path, name: &str) -> (Vec<usize>, Vec<f64>) {
    let bytes = std::fs::read(dir.join("oracle.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(name).unwrap();
    let data = t
        .data()
        .chunks_exact(8)
        .map(|c| {
            let b: [u8; 8] = c.try_into().unwrap();
            match t.dtype() {
                safetensors::Dtype::I64 => i64::from_le_bytes(b) as f64,
                safetensors::Dtype::F64 => f64::from_le_bytes(b),
                other => panic!("{name}: unexpected dtype {other:?}"),
            }
        })
        .collect();
    (t.shape().to_vec(), data)
}

#[test]
fn translation_validation_on_the_sparse_oracle_fixture() {
    let dir = fixture("sparse");
    let config = import_hf(&dir.join("config.json"))
        .expect("the fixture's config imports")
        .config;
    let (before, after) = before_and_after(&config);
    let ckpt = Checkpoint::open(&dir).expect("the fixture's weights open");
    let (_, tokens) = oracle_tensor(&dir, "tokens");
    let (_, prompt) = oracle_tensor(&dir, "prompt");
    let (shape, hf_logits) = oracle_tensor(&dir, "logits");
    let tokens: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
    let p = prompt.len();
    // Prefill the prompt, then decode every generated token through the caches.
    let prompts = vec![tokens[..p].to_vec()];
    let next: Vec<Vec<i64>> = tokens[p..].iter().map(|&t| vec![t]).collect();
    let b = session(&before, &ckpt, &prompts, &next);
    let a = session(&after, &ckpt, &prompts, &next);
    assert_same_logits(&b, &a, "sparse fixture");
    // And both are the model transformers ran: row i of HF's logits follows token i.
    let vocab = shape[1];
    let rows: Vec<&[f32]> = a
        .iter()
        .flat_map(|t| t.as_f32().unwrap().chunks_exact(vocab))
        .collect();
    assert_eq!(rows.len(), shape[0]);
    let worst = rows
        .iter()
        .enumerate()
        .flat_map(|(i, row)| {
            row.iter()
                .zip(&hf_logits[i * vocab..(i + 1) * vocab])
                .map(|(&x, &y)| (x as f64 - y).abs())
        })
        .fold(0.0, f64::max);
    assert!(
        worst < 1e-4,
        "fused glmc vs transformers: max |Δlogit| = {worst:e}"
    );
}

// ---------------------------------------------------------------------------------------------
// The pass manager catches a broken fusion

/// `fuse-elementwise`, then a deliberate bug in what it made.
struct Sabotaged(fn(&mut Module));

impl Pass for Sabotaged {
    fn name(&self) -> &'static str {
        FuseElementwise.name()
    }

    fn run(&self, module: &mut Module) -> Result<bool, PassError> {
        FuseElementwise.run(module)?;
        (self.0)(module);
        Ok(true)
    }
}

fn first_node(m: &mut Module, pick: fn(&Op) -> bool) -> (usize, glmc_ir::NodeIndex) {
    for (k, f) in m.functions.iter().enumerate() {
        if let Some(n) = f
            .canonical_order()
            .into_iter()
            .find(|&n| pick(&f.node(n).op))
        {
            return (k, n);
        }
    }
    panic!("no such node")
}

fn sabotaged_error(sabotage: fn(&mut Module)) -> String {
    let mut m = build(&load("tiny-sparse.ron"), &BuildOptions::default()).unwrap();
    before_pass().run(&mut m).unwrap();
    let mut pm = PassManager::new();
    pm.add(Sabotaged(sabotage));
    match pm.run(&mut m) {
        Ok(_) => panic!("a broken fused graph verified"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn verifier_names_the_pass_when_add_rmsnorm_loses_an_output() {
    let msg = sabotaged_error(|m| {
        let (k, n) = first_node(m, |op| matches!(op, Op::AddRmsNorm { .. }));
        m.functions[k].graph[n].outputs.truncate(1);
    });
    assert!(
        msg.starts_with("after pass `fuse-elementwise` the module no longer verifies"),
        "{msg}"
    );
}

#[test]
fn verifier_names_the_pass_when_matmul_rope_loses_its_positions() {
    let msg = sabotaged_error(|m| {
        let (k, n) = first_node(m, |op| matches!(op, Op::MatmulRope { .. }));
        let f = &mut m.functions[k];
        let edge = f
            .graph
            .edges_directed(n, petgraph::Direction::Incoming)
            .find(|e| e.weight().index == 2)
            .map(|e| petgraph::visit::EdgeRef::id(&e))
            .unwrap();
        f.graph.remove_edge(edge);
    });
    assert!(
        msg.starts_with("after pass `fuse-elementwise` the module no longer verifies"),
        "{msg}"
    );
    assert!(msg.contains("(matmul.rope of"), "{msg}");
    assert!(msg.contains("takes 3 operands, has 2"), "{msg}");
}
