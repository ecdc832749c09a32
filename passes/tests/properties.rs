//! Properties of the passes that hold by construction, checked on the graph alone: what
//! `select-attention=dense` removes, what `attention=sparse` without an indexer says, the
//! shapes GLM-5 compiles to, and determinism.

mod support;

use glmc_ir::{print_module, Function, Module, Op, Recipe};
use glmc_passes::{pipeline, AttentionChoice, PassError, PipelineOptions, PIPELINE};
use support::*;

#[allow(clippy::result_large_err)] // PassError is the crate's error type, returned as is
fn run_pipeline(module: &Module, attention: AttentionChoice) -> Result<Module, PassError> {
    let mut m = module.clone();
    pipeline(&PipelineOptions {
        attention,
        ..Default::default()
    })
    .expect("the default pipeline")
    .run(&mut m)?;
    Ok(m)
}

/// Everything of the indexer still in `module`, one line each.
fn indexer_leftovers(module: &Module) -> Vec<String> {
    let mut found = Vec::new();
    for state in module.states.keys() {
        if state.contains("indexer") {
            found.push(format!("state {state}"));
        }
    }
    for f in &module.functions {
        for node in f.graph.node_weights() {
            let what = format!("@{}: {} \"{}\"", f.name, node.op.name(), node.name);
            if node.name.contains("indexer") {
                found.push(format!("{what}: named after the indexer"));
            }
            match &node.op {
                Op::DsaScore { .. } | Op::DsaTopk { .. } => {
                    found.push(format!("{what}: an indexer op"))
                }
                Op::MlaAttend { sparse: true, .. } | Op::MlaAttendAbsorbed { sparse: true, .. } => {
                    found.push(format!("{what}: sparse attention"))
                }
                Op::Weight { recipe } => {
                    for (tensor, _) in recipe.leaves() {
                        if tensor.contains("indexer.") {
                            found.push(format!("{what}: its recipe reads {tensor}"));
                        }
                    }
                }
                Op::CacheUpdate { state, .. } if state.contains("indexer") => {
                    found.push(format!("{what}: writes {state}"))
                }
                _ => {}
            }
        }
    }
    found
}

/// Dense attention drops the indexer entirely: nodes, weights (recipes included, even inside
/// the fused projection that `fuse-mla-projections` made before), the key cache and the top-k
/// operand of attention. Checked right after select-attention in pipeline order, after the
/// whole pipeline, and for select-attention alone on the builder's graph.
#[test]
fn dense_attention_drops_the_indexer_entirely() {
    let mut configs = vec![shipped("tiny-sparse.ron")];
    for dir in oracle_fixtures() {
        configs.push(glmc_models::import_hf(&dir).expect("fixture config").config);
    }
    for config in configs {
        let module = build(&config);
        assert!(
            !indexer_leftovers(&module).is_empty(),
            "{}: the builder's graph has an indexer",
            config.name
        );
        let stages = stages(&module, AttentionChoice::Dense);
        let select = stages
            .iter()
            .position(|(p, _, _)| *p == "select-attention")
            .expect("select-attention is in the pipeline");
        for (pass, m, _) in &stages[select..] {
            let left = indexer_leftovers(m);
            assert!(
                left.is_empty(),
                "{}: after {pass} with attention=dense, the indexer is still there:\n{}",
                config.name,
                left.join("\n")
            );
        }
        let (alone, changed) = apply("select-attention", AttentionChoice::Dense, &module).unwrap();
        assert!(changed);
        assert_eq!(
            indexer_leftovers(&alone),
            Vec::<String>::new(),
            "{}",
            config.name
        );
        // What remains of attention is untouched: both caches of every layer.
        for i in 0..config.num_hidden_layers {
            for state in [
                glmc_models::builder::c_kv_state(i),
                glmc_models::builder::k_pe_state(i),
            ] {
                assert!(stages.last().unwrap().1.states.contains_key(&state));
            }
        }
    }
}

/// Dense attention compiles a model with an indexer to exactly what the same model without
/// an indexer compiles to: nothing of the indexer is left, not even its rows in a fused GEMM.
#[test]
fn dense_attention_is_the_model_without_its_indexer() {
    let mut configs = vec![shipped("tiny-sparse.ron"), shipped("glm5.ron")];
    for dir in oracle_fixtures() {
        configs.push(glmc_models::import_hf(&dir).expect("fixture config").config);
    }
    for config in configs {
        let mut plain = config.clone();
        plain.indexer = None;
        let dense = run_pipeline(&build(&config), AttentionChoice::Dense).unwrap();
        let without = run_pipeline(&build(&plain), AttentionChoice::Auto).unwrap();
        if let Some(diff) = first_difference(&print_module(&dense), &print_module(&without)) {
            panic!(
                "{}: dense differs from the model without indexer at {diff}",
                config.name
            );
        }
    }
}

