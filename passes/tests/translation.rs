//! Translation validation: the reference interpreter gives the same logits before and after
//! every pass (each on its own on the builder's graph, and each on top of the previous one in
//! pipeline order, for attention auto, sparse and dense), and after the whole pipeline run by
//! the `PassManager`.
//!
//! Models: the shipped tiny configs with random weights, every oracle fixture with its real
//! weights, and proptest-generated small configs with random weights. Inputs are workloads of
//! two sequences (one prefilled at once, one in two chunks) decoded together as a batch of two,
//! so chunked prefill and batched decode at different positions are both covered.
//!
//! `select-attention=dense` is a semantic choice, not an optimisation: it equals the model only
//! while no query sees more than `index_topk` keys. It is validated on workloads within that
//! bound, and asserted to differ on longer ones.
//!
//! Random weights can put two top-k candidates (indexer keys, router experts or groups) within
//! f32 rounding of each other, and then the rounding difference between two graph forms may flip
//! a choice. Every reference run measures the gaps at every top-k boundary it relies on
//! (`support::run_with_gaps`); the random cases reseed until the smallest relative gap is at
//! least `MIN_GAP`, and the fixtures (made with a 1e-3 gap rule) must pass the same check.

mod support;

use std::collections::HashMap;

use glmc_ir::{print_module, DType, Module};
use glmc_models::{IndexerConfig, IndexerLayerType, ModelConfig};
use glmc_passes::select_attention::index_topk;
use glmc_passes::{pipeline, AttentionChoice, PassError, PipelineOptions, PIPELINE};
use proptest::prelude::*;
use support::*;

/// Largest accepted `max|a − b| / max|a|` between two forms, in f32.
const TOL: f64 = 1e-5;
/// Smallest accepted relative top-k gap; the forms differ by about 1e-7 relative.
const MIN_GAP: f64 = 1e-4;
/// How many seeds a random case may try before giving up on finding one without near-ties.
const SEED_ATTEMPTS: u64 = 24;

const CHOICES: [AttentionChoice; 3] = [
    AttentionChoice::Auto,
    AttentionChoice::Sparse,
    AttentionChoice::Dense,
];

/// A model, its weights and the workloads to compare on.
struct Case {
    name: String,
    module: Module,
    weights: Weights,
    workloads: Vec<Workload>,
}

/// Logits per (module dump, workload), so a module reached twice (a pass that changed nothing,
/// the same pipeline through the manager) runs once.
struct Runner<'a> {
    case: &'a Case,
    memo: HashMap<(String, usize), Rows>,
}

impl Runner<'_> {
    fn logits(&mut self, m: &Module, w: usize) -> Rows {
        let key = (print_module(m), w);
        if let Some(rows) = self.memo.get(&key) {
            return rows.clone();
        }
        let rows = run(m, &self.case.weights, &self.case.workloads[w])
            .unwrap_or_else(|e| panic!("{}: running the module: {e}", self.case.name));
        self.memo.insert(key, rows.clone());
        rows
    }
}

/// Whether `choice` computes the same function as the builder's graph on workload `w`.
fn same_function(case: &Case, choice: AttentionChoice, w: usize, topk: Option<u64>) -> bool {
    match (choice, topk) {
        (AttentionChoice::Dense, Some(k)) => case.workloads[w].max_context() as u64 <= k,
        _ => true,
    }
}

