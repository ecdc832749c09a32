//! Lowering: an optimised IR function becomes a [`Phase`], a launch schedule over one arena.
//!
//! Every node becomes one of three things:
//! - a **view**: `reshape`, `slice` and `slice.last` are layouts over their operand's memory (no
//!   kernel, no copy), as long as the result is still rows of contiguous elements (what every
//!   row-wise kernel addresses); a `cache.update`'s result is a view of its cache;
//! - **launches** of kernels specialised from templates ([`crate::kernels`]): usually one; a
//!   few in sequence (a split attention and its merge), or alternatives guarded by the row
//!   count. A node's launches may share scratch buffers, live at its step alone;
//! - a **collective** (`all_reduce`, `all_gather` of a tensor-parallel rank's graph): no kernel,
//!   the runtime's NCCL call between contiguous tensors; a gather along an axis other than the
//!   first lands rank-major in a scratch buffer, and one copy launch puts each rank's block in
//!   place;
//! - **missing**, for the ops no kernel exists for yet; the artifact then says it is incomplete.
//!
//! A `concat` is folded into its producers: an operand made by a kernel for the concat alone is
//! written straight into its part of the concat's buffer; any other operand is copied there.
//!
//! The arena is planned the way `plan-memory` plans it (greedy by size over live ranges, see
//! [`glmc_passes::plan_memory::place`]), but over the buffers the lowering really has: views
//! take none, a folded concat's buffer lives from its first producer on. The plan is made for
//! the largest sizes the artifact serves ([`Limits`]); a smaller launch uses a prefix of each
//! buffer, since every offset and stride is evaluated from the launch's own sizes.

use std::collections::HashMap;

use glmc_ir::{Function, Module, NodeIndex, Op, Reduce, TensorType, Value};
use glmc_passes::plan_memory::{decode_bindings, place, Live};
use sha2::{Digest, Sha256};

use crate::expr::{Bindings, Poly};
use crate::kernels::{
    self, Lowering, NodeCtx, Planned, Source, Variant, DECODE_GEMM, MLA_SPARSE_TILES_PER_SPLIT,
    SCORE_DECODE_RING,
};
use crate::layout::{Buf, TensorRef};
use crate::schedule::{ArgValue, Collective, CollectiveOp, Kernel, Launch, Phase, Step};
use crate::target::Target;

/// The largest sizes an artifact serves: the arena and the caches are sized for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    /// Tokens in one prefill chunk (`s`).
    pub max_prefill_tokens: u64,
    /// Sequences in one decode step (`b`), and sequences the caches hold.
    pub max_batch: u64,
    /// Tokens of context per sequence (`t`), the caches' capacity.
    pub max_context: u64,
}

