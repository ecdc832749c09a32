//! What `fuse-mla-projections` and `fuse-mlp-projections` share: finding the projections
//! `<prefix>.<member>` that read one input, and replacing such a group by one GEMM over the
//! stacked weight followed by a slice per member, which keeps the member's name (so traces still
//! line up by name). The stacked weight is a `concat` recipe of the checkpoint tensors: the
//! runtime concatenates at load time, the compiler never copies weight data.

use std::collections::BTreeMap;

use glmc_ir::{Function, NodeIndex, Op, Recipe, Value};

/// A projection that can join a group: `matmul(x, weight)` named `<prefix>.<member>` whose
/// weight is read by nothing else.
pub(crate) struct Projection {
    pub matmul: NodeIndex,
    pub weight: NodeIndex,
    /// Its member's index in the stacking order.
    pub order: usize,
}

/// The projections of `f` named `<prefix>.<member>` for a member of `members` and a prefix that
/// `module` accepts, grouped by (prefix, input value), each group in stacking order.
pub(crate) fn groups(
    f: &Function,
    members: &[&str],
    module: impl Fn(&str) -> bool,
) -> BTreeMap<(String, Value), Vec<Projection>> {
    let mut groups: BTreeMap<(String, Value), Vec<Projection>> = BTreeMap::new();
    for n in f.graph.node_indices() {
        let node = f.node(n);
        if node.op != (Op::Matmul {}) {
            continue;
        }
        let Some((prefix, order)) = members.iter().enumerate().find_map(|(i, s)| {
            node.name
                .strip_suffix(s)
                .and_then(|p| p.strip_suffix('.'))
                .filter(|p| module(p))
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

/// Replaces `group` (of `prefix`, in stacking order) by one matmul named
/// `<prefix>.[member;member…]` over the stacked weight, and each member by a last-axis slice of
/// its rows that takes over its readers and its name.
pub(crate) fn stack(
    f: &mut Function,
    prefix: &str,
    members: &[&str],
    group: &[Projection],
) -> Result<(), glmc_ir::VerifyError> {
    let names: Vec<&str> = group.iter().map(|p| members[p.order]).collect();
    let fused_name = format!("{prefix}.[{}]", names.join(";"));
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
