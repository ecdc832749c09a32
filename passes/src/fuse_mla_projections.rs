//! `fuse-mla-projections`: one GEMM for every projection that reads a layer's normalised
//! hidden state in attention — `q_a_proj`, `kv_a_proj_with_mqa`, and the indexer's `wk` and
//! `weights_proj` where the layer has them (GLM-5: 2048 + 576 + 128 + 32 rows) — followed by a
//! slice per original projection, which keeps the original node's name.
//!
//! The fused weight is a `concat` recipe of the checkpoint tensors: the runtime concatenates
//! at load time, the compiler never copies weight data.

use std::collections::BTreeMap;

use glmc_ir::{Function, Module, NodeIndex, Op, Recipe, Value};

use crate::pass::{Pass, PassError};

pub struct FuseMlaProjections;

const NAME: &str = "fuse-mla-projections";

/// The projections that share the attention input, in the order their rows are stacked.
pub const FUSED: [&str; 4] = [
    "q_a_proj",
    "kv_a_proj_with_mqa",
    "indexer.wk",
    "indexer.weights_proj",
];

impl Pass for FuseMlaProjections {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, module: &mut Module) -> Result<bool, PassError> {
        let mut changed = false;
        for f in &mut module.functions {
            for group in groups(f).into_values() {
                if group.len() >= 2 {
                    fuse(f, &group).map_err(|source| PassError::verify(NAME, source))?;
                    changed = true;
                }
            }
        }
        Ok(changed)
    }
}

/// A projection that can join a group: `matmul(x, weight)` named `<attn>.<suffix>` whose
/// weight is read by nothing else.
struct Projection {
    matmul: NodeIndex,
    weight: NodeIndex,
    order: usize,
}

/// Projections grouped by (attention module prefix, input value), each group in stacking order.
fn groups(f: &Function) -> BTreeMap<(String, Value), Vec<Projection>> {
    let mut groups: BTreeMap<(String, Value), Vec<Projection>> = BTreeMap::new();
    for n in f.graph.node_indices() {
        let node = f.node(n);
        if node.op != (Op::Matmul {}) {
            continue;
        }
        let Some((prefix, order)) = FUSED.iter().enumerate().find_map(|(i, s)| {
            node.name
                .strip_suffix(s)
                .and_then(|p| p.strip_suffix('.'))
                .filter(|p| p.ends_with("self_attn"))
                .map(|p| (p, i))
        }) else {
            continue;
        };
        let [x, w] = f.operands(n)[..] else { continue };
        let weight_only_here =
            matches!(f.node(w.node).op, Op::Weight { .. }) && f.users(w).len() == 1;
        if weight_only_here {
            groups
                .entry((prefix.to_string(), x))
                .or_default()
                .push(Projection {
                    matmul: n,
                    weight: w.node,
                    order,
                });
        }
    }
    for group in groups.values_mut() {
        group.sort_by_key(|p| p.order);
    }
    groups
}

fn fuse(f: &mut Function, group: &[Projection]) -> Result<(), glmc_ir::VerifyError> {
    let prefix = {
        let first = &f.node(group[0].matmul).name;
        first[..first.len() - FUSED[group[0].order].len() - 1].to_string()
    };
    let members: Vec<&str> = group.iter().map(|p| FUSED[p.order]).collect();
    let fused_name = format!("{prefix}.[{}]", members.join(";"));
    let parts: Vec<Recipe> = group
        .iter()
        .map(|p| match &f.node(p.weight).op {
            Op::Weight { recipe } => recipe.clone(),
            _ => unreachable!("grouped projections read weight nodes"),
        })
        .collect();
    let dtype = f.node(group[0].weight).outputs[0].dtype;
    let x = f.operands(group[0].matmul)[0];
    let w = f.push_weight(
        format!("{fused_name}.weight"),
        Recipe::Concat { axis: 0, parts },
        dtype,
    )?;
    let fused = f.push(Op::Matmul {}, fused_name, &[x, w])?;
    let axis = f.node(fused).outputs[0].rank() as u64 - 1;
    let mut start = 0;
    for p in group {
        let rows = f.node(p.weight).outputs[0].shape[0]
            .as_const()
            .expect("weights have constant shapes");
        let name = f.node(p.matmul).name.clone();
        f.graph.remove_node(p.weight);
        let slice = f.push(
            Op::Slice {
                axis,
                start,
                end: start + rows,
            },
            format!("{name}#fused"),
            &[fused.into()],
        )?;
        f.take_over(p.matmul, slice);
        start += rows;
    }
    Ok(())
}

