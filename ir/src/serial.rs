//! RON form of a module, for tools that want structured data rather than text. Node ids are the
//! canonical ones, so the RON of a module is as stable as its text dump.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::graph::{Function, Module, Shard, Tp, Value};
use crate::ops::Op;
use crate::TensorType;

#[derive(Serialize, Deserialize)]
struct ModuleRepr {
    name: String,
    /// Absent for a whole (single-rank) module, so those read and print as before.
    #[serde(default, skip_serializing_if = "Tp::is_single")]
    tp: Tp,
    states: BTreeMap<String, TensorType>,
    functions: Vec<FunctionRepr>,
}

#[derive(Serialize, Deserialize)]
struct FunctionRepr {
    name: String,
    nodes: Vec<NodeRepr>,
    /// `(name, node id, output)`.
    results: Vec<(String, usize, u32)>,
}

#[derive(Serialize, Deserialize)]
struct NodeRepr {
    name: String,
    op: Op,
    /// `(node id, output)` per operand.
    operands: Vec<(usize, u32)>,
    outputs: Vec<TensorType>,
    /// Set in a rank's graph only, so whole modules read and print as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shard: Option<Shard>,
}

#[derive(Debug, thiserror::Error)]
pub enum RonError {
    #[error("{0}")]
    Syntax(#[from] ron::error::SpannedError),
    #[error("{0}")]
    Write(#[from] ron::Error),
    #[error("function @{function}: {message}")]
    Graph { function: String, message: String },
}

pub fn to_ron(module: &Module) -> Result<String, RonError> {
    let repr = ModuleRepr {
        name: module.name.clone(),
        tp: module.tp,
        states: module.states.clone(),
        functions: module.functions.iter().map(function_repr).collect(),
    };
    Ok(ron::ser::to_string_pretty(
        &repr,
        ron::ser::PrettyConfig::default(),
    )?)
}

fn function_repr(f: &Function) -> FunctionRepr {
    let order = f.canonical_order();
    let ids: HashMap<_, _> = order.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let nodes = order
        .iter()
        .map(|&n| {
            let node = f.node(n);
            NodeRepr {
                name: node.name.clone(),
                op: node.op.clone(),
                operands: f
                    .operands(n)
                    .iter()
                    .map(|v| (ids[&v.node], v.output))
                    .collect(),
                outputs: node.outputs.clone(),
                shard: node.shard,
            }
        })
        .collect();
    let results = f
        .results
        .iter()
        .map(|(name, v)| (name.clone(), ids[&v.node], v.output))
        .collect();
    FunctionRepr {
        name: f.name.clone(),
        nodes,
        results,
    }
}

pub fn from_ron(text: &str) -> Result<Module, RonError> {
    let repr: ModuleRepr = ron::from_str(text)?;
    let mut module = Module {
        name: repr.name,
        tp: repr.tp,
        states: repr.states,
        functions: Vec::new(),
    };
    for fr in repr.functions {
        let mut f = Function::new(fr.name);
        let mut nodes = Vec::with_capacity(fr.nodes.len());
        let bad = |f: &Function, message: String| RonError::Graph {
            function: f.name.clone(),
            message,
        };
        for (i, nr) in fr.nodes.into_iter().enumerate() {
            let mut operands = Vec::new();
            for (id, output) in nr.operands {
                let node = *nodes.get(id).ok_or_else(|| {
                    bad(
                        &f,
                        format!(
                            "node {i} (\"{}\") reads node {id}, which is not defined before it",
                            nr.name
                        ),
                    )
                })?;
                operands.push(Value { node, output });
            }
            let n = f.add_node(nr.op, nr.name, &operands, nr.outputs);
            f.graph[n].shard = nr.shard;
            nodes.push(n);
        }
        for (name, id, output) in fr.results {
            let node = *nodes.get(id).ok_or_else(|| {
                bad(
                    &f,
                    format!("result \"{name}\" reads node {id}, which does not exist"),
                )
            })?;
            f.results.push((name, Value { node, output }));
        }
        module.functions.push(f);
    }
    Ok(module)
}