/// Validates every pass, alone and in pipeline order, and the whole pipeline; returns the
/// largest relative error seen per pass, for the log.
fn validate(case: &Case) -> Vec<(String, f64)> {
    let topk = index_topk(&case.module);
    let mut runner = Runner {
        case,
        memo: HashMap::new(),
    };
    let mut worst: Vec<(String, f64)> = Vec::new();
    let mut record = |label: String, rel: f64| match worst.iter_mut().find(|(l, _)| *l == label) {
        Some((_, r)) => *r = r.max(rel),
        None => worst.push((label, rel)),
    };
    let n_workloads = case.workloads.len();

    for choice in CHOICES {
        if choice == AttentionChoice::Sparse && topk.is_none() {
            let err = apply("select-attention", choice, &case.module)
                .expect_err("attention=sparse without an indexer must fail");
            assert!(
                matches!(err, PassError::Options { .. }),
                "{}: {err}",
                case.name
            );
            continue;
        }
        // In pipeline order, each pass on top of the previous.
        let stages = stages(&case.module, choice);
        for pair in stages.windows(2) {
            let ((_, before, _), (pass, after, _)) = (&pair[0], &pair[1]);
            // Before select-attention every stage is the model itself.
            let selected = stages
                .iter()
                .position(|(p, _, _)| *p == "select-attention")
                .expect("select-attention runs");
            let after_select = stages.iter().position(|(p, _, _)| p == pass).unwrap() >= selected;
            for w in 0..n_workloads {
                if after_select && !same_function(case, choice, w, topk) {
                    continue;
                }
                let (a, b) = (runner.logits(before, w), runner.logits(after, w));
                let rel = rel_error(&a, &b);
                record(format!("{pass} ({choice:?}, in pipeline)"), rel);
                assert!(
                    rel <= TOL,
                    "{}: attention={choice:?}: `{pass}` in pipeline order changes the logits of \
                     workload {w}: max|a-b|/max|a| = {rel:e}",
                    case.name
                );
            }
        }
        // The whole pipeline through the manager: the same module, the same logits.
        let mut managed = case.module.clone();
        let pm = pipeline(&PipelineOptions {
            attention: choice,
            ..Default::default()
        })
        .expect("the default pipeline");
        pm.run(&mut managed)
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let last = &stages.last().expect("stages").1;
        if let Some(diff) = first_difference(&print_module(&managed), &print_module(last)) {
            panic!(
                "{}: the PassManager's pipeline differs from its passes run one by one, {diff}",
                case.name
            );
        }
        for w in 0..n_workloads {
            let (a, b) = (runner.logits(&case.module, w), runner.logits(&managed, w));
            let rel = rel_error(&a, &b);
            if same_function(case, choice, w, topk) {
                record(format!("pipeline ({choice:?})"), rel);
                assert!(
                    rel <= TOL,
                    "{}: the pipeline with attention={choice:?} changes the logits of workload \
                     {w}: {rel:e}",
                    case.name
                );
            } else {
                // More keys than index_topk: dense attention is another function.
                record(format!("pipeline ({choice:?}) beyond index_topk"), rel);
                assert!(
                    rel > 10.0 * TOL,
                    "{}: attention=dense on workload {w} (context {} > index_topk {topk:?}) \
                     should differ from sparse attention, but the logits agree to {rel:e}",
                    case.name,
                    case.workloads[w].max_context()
                );
            }
        }
    }

    // Each pass alone on the builder's graph; select-attention with every choice.
    let mut alone: Vec<(&str, AttentionChoice)> = PIPELINE
        .iter()
        .map(|&p| (p, AttentionChoice::Auto))
        .collect();
    alone.push(("select-attention", AttentionChoice::Dense));
    if topk.is_some() {
        alone.push(("select-attention", AttentionChoice::Sparse));
    }
    for (pass, choice) in alone {
        let (after, _) = apply(pass, choice, &case.module)
            .unwrap_or_else(|e| panic!("{}: {pass} alone: {e}", case.name));
        let semantic = pass == "select-attention";
        for w in 0..n_workloads {
            if semantic && !same_function(case, choice, w, topk) {
                continue;
            }
            let (a, b) = (runner.logits(&case.module, w), runner.logits(&after, w));
            let rel = rel_error(&a, &b);
            record(format!("{pass} ({choice:?}, alone)"), rel);
            assert!(
                rel <= TOL,
                "{}: `{pass}` (attention={choice:?}) alone on the builder's graph changes the \
                 logits of workload {w}: {rel:e}",
                case.name
            );
        }
    }
    eprintln!(
        "{}: {} distinct module runs; largest relative errors:",
        case.name,
        runner.memo.len()
    );
    for (label, rel) in &worst {
        eprintln!("  {label}: {rel:.2e}");
    }
    worst
}

