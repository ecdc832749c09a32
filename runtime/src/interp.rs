//! The reference interpreter: executes any IR [`Function`] on the CPU, op by op.
//!
//! It interprets the graph and never re-implements the model by hand, so whatever the compiler
//! builds (or a pass rewrites) can be run and compared against. Values are stored as f32 (every
//! float dtype: a `bf16` node only means "the model's dtype") or i64 (every integer dtype);
//! reductions that decide the result's accuracy (norm statistics, dot products, softmax, router,
//! indexer scores, expert sums, sampling probabilities) accumulate in f64. Matmul rows and
//! column tiles, attention (row, head) pairs, indexer rows, experts and sampled rows run in
//! parallel on rayon's global pool; the summation order never depends on the thread count, so results are bit-for-bit reproducible.
//!
//! * [`WeightSource`] supplies weight nodes' values: a [`Checkpoint`] (through its recipe) or a
//!   `HashMap<String, Tensor>` keyed by weight node name. An [`Interpreter`] keeps every
//!   materialized weight, keyed by node name and recipe, across calls.
//! * [`SequenceCache`] holds one sequence's persistent KV state. `prefill` runs for one sequence
//!   (chunked prefill continues at the cache's length); `decode` runs for a batch, row `i` of the
//!   inputs belonging to `caches[i]`.
//! * Symbolic dims bind on first sight (inputs, then every node's outputs) and must keep one size
//!   in a call; every node's result is checked against its declared type, so an inconsistent
//!   graph or a kernel bug is an error naming the node, never a silently wrong value.

mod attention;
mod cache;
mod fused;
mod kernels;
mod moe;
mod sample;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use glmc_ir::{verify_function, DType, Dim, Function, Module, Node, NodeIndex, Op, Recipe, Reduce};
use glmc_ir::{TensorType, Value};

pub use cache::SequenceCache;

use crate::collective::Communicator;
use crate::tensor::Tensor;
use crate::weights::{Checkpoint, WeightError};

/// Positions at or beyond this are rejected unless [`Interpreter::with_max_context`] says else.
pub const DEFAULT_MAX_CONTEXT: usize = 1 << 20;

/// Why a function cannot be run. Node errors name the function, the node, its op and the shapes
/// of its operands.
#[derive(Debug, thiserror::Error)]
pub enum InterpError {
    #[error("@{function}: {message}")]
    Function { function: String, message: String },
    #[error("@{function}: node \"{node}\" ({op} of {operands}): {message}")]
    Node {
        function: String,
        node: String,
        op: &'static str,
        /// The operands as `dtype[dims]`, comma-separated (`no operands` when none).
        operands: String,
        message: String,
    },
    /// A [`WeightSource`] has no tensor for this weight node.
    #[error("weight \"{name}\" is missing from the weight source")]
    MissingWeight { name: String },
    /// A [`Checkpoint`] cannot materialize a weight's recipe.
    #[error("weight \"{name}\": {source}")]
    Checkpoint {
        name: String,
        #[source]
        source: Box<WeightError>,
    },
}

fn fmt_operands(operands: &[Arc<Tensor>]) -> String {
    if operands.is_empty() {
        return "no operands".to_string();
    }
    let shapes: Vec<String> = operands
        .iter()
        .map(|t| format!("{}{:?}", t.dtype(), t.shape()))
        .collect();
    shapes.join(", ")
}

/// Where weight nodes get their values.
pub trait WeightSource {
    /// The value of weight node `name`, made by `recipe`, for a node of `dtype`. The interpreter
    /// checks its shape and rounds its floats to `dtype`; a source that knows the stored
    /// precision rounds them itself, once.
    fn weight(&self, name: &str, recipe: &Recipe, dtype: DType) -> Result<Tensor, InterpError>;
}

impl WeightSource for Checkpoint {
    fn weight(&self, name: &str, recipe: &Recipe, dtype: DType) -> Result<Tensor, InterpError> {
        self.materialize_as(recipe, dtype)
            .map_err(|source| InterpError::Checkpoint {
                name: name.to_string(),
                source: Box::new(source),
            })
    }
}

