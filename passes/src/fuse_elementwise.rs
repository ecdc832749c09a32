//! `fuse-elementwise`: folds elementwise ops into the op that produces or reads their operand, so
//! a kernel does the work in its epilogue instead of a round trip through memory. Each rewrite
//! is made only where the fused op computes exactly what the ops it replaces did (the reference
//! interpreter runs both with the same kernels, so they agree bit for bit).
//!
//! Names: a name stands for one value, and traces of two graphs are compared by (name, output),
//! so a fused node's output 0 is the value its name had before, and a value whose content the
//! rewrite changes gets a new name.
//!
//! - **`add.rmsnorm`**: `r = add(h, d)` read (as its `x`) by `rmsnorm(r, w)` becomes one node
//!   `add.rmsnorm(h, d, w)` with two outputs: the normalised value (output 0, the rmsnorm's
//!   readers) and the sum (output 1, which the next residual add still reads). It keeps the
//!   rmsnorm's name; the add's goes. When several rmsnorms read one sum, the first in canonical
//!   order is fused and the others read output 1. Not done when `w` depends on `r` (the fused
//!   node would be on a cycle).
//! - **`swiglu`**: `mul(silu(g), u)`, or `mul(u, silu(g))`, where the silu has no other reader
//!   (and is no result) and `u` has the silu's type (no broadcast), becomes `swiglu(g, u)` named
//!   like the mul.
//! - **`matmul.rope`**: `rope(S)` where `S` is a slice of the last axis of `P = matmul(x, W)`, or
//!   of `reshape(P)` splitting P's last axis into `[H, D]`, through any chain of further
//!   last-axis slices: after `fuse-mla-projections` the kv_a part of the fused attention-input
//!   projection is itself a slice of the fused matmul and `k_pe` a slice of that, which this
//!   handles exactly (slice offsets add up in P's columns). P becomes
//!   `matmul.rope(x, W, positions)` rotating columns `start..end` of every `period` (D for the
//!   per-head reshape, P's width otherwise); `S` then reads rotated data, takes over the rope's
//!   readers and the rope's name, and the rope goes. P and the values between it and `S` (the
//!   reshape, outer slices) now hold rotated columns, so their names get `+rope` appended.
//!   Made only when `S` has no reader but the rope, no value on the chain is a function result,
//!   every other reader of a value on the chain is a last-axis slice that misses the rotated
//!   columns (in every head), P has rank ≥ 2 (its rows, axis 0, are then the rope's rows), and
//!   the positions do not depend on P. A matmul gets at most one rotated range, so a second
//!   rope on the same projection stays a rope. Not done on a matmul whose x and weight differ
//!   in dtype (the rope epilogue's GEMMs take one).
//! - **`dsa.score` head-weight scale**: `w = scale(v, factor)` read (as its `w`) by a
//!   `dsa.score` whose `weight_scale` is 1 becomes that `dsa.score` reading `v` with
//!   `weight_scale = factor`, which scales `v` as the `scale` did (rounded to v's dtype), so its
//!   scores are the same bits. Made only when the scale has no other reader and is no result;
//!   a score that already folds a factor keeps the `scale` (two roundings are not one).
//! - **widening cast into `matmul`**: `c = cast(x)` from bf16 or f16 to f32, read (as its `x`)
//!   by a `matmul` with f32 weights, becomes that matmul reading `x` in its narrow dtype: the
//!   widening is exact, so the product is the same. Made only when the cast has no other reader
//!   and is no result; a narrowing cast, or a matmul whose weights are not f32, is left alone.
//!
//! Both folds remove a node and keep the reader's name; the folded node's value is gone.
//!
//! On GLM-5 that fuses both residual adds of every layer into the norms that follow them (the
//! first layer's input norm reads the embedding and stays), the dense MLPs' and the shared
//! experts' activations, and three of the four ropes of every layer: the query's `q_pe`
//! (q_b_proj, period 256, columns 192..256), the indexer query's (wq_b, period 128, columns
//! 0..64) and the latent key's `k_pe` (the fused attention-input projection, columns
//! 2560..2624 of 2784). The indexer key's rope reads `k_norm`, a layernorm, and stays. Every
//! indexer's head-weight scale (2^-6, its `weights_proj` slice of the fused projection) goes
//! into its `dsa.score`, and every MoE layer's router (`mlp.gate`, f32 weights) reads the
//! post-attention norm's bf16 output instead of its f32 cast (`mlp.gate.input_f32`): at decode
//! each is a launch of next to no work fewer a layer.

