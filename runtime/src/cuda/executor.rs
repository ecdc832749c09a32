//! The CUDA executor: runs a compiled artifact's phases on one GPU, over the cache slots the
//! artifact holds (`--max-batch`): a prefill fills the slot its `slot` input names, decode row
//! `i` reads and writes slot `i`.
//!
//! It reads only what the artifact holds (the manifest and the cubin) and the weights: every
//! weight is made by its recipe and uploaded once (or, for random weights, generated on the GPU),
//! the caches and one arena (the larger phase's) are allocated once, and each call uploads its
//! inputs, runs the phase's launches in order and reads back its results. Before any of that the
//! bytes the manifest needs are compared with the GPU's free memory, so a model that cannot fit
//! fails in a second with the numbers, not with an allocation error after minutes of loading.
//!
//! Given the IR the artifact was lowered from ([`CudaExecutor::observe`]), it also shows every
//! node's outputs to the run's hook, as the interpreter does (`--trace`, `--check-finite`): after
//! the step that completes a node (its launch, or for a view or a folded concat the step that
//! names its location) it synchronises and reads the node's values back from where the schedule
//! put them, so a GPU trace lines up with a CPU trace by IR node name.
//!
//! As one rank of a tensor-parallel group ([`CudaExecutor::load_rank`], then
//! [`CudaExecutor::join`]) it runs its rank's artifact on its own GPU and stream and queues the
//! schedule's collectives there through NCCL. It then waits for a call by polling, not by a
//! blocking synchronisation, so that the collective it is stuck in can be named (see
//! [`Progress`]) while the group's driver decides to abort.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream};
use glmc_codegen::artifact::{Manifest, StateEntry, WeightEntry};
use glmc_codegen::expr::Poly;
use glmc_codegen::expr::{decode_bindings, prefill_bindings, Bindings};
use glmc_codegen::layout::{Buf, TensorRef};
use glmc_codegen::schedule::{ArgValue, Collective, Launch, Phase, Step, Work};
use glmc_codegen::Target;
use glmc_ir::{Module, Node, Op};

use super::graphs::{GraphSize, Graphs};
use super::nccl::Comm;
use super::{driver, launch, random_fill, CudaError, Gpu, Kernels, LaunchMode, Memory};
use crate::against_config::human_bytes;
use crate::generate::{Call, Executor, GenerateError, NodeHook, PhaseKind};
use crate::interp::WeightSource;
use crate::random_weights::RandomWeights;
use crate::tensor::Tensor;
use crate::trace::Fault;

/// What an artifact allocates on the GPU, from its manifest alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceBytes {
    pub weights: u64,
    /// The KV caches and indexer states, at the manifest's batch and context.
    pub states: u64,
    /// The activation arena: the larger phase's.
    pub arena: u64,
}

impl DeviceBytes {
    pub fn of<C>(manifest: &Manifest<C>) -> DeviceBytes {
        DeviceBytes {
            weights: manifest
                .weights
                .iter()
                .map(|w| w.shape.iter().product::<u64>() * w.dtype.size_bytes())
                .sum(),
            states: manifest
                .states
                .iter()
                .map(|s| {
                    s.max_batch
                        * s.max_context
                        * s.row.iter().product::<u64>()
                        * s.dtype.size_bytes()
                })
                .sum(),
            arena: manifest
                .phases
                .iter()
                .map(|p| p.arena_bytes)
                .max()
                .unwrap_or(0),
        }
    }

    pub fn total(&self) -> u64 {
        self.weights + self.states + self.arena
    }

    /// Whether they fit in `free` bytes of GPU memory.
    pub fn check(&self, free: u64) -> Result<(), OutOfMemory> {
        if self.total() > free {
            return Err(OutOfMemory { needs: *self, free });
        }
        Ok(())
    }
}

/// A model predicted not to fit the GPU, before anything is allocated.
#[derive(Debug, thiserror::Error)]
#[error(
    "the model needs {} ({} of weights, {} of KV caches and states, {} of activations), the GPU has {} free: use --tp or a quantised weight format",
    human_bytes(.needs.total()),
    human_bytes(.needs.weights),
    human_bytes(.needs.states),
    human_bytes(.needs.arena),
    human_bytes(*.free)
)]
pub struct OutOfMemory {
    pub needs: DeviceBytes,
    pub free: u64,
}

/// Spreads seeds over the hash's input, so seeds 1 and 2 fill unrelated values.
const GOLDEN_KEY: u64 = 0x9E37_79B9_7F4A_7C15;

/// One call timed by [`CudaExecutor::time`].
#[derive(Clone, Debug)]
pub struct CallTiming {
    /// Wall time on the host from the first launch until the GPU finished the last.
    pub host_seconds: f64,
    /// GPU time from before the first launch to after the last (CUDA events).
    pub gpu_seconds: f64,
    /// Each launch that ran, in order, when the call was timed per launch.
    pub launches: Vec<LaunchTime>,
}

/// One launch's GPU time, between CUDA events recorded right before and after it.
#[derive(Clone, Debug)]
pub struct LaunchTime {
    pub node: String,
    pub op: String,
    pub kernel: String,
    pub seconds: f64,
}

