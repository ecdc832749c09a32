//! `fuse-cache-update`: a `cache.update` whose new rows are a norm's output, possibly with a
//! column range of it rotated, becomes one `cache.update.norm` that normalises, rotates and
//! writes each row in one kernel; a second `cache.update` writing the columns right after the
//! norm's input, unchanged, joins it. Decode moves a few hundred bytes a row here, so the
//! launches, not the bytes, are the cost.
//!
//! The rows a cache update writes are matched as pieces of one norm output N (`rmsnorm` or
//! `layernorm` of `x [n, D]`): N itself; or the `concat` along the last axis of `slice`s of N
//! covering its columns `0..D` in order, at most one of them read through a `rope` at the
//! update's positions. The fused node computes exactly what the pieces did (the interpreter runs
//! the same kernels on the same slices), and its GPU kernel rounds the normalised row to the
//! node's dtype before rotating it, where the unfused norm stored it.
//!
//! Made only when every value from N to the update's operand has no reader but the next piece
//! (N only its slices) and none is a function result, so nothing else needs the normalised rows
//! (in an expanded-attention prefill they would feed `kv_b_proj`; there the update reads the
//! cache back instead, so nothing is lost). The rope, the slices, the concat and the norm go,
//! and so do the two column slices a tail fusion leaves unread.
//!
//! The tail: when the norm reads `slice(X, 0..D)` of the last axis of `X [n, C]` and another
//! `cache.update` (same positions, slot and batching) writes `slice(X, D..C)`, the fused node
//! reads X and writes that update's state too, as its output 1; the other update goes. Not done
//! when the norm's weight or bias depends on that update (the fused node would be on a cycle).
//!
//! Names: the fused node takes the name of the update it replaces (its output 0 is that value);
//! the tail update's name goes, as the add's does in `add.rmsnorm`.
//!
//! On GLM-5, after `fuse-elementwise` rotated `k_pe` in the attention-input projection, every
//! layer's `kv_a_layernorm` → `cache.c_kv` and `cache.k_pe` become one node (3 launches → 1),
//! and the indexer's `k_norm` → `rope k_pe` → `concat k` → `indexer.cache.k` another (4 → 1),
//! in decode and prefill alike.

use glmc_ir::{Function, Module, NodeIndex, Op, RopeSpan, Value};
use petgraph::algo::has_path_connecting;

use crate::pass::{Pass, PassError};

pub struct FuseCacheUpdate;

const NAME: &str = "fuse-cache-update";

impl Pass for FuseCacheUpdate {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, module: &mut Module) -> Result<bool, PassError> {
        let mut changed = false;
        for f in &mut module.functions {
            let updates: Vec<NodeIndex> = f
                .canonical_order()
                .into_iter()
                .filter(|&n| matches!(f.node(n).op, Op::CacheUpdate { .. }))
                .collect();
            for update in updates {
                // A tail update fused into an earlier node is gone.
                if !f.graph.contains_node(update) {
                    continue;
                }
                if let Some(plan) = plan(f, update) {
                    fuse(f, plan);
                    changed = true;
                }
            }
        }
        Ok(changed)
    }
}

/// One rewrite: the update of normalised rows, how they are made, and the optional tail.
struct Plan {
    update: NodeIndex,
    norm: NodeIndex,
    /// The slices, the rope and the concat between the norm and the update.
    between: Vec<NodeIndex>,
    rope: Option<RopeSpan>,
    tail: Option<Tail>,
}

struct Tail {
    update: NodeIndex,
    /// The value whose columns `0..D` the norm reads and `D..` the tail update writes.
    whole: Value,
}

/// A piece of the new rows: columns `start..end` of norm `norm`'s output, rotated by `rope`.
struct Piece {
    norm: NodeIndex,
    start: u64,
    end: u64,
    rope: Option<(NodeIndex, RopeSpan)>,
    /// The piece's nodes after the norm (slice, rope).
    nodes: Vec<NodeIndex>,
}

