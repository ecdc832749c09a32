//! The ops `fuse-elementwise` introduces (`add.rmsnorm`, `swiglu`, `matmul.rope`) and its folds
//! (a scale into `dsa.score`, a widening cast into `matmul`): their type inference, their
//! interpreter semantics against the unfused composition, the text round trip, and the pass's
//! match conditions on small hand-built graphs, fusing and refusing.

use std::collections::HashMap;

use glmc_ir::verify::infer;
use glmc_ir::{
    parse_module, print_module, verify_module, DType, Dim, Function, Module, Op, TensorType, Value,
};
use glmc_passes::fuse_elementwise::FuseElementwise;
use glmc_passes::Pass;
use glmc_runtime::{Interpreter, Tensor};

// ---------------------------------------------------------------------------------------------
// Helpers

/// `"bf16[s,16]"` → the tensor type.
fn ty(text: &str) -> TensorType {
    let (dt, rest) = text.split_once('[').unwrap();
    let shape = rest
        .strip_suffix(']')
        .unwrap()
        .split(',')
        .filter(|d| !d.is_empty())
        .map(|d| match d.parse::<u64>() {
            Ok(n) => Dim::Const(n),
            Err(_) => Dim::sym(d),
        })
        .collect();
    TensorType::new(DType::from_name(dt).unwrap(), shape)
}

fn run_infer(op: &Op, operands: &[&str]) -> Result<String, String> {
    let types: Vec<TensorType> = operands.iter().map(|t| ty(t)).collect();
    let refs: Vec<&TensorType> = types.iter().collect();
    infer(op, &refs).map(|out| {
        out.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    })
}

#[track_caller]
fn ok(op: Op, operands: &[&str]) -> String {
    run_infer(&op, operands).unwrap_or_else(|e| panic!("{} of {operands:?}: {e}", op.name()))
}

#[track_caller]
fn err(op: Op, operands: &[&str], what: &str) {
    match run_infer(&op, operands) {
        Ok(out) => panic!("{} of {operands:?} should fail, gave {out}", op.name()),
        Err(e) => assert!(e.contains(what), "{e:?} should contain {what:?}"),
    }
}

fn matmul_rope(period: u64, start: u64, end: u64) -> Op {
    Op::MatmulRope {
        interleaved: true,
        theta: 10000.0,
        period,
        start,
        end,
    }
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn tensor(&mut self, shape: &[usize]) -> Tensor {
        let n = shape.iter().product();
        Tensor::f32(shape.to_vec(), (0..n).map(|_| 2.0 * self.unit()).collect()).unwrap()
    }
}

/// A function under construction: inputs with values, nodes, results.
struct Graph {
    f: Function,
    values: Vec<Tensor>,
}

impl Graph {
    fn new() -> Graph {
        Graph {
            f: Function::new("prefill"),
            values: Vec::new(),
        }
    }

    fn input(&mut self, name: &str, t: &str, value: Tensor) -> Value {
        let k = self.values.len() as u64;
        self.values.push(value);
        self.f.push_input(k, name, ty(t))
    }

    fn op(&mut self, op: Op, name: &str, operands: &[Value]) -> Value {
        self.f
            .push(op, name, operands)
            .unwrap_or_else(|e| panic!("{e}"))
            .into()
    }

    fn result(&mut self, name: &str, v: Value) {
        self.f.results.push((name.into(), v));
    }

    fn module(&self) -> Module {
        let mut m = Module::new("m");
        m.functions.push(self.f.clone());
        verify_module(&m).unwrap();
        m
    }
}

fn run(m: &Module, inputs: &[Tensor]) -> Vec<Tensor> {
    let weights: HashMap<String, Tensor> = HashMap::new();
    Interpreter::new()
        .run(m, &m.functions[0], &weights, &mut [], inputs)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Runs the pass; returns the fused module and whether it changed.
fn fuse(m: &Module) -> (Module, bool) {
    let mut fused = m.clone();
    let changed = FuseElementwise.run(&mut fused).unwrap();
    verify_module(&fused).unwrap_or_else(|e| panic!("{e}"));
    (fused, changed)
}

fn ops_of(m: &Module) -> Vec<&'static str> {
    let f = &m.functions[0];
    f.canonical_order()
        .into_iter()
        .map(|n| f.node(n).op.name())
        .filter(|n| *n != "input")
        .collect()
}