/// Weights by weight node name (tests, synthetic models); the recipe is ignored.
impl WeightSource for HashMap<String, Tensor> {
    fn weight(&self, name: &str, _recipe: &Recipe, _dtype: DType) -> Result<Tensor, InterpError> {
        self.get(name)
            .cloned()
            .ok_or_else(|| InterpError::MissingWeight {
                name: name.to_string(),
            })
    }
}

/// The per-node tracing hook: called after each executed node with its outputs.
pub type TraceFn<'a> = dyn FnMut(&Node, &[&Tensor]) + 'a;

/// The per-node patch hook of [`Interpreter::run_patched`]: called after each executed node with
/// the node, its operands' values and its outputs (already checked against the declared types).
/// Returning `Some(outputs)` replaces the node's outputs for every later node and for the
/// function's results; `None` keeps them.
///
/// It is a fault-injection hook for negative controls (a variant of the model the IR cannot
/// express, e.g. a router that puts its bias into the expert weights, must be caught by the
/// oracle comparison) and for debugging (overwrite one intermediate with a reference value and
/// see whether the divergence goes away). The replacements are checked against the node's
/// declared types like any kernel's result. A patch never changes what a `cache.update` already
/// wrote into the caches, only the value the node returns.
pub type PatchFn<'a> = dyn FnMut(&Node, &[&Tensor], &[&Tensor]) -> Option<Vec<Tensor>> + 'a;

/// A summary of one traced output, for `--trace` files.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceRecord {
    pub node: String,
    pub op: &'static str,
    pub output: usize,
    pub shape: Vec<usize>,
    pub dtype: DType,
    /// The L2 norm, accumulated in f64.
    pub l2: f64,
    /// The first values (integers converted to f64).
    pub first: Vec<f64>,
}

impl TraceRecord {
    /// One record per output of `node`, with up to `first_n` leading values each.
    pub fn summarize(node: &Node, outputs: &[&Tensor], first_n: usize) -> Vec<TraceRecord> {
        outputs
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let (l2, first) = match (t.as_f32(), t.as_i64()) {
                    (Ok(v), _) => l2_and_first(v.iter().map(|&x| x as f64), first_n),
                    (_, Ok(v)) => l2_and_first(v.iter().map(|&x| x as f64), first_n),
                    _ => (0.0, Vec::new()),
                };
                TraceRecord {
                    node: node.name.clone(),
                    op: node.op.name(),
                    output: i,
                    shape: t.shape().to_vec(),
                    dtype: t.dtype(),
                    l2,
                    first,
                }
            })
            .collect()
    }
}

fn l2_and_first(values: impl Iterator<Item = f64>, first_n: usize) -> (f64, Vec<f64>) {
    let mut first = Vec::with_capacity(first_n);
    let mut sum = 0.0;
    for (k, x) in values.enumerate() {
        if k < first_n {
            first.push(x);
        }
        sum += x * x;
    }
    (sum.sqrt(), first)
}

/// Runs functions; keeps materialized weights between calls.
pub struct Interpreter {
    max_context: usize,
    /// Weight node name → (its recipe, its value). A hit needs an equal recipe.
    weights: HashMap<String, (Recipe, Arc<Tensor>)>,
    /// This rank's end of its tensor-parallel group; `None` for a whole (single-rank) model.
    comm: Option<Communicator>,
}

impl Default for Interpreter {
    fn default() -> Self {
        Interpreter::new()
    }
}

impl Interpreter {
    pub fn new() -> Interpreter {
        Interpreter {
            max_context: DEFAULT_MAX_CONTEXT,
            weights: HashMap::new(),
            comm: None,
        }
    }

    /// Runs one rank of a tensor-parallel group: the collectives of its graphs meet the other
    /// ranks' through `comm`.
    pub fn with_communicator(mut self, comm: Communicator) -> Interpreter {
        self.comm = Some(comm);
        self
    }

    /// Rejects any position `>= max_context`.
    pub fn with_max_context(mut self, max_context: usize) -> Interpreter {
        self.max_context = max_context;
        self
    }

    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// How many weights are materialized and kept.
    pub fn cached_weights(&self) -> usize {
        self.weights.len()
    }