/// Drops from every fused projection of `f` the members whose slice nobody reads any more (the
/// indexer's `wk` and `weights_proj` once `select-attention=dense` has removed the indexer),
/// so the GEMM stops computing their rows and the weight recipe stops naming their tensors.
/// The weight, the GEMM and the remaining slices are rewritten in place, keeping their names'
/// form (`<attn>.[kept;members]`). Returns whether anything changed.
pub(crate) fn drop_unread_members(f: &mut Function) -> bool {
    let mut changed = false;
    let gemms: Vec<NodeIndex> = f
        .graph
        .node_indices()
        .filter(|&n| f.node(n).op == (Op::Matmul {}))
        .collect();
    for gemm in gemms {
        changed |= narrow(f, gemm).is_some();
    }
    changed
}

/// Narrows one fused projection; `None` when `gemm` is not one or every member is read.
fn narrow(f: &mut Function, gemm: NodeIndex) -> Option<()> {
    let name = f.node(gemm).name.clone();
    let (prefix, members) = name.strip_suffix(']')?.split_once(".[")?;
    let members: Vec<&str> = members.split(';').collect();
    let [_, w] = f.operands(gemm)[..] else {
        return None;
    };
    let Op::Weight {
        recipe: Recipe::Concat { axis: 0, parts },
    } = f.node(w.node).op.clone()
    else {
        return None;
    };
    if parts.len() != members.len()
        || f.users(w).len() != 1
        || f.node(w.node).name != format!("{name}.weight")
    {
        return None;
    }
    let rows: Vec<u64> = parts
        .iter()
        .map(|p| p.shape().ok().and_then(|s| s.first().copied()))
        .collect::<Option<_>>()?;
    let axis = f.node(gemm).outputs[0].rank() as u64 - 1;
    let slices: Vec<(NodeIndex, u64, u64)> = f
        .users(gemm.into())
        .into_iter()
        .map(|(s, _)| match f.node(s).op {
            Op::Slice {
                axis: a,
                start,
                end,
            } if a == axis => Some((s, start, end)),
            _ => None,
        })
        .collect::<Option<_>>()?;
    // Member i holds rows starts[i]..starts[i] + rows[i]; it is read when a slice overlaps it.
    let starts: Vec<u64> = rows
        .iter()
        .scan(0, |at, r| {
            let s = *at;
            *at += r;
            Some(s)
        })
        .collect();
    let read: Vec<bool> = (0..rows.len())
        .map(|i| {
            let (lo, hi) = (starts[i], starts[i] + rows[i]);
            slices.iter().any(|&(_, s, e)| s < hi && lo < e)
        })
        .collect();
    if read.iter().all(|&r| r) || !read.iter().any(|&r| r) {
        return None;
    }
    // A slice starting at `row` moves down by the rows of the dropped members before it.
    let shift = |row: u64| -> u64 {
        (0..rows.len())
            .filter(|&i| !read[i] && starts[i] + rows[i] <= row)
            .map(|i| rows[i])
            .sum()
    };
    for &(s, start, end) in &slices {
        let by = shift(start);
        f.graph[s].op = Op::Slice {
            axis,
            start: start - by,
            end: end - by,
        };
    }
    let kept: Vec<&str> = (0..rows.len())
        .filter(|&i| read[i])
        .map(|i| members[i])
        .collect();
    let kept_parts: Vec<Recipe> = (0..rows.len())
        .filter(|&i| read[i])
        .map(|i| parts[i].clone())
        .collect();
    let width: u64 = (0..rows.len()).filter(|&i| read[i]).map(|i| rows[i]).sum();
    let new_name = format!("{prefix}.[{}]", kept.join(";"));
    let weight = &mut f.graph[w.node];
    weight.op = Op::Weight {
        recipe: Recipe::Concat {
            axis: 0,
            parts: kept_parts,
        },
    };
    weight.outputs[0].shape[0] = width.into();
    weight.name = format!("{new_name}.weight");
    let node = &mut f.graph[gemm];
    node.outputs[0].shape[axis as usize] = width.into();
    node.name = new_name;
    Some(())
}
