//! A roofline cost model: for every op of a phase at given sizes, the bytes it must move and the
//! FLOPs it must do, and the time that takes on a target (`max(bytes / bandwidth, FLOPs /
//! tensor rate)`). It is a lower bound of what a kernel can reach, and the number each measured
//! kernel is held against.
//!
//! What is counted: every operand read once and every output written once, at its dtype, with
//! these exceptions, which follow what a good kernel reads:
//! - views (`reshape`, `slice`, `slice.last`) and the function's inputs and weights as nodes cost nothing (the
//!   op that reads them pays);
//! - `cache.update` and `cache.update.norm` write only the new rows; the attention and indexer
//!   ops read each cached row from DRAM once per sequence (not once per head or per query: the
//!   rows a step reads stay in L2 while its queries use them), and sparse attention reads at
//!   most the `index_topk` rows each query selects once the context passes `dense_until`;
//! - `moe.experts`, `moe.gate_up` and `moe.down` read the weights of the experts the tokens
//!   select (at most all of them), not the whole stacked tensor.

use glmc_ir::{Function, Op, TensorType};

use crate::expr::{Bindings, Poly};
use crate::target::Target;

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Cost {
    pub bytes: f64,
    pub flops: f64,
}

impl Cost {
    /// Seconds on `target` at its bandwidth and tensor rate.
    pub fn seconds(&self, target: Target) -> f64 {
        let mem = self.bytes / (target.memory_bandwidth_gbs() * 1e9);
        let math = self.flops / (target.mma_bf16_tflops() * 1e12);
        mem.max(math)
    }
}

/// One op's cost.
#[derive(Clone, Debug, PartialEq)]
pub struct OpCost {
    pub node: String,
    pub op: &'static str,
    pub cost: Cost,
}

fn numel(ty: &TensorType, b: &Bindings) -> f64 {
    ty.shape
        .iter()
        .map(|d| Poly::from_dim(d).eval(b).unwrap_or(0) as f64)
        .product()
}

fn bytes(ty: &TensorType, b: &Bindings) -> f64 {
    numel(ty, b) * ty.dtype.size_bytes() as f64
}

fn dim(ty: &TensorType, axis: usize, b: &Bindings) -> f64 {
    Poly::from_dim(&ty.shape[axis]).eval(b).unwrap_or(0) as f64
}

