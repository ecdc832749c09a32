//! `absorb-mla`: the absorbed (MQA) form of MLA where it is cheaper.
//!
//! The expanded form multiplies the whole latent cache by `kv_b_proj` on every step to get
//! per-head keys and values. The absorbed form folds `W_UK` into the query and applies `W_UV`
//! after attention, so attention runs over the 576-wide cache entry itself (GLM5-SPEC §3.3):
//!
//! ```text
//! q_abs[h] = W_UK[h]ᵀ · q_nope[h]            (matmul.heads with W_UKᵀ [H, L, P])
//! o_lat    = attend(q_abs|q_pe, c_kv|k_pe)   (mla.attend.absorbed, values = c_kv)
//! o[h]     = W_UV[h] · o_lat[h]               (matmul.heads with W_UV [H, V, L])
//! ```
//!
//! `decode` is always absorbed: one query per sequence cannot amortise expanding the cache.
//! `prefill` is absorbed when attention is sparse (each query reads at most `index_topk` keys,
//! as vLLM's sparse backends do for every token) and stays expanded when dense, where long
//! prefills are cheaper as ordinary multi-head attention. W_UK and W_UV are recipes over
//! `kv_b_proj.weight`; no weight data is copied.

use glmc_ir::{Dim, Function, Module, NodeIndex, Op, Recipe, Value};

use crate::dce::eliminate_dead_code;
use crate::pass::{Pass, PassError};

pub struct AbsorbMla;

const NAME: &str = "absorb-mla";

impl Pass for AbsorbMla {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, module: &mut Module) -> Result<bool, PassError> {
        let mut changed = false;
        for f in &mut module.functions {
            let attends: Vec<NodeIndex> = f
                .graph
                .node_indices()
                .filter(|&n| match f.node(n).op {
                    Op::MlaAttend { sparse, .. } => f.name == "decode" || sparse,
                    _ => false,
                })
                .collect();
            for n in attends {
                absorb(f, n)?;
                changed = true;
            }
        }
        changed |= eliminate_dead_code(module);
        Ok(changed)
    }
}

/// The expanded attention's key/value source: `slice(reshape(matmul(cache, W)))`.
struct Expanded {
    cache: Value,
    recipe: Recipe,
    weight_name: String,
    /// `[H, P + V, L]`.
    heads: u64,
    nope: u64,
    v: u64,
    latent: u64,
}

fn absorb(f: &mut Function, n: NodeIndex) -> Result<(), PassError> {
    let node = f.node(n).clone();
    let fail = |message: String| PassError::Rewrite {
        pass: NAME,
        function: f.name.clone(),
        node: node.name.clone(),
        message,
    };
    let Op::MlaAttend {
        scale,
        sparse,
        dense_until,
    } = node.op
    else {
        unreachable!("filtered by the caller")
    };
    let ops = f.operands(n);
    let (q_nope, q_pe, k_nope, k_pe, positions) = (ops[0], ops[1], ops[2], ops[3], ops[5]);
    let src = expanded_source(f, k_nope).ok_or_else(|| {
        fail(
            "k_nope is not slice(reshape(matmul(latent cache, kv_b_proj))); nothing to absorb"
                .into(),
        )
    })?;
    let Expanded {
        cache,
        recipe,
        weight_name,
        heads,
        nope,
        v,
        latent,
    } = src;
    let per_head = recipe.clone().reshape(vec![heads, nope + v, latent]);
    let dtype = f.value_type(q_nope).dtype;
    let verify = |e| PassError::verify(NAME, e);
    let uk_t = push_weight_once(
        f,
        format!("{weight_name}:uk_t"),
        per_head.clone().slice(1, 0, nope).transpose(vec![0, 2, 1]),
        dtype,
    )
    .map_err(verify)?;
    let uv = push_weight_once(
        f,
        format!("{weight_name}:uv"),
        per_head.slice(1, nope, nope + v),
        dtype,
    )
    .map_err(verify)?;
    let prefix = node
        .name
        .strip_suffix(".attn")
        .unwrap_or(&node.name)
        .to_string();
    let q_abs = f
        .push(
            Op::MatmulHeads {},
            format!("{prefix}.q_absorbed"),
            &[q_nope, uk_t],
        )
        .map_err(verify)?;
    let mut operands = vec![q_abs.into(), q_pe, cache, k_pe, positions];
    operands.extend(ops.get(6).copied());
    let attend = Op::MlaAttendAbsorbed {
        scale,
        sparse,
        dense_until,
    };
    let o_lat = f
        .push(attend, format!("{prefix}.attn_latent"), &operands)
        .map_err(verify)?;
    let out = f
        .push(
            Op::MatmulHeads {},
            format!("{}#absorbed", node.name),
            &[o_lat.into(), uv],
        )
        .map_err(verify)?;
    f.take_over(n, out);
    Ok(())
}

/// Weight nodes are named after their recipe's role; a second attention reading the same
/// `kv_b_proj` (none in GLM-5, but cheap to honour) reuses them.
fn push_weight_once(
    f: &mut Function,
    name: String,
    recipe: Recipe,
    dtype: glmc_ir::DType,
) -> Result<Value, glmc_ir::VerifyError> {
    match f.find(&name) {
        Some(n) => Ok(n.into()),
        None => f.push_weight(name, recipe, dtype),
    }
}

fn expanded_source(f: &Function, k_nope: Value) -> Option<Expanded> {
    let slice = k_nope.node;
    let Op::Slice {
        start: 0,
        end: nope,
        ..
    } = f.node(slice).op
    else {
        return None;
    };
    let reshape = f.operands(slice)[0].node;
    let Op::Reshape { ref shape } = f.node(reshape).op else {
        return None;
    };
    let (heads, width) = match shape[shape.len() - 2..] {
        [Dim::Const(h), Dim::Const(w)] => (h, w),
        _ => return None,
    };
    let matmul = f.operands(reshape)[0].node;
    if f.node(matmul).op != (Op::Matmul {}) {
        return None;
    }
    let [cache, w] = f.operands(matmul)[..] else {
        return None;
    };
    let Op::Weight { ref recipe } = f.node(w.node).op else {
        return None;
    };
    let latent = f.value_type(cache).shape.last()?.as_const()?;
    Some(Expanded {
        cache,
        recipe: recipe.clone(),
        weight_name: f.node(w.node).name.clone(),
        heads,
        nope,
        v: width - nope,
        latent,
    })
}
