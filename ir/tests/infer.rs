//! Type inference per op family, with expected types worked out by hand. Symbolic dims (`s`,
//! `t`, `b`) stay symbolic.

use glmc_ir::verify::infer;
use glmc_ir::{DType, Dim, Op, TensorType};

/// `"bf16[s,16]"` → the tensor type.
fn ty(text: &str) -> TensorType {
    let (dt, rest) = text.split_once('[').unwrap();
    let dims = rest.strip_suffix(']').unwrap();
    let shape = dims
        .split(',')
        .filter(|d| !d.is_empty())
        .map(|d| match d.parse::<u64>() {
            Ok(n) => Dim::Const(n),
            Err(_) => Dim::sym(d),
        })
        .collect();
    TensorType::new(DType::from_name(dt).unwrap(), shape)
}

fn run(op: &Op, operands: &[&str]) -> Result<Vec<TensorType>, String> {
    let types: Vec<TensorType> = operands.iter().map(|t| ty(t)).collect();
    let refs: Vec<&TensorType> = types.iter().collect();
    infer(op, &refs)
}

/// The inferred output types, `", "`-joined.
#[track_caller]
fn ok(op: Op, operands: &[&str]) -> String {
    match run(&op, operands) {
        Ok(out) => out
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        Err(e) => panic!("{} of {operands:?}: {e}", op.name()),
    }
}

/// The inference error, which must contain every one of `what`.
#[track_caller]
fn err(op: Op, operands: &[&str], what: &[&str]) {
    match run(&op, operands) {
        Ok(out) => panic!("{} of {operands:?} should fail, gave {out:?}", op.name()),
        Err(e) => {
            for w in what {
                assert!(e.contains(w), "{e:?} should contain {w:?}");
            }
        }
    }
}

#[test]
fn type_helper_reads_what_display_writes() {
    for t in ["bf16[s,16]", "i64[b]", "f32[]", "f8e4m3[4,b,t,2]"] {
        assert_eq!(ty(t).to_string(), t);
    }
}

#[test]
fn wrong_operand_count() {
    err(Op::Matmul {}, &["f32[4,4]"], &["takes 2 operands, has 1"]);
    err(
        Op::Concat { axis: 0 },
        &[],
        &["takes at least 1 operands, has 0"],
    );
    err(
        Op::MlaAttendAbsorbed {
            dense_until: 0,
            scale: 1.0,
            sparse: true,
        },
        &["f32[s,2,8]"; 5],
        &["takes 6 operands, has 5"],
    );
    err(
        Op::Input { index: 0 },
        &[],
        &["inputs and weights declare their type"],
    );
}

#[test]
fn embed() {
    assert_eq!(ok(Op::Embed {}, &["bf16[32,16]", "i64[s]"]), "bf16[s,16]");
    assert_eq!(
        ok(Op::Embed {}, &["bf16[32,16]", "i32[b,3]"]),
        "bf16[b,3,16]"
    );
    err(
        Op::Embed {},
        &["bf16[32,16]", "f32[s]"],
        &["ids must be an integer"],
    );
    err(
        Op::Embed {},
        &["bf16[512]", "i64[s]"],
        &["table must have rank 2"],
    );
    err(
        Op::Embed {},
        &["i32[32,16]", "i64[s]"],
        &["table must be a float"],
    );
}

