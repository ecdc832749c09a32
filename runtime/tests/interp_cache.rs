//! KV caches across calls: `cache.update` rows, chunked prefill, batched decode, weight reuse and
//! the tracing hook.

#[path = "interp_util.rs"]
mod util;

use std::cell::Cell;
use std::collections::HashMap;

use glmc_ir::{DType, Function, Module, Op, Recipe};
use glmc_runtime::{InterpError, Interpreter, SequenceCache, Tensor, TraceRecord, WeightSource};
use util::*;

const D: usize = 6;
const L: usize = 4;
const R: usize = 2;
const H: usize = 2;

/// A cut-down absorbed-MLA layer over a latent cache `kv` of rows `[c (L) | k_pe (R)]`.
/// `prefill` takes `x [s, D]`, `pos [s]`; `decode` takes `x [b, D]`, `pos [b]`, one row per
/// sequence. Both return the attention output `[rows, H, L]`.
fn layer_module() -> Module {
    let mut m = module_with_states(&[("kv", ty(DType::BF16, &[&(L + R).to_string()]))]);
    for batched in [false, true] {
        let (name, rows) = if batched {
            ("decode", "b")
        } else {
            ("prefill", "s")
        };
        let mut func = Function::new(name);
        let x = func.push_input(0, "x", f(&[rows, "6"]));
        let pos = func.push_input(1, "pos", i(&[rows]));
        let w = |func: &mut Function, name: &str, n: usize| {
            func.push_weight(
                name,
                Recipe::tensor(name, vec![n as u64, D as u64]),
                DType::BF16,
            )
            .unwrap()
        };
        let w_kva = w(&mut func, "kv_a", L + R);
        let w_q = w(&mut func, "q_abs", H * L);
        let w_qr = w(&mut func, "q_rope", H * R);
        // bf16 weights meet f32 activations: cast x to the model dtype first.
        let xb = push(&mut func, Op::Cast { dtype: DType::BF16 }, "x.bf16", &[x]);
        let kva = push(&mut func, Op::Matmul {}, "kva", &[xb, w_kva]);
        let c = push(
            &mut func,
            Op::Slice {
                axis: 1,
                start: 0,
                end: L as u64,
            },
            "c",
            &[kva],
        );
        let kpe_raw = push(
            &mut func,
            Op::Slice {
                axis: 1,
                start: L as u64,
                end: (L + R) as u64,
            },
            "kpe_raw",
            &[kva],
        );
        let kpe = push(
            &mut func,
            Op::Rope {
                interleaved: true,
                theta: 10000.0,
            },
            "kpe",
            &[kpe_raw, pos],
        );
        let row = push(&mut func, Op::Concat { axis: 1 }, "row", &[c, kpe]);
        let cache = push(
            &mut func,
            Op::CacheUpdate {
                batched,
                state: "kv".into(),
            },
            "cache",
            &[row, pos],
        );
        let axis = if batched { 2 } else { 1 };
        let c_cache = push(
            &mut func,
            Op::Slice {
                axis,
                start: 0,
                end: L as u64,
            },
            "c_cache",
            &[cache],
        );
        let kpe_cache = push(
            &mut func,
            Op::Slice {
                axis,
                start: L as u64,
                end: (L + R) as u64,
            },
            "kpe_cache",
            &[cache],
        );
        let q = push(&mut func, Op::Matmul {}, "q", &[xb, w_q]);
        let q_abs = push(
            &mut func,
            Op::Reshape {
                shape: vec![rows.into(), (H as u64).into(), (L as u64).into()],
            },
            "q_abs3",
            &[q],
        );
        let qr = push(&mut func, Op::Matmul {}, "qr", &[xb, w_qr]);
        let qr3 = push(
            &mut func,
            Op::Reshape {
                shape: vec![rows.into(), (H as u64).into(), (R as u64).into()],
            },
            "qr3",
            &[qr],
        );
        let q_pe = push(
            &mut func,
            Op::Rope {
                interleaved: true,
                theta: 10000.0,
            },
            "q_pe",
            &[qr3, pos],
        );
        let out = push(
            &mut func,
            Op::MlaAttendAbsorbed {
                dense_until: 0,
                scale: 0.5,
                sparse: false,
            },
            "attn",
            &[q_abs, q_pe, c_cache, kpe_cache, pos],
        );
        func.results = vec![("attn".into(), out)];
        m.functions.push(func);
    }
    m
}

