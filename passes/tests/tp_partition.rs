//! `tp-partition`: every rank's graph, run together with simulated collectives, reproduces the
//! single-device logits (rel. ≤ 1e-5 in f32, every rank bit-identical to the others); each rank
//! reads exactly its own heads of q_b_proj, kv_b_proj and o_proj; a degree that does not divide
//! a size is refused, naming the size.
//!
//! Models: the shipped tiny configs (2 heads: TP 2), tiny-sparse widened to 6 heads with a
//! vocabulary and MoE width divisible by 6 (TP 2, 3, 6), and every oracle fixture with its real
//! weights (4 heads: TP 2 and 4). Attention sparse (auto) and dense, optimised and `-O0` (where
//! prefill attention stays in its expanded form with `kv_b_proj` as one matmul).

mod support;

use std::path::Path;

use glmc_ir::{print_module_summary, Module, Op, Tp};
use glmc_models::ModelConfig;
use glmc_passes::{partition, pipeline, AttentionChoice, PipelineOptions};
use glmc_runtime::{Checkpoint, Tensor};
use support::*;

const TOL: f64 = 1e-5;
/// Smallest accepted relative top-k gap: summing partial results over ranks rounds differently
/// from one matmul, by about 1e-7 relative.
const MIN_GAP: f64 = 1e-4;

fn optimised(module: &Module, attention: AttentionChoice, no_optimization: bool) -> Module {
    let mut m = module.clone();
    let options = PipelineOptions {
        attention,
        no_optimization,
        ..Default::default()
    };
    pipeline(&options).unwrap().run(&mut m).unwrap();
    m
}

/// TP=`degree` against TP=1 on `workload`, for both attention choices, optimised and not.
fn check_degrees(
    name: &str,
    module: &Module,
    weights: &Weights,
    workload: &Workload,
    degrees: &[u64],
) {
    let sparse = glmc_passes::select_attention::index_topk(module).is_some();
    let choices: &[AttentionChoice] = if sparse {
        &[AttentionChoice::Sparse, AttentionChoice::Dense]
    } else {
        &[AttentionChoice::Auto]
    };
    for &choice in choices {
        for o0 in [false, true] {
            let whole = optimised(module, choice, o0);
            let reference =
                run(&whole, weights, workload).unwrap_or_else(|e| panic!("{name}: {e}"));
            for &degree in degrees {
                let what = format!("{name}, {choice:?}, -O0 {o0}, TP={degree}");
                let ranks = partition(&whole, degree).unwrap_or_else(|e| panic!("{what}: {e}"));
                for (r, m) in ranks.iter().enumerate() {
                    assert_eq!(
                        m.tp,
                        Tp {
                            degree,
                            rank: r as u64
                        },
                        "{what}"
                    );
                }
                let rows =
                    run_ranks(&ranks, weights, workload).unwrap_or_else(|e| panic!("{what}: {e}"));
                for (r, other) in rows.iter().enumerate() {
                    assert!(
                        other == &rows[0],
                        "{what}: rank {r}'s logits differ from rank 0's"
                    );
                }
                let err = rel_error(&reference, &rows[0]);
                assert!(err <= TOL, "{what}: rel. error {err:e} > {TOL:e}");
            }
        }
    }
}

/// Random weights for `module` whose top-k choices have no near-ties on `workload`.
fn weights_without_ties(name: &str, module: &Module, workload: &Workload) -> Weights {
    for seed in 0..24 {
        let weights = Weights::random(module, seed);
        let (_, gaps) = run_with_gaps(module, &weights, workload).unwrap();
        if gaps.min() >= MIN_GAP {
            return weights;
        }
    }
    panic!("{name}: no seed avoids near-ties in the top-k choices");
}

fn random_check(name: &str, config: &ModelConfig, degrees: &[u64]) {
    let module = build(config);
    let workload = Workload::random(config.vocab_size, 12, (5, 4), 2, 7);
    let weights = weights_without_ties(name, &module, &workload);
    check_degrees(name, &module, &weights, &workload, degrees);
}

/// tiny-sparse with 6 heads, a vocabulary of 264 and routed/shared experts 24 wide: every split
/// size divides by 2, 3 and 6.
fn six_heads() -> ModelConfig {
    let mut c = shipped("tiny-sparse.ron");
    c.name = "tiny_six_heads".into();
    c.num_attention_heads = 6;
    c.vocab_size = 264;
    c.moe.moe_intermediate_size = 24;
    c
}