fn is_result(f: &Function, v: Value) -> bool {
    f.results.iter().any(|(_, r)| *r == v)
}

/// Whether `v` is read by `reader` alone and is no result.
fn only_read_by(f: &Function, v: Value, reader: NodeIndex) -> bool {
    f.users(v).iter().all(|&(u, _)| u == reader) && !is_result(f, v)
}

fn is_norm(op: &Op) -> bool {
    matches!(op, Op::RmsNorm { .. } | Op::LayerNorm { .. })
}

/// The norm's width D when its output is `[n, D]` with D constant.
fn norm_width(f: &Function, norm: NodeIndex) -> Option<u64> {
    let ty = &f.node(norm).outputs[0];
    (ty.rank() == 2).then(|| ty.shape[1].as_const())?
}

/// `start..end` when node `n` slices the last axis of a rank-2 value.
fn column_slice(f: &Function, n: NodeIndex) -> Option<(Value, u64, u64)> {
    let Op::Slice {
        axis: 1,
        start,
        end,
    } = f.node(n).op
    else {
        return None;
    };
    let of = f.operands(n)[0];
    (f.value_type(of).rank() == 2).then_some((of, start, end))
}

/// `v` as a piece of a norm's output, read at `positions` if rotated.
fn piece(f: &Function, v: Value, positions: Value) -> Option<Piece> {
    let node = f.node(v.node);
    if is_norm(&node.op) {
        let d = norm_width(f, v.node)?;
        return Some(Piece {
            norm: v.node,
            start: 0,
            end: d,
            rope: None,
            nodes: Vec::new(),
        });
    }
    match node.op {
        Op::Slice { .. } => {
            let (of, start, end) = column_slice(f, v.node)?;
            if !is_norm(&f.node(of.node).op) || f.users(v).len() != 1 || is_result(f, v) {
                return None;
            }
            Some(Piece {
                norm: of.node,
                start,
                end,
                rope: None,
                nodes: vec![v.node],
            })
        }
        Op::Rope { interleaved, theta } => {
            let [inner, at] = f.operands(v.node)[..] else {
                return None;
            };
            if at != positions || !only_read_by(f, inner, v.node) {
                return None;
            }
            let mut p = piece(f, inner, positions)?;
            if p.rope.is_some() {
                return None;
            }
            let span = RopeSpan {
                start: p.start,
                end: p.end,
                interleaved,
                theta,
            };
            p.rope = Some((v.node, span));
            p.nodes.push(v.node);
            Some(p)
        }
        _ => None,
    }
}

fn plan(f: &Function, update: NodeIndex) -> Option<Plan> {
    let operands = f.operands(update);
    let (new, positions) = (operands[0], operands[1]);
    if !only_read_by(f, new, update) {
        return None;
    }
    let mut between = Vec::new();
    let parts = match f.node(new.node).op {
        Op::Concat { axis: 1 } if f.value_type(new).rank() == 2 => {
            between.push(new.node);
            let parts = f.operands(new.node);
            if !parts.iter().all(|&v| only_read_by(f, v, new.node)) {
                return None;
            }
            parts
        }
        _ => vec![new],
    };
    let pieces: Vec<Piece> = parts
        .iter()
        .map(|&v| piece(f, v, positions))
        .collect::<Option<_>>()?;
    let norm = pieces[0].norm;
    let d = norm_width(f, norm)?;
    // The pieces cover the norm's columns in order, at most one rotated.
    let mut at = 0;
    for p in &pieces {
        if p.norm != norm || p.start != at {
            return None;
        }
        at = p.end;
    }
    let mut rotated = pieces.iter().filter_map(|p| p.rope.as_ref());
    let rope = rotated.next().map(|(_, span)| span.clone());
    if at != d || rotated.next().is_some() {
        return None;
    }
    // The norm's output is read by the pieces alone.
    let firsts: Vec<NodeIndex> = pieces
        .iter()
        .map(|p| p.nodes.first().copied().unwrap_or(update))
        .collect();
    let users = f.users(norm.into());
    if is_result(f, norm.into())
        || users.len() != firsts.len()
        || !users.iter().all(|(u, _)| firsts.contains(u))
    {
        return None;
    }
    between.extend(pieces.into_iter().flat_map(|p| p.nodes));
    let tail = tail(f, update, norm, d);
    Some(Plan {
        update,
        norm,
        between,
        rope,
        tail,
    })
}

