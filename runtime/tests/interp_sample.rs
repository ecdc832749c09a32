//! `slice.last`, `sample.argmax`, `matmul.argmax` and `sample.top_p` in the interpreter, on rows whose answers
//! are worked out by hand; and the statistics of `sample.top_p` over many seeded draws, checked
//! with `sampling::check_frequencies`, the check a GPU harness runs on its own draws.

#[path = "interp_util.rs"]
mod util;

use glmc_ir::{DType, Op};
use glmc_runtime::sampling::{check_frequencies, nucleus_probabilities, uniform, FrequencyError};
use glmc_runtime::Tensor;
use util::*;

#[test]
fn slice_last_takes_the_last_row() {
    let x = f32t(&[3, 2, 2], (0..12).map(|v| v as f32).collect());
    let out = run_op_ok(Op::SliceLast {}, vec![(f(&["s", "2", "2"]), x)]);
    assert_eq!(out[0].shape(), [1, 2, 2]);
    assert_close(fv(&out[0]), &[8.0, 9.0, 10.0, 11.0], 0.0);
    let ids = i64t(&[4], vec![5, 6, 7, 8]);
    let out = run_op_ok(Op::SliceLast {}, vec![(i(&["s"]), ids)]);
    assert_eq!(iv(&out[0]), [8]);
    let e = run_op(
        Op::SliceLast {},
        vec![(f(&["s", "2"]), f32t(&[0, 2], vec![]))],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("\"out\" (slice.last of f32[0, 2])"), "{e}");
    assert!(e.contains("no last row"), "{e}");
}

#[test]
fn argmax_per_row_lowest_index_on_ties_never_nan() {
    let nan = f32::NAN;
    let logits = f32t(
        &[4, 4],
        vec![
            0.5,
            2.0,
            -1.0,
            2.0, // tie: the lower index
            nan,
            -3.0,
            nan,
            -2.0, // NaN skipped
            nan,
            nan,
            nan,
            nan, // nothing to choose
            f32::NEG_INFINITY,
            f32::NEG_INFINITY,
            -1e30,
            f32::INFINITY,
        ],
    );
    let out = run_op_ok(Op::SampleArgmax {}, vec![(f(&["b", "4"]), logits)]);
    assert_eq!(iv(&out[0]), [1, 3, -1, 3]);
}

/// `matmul.argmax` is `sample.argmax` of the product: w's rows 1 and 3 tie for row 0 (the
/// lower wins), row 1 picks w's row 2, and a NaN in x makes row 2 all NaN (−1).
#[test]
fn matmul_argmax_takes_the_argmax_of_the_product() {
    let x = f32t(&[3, 2], vec![1.0, 2.0, -1.0, 0.5, f32::NAN, 1.0]);
    let w = f32t(&[4, 2], vec![0.0, 0.0, 1.0, 1.0, -2.0, 0.0, 3.0, 0.0]);
    let out = run_op_ok(
        Op::MatmulArgmax {},
        vec![(f(&["b", "2"]), x), (f(&["4", "2"]), w)],
    );
    assert_eq!(iv(&out[0]), [1, 2, -1]);
}

/// Runs `sample.top_p` on `logits [n, V]` with per-row parameters.
fn top_p(logits: &[f32], v: usize, t: &[f32], p: &[f32], u: &[f32]) -> Vec<i64> {
    let n = t.len();
    let out = run_op_ok(
        Op::SampleTopP {},
        vec![
            (f(&["b", &v.to_string()]), f32t(&[n, v], logits.to_vec())),
            (f(&["b"]), f32t(&[n], t.to_vec())),
            (f(&["b"]), f32t(&[n], p.to_vec())),
            (f(&["b"]), f32t(&[n], u.to_vec())),
        ],
    );
    iv(&out[0]).to_vec()
}

#[test]
fn top_p_by_hand() {
    // Row probabilities at T = 1: [1/4, 3/4] → order [1, 0], cumulative [0.75, 1].
    let row = [0.0f32, 3f32.ln()];
    let rows: Vec<f32> = row.repeat(5);
    let got = top_p(
        &rows,
        2,
        &[1.0, 1.0, 1.0, 0.0, 1.0],
        &[1.0, 1.0, 1.0, 1.0, 0.5],
        &[0.0, 0.7, 0.8, 0.99, 0.99],
    );
    // u·M = 0 and 0.7 fall in token 1's mass, 0.8 in token 0's; T = 0 is the argmax; top_p 0.5
    // keeps token 1 alone whatever u.
    assert_eq!(got, [1, 1, 0, 1, 1]);
    // At T = 2 the logits halve: probabilities ∝ [1, √3] = [0.366, 0.634].
    assert_eq!(top_p(&row, 2, &[2.0], &[1.0], &[0.6]), [1]);
    assert_eq!(top_p(&row, 2, &[2.0], &[1.0], &[0.64]), [0]);
}

#[test]
fn top_p_rejects_a_uniform_outside_the_unit_interval() {
    let run = |u: f32| {
        run_op(
            Op::SampleTopP {},
            vec![
                (f(&["b", "2"]), f32t(&[1, 2], vec![0.0, 1.0])),
                (f(&["b"]), f32t(&[1], vec![1.0])),
                (f(&["b"]), f32t(&[1], vec![1.0])),
                (f(&["b"]), f32t(&[1], vec![u])),
            ],
        )
    };
    let e = run(1.0).unwrap_err().to_string();
    assert!(
        e.contains("sample.top_p of f32[1, 2], f32[1], f32[1], f32[1]"),
        "{e}"
    );
    assert!(e.contains("uniform of row 0 is 1, outside [0, 1)"), "{e}");
    assert!(run(f32::NAN).is_err());
    assert!(run(0.0).is_ok());
}