    /// Forgets every materialized weight (e.g. before switching to another checkpoint: the cache
    /// is keyed by node name and recipe, not by source).
    pub fn clear_weights(&mut self) {
        self.weights.clear();
    }

    /// Runs `f` of `module` on `inputs` (by argument index) and returns its results in
    /// `f.results` order. `caches` are the cache slots' persistent states: a `cache.update` that
    /// is not batched (prefill) writes the slot its `slot` operand names (then `caches` holds at
    /// least that many), or without one the only cache given; a batched one (decode) writes
    /// `caches[i]` for input row `i`; a function without `cache.update` may get none.
    pub fn run(
        &mut self,
        module: &Module,
        f: &Function,
        weights: &dyn WeightSource,
        caches: &mut [&mut SequenceCache],
        inputs: &[Tensor],
    ) -> Result<Vec<Tensor>, InterpError> {
        self.run_traced(module, f, weights, caches, inputs, &mut |_, _| {})
    }

    /// [`Interpreter::run`], calling `trace` after each node with its outputs.
    ///
    /// On error the caches are rolled back to their lengths before the call (rows this call
    /// appended are dropped; a row it overwrote below the old length stays overwritten).
    pub fn run_traced(
        &mut self,
        module: &Module,
        f: &Function,
        weights: &dyn WeightSource,
        caches: &mut [&mut SequenceCache],
        inputs: &[Tensor],
        trace: &mut TraceFn<'_>,
    ) -> Result<Vec<Tensor>, InterpError> {
        let mut patch = |node: &Node, _operands: &[&Tensor], outputs: &[&Tensor]| {
            trace(node, outputs);
            None
        };
        self.run_patched(module, f, weights, caches, inputs, &mut patch)
    }

    /// [`Interpreter::run`], calling `patch` after each node with its operands and outputs; the
    /// outputs it returns replace the node's (see [`PatchFn`]). A hook for negative controls and
    /// debugging; [`Interpreter::run_traced`] is this with a patch that only observes.
    ///
    /// On error the caches are rolled back as in [`Interpreter::run_traced`].
    pub fn run_patched(
        &mut self,
        module: &Module,
        f: &Function,
        weights: &dyn WeightSource,
        caches: &mut [&mut SequenceCache],
        inputs: &[Tensor],
        patch: &mut PatchFn<'_>,
    ) -> Result<Vec<Tensor>, InterpError> {
        let snapshots: Vec<_> = caches.iter().map(|c| c.snapshot()).collect();
        let result = self.execute(module, f, weights, caches, inputs, patch);
        if let (Err(_), Some(comm)) = (&result, &self.comm) {
            // The other ranks would otherwise wait forever for this rank's part.
            comm.abort();
        }
        if result.is_err() {
            for (c, s) in caches.iter_mut().zip(snapshots) {
                c.restore(s);
            }
        }
        result
    }