/// The workloads of a random case: `long` (may exceed index_topk) and, when the model has an
/// indexer and `long` exceeds it, `long` cut to index_topk, on which dense attention is exact.
fn workloads_for(module: &Module, long: Workload) -> Vec<Workload> {
    let mut out = vec![long];
    if let Some(k) = index_topk(module) {
        if out[0].max_context() as u64 > k {
            out.extend(out[0].truncated(k as usize));
        }
    }
    out
}

/// A random-weight case for `config`: the first seed from `seed` whose reference runs keep every
/// top-k gap at least `MIN_GAP`.
fn random_case(
    name: &str,
    config: &ModelConfig,
    seed: u64,
    workload: impl Fn(u64) -> Workload,
) -> Case {
    let module = build(config);
    let mut smallest = Vec::new();
    for attempt in 0..SEED_ATTEMPTS {
        let s = seed.wrapping_add(attempt);
        let weights = Weights::random(&module, s);
        let workloads = workloads_for(&module, workload(s));
        let gaps: Vec<Gaps> = workloads
            .iter()
            .map(|w| {
                run_with_gaps(&module, &weights, w)
                    .unwrap_or_else(|e| panic!("{name}: reference run: {e}"))
                    .1
            })
            .collect();
        let min = gaps.iter().map(Gaps::min).fold(f64::INFINITY, f64::min);
        if min >= MIN_GAP {
            return Case {
                name: format!("{name} (weight seed {s})"),
                module,
                weights,
                workloads,
            };
        }
        smallest.push((s, gaps));
    }
    panic!(
        "{name}: no seed in {seed}..{} avoids near-ties in the top-k choices (gap < {MIN_GAP}): \
         {smallest:?}",
        seed.wrapping_add(SEED_ATTEMPTS)
    );
}

// ---------------------------------------------------------------------------------------------
// The shipped tiny configs, random weights

#[test]
fn tiny_sparse_random_weights() {
    let config = shipped("tiny-sparse.ron");
    // index_topk = 8: A is 12 + 2 tokens, B 5 + 4 + 2, so sparse attention is active; the cut
    // workload (contexts <= 8) is where dense attention is exact.
    let case = random_case("tiny-sparse", &config, 0, |s| {
        Workload::random(config.vocab_size, 12, (5, 4), 2, s)
    });
    assert!(case.workloads[0].max_context() > 8 && case.workloads.len() == 2);
    validate(&case);
}

/// The bf16 build: besides what the f32 one covers, its router reads the norm's output through
/// a widening cast (`mlp.gate.input_f32`), which `fuse-elementwise` folds into the router's
/// matmul, as it folds every indexer's head-weight scale into its `dsa.score`.
#[test]
fn tiny_sparse_bf16_random_weights() {
    let mut config = shipped("tiny-sparse.ron");
    config.dtype = DType::BF16;
    let case = random_case("tiny-sparse (bf16)", &config, 0, |s| {
        Workload::random(config.vocab_size, 12, (5, 4), 2, s)
    });
    let ops = |m: &Module, op: &str, suffix: &str| -> usize {
        m.functions
            .iter()
            .flat_map(|f| f.graph.node_weights())
            .filter(|n| n.op.name() == op && n.name.ends_with(suffix))
            .count()
    };
    let (fused, _) = apply(
        "fuse-elementwise",
        AttentionChoice::Auto,
        &apply("fuse-mla-projections", AttentionChoice::Auto, &case.module)
            .unwrap()
            .0,
    )
    .unwrap();
    // Both phases: three MoE layers' router casts and three full indexers' scales.
    assert_eq!(ops(&case.module, "cast", ".mlp.gate.input_f32"), 6);
    assert_eq!(ops(&case.module, "scale", ".indexer.head_weights"), 6);
    assert_eq!(ops(&fused, "cast", ".mlp.gate.input_f32"), 0);
    assert_eq!(ops(&fused, "scale", ".indexer.head_weights"), 0);
    validate(&case);
}

