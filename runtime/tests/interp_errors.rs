//! Misuse is an `InterpError` naming what is wrong, never a panic.

#[path = "interp_util.rs"]
mod util;

use std::collections::HashMap;

use glmc_ir::{DType, Function, Module, Op, Recipe};
use glmc_runtime::{Checkpoint, InterpError, Interpreter, SequenceCache, Tensor};
use util::*;

fn no_weights() -> HashMap<String, Tensor> {
    HashMap::new()
}

/// `rope(x [s, 4], pos [s])`.
fn rope_fn() -> (Module, Function) {
    single_op(
        Op::Rope {
            interleaved: true,
            theta: 10000.0,
        },
        &[f(&["s", "4"]), i(&["s"])],
    )
}

fn err_text(r: Result<Vec<Tensor>, InterpError>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn wrong_input_count() {
    let (m, func) = rope_fn();
    let e = err_text(Interpreter::new().run(
        &m,
        &func,
        &no_weights(),
        &mut [],
        &[f32t(&[1, 4], vec![0.0; 4])],
    ));
    assert!(
        e.contains("@test") && e.contains("takes 2 inputs") && e.contains("got 1"),
        "{e}"
    );
}

#[test]
fn inconsistent_symbol_sizes() {
    let (m, func) = rope_fn();
    let inputs = [f32t(&[3, 4], vec![0.0; 12]), i64t(&[2], vec![0, 1])];
    let e = err_text(Interpreter::new().run(&m, &func, &no_weights(), &mut [], &inputs));
    assert!(
        e.contains("input 1 \"in1\"") && e.contains("s = 2") && e.contains("s = 3"),
        "{e}"
    );
}

#[test]
fn wrong_input_rank_dtype_and_constant_dim() {
    let (m, func) = rope_fn();
    let run = |inputs: &[Tensor]| {
        err_text(Interpreter::new().run(&m, &func, &no_weights(), &mut [], inputs))
    };
    let e = run(&[f32t(&[1, 5], vec![0.0; 5]), i64t(&[1], vec![0])]);
    assert!(
        e.contains("declared f32[s,4]") && e.contains("[1, 5]"),
        "{e}"
    );
    let e = run(&[f32t(&[4], vec![0.0; 4]), i64t(&[1], vec![0])]);
    assert!(e.contains("declared f32[s,4]"), "{e}");
    let e = run(&[f32t(&[1, 4], vec![0.0; 4]), f32t(&[1], vec![0.0])]);
    assert!(
        e.contains("declared i64[s]") && e.contains("f32 data"),
        "{e}"
    );
}

#[test]
fn position_beyond_max_context_and_negative_position() {
    let (m, func) = rope_fn();
    let mut interp = Interpreter::new().with_max_context(8);
    let x = f32t(&[2, 4], vec![0.0; 8]);
    let e = err_text(interp.run(
        &m,
        &func,
        &no_weights(),
        &mut [],
        &[x.clone(), i64t(&[2], vec![7, 8])],
    ));
    assert!(
        e.contains("node \"out\" (rope")
            && e.contains("position 8")
            && e.contains("maximum context of 8"),
        "{e}"
    );
    let e = err_text(interp.run(
        &m,
        &func,
        &no_weights(),
        &mut [],
        &[x, i64t(&[2], vec![0, -1])],
    ));
    assert!(e.contains("negative"), "{e}");
}

#[test]
fn embed_id_out_of_range() {
    let e = err_text(run_op(
        Op::Embed {},
        vec![
            (f(&["3", "2"]), f32t(&[3, 2], vec![0.0; 6])),
            (i(&["s"]), i64t(&[2], vec![1, 3])),
        ],
    ));
    assert!(
        e.contains("node \"out\" (embed of f32[3, 2], i64[2])")
            && e.contains("token id 3")
            && e.contains("vocabulary of 3"),
        "{e}"
    );
}

/// `x [s, 3] · w [2, 3]ᵀ` with `w` a weight node named `layer.w`.
fn weight_fn() -> (Module, Function) {
    let mut func = Function::new("prefill");
    let x = func.push_input(0, "x", f(&["s", "3"]));
    let w = func
        .push_weight(
            "layer.w",
            Recipe::tensor("model.layer.w", vec![2, 3]),
            DType::F32,
        )
        .unwrap();
    let y = push(&mut func, Op::Matmul {}, "y", &[x, w]);
    func.results = vec![("y".into(), y)];
    (Module::new("m"), func)
}

#[test]
fn missing_weight() {
    let (m, func) = weight_fn();
    let e = err_text(Interpreter::new().run(
        &m,
        &func,
        &no_weights(),
        &mut [],
        &[f32t(&[1, 3], vec![0.0; 3])],
    ));
    assert!(
        e.contains("@prefill") && e.contains("\"layer.w\"") && e.contains("missing"),
        "{e}"
    );
}

#[test]
fn weight_shape_mismatch() {
    let (m, func) = weight_fn();
    let w = HashMap::from([("layer.w".to_string(), f32t(&[3, 2], vec![0.0; 6]))]);
    let e =
        err_text(Interpreter::new().run(&m, &func, &w, &mut [], &[f32t(&[1, 3], vec![0.0; 3])]));
    assert!(
        e.contains("weight shape mismatch") && e.contains("f32[2,3]") && e.contains("[3, 2]"),
        "{e}"
    );
}

#[test]
fn checkpoint_weights_and_a_missing_checkpoint_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<f32> = vec![1.0, 0.0, 0.0, 0.0, 1.0, 1.0];
    let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2, 3], &bytes).unwrap();
    safetensors::serialize_to_file(
        [("model.layer.w", view)],
        None,
        &dir.path().join("model.safetensors"),
    )
    .unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let (m, func) = weight_fn();
    let out = Interpreter::new()
        .run(
            &m,
            &func,
            &ckpt,
            &mut [],
            &[f32t(&[1, 3], vec![2.0, 3.0, 4.0])],
        )
        .unwrap();
    assert_eq!(fv(&out[0]), [2.0, 7.0]);

    let mut func = Function::new("prefill");
    let x = func.push_input(0, "x", f(&["s", "3"]));
    let w = func
        .push_weight(
            "layer.v",
            Recipe::tensor("model.layer.v", vec![2, 3]),
            DType::F32,
        )
        .unwrap();
    let y = push(&mut func, Op::Matmul {}, "y", &[x, w]);
    func.results = vec![("y".into(), y)];
    let e =
        err_text(Interpreter::new().run(&m, &func, &ckpt, &mut [], &[f32t(&[1, 3], vec![0.0; 3])]));
    assert!(
        e.contains("\"layer.v\"") && e.contains("model.layer.v"),
        "{e}"
    );
}

