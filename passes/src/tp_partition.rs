//! `tp-partition`: rank R's graph of a tensor-parallel group of N ranks, from the optimised
//! module, laid out as vLLM lays out GLM-5 (GLM5-SPEC §4):
//!
//! | weights | split | after it |
//! |---|---|---|
//! | `q_b_proj`, `kv_b_proj` (and W_UKᵀ, W_UV made from it) | rows, by heads | H/N heads per rank |
//! | `o_proj` | columns (its input, the heads) | `all_reduce` |
//! | dense `gate_proj`/`up_proj`, `down_proj` | rows; columns | `all_reduce` |
//! | their fusion `[gate_proj;up_proj]` (`fuse-mlp-projections`) | each part by rows | this rank's rows of each part, `tp=stacked`, then the two slices take `0..I/N` and `I/N..2I/N` |
//! | routed experts' `gate_proj`/`up_proj`, `down_proj` | their intermediate dimension | partial sum |
//! | shared expert's `gate_proj`/`up_proj`, `down_proj` | rows; columns | partial sum, added to the experts' before one `all_reduce` |
//! | `embed_tokens` | rows (vocab) | `embed.shard` (masked lookup), `all_reduce` |
//! | `lm_head` | rows (vocab) | `all_gather` of the logits |
//!
//! The fused MLP weight `[gate; up]` becomes `[gate block; up block]` on a rank, which is no
//! block of the single-device value (`Shard::Stacked`, which traces skip); the two slices of
//! the GEMM's output are rewritten to take this rank's half each, and from them on every value
//! is the unfused graph's block again.
//!
//! Everything else is replicated: the fused q_a/kv_a projection, its norms, the latent KV cache,
//! the whole indexer (every rank computes the same top-k from the same inputs) and the router.
//!
//! The split is a property of the weights: a weight's recipe gets a `slice` of each checkpoint
//! tensor it reads (so a rank reads only its shard), and the activations follow by type
//! inference. `kv_b_proj` holds each head's `[k_nope | v]` rows contiguously, so a contiguous
//! block of H/N heads is one contiguous block of rows; the per-head reshapes W_UKᵀ/W_UV and the
//! graph's `[.., H, D]` views are head-major, so their head dimension is the one that shrinks.
//!
//! A partial sum (a row-parallel matmul's, the routed experts') stays partial through an `add`
//! of two partial sums (or a `moe.combine` of partial routed rows and shared output) and is
//! reduced right before anything else reads it, so the MoE block reduces once. The node that computes the whole value keeps the original name (the
//! `all_reduce`, the `all_gather`), so a rank's trace lines up with the single-device trace;
//! the node that computes this rank's part is renamed `NAME.partial` or `NAME.shard`.

use std::collections::{HashMap, HashSet};

use glmc_ir::verify::infer;
use glmc_ir::{Dim, Function, Module, NodeIndex, Op, Recipe, Reduce, Shard, TensorType, Tp, Value};

use crate::manager::PassManager;
use crate::pass::{Pass, PassError};

const NAME: &str = "tp-partition";

pub struct TpPartition {
    pub tp: Tp,
}

/// The config size whose division by the TP degree a split needs, named as `config.json`
/// names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Size {
    Heads,
    Intermediate,
    SharedIntermediate,
    MoeIntermediate,
    Vocab,
}

impl Size {
    fn field(self) -> &'static str {
        match self {
            Size::Heads => "num_attention_heads",
            Size::Intermediate => "intermediate_size",
            Size::SharedIntermediate => "moe_intermediate_size × n_shared_experts",
            Size::MoeIntermediate => "moe_intermediate_size",
            Size::Vocab => "vocab_size",
        }
    }
}

/// How a checkpoint tensor is split: along `axis` of the tensor, for `size`.
#[derive(Clone, Copy, Debug)]
struct Split {
    axis: usize,
    size: Size,
}