use glmc_ir::{DType, Dim, Function, Module, NodeIndex, Op, Value};
use petgraph::algo::has_path_connecting;

use crate::pass::{Pass, PassError};

pub struct FuseElementwise;

const NAME: &str = "fuse-elementwise";

/// Appended to the name of a value that `matmul.rope` changed (some of its columns rotated).
pub const ROTATED: &str = "+rope";

impl Pass for FuseElementwise {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, module: &mut Module) -> Result<bool, PassError> {
        let mut changed = false;
        for f in &mut module.functions {
            changed |= fuse_add_rmsnorm(f);
            changed |= fuse_swiglu(f);
            changed |= fuse_matmul_rope(f);
            changed |= fold_score_weight_scale(f);
            changed |= fold_widening_cast(f);
        }
        Ok(changed)
    }
}

/// Nodes of `f` whose op satisfies `pick`, in canonical order (so rewrites are deterministic).
fn nodes_where(f: &Function, pick: impl Fn(&Op) -> bool) -> Vec<NodeIndex> {
    f.canonical_order()
        .into_iter()
        .filter(|&n| pick(&f.node(n).op))
        .collect()
}

/// The single operand-0 input of a one-operand node.
fn input(f: &Function, n: NodeIndex) -> Value {
    f.operands(n)[0]
}

/// Whether `to` can be reached from `from` (making `from` read `to` would close a cycle).
/// Arguments and weights have no operands, so nothing reaches them.
fn depends_on(f: &Function, to: Value, from: NodeIndex) -> bool {
    !matches!(f.node(to.node).op, Op::Input { .. } | Op::Weight { .. })
        && has_path_connecting(&f.graph, from, to.node, None)
}

fn is_result(f: &Function, v: Value) -> bool {
    f.results.iter().any(|(_, r)| *r == v)
}

fn fuse_add_rmsnorm(f: &mut Function) -> bool {
    let mut changed = false;
    for norm in nodes_where(f, |op| matches!(op, Op::RmsNorm { .. })) {
        let Op::RmsNorm { eps } = f.node(norm).op else {
            unreachable!("selected above")
        };
        let [r, w] = f.operands(norm)[..] else {
            continue;
        };
        if f.node(r.node).op != (Op::Add {}) || depends_on(f, w, r.node) {
            continue;
        }
        let add = r.node;
        let [h, d] = f.operands(add)[..] else {
            continue;
        };
        let node = f.node(norm).clone();
        let mut outputs = node.outputs.clone();
        outputs.extend(f.node(add).outputs.iter().cloned());
        let fused = f.add_node(
            Op::AddRmsNorm { eps },
            format!("{}#fusing", node.name),
            &[h, d, w],
            outputs,
        );
        f.replace_all_uses(
            r,
            Value {
                node: fused,
                output: 1,
            },
        );
        f.replace_all_uses(
            norm.into(),
            Value {
                node: fused,
                output: 0,
            },
        );
        f.graph.remove_node(norm);
        f.graph.remove_node(add);
        f.graph[fused].name = node.name;
        changed = true;
    }
    changed
}

fn fuse_swiglu(f: &mut Function) -> bool {
    let mut changed = false;
    for mul in nodes_where(f, |op| *op == Op::Mul {}) {
        let [a, b] = f.operands(mul)[..] else {
            continue;
        };
        let lone_silu = |v: Value| f.node(v.node).op == Op::Silu {} && f.users(v).len() == 1;
        // Products commute exactly, so the silu may be either operand.
        let (act, u) = if lone_silu(a) {
            (a, b)
        } else if lone_silu(b) {
            (b, a)
        } else {
            continue;
        };
        if f.value_type(act) != f.value_type(u) || is_result(f, act) {
            continue;
        }
        let g = input(f, act.node);
        f.replace_op(mul, Op::Swiglu {}, &[g, u]);
        f.graph.remove_node(act.node);
        changed = true;
    }
    changed
}

