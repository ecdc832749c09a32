//! Modules, functions and the dataflow graph.

use std::collections::{BTreeMap, HashMap, HashSet};

use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::EdgeRef;
use petgraph::Direction;

use crate::ops::Op;
use crate::verify::{self, VerifyError};
use crate::{DType, Recipe, TensorType};

/// A graph node: an op, a stable semantic name (an HF module or weight path, e.g.
/// `model.layers.3.self_attn.q_a_proj`) and the types of its outputs.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub op: Op,
    pub name: String,
    pub outputs: Vec<TensorType>,
    /// In one rank's graph, how the node's outputs relate to the single-device value
    /// (`tp-partition` sets it); `None` where the rank holds the whole value.
    pub shard: Option<Shard>,
}

/// What a rank of a tensor-parallel group holds of a node's single-device value. Traces read
/// it to line a rank's values up with a single-device trace (`glmc compare-trace`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Shard {
    /// Block `rank` of `degree` equal contiguous blocks along `axis` of every output.
    Split { axis: u32 },
    /// This rank's addend of a sum over the ranks, whole only after an `all_reduce`.
    Partial,
    /// Block `rank` of each of `parts` equal contiguous parts along `axis`, in order: a GEMM over
    /// a stacked weight whose parts are each split by rows (`[gate block; up block]`). No
    /// single-device value holds this block; the slices that take each part are `Split`.
    Stacked { axis: u32, parts: u32 },
}

/// An edge: which operand of the consumer it feeds, from which output of the producer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Operand {
    pub index: u32,
    pub output: u32,
}

/// One output of one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value {
    pub node: NodeIndex,
    pub output: u32,
}

impl From<NodeIndex> for Value {
    fn from(node: NodeIndex) -> Value {
        Value { node, output: 0 }
    }
}

/// An entry function (`prefill`, `decode`): a graph, its arguments (`input` nodes) and its
/// named results.
#[derive(Clone, Debug, Default)]
pub struct Function {
    pub name: String,
    pub graph: StableDiGraph<Node, Operand>,
    pub results: Vec<(String, Value)>,
}

impl Function {
    pub fn new(name: impl Into<String>) -> Function {
        Function {
            name: name.into(),
            ..Default::default()
        }
    }

    pub fn node(&self, n: NodeIndex) -> &Node {
        &self.graph[n]
    }

    pub fn value_type(&self, v: Value) -> &TensorType {
        &self.graph[v.node].outputs[v.output as usize]
    }

    /// Adds a node with declared output types, unchecked; the verifier checks it later. For
    /// parsers and passes that know the types.
    pub fn add_node(
        &mut self,
        op: Op,
        name: impl Into<String>,
        operands: &[Value],
        outputs: Vec<TensorType>,
    ) -> NodeIndex {
        let n = self.graph.add_node(Node {
            op,
            name: name.into(),
            outputs,
            shard: None,
        });
        for (i, v) in operands.iter().enumerate() {
            self.graph.add_edge(
                v.node,
                n,
                Operand {
                    index: i as u32,
                    output: v.output,
                },
            );
        }
        n
    }

    /// Adds a node whose output types are inferred from its operands; a type error names the
    /// node, the op and the operand types.
    pub fn push(
        &mut self,
        op: Op,
        name: impl Into<String>,
        operands: &[Value],
    ) -> Result<NodeIndex, VerifyError> {
        let name = name.into();
        let types: Vec<&TensorType> = operands.iter().map(|v| self.value_type(*v)).collect();
        let outputs = verify::infer(&op, &types)
            .map_err(|message| VerifyError::node(&self.name, &name, &op, &types, message))?;
        Ok(self.add_node(op, name, operands, outputs))
    }

    /// Adds function argument `index` of type `ty`.
    pub fn push_input(&mut self, index: u64, name: impl Into<String>, ty: TensorType) -> Value {
        self.add_node(Op::Input { index }, name, &[], vec![ty])
            .into()
    }