/// Where the executor's weights come from.
enum Weights<'a> {
    /// Made on the host by their recipes (from a checkpoint) and uploaded one by one.
    Host(&'a dyn WeightSource),
    /// Generated on the GPU by the kernel of `cubin` (compiled from [`random_fill::SOURCE`]).
    Random {
        weights: &'a RandomWeights,
        cubin: &'a [u8],
    },
}

/// The IR nodes of the two phases, by name.
struct PhaseNodes {
    prefill: HashMap<String, Node>,
    decode: HashMap<String, Node>,
}

/// What a rank is doing, in words, for the group's driver to quote when a call times out: the
/// collective it waits for, or the call it is in.
pub type Progress = Arc<Mutex<String>>;

/// A tensor-parallel rank's place in its group.
struct RankComm {
    comm: Comm,
    progress: Progress,
    /// Decode sizes that ran once launch by launch: a graph is captured only at a size's
    /// second step, so NCCL has set up the connections its collectives use outside a capture.
    warmed: HashSet<GraphSize>,
}

/// A loaded artifact on one GPU.
pub struct CudaExecutor {
    gpu: Gpu,
    /// The decode graphs captured so far, made at the first replay. Declared before `kernels`
    /// and `rank`, so they are destroyed before the module whose functions they launch is
    /// unloaded and before the communicator their collectives use is aborted.
    graphs: Option<Graphs>,
    kernels: Kernels,
    /// The rank's communicator, in a tensor-parallel group.
    rank: Option<RankComm>,
    // Shared, so a call holds its schedule while it launches without copying it.
    prefill: Arc<Phase>,
    decode: Arc<Phase>,
    vocab: Option<usize>,
    max: glmc_codegen::Limits,
    memory: Memory,
    /// The IR nodes of each phase by name, when the run observes nodes.
    nodes: Option<PhaseNodes>,
    fault: Option<Fault>,
    /// Each phase's inputs, in its order, allocated once at their largest (ids and positions
    /// of a step change every call; their buffers do not).
    prefill_inputs: Vec<CudaSlice<u8>>,
    decode_inputs: Vec<CudaSlice<u8>>,
    /// The states' entries, for [`CudaExecutor::fill_states`].
    state_entries: Vec<StateEntry>,
    /// The cache slot of the prefill running (traces read its caches there).
    slot: u64,
    /// Whether decode steps replay CUDA graphs (when no node is observed and no fault set).
    use_graphs: bool,
    /// Whether a call reads its results back: a tensor-parallel group takes one rank's.
    read_results: bool,
    // The allocations `memory` points into: they live as long as the executor.
    _arena: CudaSlice<u8>,
    _weights: Vec<CudaSlice<u8>>,
    _states: Vec<CudaSlice<u8>>,
}

fn artifact_error(why: impl Into<String>) -> CudaError {
    CudaError::Artifact(why.into())
}

impl CudaExecutor {
    /// Loads `manifest` and `cubin` on GPU 0 with weights from `weights`.
    pub fn load<C>(
        manifest: &Manifest<C>,
        cubin: &[u8],
        weights: &dyn WeightSource,
    ) -> Result<CudaExecutor, GenerateError> {
        CudaExecutor::load_with(Gpu::open(0)?, manifest, cubin, Weights::Host(weights))
    }

    /// Loads `manifest` and `cubin` on GPU 0 with `weights` generated on the GPU by
    /// `random_cubin`, [`random_fill::SOURCE`] compiled for it.
    pub fn load_random<C>(
        manifest: &Manifest<C>,
        cubin: &[u8],
        weights: &RandomWeights,
        random_cubin: &[u8],
    ) -> Result<CudaExecutor, GenerateError> {
        let weights = Weights::Random {
            weights,
            cubin: random_cubin,
        };
        CudaExecutor::load_with(Gpu::open(0)?, manifest, cubin, weights)
    }

    /// Loads one tensor-parallel rank's `manifest` and `cubin` on `gpu` (opened with
    /// [`Gpu::open_for_rank`]), its weights generated on the GPU by `random` (the weights and
    /// [`random_fill::SOURCE`] compiled) when given, else made from `host`. It computes nothing
    /// with other ranks until [`CudaExecutor::join`] gives it its communicator.
    pub fn load_rank<C>(
        gpu: Gpu,
        manifest: &Manifest<C>,
        cubin: &[u8],
        host: &dyn WeightSource,
        random: Option<(&RandomWeights, &[u8])>,
    ) -> Result<CudaExecutor, GenerateError> {
        let weights = match random {
            Some((weights, cubin)) => Weights::Random { weights, cubin },
            None => Weights::Host(host),
        };
        CudaExecutor::load_with(gpu, manifest, cubin, weights)
    }

    /// Makes this executor a rank of the group `comm` joined: the schedule's collectives run
    /// through it, and waits report to `progress`.
    pub fn join(mut self, comm: Comm, progress: Progress) -> CudaExecutor {
        self.rank = Some(RankComm {
            comm,
            progress,
            warmed: HashSet::new(),
        });
        self
    }

