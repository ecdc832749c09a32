//! MLA attention (expanded and absorbed) against a naive softmax written here, the absorbed form
//! against the expanded one through the latent (GLM5-SPEC §3.3), and sparse against dense.

#![allow(clippy::needless_range_loop)]

#[path = "interp_util.rs"]
mod util;

use std::collections::HashMap;

use glmc_ir::{Function, Module, Op, Value};
use glmc_runtime::{Interpreter, Tensor};
use util::*;

/// Naive attention of one query against keys `0..t`: `keys(j)` gives (logit before scale, value);
/// visible keys are `j ≤ pos` and, when given, `j ∈ topk`. No visible key gives zeros.
fn naive_softmax_row(
    t: usize,
    pos: usize,
    topk: Option<&[i64]>,
    scale: f64,
    dv: usize,
    key: impl Fn(usize) -> (f64, Vec<f64>),
) -> Vec<f64> {
    let visible: Vec<usize> = (0..t)
        .filter(|&j| j <= pos && topk.is_none_or(|k| k.contains(&(j as i64))))
        .collect();
    let mut out = vec![0f64; dv];
    if visible.is_empty() {
        return out;
    }
    let logits: Vec<f64> = visible.iter().map(|&j| scale * key(j).0).collect();
    let m = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let z: f64 = logits.iter().map(|l| (l - m).exp()).sum();
    for (&j, l) in visible.iter().zip(&logits) {
        let p = (l - m).exp() / z;
        for (o, v) in out.iter_mut().zip(key(j).1) {
            *o += p * v;
        }
    }
    out
}