    /// Adds a weight node; its shape is the recipe's.
    pub fn push_weight(
        &mut self,
        name: impl Into<String>,
        recipe: Recipe,
        dtype: DType,
    ) -> Result<Value, VerifyError> {
        let name = name.into();
        let shape = recipe.shape().map_err(|e| VerifyError::Graph {
            function: self.name.clone(),
            message: format!("weight \"{name}\": {e}"),
        })?;
        let ty = TensorType::new(dtype, shape.into_iter().map(Into::into).collect());
        Ok(self
            .add_node(Op::Weight { recipe }, name, &[], vec![ty])
            .into())
    }

    /// The operands of `n`, in operand order.
    pub fn operands(&self, n: NodeIndex) -> Vec<Value> {
        let mut edges: Vec<(u32, Value)> = self
            .graph
            .edges_directed(n, Direction::Incoming)
            .map(|e| {
                (
                    e.weight().index,
                    Value {
                        node: e.source(),
                        output: e.weight().output,
                    },
                )
            })
            .collect();
        edges.sort_by_key(|(i, _)| *i);
        edges.into_iter().map(|(_, v)| v).collect()
    }

    /// Every `(consumer, operand index)` that reads `v`.
    pub fn users(&self, v: Value) -> Vec<(NodeIndex, u32)> {
        let mut users: Vec<(NodeIndex, u32)> = self
            .graph
            .edges_directed(v.node, Direction::Outgoing)
            .filter(|e| e.weight().output == v.output)
            .map(|e| (e.target(), e.weight().index))
            .collect();
        users.sort();
        users
    }

    /// Makes every reader of `from` (nodes and results) read `to` instead.
    pub fn replace_all_uses(&mut self, from: Value, to: Value) {
        let edges: Vec<_> = self
            .graph
            .edges_directed(from.node, Direction::Outgoing)
            .filter(|e| e.weight().output == from.output)
            .map(|e| (e.id(), e.target(), e.weight().index))
            .collect();
        for (id, target, index) in edges {
            self.graph.remove_edge(id);
            self.graph.add_edge(
                to.node,
                target,
                Operand {
                    index,
                    output: to.output,
                },
            );
        }
        for (_, v) in &mut self.results {
            if *v == from {
                *v = to;
            }
        }
    }

    /// `new` takes `old`'s place: every reader of `old`'s output `i` (nodes and results) reads
    /// `new`'s output `i`, `new` takes `old`'s name, and `old` is removed. Passes build the
    /// replacement under a temporary name first, since names are unique.
    pub fn take_over(&mut self, old: NodeIndex, new: NodeIndex) {
        let name = self.graph[old].name.clone();
        for output in 0..self.graph[old].outputs.len() as u32 {
            self.replace_all_uses(Value { node: old, output }, Value { node: new, output });
        }
        self.graph.remove_node(old);
        self.graph[new].name = name;
    }

    /// Replaces node `n` by one with a new op and operands, and `n`'s name and output types.
    pub fn replace_op(&mut self, n: NodeIndex, op: Op, operands: &[Value]) -> NodeIndex {
        let node = &self.graph[n];
        let (name, outputs) = (format!("{}#replacing", node.name), node.outputs.clone());
        let new = self.add_node(op, name, operands, outputs);
        self.take_over(n, new);
        new
    }

    /// The `input` nodes, by argument index.
    /// Adds a copy of `node` (op, name, output types) reading `operands`, and makes each of its
    /// outputs a result, named `out0`, `out1`, …: one node as a function of its own, which is how
    /// a single op is run and compared (the GPU kernel harness, the lowering's executor test).
    pub fn push_alone(&mut self, node: &Node, operands: &[Value]) -> NodeIndex {
        let n = self.add_node(
            node.op.clone(),
            node.name.clone(),
            operands,
            node.outputs.clone(),
        );
        for k in 0..node.outputs.len() {
            self.results.push((
                format!("out{k}"),
                Value {
                    node: n,
                    output: k as u32,
                },
            ));
        }
        n
    }