    fn execute(
        &mut self,
        module: &Module,
        f: &Function,
        weights: &dyn WeightSource,
        caches: &mut [&mut SequenceCache],
        inputs: &[Tensor],
        patch: &mut PatchFn<'_>,
    ) -> Result<Vec<Tensor>, InterpError> {
        let function_error = |message: String| InterpError::Function {
            function: f.name.clone(),
            message,
        };
        verify_function(module, f)
            .map_err(|e| function_error(format!("the function does not verify: {e}")))?;
        let input_nodes = f.inputs();
        if inputs.len() != input_nodes.len() {
            let declared: Vec<String> = input_nodes
                .iter()
                .map(|&n| format!("{}: {}", f.graph[n].name, f.graph[n].outputs[0]))
                .collect();
            return Err(function_error(format!(
                "takes {} inputs ({}), got {}",
                input_nodes.len(),
                declared.join(", "),
                inputs.len()
            )));
        }
        let mut env = Env {
            function: &f.name,
            max_context: self.max_context,
            bindings: HashMap::new(),
        };
        for (k, (&n, t)) in input_nodes.iter().zip(inputs).enumerate() {
            let what = format!("input {k} \"{}\"", f.graph[n].name);
            env.bind(&f.graph[n].outputs[0], t, &what)
                .map_err(function_error)?;
        }

        let order = live_order(f);
        // Values still to be read; results are kept to the end.
        let results: HashSet<Value> = f.results.iter().map(|(_, v)| *v).collect();
        let mut uses: HashMap<Value, usize> = HashMap::new();
        let operands: HashMap<NodeIndex, Vec<Value>> =
            order.iter().map(|&n| (n, f.operands(n))).collect();
        for ops in operands.values() {
            for v in ops {
                *uses.entry(*v).or_default() += 1;
            }
        }

        let mut values: HashMap<Value, Arc<Tensor>> = HashMap::new();
        for &n in &order {
            let node = &f.graph[n];
            let ops = &operands[&n];
            let args: Vec<Arc<Tensor>> = ops.iter().map(|v| values[v].clone()).collect();
            let node_error = |message: String| InterpError::Node {
                function: f.name.clone(),
                node: node.name.clone(),
                op: node.op.name(),
                operands: fmt_operands(&args),
                message,
            };
            let outputs = self
                .eval(node, &args, &mut env, module, weights, caches, inputs)
                .map_err(|e| match e {
                    Failure::Message(m) => node_error(m),
                    Failure::Source(e) => node_error(e.to_string()),
                })?;
            let refs: Vec<&Tensor> = outputs.iter().map(|t| t.as_ref()).collect();
            check_outputs(&mut env, node, &refs, "").map_err(node_error)?;
            let replaced = {
                let operand_refs: Vec<&Tensor> = args.iter().map(|t| t.as_ref()).collect();
                patch(node, &operand_refs, &refs)
            };
            let outputs = match replaced {
                None => outputs,
                Some(replaced) => {
                    let refs: Vec<&Tensor> = replaced.iter().collect();
                    check_outputs(&mut env, node, &refs, "patched ").map_err(node_error)?;
                    replaced.into_iter().map(Arc::new).collect()
                }
            };
            for (i, t) in outputs.into_iter().enumerate() {
                let v = Value {
                    node: n,
                    output: i as u32,
                };
                if results.contains(&v) || uses.get(&v).copied().unwrap_or(0) > 0 {
                    values.insert(v, t);
                }
            }
            for v in ops {
                let u = uses.get_mut(v).expect("counted above");
                *u -= 1;
                if *u == 0 && !results.contains(v) {
                    values.remove(v);
                }
            }
        }
        let results: Vec<Arc<Tensor>> =
            f.results
                .iter()
                .map(|(name, v)| {
                    values.get(v).cloned().ok_or_else(|| {
                        function_error(format!("result \"{name}\" was not computed"))
                    })
                })
                .collect::<Result<_, _>>()?;
        drop(values);
        Ok(results.into_iter().map(Arc::unwrap_or_clone).collect())
    }