impl Limits {
    /// The bindings the arena of `function` is planned for.
    pub fn bindings(&self, function: &str) -> Bindings {
        match function {
            "prefill" => Bindings::from([
                ("s".to_string(), self.max_prefill_tokens),
                ("t".to_string(), self.max_context),
            ]),
            _ => decode_bindings(self.max_batch, self.max_context),
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LowerError {
    #[error("@{function}: node \"{node}\" ({op}): {why}")]
    Node {
        function: String,
        node: String,
        op: String,
        why: String,
    },
    #[error("@{function}: the arena for {bound} passes 2^64 bytes")]
    ArenaOverflow { function: String, bound: String },
    #[error(
        "the {template} kernel for node \"{node}\" needs {need} bytes of shared memory per block; tiles are held to {limit} (SM120's limit) on every target, {target} included: choose a smaller tile"
    )]
    SharedMemory {
        template: String,
        node: String,
        need: u32,
        limit: u32,
        target: Target,
    },
}

/// A module's phases and the kernels they launch.
#[derive(Clone, Debug, PartialEq)]
pub struct Lowered {
    pub target: Target,
    pub limits: Limits,
    pub phases: Vec<Phase>,
    /// Distinct specialisations, in order of first use.
    pub kernels: Vec<Kernel>,
    /// Whether every launch is a programmatic dependent of the one before it
    /// ([`Target::has_programmatic_launch`]); every kernel waits for its predecessor with
    /// `griddepcontrol.wait` either way.
    pub programmatic_launch: bool,
}

impl Lowered {
    /// The ops without a kernel in any phase, sorted: empty for a complete artifact.
    pub fn missing_ops(&self) -> Vec<String> {
        let mut ops: Vec<String> = self.phases.iter().flat_map(|p| p.missing_ops()).collect();
        ops.sort();
        ops.dedup();
        ops
    }
}

pub fn lower_module(
    module: &Module,
    target: Target,
    limits: Limits,
) -> Result<Lowered, LowerError> {
    lower_tiled(module, target, limits, None)
}

/// [`lower_module`] with `variant` in place of the shipped choice it names (a variant that a
/// sweep times against the shipped ones).
pub fn lower_module_with(
    module: &Module,
    target: Target,
    limits: Limits,
    variant: Variant,
) -> Result<Lowered, LowerError> {
    lower_tiled(module, target, limits, Some(variant))
}

/// The lowering with `variant`, or (None) the shipped choices.
fn lower_tiled(
    module: &Module,
    target: Target,
    limits: Limits,
    variant: Option<Variant>,
) -> Result<Lowered, LowerError> {
    let mut kernels = KernelTable::default();
    let mut phases = Vec::new();
    for f in &module.functions {
        phases.push(lower_function(f, target, limits, variant, &mut kernels)?);
    }
    Ok(Lowered {
        target,
        limits,
        phases,
        kernels: kernels.kernels,
        programmatic_launch: target.has_programmatic_launch(),
    })
}

/// Kernels by content: one specialisation is generated once, whatever the number of launches.
#[derive(Default)]
pub struct KernelTable {
    pub kernels: Vec<Kernel>,
    by_name: HashMap<String, usize>,
}

impl KernelTable {
    /// The name of `planned`'s kernel, adding it when new. The name is the template and a hash
    /// of the parameters, so it is stable whatever else the module holds.
    fn intern(&mut self, planned: &Planned) -> String {
        let spec = &planned.spec;
        let mut h = Sha256::new();
        h.update(spec.template.as_bytes());
        for (k, v) in &spec.params {
            h.update(format!("\0{k}={v}").as_bytes());
        }
        let digest = h.finalize();
        let hex: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        let name = format!("glmc_{}_{hex}", spec.template);
        if !self.by_name.contains_key(&name) {
            self.by_name.insert(name.clone(), self.kernels.len());
            self.kernels.push(Kernel {
                name: name.clone(),
                template: spec.template.to_string(),
                params: spec.params.clone(),
                threads: spec.threads,
                shared_bytes: spec.shared_bytes,
            });
        }
        name
    }
}

/// Where a value lives while lowering: a layout, in the arena buffer `buffer` when it has one
/// (its offset is then relative to that buffer until the arena is placed).
#[derive(Clone, Debug)]
struct Loc {
    buffer: Option<usize>,
    at: TensorRef,
}

struct ArenaBuffer {
    bytes: u64,
    live: Live,
}

struct State<'a> {
    f: &'a Function,
    target: Target,
    limits: Limits,
    variant: Option<Variant>,
    bindings: Bindings,
    locs: HashMap<Value, Loc>,
    buffers: Vec<ArenaBuffer>,
    /// Operands written straight into a concat: the concat's value and the operand's part.
    folded: HashMap<Value, (Value, usize)>,
    steps: Vec<PendingStep>,
    /// The `slot` operand of the function's `cache.update`s (a prefill's cache slot).
    slot: Option<Value>,
}

enum PendingStep {
    Launch {
        node: String,
        op: String,
        planned: Planned,
        /// The buffer of each `Ptr` argument, in order.
        buffers: Vec<Option<usize>>,
        outputs: Vec<Loc>,
    },
    View {
        node: String,
        op: String,
        at: Loc,
    },
    Collective {
        node: String,
        op: CollectiveOp,
        ranks: u64,
        input: Loc,
        output: Loc,
    },
    Missing {
        node: String,
        op: String,
        outputs: Vec<Loc>,
        why: String,
    },
}