    pub fn inputs(&self) -> Vec<NodeIndex> {
        let mut inputs: Vec<(u64, NodeIndex)> = self
            .graph
            .node_indices()
            .filter_map(|n| match self.graph[n].op {
                Op::Input { index } => Some((index, n)),
                _ => None,
            })
            .collect();
        inputs.sort();
        inputs.into_iter().map(|(_, n)| n).collect()
    }

    pub fn find(&self, name: &str) -> Option<NodeIndex> {
        self.graph
            .node_indices()
            .find(|&n| self.graph[n].name == name)
    }

    /// A topological order that depends only on the graph's content, never on petgraph indices:
    /// the arguments first, then a depth-first post-order from the results (operands in order),
    /// then whatever the results do not reach, started from in name order. Printed ids come from
    /// this order, so they are stable across runs and across passes that touch other nodes.
    pub fn canonical_order(&self) -> Vec<NodeIndex> {
        let mut order = Vec::with_capacity(self.graph.node_count());
        let mut seen = HashSet::new();
        for n in self.inputs() {
            seen.insert(n);
            order.push(n);
        }
        let mut roots: Vec<NodeIndex> = self.results.iter().map(|(_, v)| v.node).collect();
        let mut rest: Vec<NodeIndex> = self.graph.node_indices().collect();
        rest.sort_by(|a, b| self.graph[*a].name.cmp(&self.graph[*b].name));
        roots.extend(rest);
        for root in roots {
            self.post_order_from(root, &mut seen, &mut order);
        }
        order
    }

    fn post_order_from(
        &self,
        root: NodeIndex,
        seen: &mut HashSet<NodeIndex>,
        order: &mut Vec<NodeIndex>,
    ) {
        if !seen.insert(root) {
            return;
        }
        // Iterative so that a 78-layer model cannot overflow the stack.
        let mut stack = vec![(root, self.operands(root), 0usize)];
        while let Some((n, ops, next)) = stack.last_mut() {
            if let Some(v) = ops.get(*next) {
                *next += 1;
                let m = v.node;
                if seen.insert(m) {
                    let m_ops = self.operands(m);
                    stack.push((m, m_ops, 0));
                }
            } else {
                order.push(*n);
                stack.pop();
            }
        }
    }

    /// Canonical ids: node → position in `canonical_order`.
    pub fn canonical_ids(&self) -> HashMap<NodeIndex, usize> {
        self.canonical_order()
            .into_iter()
            .enumerate()
            .map(|(i, n)| (n, i))
            .collect()
    }
}

/// A compiled unit: cache state declarations and the entry functions.
#[derive(Clone, Debug, Default)]
pub struct Module {
    pub name: String,
    /// Which tensor-parallel rank this module is the graph of.
    pub tp: Tp,
    /// Persistent per-sequence caches, by name, with the type of one token's row.
    pub states: BTreeMap<String, TensorType>,
    pub functions: Vec<Function>,
}

/// A module's place in tensor parallelism: rank `rank` of `degree` ranks. `degree` 1 is the
/// whole model on one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Tp {
    pub degree: u64,
    pub rank: u64,
}

impl Tp {
    pub const SINGLE: Tp = Tp { degree: 1, rank: 0 };

    pub fn is_single(&self) -> bool {
        *self == Tp::SINGLE
    }
}

impl Default for Tp {
    fn default() -> Tp {
        Tp::SINGLE
    }
}

impl Module {
    pub fn new(name: impl Into<String>) -> Module {
        Module {
            name: name.into(),
            ..Default::default()
        }
    }

    pub fn function(&self, name: &str) -> Option<&Function> {
        self.functions.iter().find(|f| f.name == name)
    }

    pub fn function_mut(&mut self, name: &str) -> Option<&mut Function> {
        self.functions.iter_mut().find(|f| f.name == name)
    }
}