#[test]
fn matmul() {
    assert_eq!(
        ok(Op::Matmul {}, &["bf16[s,16]", "bf16[32,16]"]),
        "bf16[s,32]"
    );
    assert_eq!(
        ok(Op::Matmul {}, &["bf16[b,t,8]", "bf16[16,8]"]),
        "bf16[b,t,16]"
    );
    assert_eq!(ok(Op::Matmul {}, &["f32[8]", "f32[3,8]"]), "f32[3]");
    err(
        Op::Matmul {},
        &["bf16[s,16]", "bf16[32,15]"],
        &["inner dims of x and w differ: 16 vs 15"],
    );
    // Symbolic inner dims must be the same symbol.
    err(
        Op::Matmul {},
        &["bf16[s,t]", "bf16[4,s]"],
        &["inner dims", "t vs s"],
    );
    // A narrow x against f32 weights (a folded widening cast) gives w's dtype; nothing else
    // mixes.
    assert_eq!(
        ok(Op::Matmul {}, &["bf16[s,16]", "f32[32,16]"]),
        "f32[s,32]"
    );
    assert_eq!(ok(Op::Matmul {}, &["f16[s,16]", "f32[32,16]"]), "f32[s,32]");
    for (x, w) in [
        ("f32[s,16]", "bf16[32,16]"),
        ("bf16[s,16]", "f16[32,16]"),
        ("f8e4m3[s,16]", "f32[32,16]"),
    ] {
        err(Op::Matmul {}, &[x, w], &["dtypes differ"]);
    }
    // The fused GEMMs take one dtype.
    err(
        Op::MatmulArgmax {},
        &["bf16[s,16]", "f32[32,16]"],
        &["dtypes differ: bf16 vs f32"],
    );
    err(
        Op::MatmulRope {
            interleaved: true,
            theta: 10000.0,
            period: 32,
            start: 0,
            end: 8,
        },
        &["bf16[s,16]", "f32[32,16]", "i64[s]"],
        &["dtypes differ: bf16 vs f32"],
    );
    err(
        Op::Matmul {},
        &["i32[s,16]", "i32[32,16]"],
        &["x must be a float tensor"],
    );
    err(
        Op::Matmul {},
        &["bf16[s,16]", "bf16[2,32,16]"],
        &["w must have rank 2"],
    );
    err(
        Op::Matmul {},
        &["bf16[1,2,3,4,16]", "bf16[32,16]"],
        &["x must have rank 1 to 4"],
    );
}

#[test]
fn matmul_heads() {
    assert_eq!(
        ok(Op::MatmulHeads {}, &["bf16[s,2,4]", "bf16[2,8,4]"]),
        "bf16[s,2,8]"
    );
    err(
        Op::MatmulHeads {},
        &["bf16[s,3,4]", "bf16[2,8,4]"],
        &["heads of x and w differ: 3 vs 2"],
    );
    err(
        Op::MatmulHeads {},
        &["bf16[s,2,5]", "bf16[2,8,4]"],
        &["inner dims of x and w differ: 5 vs 4"],
    );
}

#[test]
fn elementwise() {
    assert_eq!(ok(Op::Add {}, &["bf16[s,16]", "bf16[s,16]"]), "bf16[s,16]");
    // Broadcast of a trailing suffix.
    assert_eq!(ok(Op::Mul {}, &["f32[s,2,4]", "f32[2,4]"]), "f32[s,2,4]");
    assert_eq!(ok(Op::Mul {}, &["f32[s,2,4]", "f32[]"]), "f32[s,2,4]");
    err(
        Op::Add {},
        &["bf16[s,16]", "bf16[16,1]"],
        &["rhs shape bf16[16,1] is not a trailing part of lhs shape bf16[s,16]"],
    );
    // Broadcast is one-way: the lhs must be the larger.
    err(
        Op::Add {},
        &["bf16[16]", "bf16[s,16]"],
        &["not a trailing part"],
    );
    err(Op::Add {}, &["bf16[s,16]", "f32[s,16]"], &["dtypes differ"]);
    err(Op::Mul {}, &["i64[s]", "i64[s]"], &["lhs must be a float"]);
    assert_eq!(ok(Op::Scale { factor: 0.5 }, &["bf16[s,2]"]), "bf16[s,2]");
    assert_eq!(ok(Op::Silu {}, &["bf16[b,8]"]), "bf16[b,8]");
    assert_eq!(ok(Op::Relu {}, &["f16[t]"]), "f16[t]");
    err(Op::Silu {}, &["i32[s]"], &["x must be a float"]);
    assert_eq!(
        ok(Op::Cast { dtype: DType::F32 }, &["bf16[s,16]"]),
        "f32[s,16]"
    );
    assert_eq!(ok(Op::Cast { dtype: DType::I32 }, &["i64[s]"]), "i32[s]");
}

