//! `fuse-lm-head-argmax`: a greedy build's `lm_head` and argmax become one `matmul.argmax`, so
//! the GPU never writes the logits (GLM-5: 154880 per row) only to read them back for one index.
//!
//! Whether the run is greedy is the build's choice, not this pass's: a build for a greedy run
//! that does not need the logits (`glmc_models::builder::Sampler::Greedy` with
//! `LogitRows::Last`) ends in `sample.argmax` and returns no `logits`, which the dump shows. A
//! build that samples ends in `sample.top_p`, and one that returns the logits reads them as a
//! result; neither matches, so the pass runs in every pipeline and changes only greedy builds.
//!
//! The rewrite: `sample.argmax(L)` where `L` is `P = matmul(x, W)` with `x [n, K]`, or
//! `cast(P)` to f32 (a widening, which keeps every value and so the argmax), becomes
//! `matmul.argmax(x, W)`, which keeps the argmax's name (`next_token`). Made only when `P` (and
//! the cast) has no reader but the next node of the chain and is no function result (anything
//! else still needs the logits), and `x` has W's dtype. The interpreter computes the fused op
//! as `sample.argmax` of `matmul`, so both graphs give the same tokens.

use glmc_ir::{DType, Function, Module, NodeIndex, Op, Value};

use crate::pass::{Pass, PassError};

pub struct FuseLmHeadArgmax;

pub const NAME: &str = "fuse-lm-head-argmax";

impl Pass for FuseLmHeadArgmax {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, module: &mut Module) -> Result<bool, PassError> {
        let mut changed = false;
        for f in &mut module.functions {
            let argmaxes: Vec<NodeIndex> = f
                .canonical_order()
                .into_iter()
                .filter(|&n| f.node(n).op == Op::SampleArgmax {})
                .collect();
            for argmax in argmaxes {
                if let Some(chain) = logits_chain(f, argmax) {
                    let operands = f.operands(chain.matmul);
                    f.replace_op(argmax, Op::MatmulArgmax {}, &operands);
                    for n in chain.dead {
                        f.graph.remove_node(n);
                    }
                    changed = true;
                }
            }
        }
        Ok(changed)
    }
}

/// The matmul an argmax reads (directly or through a widening cast), and the nodes the fusion
/// leaves without readers.
struct Chain {
    matmul: NodeIndex,
    dead: Vec<NodeIndex>,
}

fn logits_chain(f: &Function, argmax: NodeIndex) -> Option<Chain> {
    let [logits] = f.operands(argmax)[..] else {
        return None;
    };
    let only_reader = |v: Value, reader: NodeIndex| {
        !f.results.iter().any(|(_, r)| *r == v)
            && f.users(v).iter().all(|&(n, _)| n == reader)
            && f.node(v.node).outputs.len() == 1
    };
    if !only_reader(logits, argmax) {
        return None;
    }
    let mut dead = vec![logits.node];
    let product = match f.node(logits.node).op {
        Op::Cast { dtype: DType::F32 } => {
            let [p] = f.operands(logits.node)[..] else {
                return None;
            };
            if !f.value_type(p).dtype.is_float() || !only_reader(p, logits.node) {
                return None;
            }
            dead.push(p.node);
            p
        }
        _ => logits,
    };
    let [x, w] = f.operands(product.node)[..] else {
        return None;
    };
    // `matmul.argmax` takes one dtype (a matmul may read x narrower than its weights).
    let plain = f.node(product.node).op == Op::Matmul {}
        && f.value_type(x).rank() == 2
        && f.value_type(x).dtype == f.value_type(w).dtype;
    plain.then_some(Chain {
        matmul: product.node,
        dead,
    })
}