/// The split of checkpoint tensor `name` (a stack's pattern for the routed experts); `None`
/// for a replicated tensor.
fn split_of(name: &str) -> Option<Split> {
    let split = |axis, size| Some(Split { axis, size });
    match name {
        "model.embed_tokens.weight" | "lm_head.weight" => return split(0, Size::Vocab),
        _ => {}
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (_, key) = rest.split_once('.')?;
    match key {
        "self_attn.q_b_proj.weight" | "self_attn.kv_b_proj.weight" => split(0, Size::Heads),
        "self_attn.o_proj.weight" => split(1, Size::Heads),
        "mlp.gate_proj.weight" | "mlp.up_proj.weight" => split(0, Size::Intermediate),
        "mlp.down_proj.weight" => split(1, Size::Intermediate),
        "mlp.shared_experts.gate_proj.weight" | "mlp.shared_experts.up_proj.weight" => {
            split(0, Size::SharedIntermediate)
        }
        "mlp.shared_experts.down_proj.weight" => split(1, Size::SharedIntermediate),
        // Stacked [E, I, D] and [E, D, I]: the member's axis, plus the stacking axis.
        "mlp.experts.{e}.gate_proj.weight" | "mlp.experts.{e}.up_proj.weight" => {
            split(1, Size::MoeIntermediate)
        }
        "mlp.experts.{e}.down_proj.weight" => split(2, Size::MoeIntermediate),
        _ => None,
    }
}

impl Pass for TpPartition {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, module: &mut Module) -> Result<bool, PassError> {
        let Tp { degree, rank } = self.tp;
        if degree == 0 || rank >= degree {
            return Err(options(format!(
                "rank {rank} of {degree} ranks: the rank must be below the TP degree"
            )));
        }
        if !module.tp.is_single() {
            return Err(options(format!(
                "the module is already rank {} of {}",
                module.tp.rank, module.tp.degree
            )));
        }
        if degree == 1 {
            return Ok(false);
        }
        check_divisible(module, degree)?;
        for f in &mut module.functions {
            Partition::new(f, self.tp).run()?;
        }
        module.tp = self.tp;
        Ok(true)
    }
}

fn options(message: String) -> PassError {
    PassError::Options {
        pass: NAME,
        message,
    }
}

/// Every size a split divides must be a multiple of the TP degree; the error names the config
/// field, its value and the degree.
fn check_divisible(module: &Module, degree: u64) -> Result<(), PassError> {
    let mut sizes = split_sizes(module);
    // Heads first: the split engines most often get wrong, and the one users ask about.
    sizes.sort_by_key(|(size, _, _)| *size != Size::Heads);
    match sizes.into_iter().find(|(_, n, _)| n % degree != 0) {
        None => Ok(()),
        Some((size, n, at)) => Err(options(format!(
            "{} {n} is not divisible by the TP degree {degree} (at \"{at}\"); pick a degree that \
             divides the number of heads, the intermediate sizes and the vocabulary",
            size.field()
        ))),
    }
}

/// Every size a split divides, with the node or tensor it was read from.
fn split_sizes(module: &Module) -> Vec<(Size, u64, String)> {
    let mut sizes: Vec<(Size, u64, String)> = Vec::new();
    for f in &module.functions {
        for n in f.graph.node_indices() {
            let node = f.node(n);
            match &node.op {
                Op::MlaAttend { .. } | Op::MlaAttendAbsorbed { .. } => {
                    let q = f.value_type(f.operands(n)[0]);
                    if let Some(h) = q.shape[1].as_const() {
                        sizes.push((Size::Heads, h, node.name.clone()));
                    }
                }
                Op::Weight { recipe } => {
                    for (leaf, shape) in leaves_with_patterns(recipe) {
                        if let Some(split) = split_of(&leaf) {
                            if split.size != Size::Heads {
                                sizes.push((split.size, shape[split.axis], leaf));
                            }
                        }
                    }
                }
                _ => {}
            }
        }
    }
    sizes
}

/// A recipe's leaves with a stack's pattern and stacked shape as one leaf, since a stack is
/// split along one of its stacked axes.
fn leaves_with_patterns(recipe: &Recipe) -> Vec<(String, Vec<u64>)> {
    match recipe {
        Recipe::Tensor { name, shape } => vec![(name.clone(), shape.clone())],
        Recipe::Stack { pattern, .. } => {
            vec![(pattern.clone(), recipe.shape().unwrap_or_default())]
        }
        Recipe::Slice { src, .. } | Recipe::Reshape { src, .. } | Recipe::Transpose { src, .. } => {
            leaves_with_patterns(src)
        }
        Recipe::Concat { parts, .. } => parts.iter().flat_map(leaves_with_patterns).collect(),
    }
}