fn layer_weights() -> HashMap<String, Tensor> {
    let mut rng = Rng(42);
    HashMap::from([
        ("kv_a".to_string(), rng.tensor(&[L + R, D], 1.0)),
        ("q_abs".to_string(), rng.tensor(&[H * L, D], 1.0)),
        ("q_rope".to_string(), rng.tensor(&[H * R, D], 1.0)),
    ])
}

fn tokens(n: usize, seed: u64) -> Vec<f32> {
    Rng(seed).vec(n * D, 1.0)
}

fn run(
    interp: &mut Interpreter,
    m: &Module,
    function: &str,
    w: &dyn WeightSource,
    caches: &mut [&mut SequenceCache],
    x: &[f32],
    pos: &[i64],
) -> Tensor {
    let n = pos.len();
    let inputs = [f32t(&[n, D], x.to_vec()), i64t(&[n], pos.to_vec())];
    let mut out = interp
        .run(m, m.function(function).unwrap(), w, caches, &inputs)
        .unwrap_or_else(|e| panic!("{e}"));
    out.remove(0)
}

#[test]
fn cache_update_returns_rows_up_to_the_furthest_position() {
    let m = cache_module();
    let w: HashMap<String, Tensor> = HashMap::new();
    let mut interp = Interpreter::new();
    let mut call = |f: &str, caches: &mut [&mut SequenceCache], rows: Vec<f32>, pos: Vec<i64>| {
        let n = pos.len();
        let inputs = [f32t(&[n, 2], rows), i64t(&[n], pos)];
        interp
            .run(&m, m.function(f).unwrap(), &w, caches, &inputs)
            .unwrap()
            .remove(0)
    };
    let (mut a, mut b) = (SequenceCache::new(), SequenceCache::new());
    let out = call(
        "prefill",
        &mut [&mut a],
        vec![1.0, 2.0, 3.0, 4.0],
        vec![0, 1],
    );
    assert_eq!(out.shape(), [2, 2]);
    assert_eq!(fv(&out), [1.0, 2.0, 3.0, 4.0]);
    // A chunk whose positions arrive out of order continues the cache.
    let out = call(
        "prefill",
        &mut [&mut b],
        vec![10.0, 11.0, 30.0, 31.0, 20.0, 21.0],
        vec![0, 2, 1],
    );
    assert_eq!(fv(&out), [10.0, 11.0, 20.0, 21.0, 30.0, 31.0]);
    let out = call("prefill", &mut [&mut a], vec![5.0, 6.0], vec![2]);
    assert_eq!(out.shape(), [3, 2]);
    assert_eq!(fv(&out), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!((a.len(), b.len()), (3, 3));
    // Batched: A writes position 3, B position 1 (overwriting); t = 4, B zero-padded past 1.
    let out = call(
        "decode",
        &mut [&mut a, &mut b],
        vec![7.0, 8.0, -1.0, -2.0],
        vec![3, 1],
    );
    assert_eq!(out.shape(), [2, 4, 2]);
    assert_eq!(
        fv(&out),
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 11.0, -1.0, -2.0, 0.0, 0.0, 0.0, 0.0]
    );
    assert_eq!(
        a.state_rows("kv").unwrap(),
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    );
    assert_eq!(
        b.state_rows("kv").unwrap(),
        [10.0, 11.0, -1.0, -2.0, 30.0, 31.0]
    );
    b.truncate(1);
    assert_eq!(b.state_rows("kv").unwrap(), [10.0, 11.0]);
}

#[test]
fn chunked_prefill_equals_one_prefill() {
    let m = layer_module();
    let w = layer_weights();
    let mut interp = Interpreter::new();
    let x = tokens(5, 1);
    let mut whole = SequenceCache::new();
    let one = run(
        &mut interp,
        &m,
        "prefill",
        &w,
        &mut [&mut whole],
        &x,
        &[0, 1, 2, 3, 4],
    );
    assert_eq!(one.shape(), [5, H, L]);

    let mut chunked = SequenceCache::new();
    let first = run(
        &mut interp,
        &m,
        "prefill",
        &w,
        &mut [&mut chunked],
        &x[..3 * D],
        &[0, 1, 2],
    );
    let second = run(
        &mut interp,
        &m,
        "prefill",
        &w,
        &mut [&mut chunked],
        &x[3 * D..],
        &[3, 4],
    );
    let joined = Tensor::concat(0, &[first, second]).unwrap();
    assert!(rel_err(fv(&joined), fv(&one)) <= 1e-6);
    assert_eq!(chunked.len(), 5);
    let (a, b) = (
        chunked.state_rows("kv").unwrap(),
        whole.state_rows("kv").unwrap(),
    );
    assert!(rel_err(a, b) <= 1e-6);
    // The outputs are not trivial: the last row attends over 5 distinct keys.
    assert!(fv(&one).iter().any(|&v| v.abs() > 1e-3));
}