fn dotf(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

struct Dims {
    n: usize,
    t: usize,
    h: usize,
    p: usize,
    r: usize,
    v: usize,
}

/// Naive expanded MLA; with `batched`, the caches have a leading batch axis (one per row).
#[allow(clippy::too_many_arguments)]
fn naive_expanded(
    d: &Dims,
    batched: bool,
    q_nope: &[f32],
    q_pe: &[f32],
    k_nope: &[f32],
    k_pe: &[f32],
    v: &[f32],
    positions: &[usize],
    topk: Option<(&[i64], usize)>,
    scale: f64,
) -> Vec<f64> {
    let mut out = Vec::new();
    for i in 0..d.n {
        let b = if batched { i } else { 0 };
        for h in 0..d.h {
            let qn = &q_nope[(i * d.h + h) * d.p..][..d.p];
            let qp = &q_pe[(i * d.h + h) * d.r..][..d.r];
            let row_topk = topk.map(|(k, kk)| &k[i * kk..(i + 1) * kk]);
            out.extend(naive_softmax_row(
                d.t,
                positions[i],
                row_topk,
                scale,
                d.v,
                |j| {
                    let kn = &k_nope[((b * d.t + j) * d.h + h) * d.p..][..d.p];
                    let kp = &k_pe[(b * d.t + j) * d.r..][..d.r];
                    let vv = &v[((b * d.t + j) * d.h + h) * d.v..][..d.v];
                    (
                        dotf(qn, kn) + dotf(qp, kp),
                        vv.iter().map(|&x| x as f64).collect(),
                    )
                },
            ));
        }
    }
    out
}

fn sh(dims: &[usize]) -> Vec<String> {
    dims.iter().map(|d| d.to_string()).collect()
}

fn ftype(dims: &[usize]) -> glmc_ir::TensorType {
    let s = sh(dims);
    f(&s.iter().map(String::as_str).collect::<Vec<_>>())
}

fn itype(dims: &[usize]) -> glmc_ir::TensorType {
    let s = sh(dims);
    i(&s.iter().map(String::as_str).collect::<Vec<_>>())
}

#[allow(clippy::type_complexity)]
fn random_expanded(
    d: &Dims,
    batched: bool,
    seed: u64,
) -> (Vec<(glmc_ir::TensorType, Tensor)>, Vec<Vec<f32>>) {
    let mut rng = Rng(seed);
    let lead: Vec<usize> = if batched { vec![d.n, d.t] } else { vec![d.t] };
    let with = |tail: &[usize]| [lead.clone(), tail.to_vec()].concat();
    let shapes = [
        vec![d.n, d.h, d.p],
        vec![d.n, d.h, d.r],
        with(&[d.h, d.p]),
        with(&[d.r]),
        with(&[d.h, d.v]),
    ];
    let mut inputs = Vec::new();
    let mut raw = Vec::new();
    for s in &shapes {
        let t = rng.tensor(s, 1.0);
        raw.push(fv(&t).to_vec());
        inputs.push((ftype(s), t));
    }
    (inputs, raw)
}

#[test]
fn expanded_attention_matches_naive_dense_and_sparse() {
    let d = Dims {
        n: 3,
        t: 6,
        h: 2,
        p: 3,
        r: 2,
        v: 4,
    };
    let positions = [2usize, 4, 5];
    let pos_t = || {
        (
            itype(&[3]),
            i64t(&[3], positions.iter().map(|&p| p as i64).collect()),
        )
    };
    let scale = 0.37;
    let (mut inputs, raw) = random_expanded(&d, false, 1);
    inputs.push(pos_t());
    let dense = run_op_ok(
        Op::MlaAttend {
            dense_until: 0,
            scale,
            sparse: false,
        },
        inputs.clone(),
    );
    let expected = naive_expanded(
        &d, false, &raw[0], &raw[1], &raw[2], &raw[3], &raw[4], &positions, None, scale,
    );
    assert_eq!(dense[0].shape(), [3, 2, 4]);
    assert_close(fv(&dense[0]), &expected, 1e-5);

    // Row 0 names a future key (5) and a duplicate; row 2 selects nothing (zeros).
    let topk = vec![0, 2, -1, 5, 4, 4, 1, -1, -1, -1, -1, -1];
    inputs.push((itype(&[3, 4]), i64t(&[3, 4], topk.clone())));
    let sparse = run_op_ok(
        Op::MlaAttend {
            dense_until: 0,
            scale,
            sparse: true,
        },
        inputs,
    );
    let filtered: Vec<i64> = topk
        .iter()
        .enumerate()
        .map(|(k, &j)| if j > positions[k / 4] as i64 { -1 } else { j })
        .collect();
    let expected = naive_expanded(
        &d,
        false,
        &raw[0],
        &raw[1],
        &raw[2],
        &raw[3],
        &raw[4],
        &positions,
        Some((&filtered, 4)),
        scale,
    );
    assert_close(fv(&sparse[0]), &expected, 1e-5);
    assert!(fv(&sparse[0])[16..].iter().all(|&x| x == 0.0));
}

#[test]
fn batched_attention_reads_each_rows_own_sequence() {
    let d = Dims {
        n: 2,
        t: 5,
        h: 3,
        p: 4,
        r: 2,
        v: 3,
    };
    let positions = [1usize, 4];
    let (mut inputs, raw) = random_expanded(&d, true, 2);
    inputs.push((itype(&[2]), i64t(&[2], vec![1, 4])));
    let out = run_op_ok(
        Op::MlaAttend {
            dense_until: 0,
            scale: 0.5,
            sparse: false,
        },
        inputs,
    );
    let expected = naive_expanded(
        &d, true, &raw[0], &raw[1], &raw[2], &raw[3], &raw[4], &positions, None, 0.5,
    );
    assert_close(fv(&out[0]), &expected, 1e-5);
}

#[test]
fn absorbed_attention_matches_naive() {
    let (n, t, h, l, r) = (2, 4, 2, 5, 2);
    let mut rng = Rng(3);
    let q_abs = rng.tensor(&[n, h, l], 1.0);
    let q_pe = rng.tensor(&[n, h, r], 1.0);
    let c = rng.tensor(&[t, l], 1.0);
    let k_pe = rng.tensor(&[t, r], 1.0);
    let positions = [1usize, 3];
    let out = run_op_ok(
        Op::MlaAttendAbsorbed {
            dense_until: 0,
            scale: 0.25,
            sparse: false,
        },
        vec![
            (ftype(&[n, h, l]), q_abs.clone()),
            (ftype(&[n, h, r]), q_pe.clone()),
            (ftype(&[t, l]), c.clone()),
            (ftype(&[t, r]), k_pe.clone()),
            (itype(&[n]), i64t(&[n], vec![1, 3])),
        ],
    );
    let mut expected = Vec::new();
    for i in 0..n {
        for hh in 0..h {
            let qa = &fv(&q_abs)[(i * h + hh) * l..][..l];
            let qp = &fv(&q_pe)[(i * h + hh) * r..][..r];
            expected.extend(naive_softmax_row(t, positions[i], None, 0.25, l, |j| {
                let cj = &fv(&c)[j * l..][..l];
                let kj = &fv(&k_pe)[j * r..][..r];
                (
                    dotf(qa, cj) + dotf(qp, kj),
                    cj.iter().map(|&x| x as f64).collect(),
                )
            }));
        }
    }
    assert_close(fv(&out[0]), &expected, 1e-5);
}

/// Expanded and absorbed MLA over the same latent cache, as two functions of one graph module:
/// expanded computes k_nope = W_UK·c and v = W_UV·c per head; absorbed computes
/// q_abs = W_UKᵀ·q_nope, attends over c and applies W_UV afterwards.
fn expanded_vs_absorbed(sparse: bool) -> f64 {
    let (n, t, h, p, r, l, v) = (4usize, 7usize, 3usize, 5usize, 4usize, 8usize, 6usize);
    let scale = 1.0 / ((p + r) as f64).sqrt();
    let mut func = Function::new("mla");
    let q_nope = func.push_input(0, "q_nope", f(&["n", "3", "5"]));
    let q_pe = func.push_input(1, "q_pe", f(&["n", "3", "4"]));
    let c = func.push_input(2, "c", f(&["t", "8"]));
    let k_pe = func.push_input(3, "k_pe", f(&["t", "4"]));
    let w_uk = func.push_input(4, "w_uk", f(&["3", "5", "8"]));
    let w_uk_t = func.push_input(5, "w_uk_t", f(&["3", "8", "5"]));
    let w_uv = func.push_input(6, "w_uv", f(&["3", "6", "8"]));
    let pos = func.push_input(7, "pos", i(&["n"]));
    let topk = func.push_input(8, "topk", i(&["n", "3"]));
    let push = |func: &mut Function, op, name: &str, args: &[Value]| -> Value {
        func.push(op, name, args).unwrap().into()
    };
    // c broadcast over heads: [t, 1, L] concatenated H times → [t, H, L].
    let c1 = push(
        &mut func,
        Op::Reshape {
            shape: vec!["t".into(), 1u64.into(), 8u64.into()],
        },
        "c1",
        &[c],
    );
    let ch = push(&mut func, Op::Concat { axis: 1 }, "ch", &[c1, c1, c1]);
    let k_nope = push(&mut func, Op::MatmulHeads {}, "k_nope", &[ch, w_uk]);
    let vv = push(&mut func, Op::MatmulHeads {}, "v", &[ch, w_uv]);
    let mut attend = vec![q_nope, q_pe, k_nope, k_pe, vv, pos];
    if sparse {
        attend.push(topk);
    }
    let expanded = push(
        &mut func,
        Op::MlaAttend {
            dense_until: 0,
            scale,
            sparse,
        },
        "expanded",
        &attend,
    );
    let q_abs = push(&mut func, Op::MatmulHeads {}, "q_abs", &[q_nope, w_uk_t]);
    let mut attend = vec![q_abs, q_pe, c, k_pe, pos];
    if sparse {
        attend.push(topk);
    }
    let o_lat = push(
        &mut func,
        Op::MlaAttendAbsorbed {
            dense_until: 0,
            scale,
            sparse,
        },
        "o_lat",
        &attend,
    );
    let absorbed = push(&mut func, Op::MatmulHeads {}, "absorbed", &[o_lat, w_uv]);
    func.results = vec![("expanded".into(), expanded), ("absorbed".into(), absorbed)];

    let mut rng = Rng(if sparse { 5 } else { 4 });
    let w_uk_v = rng.tensor(&[h, p, l], 0.5);
    let w_uk_t_v = w_uk_v.transpose(&[0, 2, 1]).unwrap();
    let inputs = vec![
        rng.tensor(&[n, h, p], 1.0),
        rng.tensor(&[n, h, r], 1.0),
        rng.tensor(&[t, l], 1.0),
        rng.tensor(&[t, r], 1.0),
        w_uk_v,
        w_uk_t_v,
        rng.tensor(&[h, v, l], 0.5),
        i64t(&[n], vec![3, 4, 5, 6]),
        i64t(&[n, 3], vec![0, 3, -1, 4, 1, 2, 5, 0, 6, 6, -1, 2]),
    ];
    let weights: HashMap<String, Tensor> = HashMap::new();
    let out = Interpreter::new()
        .run(&Module::new("m"), &func, &weights, &mut [], &inputs)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out[0].shape(), [n, h, v]);
    assert_eq!(out[1].shape(), [n, h, v]);
    rel_err(fv(&out[1]), fv(&out[0]))
}

