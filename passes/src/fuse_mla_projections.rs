//! `fuse-mla-projections`: one GEMM for every projection that reads a layer's normalised
//! hidden state in attention — `q_a_proj`, `kv_a_proj_with_mqa`, and the indexer's `wk` and
//! `weights_proj` where the layer has them (GLM-5: 2048 + 576 + 128 + 32 rows) — followed by a
//! slice per original projection, which keeps the original node's name
//! (`stack_projections.rs`, shared with `fuse-mlp-projections`).

use glmc_ir::{Function, Module, NodeIndex, Op, Recipe};

use crate::pass::{Pass, PassError};
use crate::stack_projections::{groups, stack};

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
            for ((prefix, _), group) in groups(f, &FUSED, |p| p.ends_with("self_attn")) {
                if group.len() >= 2 {
                    stack(f, &prefix, &FUSED, &group)
                        .map_err(|source| PassError::verify(NAME, source))?;
                    changed = true;
                }
            }
        }
        Ok(changed)
    }
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
