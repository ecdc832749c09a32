//! Each op of the reference interpreter on tiny inputs whose results are computed by hand (or by
//! a naive loop written here).

#[path = "interp_util.rs"]
mod util;

use glmc_ir::{DType, Dim, Op};
use util::*;

#[test]
fn rope_interleaved_and_half_split_at_position_one() {
    // theta 10000, R = 4: inv_freq = [1, 10000^(-1/2) = 0.01]; at position 1 the angles are 1 and
    // 0.01. Row 0 is at position 0 and must come back unchanged.
    let x = vec![1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0];
    let (c1, s1) = (1f64.cos(), 1f64.sin());
    let (c2, s2) = (0.01f64.cos(), 0.01f64.sin());
    let run = |interleaved| {
        let out = run_op_ok(
            Op::Rope {
                interleaved,
                theta: 10000.0,
            },
            vec![
                (f(&["n", "4"]), f32t(&[2, 4], x.clone())),
                (i(&["n"]), i64t(&[2], vec![0, 1])),
            ],
        );
        fv(&out[0]).to_vec()
    };
    // Interleaved: pairs (0,1) at angle 1 and (2,3) at angle 0.01.
    let expected = [
        1.0,
        2.0,
        3.0,
        4.0,
        1.0 * c1 - 2.0 * s1,
        2.0 * c1 + 1.0 * s1,
        3.0 * c2 - 4.0 * s2,
        4.0 * c2 + 3.0 * s2,
    ];
    assert_close(&run(true), &expected, 1e-6);
    // Half-split: pairs (0,2) at angle 1 and (1,3) at angle 0.01.
    let expected = [
        1.0,
        2.0,
        3.0,
        4.0,
        1.0 * c1 - 3.0 * s1,
        2.0 * c2 - 4.0 * s2,
        3.0 * c1 + 1.0 * s1,
        4.0 * c2 + 2.0 * s2,
    ];
    assert_close(&run(false), &expected, 1e-6);
}

#[test]
fn rope_rotates_every_head_of_a_row_at_the_row_position() {
    // x [n=2, H=2, R=2]; theta irrelevant for R = 2 (inv_freq = [1]); rows at positions 3 and 0.
    let x = vec![1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0];
    let out = run_op_ok(
        Op::Rope {
            interleaved: true,
            theta: 1e6,
        },
        vec![
            (f(&["n", "2", "2"]), f32t(&[2, 2, 2], x)),
            (i(&["n"]), i64t(&[2], vec![3, 0])),
        ],
    );
    let (c, s) = (3f64.cos(), 3f64.sin());
    assert_close(fv(&out[0]), &[c, s, -s, c, 1.0, 0.0, 0.0, 1.0], 1e-6);
}

#[test]
fn rmsnorm_by_hand() {
    // Row 0: mean(x²) = (1+4+9+16)/4 = 7.5; row 1: mean = (4+0+0+0)/4 = 1.
    let eps = 1e-5;
    let out = run_op_ok(
        Op::RmsNorm { eps },
        vec![
            (
                f(&["2", "4"]),
                f32t(&[2, 4], vec![1.0, 2.0, 3.0, 4.0, -2.0, 0.0, 0.0, 0.0]),
            ),
            (f(&["4"]), f32t(&[4], vec![1.0, 1.0, 2.0, 0.5])),
        ],
    );
    let r0 = 1.0 / (7.5f64 + eps).sqrt();
    let r1 = 1.0 / (1.0f64 + eps).sqrt();
    assert_close(
        fv(&out[0]),
        &[r0, 2.0 * r0, 6.0 * r0, 2.0 * r0, -2.0 * r1, 0.0, 0.0, 0.0],
        1e-6,
    );
}