#[test]
fn norms() {
    assert_eq!(
        ok(Op::RmsNorm { eps: 1e-6 }, &["bf16[s,16]", "bf16[16]"]),
        "bf16[s,16]"
    );
    assert_eq!(
        ok(
            Op::LayerNorm { eps: 1e-6 },
            &["bf16[b,4]", "bf16[4]", "bf16[4]"]
        ),
        "bf16[b,4]"
    );
    err(
        Op::RmsNorm { eps: 1e-6 },
        &["bf16[s,16]", "bf16[8]"],
        &["normalised dim and weight differ: 16 vs 8"],
    );
    err(
        Op::LayerNorm { eps: 1e-6 },
        &["bf16[b,4]", "bf16[4]", "bf16[5]"],
        &["differ: 4 vs 5"],
    );
    err(
        Op::RmsNorm { eps: 1e-6 },
        &["bf16[s,16]", "bf16[1,16]"],
        &["weight must have rank 1"],
    );
    err(
        Op::RmsNorm { eps: 1e-6 },
        &["bf16[s,16]", "f32[16]"],
        &["dtypes differ"],
    );
}

#[test]
fn rope() {
    let rope = || Op::Rope {
        interleaved: true,
        theta: 10000.0,
    };
    assert_eq!(ok(rope(), &["bf16[s,2,4]", "i64[s]"]), "bf16[s,2,4]");
    assert_eq!(ok(rope(), &["bf16[b,64]", "i64[b]"]), "bf16[b,64]");
    err(
        rope(),
        &["bf16[s,2,5]", "i64[s]"],
        &["rotary dim 5 must be an even constant"],
    );
    err(
        rope(),
        &["bf16[s,2,t]", "i64[s]"],
        &["rotary dim t must be an even constant"],
    );
    err(
        rope(),
        &["bf16[s,4]", "i64[b]"],
        &["positions and query rows differ: b vs s"],
    );
    err(
        rope(),
        &["bf16[s,4]", "f32[s]"],
        &["positions must be an integer"],
    );
    err(rope(), &["bf16[4]", "i64[4]"], &["x must have rank 2 to 4"]);
}

fn reshape(shape: &[&str]) -> Op {
    Op::Reshape {
        shape: shape
            .iter()
            .map(|d| match d.parse::<u64>() {
                Ok(n) => Dim::Const(n),
                Err(_) => Dim::sym(d),
            })
            .collect(),
    }
}

#[test]
fn reshape_checks_element_counts_with_symbols() {
    assert_eq!(
        ok(reshape(&["s", "2", "8"]), &["bf16[s,16]"]),
        "bf16[s,2,8]"
    );
    assert_eq!(
        ok(reshape(&["b", "t", "2", "8"]), &["bf16[b,t,16]"]),
        "bf16[b,t,2,8]"
    );
    assert_eq!(ok(reshape(&["t", "b", "4"]), &["f32[b,t,4]"]), "f32[t,b,4]");
    assert_eq!(ok(reshape(&["16"]), &["f32[2,8]"]), "f32[16]");
    err(
        reshape(&["s", "2", "9"]),
        &["bf16[s,16]"],
        &["cannot reshape bf16[s,16] to bf16[s,2,9]: element counts differ"],
    );
    // Same constant count, different symbols.
    err(
        reshape(&["t", "16"]),
        &["bf16[s,16]"],
        &["element counts differ"],
    );
    // A symbol cannot be dropped or doubled.
    err(
        reshape(&["16"]),
        &["bf16[s,16]"],
        &["element counts differ"],
    );
    err(
        reshape(&["s", "s", "16"]),
        &["bf16[s,16]"],
        &["element counts differ"],
    );
}

#[test]
fn reshape_with_huge_dims_is_an_error_not_an_overflow() {
    // 2^32 · 2^32 does not fit in u64: the element count must not wrap or panic.
    let big = "4294967296";
    err(
        reshape(&["1"]),
        &[&format!("f32[{big},{big}]")],
        &[
            "cannot reshape f32[4294967296,4294967296] to f32[1]",
            "overflows 64 bits",
        ],
    );
    err(
        reshape(&[big, big]),
        &["f32[4294967296,4294967295,2]"],
        &["overflows 64 bits"],
    );
    let max = u64::MAX.to_string();
    err(
        Op::Concat { axis: 0 },
        &[&format!("f32[{max}]"), "f32[1]"],
        &["overflows 64 bits"],
    );
}