    /// The GPU this executor runs on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    fn load_with<C>(
        gpu: Gpu,
        manifest: &Manifest<C>,
        cubin: &[u8],
        weights: Weights,
    ) -> Result<CudaExecutor, GenerateError> {
        if !manifest.complete {
            return Err(artifact_error(format!(
                "the artifact is incomplete (no kernels yet for {}): it cannot run",
                manifest.missing_ops.join(", ")
            ))
            .into());
        }
        let (major, minor) = gpu.compute_capability()?;
        let target: Target = manifest
            .target
            .parse()
            .map_err(|e| artifact_error(format!("manifest.ron: {e}")))?;
        if !target.runs_on(major, minor) {
            let fix = Target::for_gpu(major, minor)
                .map_or("a target glmc has for it".to_string(), |t| {
                    t.name().to_string()
                });
            return Err(artifact_error(format!(
                "the artifact is {}, this GPU is sm_{major}{minor}: recompile with --target {fix}",
                manifest.arch
            ))
            .into());
        }
        let phase = |name: &str| {
            manifest
                .phases
                .iter()
                .find(|p| p.function == name)
                .map(|p| Arc::new(p.clone()))
                .ok_or_else(|| artifact_error(format!("the manifest has no `{name}` phase")))
        };
        let (prefill, decode) = (phase("prefill")?, phase("decode")?);
        // cudarc frees device memory asynchronously into the stream's pool, which hands it
        // back to the driver only at a synchronisation: without one, the memory of an executor
        // dropped just before (glmc bench's sparse run before its dense one) still reads as used.
        gpu.ctx
            .synchronize()
            .map_err(driver("synchronising before reading the free GPU memory"))?;
        let (free, _total) = gpu
            .ctx
            .mem_get_info()
            .map_err(driver("reading the free GPU memory"))?;
        DeviceBytes::of(manifest).check(free as u64)?;
        let kernels = gpu.load(cubin, LaunchMode::of(manifest.programmatic_launch))?;
        let arena = gpu.alloc(prefill.arena_bytes.max(decode.arena_bytes) as usize)?;
        let mut memory = Memory {
            arena: gpu.address(&arena),
            ..Default::default()
        };
        let mut held = Vec::with_capacity(manifest.weights.len());
        let mut generator = match &weights {
            Weights::Random { cubin, .. } => Some(gpu.load(cubin, LaunchMode::Plain)?),
            Weights::Host(_) => None,
        };
        // Each weight is uploaded in the dtype the artifact was compiled for, whatever the
        // checkpoint stores: an f32 validation artifact gets f32 weights from a bf16 checkpoint.
        for w in &manifest.weights {
            let on_device = match (&weights, generator.as_mut()) {
                (Weights::Random { weights, .. }, Some(kernels)) => {
                    random_fill::generate(&gpu, kernels, weights, w)?
                }
                _ => None,
            };
            let buf = match on_device {
                Some(buf) => buf,
                None => upload(&gpu, &weights, w)?,
            };
            memory.weights.insert(w.name.clone(), gpu.address(&buf));
            held.push(buf);
        }
        let mut states = Vec::with_capacity(manifest.states.len());
        for s in &manifest.states {
            let row: u64 = s.row.iter().product();
            let buf =
                gpu.alloc((s.max_batch * s.max_context * row * s.dtype.size_bytes()) as usize)?;
            memory.states.insert(s.name.clone(), gpu.address(&buf));
            states.push(buf);
        }
        let input_buffers = |phase: &Phase| -> Result<Vec<CudaSlice<u8>>, CudaError> {
            phase
                .inputs
                .iter()
                .map(|(name, at)| {
                    let bytes = at.bytes().eval(&phase.max_bindings).ok_or_else(|| {
                        artifact_error(format!(
                            "input {name} of @{} has no size at the artifact's limits",
                            phase.function
                        ))
                    })?;
                    gpu.alloc(bytes as usize)
                })
                .collect()
        };
        let (prefill_inputs, decode_inputs) = (input_buffers(&prefill)?, input_buffers(&decode)?);
        // The logits' width, or in a greedy build without logits the embedding table's rows.
        let embed_rows = || {
            prefill
                .launches()
                .filter(|l| l.op == "embed")
                .find_map(|l| {
                    l.args.iter().find_map(|a| match (&a.name[..], &a.value) {
                        ("table", ArgValue::Ptr(t)) => t.shape.first().cloned(),
                        _ => None,
                    })
                })
        };
        let vocab = prefill
            .results
            .iter()
            .find(|(n, _)| n == "logits")
            .and_then(|(_, r)| r.shape.last().cloned())
            .or_else(embed_rows)
            .and_then(|d| d.as_const())
            .map(|v| v as usize);
        Ok(CudaExecutor {
            gpu,
            kernels,
            rank: None,
            prefill,
            decode,
            vocab,
            max: manifest.limits,
            memory,
            nodes: None,
            fault: None,
            prefill_inputs,
            decode_inputs,
            state_entries: manifest.states.clone(),
            slot: 0,
            use_graphs: true,
            read_results: true,
            graphs: None,
            _arena: arena,
            _weights: held,
            _states: states,
        })
    }

    /// Shows every node of `module` (the IR the artifact was lowered from) to the run's hook
    /// after it runs. Each step then waits for the GPU and reads its node's values back: a
    /// debugging mode, far slower than a plain run.
    pub fn observe(&mut self, module: &Module) -> Result<(), CudaError> {
        let nodes = |kind: PhaseKind| {
            let f = module.function(kind.name()).ok_or_else(|| {
                artifact_error(format!(
                    "the IR has no `{}` function to name the artifact's nodes",
                    kind.name()
                ))
            })?;
            Ok::<_, CudaError>(
                f.canonical_order()
                    .into_iter()
                    .map(|n| f.node(n))
                    .filter(|n| !matches!(n.op, Op::Weight { .. } | Op::Input { .. }))
                    .map(|n| (n.name.clone(), n.clone()))
                    .collect(),
            )
        };
        self.nodes = Some(PhaseNodes {
            prefill: nodes(PhaseKind::Prefill)?,
            decode: nodes(PhaseKind::Decode)?,
        });
        Ok(())
    }

    /// Whether decode steps replay CUDA graphs (the default) or launch kernel by kernel; both
    /// compute the same values (`--no-cuda-graphs` compares them).
    pub fn with_graphs(mut self, on: bool) -> CudaExecutor {
        self.use_graphs = on;
        self
    }

    /// Whether calls read their results back (the default); without, a call still waits for
    /// its GPU work and returns no tensors.
    pub fn with_results(mut self, on: bool) -> CudaExecutor {
        self.read_results = on;
        self
    }

    /// Captures the CUDA graph of decode at the sizes of `bindings` unless it was captured
    /// before (see [`super::graphs`]): the bindings it runs under, its context rounded up to a
    /// bucket, and its key.
    fn decode_graph(
        &mut self,
        phase: &Phase,
        bindings: &Bindings,
    ) -> Result<Option<(Bindings, GraphSize)>, CudaError> {
        let size = |name: &str| {
            bindings
                .get(name)
                .copied()
                .ok_or_else(|| artifact_error(format!("a decode step without `{name}`")))
        };
        let bindings = Graphs::bindings(size("b")?, size("t")?, self.max.max_context);
        let key = (bindings["b"], bindings["t"]);
        if self.graphs.is_none() {
            self.graphs = Some(Graphs::new(&self.gpu)?);
        }
        let graphs = self.graphs.as_mut().expect("made above");
        if let Some(rank) = self.rank.as_mut() {
            if !graphs.has(key) && rank.warmed.insert(key) {
                return Ok(None);
            }
        }
        if !graphs.has(key) {
            // Kernels are looked up (and allowed their shared memory) before the capture, so
            // nothing but launches happens while the stream is capturing.
            for l in phase.launches() {
                self.kernels.function(&l.kernel, l.dynamic_shared_bytes)?;
            }
            let (kernels, memory) = (&mut self.kernels, &self.memory);
            let comm = self.rank.as_ref().map(|r| &r.comm);
            let record = |stream: &Arc<CudaStream>| {
                phase.work().try_for_each(|w| match w {
                    Work::Launch(l) => launch(stream, kernels, l, memory, &bindings),
                    Work::Collective(c) => enqueue(comm, stream, c, memory, &bindings),
                })
            };
            // A driver that cannot capture the step still runs it, launch by launch: the run
            // says so once and keeps going that way.
            if let Err(e) = graphs.capture(key, record) {
                eprintln!("warning: decode steps run launch by launch from here on, a CUDA graph could not be captured: {e}");
                self.use_graphs = false;
                return Ok(None);
            }
        }
        Ok(Some((bindings, key)))
    }

    /// Launches `l` on the executor's stream under `bindings`.
    fn launch_one(&mut self, l: &Launch, bindings: &Bindings) -> Result<(), CudaError> {
        launch(
            &self.gpu.stream,
            &mut self.kernels,
            l,
            &self.memory,
            bindings,
        )
    }

    /// Queues the phase's launches and collectives on the executor's stream under `bindings`;
    /// the collectives each followed by an event, which [`CudaExecutor::wait`] polls.
    fn queue(
        &mut self,
        phase: &Phase,
        bindings: &Bindings,
    ) -> Result<Vec<(&'static str, String, CudaEvent)>, CudaError> {
        let mut marks = Vec::new();
        for w in phase.work() {
            match w {
                Work::Launch(l) => self.launch_one(l, bindings)?,
                Work::Collective(c) => {
                    self.collective(c, bindings)?;
                    let event = self
                        .gpu
                        .stream
                        .record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
                        .map_err(driver("recording an event after a collective"))?;
                    marks.push((c.op.name(), c.node.clone(), event));
                }
            }
        }
        Ok(marks)
    }

    /// Queues collective `c` on the executor's stream.
    fn collective(&self, c: &Collective, bindings: &Bindings) -> Result<(), CudaError> {
        enqueue(
            self.rank.as_ref().map(|r| &r.comm),
            &self.gpu.stream,
            c,
            &self.memory,
            bindings,
        )
    }

    /// Waits until `stream` has done its work. A rank polls instead of blocking, and while a
    /// collective of `marks` (each followed by its event) is incomplete it says which one in
    /// its [`Progress`], for the group's driver to name if the call times out: `counted` is
    /// how many of the call's collectives came before the first of `marks`, and how many the
    /// call has in all.
    fn wait(
        &self,
        stream: &Arc<CudaStream>,
        marks: &[(&'static str, String, CudaEvent)],
        counted: (usize, usize),
        what: &str,
    ) -> Result<(), CudaError> {
        let Some(rank) = &self.rank else {
            return stream.synchronize().map_err(driver("synchronizing"));
        };
        let done = stream
            .record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(driver("recording the call's last event"))?;
        let mut next = 0;
        let mut said = usize::MAX;
        let mut polls = 0u32;
        loop {
            while next < marks.len()
                && marks[next]
                    .2
                    .try_is_complete()
                    .map_err(driver("waiting for a collective"))?
            {
                next += 1;
            }
            if done
                .try_is_complete()
                .map_err(driver(format!("waiting for {what}")))?
            {
                return Ok(());
            }
            if said != next {
                said = next;
                let text = match marks.get(next) {
                    Some((op, node, _)) => format!(
                        "waits for {op} \"{node}\" (collective {} of {} of {what})",
                        counted.0 + next + 1,
                        counted.1
                    ),
                    None => format!("waits for {what} to finish on its GPU"),
                };
                *rank.progress.lock().unwrap_or_else(|e| e.into_inner()) = text;
            }
            // Spin briefly (a decode step takes microseconds to milliseconds), then yield
            // the core.
            polls = polls.saturating_add(1);
            if polls > 1000 {
                std::thread::sleep(std::time::Duration::from_micros(20));
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Runs a decode step from its CUDA graph, after the inputs' uploads, and waits for it: the
    /// bindings it ran under.
    fn replay_decode(
        &mut self,
        phase: &Phase,
        bindings: &Bindings,
    ) -> Result<Option<Bindings>, CudaError> {
        let Some((bindings, key)) = self.decode_graph(phase, bindings)? else {
            return Ok(None);
        };
        self.gpu.synchronize()?;
        let graphs = self.graphs.as_ref().expect("made by decode_graph");
        graphs.launch(key)?;
        self.wait(graphs.stream(), &[], (0, 0), "a decode step's CUDA graph")?;
        Ok(Some(bindings))
    }

    /// Breaks the node of `fault` after each of its launches (a test hook, see [`Fault`]).
    pub fn with_fault(mut self, fault: Option<Fault>) -> CudaExecutor {
        self.fault = fault;
        self
    }

    /// Overwrites the elements at `at` with `t`'s values.
    fn write(&self, at: &TensorRef, bindings: &Bindings, t: &Tensor) -> Result<(), CudaError> {
        let offsets = at
            .element_offsets(bindings)
            .ok_or_else(|| artifact_error(format!("{at} is not bound by {bindings:?}")))?;
        let Some(lo) = offsets.iter().min().copied() else {
            return Ok(());
        };
        let size = at.dtype.size_bytes();
        let hi = offsets.iter().max().map_or(lo, |&o| o + size);
        let base = self
            .memory
            .base(&at.buf)
            .ok_or_else(|| artifact_error(format!("no memory for {}", at.buf)))?;
        let mut bytes = self.gpu.read_bytes(base + lo, (hi - lo) as usize)?;
        let values = t
            .to_bytes(at.dtype)
            .map_err(|e| artifact_error(e.to_string()))?;
        let size = size as usize;
        for (k, &o) in offsets.iter().enumerate() {
            let o = (o - lo) as usize;
            bytes[o..o + size].copy_from_slice(&values[k * size..(k + 1) * size]);
        }
        self.gpu.write_bytes(base + lo, &bytes)
    }

    /// After step `step` of a call: breaks the node it completes when the fault names it, and
    /// shows the node's outputs to `hook` when the run observes nodes.
    fn after_step(
        &self,
        kind: PhaseKind,
        step: &Step,
        bindings: &Bindings,
        call: Call,
        hook: &mut NodeHook<'_>,
    ) -> Result<(), GenerateError> {
        let (name, outputs) = match step {
            Step::Launch(l) => (&l.node, &l.outputs[..]),
            Step::Collective(c) => (&c.node, std::slice::from_ref(&c.output)),
            Step::View { node, at, .. } => (node, std::slice::from_ref(at)),
            Step::Missing { .. } => return Ok(()),
        };
        let node = self.nodes.as_ref().and_then(|n| match kind {
            PhaseKind::Prefill => n.prefill.get(name),
            PhaseKind::Decode => n.decode.get(name),
        });
        let rank = self.rank.as_ref().map_or(0, |r| r.comm.rank());
        let broken = self
            .fault
            .as_ref()
            .filter(|f| &f.node == name && f.rank == rank);
        if node.is_none() && broken.is_none() {
            return Ok(());
        }
        let mut values = Vec::with_capacity(outputs.len());
        for at in outputs {
            let at = &self.in_slot(kind, at);
            let mut t = self.read(at, bindings)?;
            if let Some(fault) = broken {
                t = fault.apply(&t);
                self.write(at, bindings, &t)?;
            }
            values.push(t);
        }
        let Some(node) = node else {
            return Ok(());
        };
        // A reshape the lowering materialised is read where its operand's copy landed, in the
        // operand's shape: give it the node's.
        let values = values
            .into_iter()
            .zip(&node.outputs)
            .map(|(t, ty)| {
                let dims: Option<Vec<usize>> = ty
                    .shape
                    .iter()
                    .map(|d| Poly::from_dim(d).eval(bindings).map(|v| v as usize))
                    .collect();
                match dims {
                    Some(dims)
                        if dims != t.shape() && dims.iter().product::<usize>() == t.numel() =>
                    {
                        t.reshape(dims).map_err(|e| artifact_error(e.to_string()))
                    }
                    _ => Ok(t),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<&Tensor> = values.iter().collect();
        hook(call, rank, node, &refs)
    }

    /// In a call run step by step (observed, or with a fault): a rank waits for collective `c`,
    /// just queued, to complete before anything reads its GPU's memory back, polling and
    /// naming it (see [`CudaExecutor::wait`]), so that a read never blocks in a collective a
    /// lost rank never joins.
    fn wait_collective(
        &self,
        c: &Collective,
        counted: (usize, usize),
        what: &str,
    ) -> Result<(), CudaError> {
        if self.rank.is_none() {
            return Ok(());
        }
        let event = self
            .gpu
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(driver("recording an event after a collective"))?;
        let marks = [(c.op.name(), c.node.clone(), event)];
        self.wait(&self.gpu.stream, &marks, counted, what)
    }

    /// Checks `inputs` against phase `kind` and uploads them into its input buffers: the
    /// phase and the sizes of the call.
    fn upload_inputs(
        &mut self,
        kind: PhaseKind,
        inputs: &[Tensor],
    ) -> Result<(Arc<Phase>, Bindings), CudaError> {
        let bindings = self.bindings(kind, inputs)?;
        if kind == PhaseKind::Prefill {
            self.slot = match inputs.get(5).map(Tensor::as_i64) {
                Some(Ok(&[slot])) => slot as u64,
                _ => 0,
            };
        }
        let phase = Arc::clone(self.phase(kind));
        if phase.inputs.len() != inputs.len() {
            return Err(artifact_error(format!(
                "@{} takes {} inputs, {} given",
                phase.function,
                phase.inputs.len(),
                inputs.len()
            )));
        }
        let buffers = match kind {
            PhaseKind::Prefill => &mut self.prefill_inputs,
            PhaseKind::Decode => &mut self.decode_inputs,
        };
        for (((name, at), t), buf) in phase.inputs.iter().zip(inputs).zip(buffers.iter_mut()) {
            let Buf::Input(index) = at.buf else {
                return Err(artifact_error(format!("input {name} is not an argument")));
            };
            let bytes = t
                .to_bytes(at.dtype)
                .map_err(|e| artifact_error(format!("input {name}: {e}")))?;
            self.gpu.upload_into(&bytes, buf)?;
            self.memory.inputs.insert(index, self.gpu.address(buf));
        }
        Ok((phase, bindings))
    }

    /// Runs phase `kind` on `inputs` like a call of [`Executor::run`] (the caches persist), but
    /// reads no result back and times it instead: the GPU time between events before the first
    /// launch and after the last, the host's wall time from the first launch until the GPU is
    /// done, and with [`Timing::PerLaunch`] each launch between its own pair of events. The
    /// events around each launch add their own gaps, so a step timed per launch is slower than
    /// one that is not: compare the sum of the launches with a step timed without them. With
    /// [`Timing::Graph`] a decode step is replayed from its CUDA graph instead.
    pub fn time(
        &mut self,
        kind: PhaseKind,
        inputs: &[Tensor],
        timing: Timing,
    ) -> Result<CallTiming, GenerateError> {
        let (phase, bindings) = self.upload_inputs(kind, inputs)?;
        self.gpu.synchronize()?;
        if timing == Timing::Graph {
            return Ok(self.time_graph(kind, &phase, &bindings)?);
        }
        let per_launch = timing == Timing::PerLaunch;
        let record = |gpu: &Gpu| -> Result<CudaEvent, CudaError> {
            gpu.stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(driver("recording an event"))
        };
        let wall = std::time::Instant::now();
        let start = record(&self.gpu)?;
        let mut pairs = Vec::new();
        for w in phase.work() {
            let l = match w {
                Work::Launch(l) => l,
                Work::Collective(c) => {
                    self.collective(c, &bindings)?;
                    continue;
                }
            };
            // An alternative for other sizes, or an empty grid, launches nothing.
            let runs = l.when.as_ref().map_or(Some(true), |g| g.holds(&bindings)) == Some(true)
                && l.grid.eval(&bindings).is_some_and(|g| g > 0);
            if !(per_launch && runs) {
                self.launch_one(l, &bindings)?;
                continue;
            }
            let before = record(&self.gpu)?;
            self.launch_one(l, &bindings)?;
            pairs.push((l, before, record(&self.gpu)?));
        }
        let end = record(&self.gpu)?;
        end.synchronize().map_err(driver("waiting for the step"))?;
        let host_seconds = wall.elapsed().as_secs_f64();
        let launches = pairs
            .iter()
            .map(|(l, a, b)| {
                Ok(LaunchTime {
                    node: l.node.clone(),
                    op: l.op.clone(),
                    kernel: l.kernel.clone(),
                    seconds: event_seconds(a, b)?,
                })
            })
            .collect::<Result<Vec<_>, CudaError>>()?;
        Ok(CallTiming {
            host_seconds,
            gpu_seconds: event_seconds(&start, &end)?,
            launches,
        })
    }

    /// A decode step replayed from its CUDA graph (captured first when it is new), timed like
    /// [`CudaExecutor::time`]'s whole step.
    fn time_graph(
        &mut self,
        kind: PhaseKind,
        phase: &Phase,
        bindings: &Bindings,
    ) -> Result<CallTiming, CudaError> {
        if kind != PhaseKind::Decode {
            return Err(artifact_error("only decode steps replay CUDA graphs"));
        }
        let Some((_, key)) = self.decode_graph(phase, bindings)? else {
            return Err(artifact_error(
                "the decode step could not be captured into a CUDA graph",
            ));
        };
        let graphs = self.graphs.as_ref().expect("made by decode_graph");
        let event = || {
            graphs
                .stream()
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(driver("recording an event"))
        };
        let wall = std::time::Instant::now();
        let start = event()?;
        graphs.launch(key)?;
        let end = event()?;
        end.synchronize().map_err(driver("waiting for the step"))?;
        Ok(CallTiming {
            host_seconds: wall.elapsed().as_secs_f64(),
            gpu_seconds: event_seconds(&start, &end)?,
            launches: Vec::new(),
        })
    }

    /// Fills every KV cache and indexer state, all sequences and positions, with random values
    /// (uniform, unit variance, like the normalised rows a prefill writes) from `seed`, made by
    /// the generator of `random_cubin` ([`random_fill::SOURCE`] compiled for this GPU). A
    /// benchmark states a long context this way instead of prefilling it: decode reads the same
    /// bytes either way.
    pub fn fill_states(&mut self, random_cubin: &[u8], seed: u64) -> Result<(), CudaError> {
        let mut kernels = self.gpu.load(random_cubin, LaunchMode::Plain)?;
        for s in &self.state_entries {
            let address = self
                .memory
                .states
                .get(&s.name)
                .copied()
                .ok_or_else(|| artifact_error(format!("no memory for state {}", s.name)))?;
            let numel = s.max_batch * s.max_context * s.row.iter().product::<u64>();
            let key = crate::random_weights::name_hash(&s.name) ^ seed.wrapping_mul(GOLDEN_KEY);
            random_fill::fill_uniform(
                &self.gpu,
                &mut kernels,
                address,
                numel,
                s.dtype,
                key,
                3f32.sqrt(),
            )?;
        }
        self.gpu.synchronize()
    }

    /// `at` where this call keeps it: a prefill's view of a cache state names slot 0's rows,
    /// which its kernels move to the call's slot on the device.
    fn in_slot(&self, kind: PhaseKind, at: &TensorRef) -> TensorRef {
        let mut at = at.clone();
        if kind == PhaseKind::Prefill {
            let stride = glmc_codegen::kernels::slot_stride(&at, self.max.max_context);
            let bytes = stride.scale((self.slot * at.dtype.size_bytes()) as i64);
            at.offset_bytes = at.offset_bytes.add(&bytes);
        }
        at
    }

    fn phase(&self, kind: PhaseKind) -> &Arc<Phase> {
        match kind {
            PhaseKind::Prefill => &self.prefill,
            PhaseKind::Decode => &self.decode,
        }
    }

    /// The sizes of this call, checked against what the artifact was planned for.
    fn bindings(&self, kind: PhaseKind, inputs: &[Tensor]) -> Result<Bindings, CudaError> {
        let rows = inputs.first().map(Tensor::numel).unwrap_or(0) as u64;
        let positions = inputs
            .get(1)
            .and_then(|t| t.as_i64().ok())
            .ok_or_else(|| artifact_error("the second input must be the positions"))?;
        let context = positions.iter().max().map_or(0, |&p| p as u64 + 1);
        if context > self.max.max_context {
            return Err(artifact_error(format!(
                "position {} is past the {} tokens of context the artifact was compiled for: recompile with a larger --max-context",
                context - 1,
                self.max.max_context
            )));
        }
        Ok(match kind {
            PhaseKind::Prefill => {
                if rows > self.max.max_prefill_tokens {
                    return Err(artifact_error(format!(
                        "a prefill of {rows} tokens is more than the {} the artifact was compiled for: recompile with a larger --max-prefill-tokens",
                        self.max.max_prefill_tokens
                    )));
                }
                // The kernels address the slot's caches from the device copy of `slot`: one
                // past the caches would write outside them.
                if let Some(t) = inputs.get(5) {
                    let &[slot] = t.as_i64().unwrap_or_default() else {
                        return Err(artifact_error(format!(
                            "the prefill's slot input is {:?}, not one cache slot",
                            t.shape()
                        )));
                    };
                    if !(0..self.max.max_batch as i64).contains(&slot) {
                        return Err(artifact_error(format!(
                            "cache slot {slot} is outside the {} sequences the artifact was compiled for: recompile with a larger --max-batch",
                            self.max.max_batch
                        )));
                    }
                }
                prefill_bindings(rows, context.saturating_sub(rows))
            }
            PhaseKind::Decode => {
                if rows > self.max.max_batch {
                    return Err(artifact_error(format!(
                        "a decode batch of {rows} is more than the {} the artifact was compiled for",
                        self.max.max_batch
                    )));
                }
                decode_bindings(rows, context)
            }
        })
    }

    /// Reads a result back: the byte range its elements span, then the elements, a row at a
    /// time where the last axis is contiguous.
    fn read(&self, at: &TensorRef, bindings: &Bindings) -> Result<Tensor, CudaError> {
        let (starts, run) = at
            .element_runs(bindings)
            .ok_or_else(|| artifact_error(format!("result {at} is not bound by {bindings:?}")))?;
        let dims = at.dims(bindings).unwrap_or_default();
        let run_bytes = run as u64 * at.dtype.size_bytes();
        let (lo, hi) = starts.iter().fold((u64::MAX, 0), |(lo, hi), &o| {
            (lo.min(o), hi.max(o + run_bytes))
        });
        if starts.is_empty() || run == 0 {
            return Tensor::from_device_runs(dims, at.dtype, &[], &[], 0)
                .map_err(|e| artifact_error(e.to_string()));
        }
        let base = self
            .memory
            .base(&at.buf)
            .ok_or_else(|| artifact_error(format!("no memory for {}", at.buf)))?;
        let bytes = self.gpu.read_bytes(base + lo, (hi - lo) as usize)?;
        let local: Vec<u64> = starts.iter().map(|o| o - lo).collect();
        Tensor::from_device_runs(dims, at.dtype, &bytes, &local, run)
            .map_err(|e| artifact_error(e.to_string()))
    }
}

/// The time between two events, in seconds.
fn event_seconds(a: &CudaEvent, b: &CudaEvent) -> Result<f64, CudaError> {
    let ms = a.elapsed_ms(b).map_err(driver("reading an event's time"))?;
    Ok(f64::from(ms) * 1e-3)
}

/// How [`CudaExecutor::time`] runs and times a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timing {
    /// Launch by launch, timed as a whole.
    Step,
    /// Launch by launch, each between CUDA events of its own as well.
    PerLaunch,
    /// Decode only: replayed from its CUDA graph.
    Graph,
}

fn step_node(step: &Step) -> &str {
    match step {
        Step::Launch(l) => &l.node,
        Step::Collective(c) => &c.node,
        Step::View { node, .. } | Step::Missing { node, .. } => node,
    }
}

/// Queues collective `c` through `comm` on `stream`; a schedule with collectives needs one.
fn enqueue(
    comm: Option<&Comm>,
    stream: &Arc<CudaStream>,
    c: &Collective,
    memory: &Memory,
    bindings: &Bindings,
) -> Result<(), CudaError> {
    let comm = comm.ok_or_else(|| {
        artifact_error(format!(
            "{} \"{}\" is a collective of a tensor-parallel rank's artifact, which runs only in its group (glmc run --tp {})",
            c.op.name(),
            c.node,
            c.ranks
        ))
    })?;
    comm.enqueue(stream, c, memory, bindings)
        .map_err(|e| CudaError::Collective(Box::new(e)))
}

/// Weight `w` made on the host and uploaded.
fn upload(gpu: &Gpu, weights: &Weights, w: &WeightEntry) -> Result<CudaSlice<u8>, GenerateError> {
    let t = match weights {
        Weights::Host(source) => source.weight(&w.name, &w.recipe, w.dtype)?,
        Weights::Random { weights, .. } => weights.weight(&w.name, &w.recipe, w.dtype)?,
    };
    let bytes = t
        .to_bytes(w.dtype)
        .map_err(|e| artifact_error(format!("weight \"{}\" as {}: {e}", w.name, w.dtype)))?;
    Ok(gpu.upload(&bytes)?)
}

impl Executor for CudaExecutor {
    fn result_names(&self, phase: PhaseKind) -> Vec<String> {
        self.phase(phase)
            .results
            .iter()
            .map(|(n, _)| n.clone())
            .collect()
    }

    fn vocab(&self) -> Option<usize> {
        self.vocab
    }

    fn run(
        &mut self,
        kind: PhaseKind,
        inputs: &[Tensor],
        call: Call,
        hook: &mut NodeHook<'_>,
    ) -> Result<Vec<Tensor>, GenerateError> {
        let (phase, mut bindings) = self.upload_inputs(kind, inputs)?;
        let plain = self.nodes.is_none() && self.fault.is_none();
        let replayed = if plain && kind == PhaseKind::Decode && self.use_graphs {
            self.replay_decode(&phase, &bindings)?
        } else {
            None
        };
        let mut marks = Vec::new();
        if let Some(b) = replayed {
            bindings = b;
        } else if plain {
            marks = self.queue(&phase, &bindings)?;
        } else {
            // A node is complete after the last step that names it: a concat's copies come
            // before the view of the whole.
            let last: HashMap<&str, usize> = phase
                .steps
                .iter()
                .enumerate()
                .map(|(i, s)| (step_node(s), i))
                .collect();
            let collectives = phase.collectives().count();
            let mut passed = 0;
            for (i, step) in phase.steps.iter().enumerate() {
                match step {
                    Step::Launch(l) => self.launch_one(l, &bindings)?,
                    Step::Collective(c) => {
                        self.collective(c, &bindings)?;
                        self.wait_collective(c, (passed, collectives), kind.name())?;
                        passed += 1;
                    }
                    Step::View { .. } | Step::Missing { .. } => {}
                }
                if last[step_node(step)] == i {
                    self.after_step(kind, step, &bindings, call, hook)?;
                }
            }
        }
        let counted = (0, marks.len());
        self.wait(&self.gpu.stream, &marks, counted, kind.name())?;
        if !self.read_results {
            return Ok(Vec::new());
        }
        let results = phase
            .results
            .iter()
            .map(|(_, at)| self.read(at, &bindings))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(results)
    }
}