#[test]
fn tiny_dense_random_weights() {
    let config = shipped("tiny-dense.ron");
    let case = random_case("tiny-dense", &config, 0, |s| {
        Workload::random(config.vocab_size, 12, (5, 4), 2, s)
    });
    validate(&case);
}

/// `logits` (prefill all ids, decode 2 more) sees the passes' changes too: the pipeline
/// output equals the builder's on the shipped sparse model.
#[test]
fn logits_helper_agrees_after_the_pipeline() {
    let config = shipped("tiny-sparse.ron");
    let case = random_case("tiny-sparse", &config, 100, |s| {
        Workload::single(&random_ids(config.vocab_size, 6, s), &[3, 5])
    });
    let ids = match &case.workloads[0].sequences[0].chunks[..] {
        [ids] => ids.clone(),
        _ => unreachable!(),
    };
    // `logits` decodes ids[0] and ids[last]; check that run's gaps too.
    let decode = [ids[0], ids[ids.len() - 1]];
    let gaps = run_with_gaps(
        &case.module,
        &case.weights,
        &Workload::single(&ids, &decode),
    )
    .unwrap()
    .1;
    assert!(gaps.min() >= MIN_GAP, "{gaps:?}");
    let before = logits(&case.module, &case.weights, &ids);
    assert_eq!(before.len(), ids.len() + 2);
    let mut after = case.module.clone();
    pipeline(&PipelineOptions::default())
        .unwrap()
        .run(&mut after)
        .unwrap();
    let rel = rel_error(&before, &logits(&after, &case.weights, &ids));
    assert!(rel <= TOL, "{rel:e}");
}

/// Negative controls: the comparison notices wrong rewrites of the kind a pass could make.
#[test]
fn a_wrong_rewrite_is_caught() {
    let config = shipped("tiny-sparse.ron");
    let case = random_case("tiny-sparse", &config, 0, |s| {
        Workload::random(config.vocab_size, 12, (5, 4), 2, s)
    });
    let mut good = case.module.clone();
    pipeline(&PipelineOptions::default())
        .unwrap()
        .run(&mut good)
        .unwrap();
    let reference = run(&case.module, &case.weights, &case.workloads[0]).unwrap();
    let rel = |m: &Module| {
        rel_error(
            &reference,
            &run(m, &case.weights, &case.workloads[0]).unwrap(),
        )
    };
    assert!(rel(&good) <= TOL);
    let mutate = |edit: &dyn Fn(&mut glmc_ir::Node)| {
        let mut bad = good.clone();
        for f in &mut bad.functions {
            let nodes: Vec<_> = f.graph.node_indices().collect();
            for n in nodes {
                edit(&mut f.graph[n]);
            }
        }
        glmc_ir::verify_module(&bad).expect("the mutant still verifies");
        bad
    };
    // The absorbed attention's softmax scale off by 0.1%.
    let bad = mutate(&|node| {
        if let glmc_ir::Op::MlaAttendAbsorbed { scale, .. } = &mut node.op {
            *scale *= 1.001;
        }
    });
    assert!(rel(&bad) > 10.0 * TOL, "scale x1.001: {:e}", rel(&bad));
    // The indexer keeping one key fewer (only rows with more than 7 keys notice).
    let bad = mutate(&|node| {
        if let glmc_ir::Op::DsaTopk { k } = &mut node.op {
            *k -= 1;
            node.outputs[0].shape[1] = glmc_ir::Dim::Const(*k);
        }
    });
    assert!(rel(&bad) > 10.0 * TOL, "top-7: {:e}", rel(&bad));
}

// ---------------------------------------------------------------------------------------------
// The oracle fixtures, real weights

/// The cases `tests/oracle/fixtures` holds; a new one must be added here to be validated.
const FIXTURES: [&str; 7] = [
    "dense-equivalent",
    "group-routing",
    "no-dense",
    "one-token",
    "shared-indexer",
    "six-heads",
    "sparse",
];