    #[allow(clippy::too_many_arguments)]
    fn eval(
        &mut self,
        node: &Node,
        args: &[Arc<Tensor>],
        env: &mut Env<'_>,
        module: &Module,
        weights: &dyn WeightSource,
        caches: &mut [&mut SequenceCache],
        inputs: &[Tensor],
    ) -> Result<Vec<Arc<Tensor>>, Failure> {
        let a = |i: usize| -> &Tensor { &args[i] };
        let one = |t: Tensor| Ok(vec![Arc::new(t)]);
        match &node.op {
            Op::Input { index } => Ok(vec![Arc::new(inputs[*index as usize].clone())]),
            Op::Weight { recipe } => Ok(vec![self.weight(node, recipe, weights)?]),
            Op::Embed {} => one(kernels::embed(a(0), a(1))?),
            Op::EmbedShard { start } => one(kernels::embed_shard(a(0), a(1), *start)?),
            Op::AllReduce {
                op: Reduce::Sum,
                ranks,
            } => {
                let comm = self.communicator(*ranks)?;
                one(comm
                    .all_reduce_sum(&node.name, args[0].clone())
                    .map_err(msg)?)
            }
            Op::AllGather { axis, ranks } => {
                let comm = self.communicator(*ranks)?;
                one(comm
                    .all_gather(&node.name, *axis as usize, args[0].clone())
                    .map_err(msg)?)
            }
            Op::Matmul {} => one(kernels::matmul(a(0), a(1))?),
            Op::MatmulHeads {} => one(kernels::matmul_heads(a(0), a(1))?),
            Op::Add {} => one(kernels::binary(a(0), a(1), |x, y| x + y)?),
            Op::Mul {} => one(kernels::binary(a(0), a(1), |x, y| x * y)?),
            Op::Swiglu {} => one(fused::swiglu(a(0), a(1))?),
            Op::Scale { factor } => {
                let factor = *factor;
                one(kernels::unary(a(0), move |x| x * factor)?)
            }
            Op::Silu {} => one(kernels::unary(a(0), silu)?),
            Op::Relu {} => one(kernels::unary(a(0), |x| x.max(0.0))?),
            Op::Cast { dtype } => one(kernels::cast(a(0), *dtype)?),
            Op::RmsNorm { eps } => one(kernels::rmsnorm(a(0), a(1), *eps)?),
            Op::AddRmsNorm { eps } => {
                let [normed, sum] = fused::add_rmsnorm(a(0), a(1), a(2), *eps)?;
                Ok(vec![Arc::new(normed), Arc::new(sum)])
            }
            Op::LayerNorm { eps } => one(kernels::layernorm(a(0), a(1), a(2), *eps)?),
            Op::Rope { interleaved, theta } => {
                let rows = a(0).shape().first().copied().unwrap_or(0);
                let pos = env.positions(a(1), rows)?;
                one(kernels::rope(a(0), &pos, *interleaved, *theta)?)
            }
            Op::MatmulRope {
                interleaved,
                theta,
                period,
                start,
                end,
            } => {
                let rows = a(0).shape().first().copied().unwrap_or(0);
                let pos = env.positions(a(2), rows)?;
                let cols = fused::RopeColumns {
                    interleaved: *interleaved,
                    theta: *theta,
                    period: *period as usize,
                    start: *start as usize,
                    end: *end as usize,
                };
                one(fused::matmul_rope(a(0), a(1), &pos, &cols)?)
            }
            Op::Reshape { shape } => {
                let shape = env.resolve(shape, a(0).numel())?;
                one(a(0).clone().reshape(shape).map_err(msg)?)
            }
            Op::Slice { axis, start, end } => one(a(0)
                .slice(*axis as usize, *start as usize, *end as usize)
                .map_err(msg)?),
            Op::Concat { axis } => {
                let parts: Vec<Tensor> = args.iter().map(|t| (**t).clone()).collect();
                one(Tensor::concat(*axis as usize, &parts).map_err(msg)?)
            }
            Op::SliceLast {} => one(sample::slice_last(a(0))?),
            Op::CacheUpdate { batched, state } => {
                let rows = a(0).shape().first().copied().unwrap_or(0);
                let pos = env.positions(a(1), rows)?;
                let row_type = module.states.get(state).ok_or_else(|| {
                    Failure::Message(format!("cache state \"{state}\" is not declared"))
                })?;
                let slot = match args.get(2) {
                    Some(t) => Some(cache::slot(t)?),
                    None => None,
                };
                one(cache::update(
                    caches,
                    state,
                    row_type,
                    *batched,
                    slot,
                    a(0),
                    &pos,
                )?)
            }
            Op::CacheUpdateNorm {
                batched,
                eps,
                layernorm,
                rope,
                states,
            } => {
                let p = node.op.positions_operand().expect("a cache op");
                let rows = a(0).shape().first().copied().unwrap_or(0);
                let pos = env.positions(a(p), rows)?;
                let bias = if *layernorm { Some(a(2)) } else { None };
                let parts = fused::norm_rows(a(0), a(1), bias, *eps, rope.as_ref(), &pos)?;
                let slot = match args.get(p + 1) {
                    Some(t) => Some(cache::slot(t)?),
                    None => None,
                };
                let mut caches_out = Vec::with_capacity(states.len());
                for (state, new) in states.iter().zip(&parts) {
                    let row_type = module.states.get(state).ok_or_else(|| {
                        Failure::Message(format!("cache state \"{state}\" is not declared"))
                    })?;
                    caches_out.push(Arc::new(cache::update(
                        caches, state, row_type, *batched, slot, new, &pos,
                    )?));
                }
                Ok(caches_out)
            }
            Op::MlaAttend { scale, sparse, .. } => {
                let rows = a(0).shape().first().copied().unwrap_or(0);
                let pos = env.positions(a(5), rows)?;
                let topk = if *sparse { Some(a(6)) } else { None };
                one(attention::mla_expanded(
                    a(0),
                    a(1),
                    a(2),
                    a(3),
                    a(4),
                    &pos,
                    topk,
                    *scale,
                )?)
            }
            Op::MlaAttendAbsorbed { scale, sparse, .. } => {
                let rows = a(0).shape().first().copied().unwrap_or(0);
                let pos = env.positions(a(4), rows)?;
                let topk = if *sparse { Some(a(5)) } else { None };
                one(attention::mla_absorbed(
                    a(0),
                    a(1),
                    a(2),
                    a(3),
                    &pos,
                    topk,
                    *scale,
                )?)
            }
            Op::DsaScore { weight_scale } => {
                let rows = a(0).shape().first().copied().unwrap_or(0);
                let pos = env.positions(a(3), rows)?;
                let factor = *weight_scale;
                // The folded `scale`, computed as `scale` is.
                let w = kernels::unary(a(1), move |x| x * factor)?;
                one(attention::dsa_score(a(0), &w, a(2), &pos)?)
            }
            Op::DsaTopk { k } => {
                let rows = a(0).shape().first().copied().unwrap_or(0);
                let pos = env.positions(a(1), rows)?;
                one(attention::dsa_topk(a(0), &pos, *k as usize)?)
            }
            Op::MoeRoute {
                n_group,
                norm_topk_prob,
                routed_scaling_factor,
                top_k,
                topk_group,
            } => {
                let params = moe::RouteParams {
                    n_group: *n_group as usize,
                    topk_group: *topk_group as usize,
                    top_k: *top_k as usize,
                    norm_topk_prob: *norm_topk_prob,
                    routed_scaling_factor: *routed_scaling_factor,
                };
                let (w, e) = moe::route(a(0), a(1), &params)?;
                Ok(vec![Arc::new(w), Arc::new(e)])
            }
            Op::MoeExperts {} => one(moe::experts(a(0), a(1), a(2), a(3), a(4), a(5))?),
            Op::MoeSort { experts } => {
                let (offsets, order, position) = moe::sort(a(0), *experts as usize)?;
                Ok(vec![Arc::new(offsets), Arc::new(order), Arc::new(position)])
            }
            Op::MoeGateUp {} => one(moe::gate_up(a(0), a(1), a(2), a(3), a(4))?),
            Op::MoeDown {} => one(moe::down(a(0), a(1), a(2))?),
            Op::MoeCombine { shared } => {
                let s = if *shared { Some(a(3)) } else { None };
                one(moe::combine(a(0), a(1), a(2), s)?)
            }
            Op::SampleArgmax {} => one(sample::argmax(a(0))?),
            Op::MatmulArgmax {} => one(fused::matmul_argmax(a(0), a(1))?),
            Op::SampleTopP {} => one(sample::top_p(a(0), a(1), a(2), a(3))?),
        }
    }

