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
                    fuse(f, &group).map_err(|source| PassError::Verify { pass: NAME, source })?;
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
        let old: Value = p.matmul.into();
        let slice = f.push(
            Op::Slice {
                axis,
                start,
                end: start + rows,
            },
            format!("{name}#fused"),
            &[fused.into()],
        )?;
        f.replace_all_uses(old, slice.into());
        f.graph.remove_node(p.matmul);
        f.graph[slice].name = name;
        start += rows;
    }
    Ok(())
}