#[test]
fn expanded_equals_absorbed_through_the_latent() {
    let dense = expanded_vs_absorbed(false);
    assert!(dense <= 1e-5, "dense: relative error {dense}");
    let sparse = expanded_vs_absorbed(true);
    assert!(sparse <= 1e-5, "sparse: relative error {sparse}");
}

#[test]
fn sparse_with_every_causal_key_equals_dense() {
    let d = Dims {
        n: 4,
        t: 6,
        h: 2,
        p: 3,
        r: 2,
        v: 3,
    };
    let (mut inputs, _) = random_expanded(&d, false, 6);
    inputs.push((itype(&[4]), i64t(&[4], vec![0, 2, 3, 5])));
    let dense = run_op_ok(
        Op::MlaAttend {
            dense_until: 0,
            scale: 0.3,
            sparse: false,
        },
        inputs.clone(),
    );
    // Every causal key of each row, shuffled, padded with −1 and with future keys mixed in.
    let topk = vec![
        -1, 0, 5, -1, 3, -1, //
        2, 1, -1, 0, 4, -1, //
        3, 0, 2, 1, -1, 5, //
        5, 4, 3, 2, 1, 0,
    ];
    inputs.push((itype(&[4, 6]), i64t(&[4, 6], topk)));
    let sparse = run_op_ok(
        Op::MlaAttend {
            dense_until: 0,
            scale: 0.3,
            sparse: true,
        },
        inputs,
    );
    assert_eq!(fv(&sparse[0]), fv(&dense[0]));
}

