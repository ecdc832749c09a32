//! `lower-moe`: the snapshot of tiny-sparse after it (its input is `fuse-elementwise`'s
//! `tiny_sparse_after` snapshot), no `moe.experts` left in any shipped model or oracle fixture
//! after the pipeline, and the two forms of `moe.combine` (the shared experts' `add` folded in,
//! or left alone when the experts' sum has another reader) computing what the unlowered graph
//! does on random operands. Whole models are translation-validated with the rest of the pipeline
//! in `translation.rs`.

mod support;

use std::collections::HashMap;

use glmc_ir::{print_module, DType, Dim, Function, Module, Op, TensorType, Value};
use glmc_passes::lower_moe::LowerMoe;
use glmc_passes::{pipeline, AttentionChoice, Pass, PipelineOptions, PIPELINE};
use glmc_runtime::{run_function, Tensor};
use support::*;

/// The passes up to and including `lower-moe`, in pipeline order.
fn through_lower_moe() -> Vec<&'static str> {
    let end = PIPELINE.iter().position(|p| *p == "lower-moe").unwrap();
    PIPELINE[..=end].to_vec()
}

fn count(m: &Module, op: &str) -> usize {
    m.functions
        .iter()
        .flat_map(|f| f.graph.node_weights())
        .filter(|n| n.op.name() == op)
        .count()
}

#[test]
fn tiny_sparse_after() {
    let module = build(&shipped("tiny-sparse.ron"));
    let stages = stages_of(&module, AttentionChoice::Auto, &through_lower_moe());
    let (name, after, changed) = stages.last().unwrap();
    assert_eq!(*name, "lower-moe");
    assert!(changed, "tiny-sparse has MoE layers to lower");
    insta::assert_snapshot!(print_module(after));
}

#[test]
fn no_moe_experts_remain_after_the_pipeline() {
    let mut configs: Vec<_> = [
        "tiny-sparse.ron",
        "tiny-dense.ron",
        "glm5.ron",
        "glm5-2layer.ron",
    ]
    .iter()
    .map(|f| shipped(f))
    .collect();
    for dir in oracle_fixtures() {
        configs.push(glmc_models::import_hf(&dir).unwrap().config);
    }
    for config in configs {
        let mut m = build(&config);
        let experts = count(&m, "moe.experts");
        assert!(experts > 0, "{} has MoE layers", config.name);
        pipeline(&PipelineOptions::default())
            .unwrap()
            .run(&mut m)
            .unwrap();
        assert_eq!(count(&m, "moe.experts"), 0, "{}", config.name);
        for op in ["moe.sort", "moe.gate_up", "moe.down", "moe.combine"] {
            assert_eq!(count(&m, op), experts, "{}: {op}", config.name);
        }
    }
}

/// Inputs of one MoE block: `x`, the routing `weights` and `experts`, the stacked `gate`, `up`,
/// `down`, and a `shared` output to add.
const N: u64 = 5;
const D: u64 = 12;
const I: u64 = 8;
const E: u64 = 6;
const K: u64 = 3;

/// `y = moe.experts(..) + shared`; with `expose`, the experts' sum is a result of its own too.
fn moe_block(expose: bool) -> Module {
    let mut f = Function::new("decode");
    let b = Dim::Sym("b".into());
    let c = Dim::Const;
    let ty = |dtype, shape: Vec<Dim>| TensorType::new(dtype, shape);
    let x = f.push_input(0, "x", ty(DType::F32, vec![b.clone(), c(D)]));
    let w = f.push_input(1, "weights", ty(DType::F32, vec![b.clone(), c(K)]));
    let ids = f.push_input(2, "experts", ty(DType::I64, vec![b.clone(), c(K)]));
    let gate = f.push_input(3, "gate", ty(DType::F32, vec![c(E), c(I), c(D)]));
    let up = f.push_input(4, "up", ty(DType::F32, vec![c(E), c(I), c(D)]));
    let down = f.push_input(5, "down", ty(DType::F32, vec![c(E), c(D), c(I)]));
    let shared = f.push_input(6, "shared", ty(DType::F32, vec![b, c(D)]));
    let routed: Value = f
        .push(
            Op::MoeExperts {},
            "mlp.experts",
            &[x, w, ids, gate, up, down],
        )
        .unwrap()
        .into();
    let y = f.push(Op::Add {}, "mlp", &[routed, shared]).unwrap();
    f.results.push(("y".into(), y.into()));
    if expose {
        f.results.push(("routed".into(), routed));
    }
    let mut m = Module::new("moe");
    m.functions.push(f);
    m
}

