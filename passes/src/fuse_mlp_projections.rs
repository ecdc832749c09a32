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

use glmc_ir::{Function, Module};

use crate::pass::{Pass, PassError};
use crate::stack_projections::{groups, stack, Projection};

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
                stack(f, &prefix, &FUSED, &pair)
                    .map_err(|source| PassError::verify(NAME, source))?;
                changed = true;
            }
        }
        Ok(changed)
    }
}

/// The MLPs of `f` whose gate and up projections can be fused: both present, reading one
/// input, with weights of one dtype and width.
fn pairs(f: &Function) -> Vec<(String, Vec<Projection>)> {
    groups(f, &FUSED, |p| {
        p.ends_with(".mlp") || p.ends_with(".mlp.shared_experts")
    })
    .into_iter()
    .filter_map(|((prefix, _), pair)| {
        let [gate, up] = &pair[..] else {
            return None;
        };
        let (g, u) = (
            &f.node(gate.weight).outputs[0],
            &f.node(up.weight).outputs[0],
        );
        (g.dtype == u.dtype && g.shape[1..] == u.shape[1..]).then_some((prefix, pair))
    })
    .collect()
}