    /// The communicator of a collective over `ranks` ranks.
    fn communicator(&mut self, ranks: u64) -> Result<&mut Communicator, Failure> {
        match self.comm.as_ref().map(Communicator::size) {
            Some(size) if size as u64 == ranks => Ok(self.comm.as_mut().expect("matched")),
            Some(size) => Err(Failure::Message(format!(
                "a collective over {ranks} ranks, but this rank is one of {size}"
            ))),
            None => Err(Failure::Message(format!(
                "a collective over {ranks} ranks, but the interpreter runs one rank alone; \
                 run every rank's module together (glmc run --tp {ranks})"
            ))),
        }
    }

    /// A weight node's value: from the cache when the same node name was materialized with an
    /// equal recipe, else from `source`, checked against the node's declared type and rounded
    /// to its dtype, so a bf16 model computes with the weights a bf16 device holds.
    fn weight(
        &mut self,
        node: &Node,
        recipe: &Recipe,
        source: &dyn WeightSource,
    ) -> Result<Arc<Tensor>, Failure> {
        if let Some((r, t)) = self.weights.get(&node.name) {
            if r == recipe {
                return Ok(t.clone());
            }
        }
        let declared = &node.outputs[0];
        let t = source
            .weight(&node.name, recipe, declared.dtype)
            .map_err(|e| Failure::Source(Box::new(e)))?;
        let shape_ok = declared.shape.len() == t.shape().len()
            && declared
                .shape
                .iter()
                .zip(t.shape())
                .all(|(d, &s)| d.as_const() == Some(s as u64));
        if !shape_ok {
            return Err(Failure::Message(format!(
                "weight shape mismatch: the node declares {declared}, the source gives {}{:?}",
                t.dtype(),
                t.shape()
            )));
        }
        if declared.dtype.is_float() != t.dtype().is_float() {
            return Err(Failure::Message(format!(
                "weight dtype mismatch: the node declares {declared}, the source gives {} data",
                t.dtype()
            )));
        }
        let t = Arc::new(t.rounded_to(declared.dtype));
        self.weights
            .insert(node.name.clone(), (recipe.clone(), t.clone()));
        Ok(t)
    }
}