#[test]
fn tiny_sparse_tp2() {
    random_check("tiny-sparse", &shipped("tiny-sparse.ron"), &[2]);
}

#[test]
fn tiny_dense_tp2() {
    random_check("tiny-dense", &shipped("tiny-dense.ron"), &[2]);
}

#[test]
fn six_heads_tp2_tp3_tp6() {
    random_check("six heads", &six_heads(), &[2, 3, 6]);
}

#[test]
fn every_fixture_at_every_degree_that_divides_it() {
    let mut checked = Vec::new();
    for dir in oracle_fixtures() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let config = glmc_models::import_hf(&dir).unwrap().config;
        // The sizes tp-partition splits (attention heads, the dense and expert MLP widths,
        // the vocabulary).
        let mut sizes = vec![
            config.num_attention_heads,
            config.intermediate_size,
            config.vocab_size,
        ];
        sizes.push(config.moe.moe_intermediate_size);
        let degrees: Vec<u64> = [2, 3, 4, 6]
            .into_iter()
            .filter(|d| sizes.iter().all(|s| s % d == 0))
            .collect();
        let module = build(&config);
        let weights = Weights::open(&dir);
        let tokens = fixture_tokens(&dir);
        let (prompt, decode) = tokens.split_at(tokens.len() - 2);
        let workload = Workload::single(prompt, decode);
        check_degrees(&name, &module, &weights, &workload, &degrees);
        checked.push((name, degrees));
    }
    // The six-head fixture exists for the odd degrees: they must have run.
    assert!(
        checked
            .iter()
            .any(|(n, d)| n == "six-heads" && d.contains(&3) && d.contains(&6)),
        "{checked:?}"
    );
}

#[test]
fn a_degree_that_does_not_divide_is_refused_naming_the_size() {
    let cases: [(ModelConfig, u64, &str); 4] = [
        (
            shipped("tiny-sparse.ron"),
            3,
            "num_attention_heads 2 is not divisible by the TP degree 3",
        ),
        (
            ModelConfig {
                vocab_size: 260,
                ..six_heads()
            },
            3,
            "vocab_size 260 is not divisible by the TP degree 3",
        ),
        (
            ModelConfig {
                intermediate_size: 100,
                ..six_heads()
            },
            3,
            "intermediate_size 100 is not divisible by the TP degree 3",
        ),
        (
            six_heads(),
            4,
            "num_attention_heads 6 is not divisible by the TP degree 4",
        ),
    ];
    for (config, degree, message) in cases {
        let whole = optimised(&build(&config), AttentionChoice::Auto, false);
        let e = partition(&whole, degree).unwrap_err().to_string();
        assert!(e.contains(message), "{e}");
    }
    let mut moe = six_heads();
    moe.moe.moe_intermediate_size = 20;
    let whole = optimised(&build(&moe), AttentionChoice::Auto, false);
    let e = partition(&whole, 3).unwrap_err().to_string();
    assert!(e.contains("moe_intermediate_size"), "{e}");
}

/// A checkpoint whose every 2-D tensor holds, at `[i, j]`, `i` (`rows`) or `j` (columns), so a
/// materialized recipe says which rows or columns of the HF tensor it read.
fn index_checkpoint(module: &Module, dir: &Path, columns_of: impl Fn(&str) -> bool) -> Checkpoint {
    let leaves = recipe_leaves(module);
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = leaves
        .iter()
        .map(|(name, shape)| {
            let shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
            let n: usize = shape.iter().product();
            let cols = *shape.last().unwrap();
            let values: Vec<f32> = (0..n)
                .map(|k| {
                    if columns_of(name) {
                        (k % cols) as f32
                    } else {
                        (k / cols) as f32
                    }
                })
                .collect();
            (
                name.clone(),
                shape,
                values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            )
        })
        .collect();
    let views = tensors.iter().map(|(name, shape, bytes)| {
        (
            name.clone(),
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                .unwrap(),
        )
    });
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    Checkpoint::open(dir).unwrap()
}

fn values(t: &Tensor) -> &[f32] {
    t.as_f32().unwrap()
}

