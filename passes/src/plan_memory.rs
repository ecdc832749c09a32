//! `plan-memory`: the liveness of every intermediate, one arena with an offset per value, and
//! the peak bytes of a phase once its symbolic dims (`s`, `t`, `b`) are bound.
//!
//! # What is counted
//! Every node output is one [`PlannedValue`]; its [`Storage`] says where its bytes live:
//! - function arguments ([`Storage::Input`]) belong to the caller and weights
//!   ([`Storage::Weight`], at the compute dtype the graph declares: the f32 router gate counts four
//!   bytes a value) to the loaded model; neither is in the arena. Their sums are
//!   [`MemoryPlan::inputs_bytes`] and [`MemoryPlan::weights_bytes`].
//! - a `cache.update` output ([`Storage::Cache`]) is a view of persistent per-sequence state. The
//!   reference interpreter returns it as a gathered copy of `[t, row]` (prefill) or `[b, t, row]`
//!   (decode), but a real kernel reads the cache in place, so it takes **no arena bytes**. Its
//!   [`PlannedValue::bytes`] still says how big that gathered view would be. The cache itself is
//!   reported apart, per token, by [`kv_cache_bytes`].
//! - a `reshape` output ([`Storage::View`]) is the same bytes as its operand in another shape (a
//!   row-major reshape never moves data), so it takes no arena bytes either and keeps the value it
//!   views alive for as long as the view is read. Slices and concats are copies, materialised
//!   as the reference interpreter does (a kernel that read a strided slice in place would save
//!   those bytes; the plan does not assume one).
//! - every other output owns a [`Buffer`] in the arena ([`Storage::Arena`]). A kernel's own scratch
//!   (inside `moe.experts`, say) is not a graph value and is not planned here.
//!
//! # Live ranges and offsets
//! Steps are positions in the function's canonical order ([`Function::canonical_order`]), the
//! order the reference interpreter executes. A value is live from the step that defines it to
//! the last step that reads it, both included (an op reads its operands while it writes its
//! outputs); results live to the last step; a value nobody reads lives for its own step only. A
//! buffer lives as long as any view of it.
//!
//! Offsets come from TFLite's "greedy by size": buffers in decreasing size (ties: earlier
//! definition first), each put into the smallest gap that fits among the already placed buffers
//! whose live ranges overlap its own, or above all of them. Offsets are multiples of
//! [`ALIGNMENT`]. [`MemoryPlan::peak_live_bytes`], the most bytes live at any one step, is a lower
//! bound of any arena; greedy by size usually lands on it or close above.
//!
//! # Why an analysis and not a `Pass`
//! A [`Pass`](crate::Pass) rewrites a module and answers "changed?"; a plan is a result that
//! depends on bindings the module does not hold (how many tokens, what batch), and the `Pass`
//! interface has nowhere to return it. Its consumers (`glmc compile --report`, the executor that
//! sizes one allocation per phase) call [`plan_memory`] with the bindings they serve. A wrapper
//! pass that planned with fixed bindings and threw the plan away would only re-check what the
//! verifier already guarantees (a verified graph whose symbols are all bound always plans, short
//! of sizes past 2^64 bytes), so there is none.

use std::collections::{BTreeMap, HashMap};

use glmc_ir::{Dim, Function, Module, NodeIndex, Op, TensorType, Value};

/// Values of the symbolic dims, by symbol (`s` new tokens, `t` context, `b` batch).
pub type Bindings = BTreeMap<String, u64>;

/// Arena offsets are multiples of this many bytes (what `cudaMalloc` guarantees for a base
/// pointer, so a buffer at any offset is as aligned as a fresh allocation).
pub const ALIGNMENT: u64 = 256;

/// The prefill setting `glmc compile --report` plans: this many new tokens from an empty cache.
pub const REPORT_PREFILL_TOKENS: u64 = 8192;
/// The decode setting `glmc compile --report` plans: this many sequences …
pub const REPORT_DECODE_BATCH: u64 = 64;
/// … each with a context of this many tokens (128k).
pub const REPORT_DECODE_CONTEXT: u64 = 131_072;