#[test]
fn slice() {
    let slice = |axis, start, end| Op::Slice { axis, start, end };
    assert_eq!(ok(slice(2, 4, 8), &["bf16[s,2,8]"]), "bf16[s,2,4]");
    assert_eq!(ok(slice(3, 0, 4), &["bf16[b,t,2,8]"]), "bf16[b,t,2,4]");
    err(
        slice(0, 0, 1),
        &["bf16[s,16]"],
        &["cannot slice symbolic dim s of bf16[s,16]"],
    );
    err(
        slice(1, 8, 17),
        &["bf16[s,16]"],
        &["slice 8..17 of axis 1 is outside bf16[s,16]"],
    );
    err(slice(1, 4, 4), &["bf16[s,16]"], &["slice 4..4"]);
    err(slice(1, 5, 4), &["bf16[s,16]"], &["slice 5..4"]);
    err(slice(2, 0, 1), &["bf16[s,16]"], &["axis 2 out of range"]);
}

#[test]
fn concat() {
    let concat = |axis| Op::Concat { axis };
    assert_eq!(
        ok(concat(2), &["bf16[s,2,2]", "bf16[s,2,2]"]),
        "bf16[s,2,4]"
    );
    assert_eq!(
        ok(concat(1), &["f32[t,4]", "f32[t,8]", "f32[t,1]"]),
        "f32[t,13]"
    );
    assert_eq!(ok(concat(0), &["f32[3]"]), "f32[3]");
    err(
        concat(1),
        &["f32[s,4]", "f32[t,4]"],
        &["f32[t,4] and f32[s,4] differ off axis 1"],
    );
    err(
        concat(0),
        &["f32[s,4]", "f32[s,4]"],
        &["cannot concat symbolic dim"],
    );
    err(concat(1), &["f32[s,4]", "bf16[s,4]"], &["dtypes differ"]);
    err(
        concat(2),
        &["f32[s,4]", "f32[s,4]"],
        &["axis 2 out of range"],
    );
    err(
        concat(1),
        &["f32[s,4]", "f32[s,4,1]"],
        &["differ off axis 1"],
    );
}

#[test]
fn cache_update() {
    let cache = |batched| Op::CacheUpdate {
        batched,
        state: "c".into(),
    };
    // Prefill: s new rows, the cache up to the furthest position.
    assert_eq!(ok(cache(false), &["bf16[s,8]", "i64[s]"]), "bf16[t,8]");
    assert_eq!(ok(cache(false), &["bf16[s,2,4]", "i64[s]"]), "bf16[t,2,4]");
    // A prefill's cache slot: one integer.
    assert_eq!(
        ok(cache(false), &["bf16[s,8]", "i64[s]", "i64[1]"]),
        "bf16[t,8]"
    );
    err(
        cache(false),
        &["bf16[s,8]", "i64[s]", "i64[2]"],
        &["slot rows differ: 2 vs 1"],
    );
    err(
        cache(false),
        &["bf16[s,8]", "i64[s]", "f32[1]"],
        &["slot must be an integer"],
    );
    // Decode rows are their slots: no slot operand.
    err(
        cache(true),
        &["bf16[b,8]", "i64[b]", "i64[1]"],
        &["takes 2 operands, has 3"],
    );
    // Decode: one row per sequence, caches with a leading batch dim.
    assert_eq!(ok(cache(true), &["bf16[b,8]", "i64[b]"]), "bf16[b,t,8]");
    assert_eq!(ok(cache(true), &["bf16[b,2,4]", "i64[b]"]), "bf16[b,t,2,4]");
    err(
        cache(true),
        &["bf16[b,8]", "i64[s]"],
        &["positions and query rows differ: s vs b"],
    );
    err(
        cache(false),
        &["bf16[s,8]", "bf16[s]"],
        &["positions must be an integer"],
    );
    err(
        cache(false),
        &["bf16[s,1,2,3]", "i64[s]"],
        &["new rows must have rank 1 to 3"],
    );
}

fn attend(sparse: bool) -> Op {
    Op::MlaAttend {
        dense_until: 0,
        scale: 0.125,
        sparse,
    }
}