#[test]
fn layernorm_by_hand() {
    // mean 2.5, biased variance (2.25+0.25+0.25+2.25)/4 = 1.25.
    let eps = 1e-6;
    let out = run_op_ok(
        Op::LayerNorm { eps },
        vec![
            (f(&["1", "4"]), f32t(&[1, 4], vec![1.0, 2.0, 3.0, 4.0])),
            (f(&["4"]), f32t(&[4], vec![1.0, 2.0, 1.0, 1.0])),
            (f(&["4"]), f32t(&[4], vec![0.0, 0.0, 1.0, -1.0])),
        ],
    );
    let r = 1.0 / (1.25f64 + eps).sqrt();
    assert_close(
        fv(&out[0]),
        &[-1.5 * r, 2.0 * -0.5 * r, 0.5 * r + 1.0, 1.5 * r - 1.0],
        1e-6,
    );
}

#[test]
fn matmul_by_hand() {
    // x [1, 2, 3] · w [2, 3]ᵀ.
    let out = run_op_ok(
        Op::Matmul {},
        vec![
            (
                f(&["1", "s", "3"]),
                f32t(&[1, 2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            ),
            (
                f(&["2", "3"]),
                f32t(&[2, 3], vec![1.0, 0.0, -1.0, 2.0, 1.0, 0.0]),
            ),
        ],
    );
    assert_eq!(out[0].shape(), [1, 2, 2]);
    assert_close(fv(&out[0]), &[-2.0, 4.0, -2.0, 13.0], 0.0);
}

#[test]
fn matmul_matches_a_naive_loop_on_odd_sizes() {
    // Sizes that are not multiples of the 8×32 tiles or the 8-lane dot.
    let (rows, k, n) = (19, 37, 70);
    let mut rng = Rng(7);
    let x = rng.vec(rows * k, 1.0);
    let w = rng.vec(n * k, 1.0);
    let mut expected = vec![0f64; rows * n];
    for r in 0..rows {
        for c in 0..n {
            expected[r * n + c] = (0..k)
                .map(|j| x[r * k + j] as f64 * w[c * k + j] as f64)
                .sum();
        }
    }
    let out = run_op_ok(
        Op::Matmul {},
        vec![
            (f(&["s", "37"]), f32t(&[rows, k], x)),
            (f(&["70", "37"]), f32t(&[n, k], w)),
        ],
    );
    assert_close(fv(&out[0]), &expected, 1e-6);
}

#[test]
fn matmul_heads_by_hand() {
    // x [1, H=2, K=2]: head 0 = [1, 2], head 1 = [3, 4]; w [2, N=3, 2].
    let out = run_op_ok(
        Op::MatmulHeads {},
        vec![
            (
                f(&["s", "2", "2"]),
                f32t(&[1, 2, 2], vec![1.0, 2.0, 3.0, 4.0]),
            ),
            (
                f(&["2", "3", "2"]),
                f32t(
                    &[2, 3, 2],
                    vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 2.0, 0.0, 0.0, 2.0, 1.0, -1.0],
                ),
            ),
        ],
    );
    assert_eq!(out[0].shape(), [1, 2, 3]);
    assert_close(fv(&out[0]), &[1.0, 2.0, 3.0, 6.0, 8.0, -1.0], 0.0);
}

#[test]
fn elementwise_ops() {
    let x = || (f(&["2", "2"]), f32t(&[2, 2], vec![1.0, -2.0, 3.0, -4.0]));
    let row = (f(&["2"]), f32t(&[2], vec![10.0, 100.0]));
    let add = run_op_ok(Op::Add {}, vec![x(), row.clone()]);
    assert_close(fv(&add[0]), &[11.0, 98.0, 13.0, 96.0], 0.0);
    let mul = run_op_ok(Op::Mul {}, vec![x(), row]);
    assert_close(fv(&mul[0]), &[10.0, -200.0, 30.0, -400.0], 0.0);
    let same = run_op_ok(Op::Mul {}, vec![x(), x()]);
    assert_close(fv(&same[0]), &[1.0, 4.0, 9.0, 16.0], 0.0);
    let scale = run_op_ok(Op::Scale { factor: 0.5 }, vec![x()]);
    assert_close(fv(&scale[0]), &[0.5, -1.0, 1.5, -2.0], 0.0);
    let relu = run_op_ok(Op::Relu {}, vec![x()]);
    assert_close(fv(&relu[0]), &[1.0, 0.0, 3.0, 0.0], 0.0);
    let silu = run_op_ok(Op::Silu {}, vec![x()]);
    let s = |v: f64| v / (1.0 + (-v).exp());
    assert_close(fv(&silu[0]), &[s(1.0), s(-2.0), s(3.0), s(-4.0)], 1e-6);
}

#[test]
fn cast_rounds_to_integers_and_converts_back() {
    let out = run_op_ok(
        Op::Cast { dtype: DType::I64 },
        vec![(f(&["4"]), f32t(&[4], vec![1.4, 1.6, -2.5, 7.0]))],
    );
    assert_eq!(iv(&out[0]), [1, 2, -3, 7]);
    let out = run_op_ok(
        Op::Cast { dtype: DType::BF16 },
        vec![(i(&["2"]), i64t(&[2], vec![3, -5]))],
    );
    assert_eq!(fv(&out[0]), [3.0, -5.0]);
    // Between floats it is a no-op: the interpreter computes in f32.
    let out = run_op_ok(
        Op::Cast { dtype: DType::BF16 },
        vec![(f(&["1"]), f32t(&[1], vec![1.0 + 1e-6]))],
    );
    assert_eq!(fv(&out[0]), [1.0 + 1e-6]);
}

#[test]
fn embed_gathers_rows() {
    let table = f32t(&[3, 2], vec![0.0, 1.0, 10.0, 11.0, 20.0, 21.0]);
    let out = run_op_ok(
        Op::Embed {},
        vec![
            (f(&["3", "2"]), table),
            (i(&["s"]), i64t(&[3], vec![2, 0, 2])),
        ],
    );
    assert_eq!(out[0].shape(), [3, 2]);
    assert_close(fv(&out[0]), &[20.0, 21.0, 0.0, 1.0, 20.0, 21.0], 0.0);
}

#[test]
fn reshape_slice_concat() {
    let x = f32t(&[2, 6], (0..12).map(|v| v as f32).collect());
    let out = run_op_ok(
        Op::Reshape {
            shape: vec![Dim::sym("s"), Dim::Const(2), Dim::Const(3)],
        },
        vec![(f(&["s", "6"]), x.clone())],
    );
    assert_eq!(out[0].shape(), [2, 2, 3]);
    let out = run_op_ok(
        Op::Slice {
            axis: 1,
            start: 2,
            end: 5,
        },
        vec![(f(&["s", "6"]), x.clone())],
    );
    assert_eq!(out[0].shape(), [2, 3]);
    assert_close(fv(&out[0]), &[2.0, 3.0, 4.0, 8.0, 9.0, 10.0], 0.0);
    let y = f32t(&[2, 1], vec![-1.0, -2.0]);
    let out = run_op_ok(
        Op::Concat { axis: 1 },
        vec![
            (f(&["s", "1"]), y.clone()),
            (f(&["s", "6"]), x),
            (f(&["s", "1"]), y),
        ],
    );
    assert_eq!(out[0].shape(), [2, 8]);
    assert_close(
        fv(&out[0]),
        &[
            -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, -1.0, -2.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, -2.0,
        ],
        0.0,
    );
}

#[test]
fn dsa_score_by_hand() {
    // k0 = [1,0], k1 = [0,1], k2 = [1,1].
    // Row 0 (position 1): heads [1,2], [-1,1]; w = [0.5, 2].
    //   j0: 0.5·relu(1) + 2·relu(-1) = 0.5;  j1: 0.5·relu(2) + 2·relu(1) = 3;  j2: −inf.
    // Row 1 (position 2): heads [0,-1], [2,2]; w = [1, -1].
    //   j0: relu(0) − relu(2) = −2;  j1: relu(-1) − relu(2) = −2;  j2: relu(-1) − relu(4) = −4.
    let out = run_op_ok(
        Op::DsaScore { weight_scale: 1.0 },
        vec![
            (
                f(&["n", "2", "2"]),
                f32t(&[2, 2, 2], vec![1.0, 2.0, -1.0, 1.0, 0.0, -1.0, 2.0, 2.0]),
            ),
            (f(&["n", "2"]), f32t(&[2, 2], vec![0.5, 2.0, 1.0, -1.0])),
            (
                f(&["t", "2"]),
                f32t(&[3, 2], vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0]),
            ),
            (i(&["n"]), i64t(&[2], vec![1, 2])),
        ],
    );
    assert_eq!(fv(&out[0]), [0.5, 3.0, f32::NEG_INFINITY, -2.0, -2.0, -4.0]);
}