/// Bindings for a prefill of `new_tokens` appended to `cached_tokens` already in the cache:
/// `s = new_tokens`, `t = cached_tokens + new_tokens`.
pub fn prefill_bindings(new_tokens: u64, cached_tokens: u64) -> Bindings {
    Bindings::from([
        ("s".to_string(), new_tokens),
        ("t".to_string(), cached_tokens + new_tokens),
    ])
}

/// Bindings for one decode step of `batch` sequences whose caches hold `context` tokens (the new
/// one included): `b = batch`, `t = context`.
pub fn decode_bindings(batch: u64, context: u64) -> Bindings {
    Bindings::from([("b".to_string(), batch), ("t".to_string(), context)])
}

/// The report's settings, by function name: prefill of [`REPORT_PREFILL_TOKENS`] from an empty
/// cache, decode of [`REPORT_DECODE_BATCH`] sequences at [`REPORT_DECODE_CONTEXT`]; `None` for
/// any other function.
pub fn default_bindings(function: &str) -> Option<Bindings> {
    match function {
        "prefill" => Some(prefill_bindings(REPORT_PREFILL_TOKENS, 0)),
        "decode" => Some(decode_bindings(REPORT_DECODE_BATCH, REPORT_DECODE_CONTEXT)),
        _ => None,
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error(
        "@{function}: node \"{node}\" has type {ty}, but symbol `{symbol}` has no binding (bound: {bound})"
    )]
    Unbound {
        function: String,
        node: String,
        /// The node's type as printed, `bf16[s,6144]`.
        ty: String,
        symbol: String,
        /// The bindings given, `s=8192, t=8192`, or `none`.
        bound: String,
    },
    #[error("@{function}: node \"{node}\": {ty} with {bound} holds more than 2^64 bytes")]
    Overflow {
        function: String,
        node: String,
        ty: String,
        bound: String,
    },
    #[error("cache state \"{state}\" has rows of {ty}; a row must have a constant shape")]
    SymbolicState { state: String, ty: String },
    #[error("the cache states hold more than 2^64 bytes per token")]
    StateOverflow,
}

/// Steps `first..=last` of the execution order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Live {
    pub first: usize,
    pub last: usize,
}

impl Live {
    /// Whether both are live at some step.
    pub fn overlaps(self, other: Live) -> bool {
        self.first <= other.last && other.first <= self.last
    }

    pub fn contains(self, step: usize) -> bool {
        (self.first..=self.last).contains(&step)
    }
}

/// Where a value's bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Storage {
    /// A function argument, owned by the caller.
    Input,
    /// A weight, owned by the loaded model.
    Weight,
    /// A view of the persistent cache `state`, read in place: no arena bytes.
    Cache { state: String },
    /// The bytes of `of` in another shape (`reshape`): no arena bytes of its own. `of` is never
    /// itself a view.
    View { of: Value },
    /// Its own arena buffer at `offset`.
    Arena { offset: u64 },
}

/// One node output.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedValue {
    pub value: Value,
    /// The node's name; `#k` appended for output `k > 0`.
    pub name: String,
    /// The type as the graph declares it (symbols kept).
    pub ty: TensorType,
    /// Its size with the dims bound (a view's logical size, though it takes no arena bytes).
    pub bytes: u64,
    /// From its definition to its last read (its own, not extended by views of it).
    pub live: Live,
    pub storage: Storage,
}

/// An arena allocation: `offset..offset + bytes`, live over `live` (its value's range, extended
/// to the last read of any view of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buffer {
    pub value: Value,
    pub offset: u64,
    pub bytes: u64,
    pub live: Live,
}

impl Buffer {
    /// Whether the two may not share bytes: live at a common step and both non-empty.
    pub fn conflicts(&self, other: &Buffer) -> bool {
        self.bytes > 0 && other.bytes > 0 && self.live.overlaps(other.live)
    }

    /// Whether their byte ranges intersect.
    pub fn intersects(&self, other: &Buffer) -> bool {
        self.offset < other.offset + other.bytes && other.offset < self.offset + self.bytes
    }
}