#[test]
fn batched_decode_equals_each_sequence_alone() {
    let m = layer_module();
    let w = layer_weights();
    let mut interp = Interpreter::new();
    let (xa, xb) = (tokens(4, 2), tokens(6, 3));
    let prefill = |interp: &mut Interpreter, x: &[f32], n: usize| {
        let mut c = SequenceCache::new();
        let pos: Vec<i64> = (0..n as i64).collect();
        let out = run(interp, &m, "prefill", &w, &mut [&mut c], &x[..n * D], &pos);
        (c, out)
    };
    // A holds 3 tokens and B 5; each decodes its next token.
    let (mut a, _) = prefill(&mut interp, &xa, 3);
    let (mut b, _) = prefill(&mut interp, &xb, 5);
    let (mut a1, mut b1) = (a.clone(), b.clone());
    let step = [&xa[3 * D..4 * D], &xb[5 * D..6 * D]].concat();
    let batch = run(
        &mut interp,
        &m,
        "decode",
        &w,
        &mut [&mut a, &mut b],
        &step,
        &[3, 5],
    );
    assert_eq!(batch.shape(), [2, H, L]);
    let alone_a = run(
        &mut interp,
        &m,
        "decode",
        &w,
        &mut [&mut a1],
        &xa[3 * D..4 * D],
        &[3],
    );
    let alone_b = run(
        &mut interp,
        &m,
        "decode",
        &w,
        &mut [&mut b1],
        &xb[5 * D..6 * D],
        &[5],
    );
    let row = H * L;
    assert!(rel_err(&fv(&batch)[..row], fv(&alone_a)) <= 1e-6);
    assert!(rel_err(&fv(&batch)[row..], fv(&alone_b)) <= 1e-6);
    assert_eq!(a, a1);
    assert_eq!(b, b1);
    // And each decoded row equals the last row of a prefill of the whole sequence.
    let (_, full_a) = prefill(&mut interp, &xa, 4);
    let (_, full_b) = prefill(&mut interp, &xb, 6);
    assert!(rel_err(&fv(&batch)[..row], &fv(&full_a)[3 * row..]) <= 1e-6);
    assert!(rel_err(&fv(&batch)[row..], &fv(&full_b)[5 * row..]) <= 1e-6);
}

/// Counts materializations.
struct Counting {
    inner: HashMap<String, Tensor>,
    loads: Cell<usize>,
}

impl WeightSource for Counting {
    fn weight(&self, name: &str, recipe: &Recipe, dtype: DType) -> Result<Tensor, InterpError> {
        self.loads.set(self.loads.get() + 1);
        self.inner.weight(name, recipe, dtype)
    }
}

#[test]
fn weights_are_materialized_once_across_calls_and_functions() {
    let m = layer_module();
    let w = Counting {
        inner: layer_weights(),
        loads: Cell::new(0),
    };
    let mut interp = Interpreter::new();
    let mut c = SequenceCache::new();
    let x = tokens(3, 4);
    run(
        &mut interp,
        &m,
        "prefill",
        &w,
        &mut [&mut c],
        &x[..2 * D],
        &[0, 1],
    );
    run(
        &mut interp,
        &m,
        "prefill",
        &w,
        &mut [&mut c],
        &x[2 * D..],
        &[2],
    );
    run(
        &mut interp,
        &m,
        "decode",
        &w,
        &mut [&mut c],
        &x[2 * D..],
        &[3],
    );
    assert_eq!(w.loads.get(), 3);
    assert_eq!(interp.cached_weights(), 3);
    interp.clear_weights();
    run(
        &mut interp,
        &m,
        "decode",
        &w,
        &mut [&mut c],
        &x[2 * D..],
        &[4],
    );
    assert_eq!(w.loads.get(), 6);
}