/// What a rank holds of a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held {
    /// Its own part of a sum over the ranks.
    Partial,
    /// Its block of a vocabulary split along the last axis, to be gathered.
    VocabShard,
}

/// The rewrite of one function.
struct Partition<'f> {
    f: &'f mut Function,
    tp: Tp,
    /// Weight nodes whose recipe was split, with the axis of their value that shrank and why.
    split_weights: HashMap<NodeIndex, (usize, Size)>,
    /// Values this rank holds block `rank` of each part of (`Shard::Stacked`): the axis, and the
    /// number of equal parts along it.
    stacked: HashMap<Value, (usize, u64)>,
    held: HashMap<Value, Held>,
    /// A partial sum → its `all_reduce`.
    reduced: HashMap<Value, Value>,
    /// Nodes whose output types changed: their readers are re-inferred.
    retyped: HashSet<NodeIndex>,
}

impl<'f> Partition<'f> {
    fn new(f: &'f mut Function, tp: Tp) -> Partition<'f> {
        Partition {
            f,
            tp,
            split_weights: HashMap::new(),
            stacked: HashMap::new(),
            held: HashMap::new(),
            reduced: HashMap::new(),
            retyped: HashSet::new(),
        }
    }

    fn fail(&self, n: NodeIndex, message: String) -> PassError {
        PassError::Rewrite {
            pass: NAME,
            function: self.f.name.clone(),
            node: self.f.node(n).name.clone(),
            message,
        }
    }

    fn run(mut self) -> Result<(), PassError> {
        for n in self.f.canonical_order() {
            match self.f.node(n).op.clone() {
                Op::Input { .. } => {}
                Op::Weight { recipe } => self.weight(n, &recipe)?,
                op => self.compute(n, op)?,
            }
        }
        let results: Vec<(usize, Value)> = self
            .f
            .results
            .iter()
            .enumerate()
            .map(|(i, (_, v))| (i, *v))
            .collect();
        for (i, v) in results {
            if self.stacked.contains_key(&v) {
                return Err(self.fail(
                    v.node,
                    "a function result holds a stacked weight's product, which no collective \
                     makes whole"
                        .into(),
                ));
            }
            let whole = self.whole(v)?;
            self.f.results[i].1 = whole;
        }
        Ok(())
    }

    fn weight(&mut self, n: NodeIndex, recipe: &Recipe) -> Result<(), PassError> {
        if let Recipe::Concat { axis, parts } = recipe {
            return self.stacked_weight(n, *axis, parts);
        }
        let Some((sharded, size)) = self.shard(recipe).map_err(|m| self.fail(n, m))? else {
            return Ok(());
        };
        let (old, new) = (
            recipe.shape().map_err(|e| self.fail(n, e.to_string()))?,
            sharded.shape().map_err(|e| self.fail(n, e.to_string()))?,
        );
        let axis = (0..old.len())
            .find(|&a| old[a] != new[a])
            .expect("a split recipe changes one axis");
        let node = &mut self.f.graph[n];
        node.outputs[0] = node.outputs[0].with_shape(new.into_iter().map(Dim::Const).collect());
        node.op = Op::Weight { recipe: sharded };
        node.shard = Some(Shard::Split { axis: axis as u32 });
        self.split_weights.insert(n, (axis, size));
        self.retyped.insert(n);
        Ok(())
    }

    /// A fused weight, `concat` of `parts` along `axis`: replicated when no part is split, else
    /// each part must be split along `axis` into blocks of one size, and this rank's weight is
    /// its block of each part, in order (`Shard::Stacked`), as `fuse-mlp-projections` stacks
    /// the gate and up projections, each split by rows.
    fn stacked_weight(
        &mut self,
        n: NodeIndex,
        axis: u64,
        parts: &[Recipe],
    ) -> Result<(), PassError> {
        let fail = |p: &Self, m: String| p.fail(n, m);
        let sharded: Vec<Option<(Recipe, Size)>> = parts
            .iter()
            .map(|p| self.shard(p))
            .collect::<Result<_, _>>()
            .map_err(|m| fail(self, m))?;
        if sharded.iter().all(Option::is_none) {
            return Ok(());
        }
        let name_of = |p: &Recipe| {
            p.leaves()
                .first()
                .map(|(name, _)| name.clone())
                .unwrap_or_default()
        };
        let mut blocks = Vec::new();
        let mut whole_rows = HashSet::new();
        for (part, s) in parts.iter().zip(&sharded) {
            let Some((block, _)) = s else {
                return Err(fail(
                    self,
                    format!(
                        "a fused weight concatenates {:?}, which tensor parallelism does not \
                         split, with tensors it splits; tp-partition cannot split such a weight",
                        name_of(part)
                    ),
                ));
            };
            let (before, after) = (
                shape(part).map_err(|m| fail(self, m))?,
                shape(block).map_err(|m| fail(self, m))?,
            );
            let a = axis as usize;
            let along_axis = (0..before.len()).all(|i| (before[i] == after[i]) == (i != a));
            if !along_axis {
                return Err(fail(
                    self,
                    format!(
                        "a fused weight concatenates {:?} along axis {axis}, and tensor \
                         parallelism splits it along another axis; tp-partition cannot split \
                         such a weight",
                        name_of(part)
                    ),
                ));
            }
            whole_rows.insert(before[a]);
            blocks.push(block.clone());
        }
        if whole_rows.len() != 1 {
            return Err(fail(
                self,
                format!(
                    "a fused weight concatenates parts of different sizes {whole_rows:?} along \
                     axis {axis}; tp-partition splits only equal parts"
                ),
            ));
        }
        let recipe = Recipe::Concat {
            axis,
            parts: blocks,
        };
        let new = shape(&recipe).map_err(|m| fail(self, m))?;
        let node = &mut self.f.graph[n];
        node.outputs[0] = node.outputs[0].with_shape(new.into_iter().map(Dim::Const).collect());
        node.op = Op::Weight { recipe };
        node.shard = Some(Shard::Stacked {
            axis: axis as u32,
            parts: parts.len() as u32,
        });
        self.stacked
            .insert(n.into(), (axis as usize, parts.len() as u64));
        self.retyped.insert(n);
        Ok(())
    }

    /// This rank's recipe, and the size it splits; `None` when the recipe is replicated.
    fn shard(&self, recipe: &Recipe) -> Result<Option<(Recipe, Size)>, String> {
        let Tp { degree, rank } = self.tp;
        match recipe {
            Recipe::Tensor { name, shape } => Ok(split_of(name).map(|s| {
                let block = shape[s.axis] / degree;
                let r = recipe
                    .clone()
                    .slice(s.axis as u64, rank * block, (rank + 1) * block);
                (r, s.size)
            })),
            Recipe::Stack { pattern, .. } => Ok(split_of(pattern).map(|s| {
                let block = recipe.shape().expect("checked by the verifier")[s.axis] / degree;
                let r = recipe
                    .clone()
                    .slice(s.axis as u64, rank * block, (rank + 1) * block);
                (r, s.size)
            })),
            Recipe::Slice {
                src,
                axis,
                start,
                end,
            } => {
                let Some((inner, size)) = self.shard(src)? else {
                    return Ok(None);
                };
                let (before, after) = (shape(src)?, shape(&inner)?);
                if before[*axis as usize] != after[*axis as usize] {
                    return Err(format!(
                        "a recipe slices axis {axis} of {before:?}, the axis tensor parallelism \
                         splits; tp-partition cannot split such a weight"
                    ));
                }
                Ok(Some((inner.slice(*axis, *start, *end), size)))
            }
            Recipe::Reshape { src, shape: to } => {
                let Some((inner, size)) = self.shard(src)? else {
                    return Ok(None);
                };
                // Head-major (and expert-major) layouts: the outermost axis that divides is the
                // one split into blocks.
                let mut to = to.clone();
                let Some(d) = to.iter_mut().find(|d| **d % degree == 0) else {
                    return Err(format!(
                        "no axis of the reshape to {to:?} divides by the TP degree {degree}"
                    ));
                };
                *d /= degree;
                let r = inner.reshape(to);
                shape(&r)?;
                Ok(Some((r, size)))
            }
            Recipe::Transpose { src, perm } => Ok(self
                .shard(src)?
                .map(|(inner, size)| (inner.transpose(perm.clone()), size))),
            Recipe::Concat { parts, .. } => {
                for p in parts {
                    if self.shard(p)?.is_some() {
                        return Err(format!(
                            "a recipe nests a concat of {:?}, which tensor parallelism splits; \
                             tp-partition splits only a weight's outermost concat",
                            p.leaves()
                                .first()
                                .map(|(name, _)| name.clone())
                                .unwrap_or_default()
                        ));
                    }
                }
                Ok(None)
            }
        }
    }

    /// A computing node: operands made whole where the op needs them whole, the op changed
    /// where it reads a split weight, and its types re-inferred.
    fn compute(&mut self, n: NodeIndex, op: Op) -> Result<(), PassError> {
        let operands = self.f.operands(n);
        let partial = |p: &Self, v: &Value| p.held.get(v) == Some(&Held::Partial);
        let sum_of_partials = op == (Op::Add {}) && operands.iter().all(|v| partial(self, v));
        // `moe.combine` is linear in its routed rows and the shared output together, so partial
        // sums of both give this rank's part of the whole.
        let combine_of_partials = matches!(op, Op::MoeCombine { .. })
            && partial(self, &operands[0])
            && operands.get(3).is_none_or(|v| partial(self, v));
        if !(sum_of_partials || combine_of_partials) {
            for (i, v) in operands.iter().enumerate() {
                let whole = self.whole(*v)?;
                if whole != *v {
                    self.rewire(n, i as u32, *v, whole);
                }
            }
        }
        let split_operand = |i: usize| {
            operands
                .get(i)
                .and_then(|v| self.split_weights.get(&v.node).copied())
        };
        let held = match &op {
            Op::Embed {} if split_operand(0).is_some() => {
                let rows = self.f.value_type(operands[0]).shape[0]
                    .as_const()
                    .expect("a weight's shape is constant");
                self.f.graph[n].op = Op::EmbedShard {
                    start: self.tp.rank * rows,
                };
                Some(Held::Partial)
            }
            Op::Matmul {} | Op::MatmulRope { .. } => match split_operand(1) {
                Some((1, _)) => Some(Held::Partial),
                Some((0, Size::Vocab)) => Some(Held::VocabShard),
                _ => None,
            },
            // A rank's argmax over its vocabulary shard is a local index, and no collective
            // here combines (value, index) pairs: a split build samples with `sample.top_p`.
            Op::MatmulArgmax {} if split_operand(1).is_some() => {
                return Err(self.fail(
                    n,
                    "a greedy build's fused lm_head argmax (`matmul.argmax`) cannot be split by vocabulary; build with the top-p sampler for tensor parallelism".into(),
                ));
            }
            Op::MoeExperts {} if (3..6).any(|i| split_operand(i).is_some()) => Some(Held::Partial),
            Op::MoeDown {} if split_operand(2).is_some() => Some(Held::Partial),
            Op::MoeCombine { .. } if combine_of_partials => Some(Held::Partial),
            Op::Add {} if sum_of_partials => Some(Held::Partial),
            _ => None,
        };
        let stacked = self.stacked_operand(n, &op, &operands)?;
        if operands.iter().any(|v| self.retyped.contains(&v.node)) {
            self.retype(n)?;
        }
        if let Some(parts) = stacked {
            let axis = self.f.node(n).outputs[0].rank() - 1;
            self.f.graph[n].shard = Some(Shard::Stacked {
                axis: axis as u32,
                parts: parts as u32,
            });
            self.stacked.insert(n.into(), (axis, parts));
        }
        if let Some(held) = held {
            let node = &mut self.f.graph[n];
            if held == Held::Partial {
                node.shard = Some(Shard::Partial);
            }
            node.name = match held {
                Held::Partial => format!("{}.partial", node.name),
                Held::VocabShard => format!("{}.shard", node.name),
            };
            self.held.insert(n.into(), held);
        }
        Ok(())
    }

    /// What `n` makes of a stacked operand: a matmul by a weight stacked by rows gives its
    /// output stacked along the last axis (the parts returned); a slice of the last axis that
    /// takes one whole part takes this rank's block of it instead (its bounds rewritten here),
    /// so its output is `Split` like the unfused projection's. Anything else reading a stacked
    /// value is refused.
    fn stacked_operand(
        &mut self,
        n: NodeIndex,
        op: &Op,
        operands: &[Value],
    ) -> Result<Option<u64>, PassError> {
        let Some((i, (axis, parts))) = operands
            .iter()
            .enumerate()
            .find_map(|(i, v)| self.stacked.get(v).map(|s| (i, *s)))
        else {
            return Ok(None);
        };
        let degree = self.tp.degree;
        match op {
            Op::Matmul {} if i == 1 && axis == 0 => Ok(Some(parts)),
            Op::Slice {
                axis: a,
                start,
                end,
            } if *a as usize == axis => {
                let block = self.f.value_type(operands[0]).shape[axis]
                    .as_const()
                    .expect("a stacked value's axis is constant")
                    / parts;
                let part = block * degree;
                if start % part != 0 || end - start != part {
                    return Err(self.fail(
                        n,
                        format!(
                            "slices {start}..{end} of a value stacked from {parts} parts of \
                             {part}; tp-partition splits only a slice of one whole part"
                        ),
                    ));
                }
                let start = start / part * block;
                self.f.graph[n].op = Op::Slice {
                    axis: *a,
                    start,
                    end: start + block,
                };
                Ok(None)
            }
            _ => Err(self.fail(
                n,
                format!(
                    "{} reads \"{}\", of which this rank holds its block of each of {parts} \
                     parts along axis {axis}; tp-partition knows only a matmul by such a weight \
                     and a slice of one part",
                    op.name(),
                    self.f.node(operands[i].node).name
                ),
            )),
        }
    }

    /// `v` as a whole value: itself, or the all_reduce of a partial sum, or the all_gather of a
    /// vocabulary shard (each made once, named as the original node was).
    fn whole(&mut self, v: Value) -> Result<Value, PassError> {
        let Some(held) = self.held.get(&v).copied() else {
            return Ok(v);
        };
        if let Some(w) = self.reduced.get(&v) {
            return Ok(*w);
        }
        let ty = self.f.value_type(v).clone();
        let ranks = self.tp.degree;
        let op = match held {
            Held::Partial => Op::AllReduce {
                op: Reduce::Sum,
                ranks,
            },
            Held::VocabShard => Op::AllGather {
                axis: ty.rank() as u64 - 1,
                ranks,
            },
        };
        let name = self.f.node(v.node).name.clone();
        let name = name
            .strip_suffix(".partial")
            .or_else(|| name.strip_suffix(".shard"))
            .unwrap_or(&name)
            .to_string();
        let w: Value = self
            .f
            .push(op, name, &[v])
            .map_err(|e| PassError::verify(NAME, e))?
            .into();
        self.reduced.insert(v, w);
        Ok(w)
    }

    /// Operand `index` of `n` reads `to` instead of `from`.
    fn rewire(&mut self, n: NodeIndex, index: u32, from: Value, to: Value) {
        let edge = self
            .f
            .graph
            .edges_connecting(from.node, n)
            .find(|e| e.weight().index == index && e.weight().output == from.output)
            .map(|e| petgraph::visit::EdgeRef::id(&e))
            .expect("the operand edge exists");
        self.f.graph.remove_edge(edge);
        self.f.graph.add_edge(
            to.node,
            n,
            glmc_ir::Operand {
                index,
                output: to.output,
            },
        );
    }

    /// Re-infers `n`'s output types from its (changed) operands. A reshape that splits or
    /// merges heads gets the head count of this rank: its outermost constant axis that divides
    /// by the degree (the graph's head views are head-major).
    fn retype(&mut self, n: NodeIndex) -> Result<(), PassError> {
        let degree = self.tp.degree;
        if let Op::Reshape { shape } = &self.f.node(n).op {
            let mut shape = shape.clone();
            let Some(d) = shape
                .iter_mut()
                .find(|d| d.as_const().is_some_and(|k| k % degree == 0))
            else {
                return Err(self.fail(
                    n,
                    format!("no constant axis of the reshape to {shape:?} divides by {degree}"),
                ));
            };
            *d = Dim::Const(d.as_const().expect("found constant") / degree);
            self.f.graph[n].op = Op::Reshape { shape };
        }
        let node = self.f.node(n);
        let operands = self.f.operands(n);
        let types: Vec<_> = operands.iter().map(|v| self.f.value_type(*v)).collect();
        let outputs = infer(&node.op, &types).map_err(|e| {
            let types: Vec<String> = types.iter().map(ToString::to_string).collect();
            self.fail(
                n,
                format!(
                    "{} of this rank's shards ({}): {e}",
                    node.op.name(),
                    types.join(", ")
                ),
            )
        })?;
        if outputs != node.outputs {
            let axis = split_axis(&node.outputs, &outputs, degree)
                .map_err(|m| self.fail(n, format!("{}: {m}", node.op.name())))?;
            let node = &mut self.f.graph[n];
            node.outputs = outputs;
            node.shard = Some(Shard::Split { axis });
            self.retyped.insert(n);
        }
        Ok(())
    }
}

/// The one axis along which every changed output shrank by `degree`: what makes the rank's
/// value block `rank` of the whole one, which traces rely on.
fn split_axis(whole: &[TensorType], part: &[TensorType], degree: u64) -> Result<u32, String> {
    let mut axis = None;
    for (w, p) in whole.iter().zip(part) {
        let changed: Vec<usize> = (0..w.rank())
            .filter(|&a| w.shape[a] != p.shape[a])
            .collect();
        let found = match changed[..] {
            [a] if w.shape[a]
                .as_const()
                .zip(p.shape[a].as_const())
                .is_some_and(|(w, p)| w == p * degree) =>
            {
                a as u32
            }
            _ => {
                return Err(format!(
                    "{w} became {p} on this rank; tp-partition expects one axis {degree} times \
                     smaller"
                ))
            }
        };
        if axis.is_some_and(|a| a != found) {
            return Err(format!(
                "the outputs split along different axes ({} and {found})",
                axis.unwrap_or_default()
            ));
        }
        axis = Some(found);
    }
    axis.ok_or_else(|| "no output changed".to_string())
}

fn shape(r: &Recipe) -> Result<Vec<u64>, String> {
    r.shape().map_err(|e| e.to_string())
}

/// The module of every rank of a group of `degree`, each verified; `[module]` unchanged for
/// degree 1.
pub fn partition(module: &Module, degree: u64) -> Result<Vec<Module>, PassError> {
    (0..degree.max(1))
        .map(|rank| {
            let mut m = module.clone();
            let mut pm = PassManager::new();
            pm.add(TpPartition {
                tp: Tp { degree, rank },
            });
            pm.run(&mut m)?;
            Ok(m)
        })
        .collect()
}

/// Which values of a whole module some rank of a tensor-parallel group holds only a block of,
/// for a single-device trace that `glmc compare-trace` lines rank traces up with.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SplitLayout {
    /// The greatest common divisor of every size a split divides: every TP degree the model
    /// allows divides it, so a trace that digests each split value in this many blocks (fewer
    /// where the axis is shorter) has a whole number of blocks per rank at any degree.
    pub units: u64,
    /// `(function, node)` → the axis along which each rank holds one block of the node's
    /// outputs. Weights are left out: traces do not record them.
    pub axes: HashMap<(String, String), u32>,
}

