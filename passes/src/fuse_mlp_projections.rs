//! `fuse-mlp-projections`: one GEMM for an MLP's `gate_proj` and `up_proj`, which read the same
//! input — the dense MLP (`<layer>.mlp`) and each MoE layer's shared expert
//! (`<layer>.mlp.shared_experts`) — over the weight `[gate; up]`, followed by a last-axis slice
//! per projection that keeps the projection's name (so traces still line up by name). The
//! fused GEMM is named `<mlp>.[gate_proj;up_proj]`.
//!
//! Why: at decode two GEMVs of one input are two launches each reading half the bytes, and a
//! small GEMV reaches a smaller fraction of the copy bandwidth than a large one; at prefill the
//! fused N = 2·I tiles better. `fuse-elementwise` still makes `swiglu(gate, up)` of the two
//! slices, which read the fused output in place (strided rows), so nothing is copied.
//!
//! Not applied when the two projections read different values, when either weight has another
//! reader, or when the weights differ in dtype or width. The routed experts' gate/up are one
//! kernel already (`lower-moe`). Like `fuse-mla-projections`, the fused weight is a `concat`
//! recipe of the checkpoint tensors, and `tp-partition` splits each part by rows, so a rank
//! holds `[gate block; up block]` and its two slices take the halves (see `Shard::Stacked`).

use std::collections::BTreeMap;

use glmc_ir::{Function, Module, NodeIndex, Op, Recipe, Value};

use crate::pass::{Pass, PassError};

pub struct FuseMlpProjections;

const NAME: &str = "fuse-mlp-projections";

/// The projections that share an MLP's input, in the order their rows are stacked.
pub const FUSED: [&str; 2] = ["gate_proj", "up_proj"];

impl Pass for FuseMlpProjections {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, module: &mut Module) -> Result<bool, PassError> {
        let mut changed = false;
        for f in &mut module.functions {
            for (prefix, pair) in pairs(f) {
                fuse(f, &prefix, pair).map_err(|source| PassError::verify(NAME, source))?;
                changed = true;
            }
        }
        Ok(changed)
    }
}

/// A projection: its `(matmul, weight)`.
type Projection = (NodeIndex, NodeIndex);

/// `[gate, up]`.
type Pair = [Projection; 2];

/// The MLPs of `f` whose gate and up projections can be fused, by name prefix.
fn pairs(f: &Function) -> Vec<(String, Pair)> {
    let mut found: BTreeMap<(String, Value), [Option<Projection>; 2]> = BTreeMap::new();
    for n in f.graph.node_indices() {
        let node = f.node(n);
        if node.op != (Op::Matmul {}) {
            continue;
        }
        let Some((prefix, order)) = FUSED.iter().enumerate().find_map(|(i, s)| {
            node.name
                .strip_suffix(s)
                .and_then(|p| p.strip_suffix('.'))
                .filter(|p| p.ends_with(".mlp") || p.ends_with(".mlp.shared_experts"))
                .map(|p| (p, i))
        }) else {
            continue;
        };
        let [x, w] = f.operands(n)[..] else { continue };
        let weight_only_here =
            matches!(f.node(w.node).op, Op::Weight { .. }) && f.users(w).len() == 1;
        if weight_only_here {
            found.entry((prefix.to_string(), x)).or_default()[order] = Some((n, w.node));
        }
    }
    found
        .into_iter()
        .filter_map(|((prefix, _), pair)| {
            let [Some(gate), Some(up)] = pair else {
                return None;
            };
            let (g, u) = (&f.node(gate.1).outputs[0], &f.node(up.1).outputs[0]);
            (g.dtype == u.dtype && g.shape[1..] == u.shape[1..]).then_some((prefix, [gate, up]))
        })
        .collect()
}

fn fuse(f: &mut Function, prefix: &str, pair: Pair) -> Result<(), glmc_ir::VerifyError> {
    let fused_name = format!("{prefix}.[{}]", FUSED.join(";"));
    let parts: Vec<Recipe> = pair
        .iter()
        .map(|&(_, w)| match &f.node(w).op {
            Op::Weight { recipe } => recipe.clone(),
            _ => unreachable!("paired projections read weight nodes"),
        })
        .collect();
    let dtype = f.node(pair[0].1).outputs[0].dtype;
    let x = f.operands(pair[0].0)[0];
    let w = f.push_weight(
        format!("{fused_name}.weight"),
        Recipe::Concat { axis: 0, parts },
        dtype,
    )?;
    let fused = f.push(Op::Matmul {}, fused_name, &[x, w])?;
    let axis = f.node(fused).outputs[0].rank() as u64 - 1;
    let mut start = 0;
    for (matmul, weight) in pair {
        let rows = f.node(weight).outputs[0].shape[0]
            .as_const()
            .expect("weights have constant shapes");
        let name = f.node(matmul).name.clone();
        f.graph.remove_node(weight);
        let slice = f.push(
            Op::Slice {
                axis,
                start,
                end: start + rows,
            },
            format!("{name}#fused"),
            &[fused.into()],
        )?;
        f.take_over(matmul, slice);
        start += rows;
    }
    Ok(())
}