#[test]
fn every_fixture_is_validated() {
    let found: Vec<String> = oracle_fixtures()
        .iter()
        .map(|d| d.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(found, FIXTURES, "update FIXTURES and add a test per case");
}

/// The fixture's tokens, prefilled (at once, and in two chunks in a second sequence) up to the
/// last two, which are decoded as a batch of two. Every row is a row of the fixture's full
/// forward, whose top-k gaps the fixture generator checked (>= 1e-3).
fn fixture_case(case: &str) -> Case {
    let dir = repo_root().join("tests/oracle/fixtures").join(case);
    let config = glmc_models::import_hf(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .config;
    let module = build(&config);
    let weights = Weights::open(&dir);
    let tokens = fixture_tokens(&dir);
    let (prompt, decode) = tokens.split_at(tokens.len() - 2);
    let half = prompt.len() / 2;
    let long = Workload {
        sequences: vec![
            Sequence {
                chunks: vec![prompt.to_vec()],
                decode: decode.to_vec(),
            },
            Sequence {
                chunks: [&prompt[..half], &prompt[half..]]
                    .iter()
                    .filter(|c| !c.is_empty())
                    .map(|c| c.to_vec())
                    .collect(),
                decode: decode.to_vec(),
            },
        ],
    };
    let workloads = workloads_for(&module, long);
    for w in &workloads {
        let gaps = run_with_gaps(&module, &weights, w)
            .unwrap_or_else(|e| panic!("{case}: {e}"))
            .1;
        assert!(
            gaps.min() >= MIN_GAP,
            "{case}: the fixture's top-k gaps should be >= 1e-3: {gaps:?}"
        );
    }
    Case {
        name: format!("fixture {case}"),
        module,
        weights,
        workloads,
    }
}

#[test]
fn fixture_dense_equivalent() {
    let case = fixture_case("dense-equivalent");
    // index_topk = 64 > 26 tokens: dense attention is exact on the whole workload.
    assert_eq!(case.workloads.len(), 1);
    validate(&case);
}

#[test]
fn fixture_group_routing() {
    validate(&fixture_case("group-routing"));
}

#[test]
fn fixture_no_dense() {
    validate(&fixture_case("no-dense"));
}

#[test]
fn fixture_one_token() {
    validate(&fixture_case("one-token"));
}

#[test]
fn fixture_shared_indexer() {
    validate(&fixture_case("shared-indexer"));
}

#[test]
fn fixture_six_heads() {
    validate(&fixture_case("six-heads"));
}

#[test]
fn fixture_sparse() {
    validate(&fixture_case("sparse"));
}

// ---------------------------------------------------------------------------------------------
// Random small configs

/// The knobs of a random small config, before they are made consistent.
#[derive(Clone, Debug)]
struct Knobs {
    layers: usize,
    heads: u64,
    nope: u64,
    rope: u64,
    v: u64,
    kv_lora: u64,
    q_lora: u64,
    hidden: u64,
    interleave: bool,
    indexer: Option<IndexerKnobs>,
    moe: MoeKnobs,
    first_dense: usize,
}

#[derive(Clone, Debug)]
struct IndexerKnobs {
    topk: u64,
    heads: u64,
    nope: u64,
    interleave: bool,
    /// Bit i: layer i + 1 is shared (layer 0 is always full).
    shared_bits: u8,
}

#[derive(Clone, Debug)]
struct MoeKnobs {
    experts: u64,
    /// log2 of n_group, clamped to the experts.
    group_log2: u32,
    topk_group: u64,
    top_k: u64,
    shared: u64,
}

prop_compose! {
    fn attention_knobs()(
        layers in 1usize..=3,
        heads in 1u64..=3,
        nope in prop::sample::select(vec![2u64, 4, 8]),
        rope_half in 1u64..=4,
        v in prop::sample::select(vec![4u64, 8]),
        kv_lora in prop::sample::select(vec![4u64, 8, 16]),
        q_lora in prop::sample::select(vec![8u64, 16]),
        hidden in prop::sample::select(vec![16u64, 32]),
        interleave in any::<bool>(),
    ) -> (usize, u64, u64, u64, u64, u64, u64, u64, bool) {
        (layers, heads, nope, 2 * rope_half, v, kv_lora, q_lora, hidden, interleave)
    }
}

prop_compose! {
    fn indexer_knobs()(
        topk in 1u64..=14,
        heads in 2u64..=6,
        nope in prop::sample::select(vec![2u64, 4]),
        interleave in any::<bool>(),
        shared_bits in any::<u8>(),
    ) -> IndexerKnobs {
        IndexerKnobs { topk, heads, nope, interleave, shared_bits }
    }
}

prop_compose! {
    fn moe_knobs()(
        experts in prop::sample::select(vec![2u64, 4, 8]),
        group_log2 in 0u32..=2,
        topk_group_raw in 1u64..=4,
        top_k_raw in 1u64..=3,
        shared in 0u64..=1,
    ) -> MoeKnobs {
        let n_group = (1u64 << group_log2).min(experts);
        let topk_group = topk_group_raw.min(n_group);
        let reachable = topk_group * (experts / n_group);
        MoeKnobs {
            experts,
            group_log2: n_group.trailing_zeros(),
            topk_group,
            top_k: top_k_raw.min(reachable),
            shared,
        }
    }
}

prop_compose! {
    fn knobs()(
        a in attention_knobs(),
        indexer in prop::option::weighted(0.8, indexer_knobs()),
        moe in moe_knobs(),
        first_dense_raw in 0usize..=3,
    ) -> Knobs {
        let (layers, heads, nope, rope, v, kv_lora, q_lora, hidden, interleave) = a;
        Knobs {
            layers, heads, nope, rope, v, kv_lora, q_lora, hidden, interleave,
            indexer, moe,
            first_dense: first_dense_raw.min(layers),
        }
    }
}

/// A valid config from the knobs, on the tiny-sparse template.
fn config_from(k: &Knobs) -> ModelConfig {
    let mut c = shipped("tiny-sparse.ron");
    c.name = "random".into();
    c.vocab_size = 64;
    c.hidden_size = k.hidden;
    c.num_hidden_layers = k.layers;
    c.num_attention_heads = k.heads;
    c.q_lora_rank = k.q_lora;
    c.kv_lora_rank = k.kv_lora;
    c.qk_nope_head_dim = k.nope;
    c.qk_rope_head_dim = k.rope;
    c.v_head_dim = k.v;
    c.rope_interleave = k.interleave;
    c.intermediate_size = 24;
    c.first_k_dense_replace = k.first_dense;
    c.indexer = k.indexer.as_ref().map(|ix| IndexerConfig {
        index_topk: ix.topk,
        index_n_heads: ix.heads,
        index_head_dim: k.rope + ix.nope,
        rope_interleave: ix.interleave,
        k_norm_eps: 1e-6,
        layer_types: (0..k.layers)
            .map(|i| {
                if i > 0 && (ix.shared_bits >> (i - 1)) & 1 == 1 {
                    IndexerLayerType::Shared
                } else {
                    IndexerLayerType::Full
                }
            })
            .collect(),
    });
    c.moe.n_routed_experts = k.moe.experts;
    c.moe.n_group = 1 << k.moe.group_log2;
    c.moe.topk_group = k.moe.topk_group;
    c.moe.num_experts_per_tok = k.moe.top_k;
    c.moe.n_shared_experts = k.moe.shared;
    c.moe.moe_intermediate_size = 8;
    c.eos_token_ids = vec![1];
    c.validate()
        .unwrap_or_else(|e| panic!("generated an invalid config {k:?}: {e}"));
    c
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 12,
        max_shrink_iters: 16,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_small_configs(
        knobs in knobs(),
        len_a in 1usize..=10,
        chunks_b in (1usize..=5, 1usize..=5),
        seed in any::<u64>(),
    ) {
        let config = config_from(&knobs);
        let case = random_case("random config", &config, seed, |s| {
            Workload::random(config.vocab_size, len_a, chunks_b, 2, s)
        });
        eprintln!("{knobs:?}, len_a {len_a}, chunks_b {chunks_b:?}");
        validate(&case);
    }
}