/// The [`SplitLayout`] of a whole module: the split axes are those `tp-partition` gives at the
/// smallest degree the model allows (the same at every degree, since each split follows a
/// weight's rows or columns); a model no degree divides has none.
pub fn split_layout(module: &Module) -> Result<SplitLayout, PassError> {
    if !module.tp.is_single() {
        return Err(options(format!(
            "the module is already rank {} of {}; the split layout is read from a whole module",
            module.tp.rank, module.tp.degree
        )));
    }
    let units = split_sizes(module)
        .iter()
        .fold(0, |g, (_, n, _)| gcd(g, *n));
    let Some(degree) = (2..=units).find(|d| units % d == 0) else {
        return Ok(SplitLayout {
            units: 1,
            axes: HashMap::new(),
        });
    };
    let mut rank = module.clone();
    let mut pm = PassManager::new();
    pm.add(TpPartition {
        tp: Tp { degree, rank: 0 },
    });
    pm.run(&mut rank)?;
    let mut axes = HashMap::new();
    for f in &rank.functions {
        for n in f.graph.node_indices() {
            let node = f.node(n);
            if let (Some(Shard::Split { axis }), false) =
                (node.shard, matches!(node.op, Op::Weight { .. }))
            {
                let name = node.name.strip_suffix(".shard").unwrap_or(&node.name);
                axes.insert((f.name.clone(), name.to_string()), axis);
            }
        }
    }
    Ok(SplitLayout { units, axes })
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}