/// The memory plan of one function under one set of bindings.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryPlan {
    pub function: String,
    pub bindings: Bindings,
    /// The execution order steps refer to: `order[step]` (the canonical order).
    pub order: Vec<NodeIndex>,
    /// Every node output, in execution order.
    pub values: Vec<PlannedValue>,
    /// One per value with [`Storage::Arena`], in execution order.
    pub buffers: Vec<Buffer>,
    /// The arena's size: the highest `offset + bytes`, rounded up to [`ALIGNMENT`].
    pub arena_bytes: u64,
    /// The most buffer bytes live at one step: a lower bound of any arena.
    pub peak_live_bytes: u64,
    /// The first step at which `peak_live_bytes` are live.
    pub peak_step: usize,
    /// The sum of the weight nodes' sizes.
    pub weights_bytes: u64,
    /// The sum of the function arguments' sizes.
    pub inputs_bytes: u64,
    index: HashMap<Value, usize>,
}

impl MemoryPlan {
    pub fn value(&self, v: Value) -> Option<&PlannedValue> {
        self.index.get(&v).map(|&i| &self.values[i])
    }

    /// The arena offset of `v`'s bytes: its own buffer's, or for a view the viewed buffer's;
    /// `None` for arguments, weights, cache views and views of those.
    pub fn offset(&self, v: Value) -> Option<u64> {
        match &self.value(v)?.storage {
            Storage::Arena { offset } => Some(*offset),
            Storage::View { of } => self.offset(*of),
            _ => None,
        }
    }

    /// The largest value that owns arena bytes (the earliest of equals).
    pub fn largest_intermediate(&self) -> Option<&PlannedValue> {
        self.values
            .iter()
            .filter(|v| matches!(v.storage, Storage::Arena { .. }))
            .fold(None, |best: Option<&PlannedValue>, v| match best {
                Some(b) if b.bytes >= v.bytes => Some(b),
                _ => Some(v),
            })
    }

    /// The buffers live at `step`.
    pub fn live_at(&self, step: usize) -> impl Iterator<Item = &Buffer> {
        self.buffers.iter().filter(move |b| b.live.contains(step))
    }

    /// The buffer bytes live at each step (their maximum is `peak_live_bytes`).
    pub fn live_bytes(&self) -> Vec<u64> {
        live_bytes(self.order.len(), &self.buffers)
    }
}