#[test]
fn mla_attend() {
    let (q_nope, q_pe) = ("bf16[s,2,4]", "bf16[s,2,6]");
    let (k_nope, k_pe, v) = ("bf16[t,2,4]", "bf16[t,6]", "bf16[t,2,3]");
    assert_eq!(
        ok(attend(false), &[q_nope, q_pe, k_nope, k_pe, v, "i64[s]"]),
        "bf16[s,2,3]"
    );
    assert_eq!(
        ok(
            attend(true),
            &[q_nope, q_pe, k_nope, k_pe, v, "i64[s]", "i64[s,2]"]
        ),
        "bf16[s,2,3]"
    );
    // Decode: batched caches whose batch dim is the query rows.
    assert_eq!(
        ok(
            attend(true),
            &[
                "bf16[b,2,4]",
                "bf16[b,2,6]",
                "bf16[b,t,2,4]",
                "bf16[b,t,6]",
                "bf16[b,t,2,3]",
                "i64[b]",
                "i64[b,2]",
            ]
        ),
        "bf16[b,2,3]"
    );
    err(
        attend(false),
        &[
            "bf16[b,2,4]",
            "bf16[b,2,6]",
            "bf16[s,t,2,4]",
            "bf16[s,t,6]",
            "bf16[s,t,2,3]",
            "i64[b]",
        ],
        &["k_nope batch and query rows differ: s vs b"],
    );
    err(
        attend(false),
        &[q_nope, q_pe, k_nope, "bf16[t,4]", v, "i64[s]"],
        &["rope dims of q and k differ: 4 vs 6"],
    );
    err(
        attend(false),
        &[q_nope, q_pe, "bf16[t,3,4]", k_pe, v, "i64[s]"],
        &["heads of q and k differ: 3 vs 2"],
    );
    err(
        attend(false),
        &[q_nope, q_pe, k_nope, "bf16[s,6]", v, "i64[s]"],
        &["k_pe and k_nope context differ: s vs t"],
    );
    err(
        attend(true),
        &[q_nope, q_pe, k_nope, k_pe, v, "i64[s]", "i64[b,2]"],
        &["topk rows and query rows differ: b vs s"],
    );
    err(
        attend(true),
        &[q_nope, q_pe, k_nope, k_pe, v, "i64[s]", "f32[s,2]"],
        &["topk must be an integer"],
    );
    err(
        attend(false),
        &[q_nope, q_pe, k_nope, k_pe, "f16[t,2,3]", "i64[s]"],
        &["dtypes differ: bf16 vs f16"],
    );
}

#[test]
fn mla_attend_absorbed() {
    let op = |sparse| Op::MlaAttendAbsorbed {
        dense_until: 0,
        scale: 0.1,
        sparse,
    };
    assert_eq!(
        ok(
            op(false),
            &[
                "bf16[s,2,8]",
                "bf16[s,2,4]",
                "bf16[t,8]",
                "bf16[t,4]",
                "i64[s]"
            ]
        ),
        "bf16[s,2,8]"
    );
    assert_eq!(
        ok(
            op(true),
            &[
                "bf16[b,2,8]",
                "bf16[b,2,4]",
                "bf16[b,t,8]",
                "bf16[b,t,4]",
                "i64[b]",
                "i64[b,16]"
            ]
        ),
        "bf16[b,2,8]"
    );
    err(
        op(false),
        &[
            "bf16[s,2,8]",
            "bf16[s,2,4]",
            "bf16[t,7]",
            "bf16[t,4]",
            "i64[s]",
        ],
        &["latent dims of q_abs and c_kv differ: 7 vs 8"],
    );
}

#[test]
fn dsa_score_and_topk() {
    assert_eq!(
        ok(
            Op::DsaScore { weight_scale: 1.0 },
            &["bf16[s,2,4]", "bf16[s,2]", "bf16[t,4]", "i64[s]"]
        ),
        "f32[s,t]"
    );
    assert_eq!(
        ok(
            Op::DsaScore { weight_scale: 1.0 },
            &["bf16[b,2,4]", "bf16[b,2]", "bf16[b,t,4]", "i64[b]"]
        ),
        "f32[b,t]"
    );
    err(
        Op::DsaScore { weight_scale: 1.0 },
        &["bf16[s,2,4]", "bf16[s,3]", "bf16[t,4]", "i64[s]"],
        &["heads of q and w differ: 3 vs 2"],
    );
    err(
        Op::DsaScore { weight_scale: 1.0 },
        &["bf16[s,2,4]", "bf16[s,2]", "bf16[t,5]", "i64[s]"],
        &["dims of q and k differ: 5 vs 4"],
    );
    let topk = |k| Op::DsaTopk { k };
    assert_eq!(ok(topk(2048), &["f32[s,t]", "i64[s]"]), "i64[s,2048]");
    assert_eq!(ok(topk(2), &["f32[b,t]", "i64[b]"]), "i64[b,2]");
    err(topk(0), &["f32[s,t]", "i64[s]"], &["k must be positive"]);
    err(topk(2), &["f32[s]", "i64[s]"], &["scores must have rank 2"]);
    err(
        topk(2),
        &["f32[s,t]", "i64[b]"],
        &["positions and query rows differ"],
    );
}