impl<'a> State<'a> {
    fn error(&self, n: NodeIndex, why: impl Into<String>) -> LowerError {
        let node = self.f.node(n);
        LowerError::Node {
            function: self.f.name.clone(),
            node: node.name.clone(),
            op: node.op.name().to_string(),
            why: why.into(),
        }
    }

    /// A fresh arena buffer holding `at` at the planned sizes, live from `step`.
    fn new_buffer(
        &mut self,
        at: &TensorRef,
        step: usize,
        n: NodeIndex,
    ) -> Result<usize, LowerError> {
        let bytes = at.bytes().eval(&self.bindings).ok_or_else(|| {
            self.error(
                n,
                format!(
                    "the size {} is not bound by {:?}",
                    at.bytes(),
                    self.bindings
                ),
            )
        })?;
        self.buffers.push(ArenaBuffer {
            bytes: bytes as u64,
            live: Live {
                first: step,
                last: step,
            },
        });
        Ok(self.buffers.len() - 1)
    }

    fn touch(&mut self, buffer: Option<usize>, step: usize) {
        if let Some(b) = buffer {
            let live = &mut self.buffers[b].live;
            live.first = live.first.min(step);
            live.last = live.last.max(step);
        }
    }

    fn fresh(&mut self, value: Value, step: usize) -> Result<Loc, LowerError> {
        let ty = self.f.value_type(value).clone();
        let at = TensorRef::contiguous(Buf::Arena, Poly::zero(), &ty);
        let buffer = self.new_buffer(&at, step, value.node)?;
        Ok(Loc {
            buffer: Some(buffer),
            at,
        })
    }

    /// The location of an output: its part of a concat when folded, else a fresh buffer.
    fn output(&mut self, value: Value, step: usize) -> Result<Loc, LowerError> {
        if let Some(&(concat, part)) = self.folded.get(&value) {
            let whole = match self.locs.get(&concat) {
                Some(l) => l.clone(),
                None => {
                    let l = self.fresh(concat, step)?;
                    self.locs.insert(concat, l.clone());
                    l
                }
            };
            self.touch(whole.buffer, step);
            return Ok(Loc {
                buffer: whole.buffer,
                at: concat_part(self.f, concat, &whole.at, part),
            });
        }
        self.fresh(value, step)
    }

    fn copy(&mut self, n: NodeIndex, dst: &Loc, src: &Loc) -> Result<(), LowerError> {
        self.copy_for(n, dst, src, vec![dst.clone()])
    }

    /// A copy of `src` to `dst` whose launch names `outputs` as where the node's outputs land
    /// (a gather's copy writes its whole output through a view of other axes).
    fn copy_for(
        &mut self,
        n: NodeIndex,
        dst: &Loc,
        src: &Loc,
        outputs: Vec<Loc>,
    ) -> Result<(), LowerError> {
        // A cache state read in a prefill is the cache slot's, which only the device knows.
        let slot = match (&src.at.buf, self.slot()) {
            (Buf::State(_), Some(slot)) => Some(slot),
            _ => None,
        };
        let stride = kernels::slot_stride(&src.at, self.limits.max_context);
        let planned = kernels::copy(&dst.at, &src.at, slot.as_ref().map(|s| (s, stride)))
            .map_err(|why| self.error(n, why))?;
        let mut buffers = vec![dst.buffer, src.buffer];
        if slot.is_some() {
            buffers.push(None);
        }
        let node = self.f.node(n);
        self.steps.push(PendingStep::Launch {
            node: node.name.clone(),
            op: "copy".into(),
            planned,
            buffers,
            outputs,
        });
        Ok(())
    }

    /// Where the function's cache slot is (the `slot` operand of its `cache.update`s), if they
    /// name one.
    fn slot(&self) -> Option<TensorRef> {
        self.slot
            .and_then(|v| self.locs.get(&v))
            .map(|l| l.at.clone())
    }
}