/// Sparse (and auto) attention keeps the indexer, and states the exactness rule.
#[test]
fn sparse_attention_keeps_the_indexer_and_states_dense_until() {
    let config = shipped("tiny-sparse.ron");
    let module = build(&config);
    let k = config.indexer.as_ref().unwrap().index_topk;
    for choice in [AttentionChoice::Auto, AttentionChoice::Sparse] {
        let m = run_pipeline(&module, choice).unwrap();
        assert_eq!(m.states, module.states, "{choice:?} keeps every cache");
        let mut attends = 0;
        for f in &m.functions {
            for node in f.graph.node_weights() {
                match node.op {
                    Op::MlaAttend {
                        sparse,
                        dense_until,
                        ..
                    }
                    | Op::MlaAttendAbsorbed {
                        sparse,
                        dense_until,
                        ..
                    } => {
                        assert!(sparse && dense_until == k, "{choice:?}: {}", node.name);
                        attends += 1;
                    }
                    _ => {}
                }
            }
        }
        assert_eq!(attends, 2 * config.num_hidden_layers);
    }
}

#[test]
fn attention_sparse_without_an_indexer_is_a_clear_error() {
    let module = build(&shipped("tiny-dense.ron"));
    let err = run_pipeline(&module, AttentionChoice::Sparse).expect_err("no indexer, no sparse");
    assert!(
        matches!(
            err,
            PassError::Options {
                pass: "select-attention",
                ..
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    for needle in ["select-attention", "sparse", "indexer", "auto or dense"] {
        assert!(text.contains(needle), "{needle:?} missing from: {text}");
    }
    // And nothing else is refused: auto and dense compile the same module.
    let auto = run_pipeline(&module, AttentionChoice::Auto).unwrap();
    let dense = run_pipeline(&module, AttentionChoice::Dense).unwrap();
    assert_eq!(print_module(&auto), print_module(&dense));
}

// ---------------------------------------------------------------------------------------------
// GLM-5, graph only

fn weight_recipe<'f>(f: &'f Function, name: &str) -> &'f Recipe {
    let n = f
        .find(name)
        .unwrap_or_else(|| panic!("@{}: no node {name}", f.name));
    match &f.node(n).op {
        Op::Weight { recipe } => recipe,
        op => panic!("{name} is {}, not a weight", op.name()),
    }
}

fn dims(f: &Function, v: glmc_ir::Value) -> String {
    f.value_type(v)
        .shape
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

#[test]
fn glm5_compiles_to_the_fused_projection_and_the_absorbed_query() {
    let config = shipped("glm5.ron");
    let module = build(&config);
    let m = run_pipeline(&module, AttentionChoice::Auto).unwrap();
    for phase in ["decode", "prefill"] {
        let f = m.function(phase).unwrap();
        for i in 0..config.num_hidden_layers {
            let p = format!("model.layers.{i}.self_attn");
            // One GEMM for q_a_proj + kv_a_proj_with_mqa + indexer.wk + indexer.weights_proj:
            // 2048 + 576 + 128 + 32 = 2784 rows, a concat recipe of the checkpoint tensors.
            let fused =
                format!("{p}.[q_a_proj;kv_a_proj_with_mqa;indexer.wk;indexer.weights_proj]");
            let w = f
                .find(&format!("{fused}.weight"))
                .expect("the fused weight");
            assert_eq!(
                f.node(w).outputs[0].to_string(),
                "bf16[2784,6144]",
                "{fused}"
            );
            let Recipe::Concat { axis: 0, parts } = weight_recipe(f, &format!("{fused}.weight"))
            else {
                panic!("{fused}: not a row concat");
            };
            let parts: Vec<(String, Vec<u64>)> = parts.iter().flat_map(Recipe::leaves).collect();
            let expected: Vec<(String, Vec<u64>)> = [
                ("q_a_proj", 2048),
                ("kv_a_proj_with_mqa", 576),
                ("indexer.wk", 128),
                ("indexer.weights_proj", 32),
            ]
            .iter()
            .map(|(n, rows)| (format!("{p}.{n}.weight"), vec![*rows, 6144]))
            .collect();
            assert_eq!(parts, expected);
            let users = f.users(w.into());
            assert_eq!(users.len(), 1, "{fused}.weight feeds one GEMM");
            // fuse-elementwise may fold the rope of the k_pe rows into the GEMM (and rename it).
            let gemm = users[0].0;
            assert!(f.node(gemm).op.name().starts_with("matmul"), "{fused}");
            assert_eq!(
                dims(f, gemm.into()),
                format!("{},2784", if phase == "decode" { "b" } else { "s" })
            );
            let mut widths: Vec<(u64, u64)> = f
                .users(gemm.into())
                .iter()
                .map(|&(s, _)| match f.node(s).op {
                    Op::Slice { start, end, .. } => (start, end),
                    ref op => panic!("{fused} feeds {}", op.name()),
                })
                .collect();
            widths.sort();
            assert_eq!(
                widths,
                [(0, 2048), (2048, 2624), (2624, 2752), (2752, 2784)]
            );

            // The absorbed query: per head W_UK^T q_nope, 512 wide, plus 64 rope = 576.
            let attn = f
                .find(&format!("{p}.attn_latent"))
                .expect("absorbed attention");
            assert!(matches!(
                f.node(attn).op,
                Op::MlaAttendAbsorbed {
                    sparse: true,
                    dense_until: 2048,
                    ..
                }
            ));
            let ops = f.operands(attn);
            let rows = if phase == "decode" { "b" } else { "s" };
            let cache = if phase == "decode" { "b,t" } else { "t" };
            assert_eq!(dims(f, ops[0]), format!("{rows},64,512"), "q_abs");
            assert_eq!(dims(f, ops[1]), format!("{rows},64,64"), "q_pe");
            assert_eq!(dims(f, ops[2]), format!("{cache},512"), "c_kv cache");
            assert_eq!(dims(f, ops[3]), format!("{cache},64"), "k_pe cache");
            assert_eq!(dims(f, attn.into()), format!("{rows},64,512"), "o_lat");
            let uk_t = f.find(&format!("{p}.kv_b_proj.weight:uk_t")).unwrap();
            let uv = f.find(&format!("{p}.kv_b_proj.weight:uv")).unwrap();
            assert_eq!(f.node(uk_t).outputs[0].to_string(), "bf16[64,512,192]");
            assert_eq!(f.node(uv).outputs[0].to_string(), "bf16[64,256,512]");
            for w in [uk_t, uv] {
                let leaves = weight_recipe(f, &f.node(w).name).leaves();
                assert_eq!(
                    leaves,
                    [(format!("{p}.kv_b_proj.weight"), vec![28672, 512])]
                );
            }
            // No expanded attention, no per-head key/value expansion of the cache.
            assert!(f.find(&format!("{p}.kv_b_proj")).is_none());
        }
        let expanded = f
            .graph
            .node_weights()
            .filter(|n| matches!(n.op, Op::MlaAttend { .. }))
            .count();
        assert_eq!(expanded, 0, "@{phase}: sparse GLM-5 is absorbed everywhere");
    }
}

/// With dense attention, long prefill stays expanded (ordinary MHA over per-head K/V), and
/// decode is absorbed.
#[test]
fn glm5_dense_prefill_stays_expanded() {
    let config = shipped("glm5.ron");
    let m = run_pipeline(&build(&config), AttentionChoice::Dense).unwrap();
    let count = |f: &Function, absorbed: bool| {
        f.graph
            .node_weights()
            .filter(|n| match n.op {
                Op::MlaAttend { .. } => !absorbed,
                Op::MlaAttendAbsorbed { .. } => absorbed,
                _ => false,
            })
            .count()
    };
    let (prefill, decode) = (
        m.function("prefill").unwrap(),
        m.function("decode").unwrap(),
    );
    assert_eq!((count(prefill, false), count(prefill, true)), (78, 0));
    assert_eq!((count(decode, false), count(decode, true)), (0, 78));
    let fused = "model.layers.0.self_attn.[q_a_proj;kv_a_proj_with_mqa].weight";
    let w = decode
        .find(fused)
        .expect("the fused projection without the indexer");
    assert_eq!(decode.node(w).outputs[0].to_string(), "bf16[2624,6144]");
    assert!(indexer_leftovers(&m).is_empty());
}

#[test]
fn the_pipeline_is_deterministic() {
    for (file, choice) in [
        ("glm5.ron", AttentionChoice::Auto),
        ("tiny-sparse.ron", AttentionChoice::Auto),
        ("tiny-sparse.ron", AttentionChoice::Dense),
        ("tiny-dense.ron", AttentionChoice::Auto),
    ] {
        let config = shipped(file);
        // Two fresh builds: nothing may depend on petgraph indices or hash order.
        let a = print_module(&run_pipeline(&build(&config), choice).unwrap());
        let b = print_module(&run_pipeline(&build(&config), choice).unwrap());
        if let Some(diff) = first_difference(&a, &b) {
            panic!("{file} ({choice:?}): two runs differ at {diff}");
        }
    }
}

/// Running the pipeline on its own output changes nothing: every pass reaches its fixpoint
/// in one run.
#[test]
fn the_pipeline_is_idempotent() {
    for file in ["tiny-sparse.ron", "tiny-dense.ron"] {
        let module = build(&shipped(file));
        for choice in [AttentionChoice::Auto, AttentionChoice::Dense] {
            let once = run_pipeline(&module, choice).unwrap();
            let mut twice = once.clone();
            let records = pipeline(&PipelineOptions {
                attention: choice,
                ..Default::default()
            })
            .unwrap()
            .run(&mut twice)
            .unwrap();
            let changed: Vec<&str> = records
                .iter()
                .filter(|r| r.changed)
                .map(|r| r.name)
                .collect();
            assert!(
                changed.is_empty(),
                "{file} ({choice:?}): a second run changed {changed:?}"
            );
            assert_eq!(print_module(&once), print_module(&twice));
            assert_eq!(records.len(), PIPELINE.len());
        }
    }
}