fn fold_score_weight_scale(f: &mut Function) -> bool {
    let mut changed = false;
    for score in nodes_where(f, |op| matches!(op, Op::DsaScore { .. })) {
        let Op::DsaScore { weight_scale } = f.node(score).op else {
            unreachable!("selected above")
        };
        let [q, w, k, positions] = f.operands(score)[..] else {
            continue;
        };
        let Op::Scale { factor } = f.node(w.node).op else {
            continue;
        };
        if weight_scale != 1.0 || f.users(w).len() != 1 || is_result(f, w) {
            continue;
        }
        let v = input(f, w.node);
        let op = Op::DsaScore {
            weight_scale: factor,
        };
        f.replace_op(score, op, &[q, v, k, positions]);
        f.graph.remove_node(w.node);
        changed = true;
    }
    changed
}

fn fold_widening_cast(f: &mut Function) -> bool {
    let mut changed = false;
    for matmul in nodes_where(f, |op| *op == Op::Matmul {}) {
        let [c, w] = f.operands(matmul)[..] else {
            continue;
        };
        if f.node(c.node).op != (Op::Cast { dtype: DType::F32 })
            || f.value_type(w).dtype != DType::F32
            || f.users(c).len() != 1
            || is_result(f, c)
        {
            continue;
        }
        let x = input(f, c.node);
        if !matches!(f.value_type(x).dtype, DType::BF16 | DType::F16) {
            continue;
        }
        f.replace_op(matmul, Op::Matmul {}, &[x, w]);
        f.graph.remove_node(c.node);
        changed = true;
    }
    changed
}

/// A rope that can move into the epilogue of the matmul its input is sliced from.
struct RopeEpilogue {
    /// The slice the rope reads.
    slice: NodeIndex,
    matmul: NodeIndex,
    /// The values between the matmul and `slice` (a reshape, outer slices), which hold rotated
    /// columns from now on.
    between: Vec<NodeIndex>,
    positions: Value,
    period: u64,
    start: u64,
    end: u64,
}

fn fuse_matmul_rope(f: &mut Function) -> bool {
    let mut changed = false;
    for rope in nodes_where(f, |op| matches!(op, Op::Rope { .. })) {
        let Some(plan) = rope_epilogue(f, rope) else {
            continue;
        };
        let Op::Rope { interleaved, theta } = f.node(rope).op else {
            unreachable!("selected above")
        };
        let [x, w] = f.operands(plan.matmul)[..] else {
            unreachable!("checked by rope_epilogue")
        };
        let op = Op::MatmulRope {
            interleaved,
            theta,
            period: plan.period,
            start: plan.start,
            end: plan.end,
        };
        let fused = f.replace_op(plan.matmul, op, &[x, w, plan.positions]);
        // A name stands for one value (traces of two graphs are compared by name): the values
        // that now hold rotated columns get new names, the slice takes the rope's.
        for n in plan.between.into_iter().chain([fused]) {
            let name = format!("{}{ROTATED}", f.node(n).name);
            f.graph[n].name = name;
        }
        f.replace_all_uses(rope.into(), plan.slice.into());
        let name = f.node(rope).name.clone();
        f.graph.remove_node(rope);
        f.graph[plan.slice].name = name;
        changed = true;
    }
    changed
}

/// The slice of the last axis that node `n` is, as `start..end`.
fn last_axis_slice(f: &Function, n: NodeIndex) -> Option<(u64, u64)> {
    let Op::Slice { axis, start, end } = f.node(n).op else {
        return None;
    };
    let rank = f.value_type(input(f, n)).rank() as u64;
    (axis + 1 == rank).then_some((start, end))
}

/// Whether columns `a..b` of a value whose column 0 is column `base` of a period overlap the
/// rotated columns `start..end`, in any of `blocks` consecutive periods.
fn overlaps(range: (u64, u64), base: u64, blocks: u64, period: u64, rot: (u64, u64)) -> bool {
    let (a, b) = (base + range.0, base + range.1);
    (0..blocks).any(|k| a < k * period + rot.1 && k * period + rot.0 < b)
}