/// The part of concat `concat` (at `whole`) that operand `part` fills.
fn concat_part(f: &Function, concat: Value, whole: &TensorRef, part: usize) -> TensorRef {
    let Op::Concat { axis } = &f.node(concat.node).op else {
        unreachable!("folded into a concat")
    };
    let axis = *axis as usize;
    let operands = f.operands(concat.node);
    let extent = |v: Value| {
        f.value_type(v).shape[axis]
            .as_const()
            .expect("concat parts along a constant axis")
    };
    let start: u64 = operands[..part].iter().map(|&v| extent(v)).sum();
    whole.slice(axis, start, start + extent(operands[part]))
}

/// Operands a kernel can write into the concat directly: made by a kernel, read by the concat
/// alone, along a constant axis, and landing on rows a kernel can address.
fn foldable_concat_parts(f: &Function) -> HashMap<Value, (Value, usize)> {
    let results: Vec<Value> = f.results.iter().map(|(_, v)| *v).collect();
    let mut folded = HashMap::new();
    for n in f.canonical_order() {
        let Op::Concat { axis } = &f.node(n).op else {
            continue;
        };
        let concat = Value::from(n);
        let operands = f.operands(n);
        if operands
            .iter()
            .any(|&v| f.value_type(v).shape[*axis as usize].as_const().is_none())
        {
            continue;
        }
        let whole = TensorRef::contiguous(Buf::Arena, Poly::zero(), f.value_type(concat));
        for (part, &v) in operands.iter().enumerate() {
            let producer = &f.node(v.node).op;
            let makes_its_own = !matches!(
                producer,
                Op::Input { .. }
                    | Op::Weight { .. }
                    | Op::Reshape { .. }
                    | Op::Slice { .. }
                    | Op::Concat { .. }
                    | Op::CacheUpdate { .. }
                    | Op::CacheUpdateNorm { .. }
                    // NCCL writes whole contiguous tensors, never a part of a concat.
                    | Op::AllReduce { .. }
                    | Op::AllGather { .. }
            );
            let only_user = f.users(v).len() == 1 && !results.contains(&v);
            let addressable = concat_part(f, concat, &whole, part).rows().is_some();
            if makes_its_own && only_user && addressable {
                folded.insert(v, (concat, part));
            }
        }
    }
    folded
}

pub fn lower_function(
    f: &Function,
    target: Target,
    limits: Limits,
    variant: Option<Variant>,
    kernels: &mut KernelTable,
) -> Result<Phase, LowerError> {
    let order = f.canonical_order();
    let mut st = State {
        f,
        target,
        limits,
        variant,
        bindings: limits.bindings(&f.name),
        locs: HashMap::new(),
        buffers: Vec::new(),
        folded: foldable_concat_parts(f),
        steps: Vec::new(),
        slot: order.iter().find_map(|&n| {
            let p = f.node(n).op.positions_operand()?;
            f.operands(n).get(p + 1).copied()
        }),
    };
    for (step, &n) in order.iter().enumerate() {
        lower_node(&mut st, n, step)?;
    }
    let last = order.len().saturating_sub(1);
    for (_, v) in &f.results {
        let b = st.locs[v].buffer;
        st.touch(b, last);
    }

    let spans: Vec<(u64, Live)> = st.buffers.iter().map(|b| (b.bytes, b.live)).collect();
    let (offsets, arena_bytes) = place(&spans).map_err(|_| LowerError::ArenaOverflow {
        function: f.name.clone(),
        bound: format!("{:?}", st.bindings),
    })?;
    let resolve = |loc: &Loc| -> TensorRef {
        let mut at = loc.at.clone();
        if let Some(b) = loc.buffer {
            at.offset_bytes = at.offset_bytes.add(&Poly::constant(offsets[b] as i64));
        }
        at
    };

    let mut steps = Vec::with_capacity(st.steps.len());
    for pending in st.steps {
        steps.push(match pending {
            PendingStep::Launch {
                node,
                op,
                mut planned,
                buffers,
                outputs,
            } => {
                let mut ptrs = buffers.into_iter();
                for arg in &mut planned.args {
                    if let ArgValue::Ptr(at) = &mut arg.value {
                        let buffer = ptrs.next().expect("one buffer per pointer argument");
                        *at = resolve(&Loc {
                            buffer,
                            at: at.clone(),
                        });
                    }
                }
                check_shared_memory(&planned.spec, &node, target)?;
                let kernel = kernels.intern(&planned);
                Step::Launch(Launch {
                    node,
                    op,
                    kernel,
                    grid: planned.grid,
                    block: planned.spec.threads,
                    dynamic_shared_bytes: if planned.spec.dynamic_shared {
                        planned.spec.shared_bytes
                    } else {
                        0
                    },
                    when: planned.when,
                    note: planned.note,
                    args: planned.args,
                    outputs: outputs.iter().map(resolve).collect(),
                })
            }
            PendingStep::View { node, op, at } => Step::View {
                node,
                op,
                at: resolve(&at),
            },
            PendingStep::Collective {
                node,
                op,
                ranks,
                input,
                output,
            } => Step::Collective(Collective {
                node,
                op,
                ranks,
                input: resolve(&input),
                output: resolve(&output),
            }),
            PendingStep::Missing {
                node,
                op,
                outputs,
                why,
            } => Step::Missing {
                node,
                op,
                outputs: outputs.iter().map(resolve).collect(),
                why,
            },
        });
    }
    let inputs = f
        .inputs()
        .into_iter()
        .map(|n| {
            let v = Value::from(n);
            (f.node(n).name.clone(), st.locs[&v].at.clone())
        })
        .collect();
    let results = f
        .results
        .iter()
        .map(|(name, v)| {
            let loc = &st.locs[v];
            (name.clone(), resolve(loc))
        })
        .collect();
    Ok(Phase {
        function: f.name.clone(),
        max_bindings: limits.bindings(&f.name),
        arena_bytes,
        inputs,
        results,
        steps,
    })
}