/// `silu(x) = x · sigmoid(x)`, in f64: the `silu` op and the activation of `swiglu`.
fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// A node's outputs (as computed, or as a patch replaced them; `what` says which) must be as
/// many as it declares and of the declared types, binding symbols on the way.
fn check_outputs(
    env: &mut Env,
    node: &Node,
    outputs: &[&Tensor],
    what: &str,
) -> Result<(), String> {
    if outputs.len() != node.outputs.len() {
        return Err(format!(
            "{what}outputs: {} made, {} declared",
            outputs.len(),
            node.outputs.len()
        ));
    }
    for (i, (t, ty)) in outputs.iter().zip(&node.outputs).enumerate() {
        env.bind(ty, t, &format!("{what}output {i} of \"{}\"", node.name))?;
    }
    Ok(())
}

/// The rows a cache-writing op (`cache.update`, `cache.update.norm`) writes at its positions,
/// one `[n, ..]` tensor per state it writes (in `Op::cache_states` order), from its operands:
/// what a device's cache rows are checked against, since the op's own result is the whole cache.
pub fn cache_op_rows(op: &Op, operands: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    match op {
        Op::CacheUpdate { .. } => Ok(vec![operands[0].clone()]),
        Op::CacheUpdateNorm {
            eps,
            layernorm,
            rope,
            ..
        } => {
            let p = op.positions_operand().expect("a cache op");
            let positions = kernels::i64s(operands[p], "positions")?
                .iter()
                .map(|&x| usize::try_from(x).map_err(|_| format!("position {x} is negative")))
                .collect::<Result<Vec<usize>, String>>()?;
            let bias = if *layernorm { Some(operands[2]) } else { None };
            fused::norm_rows(
                operands[0],
                operands[1],
                bias,
                *eps,
                rope.as_ref(),
                &positions,
            )
        }
        other => Err(format!("`{}` writes no cache", other.name())),
    }
}

/// Runs `f` once with a fresh [`Interpreter`] (no weight reuse across calls).
pub fn run_function(
    module: &Module,
    f: &Function,
    weights: &dyn WeightSource,
    caches: &mut [&mut SequenceCache],
    inputs: &[Tensor],
) -> Result<Vec<Tensor>, InterpError> {
    Interpreter::new().run(module, f, weights, caches, inputs)
}

/// A kernel's failure: a message the executor wraps with the node's context, or an error from
/// the weight source.
enum Failure {
    Message(String),
    Source(Box<InterpError>),
}

impl From<String> for Failure {
    fn from(m: String) -> Failure {
        Failure::Message(m)
    }
}

fn msg(e: impl std::fmt::Display) -> Failure {
    Failure::Message(e.to_string())
}

/// Per-call state: symbol bindings and the position limit.
struct Env<'f> {
    function: &'f str,
    max_context: usize,
    /// Symbol → (size, where it was bound).
    bindings: HashMap<String, (usize, String)>,
}