#[test]
fn dsa_topk_pads_limits_causally_and_breaks_ties_low() {
    let scores = vec![
        9.0, 9.0, 9.0, 9.0, 9.0, // row 0 at position 1: two keys ≤ k = 3 → [0, 1, -1]
        2.0, 0.5, 2.0, 2.0, 3.0, // row 1 at position 4: 4, then 0 and 2 of the tied 0, 2, 3
        1.0, 1.0, 1.0, 0.0, 100.0, // row 2 at position 3: 100 at j = 4 is in the future
        -5.0, 0.0, 0.0, 0.0, 0.0, // row 3 at position 2: exactly k keys → ascending
    ];
    let out = run_op_ok(
        Op::DsaTopk { k: 3 },
        vec![
            (f(&["n", "t"]), f32t(&[4, 5], scores)),
            (i(&["n"]), i64t(&[4], vec![1, 4, 3, 2])),
        ],
    );
    assert_eq!(out[0].shape(), [4, 3]);
    assert_eq!(iv(&out[0]), [0, 1, -1, 0, 2, 4, 0, 1, 2, 0, 1, 2]);
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

#[test]
fn router_never_picks_an_expert_of_a_dropped_group() {
    // 4 experts in 2 groups of 2, keep 1 group, pick 2 experts. Bias chosen so that
    // choice = s + bias = [0.95, −0.3, 0.3, 0.2]: group 0 scores 0.65, group 1 scores 0.5, so
    // group 1 is dropped. Transformers 5.17 fills dropped groups with −inf (the op table and the
    // `group-routing` oracle fixture), so the top-2 is experts 0 and 1 even though expert 1's
    // choice is negative; a 0.0 fill would have picked experts 0 and 2.
    let logits = [1.0f32, 0.0, -1.0, 2.0];
    let target = [0.95, -0.3, 0.3, 0.2];
    let s: Vec<f64> = logits.iter().map(|&l| sigmoid(l as f64)).collect();
    let bias: Vec<f32> = (0..4).map(|e| (target[e] - s[e]) as f32).collect();
    let route = |norm_topk_prob| {
        run_op_ok(
            Op::MoeRoute {
                n_group: 2,
                norm_topk_prob,
                routed_scaling_factor: 2.5,
                top_k: 2,
                topk_group: 1,
            },
            vec![
                (f(&["n", "4"]), f32t(&[1, 4], logits.to_vec())),
                (f(&["4"]), f32t(&[4], bias.clone())),
            ],
        )
    };
    let out = route(true);
    assert_eq!(iv(&out[1]), [0, 1]);
    let sum = s[0] + s[1];
    assert_close(fv(&out[0]), &[s[0] / sum * 2.5, s[1] / sum * 2.5], 1e-6);
    let out = route(false);
    assert_eq!(iv(&out[1]), [0, 1]);
    assert_close(fv(&out[0]), &[s[0] * 2.5, s[1] * 2.5], 1e-6);
}

#[test]
fn router_group_scores_sum_the_two_best_of_each_group() {
    // 6 experts in 3 groups of 2, keep 2 groups, pick 3. choice (bias 0, so choice = s):
    // group 0 = {0.9, 0.05} → 0.95; group 1 = {0.6, 0.55} → 1.15; group 2 = {0.5, 0.48} → 0.98.
    // Keep groups 1 and 2 (group 0 holds the single best expert but loses on its sum), so the
    // top-3 is experts 2 (0.6), 3 (0.55), 4 (0.5).
    let target = [0.9f64, 0.05, 0.6, 0.55, 0.5, 0.48];
    let logits: Vec<f32> = target
        .iter()
        .map(|&p| (p / (1.0 - p)).ln() as f32)
        .collect();
    let out = run_op_ok(
        Op::MoeRoute {
            n_group: 3,
            norm_topk_prob: false,
            routed_scaling_factor: 1.0,
            top_k: 3,
            topk_group: 2,
        },
        vec![
            (f(&["n", "6"]), f32t(&[1, 6], logits)),
            (f(&["6"]), f32t(&[6], vec![0.0; 6])),
        ],
    );
    assert_eq!(iv(&out[1]), [2, 3, 4]);
    assert_close(fv(&out[0]), &[0.6, 0.55, 0.5], 1e-6);
}

#[test]
fn router_single_group_is_plain_top_k_of_biased_scores() {
    // n_group = 1 (GLM-5): the bias changes the selection but not the weights.
    let logits = vec![0.0f32, 3.0, 1.0, -2.0, 2.0, 0.5];
    let bias = vec![0.0f32, -1.0, 0.0, 0.0, 0.0, 0.9];
    let out = run_op_ok(
        Op::MoeRoute {
            n_group: 1,
            norm_topk_prob: true,
            routed_scaling_factor: 1.0,
            top_k: 3,
            topk_group: 1,
        },
        vec![
            (
                f(&["n", "6"]),
                f32t(&[2, 6], [logits.clone(), logits.clone()].concat()),
            ),
            (f(&["6"]), f32t(&[6], bias.clone())),
        ],
    );
    // choices: [0.5, 0.953-1, 0.731, 0.119, 0.881, 0.622+0.9] → 5 (1.522), 4 (0.881), 2 (0.731).
    assert_eq!(iv(&out[1]), [5, 4, 2, 5, 4, 2]);
    let s: Vec<f64> = [5, 4, 2]
        .iter()
        .map(|&e| sigmoid(logits[e] as f64))
        .collect();
    let sum: f64 = s.iter().sum();
    let w: Vec<f64> = s.iter().map(|x| x / sum).collect();
    assert_close(fv(&out[0]), &[w.clone(), w].concat(), 1e-6);
}

#[test]
fn experts_match_a_naive_swiglu_sum() {
    let (n, k, e, d, inter) = (5, 2, 4, 6, 3);
    let mut rng = Rng(11);
    let x = rng.vec(n * d, 1.0);
    let w = rng.vec(n * k, 1.0);
    let idx: Vec<i64> = vec![0, 3, 3, 0, 1, 1, 2, 0, 3, 2];
    let gate = rng.vec(e * inter * d, 1.0);
    let up = rng.vec(e * inter * d, 1.0);
    let down = rng.vec(e * d * inter, 1.0);
    let mut expected = vec![0f64; n * d];
    for t in 0..n {
        for j in 0..k {
            let ex = idx[t * k + j] as usize;
            let mut h = vec![0f64; inter];
            for (r, hv) in h.iter_mut().enumerate() {
                let (mut g, mut u) = (0f64, 0f64);
                for c in 0..d {
                    g += gate[(ex * inter + r) * d + c] as f64 * x[t * d + c] as f64;
                    u += up[(ex * inter + r) * d + c] as f64 * x[t * d + c] as f64;
                }
                *hv = g / (1.0 + (-g).exp()) * u;
            }
            for c in 0..d {
                let y: f64 = (0..inter)
                    .map(|r| down[(ex * d + c) * inter + r] as f64 * h[r])
                    .sum();
                expected[t * d + c] += w[t * k + j] as f64 * y;
            }
        }
    }
    let out = run_op_ok(
        Op::MoeExperts {},
        vec![
            (f(&["n", "6"]), f32t(&[n, d], x)),
            (f(&["n", "2"]), f32t(&[n, k], w)),
            (i(&["n", "2"]), i64t(&[n, k], idx)),
            (f(&["4", "3", "6"]), f32t(&[e, inter, d], gate)),
            (f(&["4", "3", "6"]), f32t(&[e, inter, d], up)),
            (f(&["4", "6", "3"]), f32t(&[e, d, inter], down)),
        ],
    );
    assert_close(fv(&out[0]), &expected, 1e-5);
}

#[test]
fn moe_sort_groups_pairs_by_expert_stably() {
    // Pairs (t, j) → index 2t + j: experts 2,0 | 0,2 | 1,2.
    let out = run_op_ok(
        Op::MoeSort { experts: 4 },
        vec![(i(&["n", "2"]), i64t(&[3, 2], vec![2, 0, 0, 2, 1, 2]))],
    );
    let iv = |t: &glmc_runtime::Tensor| t.as_i64().unwrap().to_vec();
    assert_eq!(iv(&out[0]), [0, 2, 3, 6, 6]);
    // Expert 0: pairs 1, 2; expert 1: pair 4; expert 2: pairs 0, 3, 5 (lowest pair first).
    assert_eq!(iv(&out[1]), [1, 2, 4, 0, 3, 5]);
    assert_eq!(iv(&out[2]), [3, 0, 1, 4, 2, 5]);
}

#[test]
fn moe_sort_rejects_an_id_outside_the_experts() {
    let err = run_op(
        Op::MoeSort { experts: 4 },
        vec![(i(&["n", "2"]), i64t(&[1, 2], vec![1, 4]))],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("expert 4 (row 0, slot 1)"), "{err}");
}

#[test]
fn sort_gate_up_down_combine_equal_moe_experts() {
    let (n, k, e, d, inter) = (5, 2, 4, 6, 3);
    let mut rng = Rng(12);
    let x = rng.vec(n * d, 1.0);
    let w = rng.vec(n * k, 1.0);
    let idx: Vec<i64> = vec![0, 3, 3, 0, 1, 3, 2, 0, 3, 2];
    let gate = rng.vec(e * inter * d, 1.0);
    let up = rng.vec(e * inter * d, 1.0);
    let down = rng.vec(e * d * inter, 1.0);
    let experts = run_op_ok(
        Op::MoeExperts {},
        vec![
            (f(&["n", "6"]), f32t(&[n, d], x.clone())),
            (f(&["n", "2"]), f32t(&[n, k], w.clone())),
            (i(&["n", "2"]), i64t(&[n, k], idx.clone())),
            (f(&["4", "3", "6"]), f32t(&[e, inter, d], gate.clone())),
            (f(&["4", "3", "6"]), f32t(&[e, inter, d], up.clone())),
            (f(&["4", "6", "3"]), f32t(&[e, d, inter], down.clone())),
        ],
    );
    let sorted = run_op_ok(
        Op::MoeSort { experts: 4 },
        vec![(i(&["n", "2"]), i64t(&[n, k], idx))],
    );
    let h = run_op_ok(
        Op::MoeGateUp {},
        vec![
            (f(&["n", "6"]), f32t(&[n, d], x)),
            (i(&["n", "2"]), sorted[1].clone()),
            (i(&["5"]), sorted[0].clone()),
            (f(&["4", "3", "6"]), f32t(&[e, inter, d], gate)),
            (f(&["4", "3", "6"]), f32t(&[e, inter, d], up)),
        ],
    );
    let rows = run_op_ok(
        Op::MoeDown {},
        vec![
            (f(&["n", "2", "3"]), h[0].clone()),
            (i(&["5"]), sorted[0].clone()),
            (f(&["4", "6", "3"]), f32t(&[e, d, inter], down)),
        ],
    );
    let y = run_op_ok(
        Op::MoeCombine { shared: false },
        vec![
            (f(&["n", "2", "6"]), rows[0].clone()),
            (i(&["n", "2"]), sorted[2].clone()),
            (f(&["n", "2"]), f32t(&[n, k], w)),
        ],
    );
    let want: Vec<f64> = fv(&experts[0]).iter().map(|v| *v as f64).collect();
    assert_close(fv(&y[0]), &want, 1e-6);
}