fn bound_text(bindings: &Bindings) -> String {
    if bindings.is_empty() {
        return "none".into();
    }
    bindings
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `ty`'s size in bytes with `bindings`; `Err(Some(symbol))` for an unbound symbol, `Err(None)`
/// on overflow.
fn size_of(ty: &TensorType, bindings: &Bindings) -> Result<u64, Option<String>> {
    let mut n = ty.dtype.size_bytes();
    for d in &ty.shape {
        let k = match d {
            Dim::Const(k) => *k,
            Dim::Sym(s) => *bindings.get(s).ok_or_else(|| Some(s.clone()))?,
        };
        n = n.checked_mul(k).ok_or(None)?;
    }
    Ok(n)
}

/// Bytes live at each of `steps` steps: a sweep over the buffers' starts and ends. The sum
/// cannot overflow: every buffer fits in the arena, whose size was checked.
fn live_bytes(steps: usize, buffers: &[Buffer]) -> Vec<u64> {
    let mut delta: Vec<i128> = vec![0; steps + 1];
    for buf in buffers {
        delta[buf.live.first] += i128::from(buf.bytes);
        delta[buf.live.last + 1] -= i128::from(buf.bytes);
    }
    let mut live = 0i128;
    delta[..steps]
        .iter()
        .map(|d| {
            live += d;
            u64::try_from(live).unwrap_or(u64::MAX)
        })
        .collect()
}

fn round_up(n: u64, to: u64) -> Option<u64> {
    n.checked_next_multiple_of(to)
}

/// Plans `f`'s memory with its symbolic dims bound by `bindings` (see the module docs for what
/// is counted). `f` must verify. The plan depends only on the graph's content and the bindings,
/// never on petgraph indices or hashing, so it is the same on every run.
pub fn plan_memory(f: &Function, bindings: &Bindings) -> Result<MemoryPlan, PlanError> {
    let order = f.canonical_order();
    let step: HashMap<NodeIndex, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let last_step = order.len().saturating_sub(1);
    let results: Vec<Value> = f.results.iter().map(|(_, v)| *v).collect();

    let mut values: Vec<PlannedValue> = Vec::new();
    let mut index: HashMap<Value, usize> = HashMap::new();
    let (mut weights_bytes, mut inputs_bytes) = (0u64, 0u64);
    let overflow = |node: &str, ty: &TensorType| PlanError::Overflow {
        function: f.name.clone(),
        node: node.to_string(),
        ty: ty.to_string(),
        bound: bound_text(bindings),
    };
    for (i, &n) in order.iter().enumerate() {
        let node = f.node(n);
        for (k, ty) in node.outputs.iter().enumerate() {
            let value = Value {
                node: n,
                output: k as u32,
            };
            let bytes = size_of(ty, bindings).map_err(|e| match e {
                Some(symbol) => PlanError::Unbound {
                    function: f.name.clone(),
                    node: node.name.clone(),
                    ty: ty.to_string(),
                    symbol,
                    bound: bound_text(bindings),
                },
                None => overflow(&node.name, ty),
            })?;
            let storage = match &node.op {
                Op::Input { .. } => {
                    inputs_bytes = inputs_bytes
                        .checked_add(bytes)
                        .ok_or_else(|| overflow(&node.name, ty))?;
                    Storage::Input
                }
                Op::Weight { .. } => {
                    weights_bytes = weights_bytes
                        .checked_add(bytes)
                        .ok_or_else(|| overflow(&node.name, ty))?;
                    Storage::Weight
                }
                Op::CacheUpdate { .. } | Op::CacheUpdateNorm { .. } => Storage::Cache {
                    state: node.op.cache_states()[k].clone(),
                },
                Op::Reshape { .. } => {
                    let operand = f.operands(n)[0];
                    let of = match &values[index[&operand]].storage {
                        Storage::View { of } => *of,
                        _ => operand,
                    };
                    Storage::View { of }
                }
                _ => Storage::Arena { offset: 0 },
            };
            let last = if results.contains(&value) {
                last_step
            } else {
                f.users(value)
                    .iter()
                    .map(|(user, _)| step[user])
                    .max()
                    .unwrap_or(i)
            };
            let name = if k == 0 {
                node.name.clone()
            } else {
                format!("{}#{k}", node.name)
            };
            index.insert(value, values.len());
            values.push(PlannedValue {
                value,
                name,
                ty: ty.clone(),
                bytes,
                live: Live { first: i, last },
                storage,
            });
        }
    }

    // Buffers, with live ranges extended by their views.
    let mut buffers: Vec<Buffer> = Vec::new();
    let mut buffer_of: HashMap<Value, usize> = HashMap::new();
    for v in &values {
        match v.storage {
            Storage::Arena { .. } => {
                buffer_of.insert(v.value, buffers.len());
                buffers.push(Buffer {
                    value: v.value,
                    offset: 0,
                    bytes: v.bytes,
                    live: v.live,
                });
            }
            Storage::View { of } => {
                if let Some(&b) = buffer_of.get(&of) {
                    let live = &mut buffers[b].live;
                    live.last = live.last.max(v.live.last);
                }
            }
            _ => {}
        }
    }

    let spans: Vec<(u64, Live)> = buffers.iter().map(|b| (b.bytes, b.live)).collect();
    let (offsets, arena_bytes) = place(&spans).map_err(|b| {
        let owner = &values[index[&buffers[b].value]];
        overflow(&owner.name, &owner.ty)
    })?;
    for (buf, offset) in buffers.iter_mut().zip(offsets) {
        buf.offset = offset;
    }
    for buf in &buffers {
        let v = &mut values[index[&buf.value]];
        v.storage = Storage::Arena { offset: buf.offset };
    }

    // The peak: the first step with the most bytes live.
    let live = live_bytes(order.len(), &buffers);
    let (peak_step, peak_live_bytes) = live.iter().copied().enumerate().fold(
        (0, 0),
        |best, (s, b)| if b > best.1 { (s, b) } else { best },
    );

    Ok(MemoryPlan {
        function: f.name.clone(),
        bindings: bindings.clone(),
        order,
        values,
        buffers,
        arena_bytes,
        peak_live_bytes,
        peak_step,
        weights_bytes,
        inputs_bytes,
        index,
    })
}

/// Offsets for buffers of `(bytes, live range)` in one arena, by TFLite's "greedy by size" (see
/// the module docs), and the arena's size. Buffers whose live ranges overlap never share bytes;
/// every offset is a multiple of [`ALIGNMENT`]. `Err(i)` names a buffer whose end would pass 2^64.
pub fn place(spans: &[(u64, Live)]) -> Result<(Vec<u64>, u64), usize> {
    let mut offsets = vec![0u64; spans.len()];
    let mut by_size: Vec<usize> = (0..spans.len()).collect();
    by_size.sort_by_key(|&b| (std::cmp::Reverse(spans[b].0), b));
    let mut placed: Vec<usize> = Vec::with_capacity(spans.len());
    let mut arena_bytes = 0u64;
    for b in by_size {
        let (bytes, live) = spans[b];
        if bytes == 0 {
            continue;
        }
        let need = round_up(bytes, ALIGNMENT).ok_or(b)?;
        let mut neighbours: Vec<(u64, u64)> = placed
            .iter()
            .filter(|&&p| spans[p].1.overlaps(live))
            .map(|&p| {
                (
                    offsets[p],
                    offsets[p] + round_up(spans[p].0, ALIGNMENT).unwrap_or(u64::MAX),
                )
            })
            .collect();
        neighbours.sort();
        let mut best: Option<(u64, u64)> = None; // (gap size, offset)
        let mut end = 0u64;
        for (start, stop) in neighbours {
            if start > end {
                let gap = start - end;
                if gap >= need && best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, end));
                }
            }
            end = end.max(stop);
        }
        let offset = best.map_or(end, |(_, o)| o);
        arena_bytes = arena_bytes.max(offset.checked_add(need).ok_or(b)?);
        offsets[b] = offset;
        placed.push(b);
    }
    Ok((offsets, arena_bytes))
}