fn lower_node(st: &mut State, n: NodeIndex, step: usize) -> Result<(), LowerError> {
    let f = st.f;
    let node = f.node(n);
    let operands = f.operands(n);
    let operand_locs: Vec<Loc> = operands.iter().map(|v| st.locs[v].clone()).collect();
    for l in &operand_locs {
        st.touch(l.buffer, step);
    }
    let value = Value::from(n);
    let view = |st: &mut State, at: Loc| {
        st.locs.insert(value, at.clone());
        st.steps.push(PendingStep::View {
            node: node.name.clone(),
            op: node.op.name().to_string(),
            at,
        });
    };
    match &node.op {
        Op::Input { index } => {
            let at = TensorRef::contiguous(Buf::Input(*index), Poly::zero(), &node.outputs[0]);
            st.locs.insert(value, Loc { buffer: None, at });
        }
        Op::Weight { .. } => {
            let at = TensorRef::contiguous(
                Buf::Weight(node.name.clone()),
                Poly::zero(),
                &node.outputs[0],
            );
            st.locs.insert(value, Loc { buffer: None, at });
        }
        Op::Reshape { shape } => {
            let src = &operand_locs[0];
            let shape: Vec<Poly> = shape.iter().map(Poly::from_dim).collect();
            match src.at.reshape(&shape) {
                Some(at) => view(
                    st,
                    Loc {
                        buffer: src.buffer,
                        at,
                    },
                ),
                None => {
                    // Materialise the operand in row-major order, then view it.
                    let flat = st.fresh(operands[0], step)?;
                    st.copy(n, &flat, src)?;
                    let at = flat
                        .at
                        .reshape(&shape)
                        .expect("a contiguous tensor reshapes");
                    st.locs.insert(
                        value,
                        Loc {
                            buffer: flat.buffer,
                            at,
                        },
                    );
                }
            }
        }
        Op::Slice { axis, start, end } => {
            let src = &operand_locs[0];
            let at = src.at.slice(*axis as usize, *start, *end);
            if at.rows().is_some() {
                view(
                    st,
                    Loc {
                        buffer: src.buffer,
                        at,
                    },
                );
            } else {
                let dst = st.fresh(value, step)?;
                st.copy(
                    n,
                    &dst,
                    &Loc {
                        buffer: src.buffer,
                        at,
                    },
                )?;
                st.locs.insert(value, dst);
            }
        }
        Op::SliceLast {} => {
            let src = &operand_locs[0];
            let n = src.at.shape[0].clone();
            let mut at = src.at.clone();
            at.offset_bytes = at.offset_bytes.add(
                &n.add(&Poly::constant(-1))
                    .mul(&at.strides[0])
                    .scale(at.dtype.size_bytes() as i64),
            );
            at.shape[0] = Poly::constant(1);
            view(
                st,
                Loc {
                    buffer: src.buffer,
                    at,
                },
            );
        }
        Op::AllReduce {
            op: Reduce::Sum,
            ranks,
        } => {
            let input = contiguous(st, n, operands[0], &operand_locs[0], step)?;
            let output = st.output(value, step)?;
            st.locs.insert(value, output.clone());
            st.steps.push(PendingStep::Collective {
                node: node.name.clone(),
                op: CollectiveOp::AllReduceSum,
                ranks: *ranks,
                input,
                output,
            });
        }
        Op::AllGather { axis, ranks } => {
            let input = contiguous(st, n, operands[0], &operand_locs[0], step)?;
            let output = st.output(value, step)?;
            st.locs.insert(value, output.clone());
            all_gather(st, n, *axis as usize, *ranks, input, output, step)?;
        }
        Op::Concat { axis } => {
            if let Some(at) = adjacent_view(&operand_locs, *axis as usize) {
                view(st, at);
                return Ok(());
            }
            let whole = match st.locs.get(&value) {
                Some(l) => l.clone(),
                None => st.fresh(value, step)?,
            };
            st.touch(whole.buffer, step);
            for (part, &v) in operands.iter().enumerate() {
                if st.folded.get(&v) == Some(&(value, part)) {
                    continue;
                }
                let dst = Loc {
                    buffer: whole.buffer,
                    at: concat_part(f, value, &whole.at, part),
                };
                st.copy(n, &dst, &operand_locs[part])?;
            }
            // The parts are in place: from here on the concat is its buffer.
            view(st, whole);
        }
        _ => {
            // Only these kernels read a cache in the prefill's slot; any other op is given the
            // slot's rows copied into the arena.
            let reads_slot = matches!(
                node.op,
                Op::CacheUpdate { .. }
                    | Op::CacheUpdateNorm { .. }
                    | Op::MlaAttend { .. }
                    | Op::MlaAttendAbsorbed { .. }
                    | Op::DsaScore { .. }
            );
            let mut operand_locs = operand_locs;
            if !reads_slot && st.slot.is_some() {
                for (k, l) in operand_locs.iter_mut().enumerate() {
                    if matches!(l.at.buf, Buf::State(_)) {
                        let rows = st.fresh(operands[k], step)?;
                        st.copy(n, &rows, l)?;
                        *l = rows;
                    }
                }
            }
            let outputs: Vec<Loc> = match &node.op {
                Op::CacheUpdate { .. } | Op::CacheUpdateNorm { .. } => node
                    .op
                    .cache_states()
                    .iter()
                    .enumerate()
                    .map(|(k, state)| {
                        let batched = node.op.batched_cache();
                        cache_view(&node.outputs[k], state, batched, st.limits.max_context)
                    })
                    .collect(),
                _ => (0..node.outputs.len())
                    .map(|k| {
                        st.output(
                            Value {
                                node: n,
                                output: k as u32,
                            },
                            step,
                        )
                    })
                    .collect::<Result<_, _>>()?,
            };
            for (k, l) in outputs.iter().enumerate() {
                st.locs.insert(
                    Value {
                        node: n,
                        output: k as u32,
                    },
                    l.clone(),
                );
            }
            let operand_refs: Vec<TensorRef> = operand_locs.iter().map(|l| l.at.clone()).collect();
            let output_refs: Vec<TensorRef> = outputs.iter().map(|l| l.at.clone()).collect();
            let cx = NodeCtx {
                node,
                operands: &operand_refs,
                outputs: &output_refs,
                max_context: st.limits.max_context,
                target: st.target,
                tiled_gemm: match st.variant {
                    Some(Variant::TiledGemm(t)) => Some(t),
                    _ => None,
                },
                decode_gemm: match st.variant {
                    Some(Variant::DecodeGemm(d)) => d,
                    _ => DECODE_GEMM,
                },
                mla_tiles_per_split: match st.variant {
                    Some(Variant::MlaTilesPerSplit(n)) => n,
                    _ => MLA_SPARSE_TILES_PER_SPLIT,
                },
                mla_kernel: match st.variant {
                    Some(Variant::Mla(k)) => Some(k),
                    _ => None,
                },
                moe_down: match st.variant {
                    Some(Variant::MoeDown(f)) => Some(f),
                    _ => None,
                },
                score_ring: match st.variant {
                    Some(Variant::ScoreRing(r)) => r,
                    _ => SCORE_DECODE_RING,
                },
                slot: st.slot(),
                limits: &st.bindings,
                sources: Default::default(),
                scratch: Default::default(),
            };
            let launches = match kernels::lower(&cx) {
                Lowering::Launch(planned) => vec![(planned, cx.sources.take())],
                Lowering::Launches(list) => list,
                Lowering::NotYet(why) => {
                    st.steps.push(PendingStep::Missing {
                        node: node.name.clone(),
                        op: node.op.name().to_string(),
                        outputs,
                        why,
                    });
                    return Ok(());
                }
            };
            // A scratch buffer lives at this step alone, so the planner lends its space to the
            // buffers of other steps.
            let scratch = cx
                .scratch
                .take()
                .iter()
                .map(|at| st.new_buffer(at, step, n))
                .collect::<Result<Vec<_>, _>>()?;
            for (planned, sources) in launches {
                let buffers = sources
                    .into_iter()
                    .map(|s| match s {
                        Source::Operand(i) => operand_locs[i].buffer,
                        Source::Output(k) => outputs[k].buffer,
                        Source::Scratch(k) => Some(scratch[k]),
                        Source::Other => None,
                    })
                    .collect();
                st.steps.push(PendingStep::Launch {
                    node: node.name.clone(),
                    op: node.op.name().to_string(),
                    planned,
                    buffers,
                    outputs: outputs.clone(),
                });
            }
        }
    }
    Ok(())
}