/// The pass must fuse into `expect` (the op names in canonical order, inputs left out) and
/// compute bit for bit what the graph computed before.
#[track_caller]
fn assert_fuses_exactly(g: &Graph, expect: &[&str]) -> Module {
    let m = g.module();
    let (fused, changed) = fuse(&m);
    assert!(changed, "nothing fused:\n{}", print_module(&m));
    assert_eq!(ops_of(&fused), expect, "\n{}", print_module(&fused));
    assert_eq!(run(&m, &g.values), run(&fused, &g.values));
    fused
}

#[track_caller]
fn assert_refused(g: &Graph) {
    let m = g.module();
    let (fused, changed) = fuse(&m);
    assert!(!changed, "fused:\n{}", print_module(&fused));
    assert_eq!(print_module(&fused), print_module(&m));
}

// ---------------------------------------------------------------------------------------------
// Inference

#[test]
fn add_rmsnorm_infers_the_norm_and_the_sum() {
    let op = || Op::AddRmsNorm { eps: 1e-5 };
    assert_eq!(
        ok(op(), &["bf16[s,16]", "bf16[s,16]", "bf16[16]"]),
        "bf16[s,16], bf16[s,16]"
    );
    // The add's broadcast rule carries over.
    assert_eq!(
        ok(op(), &["f32[b,4,16]", "f32[16]", "f32[16]"]),
        "f32[b,4,16], f32[b,4,16]"
    );
    err(
        op(),
        &["bf16[s,16]", "bf16[s,16]", "bf16[8]"],
        "normalised dim and weight differ: 16 vs 8",
    );
    err(
        op(),
        &["bf16[s,16]", "f32[s,16]", "bf16[16]"],
        "dtypes differ",
    );
    err(
        op(),
        &["bf16[s,16]", "bf16[b,16]", "bf16[16]"],
        "is not a trailing part",
    );
    err(
        op(),
        &["bf16[s,16]", "bf16[s,16]"],
        "takes 3 operands, has 2",
    );
}

#[test]
fn swiglu_needs_one_type() {
    assert_eq!(
        ok(Op::Swiglu {}, &["bf16[s,96]", "bf16[s,96]"]),
        "bf16[s,96]"
    );
    err(
        Op::Swiglu {},
        &["bf16[s,96]", "bf16[96]"],
        "must have one type",
    );
    err(
        Op::Swiglu {},
        &["bf16[s,96]", "f32[s,96]"],
        "must have one type",
    );
    err(
        Op::Swiglu {},
        &["i64[s]", "i64[s]"],
        "must be a float tensor",
    );
}

#[test]
fn matmul_rope_infers_the_matmul_and_checks_the_columns() {
    let ops = ["bf16[s,64]", "bf16[32,64]", "i64[s]"];
    assert_eq!(ok(matmul_rope(16, 8, 16), &ops), "bf16[s,32]");
    assert_eq!(ok(matmul_rope(32, 0, 32), &ops), "bf16[s,32]");
    assert_eq!(
        ok(
            matmul_rope(8, 0, 4),
            &["f32[b,3,64]", "f32[32,64]", "i64[b]"]
        ),
        "f32[b,3,32]"
    );
    err(
        matmul_rope(12, 8, 12),
        &ops,
        "period 12 does not divide the 32",
    );
    err(matmul_rope(0, 0, 2), &ops, "period 0 does not divide");
    err(matmul_rope(16, 8, 18), &ops, "within the period 16");
    err(matmul_rope(16, 8, 11), &ops, "non-empty even range");
    err(matmul_rope(16, 8, 8), &ops, "non-empty even range");
    err(
        matmul_rope(16, 8, 16),
        &["bf16[s,64]", "bf16[32,64]", "i64[b]"],
        "positions and query rows differ: b vs s",
    );
    err(
        matmul_rope(16, 8, 16),
        &["bf16[s,64]", "bf16[32,64]", "f32[s]"],
        "positions must be an integer tensor",
    );
    err(
        matmul_rope(16, 8, 16),
        &["bf16[64]", "bf16[32,64]", "i64[s]"],
        "output must have rank 2 to 4",
    );
    err(
        matmul_rope(16, 8, 16),
        &["bf16[s,64]", "bf16[32,48]", "i64[s]"],
        "inner dims of x and w differ",
    );
}