/// The bytes one token occupies in the persistent caches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvCacheBytes {
    /// Per state, by name (the module's order): row numel × dtype size.
    pub states: Vec<(String, u64)>,
    /// Per layer, in layer order, for states named `model.layers.N.…`; the states of no layer
    /// are summed under `None`, first.
    pub layers: Vec<(Option<u64>, u64)>,
    /// All states together.
    pub per_token: u64,
}

impl KvCacheBytes {
    /// The bytes `tokens` tokens occupy (summed over sequences); `None` on overflow.
    pub fn for_tokens(&self, tokens: u64) -> Option<u64> {
        self.per_token.checked_mul(tokens)
    }
}

/// The layer a state or node named `model.layers.N.…` belongs to.
pub fn layer_of(name: &str) -> Option<u64> {
    name.strip_prefix("model.layers.")?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// KV cache bytes per token over the module's `states` (row numel × dtype size each).
pub fn kv_cache_bytes(module: &Module) -> Result<KvCacheBytes, PlanError> {
    let mut states = Vec::with_capacity(module.states.len());
    let mut layers: BTreeMap<Option<u64>, u64> = BTreeMap::new();
    let mut per_token = 0u64;
    for (state, row) in &module.states {
        let bytes = row
            .const_numel()
            .and_then(|n| n.checked_mul(row.dtype.size_bytes()))
            .ok_or_else(|| PlanError::SymbolicState {
                state: state.clone(),
                ty: row.to_string(),
            })?;
        states.push((state.clone(), bytes));
        let layer = layers.entry(layer_of(state)).or_default();
        *layer = layer.checked_add(bytes).ok_or(PlanError::StateOverflow)?;
        per_token = per_token
            .checked_add(bytes)
            .ok_or(PlanError::StateOverflow)?;
    }
    Ok(KvCacheBytes {
        states,
        layers: layers.into_iter().collect(),
        per_token,
    })
}