/// Every op of `f` that becomes a kernel, with its cost at `bindings`.
pub fn function_cost(f: &Function, bindings: &Bindings) -> Vec<OpCost> {
    let mut out = Vec::new();
    for n in f.canonical_order() {
        let node = f.node(n);
        let ins: Vec<TensorType> = f
            .operands(n)
            .iter()
            .map(|&v| f.value_type(v).clone())
            .collect();
        let outs = &node.outputs;
        let read: f64 = ins.iter().map(|t| bytes(t, bindings)).sum();
        let written: f64 = outs.iter().map(|t| bytes(t, bindings)).sum();
        let plain = Cost {
            bytes: read + written,
            flops: 0.0,
        };
        let cost = match &node.op {
            Op::Input { .. }
            | Op::Weight { .. }
            | Op::Reshape { .. }
            | Op::Slice { .. }
            | Op::SliceLast {} => continue,
            Op::CacheUpdate { .. } => Cost {
                bytes: 2.0 * bytes(&ins[0], bindings),
                flops: 0.0,
            },
            // x's rows read and written once (normalised, or as the tail), and the norm's
            // weight (and bias).
            Op::CacheUpdateNorm { layernorm, .. } => Cost {
                bytes: 2.0 * bytes(&ins[0], bindings)
                    + ins[1..2 + usize::from(*layernorm)]
                        .iter()
                        .map(|t| bytes(t, bindings))
                        .sum::<f64>(),
                flops: 0.0,
            },
            Op::Embed {} => Cost {
                bytes: 2.0 * written + bytes(&ins[1], bindings),
                flops: 0.0,
            },
            Op::Matmul {} | Op::MatmulRope { .. } => {
                let k = dim(&ins[1], 1, bindings);
                Cost {
                    bytes: read + written,
                    flops: 2.0 * numel(&outs[0], bindings) * k,
                }
            }
            // The product of rows × vocabulary, of which only a token per row is written.
            Op::MatmulArgmax {} => {
                let (rows, n, k) = (
                    dim(&ins[0], 0, bindings),
                    dim(&ins[1], 0, bindings),
                    dim(&ins[1], 1, bindings),
                );
                Cost {
                    bytes: read + written,
                    flops: 2.0 * rows * n * k,
                }
            }
            Op::MatmulHeads {} => {
                let k = dim(&ins[1], 2, bindings);
                Cost {
                    bytes: read + written,
                    flops: 2.0 * numel(&outs[0], bindings) * k,
                }
            }
            Op::MlaAttend {
                sparse,
                dense_until,
                ..
            }
            | Op::MlaAttendAbsorbed {
                sparse,
                dense_until,
                ..
            } => attention(node.op.name(), &ins, outs, *sparse, *dense_until, bindings),
            Op::DsaScore { .. } => {
                let (n, h, d) = (
                    dim(&ins[0], 0, bindings),
                    dim(&ins[0], 1, bindings),
                    dim(&ins[0], 2, bindings),
                );
                let keys = dim(&outs[0], 1, bindings);
                Cost {
                    bytes: read + written,
                    flops: 2.0 * n * h * d * keys,
                }
            }
            Op::MoeExperts {} => {
                let (n, k) = (dim(&ins[1], 0, bindings), dim(&ins[1], 1, bindings));
                let experts = dim(&ins[3], 0, bindings);
                let active = (n * k).min(experts);
                let per_expert: f64 = ins[3..].iter().map(|t| bytes(t, bindings) / experts).sum();
                let inter = dim(&ins[3], 1, bindings);
                let hidden = dim(&ins[3], 2, bindings);
                Cost {
                    bytes: active * per_expert
                        + ins[..3].iter().map(|t| bytes(t, bindings)).sum::<f64>()
                        + written,
                    flops: 2.0 * n * k * 3.0 * inter * hidden,
                }
            }
            // The grouped GEMMs read the weights of the experts with rows (at most all of
            // them), and their routed rows once.
            Op::MoeGateUp {} | Op::MoeDown {} => {
                let first_weight = if node.op == (Op::MoeGateUp {}) { 3 } else { 2 };
                let w = &ins[first_weight];
                let (experts, n, k) = (
                    dim(w, 0, bindings),
                    dim(w, 1, bindings),
                    dim(w, 2, bindings),
                );
                let routed = dim(&outs[0], 0, bindings) * dim(&outs[0], 1, bindings);
                let active = routed.min(experts);
                let weights: f64 = ins[first_weight..]
                    .iter()
                    .map(|t| active * bytes(t, bindings) / experts)
                    .sum();
                let rest: f64 = ins[..first_weight].iter().map(|t| bytes(t, bindings)).sum();
                let mats = (ins.len() - first_weight) as f64;
                Cost {
                    bytes: weights + rest + written,
                    flops: 2.0 * mats * routed * n * k,
                }
            }
            _ => plain,
        };
        out.push(OpCost {
            node: node.name.clone(),
            op: node.op.name(),
            cost,
        });
    }
    out
}

/// MLA attention, expanded or absorbed: the cached rows are read once per sequence (all heads
/// share them); a sparse query past `dense_until` reads only its `index_topk` rows.
fn attention(
    op: &str,
    ins: &[TensorType],
    outs: &[TensorType],
    sparse: bool,
    dense_until: u64,
    b: &Bindings,
) -> Cost {
    let absorbed = op == "mla.attend.absorbed";
    let (n, heads) = (dim(&ins[0], 0, b), dim(&ins[0], 1, b));
    // Key caches: operands 2.. up to the positions; their leading dims are (b,)t.
    let caches = if absorbed { &ins[2..4] } else { &ins[2..5] };
    // A decode cache is `[b, t, ..]`, a prefill one `[t, ..]`.
    let batched = caches[0].rank() == if absorbed { 3 } else { 4 };
    let (sequences, t) = if batched {
        (dim(&caches[0], 0, b), dim(&caches[0], 1, b))
    } else {
        (1.0, dim(&caches[0], 0, b))
    };
    let row_bytes: f64 = caches
        .iter()
        .map(|c| bytes(c, b) / (sequences * t).max(1.0))
        .sum();
    let selected = if sparse && dense_until > 0 {
        (dense_until as f64).min(t)
    } else {
        t
    };
    // Each cached row comes from DRAM at most once per step: the queries of one sequence share
    // it (it stays in L2); a sparse decode query reads only its selected rows.
    let keys_read = if sparse && t > dense_until as f64 {
        (n * selected).min(sequences * t)
    } else {
        sequences * t
    };
    let q_bytes: f64 = ins[..2].iter().map(|x| bytes(x, b)).sum();
    let width: f64 = if absorbed {
        dim(&ins[0], 2, b) + dim(&ins[1], 2, b) + dim(&ins[0], 2, b)
    } else {
        dim(&ins[0], 2, b) + dim(&ins[1], 2, b) + dim(&ins[4], ins[4].rank() - 1, b)
    };
    let keys_per_query = if sparse { selected } else { t };
    Cost {
        bytes: keys_read * row_bytes + q_bytes + outs.iter().map(|o| bytes(o, b)).sum::<f64>(),
        flops: 2.0 * n * heads * keys_per_query * width,
    }
}