impl Env<'_> {
    /// Checks `t` against the declared `ty`, binding symbols seen for the first time.
    fn bind(&mut self, ty: &TensorType, t: &Tensor, what: &str) -> Result<(), String> {
        if ty.dtype.is_float() != t.dtype().is_float() {
            return Err(format!(
                "{what} is declared {ty} but holds {} data",
                t.dtype()
            ));
        }
        if ty.rank() != t.shape().len() {
            return Err(format!(
                "{what} is declared {ty} but has shape {:?}",
                t.shape()
            ));
        }
        for (d, &size) in ty.shape.iter().zip(t.shape()) {
            match d {
                Dim::Const(c) => {
                    if *c != size as u64 {
                        return Err(format!(
                            "{what} is declared {ty} but has shape {:?}",
                            t.shape()
                        ));
                    }
                }
                Dim::Sym(s) => match self.bindings.get(s) {
                    Some((bound, origin)) if *bound != size => {
                        return Err(format!(
                            "{what} (declared {ty}) has shape {:?}, so {s} = {size}, but {s} = \
                             {bound} from {origin} (a symbol has one size in a call)",
                            t.shape()
                        ));
                    }
                    Some(_) => {}
                    None => {
                        self.bindings.insert(s.clone(), (size, what.to_string()));
                    }
                },
            }
        }
        Ok(())
    }

    /// A reshape target in concrete sizes; one unbound symbol is solved from `numel`.
    fn resolve(&self, shape: &[Dim], numel: usize) -> Result<Vec<usize>, String> {
        let mut out = Vec::with_capacity(shape.len());
        let mut unknown = None;
        for (i, d) in shape.iter().enumerate() {
            match d {
                Dim::Const(c) => out.push(*c as usize),
                Dim::Sym(s) => match self.bindings.get(s) {
                    Some((size, _)) => out.push(*size),
                    None if unknown.is_none() => {
                        unknown = Some(i);
                        out.push(1);
                    }
                    None => {
                        return Err(format!(
                            "reshape target {shape:?} has more than one unbound symbol"
                        ))
                    }
                },
            }
        }
        if let Some(i) = unknown {
            let known: usize = out.iter().product();
            if known == 0 || !numel.is_multiple_of(known) {
                return Err(format!(
                    "cannot solve {} in reshape of {numel} elements to {shape:?}",
                    shape[i]
                ));
            }
            out[i] = numel / known;
        }
        Ok(out)
    }

    /// Validated positions: one per row, each in `0..max_context`.
    fn positions(&self, t: &Tensor, rows: usize) -> Result<Vec<usize>, String> {
        let p = t
            .as_i64()
            .map_err(|_| format!("positions must be integers, got {} data", t.dtype()))?;
        if t.shape().len() != 1 || p.len() != rows {
            return Err(format!(
                "positions have shape {:?}, expected [{rows}] (one per row)",
                t.shape()
            ));
        }
        p.iter()
            .enumerate()
            .map(|(i, &x)| {
                if x < 0 {
                    Err(format!("position {x} of row {i} is negative"))
                } else if x as u64 >= self.max_context as u64 {
                    Err(format!(
                        "position {x} of row {i} is beyond the maximum context of {} tokens \
                         (in @{})",
                        self.max_context, self.function
                    ))
                } else {
                    Ok(x as usize)
                }
            })
            .collect()
    }
}

/// The nodes that must run, in a topological order: those the results need, and every node
/// with a side effect (`cache.update`) with what it needs.
fn live_order(f: &Function) -> Vec<NodeIndex> {
    let mut live = HashSet::new();
    let mut stack: Vec<NodeIndex> = f.results.iter().map(|(_, v)| v.node).collect();
    stack.extend(
        f.graph
            .node_indices()
            .filter(|&n| f.graph[n].op.has_side_effect()),
    );
    while let Some(n) = stack.pop() {
        if live.insert(n) {
            stack.extend(f.operands(n).into_iter().map(|v| v.node));
        }
    }
    f.canonical_order()
        .into_iter()
        .filter(|n| live.contains(n))
        .collect()
}