// ---------------------------------------------------------------------------------------------
// Statistics

const DRAWS: usize = 200_000;
const SEED: u64 = 2024;

/// Twelve distinct logits, descending, so the sorted order is the index order.
const LOGITS: [f32; 12] = [
    3.0, 2.6, 2.1, 1.9, 1.4, 1.0, 0.6, 0.1, -0.5, -1.1, -1.9, -3.0,
];

/// `DRAWS` draws of `sample.top_p` on `logits`, in one op call of `DRAWS` identical rows, the
/// uniform of row `r` being `uniform(SEED, 0, r)`: how a GPU harness would draw them.
fn draws(logits: &[f32], temperature: f32, top_p: f32) -> Vec<i64> {
    let v = logits.len();
    let out = run_op_ok(
        Op::SampleTopP {},
        vec![
            (
                f(&["b", &v.to_string()]),
                f32t(&[DRAWS, v], logits.repeat(DRAWS)),
            ),
            (f(&["b"]), f32t(&[DRAWS], vec![temperature; DRAWS])),
            (f(&["b"]), f32t(&[DRAWS], vec![top_p; DRAWS])),
            (
                f(&["b"]),
                Tensor::f32(
                    vec![DRAWS],
                    (0..DRAWS as u64).map(|r| uniform(SEED, 0, r)).collect(),
                )
                .unwrap(),
            ),
        ],
    );
    assert_eq!(out[0].dtype(), DType::I64);
    iv(&out[0]).to_vec()
}

/// softmax(logits / T), written out independently of the runtime.
fn softmax(logits: &[f32], t: f64) -> Vec<f64> {
    let e: Vec<f64> = logits.iter().map(|&x| (x as f64 / t).exp()).collect();
    let z: f64 = e.iter().sum();
    e.iter().map(|x| x / z).collect()
}

#[test]
fn draws_follow_the_renormalised_nucleus() {
    let p = softmax(&LOGITS, 2.0);
    // The nucleus of top_p 0.9 (LOGITS is sorted): the shortest prefix reaching 0.9, with the
    // boundary far enough from 0.9 that rounding cannot move it.
    let mut acc = 0.0;
    let k = p.iter().position(|&x| {
        acc += x;
        acc >= 0.9
    });
    let k = k.expect("the prefix reaches 0.9") + 1;
    let before: f64 = p[..k - 1].iter().sum();
    let mass: f64 = p[..k].iter().sum();
    assert!(before < 0.895 && mass > 0.905, "{before} {mass}");
    assert!(
        (2..12).contains(&k),
        "a nucleus of {k} tokens tests nothing"
    );
    let expected: Vec<f64> = (0..12)
        .map(|i| if i < k { p[i] / mass } else { 0.0 })
        .collect();
    let shared = nucleus_probabilities(&LOGITS, 2.0, 0.9);
    for (a, b) in expected.iter().zip(&shared) {
        assert!((a - b).abs() < 1e-12, "{expected:?} vs {shared:?}");
    }

    let got = draws(&LOGITS, 2.0, 0.9);
    let report = check_frequencies(&expected, &got).unwrap_or_else(|e| panic!("{e}"));
    println!(
        "T=2 top_p=0.9: nucleus of {k}, chi-square {:.2} with {} df over {} draws",
        report.chi_square, report.degrees_of_freedom, report.draws
    );
    // The same draws are not those of another temperature: the check has teeth.
    let colder = nucleus_probabilities(&LOGITS, 1.8, 0.9);
    assert!(check_frequencies(&colder, &got).is_err());
}

#[test]
fn full_distribution_at_top_p_one() {
    let expected = softmax(&LOGITS, 2.0);
    let got = draws(&LOGITS, 2.0, 1.0);
    let report = check_frequencies(&expected, &got).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.degrees_of_freedom, 11);
}

#[test]
fn temperature_zero_and_tiny_top_p_give_the_argmax() {
    for (t, p) in [(0.0, 0.9), (0.0, 1.0), (2.0, 1e-6)] {
        let got = draws(&LOGITS, t, p);
        assert!(got.iter().all(|&id| id == 0), "T={t} top_p={p}");
    }
    // Argmax not at index 0: the order is by value, not position.
    let mut shifted = LOGITS;
    shifted.rotate_right(5);
    assert!(draws(&shifted, 0.0, 0.9).iter().all(|&id| id == 5));
    assert!(draws(&shifted, 2.0, 1e-6).iter().all(|&id| id == 5));
}

#[test]
fn tied_tokens_share_the_mass_and_order_by_index() {
    let logits = [0.5f32, 2.0, 2.0, 0.0, -1.0];
    let p = softmax(&logits, 1.0);
    // Equal probabilities, so each tied token is drawn equally often.
    let got = draws(&logits, 1.0, 1.0);
    check_frequencies(&p, &got).unwrap_or_else(|e| panic!("{e}"));
    // A nucleus that ends inside the tie keeps the lower index only.
    let got = draws(&logits, 1.0, (p[1] * 0.99) as f32);
    assert!(got.iter().all(|&id| id == 1));
    // Greedy on a tie: the lower index.
    assert!(draws(&logits, 0.0, 1.0).iter().all(|&id| id == 1));
}

#[test]
fn nan_logits_are_never_drawn() {
    let mut logits = LOGITS;
    logits[1] = f32::NAN;
    let got = draws(&logits, 2.0, 1.0);
    match check_frequencies(&nucleus_probabilities(&logits, 2.0, 1.0), &got) {
        Ok(_) => {}
        Err(FrequencyError::Impossible { token, .. }) => panic!("drew token {token}"),
        Err(e) => panic!("{e}"),
    }
    assert!(got.iter().all(|&id| id != 1));
}