#[test]
fn cache_misuse() {
    let m = cache_module();
    let w = no_weights();
    let mut interp = Interpreter::new();
    let rows = |n: usize| f32t(&[n, 2], vec![1.0; 2 * n]);
    let (mut a, mut b) = (SequenceCache::new(), SequenceCache::new());
    let prefill = m.function("prefill").unwrap();
    let decode = m.function("decode").unwrap();
    let e = err_text(interp.run(
        &m,
        prefill,
        &w,
        &mut [&mut a, &mut b],
        &[rows(1), i64t(&[1], vec![0])],
    ));
    assert!(e.contains("one sequence") && e.contains("2 caches"), "{e}");
    let e = err_text(interp.run(&m, prefill, &w, &mut [], &[rows(1), i64t(&[1], vec![0])]));
    assert!(e.contains("0 caches"), "{e}");
    let e = err_text(interp.run(
        &m,
        decode,
        &w,
        &mut [&mut a],
        &[rows(2), i64t(&[2], vec![0, 0])],
    ));
    assert!(e.contains("writes 2 rows") && e.contains("1 caches"), "{e}");
    let e = err_text(interp.run(
        &m,
        prefill,
        &w,
        &mut [&mut a],
        &[rows(1), i64t(&[1], vec![5])],
    ));
    assert!(e.contains("gap") && e.contains("position 5"), "{e}");
    assert!(a.is_empty() && b.is_empty());
    // A failing call rolls back what it appended: sequence 0's row is dropped again when
    // sequence 1's write would leave a gap.
    interp
        .run(
            &m,
            prefill,
            &w,
            &mut [&mut a],
            &[rows(2), i64t(&[2], vec![0, 1])],
        )
        .unwrap();
    let e = err_text(interp.run(
        &m,
        decode,
        &w,
        &mut [&mut a, &mut b],
        &[rows(2), i64t(&[2], vec![2, 3])],
    ));
    assert!(e.contains("sequence 1") && e.contains("gap"), "{e}");
    assert_eq!((a.len(), b.len()), (2, 0));
}

#[test]
fn attention_position_past_the_cache() {
    let e = err_text(run_op(
        Op::MlaAttendAbsorbed {
            dense_until: 0,
            scale: 1.0,
            sparse: false,
        },
        vec![
            (f(&["n", "1", "2"]), f32t(&[1, 1, 2], vec![0.0; 2])),
            (f(&["n", "1", "2"]), f32t(&[1, 1, 2], vec![0.0; 2])),
            (f(&["t", "2"]), f32t(&[2, 2], vec![0.0; 4])),
            (f(&["t", "2"]), f32t(&[2, 2], vec![0.0; 4])),
            (i(&["n"]), i64t(&[1], vec![2])),
        ],
    ));
    assert!(
        e.contains("position 2") && e.contains("holds 2 keys"),
        "{e}"
    );
}

#[test]
fn topk_index_below_minus_one_and_router_nan() {
    let e = err_text(run_op(
        Op::MlaAttendAbsorbed {
            dense_until: 0,
            scale: 1.0,
            sparse: true,
        },
        vec![
            (f(&["n", "1", "2"]), f32t(&[1, 1, 2], vec![0.0; 2])),
            (f(&["n", "1", "2"]), f32t(&[1, 1, 2], vec![0.0; 2])),
            (f(&["t", "2"]), f32t(&[2, 2], vec![0.0; 4])),
            (f(&["t", "2"]), f32t(&[2, 2], vec![0.0; 4])),
            (i(&["n"]), i64t(&[1], vec![1])),
            (i(&["n", "2"]), i64t(&[1, 2], vec![0, -7])),
        ],
    ));
    assert!(e.contains("index -7"), "{e}");
    let e = err_text(run_op(
        Op::MoeRoute {
            n_group: 1,
            norm_topk_prob: true,
            routed_scaling_factor: 1.0,
            top_k: 1,
            topk_group: 1,
        },
        vec![
            (f(&["n", "2"]), f32t(&[1, 2], vec![f32::NAN, 0.0])),
            (f(&["2"]), f32t(&[2], vec![0.0; 2])),
        ],
    ));
    assert!(e.contains("NaN"), "{e}");
}

#[test]
fn unverifiable_function() {
    // A cache.update of a state the module does not declare.
    let mut m = cache_module();
    m.states.clear();
    let f = m.function("prefill").unwrap();
    let mut c = SequenceCache::new();
    let e = err_text(Interpreter::new().run(
        &m,
        f,
        &no_weights(),
        &mut [&mut c],
        &[f32t(&[1, 2], vec![0.0; 2]), i64t(&[1], vec![0])],
    ));
    assert!(e.contains("does not verify") && e.contains("kv"), "{e}");
}