fn route(n_group: u64, topk_group: u64, top_k: u64) -> Op {
    Op::MoeRoute {
        n_group,
        norm_topk_prob: true,
        routed_scaling_factor: 2.5,
        top_k,
        topk_group,
    }
}

#[test]
fn moe_route() {
    assert_eq!(
        ok(route(8, 4, 8), &["f32[s,256]", "f32[256]"]),
        "f32[s,8], i64[s,8]"
    );
    assert_eq!(
        ok(route(1, 1, 2), &["f32[b,4]", "f32[4]"]),
        "f32[b,2], i64[b,2]"
    );
    err(
        route(8, 4, 8),
        &["bf16[s,256]", "f32[256]"],
        &["router logits and bias must be f32"],
    );
    err(
        route(3, 1, 2),
        &["f32[s,256]", "f32[256]"],
        &["256 experts cannot form 3 groups keeping 1"],
    );
    err(
        route(0, 0, 2),
        &["f32[s,256]", "f32[256]"],
        &["cannot form 0 groups"],
    );
    err(route(8, 9, 2), &["f32[s,256]", "f32[256]"], &["keeping 9"]);
    err(
        route(8, 1, 33),
        &["f32[s,256]", "f32[256]"],
        &["top_k 33 exceeds the 32 experts of the kept groups"],
    );
    err(route(8, 1, 0), &["f32[s,256]", "f32[256]"], &["top_k 0"]);
    err(
        route(1, 1, 1),
        &["f32[s,e]", "f32[e]"],
        &["the expert count must be constant"],
    );
    err(
        route(1, 1, 1),
        &["f32[s,4]", "f32[8]"],
        &["experts of logits and bias differ: 8 vs 4"],
    );
}

#[test]
fn moe_experts() {
    let good = [
        "bf16[s,16]",
        "f32[s,2]",
        "i64[s,2]",
        "bf16[4,8,16]",
        "bf16[4,8,16]",
        "bf16[4,16,8]",
    ];
    assert_eq!(ok(Op::MoeExperts {}, &good), "bf16[s,16]");
    let with = |i: usize, t: &'static str| {
        let mut v = good;
        v[i] = t;
        v
    };
    err(
        Op::MoeExperts {},
        &with(2, "i64[s,3]"),
        &["weights f32[s,2] and experts i64[s,3] differ in shape"],
    );
    err(
        Op::MoeExperts {},
        &with(2, "f32[s,2]"),
        &["experts must be an integer"],
    );
    err(
        Op::MoeExperts {},
        &with(4, "bf16[4,9,16]"),
        &["gate bf16[4,8,16] and up bf16[4,9,16] differ"],
    );
    err(
        Op::MoeExperts {},
        &with(5, "bf16[4,16,9]"),
        &["intermediate dims of gate and down differ: 9 vs 8"],
    );
    err(
        Op::MoeExperts {},
        &with(5, "bf16[5,16,8]"),
        &["experts of gate and down differ: 5 vs 4"],
    );
    err(
        Op::MoeExperts {},
        &with(3, "f32[4,8,16]"),
        &["dtypes differ"],
    );
    err(
        Op::MoeExperts {},
        &with(0, "bf16[b,16]"),
        &["rows of x and weights differ: s vs b"],
    );
}