/// `loc` (operand `value` of node `n`) as a contiguous tensor, copied into a fresh buffer when
/// it is a strided view: NCCL reads and writes whole contiguous ranges.
fn contiguous(
    st: &mut State,
    n: NodeIndex,
    value: Value,
    loc: &Loc,
    step: usize,
) -> Result<Loc, LowerError> {
    if loc.at.is_contiguous() {
        return Ok(loc.clone());
    }
    let dst = st.fresh(value, step)?;
    st.copy(n, &dst, loc)?;
    Ok(dst)
}

/// An `all_gather` of `input` along `axis` into `output`. NCCL concatenates the ranks' inputs
/// rank after rank, which is the gather along the first axis; along another axis (the logits'
/// vocabulary) it gathers into a scratch buffer `[ranks, ..input]`, and one copy, reading that
/// buffer with its rank axis moved to `axis`, writes each rank's block into its columns.
fn all_gather(
    st: &mut State,
    n: NodeIndex,
    axis: usize,
    ranks: u64,
    input: Loc,
    output: Loc,
    step: usize,
) -> Result<(), LowerError> {
    let node = st.f.node(n);
    let collective = |st: &mut State, to: Loc| {
        st.steps.push(PendingStep::Collective {
            node: node.name.clone(),
            op: CollectiveOp::AllGather,
            ranks,
            input: input.clone(),
            output: to,
        });
    };
    if axis == 0 {
        collective(st, output);
        return Ok(());
    }
    let rank = input.at.shape.len();
    if rank + 1 > 4 {
        return Err(st.error(
            n,
            format!("a gather of a rank-{rank} tensor along axis {axis} needs a copy of rank {}, and the copy kernel takes at most 4", rank + 1),
        ));
    }
    let mut shape = vec![Poly::constant(ranks as i64)];
    shape.extend(input.at.shape.iter().cloned());
    let staged = TensorRef {
        buf: Buf::Arena,
        offset_bytes: Poly::zero(),
        dtype: input.at.dtype,
        strides: crate::layout::contiguous_strides(&shape),
        shape,
    };
    let staging = Loc {
        buffer: Some(st.new_buffer(&staged, step, n)?),
        at: staged.clone(),
    };
    collective(st, staging.clone());
    // The staging buffer read as [..before, ranks, block, ..after]: its rank axis moved to
    // `axis`, the output's `axis` split into (rank, block).
    let mut src = staged;
    let rank_extent = src.shape.remove(0);
    let rank_stride = src.strides.remove(0);
    src.shape.insert(axis, rank_extent.clone());
    src.strides.insert(axis, rank_stride);
    let mut dst = output.at.clone();
    let block = input.at.shape[axis].clone();
    let inner = dst.strides[axis].clone();
    dst.shape.splice(axis..=axis, [rank_extent, block.clone()]);
    dst.strides.splice(axis..=axis, [block.mul(&inner), inner]);
    let src = Loc {
        buffer: staging.buffer,
        at: src,
    };
    let dst = Loc {
        buffer: output.buffer,
        at: dst,
    };
    st.copy_for(n, &dst, &src, vec![output])
}