fn rope_epilogue(f: &Function, rope: NodeIndex) -> Option<RopeEpilogue> {
    let [x, positions] = f.operands(rope)[..] else {
        return None;
    };
    let slice = x.node;
    last_axis_slice(f, slice)?;
    if f.users(x).len() != 1 || is_result(f, x) {
        return None;
    }
    // Walk down: last-axis slices, then maybe a reshape splitting the last axis, then the matmul.
    let mut slices = vec![slice];
    let mut v = input(f, slice);
    let mut reshape = None;
    loop {
        match &f.node(v.node).op {
            Op::Matmul {} => break,
            Op::Slice { .. } => {
                last_axis_slice(f, v.node)?;
                slices.push(v.node);
                v = input(f, v.node);
            }
            Op::Reshape { shape } => {
                let p = f.value_type(input(f, v.node));
                if !splits_last_axis(&p.shape, shape) {
                    return None;
                }
                reshape = Some(v.node);
                v = input(f, v.node);
                if f.node(v.node).op != (Op::Matmul {}) {
                    return None;
                }
                break;
            }
            _ => return None,
        }
    }
    let matmul = v.node;
    let [x_in, w_in] = f.operands(matmul)[..] else {
        return None;
    };
    if f.value_type(x_in).dtype != f.value_type(w_in).dtype {
        return None;
    }
    let out = f.value_type(matmul.into());
    let width = out.shape.last()?.as_const()?;
    if out.rank() < 2 || depends_on(f, positions, matmul) {
        return None;
    }
    let period = match reshape {
        Some(r) => f.value_type(r.into()).shape.last()?.as_const()?,
        None => width,
    };
    // Column 0 of every value on the chain, in period coordinates, from the matmul (or its
    // reshape) up to the slice the rope reads.
    let mut bases = Vec::with_capacity(slices.len());
    let mut base = 0;
    for &s in slices.iter().rev() {
        bases.push(base);
        base += last_axis_slice(f, s)?.0;
    }
    let rot = (base, base + f.value_type(x).shape.last()?.as_const()?);
    // Every other reader of a value on the chain must miss the rotated columns. Each entry:
    // the value, its reader on the chain, the period column of its column 0, and how many
    // periods its last axis spans.
    let mut chain: Vec<(Value, NodeIndex, u64, u64)> = Vec::new();
    let lowest = *slices.last().expect("the rope's slice");
    match reshape {
        Some(r) => {
            chain.push((matmul.into(), r, 0, width / period));
            chain.push((r.into(), lowest, 0, 1));
        }
        None => chain.push((matmul.into(), lowest, 0, 1)),
    }
    for (k, pair) in slices.windows(2).rev().enumerate() {
        // `pair[1]` is read by `pair[0]`; its column 0 sits at `bases[k + 1]`.
        chain.push((pair[1].into(), pair[0], bases[k + 1], 1));
    }
    for (value, next, base, blocks) in chain {
        if is_result(f, value) {
            return None;
        }
        for (user, _) in f.users(value) {
            if user == next {
                continue;
            }
            let range = last_axis_slice(f, user)?;
            if overlaps(range, base, blocks, period, rot) {
                return None;
            }
        }
    }
    let between = reshape
        .into_iter()
        .chain(slices[1..].iter().copied())
        .collect();
    Some(RopeEpilogue {
        slice,
        matmul,
        between,
        positions,
        period,
        start: rot.0,
        end: rot.1,
    })
}

/// Whether `to` is `from` with its last axis split in two constant dims.
fn splits_last_axis(from: &[Dim], to: &[Dim]) -> bool {
    let r = from.len();
    if r == 0 || to.len() != r + 1 || from[..r - 1] != to[..r - 1] {
        return false;
    }
    match (&from[r - 1], &to[r - 1], &to[r]) {
        (Dim::Const(n), Dim::Const(h), Dim::Const(d)) => h.checked_mul(*d) == Some(*n),
        _ => false,
    }
}