#[test]
fn dsa_score_matches_naive_on_a_batched_cache() {
    let (n, t, hi, di) = (3, 5, 4, 6);
    let mut rng = Rng(8);
    let q = rng.tensor(&[n, hi, di], 1.0);
    let w = rng.tensor(&[n, hi], 1.0);
    let k = rng.tensor(&[n, t, di], 1.0);
    let positions = [0usize, 4, 2];
    let out = run_op_ok(
        Op::DsaScore { weight_scale: 1.0 },
        vec![
            (ftype(&[n, hi, di]), q.clone()),
            (ftype(&[n, hi]), w.clone()),
            (ftype(&[n, t, di]), k.clone()),
            (itype(&[n]), i64t(&[n], vec![0, 4, 2])),
        ],
    );
    let mut expected = Vec::new();
    for row in 0..n {
        for j in 0..t {
            if j > positions[row] {
                expected.push(f64::NEG_INFINITY);
                continue;
            }
            let kj = &fv(&k)[(row * t + j) * di..][..di];
            let s: f64 = (0..hi)
                .map(|h| {
                    let d = dotf(&fv(&q)[(row * hi + h) * di..][..di], kj);
                    fv(&w)[row * hi + h] as f64 * d.max(0.0)
                })
                .sum();
            expected.push(s);
        }
    }
    let got = fv(&out[0]);
    for (g, e) in got.iter().zip(&expected) {
        if e.is_infinite() {
            assert_eq!(*g, f32::NEG_INFINITY);
        } else {
            assert!(
                (*g as f64 - e).abs() <= 1e-5 * e.abs().max(1.0),
                "{g} vs {e}"
            );
        }
    }
}