/// The `cache.update` writing the columns of the norm's input's source right after it.
fn tail(f: &Function, update: NodeIndex, norm: NodeIndex, d: u64) -> Option<Tail> {
    let input = f.operands(norm)[0];
    let (whole, 0, end) = column_slice(f, input.node)? else {
        return None;
    };
    let cols = f.value_type(whole).shape[1].as_const()?;
    if end != d || cols <= d {
        return None;
    }
    let rest = f.operands(update)[1..].to_vec();
    let params = &f.operands(norm)[1..];
    f.users(whole).into_iter().find_map(|(slice, _)| {
        if column_slice(f, slice)? != (whole, d, cols) {
            return None;
        }
        f.users(slice.into()).into_iter().find_map(|(other, k)| {
            let same_kind = f.node(other).op.batched_cache() == f.node(update).op.batched_cache();
            let cycle = params
                .iter()
                .any(|w| has_path_connecting(&f.graph, other, w.node, None));
            let fits = matches!(f.node(other).op, Op::CacheUpdate { .. })
                && k == 0
                && other != update
                && same_kind
                && f.operands(other)[1..] == rest[..]
                && !cycle;
            fits.then_some(Tail {
                update: other,
                whole,
            })
        })
    })
}

fn fuse(f: &mut Function, plan: Plan) {
    let Plan {
        update,
        norm,
        between,
        rope,
        tail,
    } = plan;
    let (layernorm, eps) = match f.node(norm).op {
        Op::RmsNorm { eps } => (false, eps),
        Op::LayerNorm { eps } => (true, eps),
        _ => unreachable!("plan picks norms"),
    };
    let batched = f.node(update).op.batched_cache();
    let norm_operands = f.operands(norm);
    let update_operands = f.operands(update);
    let x = tail.as_ref().map_or(norm_operands[0], |t| t.whole);
    let mut operands = vec![x];
    operands.extend(&norm_operands[1..]);
    operands.extend(&update_operands[1..]);
    let mut states = f.node(update).op.cache_states().to_vec();
    let mut outputs = f.node(update).outputs.clone();
    if let Some(t) = &tail {
        states.extend(f.node(t.update).op.cache_states().iter().cloned());
        outputs.extend(f.node(t.update).outputs.iter().cloned());
    }
    let op = Op::CacheUpdateNorm {
        batched,
        eps,
        layernorm,
        rope,
        states,
    };
    let name = f.node(update).name.clone();
    let fused = f.add_node(op, format!("{name}#fusing"), &operands, outputs);
    f.replace_all_uses(update.into(), fused.into());
    f.graph.remove_node(update);
    // With a tail, the slices the norm and the tail update read are views nobody else may read.
    let mut views = Vec::new();
    if let Some(t) = tail {
        views.push(norm_operands[0]);
        views.push(f.operands(t.update)[0]);
        f.replace_all_uses(
            t.update.into(),
            Value {
                node: fused,
                output: 1,
            },
        );
        f.graph.remove_node(t.update);
    }
    for n in between.into_iter().rev() {
        f.graph.remove_node(n);
    }
    f.graph.remove_node(norm);
    for v in views {
        if f.users(v).is_empty() && !is_result(f, v) {
            f.graph.remove_node(v.node);
        }
    }
    f.graph[fused].name = name;
}