/// Refuses a specialisation whose tile needs more shared memory than SM120 has, on every target.
fn check_shared_memory(spec: &kernels::Spec, node: &str, target: Target) -> Result<(), LowerError> {
    let limit = target.tile_shared_memory_limit();
    if spec.shared_bytes > limit {
        return Err(LowerError::SharedMemory {
            template: spec.template.to_string(),
            node: node.to_string(),
            need: spec.shared_bytes,
            limit,
            target,
        });
    }
    Ok(())
}

/// The concat as a view, when its parts already lie side by side in one buffer in order (the
/// rotated and the plain halves of a head that one kernel wrote, say): no copy at all.
fn adjacent_view(parts: &[Loc], axis: usize) -> Option<Loc> {
    let first = parts.first()?;
    let mut at = first.at.clone();
    for p in &parts[1..] {
        let step = at.strides[axis]
            .mul(&at.shape[axis])
            .scale(at.dtype.size_bytes() as i64);
        let lines_up = p.buffer == first.buffer
            && p.at.buf == at.buf
            && p.at.dtype == at.dtype
            && p.at.strides == at.strides
            && p.at.offset_bytes == at.offset_bytes.add(&step)
            && p.at
                .shape
                .iter()
                .enumerate()
                .all(|(k, d)| k == axis || *d == at.shape[k]);
        if !lines_up {
            return None;
        }
        at.shape[axis] = at.shape[axis].add(&p.at.shape[axis]);
    }
    Some(Loc {
        buffer: first.buffer,
        at,
    })
}

/// The cache state as the `[t, ..]` (prefill) or `[b, t, ..]` (decode) view `cache.update`
/// returns, over a `[max_batch, max_context, ..]` allocation.
fn cache_view(ty: &TensorType, state: &str, batched: bool, max_context: u64) -> Loc {
    let mut at = TensorRef::contiguous(Buf::State(state.to_string()), Poly::zero(), ty);
    if batched {
        let row = Poly::product(&at.shape[2..]);
        at.strides[0] = row.scale(max_context as i64);
    }
    Loc { buffer: None, at }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tile_past_99_kib_is_refused_even_where_the_gpu_has_more() {
        let spec = |bytes| kernels::Spec {
            template: "gemm",
            params: Default::default(),
            threads: 256,
            shared_bytes: bytes,
            dynamic_shared: true,
        };
        for target in Target::ALL {
            assert!(check_shared_memory(&spec(99 * 1024), "n", target).is_ok());
            let err = check_shared_memory(&spec(99 * 1024 + 1), "n", target).unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains("101377") && text.contains("101376") && text.contains("smaller tile"),
                "{text}"
            );
        }
    }
}