/// Each rank's q_b_proj and kv_b_proj hold exactly its heads' rows — for kv_b_proj each head's
/// contiguous [k_nope | v] block, also inside W_UKᵀ and W_UV — and its o_proj exactly those
/// heads' columns: checked on the values the recipes read.
#[test]
fn each_rank_reads_only_its_heads_of_q_b_kv_b_and_o_proj() {
    for (config, degree) in [
        (six_heads(), 3u64),
        (six_heads(), 2),
        (shipped("tiny-sparse.ron"), 2),
    ] {
        let (h, p, r, v) = (
            config.num_attention_heads,
            config.qk_nope_head_dim,
            config.qk_rope_head_dim,
            config.v_head_dim,
        );
        let hl = h / degree;
        let whole = optimised(&build(&config), AttentionChoice::Auto, false);
        let o0 = optimised(&build(&config), AttentionChoice::Auto, true);
        let dir = tempfile::tempdir().unwrap();
        let ckpt = index_checkpoint(&whole, dir.path(), |name| name.ends_with("o_proj.weight"));
        let mut seen = [0usize; 5];
        for module in [&whole, &o0] {
            for (rank, m) in partition(module, degree).unwrap().iter().enumerate() {
                let first_head = rank as u64 * hl;
                for f in &m.functions {
                    for node in f.graph.node_weights() {
                        let Op::Weight { recipe } = &node.op else {
                            continue;
                        };
                        let leaf = match &recipe.leaves()[..] {
                            [(leaf, _)] => leaf.clone(),
                            _ => continue,
                        };
                        let t = Checkpoint::materialize(&ckpt, recipe).unwrap();
                        let x = values(&t);
                        let shape = t.shape().to_vec();
                        let at = format!("rank {rank}/{degree}, \"{}\"", node.name);
                        if leaf.ends_with("q_b_proj.weight") {
                            // Rows [first_head·(P+R), (first_head+hl)·(P+R)), in order.
                            let w = (p + r) as usize;
                            assert_eq!(shape[0], hl as usize * w, "{at}");
                            for (row, chunk) in x.chunks(shape[1]).enumerate() {
                                let want = (first_head as usize * w + row) as f32;
                                assert!(chunk.iter().all(|&e| e == want), "{at}: row {row}");
                            }
                            seen[0] += 1;
                        } else if node.name.ends_with("kv_b_proj.weight:uk_t") {
                            // [hl, L, P]: head h, nope dim j came from row (first_head+h)·(P+V)+j.
                            let (l, pp) = (shape[1], shape[2]);
                            assert_eq!((shape[0], pp), (hl as usize, p as usize), "{at}");
                            for (k, &e) in x.iter().enumerate() {
                                let (hh, j) = (k / (l * pp), k % pp);
                                let want =
                                    ((first_head as usize + hh) * (p + v) as usize + j) as f32;
                                assert_eq!(e, want, "{at}: element {k}");
                            }
                            seen[1] += 1;
                        } else if node.name.ends_with("kv_b_proj.weight:uv") {
                            // [hl, V, L]: head h, value dim j came from row (first_head+h)·(P+V)+P+j.
                            let (vv, l) = (shape[1], shape[2]);
                            assert_eq!((shape[0], vv), (hl as usize, v as usize), "{at}");
                            for (k, &e) in x.iter().enumerate() {
                                let (hh, j) = (k / (vv * l), (k / l) % vv);
                                let want = ((first_head as usize + hh) * (p + v) as usize
                                    + p as usize
                                    + j) as f32;
                                assert_eq!(e, want, "{at}: element {k}");
                            }
                            seen[2] += 1;
                        } else if leaf.ends_with("kv_b_proj.weight") {
                            let w = (p + v) as usize;
                            assert_eq!(shape[0], hl as usize * w, "{at}");
                            for (row, chunk) in x.chunks(shape[1]).enumerate() {
                                let want = (first_head as usize * w + row) as f32;
                                assert!(chunk.iter().all(|&e| e == want), "{at}: row {row}");
                            }
                            seen[3] += 1;
                        } else if leaf.ends_with("o_proj.weight") {
                            // Columns [first_head·V, (first_head+hl)·V).
                            assert_eq!(shape[1], (hl * v) as usize, "{at}");
                            for chunk in x.chunks(shape[1]) {
                                for (c, &e) in chunk.iter().enumerate() {
                                    assert_eq!(e, (first_head * v) as f32 + c as f32, "{at}");
                                }
                            }
                            seen[4] += 1;
                        }
                    }
                }
            }
        }
        assert!(
            seen.iter().all(|&k| k > 0),
            "{}: every kind was checked: {seen:?}",
            config.name
        );
    }
}

