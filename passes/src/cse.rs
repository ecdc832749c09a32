//! `cse`: merges nodes that compute the same thing from the same operands, weights with the
//! same recipe included. The node that comes first in canonical order keeps its name.

use std::collections::HashMap;

use glmc_ir::{Module, Op, Value};

use crate::pass::{Pass, PassError};

pub struct Cse;

impl Pass for Cse {
    fn name(&self) -> &'static str {
        "cse"
    }

    fn run(&self, module: &mut Module) -> Result<bool, PassError> {
        let mut changed = false;
        for f in &mut module.functions {
            let mut seen: HashMap<(String, Vec<Value>, String), glmc_ir::NodeIndex> =
                HashMap::new();
            for n in f.canonical_order() {
                let node = f.node(n);
                if matches!(node.op, Op::Input { .. }) || node.op.has_side_effect() {
                    continue;
                }
                // Debug text is a faithful key: ops compare by value and print every field.
                let key = (
                    format!("{:?}", node.op),
                    f.operands(n),
                    format!("{:?}", node.outputs),
                );
                match seen.get(&key) {
                    Some(&first) => {
                        for output in 0..node.outputs.len() as u32 {
                            f.replace_all_uses(
                                Value { node: n, output },
                                Value {
                                    node: first,
                                    output,
                                },
                            );
                        }
                        f.graph.remove_node(n);
                        changed = true;
                    }
                    None => {
                        seen.insert(key, n);
                    }
                }
            }
        }
        Ok(changed)
    }
}