#[test]
fn fused_ops_are_in_the_table_and_round_trip_as_text() {
    for name in ["add.rmsnorm", "swiglu", "matmul.rope"] {
        assert!(Op::NAMES.contains(&name), "{name}");
    }
    assert_eq!(matmul_rope(16, 8, 16).arity(), glmc_ir::Arity::Exact(3));
    assert_eq!(
        Op::AddRmsNorm { eps: 1e-6 }.arity(),
        glmc_ir::Arity::Exact(3)
    );
    assert_eq!(Op::Swiglu {}.arity(), glmc_ir::Arity::Exact(2));
    let g = residual_norm_graph();
    let (fused, _) = fuse(&g.module());
    let text = print_module(&fused);
    let back = parse_module(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(print_module(&back), text);
}

// ---------------------------------------------------------------------------------------------
// Interpreter semantics: each fused op against its unfused composition

#[test]
fn add_rmsnorm_equals_add_then_rmsnorm() {
    let mut rng = Rng(7);
    let (h, d, w) = (
        rng.tensor(&[5, 24]),
        rng.tensor(&[5, 24]),
        rng.tensor(&[24]),
    );
    let mut unfused = Graph::new();
    let (hi, di, wi) = (
        unfused.input("h", "f32[s,24]", h.clone()),
        unfused.input("d", "f32[s,24]", d.clone()),
        unfused.input("w", "f32[24]", w.clone()),
    );
    let r = unfused.op(Op::Add {}, "r", &[hi, di]);
    let y = unfused.op(Op::RmsNorm { eps: 1e-6 }, "y", &[r, wi]);
    unfused.result("r", r);
    unfused.result("y", y);

    let mut fused = Graph::new();
    let (hi, di, wi) = (
        fused.input("h", "f32[s,24]", h),
        fused.input("d", "f32[s,24]", d),
        fused.input("w", "f32[24]", w),
    );
    let n = fused.op(Op::AddRmsNorm { eps: 1e-6 }, "y", &[hi, di, wi]);
    fused.result(
        "r",
        Value {
            node: n.node,
            output: 1,
        },
    );
    fused.result("y", n);
    assert_eq!(
        run(&unfused.module(), &unfused.values),
        run(&fused.module(), &fused.values)
    );
}

#[test]
fn swiglu_equals_mul_of_silu() {
    let mut rng = Rng(11);
    let (g, u) = (rng.tensor(&[3, 40]), rng.tensor(&[3, 40]));
    let mut unfused = Graph::new();
    let (gi, ui) = (
        unfused.input("g", "f32[s,40]", g.clone()),
        unfused.input("u", "f32[s,40]", u.clone()),
    );
    let a = unfused.op(Op::Silu {}, "a", &[gi]);
    let y = unfused.op(Op::Mul {}, "y", &[a, ui]);
    unfused.result("y", y);
    let mut fused = Graph::new();
    let (gi, ui) = (
        fused.input("g", "f32[s,40]", g),
        fused.input("u", "f32[s,40]", u),
    );
    let y = fused.op(Op::Swiglu {}, "y", &[gi, ui]);
    fused.result("y", y);
    let out = run(&fused.module(), &fused.values);
    assert_eq!(run(&unfused.module(), &unfused.values), out);
    // silu(0) = 0, silu(x) → x for large x: spot-check the formula itself.
    let x = out[0].as_f32().unwrap()[0] as f64;
    let (g0, u0) = (
        fused.values[0].as_f32().unwrap()[0] as f64,
        fused.values[1].as_f32().unwrap()[0] as f64,
    );
    assert!((x - g0 / (1.0 + (-g0).exp()) * u0).abs() < 1e-6);
}

/// `rope(slice(reshape(matmul(x, w), [s, H, D]), 2, a..b))`, every column of the matmul a
/// result, against `matmul.rope` with period D.
#[test]
fn matmul_rope_equals_rope_of_a_slice_per_head() {
    for (interleaved, start, end) in [(true, 4, 12), (false, 0, 6), (true, 10, 12)] {
        let mut rng = Rng(13 + start);
        let (x, w) = (rng.tensor(&[4, 20]), rng.tensor(&[36, 20]));
        let pos = Tensor::i64(vec![4], vec![0, 3, 17, 1000]).unwrap();
        let rope = Op::Rope {
            interleaved,
            theta: 10000.0,
        };
        let mut unfused = Graph::new();
        let (xi, wi, pi) = (
            unfused.input("x", "f32[s,20]", x.clone()),
            unfused.input("w", "f32[36,20]", w.clone()),
            unfused.input("positions", "i64[s]", pos.clone()),
        );
        let p = unfused.op(Op::Matmul {}, "p", &[xi, wi]);
        let shape = vec![Dim::sym("s"), Dim::Const(3), Dim::Const(12)];
        let heads = unfused.op(Op::Reshape { shape }, "heads", &[p]);
        let parts = [(0, start), (start, end), (end, 12)];
        let mut pieces = Vec::new();
        for (k, (a, b)) in parts.into_iter().enumerate() {
            if a == b {
                continue;
            }
            let s = unfused.op(
                Op::Slice {
                    axis: 2,
                    start: a,
                    end: b,
                },
                &format!("part{k}"),
                &[heads],
            );
            pieces.push(if k == 1 {
                unfused.op(rope.clone(), "rotated", &[s, pi])
            } else {
                s
            });
        }
        let all = unfused.op(Op::Concat { axis: 2 }, "all", &pieces);
        unfused.result("all", all);

        let mut fused = Graph::new();
        let (xi, wi, pi) = (
            fused.input("x", "f32[s,20]", x),
            fused.input("w", "f32[36,20]", w),
            fused.input("positions", "i64[s]", pos),
        );
        let op = Op::MatmulRope {
            interleaved,
            theta: 10000.0,
            period: 12,
            start,
            end,
        };
        let p = fused.op(op, "p", &[xi, wi, pi]);
        let shape = vec![Dim::sym("s"), Dim::Const(3), Dim::Const(12)];
        let heads = fused.op(Op::Reshape { shape }, "heads", &[p]);
        fused.result("all", heads);
        assert_eq!(
            run(&unfused.module(), &unfused.values),
            run(&fused.module(), &fused.values),
            "interleaved={interleaved}, {start}..{end}"
        );
    }
}

#[test]
fn matmul_rope_by_hand() {
    // w = identity, so the matmul returns x; period 4, columns 2..4 rotated (R = 2, one pair,
    // frequency 1) at positions 0 and 2: row 0 unchanged, row 1's (x2, x3) turned by 2 rad.
    let x = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
    let mut eye = vec![0.0; 16];
    for i in 0..4 {
        eye[i * 4 + i] = 1.0;
    }
    let mut g = Graph::new();
    let xi = g.input("x", "f32[s,4]", Tensor::f32(vec![2, 4], x).unwrap());
    let wi = g.input("w", "f32[4,4]", Tensor::f32(vec![4, 4], eye).unwrap());
    let pi = g.input(
        "positions",
        "i64[s]",
        Tensor::i64(vec![2], vec![0, 2]).unwrap(),
    );
    let y = g.op(matmul_rope(4, 2, 4), "y", &[xi, wi, pi]);
    g.result("y", y);
    let out = run(&g.module(), &g.values);
    let (c, s) = (2f64.cos(), 2f64.sin());
    let expected = [
        1.0,
        2.0,
        3.0,
        4.0,
        5.0,
        6.0,
        7.0 * c - 8.0 * s,
        8.0 * c + 7.0 * s,
    ];
    for (a, e) in out[0].as_f32().unwrap().iter().zip(expected) {
        assert!((*a as f64 - e).abs() < 1e-6, "{a} vs {e}");
    }
}

// ---------------------------------------------------------------------------------------------
// The pass on small graphs

/// `y = rmsnorm(h + d, w)` with the sum also returned (the next residual).
fn residual_norm_graph() -> Graph {
    let mut rng = Rng(3);
    let mut g = Graph::new();
    let h = g.input("h", "f32[s,8]", rng.tensor(&[3, 8]));
    let d = g.input("d", "f32[s,8]", rng.tensor(&[3, 8]));
    let w = g.input("w", "f32[8]", rng.tensor(&[8]));
    let r = g.op(Op::Add {}, "residual", &[h, d]);
    let y = g.op(Op::RmsNorm { eps: 1e-5 }, "norm", &[r, w]);
    let z = g.op(Op::Add {}, "next_residual", &[r, y]);
    g.result("z", z);
    g
}

#[test]
fn fuses_a_residual_add_into_its_norm() {
    let g = residual_norm_graph();
    let fused = assert_fuses_exactly(&g, &["add.rmsnorm", "add"]);
    let f = &fused.functions[0];
    let n = f.find("norm").unwrap();
    assert!(f.find("residual").is_none());
    let next = f.find("next_residual").unwrap();
    assert_eq!(
        f.operands(next),
        vec![Value { node: n, output: 1 }, Value { node: n, output: 0 }]
    );
}

#[test]
fn a_sum_read_by_two_norms_fuses_into_the_first() {
    let mut rng = Rng(5);
    let mut g = Graph::new();
    let h = g.input("h", "f32[s,8]", rng.tensor(&[2, 8]));
    let d = g.input("d", "f32[s,8]", rng.tensor(&[2, 8]));
    let w = g.input("w", "f32[8]", rng.tensor(&[8]));
    let r = g.op(Op::Add {}, "r", &[h, d]);
    let a = g.op(Op::RmsNorm { eps: 1e-5 }, "a", &[r, w]);
    let b = g.op(Op::RmsNorm { eps: 1e-3 }, "b", &[r, w]);
    let y = g.op(Op::Mul {}, "y", &[a, b]);
    g.result("y", y);
    g.result("r", r);
    assert_fuses_exactly(&g, &["add.rmsnorm", "rmsnorm", "mul"]);
}

#[test]
fn refuses_add_rmsnorm_when_the_weight_depends_on_the_sum() {
    // w = the first row of r: fusing would make the node read its own output.
    let mut rng = Rng(9);
    let mut g = Graph::new();
    let h = g.input("h", "f32[4,8]", rng.tensor(&[4, 8]));
    let d = g.input("d", "f32[4,8]", rng.tensor(&[4, 8]));
    let r = g.op(Op::Add {}, "r", &[h, d]);
    let row = g.op(
        Op::Slice {
            axis: 0,
            start: 0,
            end: 1,
        },
        "row",
        &[r],
    );
    let w = g.op(
        Op::Reshape {
            shape: vec![Dim::Const(8)],
        },
        "w",
        &[row],
    );
    let y = g.op(Op::RmsNorm { eps: 1e-5 }, "y", &[r, w]);
    g.result("y", y);
    assert_refused(&g);
}

#[test]
fn fuses_silu_times_up_either_way_round() {
    for silu_first in [true, false] {
        let mut rng = Rng(21);
        let mut g = Graph::new();
        let gate = g.input("gate", "f32[s,16]", rng.tensor(&[3, 16]));
        let up = g.input("up", "f32[s,16]", rng.tensor(&[3, 16]));
        let act = g.op(Op::Silu {}, "act", &[gate]);
        let operands = if silu_first { [act, up] } else { [up, act] };
        let y = g.op(Op::Mul {}, "act_mul_up", &operands);
        g.result("y", y);
        let fused = assert_fuses_exactly(&g, &["swiglu"]);
        let f = &fused.functions[0];
        let n = f.find("act_mul_up").unwrap();
        assert_eq!(f.operands(n), vec![gate, up]);
    }
}

#[test]
fn refuses_swiglu_when_the_activation_has_another_reader_or_broadcasts() {
    let mut rng = Rng(23);
    let mut g = Graph::new();
    let gate = g.input("gate", "f32[s,16]", rng.tensor(&[3, 16]));
    let up = g.input("up", "f32[s,16]", rng.tensor(&[3, 16]));
    let act = g.op(Op::Silu {}, "act", &[gate]);
    let y = g.op(Op::Mul {}, "y", &[act, up]);
    g.result("y", y);
    g.result("act", act);
    assert_refused(&g);

    let mut g = Graph::new();
    let gate = g.input("gate", "f32[s,16]", rng.tensor(&[3, 16]));
    let up = g.input("up", "f32[s,16]", rng.tensor(&[3, 16]));
    let act = g.op(Op::Silu {}, "act", &[gate]);
    let y = g.op(Op::Mul {}, "y", &[act, up]);
    let z = g.op(Op::Add {}, "z", &[y, act]);
    g.result("z", z);
    assert_refused(&g);

    let mut g = Graph::new();
    let gate = g.input("gate", "f32[16]", rng.tensor(&[16]));
    let up = g.input("up", "f32[s,16]", rng.tensor(&[3, 16]));
    let act = g.op(Op::Silu {}, "act", &[gate]);
    let y = g.op(Op::Mul {}, "y", &[up, act]);
    g.result("y", y);
    assert_refused(&g);
}

/// A projection `p = x · wᵀ` of width 24, its columns read by `readers` (`start..end` slices of
/// the last axis), and a rope of columns `rot` of `p`, all returned.
fn flat_rope_graph(rot: (u64, u64), readers: &[(u64, u64)]) -> Graph {
    let mut rng = Rng(31);
    let mut g = Graph::new();
    let x = g.input("x", "f32[s,10]", rng.tensor(&[3, 10]));
    let w = g.input("w", "f32[24,10]", rng.tensor(&[24, 10]));
    let pos = g.input(
        "positions",
        "i64[s]",
        Tensor::i64(vec![3], vec![5, 6, 7]).unwrap(),
    );
    let p = g.op(Op::Matmul {}, "p", &[x, w]);
    let slice = |g: &mut Graph, name: &str, (start, end): (u64, u64)| {
        g.op(
            Op::Slice {
                axis: 1,
                start,
                end,
            },
            name,
            &[p],
        )
    };
    let unrotated = slice(&mut g, "pe_unrotated", rot);
    let rope = Op::Rope {
        interleaved: false,
        theta: 500.0,
    };
    let pe = g.op(rope, "pe", &[unrotated, pos]);
    g.result("pe", pe);
    for (k, &r) in readers.iter().enumerate() {
        let s = slice(&mut g, &format!("other{k}"), r);
        g.result(&format!("other{k}"), s);
    }
    g
}

#[test]
fn fuses_a_rope_of_a_flat_projection() {
    let g = flat_rope_graph((8, 16), &[(0, 8), (16, 24), (2, 7)]);
    let fused = assert_fuses_exactly(&g, &["matmul.rope", "slice", "slice", "slice", "slice"]);
    let f = &fused.functions[0];
    assert_eq!(
        f.node(f.find("p+rope").unwrap()).op,
        Op::MatmulRope {
            interleaved: false,
            theta: 500.0,
            period: 24,
            start: 8,
            end: 16
        }
    );
    assert!(matches!(f.node(f.find("pe").unwrap()).op, Op::Slice { .. }));
    assert!(f.find("pe_unrotated").is_none() && f.find("p").is_none());
}

#[test]
fn refuses_a_rope_whose_columns_are_read_unrotated() {
    // Another slice overlaps the rotated columns.
    assert_refused(&flat_rope_graph((8, 16), &[(0, 9)]));
    assert_refused(&flat_rope_graph((8, 16), &[(15, 24)]));
    // The projection itself is a result.
    let mut g = flat_rope_graph((8, 16), &[]);
    let p: Value = g.f.find("p").unwrap().into();
    g.result("p", p);
    assert_refused(&g);
    // The rope's slice has another reader.
    let mut g = flat_rope_graph((8, 16), &[]);
    let s: Value = g.f.find("pe_unrotated").unwrap().into();
    g.result("unrotated", s);
    assert_refused(&g);
}

/// The GLM-5 shapes in small: a fused projection `[q | kv | k]`, kv sliced, kv's rope part
/// sliced again and rotated; and a per-head query `reshape(matmul)` with `[nope | pe]` heads.
#[test]
fn fuses_through_a_slice_of_a_fused_projection_and_per_head() {
    let mut rng = Rng(41);
    let mut g = Graph::new();
    let x = g.input("x", "f32[b,12]", rng.tensor(&[2, 12]));
    let w = g.input("w", "f32[30,12]", rng.tensor(&[30, 12]));
    let wq = g.input("wq", "f32[40,12]", rng.tensor(&[40, 12]));
    let pos = g.input(
        "positions",
        "i64[b]",
        Tensor::i64(vec![2], vec![9, 40]).unwrap(),
    );
    let sl = |g: &mut Graph, name: &str, v: Value, axis: u64, start: u64, end: u64| {
        g.op(Op::Slice { axis, start, end }, name, &[v])
    };
    let rope = Op::Rope {
        interleaved: true,
        theta: 1e6,
    };
    let fused = g.op(Op::Matmul {}, "fused", &[x, w]);
    let q = sl(&mut g, "q", fused, 1, 0, 10);
    let kv = sl(&mut g, "kv", fused, 1, 10, 22);
    let k = sl(&mut g, "k", fused, 1, 22, 30);
    let c_kv = sl(&mut g, "c_kv", kv, 1, 0, 8);
    let k_pe_un = sl(&mut g, "k_pe_unrotated", kv, 1, 8, 12);
    let k_pe = g.op(rope.clone(), "k_pe", &[k_pe_un, pos]);
    let proj = g.op(Op::Matmul {}, "q_b_proj", &[x, wq]);
    let shape = vec![Dim::sym("b"), Dim::Const(4), Dim::Const(10)];
    let heads = g.op(Op::Reshape { shape }, "q_heads", &[proj]);
    let q_nope = sl(&mut g, "q_nope", heads, 2, 0, 6);
    let q_pe_un = sl(&mut g, "q_pe_unrotated", heads, 2, 6, 10);
    let q_pe = g.op(rope, "q_pe", &[q_pe_un, pos]);
    for (name, v) in [
        ("q", q),
        ("k", k),
        ("c_kv", c_kv),
        ("k_pe", k_pe),
        ("q_nope", q_nope),
        ("q_pe", q_pe),
    ] {
        g.result(name, v);
    }
    let m = assert_fuses_exactly(
        &g,
        &[
            "matmul.rope",
            "slice",
            "slice",
            "slice",
            "slice",
            "slice",
            "matmul.rope",
            "reshape",
            "slice",
            "slice",
        ],
    );
    let f = &m.functions[0];
    let op = |name: &str| f.node(f.find(name).unwrap()).op.clone();
    assert!(
        matches!(
            op("fused+rope"),
            Op::MatmulRope {
                period: 30,
                start: 18,
                end: 22,
                ..
            }
        ),
        "{:?}",
        op("fused+rope")
    );
    assert!(
        matches!(
            op("q_b_proj+rope"),
            Op::MatmulRope {
                period: 10,
                start: 6,
                end: 10,
                ..
            }
        ),
        "{:?}",
        op("q_b_proj+rope")
    );
    // Names: values that now hold rotated columns are renamed, the rest keep theirs.
    for name in [
        "kv+rope",
        "q_heads+rope",
        "q",
        "k",
        "c_kv",
        "k_pe",
        "q_nope",
        "q_pe",
    ] {
        assert!(f.find(name).is_some(), "{name}");
    }
    for name in [
        "fused",
        "q_b_proj",
        "kv",
        "q_heads",
        "k_pe_unrotated",
        "q_pe_unrotated",
    ] {
        assert!(f.find(name).is_none(), "{name}");
    }
}

#[test]
fn refuses_a_per_head_rope_when_another_slice_of_the_flat_projection_overlaps_a_head() {
    // Flat columns 12..17 reach column 16, column 6 of head 1, which is rotated.
    let mut rng = Rng(43);
    let mut g = Graph::new();
    let x = g.input("x", "f32[s,12]", rng.tensor(&[2, 12]));
    let wq = g.input("wq", "f32[40,12]", rng.tensor(&[40, 12]));
    let pos = g.input(
        "positions",
        "i64[s]",
        Tensor::i64(vec![2], vec![1, 2]).unwrap(),
    );
    let proj = g.op(Op::Matmul {}, "proj", &[x, wq]);
    let shape = vec![Dim::sym("s"), Dim::Const(4), Dim::Const(10)];
    let heads = g.op(Op::Reshape { shape }, "heads", &[proj]);
    let pe_un = g.op(
        Op::Slice {
            axis: 2,
            start: 6,
            end: 10,
        },
        "pe_unrotated",
        &[heads],
    );
    let pe = g.op(
        Op::Rope {
            interleaved: true,
            theta: 1e4,
        },
        "pe",
        &[pe_un, pos],
    );
    let flat = g.op(
        Op::Slice {
            axis: 1,
            start: 12,
            end: 17,
        },
        "flat",
        &[proj],
    );
    g.result("pe", pe);
    g.result("flat", flat);
    assert_refused(&g);
}

/// `dsa.score(q, scale(v), k, positions)` over 3 rows, 2 heads of 4 dims and 5 keys, with
/// `v` = `v_t` (the head weights before the scale) and the score's `weight_scale` as given.
struct ScoreGraph {
    g: Graph,
    v: Value,
    head_weights: Value,
    score: Value,
}

fn score_graph(v_t: &str, weight_scale: f64) -> ScoreGraph {
    let mut rng = Rng(47);
    let mut g = Graph::new();
    let q = g.input("q", "bf16[3,2,4]", rng.tensor(&[3, 2, 4]));
    let v = g.input("v", v_t, rng.tensor(&[3, 2]));
    let k = g.input("k", "bf16[5,4]", rng.tensor(&[5, 4]));
    let pos = g.input(
        "positions",
        "i64[3]",
        Tensor::i64(vec![3], vec![2, 3, 4]).unwrap(),
    );
    let head_weights = g.op(Op::Scale { factor: 0.177 }, "head_weights", &[v]);
    let score = g.op(
        Op::DsaScore { weight_scale },
        "scores",
        &[q, head_weights, k, pos],
    );
    ScoreGraph {
        g,
        v,
        head_weights,
        score,
    }
}

#[test]
fn folds_the_head_weight_scale_into_the_score() {
    for v_t in ["bf16[3,2]", "f32[3,2]"] {
        let mut s = score_graph(v_t, 1.0);
        s.g.result("scores", s.score);
        let fused = assert_fuses_exactly(&s.g, &["dsa.score"]);
        let f = &fused.functions[0];
        let n = f.find("scores").unwrap();
        assert_eq!(
            f.node(n).op,
            Op::DsaScore {
                weight_scale: 0.177
            }
        );
        assert_eq!(f.operands(n)[1], s.v);
        assert!(f.find("head_weights").is_none());
    }
}

#[test]
fn refuses_the_head_weight_scale_when_read_elsewhere_returned_or_already_folded() {
    let mut s = score_graph("bf16[3,2]", 1.0);
    s.g.result("scores", s.score);
    s.g.result("head_weights", s.head_weights);
    assert_refused(&s.g);

    let mut s = score_graph("bf16[3,2]", 1.0);
    let twice =
        s.g.op(Op::Add {}, "twice", &[s.head_weights, s.head_weights]);
    s.g.result("scores", s.score);
    s.g.result("twice", twice);
    assert_refused(&s.g);

    let mut s = score_graph("bf16[3,2]", 0.5);
    s.g.result("scores", s.score);
    assert_refused(&s.g);
}

/// `matmul(cast(x, to), w)` of 3 rows, 8 inputs and 4 outputs.
fn cast_matmul_graph(x_t: &str, to: DType, w_t: &str) -> (Graph, Value, Value, Value, Value) {
    let mut rng = Rng(53);
    let mut g = Graph::new();
    let x = g.input("x", x_t, rng.tensor(&[3, 8]));
    let w = g.input("w", w_t, rng.tensor(&[4, 8]));
    let c = g.op(Op::Cast { dtype: to }, "x_cast", &[x]);
    let y = g.op(Op::Matmul {}, "y", &[c, w]);
    (g, x, w, c, y)
}

#[test]
fn folds_a_widening_cast_into_an_f32_matmul() {
    for x_t in ["bf16[3,8]", "f16[3,8]"] {
        let (mut g, x, w, _, y) = cast_matmul_graph(x_t, DType::F32, "f32[4,8]");
        g.result("y", y);
        let fused = assert_fuses_exactly(&g, &["matmul"]);
        let f = &fused.functions[0];
        let n = f.find("y").unwrap();
        assert_eq!(f.operands(n), vec![x, w]);
        assert_eq!(f.node(n).outputs[0], ty("f32[3,4]"));
        assert!(f.find("x_cast").is_none());
    }
}

#[test]
fn refuses_a_cast_read_elsewhere_returned_narrowing_or_into_a_non_f32_matmul() {
    let (mut g, _, _, c, y) = cast_matmul_graph("bf16[3,8]", DType::F32, "f32[4,8]");
    g.result("y", y);
    g.result("x_cast", c);
    assert_refused(&g);

    let (mut g, _, _, c, y) = cast_matmul_graph("bf16[3,8]", DType::F32, "f32[4,8]");
    let relu = g.op(Op::Relu {}, "relu", &[c]);
    g.result("y", y);
    g.result("relu", relu);
    assert_refused(&g);

    // Narrowing: the cast rounds, so the matmul must read what it made.
    let (mut g, _, _, _, y) = cast_matmul_graph("f32[3,8]", DType::BF16, "bf16[4,8]");
    g.result("y", y);
    assert_refused(&g);

    // A widening cast into a matmul whose weights are not f32.
    let (mut g, _, _, _, y) = cast_matmul_graph("bf16[3,8]", DType::F16, "f16[4,8]");
    g.result("y", y);
    assert_refused(&g);

    // An f32 cast of f32 changes nothing but is no widening either.
    let (mut g, _, _, _, y) = cast_matmul_graph("f32[3,8]", DType::F32, "f32[4,8]");
    g.result("y", y);
    assert_refused(&g);
}