/// Each rank's fused MLP weight (`fuse-mlp-projections`, dense and shared expert) is its rows
/// of gate followed by its rows of up, and the two slices of the GEMM's output take those two
/// halves: checked on the rows the recipe reads and on the slice bounds.
#[test]
fn each_rank_stacks_its_rows_of_gate_and_up() {
    for (config, degree) in [(six_heads(), 3u64), (shipped("tiny-sparse.ron"), 2)] {
        let whole = optimised(&build(&config), AttentionChoice::Auto, false);
        let dir = tempfile::tempdir().unwrap();
        let ckpt = index_checkpoint(&whole, dir.path(), |_| false);
        let mut seen = 0;
        for (rank, m) in partition(&whole, degree).unwrap().iter().enumerate() {
            let rank = rank as u64;
            for f in &m.functions {
                for n in f.graph.node_indices() {
                    let node = f.node(n);
                    let Some(mlp) = node.name.strip_suffix(".[gate_proj;up_proj]") else {
                        continue;
                    };
                    let at = format!("rank {rank}/{degree}, \"{}\"", node.name);
                    let w = f.operands(n)[1];
                    let Op::Weight { recipe } = &f.node(w.node).op else {
                        panic!("{at}: reads a weight");
                    };
                    let leaves: Vec<String> = recipe.leaves().into_iter().map(|l| l.0).collect();
                    assert_eq!(
                        leaves,
                        [
                            format!("{mlp}.gate_proj.weight"),
                            format!("{mlp}.up_proj.weight")
                        ],
                        "{at}"
                    );
                    let t = Checkpoint::materialize(&ckpt, recipe).unwrap();
                    let (rows, cols) = (t.shape()[0], t.shape()[1]);
                    let block = rows / 2;
                    for (row, chunk) in values(&t).chunks(cols).enumerate() {
                        let want = (rank as usize * block + row % block) as f32;
                        assert!(chunk.iter().all(|&e| e == want), "{at}: row {row}");
                    }
                    let mut slices: Vec<(String, u64, u64)> = f
                        .users(n.into())
                        .into_iter()
                        .map(|(s, _)| match f.node(s).op {
                            Op::Slice { start, end, .. } => (f.node(s).name.clone(), start, end),
                            ref op => panic!("{at}: read by {}", op.name()),
                        })
                        .collect();
                    slices.sort();
                    let b = block as u64;
                    assert_eq!(
                        slices,
                        [
                            (format!("{mlp}.gate_proj"), 0, b),
                            (format!("{mlp}.up_proj"), b, 2 * b)
                        ],
                        "{at}"
                    );
                    seen += 1;
                }
            }
        }
        // Dense and shared expert, prefill and decode, every rank.
        assert!(seen >= 4 * degree, "{}: {seen} fused MLPs", config.name);
    }
}

/// Rank 1 of tiny-sparse at TP=2, its distinct layers once: the sharded shapes and where the
/// collectives go. Review with `cargo insta review`.
#[test]
fn tiny_sparse_rank_1_of_2_snapshot() {
    let whole = optimised(
        &build(&shipped("tiny-sparse.ron")),
        AttentionChoice::Auto,
        false,
    );
    let ranks = partition(&whole, 2).unwrap();
    insta::assert_snapshot!(print_module_summary(&ranks[1]));
}

/// Partitioning is not something a partitioned module can take again, and a rank outside the
/// group is refused.
#[test]
fn a_rank_is_partitioned_once_and_within_its_group() {
    use glmc_passes::{Pass, TpPartition};
    let whole = optimised(
        &build(&shipped("tiny-sparse.ron")),
        AttentionChoice::Auto,
        false,
    );
    let mut rank = partition(&whole, 2).unwrap().remove(0);
    let again = TpPartition {
        tp: Tp { degree: 2, rank: 0 },
    };
    assert!(again
        .run(&mut rank)
        .unwrap_err()
        .to_string()
        .contains("already rank 0 of 2"));
    let outside = TpPartition {
        tp: Tp { degree: 2, rank: 2 },
    };
    let e = outside.run(&mut whole.clone()).unwrap_err().to_string();
    assert!(e.contains("rank 2 of 2 ranks"), "{e}");
}