fn random_inputs(seed: u64) -> Vec<Tensor> {
    let mut rng = Rng::new(seed);
    let mut floats = |shape: Vec<usize>| {
        let n = shape.iter().product();
        Tensor::f32(shape, (0..n).map(|_| rng.normal() as f32).collect()).unwrap()
    };
    let (n, d, i, e, k) = (N as usize, D as usize, I as usize, E as usize, K as usize);
    let x = floats(vec![n, d]);
    let w = floats(vec![n, k]);
    let (gate, up, down, shared) = (
        floats(vec![e, i, d]),
        floats(vec![e, i, d]),
        floats(vec![e, d, i]),
        floats(vec![n, d]),
    );
    // Token t picks experts t, t+1, t+2 (mod E): every expert gets rows, some none at small n.
    let ids = (0..n * k).map(|a| ((a / k + a % k) % e) as i64).collect();
    let ids = Tensor::i64(vec![n, k], ids).unwrap();
    vec![x, w, ids, gate, up, down, shared]
}

fn run(m: &Module, ins: &[Tensor]) -> Vec<Vec<f32>> {
    run_function(m, &m.functions[0], &HashMap::new(), &mut [], ins)
        .unwrap()
        .into_iter()
        .map(|t| t.into_f32().unwrap())
        .collect()
}

fn assert_same(before: &[Vec<f32>], after: &[Vec<f32>]) {
    assert_eq!(before.len(), after.len());
    for (a, b) in before.iter().zip(after) {
        let scale = a.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(worst <= 1e-6 * scale, "max diff {worst} (scale {scale})");
    }
}

#[test]
fn the_shared_add_folds_into_the_combine() {
    let before = moe_block(false);
    let mut after = before.clone();
    assert!(LowerMoe.run(&mut after).unwrap());
    let f = &after.functions[0];
    let combine = f.node(f.find("mlp").unwrap());
    assert_eq!(combine.op, Op::MoeCombine { shared: true });
    assert_eq!(count(&after, "add") + count(&after, "moe.experts"), 0);
    let ins = random_inputs(1);
    assert_same(&run(&before, &ins), &run(&after, &ins));
}

#[test]
fn an_experts_sum_read_elsewhere_keeps_its_add() {
    let before = moe_block(true);
    let mut after = before.clone();
    assert!(LowerMoe.run(&mut after).unwrap());
    let f = &after.functions[0];
    let combine = f.node(f.find("mlp.experts").unwrap());
    assert_eq!(combine.op, Op::MoeCombine { shared: false });
    assert_eq!(count(&after, "add"), 1);
    let ins = random_inputs(2);
    assert_same(&run(&before, &ins), &run(&after, &ins));
}

#[test]
fn a_wrong_lowering_is_caught() {
    // The check can fail: dropping the shared output from the folded combine changes y.
    let before = moe_block(false);
    let mut after = before.clone();
    LowerMoe.run(&mut after).unwrap();
    let f = &mut after.functions[0];
    let n = f.find("mlp").unwrap();
    let operands = f.operands(n);
    f.replace_op(n, Op::MoeCombine { shared: false }, &operands[..3]);
    let ins = random_inputs(3);
    let (a, b) = (run(&before, &ins), run(&after, &ins));
    let diff = a[0]
        .iter()
        .zip(&b[0])
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(
        diff > 0.1,
        "dropping the shared output went unnoticed ({diff})"
    );
}