#[test]
fn trace_sees_every_executed_node_with_its_outputs() {
    let m = layer_module();
    let w = layer_weights();
    let f = m.function("prefill").unwrap();
    let mut records: Vec<TraceRecord> = Vec::new();
    let mut c = SequenceCache::new();
    let x = tokens(2, 5);
    let inputs = [f32t(&[2, D], x.clone()), i64t(&[2], vec![0, 1])];
    let out = Interpreter::new()
        .run_traced(&m, f, &w, &mut [&mut c], &inputs, &mut |node, outs| {
            records.extend(TraceRecord::summarize(node, outs, 3));
        })
        .unwrap();
    assert_eq!(records.len(), f.graph.node_count());
    let x_rec = records.iter().find(|r| r.node == "x").unwrap();
    let l2 = x
        .iter()
        .map(|&v| (v as f64) * (v as f64))
        .sum::<f64>()
        .sqrt();
    assert!((x_rec.l2 - l2).abs() < 1e-9);
    assert_eq!(
        x_rec.first,
        x[..3].iter().map(|&v| v as f64).collect::<Vec<_>>()
    );
    let last = records.last().unwrap();
    assert_eq!(
        (last.node.as_str(), last.op),
        ("attn", "mla.attend.absorbed")
    );
    assert_eq!(last.shape, out[0].shape());
    let cache_rec = records.iter().find(|r| r.node == "cache").unwrap();
    assert_eq!(cache_rec.shape, [2, L + R]);
}

/// A weight node holds its dtype's values: the interpreter rounds a bf16 node's weights to
/// nearest-even bf16 (what a bf16 device holds), and leaves an f32 node's alone.
#[test]
fn weights_are_rounded_to_their_node_dtype() {
    let mut func = Function::new("prefill");
    let result = |func: &mut Function, name: &str, dtype| {
        let w = func
            .push_weight(name, Recipe::tensor(name, vec![3]), dtype)
            .unwrap();
        func.results.push((name.to_string(), w));
    };
    result(&mut func, "w_bf16", DType::BF16);
    result(&mut func, "w_f32", DType::F32);
    // A tie (1 + 2^-8, to even: 1), just past one (up), and a value bf16 holds exactly.
    let values = vec![
        1.0 + 2f32.powi(-8),
        1.0 + 2f32.powi(-8) + 2f32.powi(-20),
        0.15625,
    ];
    let weights: HashMap<String, Tensor> = ["w_bf16", "w_f32"]
        .iter()
        .map(|n| (n.to_string(), f32t(&[3], values.clone())))
        .collect();
    let out = Interpreter::new()
        .run(&Module::new("m"), &func, &weights, &mut [], &[])
        .unwrap();
    assert_eq!(fv(&out[0]), [1.0, 1.0 + 2f32.powi(-7), 0.15625]);
    assert_eq!(fv(&out[1]), values);
}

/// A prefill's `slot` operand picks the cache it writes and reads among the slots given; the
/// other slots keep their rows, and a slot past them is an error that changes nothing.
#[test]
fn a_prefill_writes_the_cache_slot_it_names() {
    let mut m = module_with_states(&[("kv", f(&["2"]))]);
    let mut func = Function::new("prefill");
    let new = func.push_input(0, "new", f(&["s", "2"]));
    let pos = func.push_input(1, "pos", i(&["s"]));
    let slot = func.push_input(2, "slot", i(&["1"]));
    let out = push(
        &mut func,
        Op::CacheUpdate {
            batched: false,
            state: "kv".into(),
        },
        "cache",
        &[new, pos, slot],
    );
    func.results = vec![("cache".into(), out)];
    m.functions.push(func);
    let w: HashMap<String, Tensor> = HashMap::new();
    let mut interp = Interpreter::new();
    let (mut a, mut b) = (SequenceCache::new(), SequenceCache::new());
    let mut call = |caches: &mut [&mut SequenceCache], rows: Vec<f32>, slot: i64| {
        let n = rows.len() / 2;
        let inputs = [
            f32t(&[n, 2], rows),
            i64t(&[n], (0..n as i64).collect()),
            i64t(&[1], vec![slot]),
        ];
        interp.run(&m, m.function("prefill").unwrap(), &w, caches, &inputs)
    };
    let out = call(&mut [&mut a, &mut b], vec![1.0, 2.0, 3.0, 4.0], 1).unwrap();
    assert_eq!(fv(&out[0]), [1.0, 2.0, 3.0, 4.0]);
    let out = call(&mut [&mut a, &mut b], vec![5.0, 6.0], 0).unwrap();
    assert_eq!(fv(&out[0]), [5.0, 6.0]);
    let err = call(&mut [&mut a, &mut b], vec![7.0, 8.0], 2)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cache slot 2 is out of range: 2 cache slots were given"),
        "{err}"
    );
    assert_eq!(a.state_rows("kv").unwrap(), [5.0, 6.0]);
    assert_eq!(b.state_rows("kv").unwrap(), [1.0, 2.0, 3.0, 4.0]);
}
