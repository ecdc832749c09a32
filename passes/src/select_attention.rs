//! `select-attention`: dense or sparse attention, chosen from the config or the command line
//! and written into the graph, never decided at run time.
//!
//! - `dense` drops the top-k operand of every attention op; the indexer subgraph, its weights
//!   and its key cache then have no reader and are removed.
//! - `sparse` keeps the indexer and states the exactness rule in the graph: a query whose
//!   context holds at most `index_topk` keys selects all of them, so sparse attention equals
//!   dense attention there (`dense_until`), and a kernel may skip the indexer for such rows.
//! - `auto` is sparse when the model has an indexer, dense otherwise.

use glmc_ir::{Module, Op};

use crate::dce::eliminate_dead_code;
use crate::fuse_mla_projections::drop_unread_members;
use crate::pass::{Pass, PassError};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttentionChoice {
    #[default]
    Auto,
    Dense,
    Sparse,
}

pub struct SelectAttention {
    pub choice: AttentionChoice,
}

const NAME: &str = "select-attention";

/// The `index_topk` of the model's indexer, if it has one.
pub fn index_topk(module: &Module) -> Option<u64> {
    module
        .functions
        .iter()
        .flat_map(|f| f.graph.node_weights())
        .find_map(|n| match n.op {
            Op::DsaTopk { k } => Some(k),
            _ => None,
        })
}

impl Pass for SelectAttention {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, module: &mut Module) -> Result<bool, PassError> {
        let topk = index_topk(module);
        let sparse = match (self.choice, topk) {
            (AttentionChoice::Sparse, None) => {
                return Err(PassError::Options {
                    pass: NAME,
                    message: "attention=sparse needs a DSA indexer, and this model has none; use auto or dense".into(),
                })
            }
            (AttentionChoice::Dense, _) | (_, None) => None,
            (_, Some(k)) => Some(k),
        };
        let mut changed = false;
        for f in &mut module.functions {
            let attends: Vec<_> = f
                .graph
                .node_indices()
                .filter(|&n| {
                    matches!(
                        f.node(n).op,
                        Op::MlaAttend { .. } | Op::MlaAttendAbsorbed { .. }
                    )
                })
                .collect();
            for n in attends {
                let node = f.node(n).clone();
                let operands = f.operands(n);
                let op = match (&node.op, sparse) {
                    (
                        Op::MlaAttend {
                            scale,
                            sparse: true,
                            ..
                        },
                        None,
                    ) => Op::MlaAttend {
                        scale: *scale,
                        sparse: false,
                        dense_until: 0,
                    },
                    (
                        Op::MlaAttendAbsorbed {
                            scale,
                            sparse: true,
                            ..
                        },
                        None,
                    ) => Op::MlaAttendAbsorbed {
                        scale: *scale,
                        sparse: false,
                        dense_until: 0,
                    },
                    (
                        Op::MlaAttend {
                            scale,
                            sparse: true,
                            ..
                        },
                        Some(k),
                    ) => Op::MlaAttend {
                        scale: *scale,
                        sparse: true,
                        dense_until: k,
                    },
                    (
                        Op::MlaAttendAbsorbed {
                            scale,
                            sparse: true,
                            ..
                        },
                        Some(k),
                    ) => Op::MlaAttendAbsorbed {
                        scale: *scale,
                        sparse: true,
                        dense_until: k,
                    },
                    _ => continue,
                };
                if op == node.op {
                    continue;
                }
                let keep = if sparse.is_some() {
                    operands.len()
                } else {
                    operands.len() - 1
                };
                f.replace_op(n, op, &operands[..keep]);
                changed = true;
            }
        }
        changed |= eliminate_dead_code(module);
        // A projection fused before this pass may still compute (and load) the indexer's rows.
        for f in &mut module.functions {
            changed |= drop_unread_members(f);
        }
        Ok(changed)
    }
}