#[test]
fn arity_table() {
    use glmc_ir::Arity;
    assert_eq!(attend(true).arity(), Arity::Exact(7));
    assert_eq!(attend(false).arity(), Arity::Exact(6));
    assert_eq!(Op::Concat { axis: 0 }.arity(), Arity::AtLeast(1));
    assert!(Arity::AtLeast(1).accepts(5) && !Arity::AtLeast(1).accepts(0));
    assert_eq!(Arity::AtLeast(2).to_string(), "at least 2");
    // Every op name is unique.
    let mut names = Op::NAMES.to_vec();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), Op::NAMES.len());
    assert!(Op::CacheUpdate {
        batched: false,
        state: String::new()
    }
    .has_side_effect());
    assert!(!Op::Matmul {}.has_side_effect());
}

#[test]
fn slice_last() {
    assert_eq!(ok(Op::SliceLast {}, &["bf16[s,16]"]), "bf16[1,16]");
    assert_eq!(ok(Op::SliceLast {}, &["f32[4,2,8]"]), "f32[1,2,8]");
    assert_eq!(ok(Op::SliceLast {}, &["i64[b]"]), "i64[1]");
    err(Op::SliceLast {}, &["f32[]"], &["scalar f32[] has no rows"]);
}

#[test]
fn samplers() {
    assert_eq!(ok(Op::SampleArgmax {}, &["bf16[b,32]"]), "i64[b]");
    assert_eq!(ok(Op::SampleArgmax {}, &["f32[1,32]"]), "i64[1]");
    err(
        Op::SampleArgmax {},
        &["f32[32]"],
        &["logits must have rank 2, has f32[32]"],
    );
    err(
        Op::SampleArgmax {},
        &["i64[b,32]"],
        &["logits must be a float tensor"],
    );
    let top_p =
        |logits: &str, t: &str, p: &str, u: &str| run(&Op::SampleTopP {}, &[logits, t, p, u]);
    assert_eq!(
        ok(
            Op::SampleTopP {},
            &["f32[b,32]", "f32[b]", "f32[b]", "f32[b]"]
        ),
        "i64[b]"
    );
    assert_eq!(
        ok(
            Op::SampleTopP {},
            &["bf16[1,32]", "f32[1]", "f32[1]", "f32[1]"]
        ),
        "i64[1]"
    );
    let e = top_p("f32[b,32]", "f32[b]", "f32[s]", "f32[b]").unwrap_err();
    assert!(e.contains("top_p and logits rows differ: s vs b"), "{e}");
    let e = top_p("f32[b,32]", "f32[b]", "f32[b]", "bf16[b]").unwrap_err();
    assert!(
        e.contains("uniform must be f32[b], one per row, is bf16[b]"),
        "{e}"
    );
    let e = top_p("f32[b,32]", "f32[b,1]", "f32[b]", "f32[b]").unwrap_err();
    assert!(e.contains("temperature must be f32[b]"), "{e}");
    err(
        Op::SampleTopP {},
        &["f32[b,32]", "f32[b]", "f32[b]"],
        &["takes 4 operands, has 3"],
    );
}

#[test]
fn collectives() {
    let sum = |ranks| Op::AllReduce {
        op: glmc_ir::Reduce::Sum,
        ranks,
    };
    assert_eq!(ok(sum(2), &["bf16[b,64]"]), "bf16[b,64]");
    err(sum(2), &["i64[b]"], &["x must be a float"]);
    err(sum(0), &["f32[b]"], &["ranks must be positive"]);
    let gather = |axis, ranks| Op::AllGather { axis, ranks };
    assert_eq!(ok(gather(1, 4), &["f32[s,64]"]), "f32[s,256]");
    assert_eq!(ok(gather(0, 2), &["i64[3,b]"]), "i64[6,b]");
    err(
        gather(0, 2),
        &["f32[s,64]"],
        &["cannot gather along symbolic dim s"],
    );
    err(gather(2, 2), &["f32[s,64]"], &["axis 2 out of range"]);
    err(gather(1, 0), &["f32[s,64]"], &["ranks must be positive"]);
    assert_eq!(
        ok(Op::EmbedShard { start: 16 }, &["bf16[16,8]", "i64[s]"]),
        "bf16[s,8]"
    );
    err(
        Op::EmbedShard { start: 0 },
        &["bf16[16,8]", "f32[s]"],
        &["ids must be an integer"],
    );
}