/// A rank's graph says how each node relates to the single-device value: `tp=split(AXIS)` for
/// its block, `tp=stacked(AXIS, PARTS)` for its block of each part of the fused MLP GEMM,
/// `tp=partial` for its addend of a sum. The text and RON forms keep it.
#[test]
fn a_rank_marks_its_blocks_and_partial_sums_and_the_dump_round_trips() {
    let whole = optimised(
        &build(&shipped("tiny-sparse.ron")),
        AttentionChoice::Auto,
        false,
    );
    let rank = partition(&whole, 2).unwrap().remove(1);
    let text = glmc_ir::print_module(&rank);
    for line in [
        "\"model.layers.0.self_attn.q_b_proj+rope\" tp=split(1)",
        "\"model.layers.0.self_attn.attn\" tp=split(1)",
        "\"model.layers.1.mlp.experts.gate_up\" tp=split(2)",
        "\"model.layers.0.mlp.[gate_proj;up_proj]\" tp=stacked(1, 2)",
        "\"model.layers.0.mlp.gate_proj\" tp=split(1)",
        "\"model.layers.0.mlp.up_proj\" tp=split(1)",
        "\"model.layers.1.mlp.shared_experts.[gate_proj;up_proj]\" tp=stacked(1, 2)",
        "\"model.layers.1.mlp.shared_experts.up_proj\" tp=split(1)",
        "\"model.layers.0.self_attn.o_proj.partial\" tp=partial",
        "\"lm_head.shard\" tp=split(1)",
    ] {
        assert!(text.contains(line), "missing {line}");
    }
    assert!(
        text.contains("all_reduce") && !text.contains("self_attn.o_proj\" tp="),
        "the all_reduce holds the whole value"
    );
    let parsed = glmc_ir::parse_module(&text).unwrap();
    assert_eq!(glmc_ir::print_module(&parsed), text);
    let ron = glmc_ir::serial::to_ron(&rank).unwrap();
    let back = glmc_ir::serial::from_ron(&ron).unwrap();
    assert_eq!(glmc_ir::print_module(&back), text);
}

/// The split layout of a whole module, for single-device traces: every degree the model allows
/// divides its units, and the axes are the ranks' (the logits' under their whole name).
#[test]
fn the_split_layout_names_the_axes_the_ranks_split() {
    let whole = optimised(
        &build(&shipped("tiny-sparse.ron")),
        AttentionChoice::Auto,
        false,
    );
    let layout = glmc_passes::split_layout(&whole).unwrap();
    assert_eq!(layout.units, 2, "tiny-sparse has 2 heads");
    let axis = |f: &str, node: &str| layout.axes.get(&(f.to_string(), node.to_string())).copied();
    assert_eq!(
        axis("prefill", "model.layers.0.self_attn.q_b_proj+rope"),
        Some(1)
    );
    assert_eq!(
        axis("decode", "model.layers.1.mlp.experts.gate_up"),
        Some(2)
    );
    assert_eq!(axis("prefill", "lm_head"), Some(1));
    assert_eq!(axis("decode", "model.layers.0.mlp.gate_proj"), Some(1));
    assert_eq!(axis("decode", "model.layers.0.mlp.up_proj"), Some(1));
    // A rank's [gate block; up block] is no block of the single-device [gate; up].
    assert_eq!(
        axis("decode", "model.layers.0.mlp.[gate_proj;up_proj]"),
        None
    );
    assert_eq!(axis("prefill", "model.layers.0.self_attn.o_proj"), None);
    assert_eq!(
        axis("prefill", "model.layers.0.self_attn.o_proj.weight"),
        None
    );
    let rank = partition(&whole, 2).unwrap().remove(0);
    assert!(glmc_passes::split_layout(&rank)
        .unwrap_err()
        .to_string()
        .contains("already rank 0 of 2"));
}
