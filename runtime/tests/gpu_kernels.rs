//! The GPU kernel harness (run on a GPU by `scripts/gpu-test.sh`; ignored elsewhere).
//!
//! Every kernel launch the shipped models lower to is checked against the reference
//! interpreter's implementation of the same op: the node is cut out of its graph together with
//! the views that feed it (so its operands keep the strides they have in the model), run through
//! the real lowering and the generated CUDA on random inputs, and compared element by element.
//! Then each kernel family is timed at GLM-5's sizes, and its achieved bandwidth and FLOP rate are
//! written down against its roofline: its bytes at the copy bandwidth measured in the same run,
//! or its FLOPs at the measured `mma.sync` rate, whichever takes longer.
//!
//! Tolerances, from the arithmetic: an f32 output is within 1e-5 of the f64 interpreter relative
//! to the row's largest value (f32 accumulation over at most 12288 terms); a bf16 output within
//! one bf16 ulp of its value (2^-8 relative: the output rounding plus f32 differences) plus half
//! an ulp of the largest value (cancellation of rounded operands, as in rope); integers exactly,
//! except the tokens of `matmul.argmax`: the GPU picks from its logits rounded to the model's
//! dtype, so a token is right when its logit (the interpreter's) is within that dtype's
//! tolerance of the row's largest (`argmax_close`).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::PathBuf;

use glmc_codegen::artifact::{self, WeightEntry};
use glmc_codegen::expr::{Bindings, GridDim, Guard};
use glmc_codegen::kernels::{
    narrow_weight_columns, persistent_blocks, shipped_moe_down, shipped_tiled_gemm, with_x_ahead,
    with_x_staged, DecodeGemm, MoeDown, ScoreRing, TiledGemm, DECODE_GEMM, DECODE_GEMM_VARIANTS,
    MOE_DOWN, MOE_DOWN_VARIANTS, SCORE_RING_VARIANTS, TILED_GEMM, TILED_GEMM_VARIANTS,
};
use glmc_codegen::layout::{Buf, TensorRef};
use glmc_codegen::schedule::{Kernel, Launch, Phase, Step};
use glmc_codegen::{
    lower_module, lower_module_with, nvcc, render, Limits, Lowered, MlaKernel, Target, Variant,
};
use glmc_ir::{DType, Function, Module, NodeIndex, Op, TensorType, Value};
use glmc_models::builder::{BuildOptions, Sampler};
use glmc_models::ModelConfig;
use glmc_passes::{pipeline, PipelineOptions};
use glmc_runtime::cuda::ceiling::{self, Gather, ReadCeiling};
use glmc_runtime::cuda::graphs::Graphs;
use glmc_runtime::cuda::{launch, random_fill, Gpu, LaunchMode, Memory};
use glmc_runtime::{run_function, sampling, RandomWeights, Tensor};
use half::bf16;

fn repo() -> PathBuf {
    std::env::var_os("GLMC_REPO")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."))
}

/// Where the results go: `$GLMC_GPU_OUT` (the device's `$OUT`), else the temp dir.
fn out_dir() -> PathBuf {
    std::env::var_os("GLMC_GPU_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
}

fn model(file: &str) -> Module {
    model_in(file, None, &[], Sampler::TopP)
}

/// A shipped model, in `dtype` where given (the f32 validation mode), else its own, built with
/// `sampler` (`Greedy`: for a greedy run without logits, ending in `matmul.argmax`), after the
/// pipeline without the passes `disabled`.
fn model_in(file: &str, dtype: Option<DType>, disabled: &[&str], sampler: Sampler) -> Module {
    let mut config = ModelConfig::load(&repo().join("models").join(file)).unwrap();
    if let Some(d) = dtype {
        config.dtype = d;
    }
    let options = BuildOptions {
        sampler,
        ..Default::default()
    };
    let mut m = glmc_models::builder::build(&config, &options).unwrap();
    let options = PipelineOptions {
        disabled: disabled.iter().map(|p| p.to_string()).collect(),
        ..Default::default()
    };
    pipeline(&options).unwrap().run(&mut m).unwrap();
    m
}

/// A shipped model through the pipeline with dense attention (whose prefill expands every
/// cached latent through `kv_b_proj`).
fn dense_model(file: &str) -> Module {
    let config = ModelConfig::load(&repo().join("models").join(file)).unwrap();
    let mut m = glmc_models::builder::build(&config, &BuildOptions::default()).unwrap();
    let options = PipelineOptions {
        attention: glmc_passes::AttentionChoice::Dense,
        ..Default::default()
    };
    pipeline(&options).unwrap().run(&mut m).unwrap();
    m
}

/// A tiny deterministic generator (xorshift), so a failure reproduces.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

fn is_view(op: &Op) -> bool {
    matches!(op, Op::Slice { .. } | Op::Reshape { .. } | Op::SliceLast {})
}

/// Node `n` of `f` with the views that feed it, its other operands as inputs (each value once,
/// however many operands read it).
fn cut(f: &Function, n: NodeIndex) -> Function {
    fn copy(
        f: &Function,
        v: Value,
        mini: &mut Function,
        done: &mut HashMap<Value, Value>,
    ) -> Value {
        if let Some(&m) = done.get(&v) {
            return m;
        }
        let node = f.node(v.node);
        let m = if is_view(&node.op) {
            let src = copy(f, f.operands(v.node)[0], mini, done);
            mini.add_node(
                node.op.clone(),
                node.name.clone(),
                &[src],
                node.outputs.clone(),
            )
            .into()
        } else {
            // Two outputs of one node (the router's weights and experts) become two inputs.
            let mut name = node.name.clone();
            if mini.find(&name).is_some() {
                name = format!("{name}#{}", v.output);
            }
            mini.push_input(mini.inputs().len() as u64, name, f.value_type(v).clone())
        };
        done.insert(v, m);
        m
    }
    let mut mini = Function::new(f.name.clone());
    let mut done = HashMap::new();
    let operands: Vec<Value> = f
        .operands(n)
        .into_iter()
        .map(|v| copy(f, v, &mut mini, &mut done))
        .collect();
    let node = f.node(n);
    mini.push_alone(node, &operands);
    mini
}

fn dims(ty: &TensorType, b: &Bindings) -> Vec<usize> {
    ty.shape
        .iter()
        .map(|d| glmc_codegen::expr::Poly::from_dim(d).eval(b).unwrap() as usize)
        .collect()
}

/// Random inputs for `mini`'s arguments: values a bf16 holds exactly where the type is bf16;
/// ids inside the vocabulary; distinct positions inside the context.
fn inputs(mini: &Function, b: &Bindings, rng: &mut Rng, vocab: u64, context: u64) -> Vec<Tensor> {
    let mut ins: Vec<(u64, Tensor)> = Vec::new();
    for n in mini.inputs() {
        let node = mini.node(n);
        let Op::Input { index } = node.op else {
            unreachable!()
        };
        let ty = &node.outputs[0];
        let shape = dims(ty, b);
        let count: usize = shape.iter().product();
        let t = match (ty.dtype, node.name.as_str()) {
            (DType::F32, "uniform") => {
                Tensor::f32(shape, (0..count).map(|_| rng.uniform()).collect())
            }
            (DType::F32, "top_p") => Tensor::f32(shape, vec![0.9; count]),
            // greedy and sampled rows alternate
            (DType::F32, "temperature") => {
                Tensor::f32(shape, (0..count).map(|i| (i % 2) as f32).collect())
            }
            // Slot 1, not 0: a kernel that ignores the slot writes or reads the wrong rows.
            (DType::I64, "slot") => Tensor::i64(shape, vec![1; count]),
            (DType::I64, "positions") => {
                let start = rng.next() % (context - count as u64).max(1);
                Tensor::i64(shape, (0..count as i64).map(|i| start as i64 + i).collect())
            }
            (DType::I64, _) => Tensor::i64(
                shape,
                (0..count).map(|_| (rng.next() % vocab) as i64).collect(),
            ),
            (DType::BF16, _) => Tensor::f32(
                shape,
                (0..count)
                    .map(|_| bf16::from_f32(rng.uniform() * 4.0 - 2.0).to_f32())
                    .collect(),
            ),
            _ => Tensor::f32(
                shape,
                (0..count).map(|_| rng.uniform() * 4.0 - 2.0).collect(),
            ),
        }
        .unwrap();
        ins.push((index, t));
    }
    ins.sort_by_key(|(i, _)| *i);
    ins.into_iter().map(|(_, t)| t).collect()
}

/// The elements of `at` (row-major) out of the bytes of its buffer.
fn gather(bytes: &[u8], at: &TensorRef, b: &Bindings) -> Vec<f64> {
    let t = Tensor::from_device_bytes(
        at.dims(b).unwrap(),
        at.dtype,
        bytes,
        &at.element_offsets(b).unwrap(),
    )
    .unwrap();
    match t.as_f32() {
        Ok(v) => v.iter().map(|x| *x as f64).collect(),
        Err(_) => t.as_i64().unwrap().iter().map(|x| *x as f64).collect(),
    }
}

struct Device {
    gpu: Gpu,
    target: Target,
    compiler: nvcc::Compiler,
}

impl Device {
    fn open() -> Device {
        let gpu = Gpu::open(0).expect("a GPU");
        let (major, minor) = gpu.compute_capability().unwrap();
        let target = Target::for_gpu(major, minor)
            .unwrap_or_else(|| panic!("no target for compute capability {major}.{minor}"));
        let compiler = nvcc::find(None)
            .unwrap()
            .expect("nvcc on PATH or $GLMC_NVCC");
        Device {
            gpu,
            target,
            compiler,
        }
    }
}

/// One lowered mini-module on the GPU: its inputs uploaded, its launches run; returns the bytes
/// of the arena, of every input and of every state, and the phase.
struct Run {
    phase: Phase,
    arena: Vec<u8>,
    inputs: BTreeMap<u64, Vec<u8>>,
    states: BTreeMap<String, Vec<u8>>,
    seconds_per_run: Option<f64>,
    /// With [`Timing::EachToo`], where the run launches more than one kernel: each launch that
    /// runs, timed alone the same way (its kernel and seconds), so that a split's partial kernel
    /// and its merge are told apart.
    seconds_per_launch: Vec<(String, f64)>,
}

/// Whether [`run_on_gpu`] times the run (`true`: [`Timing::Whole`]) and each of its launches.
#[derive(Clone, Copy, PartialEq)]
enum Timing {
    Untimed,
    Whole,
    /// The whole run, and where it launches more than one kernel each one alone.
    EachToo,
}

impl From<bool> for Timing {
    fn from(time_it: bool) -> Timing {
        if time_it {
            Timing::Whole
        } else {
            Timing::Untimed
        }
    }
}

fn run_on_gpu(
    dev: &Device,
    module: &Module,
    limits: Limits,
    ins: &[Tensor],
    b: &Bindings,
    time_it: impl Into<Timing>,
) -> Run {
    run_on_gpu_with(dev, module, limits, ins, b, time_it, &|m, t, l| {
        lower_module(m, t, l).unwrap()
    })
}

/// How a variant sweep lowers a module: the lowering with a kernel's variant chosen.
type LowerWith<'a> = dyn Fn(&Module, Target, Limits) -> Lowered + 'a;

/// The source of `module`'s kernels as `lower` lowers it.
fn variant_source(module: &Module, target: Target, limits: Limits, lower: &LowerWith) -> String {
    render::render(&lower(module, target, limits).kernels).unwrap()
}

/// [`run_on_gpu`] with the module lowered by `lower`.
fn run_on_gpu_with(
    dev: &Device,
    module: &Module,
    limits: Limits,
    ins: &[Tensor],
    b: &Bindings,
    time_it: impl Into<Timing>,
    lower: &LowerWith,
) -> Run {
    let timing = time_it.into();
    let lowered = lower(module, dev.target, limits);
    let phase = lowered.phases[0].clone();
    let source = render::render(&lowered.kernels).unwrap();
    let compiled = nvcc::compile(
        &dev.compiler,
        &source,
        dev.target,
        nvcc::default_cache_dir().as_deref(),
    )
    .unwrap();
    let gpu = &dev.gpu;
    let mut kernels = gpu
        .load(&compiled.cubin, LaunchMode::of(lowered.programmatic_launch))
        .unwrap();
    let arena = gpu.alloc(phase.arena_bytes as usize).unwrap();
    let mut memory = Memory {
        arena: gpu.address(&arena),
        ..Default::default()
    };
    let mut input_bufs = Vec::new();
    for (i, (_, at)) in phase.inputs.iter().enumerate() {
        let buf = gpu.upload(&ins[i].to_bytes(at.dtype).unwrap()).unwrap();
        let Buf::Input(index) = at.buf else {
            unreachable!()
        };
        memory.inputs.insert(index, gpu.address(&buf));
        input_bufs.push((index, buf));
    }
    let mut state_bufs = Vec::new();
    for (name, ty) in &module.states {
        let row: u64 = ty.shape.iter().filter_map(|d| d.as_const()).product();
        let bytes = limits.max_batch * limits.max_context * row * ty.dtype.size_bytes();
        let buf = gpu.alloc(bytes as usize).unwrap();
        memory.states.insert(name.clone(), gpu.address(&buf));
        state_bufs.push((name.clone(), buf));
    }
    let launches: Vec<_> = phase.launches().cloned().collect();
    for l in &launches {
        launch(&gpu.stream, &mut kernels, l, &memory, b).unwrap();
    }
    gpu.synchronize().unwrap();
    let mut seconds_per_launch = Vec::new();
    let seconds_per_run = (timing != Timing::Untimed).then(|| {
        // Inputs (weights among them) are read from DRAM, not from L2, as issue 14 times them:
        // the runs rotate through copies of the inputs that together span at least twice the
        // 60 MB L2 it names (at most 64 copies, so inputs under 2 MB stay partly in L2), back to
        // back in one CUDA graph, so launch gaps do not count either.
        let bytes: usize = input_bufs
            .iter()
            .map(|(_, b)| b.len())
            .sum::<usize>()
            .max(1);
        let copies = ceiling::rotation_copies(bytes);
        let reps = copies.max(20);
        let mut copy_bufs = Vec::new();
        let memories: Vec<Memory> = (0..copies)
            .map(|c| {
                let mut m = memory.clone();
                if c > 0 {
                    for (index, buf) in &input_bufs {
                        let copy = gpu.stream.clone_dtod(buf).unwrap();
                        m.inputs.insert(*index, gpu.address(&copy));
                        copy_bufs.push(copy);
                    }
                }
                m
            })
            .collect();
        gpu.synchronize().unwrap();
        // Seconds a run of `these` launches takes, replayed from its graph after a warm replay.
        let mut time = |these: &[&Launch]| {
            let mut graphs = Graphs::new(gpu).unwrap();
            graphs
                .capture((0, 0), |stream| {
                    for r in 0..reps {
                        for l in these {
                            launch(stream, &mut kernels, l, &memories[r % copies], b)?;
                        }
                    }
                    Ok(())
                })
                .unwrap();
            graphs.launch((0, 0)).unwrap();
            let event = || {
                graphs
                    .stream()
                    .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .unwrap()
            };
            let start = event();
            graphs.launch((0, 0)).unwrap();
            let end = event();
            end.synchronize().unwrap();
            start.elapsed_ms(&end).unwrap() as f64 * 1e-3 / reps as f64
        };
        let all: Vec<&Launch> = launches.iter().collect();
        let secs = time(&all);
        let running: Vec<&Launch> = launches.iter().filter(|l| runs(l, b)).collect();
        if timing == Timing::EachToo && running.len() > 1 {
            for l in running {
                seconds_per_launch.push((l.kernel.clone(), time(&[l])));
            }
        }
        drop(copy_bufs);
        secs
    });
    Run {
        phase,
        arena: gpu.download(&arena).unwrap(),
        inputs: input_bufs
            .iter()
            .map(|(i, buf)| (*i, gpu.download(buf).unwrap()))
            .collect(),
        states: state_bufs
            .iter()
            .map(|(n, buf)| (n.clone(), gpu.download(buf).unwrap()))
            .collect(),
        seconds_per_run,
        seconds_per_launch,
    }
}

fn bytes_of(run: &Run, at: &TensorRef) -> Vec<u8> {
    match &at.buf {
        Buf::Arena => run.arena.clone(),
        Buf::Input(i) => run.inputs[i].clone(),
        Buf::State(s) => run.states[s].clone(),
        Buf::Weight(_) => panic!("a result in a weight"),
    }
}

/// `Err(description)` when `gpu` is not within the tolerance of `reference`.
fn compare(gpu: &[f64], reference: &[f64], dtype: DType) -> Result<f64, String> {
    assert_eq!(gpu.len(), reference.len());
    // Over the finite values: a masked −inf would make every bound infinite.
    let scale = reference
        .iter()
        .filter(|x| x.is_finite())
        .fold(0f64, |m, x| m.max(x.abs()));
    let mut worst = 0f64;
    for (i, (g, r)) in gpu.iter().zip(reference).enumerate() {
        if g == r {
            continue; // equal, infinities included (masked scores are −inf on both sides)
        }
        let d = (g - r).abs();
        let bound = match dtype {
            DType::F32 => 1e-5 * scale.max(1e-30),
            DType::BF16 => 2f64.powi(-8) * r.abs() + 2f64.powi(-9) * scale,
            _ => 0.0,
        };
        if d.is_nan() || d > bound {
            return Err(format!(
                "element {i}: gpu {g} vs interpreter {r} (bound {bound:e})"
            ));
        }
        worst = worst.max(d / scale.max(1e-30));
    }
    Ok(worst)
}

/// A GEMM weight's (heads, N, K): one matrix is one head.
fn weight_shape(w: &TensorType) -> [u64; 3] {
    let dims: Vec<u64> = w.shape.iter().map(|d| d.as_const().unwrap()).collect();
    match dims.as_slice() {
        [h, n, k] => [*h, *n, *k],
        [n, k] => [1, *n, *k],
        _ => unreachable!("a weight is a matrix or one per head"),
    }
}

/// The largest error of a run's results against the interpreter's (`compare`), or the first
/// element out of tolerance.
fn worst_error(run: &Run, want: &[Tensor], b: &Bindings) -> Result<f64, String> {
    let mut worst = 0f64;
    for ((_, at), r) in run.phase.results.iter().zip(want) {
        let gpu = gather(&bytes_of(run, at), at, b);
        let reference: Vec<f64> = r.as_f32().unwrap().iter().map(|x| *x as f64).collect();
        worst = worst.max(compare(&gpu, &reference, at.dtype)?);
    }
    Ok(worst)
}

/// The GiB of inputs a node's cut would need, when past what the host can make quickly (the
/// 19 GiB of GLM-5's stacked experts): such nodes are not cut out at GLM-5's size.
fn too_large(f: &Function, n: NodeIndex, b: &Bindings) -> Option<f64> {
    let mini = cut(f, n);
    let bytes: f64 = mini
        .inputs()
        .into_iter()
        .map(|i| {
            let ty = &mini.node(i).outputs[0];
            dims(ty, b).iter().product::<usize>() as f64 * ty.dtype.size_bytes() as f64
        })
        .sum();
    let gib = bytes / (1u64 << 30) as f64;
    (gib > 4.0).then_some(gib)
}

/// The argument index of the input behind operand `k` of a cut's node (through its views).
fn input_of_operand(mini: &Function, k: usize) -> usize {
    let node = mini.results[0].1.node;
    let mut v = mini.operands(node)[k];
    while is_view(&mini.node(v.node).op) {
        v = mini.operands(v.node)[0];
    }
    match mini.node(v.node).op {
        Op::Input { index } => index as usize,
        _ => unreachable!("a cut's operands come from its inputs"),
    }
}

fn limits_for() -> Limits {
    Limits {
        max_prefill_tokens: 64,
        // A decode GEMM's 64-row skinny kernel runs from 17 rows (`bindings_for` takes the
        // fewest its guard allows): the arena must hold them.
        max_batch: 64,
        max_context: 256,
    }
}

/// [`small_bindings`], with the row count moved to the fewest a guard allows where the launch is
/// an alternative for other rows (so the harness runs that kernel, not another).
fn bindings_for(phase: &str, when: Option<&Guard>) -> Bindings {
    let mut b = small_bindings(phase);
    if let Some(g) = when {
        if g.holds(&b) == Some(false) {
            let sym = g
                .rows
                .symbols()
                .next()
                .expect("a guard on a symbolic row count");
            let rows = g.fewest_rows() as u64;
            b.insert(sym.to_string(), rows);
            let t = b.get("t").copied().unwrap_or(0).max(rows);
            b.insert("t".into(), t);
        }
    }
    b
}

/// The kernels that run under `b`, in order.
fn launched(phase: &Phase, b: &Bindings) -> Vec<String> {
    phase
        .launches()
        .filter(|l| runs(l, b))
        .map(|l| l.kernel.clone())
        .collect()
}

/// Whether launch `l` runs at sizes `b` (its guard, if any, holds).
fn runs(l: &Launch, b: &Bindings) -> bool {
    l.when.as_ref().is_none_or(|g| g.holds(b) == Some(true))
}

fn small_bindings(phase: &str) -> Bindings {
    match phase {
        "prefill" => Bindings::from([("s".into(), 7), ("t".into(), 19)]),
        _ => Bindings::from([("b".into(), 5), ("t".into(), 23)]),
    }
}

/// Integer operands as the graph makes them (the cut node's operands are its inputs, in order):
/// experts inside the table, distinct per token; the routed rows' offsets, order and positions
/// of such a routing for the grouped GEMMs and the combine; top-k rows of keys in [−1, t), except that a row whose context holds
/// at most `dense_until` keys lists all of them, as `dsa.topk` gives it and `mla.attend` assumes.
fn fit_operands(mini: &Function, op: &Op, ins: &mut [Tensor], rng: &mut Rng, context: u64) {
    let at = |k: usize| input_of_operand(mini, k);
    let retype = |t: &Tensor, data: Vec<i64>| Tensor::i64(t.shape().to_vec(), data).unwrap();
    match op {
        Op::MoeExperts {} => {
            let (ids, table) = (at(2), at(3));
            let experts = ins[table].shape()[0];
            let (n, k) = (ins[ids].shape()[0], ins[ids].shape()[1]);
            ins[ids] = retype(&ins[ids], route(rng, n, k, experts));
        }
        Op::MoeSort { experts } => {
            let ids = at(0);
            let (n, k) = (ins[ids].shape()[0], ins[ids].shape()[1]);
            ins[ids] = retype(&ins[ids], route(rng, n, k, *experts as usize));
        }
        // The sort of a random routing, as `moe.sort` gives it to the grouped GEMMs and the combine.
        Op::MoeGateUp {} | Op::MoeDown {} | Op::MoeCombine { .. } => {
            let (n, k, experts, offsets, order, position) = match op {
                Op::MoeGateUp {} => {
                    let o = at(1);
                    let s = ins[o].shape();
                    let e = ins[at(3)].shape()[0];
                    (s[0], s[1], e, Some(at(2)), Some(o), None)
                }
                Op::MoeDown {} => {
                    let s = ins[at(0)].shape();
                    let e = ins[at(2)].shape()[0];
                    (s[0], s[1], e, Some(at(1)), None, None)
                }
                _ => {
                    let p = at(1);
                    let s = ins[p].shape();
                    (s[0], s[1], 2 * s[1], None, None, Some(p))
                }
            };
            let (off, ord, pos) = sort_pairs(&route(rng, n, k, experts), experts);
            for (slot, data) in [(offsets, off), (order, ord), (position, pos)] {
                if let Some(i) = slot {
                    ins[i] = retype(&ins[i], data);
                }
            }
        }
        Op::MlaAttend {
            sparse: true,
            dense_until,
            ..
        }
        | Op::MlaAttendAbsorbed {
            sparse: true,
            dense_until,
            ..
        } => {
            let (p, t) = match op {
                Op::MlaAttend { .. } => (5, 6),
                _ => (4, 5),
            };
            let (p, t) = (at(p), at(t));
            let positions = ins[p].as_i64().unwrap().to_vec();
            let k = ins[t].shape()[1];
            let mut data = Vec::with_capacity(positions.len() * k);
            for &pos in &positions {
                for slot in 0..k as i64 {
                    data.push(if pos < *dense_until as i64 {
                        if slot <= pos {
                            slot
                        } else {
                            -1
                        }
                    } else {
                        (rng.next() % (context + 1)) as i64 - 1
                    });
                }
            }
            ins[t] = retype(&ins[t], data);
        }
        _ => {}
    }
}

/// A routing of `n` tokens to `k` distinct experts each of `experts`, uniform, flat `[n,k]`.
fn route(rng: &mut Rng, n: usize, k: usize, experts: usize) -> Vec<i64> {
    let mut ids = Vec::with_capacity(n * k);
    for _ in 0..n {
        let mut row: Vec<i64> = Vec::with_capacity(k);
        while row.len() < k.min(experts) {
            let e = (rng.next() % experts as u64) as i64;
            if !row.contains(&e) {
                row.push(e);
            }
        }
        row.resize(k, row[0]);
        ids.extend(row);
    }
    ids
}

/// `moe.sort` on the host: `(offsets, order, position)` of the pairs `ids`, stable.
fn sort_pairs(ids: &[i64], experts: usize) -> (Vec<i64>, Vec<i64>, Vec<i64>) {
    let mut offsets = vec![0i64; experts + 1];
    for &e in ids {
        offsets[e as usize + 1] += 1;
    }
    for e in 0..experts {
        offsets[e + 1] += offsets[e];
    }
    let mut next = offsets.clone();
    let (mut order, mut position) = (vec![0; ids.len()], vec![0; ids.len()]);
    for (p, &e) in ids.iter().enumerate() {
        let r = next[e as usize];
        next[e as usize] += 1;
        order[r as usize] = p as i64;
        position[p] = r;
    }
    (offsets, order, position)
}

/// The interpreter's outputs of `f` (weights and caches none: a cut's are its inputs).
fn interpret(m: &Module, f: &Function, ins: &[Tensor]) -> Result<Vec<Tensor>, String> {
    run_function(m, f, &HashMap::new(), &mut [], ins).map_err(|e| format!("interpreter: {e}"))
}

/// Checks one node: GPU vs interpreter (or, for `cache.update`, the rows written).
fn check_node(
    dev: &Device,
    module: &Module,
    f: &Function,
    n: NodeIndex,
    rng: &mut Rng,
    vocab: u64,
    when: Option<&Guard>,
) -> Result<String, String> {
    let node = f.node(n);
    let mini = cut(f, n);
    let mut mini_module = Module::new(format!("{}-{}", module.name, node.name));
    for state in node.op.cache_states() {
        mini_module
            .states
            .insert(state.clone(), module.states[state].clone());
    }
    mini_module.functions.push(mini.clone());
    let b = bindings_for(&f.name, when);
    let limits = limits_for();
    let context = b
        .get("t")
        .copied()
        .unwrap_or(limits.max_context)
        .min(limits.max_context);
    let mut ins = inputs(&mini, &b, rng, vocab, context);
    fit_operands(&mini, &node.op, &mut ins, rng, context);
    let run = run_on_gpu(dev, &mini_module, limits, &ins, &b, false);
    let kernels = launched(&run.phase, &b);
    let states = node.op.cache_states();
    if !states.is_empty() {
        // The rows the interpreter's op writes (from its operands after their views) must sit
        // at positions[i] of sequence i's cache (or the slot's): exactly the new rows for a
        // `cache.update`, within tolerance where the op computes them.
        let mut views = mini.clone();
        let last = views.results[0].1.node;
        let operands = views.operands(last);
        views.graph.remove_node(last);
        views.results = operands
            .iter()
            .enumerate()
            .map(|(k, v)| (format!("operand{k}"), *v))
            .collect();
        let args = interpret(&mini_module, &views, &ins)?;
        let arg_refs: Vec<&Tensor> = args.iter().collect();
        let want = glmc_runtime::cache_op_rows(&node.op, &arg_refs)?;
        let exact = matches!(node.op, Op::CacheUpdate { .. });
        let batched = node.op.batched_cache();
        let mut worst = 0f64;
        for (state, w) in states.iter().zip(&want) {
            let ty = &module.states[state];
            let written = cache_rows(&run, &mini, &ins, (state, ty), batched, limits.max_context);
            let reference: Vec<f64> = w.as_f32().unwrap().iter().map(|x| *x as f64).collect();
            if exact {
                if let Some(e) = (0..written.len()).find(|&e| written[e] != reference[e]) {
                    let width = reference.len() / w.shape()[0];
                    return Err(format!(
                        "{state} row {} col {}: cache holds {}, wrote {}",
                        e / width,
                        e % width,
                        written[e],
                        reference[e]
                    ));
                }
            } else {
                let err =
                    compare(&written, &reference, ty.dtype).map_err(|e| format!("{state}: {e}"))?;
                worst = worst.max(err);
            }
        }
        let rows = want[0].shape()[0];
        let how = if exact {
            "exact".to_string()
        } else {
            format!("max err {worst:.2e}")
        };
        return Ok(format!("{rows} rows {how} via {}", kernels.join(",")));
    }
    if node.op == (Op::MatmulArgmax {}) {
        let (_, at) = &run.phase.results[0];
        let tokens = gather(&bytes_of(&run, at), at, &b);
        let logits = argmax_logits(&mini_module, &mini, &ins)?;
        let dtype = mini
            .value_type(mini.operands(mini.results[0].1.node)[0])
            .dtype;
        let exact = argmax_close(&tokens, &logits, dtype)?;
        return Ok(format!(
            "{exact} of {} tokens the interpreter's argmax, the others within tolerance, via {}",
            tokens.len(),
            kernels.join(",")
        ));
    }
    let mut reference = match node.op {
        Op::DsaScore { weight_scale } => {
            scores_of_stored_weights(&mini_module, &mini, &ins, weight_scale)?
        }
        _ => interpret(&mini_module, &mini, &ins)?,
    };
    if let Op::AddRmsNorm { .. } = node.op {
        reference[0] = norm_of_stored_sum(&run, &mini_module, &mini, &ins, &b)?;
    }
    let mut worst = 0f64;
    for ((_, at), r) in run.phase.results.iter().zip(&reference) {
        let gpu = gather(&bytes_of(&run, at), at, &b);
        let want: Vec<f64> = match r.as_f32() {
            Ok(v) => v.iter().map(|x| *x as f64).collect(),
            Err(_) => r.as_i64().unwrap().iter().map(|x| *x as f64).collect(),
        };
        worst = worst.max(compare(&gpu, &want, at.dtype)?);
    }
    Ok(format!("max err {worst:.2e} via {}", kernels.join(",")))
}

/// The reference for a `dsa.score` that folds the head weights' `scale`: the interpreter's scores
/// of the weights as the unfused `scale` kernel stores them. The kernel rounds `w · factor` (in
/// f32, the factor passed as f32) to w's dtype, as `elementwise.cu` stores a `scale` and as the
/// unfused score then reads it; the interpreter keeps the product in f32, which against a bf16
/// `w` is up to 2^-9 of a weight off (GLM-5's 2^-6 is exact, the tiny models' 1/√32 is not),
/// past the f32 bound of the scores.
fn scores_of_stored_weights(
    m: &Module,
    mini: &Function,
    ins: &[Tensor],
    weight_scale: f64,
) -> Result<Vec<Tensor>, String> {
    let w = input_of_operand(mini, 1);
    for k in [0, 2, 3] {
        assert_ne!(
            input_of_operand(mini, k),
            w,
            "dsa.score's operand {k} shares the head weights' input"
        );
    }
    let node = mini.results[0].1.node;
    let dtype = mini.value_type(mini.operands(node)[1]).dtype;
    let factor = weight_scale as f32;
    let scaled: Vec<f32> = ins[w]
        .as_f32()
        .unwrap()
        .iter()
        .map(|x| x * factor)
        .collect();
    let mut stored = ins.to_vec();
    stored[w] = Tensor::f32(ins[w].shape().to_vec(), scaled)
        .unwrap()
        .rounded_to(dtype);
    let mut unfolded = mini.clone();
    unfolded.graph[node].op = Op::DsaScore { weight_scale: 1.0 };
    let mut m = m.clone();
    m.functions = vec![unfolded.clone()];
    interpret(&m, &unfolded, &stored)
}

/// The reference for `add.rmsnorm`'s normalised output: the interpreter's norm of the sum the
/// GPU stored. The kernel normalises its sum as stored, rounded to the residual's dtype, as the
/// unfused graph's `rmsnorm` reads the `add`'s stored output (and transformers' bf16 residual
/// stream does); the interpreter keeps the sum in f32. Against the f32 sum a bf16 norm is off by
/// the sum's rounding (up to 2^-8 of an element) on top of its own, which the bf16 bound does not
/// cover. The stored sum itself is checked against the interpreter's sum.
fn norm_of_stored_sum(
    run: &Run,
    m: &Module,
    mini: &Function,
    ins: &[Tensor],
    b: &Bindings,
) -> Result<Tensor, String> {
    let node = mini.results[0].1.node;
    for k in 0..2 {
        let op = &mini.node(mini.operands(node)[k].node).op;
        assert!(
            matches!(op, Op::Input { .. }),
            "add.rmsnorm's operand {k} is a view ({op:?}): the stored sum cannot stand in for it"
        );
    }
    let (h, d) = (input_of_operand(mini, 0), input_of_operand(mini, 1));
    let (_, at) = &run.phase.results[1];
    let sum: Vec<f32> = gather(&bytes_of(run, at), at, b)
        .into_iter()
        .map(|x| x as f32)
        .collect();
    let mut stored = ins.to_vec();
    let zeros = vec![0.0; ins[d].shape().iter().product()];
    stored[h] = Tensor::f32(ins[h].shape().to_vec(), sum).map_err(|e| e.to_string())?;
    stored[d] = Tensor::f32(ins[d].shape().to_vec(), zeros).map_err(|e| e.to_string())?;
    Ok(interpret(m, mini, &stored)?.swap_remove(0))
}

/// What a GPU run of a cut cache op left at its positions of `state` (rows of `row`): row i at
/// positions[i] of sequence i (`batched`) or of the cut's slot, the rows one after another.
fn cache_rows(
    run: &Run,
    mini: &Function,
    ins: &[Tensor],
    (state, row): (&str, &TensorType),
    batched: bool,
    max_context: u64,
) -> Vec<f64> {
    let last = mini.results[0].1.node;
    let p = mini.node(last).op.positions_operand().expect("a cache op");
    let pos = ins[input_of_operand(mini, p)].as_i64().unwrap();
    let slot = match mini.operands(last).get(p + 1) {
        Some(_) => ins[input_of_operand(mini, p + 1)].as_i64().unwrap()[0] as usize,
        None => 0,
    };
    let width: usize = row
        .shape
        .iter()
        .map(|d| d.as_const().unwrap() as usize)
        .product();
    let cache = &run.states[state];
    let size = row.dtype.size_bytes() as usize;
    let mut out = Vec::with_capacity(pos.len() * width);
    for (i, &p) in pos.iter().enumerate() {
        let seq = if batched { i } else { slot };
        for j in 0..width {
            let e = (seq * max_context as usize + p as usize) * width + j;
            let raw = &cache[e * size..(e + 1) * size];
            out.push(match row.dtype {
                DType::BF16 => bf16::from_le_bytes(raw.try_into().unwrap()).to_f32() as f64,
                _ => f32::from_le_bytes(raw.try_into().unwrap()) as f64,
            });
        }
    }
    out
}

/// The interpreter's logits `matmul(x, w)` of a cut `matmul.argmax` (its one node made the
/// product), as f32 rows.
fn argmax_logits(m: &Module, mini: &Function, ins: &[Tensor]) -> Result<Tensor, String> {
    let mut product = mini.clone();
    let n = product.results[0].1.node;
    let operands: Vec<TensorType> = product
        .operands(n)
        .iter()
        .map(|v| product.value_type(*v).clone())
        .collect();
    let ty = glmc_ir::verify::infer(&Op::Matmul {}, &[&operands[0], &operands[1]])?.remove(0);
    product.graph[n].op = Op::Matmul {};
    product.graph[n].outputs = vec![ty];
    let mut module = m.clone();
    module.functions = vec![product.clone()];
    Ok(interpret(&module, &product, ins)?.remove(0))
}

/// Each GPU token of `matmul.argmax` against the interpreter's `logits [n, V]`: −1 only for a
/// row of only NaN; otherwise a column whose logit is within the tolerance of `compare` for
/// `dtype` (one output rounding and f32 differences) of the row's largest, since the GPU
/// decides on logits rounded to `dtype`, where near-ties may tie or swap. Returns how many
/// tokens are the interpreter's argmax exactly.
fn argmax_close(tokens: &[f64], logits: &Tensor, dtype: DType) -> Result<usize, String> {
    let v = logits.shape()[1];
    let rows = logits.as_f32().unwrap().chunks(v);
    let mut exact = 0;
    for (r, (row, &t)) in rows.zip(tokens).enumerate() {
        let want = sampling::argmax(row);
        let Some(best) = want else {
            if t != -1.0 {
                return Err(format!("row {r} is all NaN, the GPU chose {t}"));
            }
            exact += 1;
            continue;
        };
        if t < 0.0 || t as usize >= v || t.fract() != 0.0 {
            return Err(format!("row {r}: the GPU chose {t}, not a column of {v}"));
        }
        let (m, got) = (row[best] as f64, row[t as usize] as f64);
        let scale = row.iter().fold(0f64, |a, x| a.max((*x as f64).abs()));
        let bound = match dtype {
            DType::BF16 => 2f64.powi(-8) * m.abs() + 2f64.powi(-9) * scale,
            _ => 1e-5 * scale.max(1e-30),
        };
        // NaN (the GPU chose a column whose logit is NaN) fails too.
        if m - got > bound || got.is_nan() {
            return Err(format!(
                "row {r}: the GPU chose column {t} (logit {got}), the interpreter {best} ({m}); bound {bound:e}"
            ));
        }
        exact += usize::from(t as usize == best);
    }
    Ok(exact)
}

/// The tiny models: tiny-sparse also in bf16, whose prefill takes the tensor-core grouped GEMM
/// at sizes the interpreter checks (GLM-5's are too large to cut out), without `lower-moe`,
/// which keeps the `moe.experts` baseline the lowered kernels replaced, and without
/// `fuse-cache-update`, which keeps the plain `cache.update` and `rope`; tiny-dense in bf16,
/// whose prefill attention takes the flash kernel (8 + 8 query dims, padded tiles); tiny-sparse
/// built greedy in f32 and bf16, whose lm_head is fused with the argmax.
#[test]
#[ignore = "gpu"]
fn every_kernel_instance_matches_the_interpreter() {
    use Sampler::{Greedy, TopP};
    check_every_kernel_instance(
        &[
            ("tiny-sparse.ron", None, &[][..], TopP),
            ("tiny-sparse.ron", Some(DType::BF16), &[], TopP),
            ("tiny-sparse.ron", None, &["lower-moe"], TopP),
            ("tiny-sparse.ron", None, &["fuse-cache-update"], TopP),
            ("tiny-dense.ron", None, &[], TopP),
            ("tiny-dense.ron", Some(DType::BF16), &[], TopP),
            ("tiny-sparse.ron", None, &[], Greedy),
            ("tiny-sparse.ron", Some(DType::BF16), &[], Greedy),
        ],
        "harness.txt",
    );
}

/// GLM-5 as compiled (bf16), and its greedy build's fused lm_head.
#[test]
#[ignore = "gpu"]
fn every_glm5_kernel_instance_matches_the_interpreter() {
    check_every_kernel_instance(
        &[
            ("glm5.ron", None, &[], Sampler::TopP),
            ("glm5.ron", None, &[], Sampler::Greedy),
        ],
        "harness-glm5.txt",
    );
}

/// GLM-5 in the f32 validation mode, whose GEMMs and expert kernels differ from bf16's.
#[test]
#[ignore = "gpu"]
fn every_glm5_f32_kernel_instance_matches_the_interpreter() {
    check_every_kernel_instance(
        &[
            ("glm5.ron", Some(DType::F32), &[], Sampler::TopP),
            ("glm5.ron", Some(DType::F32), &[], Sampler::Greedy),
        ],
        "harness-glm5-f32.txt",
    );
}

/// A model the harness lowers: its file, a dtype override, the passes disabled and the
/// sampler it is built with. A greedy build differs from the sampling one only in its ends, so
/// of it only the `matmul.argmax` launches are checked.
type HarnessModel<'a> = (&'a str, Option<DType>, &'a [&'a str], Sampler);

/// Checks one node per distinct kernel of each model against the interpreter and writes the
/// lines to `report_file`.
fn check_every_kernel_instance(models: &[HarnessModel], report_file: &str) {
    let dev = Device::open();
    let mut report = String::new();
    let mut failures = Vec::new();
    let mut rng = Rng(0x9e3779b97f4a7c15);
    for &(file, dtype, disabled, sampler) in models {
        let module = model_in(file, dtype, disabled, sampler);
        let config = ModelConfig::load(&repo().join("models").join(file)).unwrap();
        let file = match dtype {
            Some(d) => format!("{file} ({d})"),
            None => file.to_string(),
        };
        let file = match disabled {
            [] => file,
            _ => format!("{file} without {}", disabled.join(", ")),
        };
        let file = match sampler {
            Sampler::TopP => file,
            Sampler::Greedy => format!("{file} greedy"),
        };
        for f in &module.functions {
            let lowered = lower_module(&module, dev.target, limits_for()).unwrap();
            let phase = lowered
                .phases
                .iter()
                .find(|p| p.function == f.name)
                .unwrap();
            // One node per distinct kernel (plus every concat that copies), checked on its own.
            let mut seen = std::collections::HashSet::new();
            for step in &phase.steps {
                let Step::Launch(l) = step else { continue };
                let checked = sampler == Sampler::TopP || l.op == "matmul.argmax";
                if !checked || !seen.insert(l.kernel.clone()) {
                    continue;
                }
                let n = f.find(&l.node).expect("a launch names its node");
                if let Some(gib) = too_large(f, n, &small_bindings(&f.name)) {
                    let line = format!(
                        "skip {file} @{} {} \"{}\": {gib:.1} GiB of inputs; the same kernel template is checked at the tiny models' sizes and end to end by the oracle",
                        f.name, l.op, l.node
                    );
                    println!("{line}");
                    writeln!(report, "{line}").unwrap();
                    continue;
                }
                let result = check_node(
                    &dev,
                    &module,
                    f,
                    n,
                    &mut rng,
                    config.vocab_size,
                    l.when.as_ref(),
                );
                let line = match &result {
                    Ok(s) => format!("ok   {file} @{} {} \"{}\": {s}", f.name, l.op, l.node),
                    Err(e) => format!("FAIL {file} @{} {} \"{}\": {e}", f.name, l.op, l.node),
                };
                println!("{line}");
                writeln!(report, "{line}").unwrap();
                if result.is_err() {
                    failures.push(line);
                }
            }
        }
    }
    std::fs::write(out_dir().join(report_file), &report).unwrap();
    assert!(
        failures.is_empty(),
        "{} kernels failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Random weights made on the GPU are the interpreter's, bit for bit: every weight of
/// tiny-sparse (f32) and every GLM-5 slice weight up to 2^28 elements (bf16: attention, dense MLP,
/// router, norms, cut for 8 ranks too), each generated by `random_fill::generate` straight into
/// its layout and compared byte by byte with `RandomWeights::materialize` in the weight's dtype.
#[test]
#[ignore = "gpu"]
fn random_weights_on_the_gpu_equal_the_interpreters() {
    let dev = Device::open();
    let cubin = nvcc::compile(
        &dev.compiler,
        random_fill::SOURCE,
        dev.target,
        nvcc::default_cache_dir().as_deref(),
    )
    .unwrap()
    .cubin;
    let mut kernels = dev.gpu.load(&cubin, LaunchMode::Plain).unwrap();
    let tiny = model("tiny-sparse.ron");
    let slice = model("glm5-slice.ron");
    let mut cases: Vec<(RandomWeights, WeightEntry)> = artifact::weights(&tiny)
        .into_iter()
        .map(|w| (RandomWeights::new(7, DType::F32), w))
        .collect();
    let mut big = artifact::weights(&slice);
    big.extend(artifact::weights(
        &glmc_passes::partition(&slice, 8).unwrap()[3],
    ));
    cases.extend(
        big.into_iter()
            .filter(|w| w.shape.iter().product::<u64>() <= 1 << 28)
            .map(|w| (RandomWeights::new(7, DType::BF16), w)),
    );
    let mut failures = Vec::new();
    for (random, w) in &cases {
        let buf = random_fill::generate(&dev.gpu, &mut kernels, random, w)
            .unwrap()
            .unwrap_or_else(|| panic!("{}: not generated on the GPU", w.name));
        let gpu = dev.gpu.download(&buf).unwrap();
        let cpu = random
            .materialize(&w.recipe)
            .unwrap()
            .to_bytes(w.dtype)
            .unwrap();
        let size = w.dtype.size_bytes() as usize;
        let differ = gpu
            .chunks(size)
            .zip(cpu.chunks(size))
            .filter(|(a, b)| a != b)
            .count();
        if gpu.len() != cpu.len() || differ > 0 {
            failures.push(format!(
                "{} ({} {:?}): {differ} of {} elements differ ({} vs {} bytes)",
                w.name,
                w.dtype,
                w.shape,
                cpu.len() / size,
                gpu.len(),
                cpu.len()
            ));
        }
    }
    println!("random weights: {} weights compared", cases.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The GPU's `sample.top_p` follows the nucleus distribution (the CPU test's statistical check)
/// on each of its paths: a peaked row, a flat row (its bins sorted in shared memory), a narrow
/// row at a high temperature and a row of equal logits (bins of over 2048 tokens, refined by
/// passes over the row); at temperature 0 every draw is the argmax. Short rows (1 to 3000
/// tokens, tied logits) and, at GLM-5's vocabulary, rows of every kind in batches of 1, 8 and 64
/// give the interpreter's token for the same draw, and one row of each kind is timed at batches 1
/// and 8 (the target: 10 us for one row), its tokens after the graph's replays checked again.
#[test]
#[ignore = "gpu"]
fn top_p_sampling_on_the_gpu_has_the_nucleus_distribution() {
    let dev = Device::open();
    let mut rng = Rng(77);
    let peaked: Vec<f32> = vec![
        1.0, 2.5, -0.5, 0.3, 1.7, 2.2, -1.2, 0.9, 1.1, -2.0, 0.0, 1.4,
    ];
    let flat: Vec<f32> = (0..4096).map(|_| rng.uniform() * 2.0 - 1.0).collect();
    let equal = vec![0.25f32; 4096];
    let mut report = String::new();
    for (name, row, draws, temperature, top_p) in [
        (
            "peaked, 12 tokens, T=2, top-p 0.9 (sorted bins)",
            &peaked,
            200_000usize,
            2.0f32,
            0.9f32,
        ),
        (
            "flat, 4096 tokens, T=1, top-p 0.5 (sorted bins)",
            &flat,
            20_000,
            1.0,
            0.5,
        ),
        (
            "narrow, 4096 tokens, T=200, top-p 0.5 (a bin of over 2048: bisection)",
            &flat,
            20_000,
            200.0,
            0.5,
        ),
        (
            "equal, 4096 tokens, T=1, top-p 0.5 (ties counted in index order)",
            &equal,
            20_000,
            1.0,
            0.5,
        ),
        ("greedy, T=0", &peaked, 200_000, 0.0, 0.9),
    ] {
        let ids = sample_on_gpu(&dev, row, draws, temperature, top_p, false).0;
        if temperature == 0.0 {
            let best = sampling::argmax(row).unwrap() as i64;
            assert!(
                ids.iter().all(|&i| i == best),
                "{name}: a greedy draw was not the argmax"
            );
            writeln!(report, "{name}: all {draws} draws were the argmax").unwrap();
        } else {
            let expected = sampling::nucleus_probabilities(row, temperature, top_p);
            let check = sampling::check_frequencies(&expected, &ids)
                .unwrap_or_else(|e| panic!("{name}: GPU draws: {e}"));
            writeln!(report, "{name}: {check:?}").unwrap();
        }
    }
    // Short rows, tied logits among them: one bin per token near the maximum and the rest in the
    // last; candidates padded to a power of two (12, 1000), a partial second slice (3000).
    let mut short = Rng(78);
    for cols in [1usize, 8, 12, 64, 1000, 3000] {
        let row: Vec<f32> = (0..cols)
            .map(|_| ((short.uniform() * 12.0).floor() - 6.0) * 0.5)
            .collect();
        let rows: Vec<_> = (0..256)
            .map(|i| {
                let u = sampling::uniform(17, cols as u64, i);
                (row.as_slice(), 1.5, 0.9, u)
            })
            .collect();
        let (ids, _) = sample_rows_on_gpu(&dev, cols, &rows, false);
        assert_interpreter_tokens(&rows, &ids, |i| format!("{cols} tokens, draw {i}"));
        writeln!(
            report,
            "{cols}-token rows: all {} draws the interpreter's",
            rows.len()
        )
        .unwrap();
    }
    // GLM-5's vocabulary: every kind of row, each with its own draw, against the interpreter.
    let vocab = 154_880;
    let kinds = glm5_sampling_rows(vocab, &mut rng);
    for batch in [1usize, 8, 64] {
        let mut rows = Vec::new();
        for i in 0..batch {
            let (_, row, t, p) = &kinds[(i + batch) % kinds.len()];
            rows.push((
                row.as_slice(),
                *t,
                *p,
                sampling::uniform(11, batch as u64, i as u64),
            ));
        }
        let (ids, _) = sample_rows_on_gpu(&dev, vocab, &rows, false);
        assert_interpreter_tokens(&rows, &ids, |i| {
            format!(
                "batch {batch}, row {i} ({})",
                kinds[(i + batch) % kinds.len()].0
            )
        });
        writeln!(
            report,
            "batch {batch} of {vocab}-token rows: every token the interpreter's"
        )
        .unwrap();
    }
    // Timing: one row of each kind alone, and eight of it. The tokens are those of the last of
    // the timed graph's replays, each starting from the scratch the one before it left.
    for (name, row, t, p) in &kinds {
        for batch in [1usize, 8] {
            let rows: Vec<_> = (0..batch)
                .map(|i| (row.as_slice(), *t, *p, sampling::uniform(13, 0, i as u64)))
                .collect();
            let (ids, secs) = sample_rows_on_gpu(&dev, vocab, &rows, true);
            assert_interpreter_tokens(&rows, &ids, |i| {
                format!("replayed, batch {batch}, row {i} ({name})")
            });
            writeln!(
                report,
                "{name}, T={t}, top-p {p}, batch {batch}: {:.1} us",
                secs.unwrap() * 1e6
            )
            .unwrap();
        }
    }
    print!("{report}");
    std::fs::write(out_dir().join("sampling.txt"), report).unwrap();
}

/// Each GPU token `ids[i]` is the interpreter's for `rows[i]`; `what(i)` names the row.
fn assert_interpreter_tokens(rows: &[SampleRow], ids: &[i64], what: impl Fn(usize) -> String) {
    for (i, ((row, t, p, u), &id)) in rows.iter().zip(ids).enumerate() {
        let want = sampling::sample_row(row, *t, *p, *u).map_or(-1, |k| k as i64);
        assert_eq!(
            id,
            want,
            "{} (T={t}, top-p {p}, u={u}): GPU token {id}, interpreter {want}",
            what(i)
        );
    }
}

/// Rows of GLM-5's vocabulary, one per path of `sample.top_p`: (name, logits, T, top-p).
fn glm5_sampling_rows(vocab: usize, rng: &mut Rng) -> Vec<(&'static str, Vec<f32>, f32, f32)> {
    let mut confident: Vec<f32> = (0..vocab).map(|_| rng.uniform() * 4.0 - 2.0).collect();
    for (k, x) in confident.iter_mut().take(40).enumerate() {
        *x = 14.0 - k as f32 * 0.25;
    }
    let flat: Vec<f32> = (0..vocab).map(|_| rng.uniform() * 4.0 - 2.0).collect();
    // A language model's shape: a few likely tokens over a long tail of many small ones.
    let tail: Vec<f32> = (0..vocab)
        .map(|i| {
            let x = rng.uniform();
            if i % 9973 == 0 {
                8.0 + 4.0 * x
            } else {
                -6.0 * x * x
            }
        })
        .collect();
    // NaN never drawn, -inf never reached.
    let mut holes = flat.clone();
    for (i, x) in holes.iter_mut().enumerate() {
        match i % 97 {
            0 => *x = f32::NAN,
            1 => *x = f32::NEG_INFINITY,
            _ => {}
        }
    }
    vec![
        ("confident", confident.clone(), 1.0, 0.9),
        ("flat", flat.clone(), 1.0, 0.9),
        ("flat, whole row", flat.clone(), 1.0, 1.0),
        ("long tail", tail, 0.7, 0.95),
        ("narrow (bisection)", flat.clone(), 200.0, 0.9),
        // Not top-p 0.5: half of an even vocabulary of equal tokens reaches it exactly, so the
        // nucleus size would be decided by rounding (the interpreter's f64 running sum of 77440
        // terms fell below 0.5 and kept one token more than the GPU's exact fixed-point sum, and
        // the draw of batch 64 row 5 differed by that token). 0.3 in f32 is 1.2e-8 above
        // 46464 / 154880, far beyond either's rounding.
        ("equal (ties)", vec![1.5; vocab], 1.0, 0.3),
        ("greedy", confident, 0.0, 0.9),
        ("NaN and -inf", holes, 1.3, 0.8),
    ]
}

/// `draws` rows of `row`, each with its own uniform draw, through the lowered `sample.top_p`.
fn sample_on_gpu(
    dev: &Device,
    row: &[f32],
    draws: usize,
    temperature: f32,
    top_p: f32,
    time_it: bool,
) -> (Vec<i64>, Option<f64>) {
    let rows: Vec<_> = (0..draws as u64)
        .map(|r| (row, temperature, top_p, sampling::uniform(7, 0, r)))
        .collect();
    sample_rows_on_gpu(dev, row.len(), &rows, time_it)
}

/// One row of `sample.top_p`'s operands: logits, temperature, top-p, uniform draw.
type SampleRow<'a> = (&'a [f32], f32, f32, f32);

/// Rows of `v` logits with their (temperature, top-p, uniform) through the lowered
/// `sample.top_p` as one batch; the tokens and, timed, the seconds per run.
fn sample_rows_on_gpu(
    dev: &Device,
    v: usize,
    rows: &[SampleRow],
    time_it: bool,
) -> (Vec<i64>, Option<f64>) {
    let draws = rows.len();
    let mut f = Function::new("decode");
    let b = glmc_ir::Dim::sym("b");
    let vec_of = |ty| TensorType::new(DType::F32, vec![b.clone()]).with_dtype(ty);
    let logits = f.push_input(
        0,
        "logits",
        TensorType::new(DType::F32, vec![b.clone(), (v as u64).into()]),
    );
    let t = f.push_input(1, "temperature", vec_of(DType::F32));
    let p = f.push_input(2, "top_p", vec_of(DType::F32));
    let u = f.push_input(3, "uniform", vec_of(DType::F32));
    let s = f
        .push(Op::SampleTopP {}, "next_token", &[logits, t, p, u])
        .unwrap();
    f.results.push(("next_token".into(), s.into()));
    let mut module = Module::new("sampling");
    module.functions.push(f);
    let column = |k: fn(&SampleRow) -> f32| rows.iter().map(k).collect::<Vec<_>>();
    let ins = vec![
        Tensor::f32(
            vec![draws, v],
            rows.iter().flat_map(|r| r.0.iter().copied()).collect(),
        )
        .unwrap(),
        Tensor::f32(vec![draws], column(|r| r.1)).unwrap(),
        Tensor::f32(vec![draws], column(|r| r.2)).unwrap(),
        Tensor::f32(vec![draws], column(|r| r.3)).unwrap(),
    ];
    let bind = Bindings::from([("b".into(), draws as u64), ("t".into(), 1)]);
    let limits = Limits {
        max_prefill_tokens: 1,
        max_batch: draws as u64,
        max_context: 1,
    };
    let run = run_on_gpu(dev, &module, limits, &ins, &bind, time_it);
    let (_, at) = &run.phase.results[0];
    let ids = gather(&bytes_of(&run, at), at, &bind)
        .iter()
        .map(|x| *x as i64)
        .collect();
    (ids, run.seconds_per_run)
}

/// Each kernel family at GLM-5's sizes (prefill of 4096 tokens; decode of 64 sequences), timed
/// over 20 back-to-back runs, with its bytes moved against the copy bandwidth measured here.
#[test]
#[ignore = "gpu"]
fn kernel_bandwidth_at_glm5_sizes() {
    let dev = Device::open();
    let module = model("glm5.ron");
    let mut rng = Rng(12345);
    let copy_gbs = measure_copy_bandwidth(&dev);
    let mut report = format!(
        "copy roofline measured in this run: {copy_gbs:.0} GB/s (device-to-device memcpy of 2 GiB)\n\
         | phase | op | node | kernel | bytes moved | GFLOP | time (us) | GB/s | TFLOP/s | of roofline |\n|---|---|---|---|---|---|---|---|---|---|\n"
    );
    for f in &module.functions {
        let b = match f.name.as_str() {
            "prefill" => Bindings::from([("s".into(), 4096), ("t".into(), 4096)]),
            _ => Bindings::from([("b".into(), 64), ("t".into(), 4096)]),
        };
        let limits = Limits {
            max_prefill_tokens: 4096,
            max_batch: 64,
            max_context: 4096,
        };
        let lowered = lower_module(&module, dev.target, limits).unwrap();
        let phase = lowered
            .phases
            .iter()
            .find(|p| p.function == f.name)
            .unwrap();
        let mut seen = std::collections::HashSet::new();
        for l in phase.launches() {
            // the first layer of each kind is enough: later layers launch the same kernels
            if !seen.insert((l.op.clone(), l.kernel.clone())) || l.op == "embed" {
                continue;
            }
            let n = f.find(&l.node).unwrap();
            if too_large(f, n, &b).is_some() {
                continue;
            }
            let mini = cut(f, n);
            let mut mm = Module::new("bench");
            for state in f.node(n).op.cache_states() {
                mm.states
                    .insert(state.clone(), module.states[state].clone());
            }
            mm.functions.push(mini.clone());
            let ins = inputs(&mini, &b, &mut rng, 154_880, 4096);
            let run = run_on_gpu(&dev, &mm, limits, &ins, &b, true);
            let t = timed(&run, &mini, &b, copy_gbs);
            writeln!(
                report,
                "| {} | {} | {} | {} | {:.1} MB | {:.2} | {} |",
                f.name,
                l.op,
                l.node,
                l.kernel,
                t.moved / 1e6,
                t.flops / 1e9,
                t.cells()
            )
            .unwrap();
        }
    }
    print!("{report}");
    std::fs::write(out_dir().join("bandwidth.md"), report).unwrap();
}

/// A timed run against its roofline: the bytes the op must move and its FLOPs (the cost model's
/// counts, e.g. only the experts the tokens select), and the roofline time, its bytes at the
/// copy bandwidth measured in the run or its FLOPs at the mma.sync rate measured on this machine
/// (TOOLCHAIN.md), whichever is longer.
struct Timed {
    secs: f64,
    moved: f64,
    flops: f64,
    bound: f64,
}

impl Timed {
    /// `time (us) | GB/s | TFLOP/s | of roofline`, as the tables print them.
    fn cells(&self) -> String {
        format!(
            "{:.1} | {:.0} | {:.1} | {:.1}%",
            self.secs * 1e6,
            self.moved / self.secs / 1e9,
            self.flops / self.secs / 1e12,
            100.0 * self.bound / self.secs
        )
    }

    /// The fields bench/render.py reads of a timed case.
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "time_us": self.secs * 1e6,
            "bytes": self.moved,
            "flops": self.flops,
            "roofline_us": self.bound * 1e6,
        })
    }
}

fn timed(run: &Run, f: &Function, b: &Bindings, copy_gbs: f64) -> Timed {
    let costs = glmc_codegen::cost::function_cost(f, b);
    let moved: f64 = costs.iter().map(|c| c.cost.bytes).sum();
    let flops: f64 = costs.iter().map(|c| c.cost.flops).sum();
    Timed {
        secs: run.seconds_per_run.expect("a timed run"),
        moved,
        flops,
        bound: (moved / (copy_gbs * 1e9)).max(flops / (MMA_SYNC_TFLOPS * 1e12)),
    }
}

/// bf16 `mma.sync` m16n8k16 from registers on an H200, measured 2026-11-30 (TOOLCHAIN.md): the
/// ceiling of any SM120-style kernel there.
const MMA_SYNC_TFLOPS: f64 = 646.0;

fn measure_copy_bandwidth(dev: &Device) -> f64 {
    let bytes = 2usize << 30;
    let src = dev.gpu.alloc(bytes).unwrap();
    let mut dst = dev.gpu.alloc(bytes).unwrap();
    dev.gpu.stream.memcpy_dtod(&src, &mut dst).unwrap();
    dev.gpu.synchronize().unwrap();
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = dev.gpu.stream.record_event(flags).unwrap();
    let reps = 10;
    for _ in 0..reps {
        dev.gpu.stream.memcpy_dtod(&src, &mut dst).unwrap();
    }
    let end = dev.gpu.stream.record_event(flags).unwrap();
    end.synchronize().unwrap();
    let secs = start.elapsed_ms(&end).unwrap() as f64 * 1e-3 / reps as f64;
    2.0 * bytes as f64 / secs / 1e9
}

/// `t` (whose first axis holds `from` rows) with its rows repeated cyclically to `to` rows.
fn repeat_rows(t: &Tensor, from: usize, to: usize) -> Tensor {
    let mut shape = t.shape().to_vec();
    assert_eq!(shape[0], from);
    shape[0] = to;
    let row = t.numel() / from;
    let pick = |i: usize| (i / row % from) * row + i % row;
    match t.as_f32() {
        Ok(v) => Tensor::f32(shape, (0..to * row).map(|i| v[pick(i)]).collect()),
        Err(_) => {
            let v = t.as_i64().unwrap();
            Tensor::i64(shape, (0..to * row).map(|i| v[pick(i)]).collect())
        }
    }
    .unwrap()
}

/// For each input of `mini`, in order, whether its first axis is the row symbol `sym`.
fn per_row_inputs(mini: &Function, sym: &str) -> Vec<bool> {
    let mut ins: Vec<(u64, bool)> = mini
        .inputs()
        .into_iter()
        .map(|i| {
            let node = mini.node(i);
            let Op::Input { index } = node.op else {
                unreachable!()
            };
            let first = node.outputs[0].shape.first();
            (index, first == Some(&glmc_ir::Dim::Sym(sym.into())))
        })
        .collect();
    ins.sort_by_key(|(i, _)| *i);
    ins.into_iter().map(|(_, r)| r).collect()
}

/// Compiles every source into the cubin cache, on every core, so that the runs then read it.
fn compile_all(dev: &Device, sources: &[String]) {
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..std::thread::available_parallelism().map_or(4, |n| n.get()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(source) = sources.get(i) else { break };
                nvcc::compile(
                    &dev.compiler,
                    source,
                    dev.target,
                    nvcc::default_cache_dir().as_deref(),
                )
                .unwrap();
            });
        }
    });
}

/// Every GEMM of GLM-5 (each projection, the per-head absorbed products, the rope epilogues,
/// the lm_head and the f32 router) as the lowering launches it: decode at 1, 8 and 64 rows,
/// prefill at 1, 8, 67 and 4096, each against the interpreter. The interpreter computes 67 rows;
/// the 4096-row inputs repeat them (a period that is no multiple of any tile), so every output row
/// of the big run is checked against an independent value. Timed by `run_on_gpu` (inputs from
/// DRAM, in a CUDA graph); written to
/// `gemm.json` for `scripts/torch_gemm.py`, which times `torch.matmul` on the same shapes.
#[test]
#[ignore = "gpu"]
fn glm5_gemm_shapes_match_the_interpreter_and_are_timed() {
    let dev = Device::open();
    let module = model("glm5.ron");
    let copy_gbs = measure_copy_bandwidth(&dev);
    let mut rng = Rng(4242);
    let limits = Limits {
        max_prefill_tokens: 4096,
        max_batch: 64,
        max_context: 4096,
    };
    let lowered = lower_module(&module, dev.target, limits).unwrap();
    let mut report = format!(
        "copy roofline measured in this run: {copy_gbs:.0} GB/s; mma.sync ceiling {MMA_SYNC_TFLOPS} TFLOP/s\n\
         | phase | rows | op | node | kernel | heads × N × K | max err | time (us) | GB/s | TFLOP/s | of roofline |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    let mut shapes = Vec::new();
    let mut failures = Vec::new();
    for f in &module.functions {
        let phase = lowered
            .phases
            .iter()
            .find(|p| p.function == f.name)
            .unwrap();
        let (sym, sizes): (&str, &[u64]) = match f.name.as_str() {
            "prefill" => ("s", &[1, 8, 67, 4096]),
            _ => ("b", &[1, 8, 64]),
        };
        // One node per kernel: a node with two (guarded by the row count) runs once per size,
        // and the size picks.
        let mut seen = std::collections::HashSet::new();
        let mut nodes = std::collections::HashSet::new();
        for l in phase.launches() {
            if !l.op.starts_with("matmul")
                || !seen.insert(l.kernel.clone())
                || !nodes.insert(l.node.clone())
            {
                continue;
            }
            let n = f.find(&l.node).unwrap();
            let mini = cut(f, n);
            let mut mm = Module::new("gemm");
            mm.functions.push(mini.clone());
            let w = &f.node(f.operands(n)[1].node).outputs[0];
            let [heads, n_cols, k] = weight_shape(w);
            // Inputs whose first axis is the row symbol. A node whose output has no such axis (the
            // prefill's lm_head, which sees the last row) runs at one row.
            let per_row = per_row_inputs(&mini, sym);
            let row_symbol = glmc_ir::Dim::Sym(sym.into());
            let sizes: &[u64] = if f.node(n).outputs[0].shape.first() == Some(&row_symbol) {
                sizes
            } else {
                &[1]
            };
            let mut last: Option<(u64, Vec<Tensor>, Vec<Tensor>)> = None;
            for &rows in sizes {
                let b = Bindings::from([(sym.into(), rows), ("t".into(), 4096)]);
                let (ins, want) = match &last {
                    Some((from, ins, want)) if rows == 4096 => {
                        let from = *from as usize;
                        let ins: Vec<Tensor> = ins
                            .iter()
                            .zip(&per_row)
                            .map(|(t, r)| {
                                if *r {
                                    repeat_rows(t, from, 4096)
                                } else {
                                    t.clone()
                                }
                            })
                            .collect();
                        let want: Vec<Tensor> =
                            want.iter().map(|t| repeat_rows(t, from, 4096)).collect();
                        (ins, want)
                    }
                    _ => {
                        let ins = inputs(&mini, &b, &mut rng, 154_880, 4096);
                        let want = interpret(&mm, &mini, &ins).unwrap();
                        (ins, want)
                    }
                };
                let run = run_on_gpu(&dev, &mm, limits, &ins, &b, true);
                let worst = worst_error(&run, &want, &b);
                let kernel = launched(&run.phase, &b).join(",");
                let t = timed(&run, &mini, &b, copy_gbs);
                let err = match &worst {
                    Ok(e) => format!("{e:.1e}"),
                    Err(e) => {
                        failures.push(format!("{} {} rows={rows}: {e}", f.name, l.node));
                        "FAIL".to_string()
                    }
                };
                let line = format!(
                    "| {} | {rows} | {} | {} | {kernel} | {heads} × {n_cols} × {k} | {err} | {} |",
                    f.name,
                    l.op,
                    l.node,
                    t.cells()
                );
                println!("{line}");
                writeln!(report, "{line}").unwrap();
                shapes.push(format!(
                    "{{\"phase\": \"{}\", \"node\": \"{}\", \"rows\": {rows}, \"heads\": {heads}, \"n\": {n_cols}, \"k\": {k}, \"dtype\": \"{}\", \"glmc_us\": {:.3}, \"bytes\": {}, \"flops\": {}}}",
                    f.name,
                    l.node,
                    w.dtype.name(),
                    t.secs * 1e6,
                    t.moved,
                    t.flops
                ));
                if rows == 67 {
                    last = Some((rows, ins, want));
                }
            }
        }
    }
    // lm_head fused with the argmax (a greedy build), to set against the lm_head lines above.
    let greedy = model_in("glm5.ron", None, &[], Sampler::Greedy);
    for f in &greedy.functions {
        let n = f.find("next_token").unwrap();
        assert_eq!(f.node(n).op, Op::MatmulArgmax {}, "@{}", f.name);
        let mini = cut(f, n);
        let mut mm = Module::new("lm_head_argmax");
        mm.functions.push(mini.clone());
        let (sym, sizes): (&str, &[u64]) = match f.name.as_str() {
            "prefill" => ("s", &[1]),
            _ => ("b", &[1, 8]),
        };
        for &rows in sizes {
            let b = Bindings::from([(sym.into(), rows), ("t".into(), 4096)]);
            let ins = inputs(&mini, &b, &mut rng, 154_880, 4096);
            let run = run_on_gpu(&dev, &mm, limits, &ins, &b, true);
            let (_, at) = &run.phase.results[0];
            let tokens = gather(&bytes_of(&run, at), at, &b);
            let logits = argmax_logits(&mm, &mini, &ins).unwrap();
            let err = match argmax_close(&tokens, &logits, DType::BF16) {
                Ok(exact) => format!("{exact}/{} exact", tokens.len()),
                Err(e) => {
                    failures.push(format!("{} next_token rows={rows}: {e}", f.name));
                    "FAIL".to_string()
                }
            };
            let kernel = launched(&run.phase, &b).join(",");
            let t = timed(&run, &mini, &b, copy_gbs);
            let line = format!(
                "| {} | {rows} | matmul.argmax | next_token | {kernel} | 1 × 154880 × 6144 | {err} | {} |",
                f.name,
                t.cells()
            );
            println!("{line}");
            writeln!(report, "{line}").unwrap();
        }
    }
    print!("{report}");
    std::fs::write(out_dir().join("gemm.md"), &report).unwrap();
    std::fs::write(
        out_dir().join("gemm.json"),
        format!("[\n{}\n]\n", shapes.join(",\n")),
    )
    .unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A variant of the 16-row skinny GEMM: its tile (8-column MMA tiles a warp, `nt`, and warps
/// that split K, `warps_k`; a block is 8 / `warps_k` warps' columns wide), weight chunks in
/// flight per warp, blocks an SM, L2 prefetch bytes, whether the grid is persistent
/// (`persistent_blocks`) or a block per tile, the rows of x it stages in shared memory
/// (`with_x_staged`; 0: none) and otherwise the chunks of x it loads from global memory ahead of
/// the MMAs (`with_x_ahead`; 1 unless set).
#[derive(Clone, Copy, Debug, PartialEq)]
struct SkinnyVariant {
    nt: u64,
    warps_k: u64,
    depth: u64,
    blocks: u64,
    prefetch: u64,
    persistent: bool,
    x_rows: u64,
    x_ahead: u64,
}

impl SkinnyVariant {
    const fn new(
        (nt, warps_k): (u64, u64),
        depth: u64,
        blocks: u64,
        persistent: bool,
    ) -> SkinnyVariant {
        SkinnyVariant {
            nt,
            warps_k,
            depth,
            blocks,
            prefetch: 256,
            persistent,
            x_rows: 0,
            x_ahead: 1,
        }
    }

    /// The variant a lowered kernel is.
    fn of(k: &Kernel) -> SkinnyVariant {
        let p = |name: &str| k.params[name].parse::<u64>().unwrap();
        SkinnyVariant {
            nt: p("nt"),
            warps_k: p("warps_k"),
            depth: p("depth"),
            blocks: p("min_blocks"),
            prefetch: p("prefetch"),
            persistent: k.template == PERSISTENT_SKINNY,
            x_rows: k.params.get("x_rows").map_or(0, |_| p("x_rows")),
            x_ahead: k.params.get("x_ahead").map_or(1, |_| p("x_ahead")),
        }
    }

    /// Columns a block of it computes.
    fn block_columns(&self) -> u64 {
        8 * self.nt * (8 / self.warps_k)
    }

    /// Its tiles on kernel `k`'s weight: the permuted columns (a rope block padded to an even
    /// width) in tiles of [`Self::block_columns`], times the heads.
    fn tiles(&self, k: &Kernel) -> u64 {
        let p = |name: &str| k.params[name].parse::<u64>().unwrap();
        skinny_columns(k).div_ceil(self.block_columns()) * p("heads")
    }

    /// Its grid on kernel `k` (at most 16 rows: one row tile).
    fn blocks_for(&self, k: &Kernel, target: Target) -> u64 {
        let tiles = self.tiles(k);
        if self.persistent {
            persistent_blocks(tiles, self.blocks, target)
        } else {
            tiles
        }
    }
}

/// MMA tiles a warp and warps on K: 8 columns a warp over K split 8 ways (the narrow tile), 16
/// (the 16-column tile), 16 over K split 4 ways, and the short-K tiles: 8 or 16 columns a warp
/// on one or two warps a column tile.
const NARROW: (u64, u64) = (1, 8);
const WIDE: (u64, u64) = (2, 8);
const WIDE_HALF_K: (u64, u64) = (2, 4);
const ONE_WARP_8: (u64, u64) = (1, 1);
const ONE_WARP_16: (u64, u64) = (2, 1);
const TWO_WARPS_8: (u64, u64) = (1, 2);
const TWO_WARPS_16: (u64, u64) = (2, 2);

/// The variants the sweep below times besides the shipped one, by the weight's class. For K of
/// more than 16 chunks, 16-column tiles and then narrow weights ([`narrow_weight_columns`]): a
/// block per tile at the depths and blocks an SM that won some shape in
/// tests/gpu/results/2026-12-01q (call D; no L2 prefetch lost or tied everywhere there), and
/// persistent grids (`gemm_skinny_persistent.cu`), with the ones of 2026-12-01s's sweep and
/// all of a warp's chunks of a tile in flight at two blocks an SM (on q_b_proj's persistent
/// grid also 32-column tiles, half the tiles a block walks). K of at most 8 chunks (q_absorbed)
/// and 16 (attn): the tiles they shipped before (8 columns a warp, on 3 or 4 blocks an SM, and
/// persistent), and all of a warp's chunks in flight at two blocks an SM, 8 or 16 columns a
/// warp. A persistent variant whose grid is a block per tile anyway (no more tiles than slots)
/// is the per-tile one and runs once.
const SKINNY_VARIANTS: [&[SkinnyVariant]; 4] = [
    &[
        SkinnyVariant::new(WIDE, 2, 4, false),
        SkinnyVariant::new(WIDE, 3, 3, false),
        SkinnyVariant::new(WIDE, 4, 2, false),
        SkinnyVariant::new(WIDE, 2, 4, true),
        SkinnyVariant::new(WIDE, 3, 3, true),
        SkinnyVariant::new(WIDE, 4, 3, true),
        SkinnyVariant::new(WIDE, 4, 2, true),
        SkinnyVariant::new(WIDE, 6, 2, true),
        SkinnyVariant::new(WIDE, 8, 2, true),
        SkinnyVariant::new(WIDE_HALF_K, 8, 2, true),
    ],
    &[
        SkinnyVariant::new(NARROW, 4, 4, false),
        SkinnyVariant::new(NARROW, 4, 3, false),
        SkinnyVariant::new(NARROW, 8, 2, false),
        SkinnyVariant::new(NARROW, 4, 4, true),
        SkinnyVariant::new(NARROW, 4, 3, true),
        SkinnyVariant::new(NARROW, 8, 2, true),
        SkinnyVariant::new(NARROW, 12, 2, true),
        SkinnyVariant::new(WIDE, 8, 2, false),
        SkinnyVariant::new(WIDE, 8, 2, true),
    ],
    &[
        SkinnyVariant::new(ONE_WARP_8, 4, 3, false),
        SkinnyVariant::new(ONE_WARP_8, 4, 4, false),
        SkinnyVariant::new(ONE_WARP_8, 8, 2, true),
        SkinnyVariant::new(ONE_WARP_16, 8, 2, false),
    ],
    &[
        SkinnyVariant::new(TWO_WARPS_8, 4, 4, false),
        SkinnyVariant::new(TWO_WARPS_8, 4, 3, false),
        SkinnyVariant::new(TWO_WARPS_8, 8, 2, true),
        SkinnyVariant::new(TWO_WARPS_8, 12, 2, true),
        SkinnyVariant::new(ONE_WARP_8, 16, 2, false),
        SkinnyVariant::new(TWO_WARPS_16, 8, 2, false),
    ],
];

/// GLM-5's `max_position_embeddings`: the GEMM sweeps draw their rows' positions below it, so the
/// rope epilogues' f32 angle reduction is checked where the angles are largest.
const GLM5_POSITIONS: u64 = 202_752;

/// Which of [`SKINNY_VARIANTS`] a skinny GEMM kernel of K `k` and `columns` weight columns over
/// all heads is timed in.
fn skinny_class(k: u64, columns: u64) -> usize {
    match k.div_ceil(32) {
        0..=8 => 2,
        9..=16 => 3,
        _ if columns < narrow_weight_columns() => 1,
        _ => 0,
    }
}

/// The template of the 16-row skinny GEMM on a persistent grid.
const PERSISTENT_SKINNY: &str = "gemm_skinny_persistent";

/// The permuted columns of a 16-row skinny GEMM kernel (`gemm_skinny.cu` with one row tile, or
/// `gemm_skinny_persistent.cu`) in one head: a rope block padded to an even width.
fn skinny_columns(k: &Kernel) -> u64 {
    let p = |name: &str| k.params[name].parse::<u64>().unwrap();
    let n = p("n");
    if k.params["rope"] == "true" {
        let period = p("period");
        n / period * (period + period % 2)
    } else {
        n
    }
}

/// A launch a variant sweep times: its node in `f`, its kernel, and the node cut out of `f`
/// (`mini`) as a module of its own.
struct Picked {
    node: String,
    kernel: Kernel,
    f: Function,
    n: NodeIndex,
    mini: Function,
    module: Module,
}

/// The launches of function `function` of each of `modules`, lowered for `limits`, whose kernel
/// `keep` accepts, one per distinct kernel (later layers launch the same ones).
fn distinct_launches(
    dev: &Device,
    modules: &[Module],
    function: &str,
    limits: Limits,
    name: &str,
    keep: &dyn Fn(&Kernel) -> bool,
) -> Vec<Picked> {
    let mut seen = std::collections::HashSet::new();
    let mut picked = Vec::new();
    for module in modules {
        let f = module
            .functions
            .iter()
            .find(|f| f.name == function)
            .unwrap();
        let lowered = lower_module(module, dev.target, limits).unwrap();
        let phase = lowered
            .phases
            .iter()
            .find(|p| p.function == f.name)
            .unwrap();
        for l in phase.launches() {
            let Some(k) = lowered.kernels.iter().find(|k| k.name == l.kernel) else {
                continue;
            };
            if keep(k) && seen.insert(k.name.clone()) {
                let n = f.find(&l.node).unwrap();
                let mini = cut(f, n);
                let mut m = Module::new(name);
                m.functions.push(mini.clone());
                picked.push(Picked {
                    node: l.node.clone(),
                    kernel: k.clone(),
                    f: f.clone(),
                    n,
                    mini,
                    module: m,
                });
            }
        }
    }
    picked
}

/// The 16-row skinny GEMM (`gemm_skinny.cu` with one row tile, `gemm_skinny_persistent.cu` on a
/// persistent grid) in each of [`SKINNY_VARIANTS`], and the shipped tile with its rows of x
/// staged in shared memory where K allows (`with_x_staged`), else with x loaded further ahead
/// (`with_x_ahead`), on every GLM-5 decode projection at 1 and 8 rows: each variant checked against the
/// interpreter and timed as issue 14 times a decode GEMM (weights from DRAM, back to back in a
/// CUDA graph). Writes `skinny.md` (every variant, the one the lowering ships marked) and
/// `skinny.json` (the shipped variant, for `scripts/torch_gemm.py`), so the lowering's choice
/// is read off a measurement; the shipped variant is also timed with plain launches, for what
/// programmatic launch buys back to back. Beside each shape, its read ceiling
/// ([`ReadCeilings`]): `read_us` in `skinny.json`, a line of `skinny.md`.
#[test]
#[ignore = "gpu"]
fn glm5_skinny_gemm_variants_are_timed() {
    let dev = Device::open();
    let module = model("glm5.ron");
    let copy_gbs = measure_copy_bandwidth(&dev);
    let mut reads = ReadCeilings::new(&dev);
    let mut rng = Rng(777);
    let limits = Limits {
        max_prefill_tokens: 64,
        max_batch: 64,
        max_context: 4096,
    };
    let is_narrow_skinny = |k: &Kernel| {
        k.template == PERSISTENT_SKINNY
            || (k.template == "gemm_skinny" && k.params.get("mt").map(String::as_str) == Some("1"))
    };
    let mut cases = Vec::new();
    let picked = distinct_launches(
        &dev,
        std::slice::from_ref(&module),
        "decode",
        limits,
        "skinny",
        &is_narrow_skinny,
    );
    for p in picked {
        let (k, mini, mm) = (p.kernel, p.mini, p.module);
        // A persistent grid of a block per tile is the per-tile grid.
        let effective = |v: SkinnyVariant| SkinnyVariant {
            persistent: v.persistent && v.blocks_for(&k, dev.target) < v.tiles(&k),
            ..v
        };
        let shipped = effective(SkinnyVariant::of(&k));
        let kp = |name: &str| k.params[name].parse::<u64>().unwrap();
        let class = skinny_class(kp("k"), kp("n") * kp("heads"));
        let mut variants = vec![shipped];
        // The shipped tile with x staged in shared memory where its K allows, else with x
        // loaded further ahead.
        let x_early = with_x_staged(&k).or_else(|| with_x_ahead(&k));
        variants.extend(x_early.map(|e| effective(SkinnyVariant::of(&e))));
        for &v in SKINNY_VARIANTS[class] {
            let v = effective(v);
            if !variants.contains(&v) {
                variants.push(v);
            }
        }
        cases.push((p.node, mini, mm, k, shipped, variants));
    }
    let f = module
        .functions
        .iter()
        .find(|f| f.name == "decode")
        .unwrap();
    let target = dev.target;
    let tweak = |v: SkinnyVariant, shipped: Kernel| {
        move |module: &Module, t: Target, limits: Limits| {
            let mut lowered = lower_module(module, t, limits).unwrap();
            let mut names = std::collections::HashSet::new();
            for k in lowered.kernels.iter_mut().filter(|k| is_narrow_skinny(k)) {
                k.template = if v.persistent {
                    PERSISTENT_SKINNY
                } else {
                    "gemm_skinny"
                }
                .into();
                for (name, value) in [
                    ("nt", v.nt),
                    ("warps_k", v.warps_k),
                    ("depth", v.depth),
                    ("min_blocks", v.blocks),
                    ("prefetch", v.prefetch),
                ] {
                    k.params.insert(name.into(), value.to_string());
                }
                // The partial sums' static array: 8 warps × 4·nt floats × 32 lanes.
                k.shared_bytes = (8 * 4 * v.nt * 32 * 4) as u32;
                k.params.remove("x_rows");
                k.params.remove("x_ahead");
                if v.x_rows > 0 {
                    *k = with_x_staged(k).unwrap();
                } else if v.x_ahead > 1 {
                    *k = with_x_ahead(k).unwrap();
                }
                assert_eq!(SkinnyVariant::of(k), v, "the tweaked kernel is the variant");
                names.insert(k.name.clone());
            }
            for step in lowered.phases.iter_mut().flat_map(|p| p.steps.iter_mut()) {
                if let Step::Launch(l) = step {
                    if names.contains(&l.kernel) {
                        l.grid = GridDim::fixed(v.blocks_for(&shipped, target));
                    }
                }
            }
            lowered
        }
    };
    // Every variant compiled first, on every core, into the cubin cache the runs then read.
    let sources: Vec<String> = cases
        .iter()
        .flat_map(|(_, _, mm, k, _, variants)| {
            variants
                .iter()
                .map(|v| variant_source(mm, dev.target, limits, &tweak(*v, k.clone())))
        })
        .collect();
    compile_all(&dev, &sources);
    let mut report = format!(
        "copy roofline measured in this run: {copy_gbs:.0} GB/s; variant = the tile (`Cc×W`: C columns a warp, W warps on K), depth/blocks an SM/L2 prefetch, then the grid: `tiles` (a block per tile) or `pN` (persistent, N blocks), * = shipped; read ceiling = a kernel that only reads the weight's bytes (heads × N × K × 2, the weight alone: not x or y) under the same protocol, its fastest configuration (16-byte loads in flight a thread, blocks an SM) and its GB/s of those bytes\n\
         | rows | node | heads × N × K | variant | max err | time (us) | GB/s | TFLOP/s | of roofline |\n|---|---|---|---|---|---|---|---|---|\n"
    );
    let name = |v: &SkinnyVariant, k: &Kernel| {
        let grid = if v.persistent {
            format!("p{}", v.blocks_for(k, target))
        } else {
            "tiles".to_string()
        };
        let staged = match (v.x_rows, v.x_ahead) {
            (0, 1) => String::new(),
            (0, a) => format!(" x+{a}"),
            (r, _) => format!(" x{r}"),
        };
        format!(
            "{}c×{} {}/{}/{} {grid}{staged}",
            8 * v.nt,
            v.warps_k,
            v.depth,
            v.blocks,
            v.prefetch
        )
    };
    let mut shapes = Vec::new();
    let mut failures = Vec::new();
    for (node, mini, mm, kernel, shipped, variants) in &cases {
        let n = f.find(node).unwrap();
        let weight = &f.node(f.operands(n)[1].node).outputs[0];
        let [heads, n_cols, k] = weight_shape(weight);
        let weight_bytes = heads * n_cols * k * weight.dtype.size_bytes();
        let read = reads.of(&dev, weight_bytes);
        for rows in [1u64, 8] {
            let b = Bindings::from([("b".into(), rows), ("t".into(), 4096)]);
            let ins = inputs(mini, &b, &mut rng, 154_880, GLM5_POSITIONS);
            let want = interpret(mm, mini, &ins).unwrap();
            // A run checked against the interpreter, timed and written as a line of the report.
            let record =
                |run: &Run, label: &str, failures: &mut Vec<String>, report: &mut String| {
                    let err = match worst_error(run, &want, &b) {
                        Ok(e) => format!("{e:.1e}"),
                        Err(e) => {
                            failures.push(format!("{node} rows={rows} {label}: {e}"));
                            "FAIL".to_string()
                        }
                    };
                    let t = timed(run, mini, &b, copy_gbs);
                    let line = format!(
                        "| {rows} | {node} | {heads} × {n_cols} × {k} | {label} | {err} | {} |",
                        t.cells()
                    );
                    println!("{line}");
                    writeln!(report, "{line}").unwrap();
                    t
                };
            let mut best: Option<(f64, SkinnyVariant)> = None;
            for v in variants {
                let run =
                    run_on_gpu_with(&dev, mm, limits, &ins, &b, true, &tweak(*v, kernel.clone()));
                let mark = if v == shipped { "*" } else { "" };
                let label = format!("{}{mark}", name(v, kernel));
                let t = record(&run, &label, &mut failures, &mut report);
                if best.is_none_or(|(secs, _)| t.secs < secs) {
                    best = Some((t.secs, *v));
                }
                if !mark.is_empty() {
                    shapes.push(format!(
                        "{{\"phase\": \"decode\", \"node\": \"{node}\", \"rows\": {rows}, \"heads\": {heads}, \"n\": {n_cols}, \"k\": {k}, \"dtype\": \"bf16\", \"glmc_us\": {:.3}, \"bytes\": {}, \"flops\": {}, \"read_us\": {:.3}}}",
                        t.secs * 1e6,
                        t.moved,
                        t.flops,
                        read.secs * 1e6
                    ));
                }
            }
            // What programmatic launch buys the shipped variant back to back: the same run with
            // each launch waiting for the one before it to finish.
            let plain = |m: &Module, t: Target, l: Limits| Lowered {
                programmatic_launch: false,
                ..tweak(*shipped, kernel.clone())(m, t, l)
            };
            let run = run_on_gpu_with(&dev, mm, limits, &ins, &b, true, &plain);
            let label = format!("{} plain launches", name(shipped, kernel));
            record(&run, &label, &mut failures, &mut report);
            let (secs, v) = best.unwrap();
            writeln!(
                report,
                "| {rows} | {node} | best | {} | | {:.1} | | | |",
                name(&v, kernel),
                secs * 1e6
            )
            .unwrap();
            writeln!(
                report,
                "| {rows} | {node} | read ceiling | {}, {weight_bytes} bytes | | {:.1} | {:.0} | | |",
                read.config,
                read.secs * 1e6,
                weight_bytes as f64 / read.secs / 1e9
            )
            .unwrap();
        }
    }
    finish_sweep("skinny", &report, &shapes, &failures);
}

/// The read ceilings (`runtime/src/cuda/ceiling.rs`) of a weight (`of`: the fastest a kernel
/// that only reads its bytes runs under the protocol `run_on_gpu_with` times glmc's kernels by,
/// rotated copies from DRAM, back to back in one CUDA graph, programmatic launches; measured
/// once a byte count) and of the absorbed attention's key gather (`gather`).
struct ReadCeilings {
    kernels: glmc_runtime::cuda::Kernels,
    by_bytes: HashMap<u64, ReadCeiling>,
}

impl ReadCeilings {
    fn new(dev: &Device) -> ReadCeilings {
        let source = ceiling::read_source();
        let cache = nvcc::default_cache_dir();
        let compiled = nvcc::compile(&dev.compiler, &source, dev.target, cache.as_deref()).unwrap();
        ReadCeilings {
            kernels: dev
                .gpu
                .load(&compiled.cubin, LaunchMode::Programmatic)
                .unwrap(),
            by_bytes: HashMap::new(),
        }
    }

    fn gather(&mut self, dev: &Device, gather: &Gather) -> ReadCeiling {
        ceiling::gather_ceiling(&dev.gpu, &mut self.kernels, gather).unwrap()
    }

    fn of(&mut self, dev: &Device, bytes: u64) -> ReadCeiling {
        *self.by_bytes.entry(bytes).or_insert_with(|| {
            ceiling::read_ceiling(&dev.gpu, &mut self.kernels, bytes as usize).unwrap()
        })
    }
}

/// Writes a variant sweep's report (`STEM.md`) and its shapes for `scripts/torch_gemm.py`
/// (`STEM.json`), then fails if any variant did.
fn finish_sweep(stem: &str, report: &str, shapes: &[String], failures: &[String]) {
    std::fs::write(out_dir().join(format!("{stem}.md")), report).unwrap();
    std::fs::write(
        out_dir().join(format!("{stem}.json")),
        format!("[\n{}\n]\n", shapes.join(",\n")),
    )
    .unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// What the tiled and decode GEMM sweeps write: the report's lines, the JSON lines of each
/// shape's shipped and fastest variant (for `scripts/torch_gemm.py`) and the failures.
struct Sweep {
    report: String,
    shapes: Vec<String>,
    failures: Vec<String>,
    copy_gbs: f64,
}

/// One GEMM shape of a sweep, and its fastest passing variant so far.
struct SweepShape<'a> {
    phase: &'a str,
    node: &'a str,
    rows: u64,
    weight: [u64; 3],
    best: Option<(f64, String)>,
}

impl Sweep {
    fn new(header: String, copy_gbs: f64) -> Sweep {
        Sweep {
            report: header,
            shapes: Vec::new(),
            failures: Vec::new(),
            copy_gbs,
        }
    }

    /// One variant's run of `shape`: checked against `want`, timed over `f` at `b`, its line
    /// written, and its JSON line kept when it is shipped or the fastest passing one so far.
    fn variant(
        &mut self,
        shape: &mut SweepShape,
        label: &str,
        shipped: bool,
        run: &Run,
        want: &[Tensor],
        (f, b): (&Function, &Bindings),
    ) {
        let (node, rows, [heads, n, k]) = (shape.node, shape.rows, shape.weight);
        let err = match worst_error(run, want, b) {
            Ok(e) => format!("{e:.1e}"),
            Err(e) => {
                self.failures.push(format!("{node} variant {label}: {e}"));
                "FAIL".to_string()
            }
        };
        let t = timed(run, f, b, self.copy_gbs);
        let mark = if shipped { "*" } else { "" };
        let line = format!(
            "| {rows} | {node} | {heads} × {n} × {k} | {label}{mark} | {err} | {} |",
            t.cells()
        );
        println!("{line}");
        writeln!(self.report, "{line}").unwrap();
        let json = |tag: &str| {
            format!(
                "{{\"phase\": \"{}\", \"node\": \"{node} [{tag}]\", \"rows\": {rows}, \"heads\": {heads}, \"n\": {n}, \"k\": {k}, \"dtype\": \"bf16\", \"glmc_us\": {:.3}, \"bytes\": {}, \"flops\": {}}}",
                shape.phase,
                t.secs * 1e6,
                t.moved,
                t.flops
            )
        };
        if shipped {
            self.shapes.push(json(&format!("shipped {label}")));
        }
        if shape.best.as_ref().is_none_or(|(secs, _)| t.secs < *secs) && err != "FAIL" {
            if !shipped {
                self.shapes
                    .retain(|s| !s.contains(&format!("{node} [best ")));
                self.shapes.push(json(&format!("best {label}")));
            }
            shape.best = Some((t.secs, label.to_string()));
        }
    }

    /// The shape's fastest variant, as a line of its own.
    fn best(&mut self, shape: &SweepShape) {
        if let Some((secs, label)) = &shape.best {
            writeln!(
                self.report,
                "| {} | {} | best | {label} | | {:.1} | | | |",
                shape.rows,
                shape.node,
                secs * 1e6
            )
            .unwrap();
        }
    }

    fn finish(&self, stem: &str) {
        finish_sweep(stem, &self.report, &self.shapes, &self.failures);
    }
}

/// The tiled GEMM (`gemm_mma.cu`) in [`TILED_GEMM`] and each of [`TILED_GEMM_VARIANTS`] on every
/// GLM-5 prefill GEMM it runs (one node per distinct kernel) at 4096 rows: each variant checked
/// against the interpreter (computed at 67 rows, the inputs repeated to 4096, as
/// `glm5_gemm_shapes_match_the_interpreter_and_are_timed` does) and timed as issue 14 times a
/// GEMM (inputs from DRAM, back to back in a CUDA graph). Writes `tiled.md` (every variant,
/// TFLOP/s and the fraction of the mma.sync ceiling, the shipped one marked, the best per
/// node) and `tiled.json` (the shipped and the best variant of each node, for
/// `scripts/torch_gemm.py`), so that the winner is read off a measurement.
#[test]
#[ignore = "gpu"]
fn glm5_tiled_gemm_variants_are_timed() {
    let dev = Device::open();
    let copy_gbs = measure_copy_bandwidth(&dev);
    let mut rng = Rng(9091);
    let limits = Limits {
        max_prefill_tokens: 4096,
        max_batch: 64,
        max_context: 4096,
    };
    // The sparse prefill's GEMMs, then the dense prefill's that differ (kv_b_proj).
    let modules = [model("glm5.ron"), dense_model("glm5.ron")];
    let cases: Vec<_> = distinct_launches(&dev, &modules, "prefill", limits, "tiled", &|k| {
        k.template == "gemm_mma"
    })
    .into_iter()
    .map(|p| {
        let w = p.f.node(p.f.operands(p.n)[1].node).outputs[0].clone();
        let rows = p.f.node(p.n).outputs[0].shape.first().cloned();
        (p.node, p.mini, p.module, w, rows)
    })
    .collect();
    let variants: Vec<TiledGemm> = std::iter::once(TILED_GEMM)
        .chain(TILED_GEMM_VARIANTS)
        .collect();
    let lower = |v: TiledGemm| {
        move |m: &Module, t, l| lower_module_with(m, t, l, Variant::TiledGemm(v)).unwrap()
    };
    let sources: Vec<String> = cases
        .iter()
        .flat_map(|(_, _, mm, _, _)| {
            variants
                .iter()
                .map(|v| variant_source(mm, dev.target, limits, &lower(*v)))
        })
        .collect();
    compile_all(&dev, &sources);
    let mut sweep = Sweep::new(format!(
        "copy roofline measured in this run: {copy_gbs:.0} GB/s; mma.sync ceiling {MMA_SYNC_TFLOPS} TFLOP/s; \
         variant = block tile, warps, K step, stages, blocks an SM, row tiles a group; * = shipped\n\
         | rows | node | heads × N × K | variant | max err | time (us) | GB/s | TFLOP/s | of roofline |\n|---|---|---|---|---|---|---|---|---|\n"
    ), copy_gbs);
    let (small, rows) = (67u64, 4096u64);
    for (node, mini, mm, w, first) in &cases {
        let [heads, n_cols, k] = weight_shape(w);
        // The rows are the prefill's tokens (`s`) or, for the dense prefill's kv_b_proj, the
        // context (`t`); both symbols take the row count.
        let sym = match first {
            Some(glmc_ir::Dim::Sym(s)) => s.clone(),
            other => panic!("{node}: rows {other:?}"),
        };
        let per_row = per_row_inputs(mini, &sym);
        let b = Bindings::from([("s".into(), small), ("t".into(), small)]);
        let ins = inputs(mini, &b, &mut rng, 154_880, GLM5_POSITIONS);
        let want = interpret(mm, mini, &ins).unwrap();
        let ins: Vec<Tensor> = ins
            .iter()
            .zip(&per_row)
            .map(|(t, r)| {
                if *r {
                    repeat_rows(t, small as usize, rows as usize)
                } else {
                    t.clone()
                }
            })
            .collect();
        let want: Vec<Tensor> = want
            .iter()
            .map(|t| repeat_rows(t, small as usize, rows as usize))
            .collect();
        let b = Bindings::from([("s".into(), rows), ("t".into(), rows)]);
        let mut shape = SweepShape {
            phase: "prefill",
            node,
            rows,
            weight: [heads, n_cols, k],
            best: None,
        };
        for &v in &variants {
            let run = run_on_gpu_with(&dev, mm, limits, &ins, &b, true, &lower(v));
            let shipped = v == shipped_tiled_gemm(k);
            sweep.variant(&mut shape, &v.to_string(), shipped, &run, &want, (mini, &b));
        }
        sweep.best(&shape);
    }
    sweep.finish("tiled");
}

/// Every GLM-5 decode GEMM above 16 rows (one node per distinct kernel) at 64 rows in
/// [`DECODE_GEMM`] and each of [`DECODE_GEMM_VARIANTS`] (the 64-row skinny GEMM among them):
/// each variant checked against the interpreter and timed as issue 14 times a decode GEMM
/// (weights from DRAM, back to back in a CUDA graph; a split GEMM's partial and reduce launches
/// together). Writes `decode64.md` (every variant with its K splits, the fraction of the roofline,
/// the shipped one marked, the best per node) and `decode64.json` (the shipped and the best
/// variant of each node, for `scripts/torch_gemm.py`), so that the winner is read off a
/// measurement.
#[test]
#[ignore = "gpu"]
fn glm5_decode_gemm_variants_are_timed() {
    let dev = Device::open();
    let copy_gbs = measure_copy_bandwidth(&dev);
    let mut rng = Rng(6464);
    let limits = Limits {
        max_prefill_tokens: 64,
        max_batch: 64,
        max_context: 4096,
    };
    let module = model("glm5.ron");
    let lower = |v: DecodeGemm| {
        move |m: &Module, t, l| lower_module_with(m, t, l, Variant::DecodeGemm(v)).unwrap()
    };
    // The tiled GEMMs of the batch's rows (the first launch of a split one): the kernels a
    // decode runs above 16 rows.
    let batch = glmc_ir::Dim::Sym("b".into());
    let cases: Vec<Picked> = distinct_launches(
        &dev,
        std::slice::from_ref(&module),
        "decode",
        limits,
        "decode64",
        &|k| k.template == "gemm_mma" && k.params["part"] != "reduce",
    )
    .into_iter()
    .filter(|p| p.f.node(p.n).outputs[0].shape.first() == Some(&batch))
    .collect();
    let variants: Vec<DecodeGemm> = std::iter::once(DECODE_GEMM)
        .chain(DECODE_GEMM_VARIANTS)
        .collect();
    let sources: Vec<String> = cases
        .iter()
        .flat_map(|p| {
            variants
                .iter()
                .map(|v| variant_source(&p.module, dev.target, limits, &lower(*v)))
        })
        .collect();
    compile_all(&dev, &sources);
    // A variant as the lowering ran it on a node: the tile and the ways K was split.
    let name = |v: DecodeGemm, mm: &Module| match v {
        DecodeGemm::Skinny => "skinny 64x16".to_string(),
        DecodeGemm::Tiled(t) => {
            let lowered = lower(v)(mm, dev.target, limits);
            let splits = lowered
                .kernels
                .iter()
                .find(|k| k.template == "gemm_mma")
                .map_or("?".to_string(), |k| k.params["splits"].clone());
            format!("{t} K/{splits}")
        }
    };
    let mut sweep = Sweep::new(format!(
        "copy roofline measured in this run: {copy_gbs:.0} GB/s; mma.sync ceiling {MMA_SYNC_TFLOPS} TFLOP/s; \
         variant = the 64-row skinny GEMM, or the tiled one's block tile, warps, K step, stages, blocks an SM, row tiles a group and K splits; * = shipped\n\
         | rows | node | heads × N × K | variant | max err | time (us) | GB/s | TFLOP/s | of roofline |\n|---|---|---|---|---|---|---|---|---|\n"
    ), copy_gbs);
    let rows = 64u64;
    for p in &cases {
        let (node, mini, mm) = (&p.node, &p.mini, &p.module);
        let [heads, n_cols, k] = weight_shape(&p.f.node(p.f.operands(p.n)[1].node).outputs[0]);
        let b = Bindings::from([("b".into(), rows), ("t".into(), 4096)]);
        let ins = inputs(mini, &b, &mut rng, 154_880, 4096);
        let want = interpret(mm, mini, &ins).unwrap();
        let mut shape = SweepShape {
            phase: "decode",
            node,
            rows,
            weight: [heads, n_cols, k],
            best: None,
        };
        for &v in &variants {
            let run = run_on_gpu_with(&dev, mm, limits, &ins, &b, true, &lower(v));
            let shipped = v == DECODE_GEMM;
            sweep.variant(&mut shape, &name(v, mm), shipped, &run, &want, (mini, &b));
        }
        sweep.best(&shape);
    }
    sweep.finish("decode64");
}

/// `shape` of values a bf16 holds exactly, uniform in [−1, 1) times `scale`.
fn random_bf16(rng: &mut Rng, shape: Vec<usize>, scale: f32) -> Tensor {
    let count = shape.iter().product();
    let data = (0..count)
        .map(|_| bf16::from_f32((rng.uniform() * 2.0 - 1.0) * scale).to_f32())
        .collect();
    Tensor::f32(shape, data).unwrap()
}

/// The grouped expert GEMMs at GLM-5's shapes (hidden 6144, expert intermediate 2048, top-8 of
/// 256 experts, bf16) as the lowering launches them: decode at 1 and 8 tokens (gate/up's skinny
/// kernel; `moe.down` in every form of `MOE_DOWN_VARIANTS` beside the shipped `MOE_DOWN`, the
/// form the lowering ships at that count marked `*`, so that one run picks the form) and, in
/// tests of their own, decode at 64 tokens and prefill at 67 tokens (the tensor-core kernel; a
/// period that is no multiple of its tiles) against the interpreter, and prefill at 4096 tokens
/// on sampled routed rows against the host (`sampled_moe_rows`), since the interpreter would
/// take minutes. The routing is drawn over all 256 experts (8 distinct per token, uniform); only
/// the experts that get rows are in the weight table, relabelled in id order, so a run moves
/// what GLM-5's would (the active experts' weights, the same rows per expert) without 19 GiB of
/// stacked weights. The table's experts cycle through 8 random ones (`repeat_rows`), so a
/// kernel that picks the wrong expert still fails. Timed by `run_on_gpu` (inputs from DRAM, in a
/// CUDA graph); written to `moe-decode.md`, `moe-decode64.md` and `moe-prefill.md`, one test
/// each (the weight tables of 64 tokens and more take a minute or more of host time to make;
/// the `moe.experts` baseline of codegen II, about 20 ms at one token, is no longer timed).
#[test]
#[ignore = "gpu"]
fn glm5_moe_grouped_gemms_match_the_interpreter_and_are_timed() {
    moe_grouped_gemms(&[("decode", "b", 1), ("decode", "b", 8)], "moe-decode.md");
}

#[test]
#[ignore = "gpu"]
fn glm5_moe_grouped_gemms_at_64_tokens_match_the_interpreter_and_are_timed() {
    moe_grouped_gemms(&[("decode", "b", 64)], "moe-decode64.md");
}

#[test]
#[ignore = "gpu"]
fn glm5_moe_grouped_gemms_at_prefill_match_the_interpreter_and_are_timed() {
    moe_grouped_gemms(
        &[("prefill", "s", 67), ("prefill", "s", 4096)],
        "moe-prefill.md",
    );
}

/// Routed rows of a large `moe.gate_up` or `moe.down` run against the same rows computed on the
/// host in f64 from the op's inputs (the interpreter would take minutes at 4096 tokens): every
/// row next to a 64-row boundary of the expert with the most rows (the tensor-core kernel's
/// tiles end there) and 16 rows spread over all. `ins` are the op's inputs as the test made
/// them, `gpu` its output; returns the GPU's sampled values, the reference and the row count.
fn sampled_moe_rows(
    op: &Op,
    ins: &[Tensor],
    gpu: &[f64],
    top_k: usize,
) -> (Vec<f64>, Vec<f64>, usize) {
    let offsets = ins[1].as_i64().unwrap();
    let w0 = ins[2].as_f32().unwrap();
    let (n, k) = (ins[2].shape()[1], ins[2].shape()[2]);
    let routed = *offsets.last().unwrap() as usize;
    let owner = |r: usize| offsets.iter().rposition(|&o| o as usize <= r).unwrap();
    let biggest = (0..offsets.len() - 1)
        .max_by_key(|&e| offsets[e + 1] - offsets[e])
        .unwrap();
    let (start, end) = (offsets[biggest] as usize, offsets[biggest + 1] as usize);
    let mut rows: Vec<usize> = (start..end)
        .filter(|r| matches!((r - start) % 64, 0 | 63))
        .chain((0..16).map(|i| i * routed / 16))
        .chain([end - 1, routed - 1])
        .collect();
    rows.sort_unstable();
    rows.dedup();
    let dot =
        |a: &[f32], b: &[f32]| -> f64 { a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum() };
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for &r in &rows {
        let e = owner(r);
        got.extend_from_slice(&gpu[r * n..(r + 1) * n]);
        let span = |c: usize| (e * n + c) * k..(e * n + c + 1) * k;
        match op {
            Op::MoeGateUp {} => {
                let (x, w1, order) = (
                    ins[0].as_f32().unwrap(),
                    ins[3].as_f32().unwrap(),
                    ins[4].as_i64().unwrap(),
                );
                let t = order[r] as usize / top_k;
                let xr = &x[t * k..(t + 1) * k];
                want.extend((0..n).map(|c| {
                    let g = dot(xr, &w0[span(c)]);
                    g / (1.0 + (-g).exp()) * dot(xr, &w1[span(c)])
                }));
            }
            _ => {
                let h = ins[0].as_f32().unwrap();
                let hr = &h[r * k..(r + 1) * k];
                want.extend((0..n).map(|c| dot(hr, &w0[span(c)])));
            }
        }
    }
    (got, want, rows.len())
}

/// The host reference of `sampled_moe_rows` is the interpreter's `moe.gate_up` and `moe.down`:
/// on a small routing (40 tokens, top 4 of 16 experts, f32), its rows equal the interpreter's.
#[test]
fn sampled_moe_rows_are_the_interpreters() {
    use glmc_ir::Dim;
    let (tokens, top_k, experts, n, k) = (40usize, 4usize, 16usize, 24usize, 64usize);
    let mut rng = Rng(0x5eed);
    let ids = route(&mut rng, tokens, top_k, experts);
    let (offsets, order, _) = sort_pairs(&ids, experts);
    let c = |v: usize| Dim::Const(v as u64);
    let ty = |shape: Vec<Dim>| TensorType::new(DType::F32, shape);
    let int = |shape: Vec<Dim>| TensorType::new(DType::I64, shape);
    let random = |rng: &mut Rng, shape: Vec<usize>| {
        let count = shape.iter().product();
        Tensor::f32(shape, (0..count).map(|_| rng.uniform() - 0.5).collect()).unwrap()
    };
    for op in [Op::MoeGateUp {}, Op::MoeDown {}] {
        let mut f = Function::new("decode");
        let (operands, ins) = match op {
            Op::MoeGateUp {} => {
                let x = f.push_input(0, "x", ty(vec![c(tokens), c(k)]));
                let off = f.push_input(1, "offsets", int(vec![c(experts + 1)]));
                let w0 = f.push_input(2, "w0", ty(vec![c(experts), c(n), c(k)]));
                let w1 = f.push_input(3, "w1", ty(vec![c(experts), c(n), c(k)]));
                let ord = f.push_input(4, "order", int(vec![c(tokens), c(top_k)]));
                let ins = vec![
                    random(&mut rng, vec![tokens, k]),
                    Tensor::i64(vec![experts + 1], offsets.clone()).unwrap(),
                    random(&mut rng, vec![experts, n, k]),
                    random(&mut rng, vec![experts, n, k]),
                    Tensor::i64(vec![tokens, top_k], order.clone()).unwrap(),
                ];
                (vec![x, ord, off, w0, w1], ins)
            }
            _ => {
                let h = f.push_input(0, "h", ty(vec![c(tokens), c(top_k), c(k)]));
                let off = f.push_input(1, "offsets", int(vec![c(experts + 1)]));
                let w0 = f.push_input(2, "w0", ty(vec![c(experts), c(n), c(k)]));
                let ins = vec![
                    random(&mut rng, vec![tokens, top_k, k]),
                    Tensor::i64(vec![experts + 1], offsets.clone()).unwrap(),
                    random(&mut rng, vec![experts, n, k]),
                ];
                (vec![h, off, w0], ins)
            }
        };
        let node = f.push(op.clone(), op.name(), &operands).unwrap();
        f.results.push(("out0".into(), node.into()));
        let mut m = Module::new("moe");
        m.functions.push(f.clone());
        let out = interpret(&m, &f, &ins).unwrap();
        let all: Vec<f64> = out[0].as_f32().unwrap().iter().map(|x| *x as f64).collect();
        let (got, want, rows) = sampled_moe_rows(&op, &ins, &all, top_k);
        assert!(rows > 16, "{rows} rows");
        let e = compare(&got, &want, DType::F32).unwrap();
        assert!(e < 1e-6, "{}: {e:e}", op.name());
    }
}

/// A grouped GEMM's form as a run of [`moe_grouped_gemms`] lowers it: as shipped, or (`moe.down`
/// at decode) in one form of `MoeDown` for every token count.
#[derive(Clone, Copy)]
enum MoeForm {
    Shipped,
    Down(MoeDown),
}

impl MoeForm {
    fn lower(self, m: &Module, t: Target, l: Limits) -> Lowered {
        match self {
            MoeForm::Shipped => lower_module(m, t, l).unwrap(),
            MoeForm::Down(f) => lower_module_with(m, t, l, Variant::MoeDown(f)).unwrap(),
        }
    }
}

/// One grouped GEMM alone in a function, at GLM-5's widths: `moe.gate_up` (x, offsets, gate,
/// up, order) or `moe.down` (h, offsets, down), `active` experts, rows `sym`.
fn moe_module(op: &Op, phase: &str, sym: &str, active: usize) -> (Module, Function) {
    use glmc_ir::Dim;
    let row = Dim::Sym(sym.into());
    let c = |v: usize| Dim::Const(v as u64);
    let bf = |shape: Vec<Dim>| TensorType::new(DType::BF16, shape);
    let int = |shape: Vec<Dim>| TensorType::new(DType::I64, shape);
    let table = |n: usize, k: usize| bf(vec![c(active), c(n), c(k)]);
    let mut f = Function::new(phase);
    let operands = match op {
        Op::MoeGateUp {} => {
            let x = f.push_input(0, "x", bf(vec![row.clone(), c(MOE_HIDDEN)]));
            let offsets = f.push_input(1, "offsets", int(vec![c(active + 1)]));
            let w0 = f.push_input(2, "w0", table(MOE_INTER, MOE_HIDDEN));
            let w1 = f.push_input(3, "w1", table(MOE_INTER, MOE_HIDDEN));
            let order = f.push_input(4, "order", int(vec![row, c(MOE_TOP_K)]));
            vec![x, order, offsets, w0, w1]
        }
        _ => {
            let h = f.push_input(0, "h", bf(vec![row, c(MOE_TOP_K), c(MOE_INTER)]));
            let offsets = f.push_input(1, "offsets", int(vec![c(active + 1)]));
            let w0 = f.push_input(2, "w0", table(MOE_HIDDEN, MOE_INTER));
            vec![h, offsets, w0]
        }
    };
    let node = f.push(op.clone(), op.name(), &operands).unwrap();
    f.results.push(("out0".into(), node.into()));
    let mut m = Module::new("moe");
    m.functions.push(f.clone());
    (m, f)
}

/// GLM-5's routed experts: hidden size, expert intermediate size, experts, experts a token.
const MOE_HIDDEN: usize = 6144;
const MOE_INTER: usize = 2048;
const MOE_EXPERTS: usize = 256;
const MOE_TOP_K: usize = 8;

/// The grouped GEMMs at each `(phase, symbol, tokens)` of `cases`.
fn moe_grouped_gemms(cases: &[(&str, &str, usize)], report_file: &str) {
    let dev = Device::open();
    let copy_gbs = measure_copy_bandwidth(&dev);
    let mut rng = Rng(0x6d6f65);
    let limits = Limits {
        max_prefill_tokens: 4096,
        max_batch: 64,
        max_context: 4096,
    };
    // Each case's routing, relabelled to its active experts (the experts with rows, in id
    // order), the sort of it, and the forms each op runs in.
    struct Case<'a> {
        phase: &'a str,
        sym: &'a str,
        tokens: usize,
        active: usize,
        relabelled: Vec<i64>,
        runs: Vec<(Op, Module, Function, Vec<MoeForm>)>,
    }
    let cases: Vec<Case> = cases
        .iter()
        .map(|&(phase, sym, tokens)| {
            let ids = route(&mut rng, tokens, MOE_TOP_K, MOE_EXPERTS);
            let mut used = ids.clone();
            used.sort_unstable();
            used.dedup();
            let relabelled: Vec<i64> = ids
                .iter()
                .map(|e| used.binary_search(e).unwrap() as i64)
                .collect();
            let active = used.len();
            let runs = [Op::MoeGateUp {}, Op::MoeDown {}]
                .into_iter()
                .map(|op| {
                    let (m, f) = moe_module(&op, phase, sym, active);
                    let forms = if matches!(op, Op::MoeDown {}) && phase == "decode" {
                        std::iter::once(MoeDown::Stream(MOE_DOWN))
                            .chain(MOE_DOWN_VARIANTS)
                            .map(MoeForm::Down)
                            .collect()
                    } else {
                        vec![MoeForm::Shipped]
                    };
                    (op, m, f, forms)
                })
                .collect();
            Case {
                phase,
                sym,
                tokens,
                active,
                relabelled,
                runs,
            }
        })
        .collect();
    // Every kernel compiled up front on every core, so that the runs read the cubin cache.
    let sources: Vec<String> = cases
        .iter()
        .flat_map(|c| &c.runs)
        .flat_map(|(_, m, _, forms)| {
            forms
                .iter()
                .map(|form| render::render(&form.lower(m, dev.target, limits).kernels).unwrap())
        })
        .collect();
    compile_all(&dev, &sources);
    let mut report = format!(
        "copy roofline measured in this run: {copy_gbs:.0} GB/s; mma.sync ceiling {MMA_SYNC_TFLOPS} TFLOP/s; \
         form = as lowered, or moe.down's form at decode (cols a block, steps in flight a warp, blocks an SM; * = shipped at this count)\n\
         | phase | tokens | active experts | op | kernel | form | max err | time (us) | GB/s | TFLOP/s | of roofline |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    let mut failures = Vec::new();
    for case in &cases {
        let (phase, tokens, active) = (case.phase, case.tokens, case.active);
        let (offsets, order, _) = sort_pairs(&case.relabelled, active);
        let b = Bindings::from([(case.sym.into(), tokens as u64), ("t".into(), 4096)]);
        let int = |shape: &[usize], data: Vec<i64>| Tensor::i64(shape.to_vec(), data).unwrap();
        let offsets_t = int(&[active + 1], offsets);
        let weight = |rng: &mut Rng, n: usize, kk: usize| {
            repeat_rows(&random_bf16(rng, vec![8, n, kk], 0.02), 8, active)
        };
        for (op, mm, f, forms) in &case.runs {
            let mut ins = match op {
                Op::MoeGateUp {} => vec![
                    random_bf16(&mut rng, vec![tokens, MOE_HIDDEN], 1.0),
                    offsets_t.clone(),
                    weight(&mut rng, MOE_INTER, MOE_HIDDEN),
                    weight(&mut rng, MOE_INTER, MOE_HIDDEN),
                    int(&[tokens, MOE_TOP_K], order.clone()),
                ],
                _ => vec![
                    random_bf16(&mut rng, vec![tokens, MOE_TOP_K, MOE_INTER], 1.0),
                    offsets_t.clone(),
                    weight(&mut rng, MOE_HIDDEN, MOE_INTER),
                ],
            };
            // The interpreter's result, computed once for every form.
            let want: Option<Vec<f64>> = (tokens < 4096).then(|| {
                interpret(mm, f, &ins).unwrap()[0]
                    .as_f32()
                    .unwrap()
                    .iter()
                    .map(|x| *x as f64)
                    .collect()
            });
            for &form in forms {
                let run = run_on_gpu_with(&dev, mm, limits, &ins, &b, true, &|m, t, l| {
                    form.lower(m, t, l)
                });
                let at = &run.phase.results[0].1;
                let gpu = gather(&bytes_of(&run, at), at, &b);
                let name = match form {
                    MoeForm::Shipped => "as lowered".to_string(),
                    MoeForm::Down(d) if d == shipped_moe_down(tokens as u64) => format!("{d}*"),
                    MoeForm::Down(d) => d.to_string(),
                };
                let checked = match &want {
                    Some(reference) => {
                        compare(&gpu, reference, at.dtype).map(|e| format!("{e:.1e}"))
                    }
                    None => {
                        let (got, want, rows) = sampled_moe_rows(op, &ins, &gpu, MOE_TOP_K);
                        compare(&got, &want, at.dtype)
                            .map(|e| format!("{e:.1e} ({rows} sampled rows)"))
                    }
                };
                let err = checked.unwrap_or_else(|why| {
                    failures.push(format!("{phase} {tokens} {} {name}: {why}", op.name()));
                    "FAIL".into()
                });
                let kernel = launched(&run.phase, &b).join(",");
                let line = format!(
                    "| {phase} | {tokens} | {active} | {} | {kernel} | {name} | {err} | {} |",
                    op.name(),
                    timed(&run, f, &b, copy_gbs).cells()
                );
                println!("{line}");
                writeln!(report, "{line}").unwrap();
            }
            ins.clear();
        }
    }
    print!("{report}");
    std::fs::write(out_dir().join(report_file), &report).unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// One `mla.attend.absorbed` at GLM-5's widths (512 latent + 64 rope, scale 1/16) alone in a
/// function: inputs q_abs, q_pe, the latent and rope caches (`[b, t, ..]` at decode, `[t, ..]`
/// at prefill), positions and, when sparse, the top-k lists of 2048.
fn absorbed_attention_module(
    phase: &str,
    heads: u64,
    sparse: bool,
    dense_until: u64,
    dtype: DType,
) -> Module {
    use glmc_ir::Dim;
    let row = Dim::sym(if phase == "prefill" { "s" } else { "b" });
    let t = Dim::sym("t");
    let cache = |d: u64| {
        let mut shape = vec![t.clone(), Dim::Const(d)];
        if phase != "prefill" {
            shape.insert(0, row.clone());
        }
        TensorType::new(dtype, shape)
    };
    let mut f = Function::new(phase);
    let q = |d: u64| TensorType::new(dtype, vec![row.clone(), Dim::Const(heads), Dim::Const(d)]);
    let mut operands = vec![
        f.push_input(0, "q_abs", q(512)),
        f.push_input(1, "q_pe", q(64)),
        f.push_input(2, "c_kv", cache(512)),
        f.push_input(3, "k_pe", cache(64)),
        f.push_input(
            4,
            "positions",
            TensorType::new(DType::I64, vec![row.clone()]),
        ),
    ];
    if sparse {
        operands.push(f.push_input(
            5,
            "topk",
            TensorType::new(DType::I64, vec![row.clone(), Dim::Const(2048)]),
        ));
    }
    let op = Op::MlaAttendAbsorbed {
        dense_until,
        scale: 1.0 / 16.0,
        sparse,
    };
    let node = f.push(op, "attn", &operands).unwrap();
    f.results.push(("out".into(), node.into()));
    let mut m = Module::new("absorbed");
    m.functions.push(f);
    m
}

/// `t` restricted to the entries `pick` of its first axis.
fn pick_rows(t: &Tensor, pick: &[usize]) -> Tensor {
    let mut shape = t.shape().to_vec();
    let row = t.numel() / shape[0];
    shape[0] = pick.len();
    let gather = |r: &usize| r * row..(r + 1) * row;
    match t.as_f32() {
        Ok(v) => Tensor::f32(shape, pick.iter().flat_map(gather).map(|i| v[i]).collect()),
        Err(_) => {
            let v = t.as_i64().unwrap();
            Tensor::i64(shape, pick.iter().flat_map(gather).map(|i| v[i]).collect())
        }
    }
    .unwrap()
}

/// A top-k row for a query at `pos` of a context of `t`: `min(2048, pos + 1)` distinct keys of
/// `0..=pos` in random order, of which, when `holes` and the row has more than 2048 keys, one in
/// 16 is replaced by −1 or by a key past the position (both skipped), −1 padded. A row with at
/// most 2048 keys lists them all, as `dsa.topk` does: the interpreter reads the list there
/// while the kernels apply the `dense_until` rule, and the two agree only on such lists.
fn sparse_list(rng: &mut Rng, pos: usize, t: usize, holes: bool) -> Vec<i64> {
    let mut keys: Vec<i64> = (0..=pos as i64).collect();
    let k = keys.len().min(2048);
    let holes = holes && keys.len() > k;
    for i in 0..k {
        let j = i + (rng.next() % (keys.len() - i) as u64) as usize;
        keys.swap(i, j);
    }
    keys.truncate(k);
    for (i, key) in keys.iter_mut().enumerate() {
        if holes && i % 16 == 5 {
            *key = if i % 32 == 5 || pos + 1 >= t {
                -1
            } else {
                (pos + 1 + (rng.next() as usize) % (t - pos - 1)) as i64
            };
        }
    }
    keys.resize(2048, -1);
    keys
}

/// Fewest key tiles a split of the sparse absorbed attention holds, timed against the shipped
/// (`glmc_codegen::kernels::MLA_SPARSE_TILES_PER_SPLIT`) at a few rows.
const MLA_TILES_PER_SPLIT_VARIANTS: [u64; 3] = [1, 4, 8];
/// The same at batch 64 and 32k context: at least 32 tiles a split (two splits) and 64 (one, no
/// merge), against the shipped splits (the most that fit one wave: one of 64 heads, four of 8
/// on an H200; for 64 heads the variants lower to the shipped kernels, a second timing of it).
const MLA_WAVE_TILES_PER_SPLIT_VARIANTS: [u64; 2] = [32, 64];

/// `mla.attend.absorbed` on the tensor cores at GLM-5's sizes (bf16, 512 + 64 dims, 64 heads and
/// the 8 of a rank at TP=8, top-k 2048 with dense_until 2048) against the interpreter: decode at
/// batch 1 and 64 over contexts 1, 100, 2048, 4096 and 32768 (past 2048 through the top-k lists),
/// batch 8 of 64 heads at 32768, ragged lengths, a top-k list holding every key (dense_until 0)
/// against dense attention, and a 4096-token sparse prefill. Where the interpreter would take
/// minutes (batch 64 × 32768, the prefill) it checks sampled rows, and batch 64 × 32768 is also
/// compared in full with the baseline kernel (the same values in f32, which the baseline takes).
/// Other split lengths at a few rows, the 16-head kernel where 64 heads take the wide one, the
/// key ring filled by bulk copies and the 64-head kernel are timed against the shipped choice and
/// checked the same way. `GLMC_ATTENTION_CASES` (heads×rows×context, comma-separated) runs only
/// the cases it names.
/// Timed by `run_on_gpu`; written to `attention.md` (and `attention.json`, for `bench/render.py`)
/// with the roofline: the bytes (each row's visible keys at 1152 bytes, the prefill's cache once,
/// queries and outputs) at the copy bandwidth measured here, or the FLOPs (2 · heads · (576 + 512)
/// per visible key) at the mma.sync rate; and, where the top-k lists name keys spanning twice the
/// L2, the gather ceiling (`read_us`: a kernel that only reads the listed keys, timed the same
/// way).
#[test]
#[ignore = "gpu"]
fn glm5_absorbed_attention_matches_and_is_timed() {
    struct Case {
        name: &'static str,
        phase: &'static str,
        heads: u64,
        rows: usize,
        context: usize,
        ragged: bool,
        sparse: bool,
        dense_until: u64,
        /// Rows the interpreter checks (None: all).
        sample: Option<Vec<usize>>,
        baseline: bool,
    }
    let case = |name, phase, heads, rows, context| Case {
        name,
        phase,
        heads,
        rows,
        context,
        ragged: false,
        sparse: true,
        dense_until: 2048,
        sample: None,
        baseline: false,
    };
    let mut cases = Vec::new();
    for heads in [64, 8] {
        for rows in [1, 64] {
            for context in [1, 100, 2048, 4096, 32768] {
                let mut c = case("decode", "decode", heads, rows, context);
                if rows == 64 && context == 32768 {
                    c.sample = Some(vec![0, 37, 63]);
                    c.baseline = true;
                }
                cases.push(c);
            }
        }
    }
    // Batch 8 of 64 heads: split counts between batch 1's and 64's.
    cases.push(case("decode", "decode", 64, 8, 32768));
    cases.push(Case {
        ragged: true,
        ..case("decode, ragged", "decode", 64, 64, 4096)
    });
    cases.push(Case {
        ragged: true,
        ..case("decode, ragged", "decode", 8, 33, 4096)
    });
    cases.push(Case {
        dense_until: 0,
        ..case("decode, list of every key", "decode", 64, 5, 1000)
    });
    cases.push(Case {
        sparse: false,
        ..case("decode, dense op", "decode", 64, 2, 32768)
    });
    cases.push(Case {
        sample: Some(vec![0, 1, 2047, 2048, 3001, 4095]),
        ..case("prefill, sparse", "prefill", 64, 4096, 4096)
    });
    cases.push(case("prefill, few rows", "prefill", 64, 3, 4096));
    // A short device call runs only the cases it names, as heads×rows×context (each with its
    // variants; the later cases' random inputs then differ from a full run's).
    if let Some(only) = std::env::var_os("GLMC_ATTENTION_CASES") {
        let only = only.to_string_lossy().into_owned();
        let keys: Vec<&str> = only.split(',').collect();
        cases.retain(|c| keys.contains(&format!("{}x{}x{}", c.heads, c.rows, c.context).as_str()));
        assert!(
            !cases.is_empty(),
            "GLMC_ATTENTION_CASES={only} names no case"
        );
    }

    let dev = Device::open();
    let copy_gbs = measure_copy_bandwidth(&dev);
    let mut reads = ReadCeilings::new(&dev);
    let mut rng = Rng(0xa77e);
    let limits = Limits {
        max_prefill_tokens: 4096,
        max_batch: 64,
        max_context: 32768,
    };
    let mut report = format!(
        "copy roofline measured in this run: {copy_gbs:.0} GB/s; mma.sync ceiling {MMA_SYNC_TFLOPS} TFLOP/s\n\
         | case | heads | rows | context | kernels | checked rows | max err | time (us) | GB/s | TFLOP/s | of roofline |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    let mut failures = Vec::new();
    let mut timed: Vec<serde_json::Value> = Vec::new();
    for c in &cases {
        let module =
            absorbed_attention_module(c.phase, c.heads, c.sparse, c.dense_until, DType::BF16);
        let h = c.heads as usize;
        let prefill = c.phase == "prefill";
        let positions: Vec<usize> = (0..c.rows)
            .map(|i| {
                if prefill {
                    if c.rows == c.context {
                        i
                    } else {
                        c.context - c.rows + i
                    }
                } else if c.ragged {
                    (rng.next() as usize) % c.context
                } else {
                    c.context - 1
                }
            })
            .collect();
        let seqs = if prefill { 1 } else { c.rows };
        let mut ins = vec![
            random_bf16(&mut rng, vec![c.rows, h, 512], 1.0),
            random_bf16(&mut rng, vec![c.rows, h, 64], 1.0),
        ];
        let cache_shape = |d: usize| {
            if prefill {
                vec![c.context, d]
            } else {
                vec![seqs, c.context, d]
            }
        };
        ins.push(random_bf16(&mut rng, cache_shape(512), 1.0));
        ins.push(random_bf16(&mut rng, cache_shape(64), 1.0));
        ins.push(Tensor::i64(vec![c.rows], positions.iter().map(|&p| p as i64).collect()).unwrap());
        let mut visible: Vec<usize> = positions.iter().map(|p| p + 1).collect();
        if c.sparse {
            let mut lists = Vec::with_capacity(c.rows * 2048);
            for (i, &p) in positions.iter().enumerate() {
                let list = sparse_list(&mut rng, p, c.context, c.dense_until > 0);
                if p as u64 + 1 > c.dense_until {
                    visible[i] = list.iter().filter(|&&j| j >= 0 && j as usize <= p).count();
                }
                lists.extend(list);
            }
            ins.push(Tensor::i64(vec![c.rows, 2048], lists).unwrap());
        }
        let sym = if prefill { "s" } else { "b" };
        let b = Bindings::from([(sym.into(), c.rows as u64), ("t".into(), c.context as u64)]);
        let run = run_on_gpu(&dev, &module, limits, &ins, &b, Timing::EachToo);
        let at = &run.phase.results[0].1;
        let gpu = gather(&bytes_of(&run, at), at, &b);
        let per_row = h * 512;
        let checked: Vec<usize> = c.sample.clone().unwrap_or_else(|| (0..c.rows).collect());
        let mut sub: Vec<Tensor> = ins
            .iter()
            .enumerate()
            .map(|(k, t)| {
                if prefill && (k == 2 || k == 3) {
                    t.clone()
                } else {
                    pick_rows(t, &checked)
                }
            })
            .collect();
        // The list of every key must equal dense attention: the interpreter runs the dense op.
        let reference_module = if c.dense_until == 0 {
            sub.pop();
            absorbed_attention_module(c.phase, c.heads, false, 0, DType::BF16)
        } else {
            absorbed_attention_module(c.phase, c.heads, c.sparse, c.dense_until, DType::BF16)
        };
        let want = interpret(&reference_module, &reference_module.functions[0], &sub).unwrap();
        let want: Vec<f64> = want[0]
            .as_f32()
            .unwrap()
            .iter()
            .map(|x| *x as f64)
            .collect();
        let got: Vec<f64> = checked
            .iter()
            .flat_map(|&r| gpu[r * per_row..(r + 1) * per_row].iter().copied())
            .collect();
        let mut err = match compare(&got, &want, DType::BF16) {
            Ok(e) => format!("{e:.1e}"),
            Err(why) => {
                failures.push(format!(
                    "{} {}h {}×{}: {why}",
                    c.name, c.heads, c.rows, c.context
                ));
                "FAIL".into()
            }
        };
        let kernels = launched(&run.phase, &b).join(",");
        let cost = {
            let keys: usize = if prefill {
                c.context
            } else {
                visible.iter().sum()
            };
            let bytes = keys as f64 * 1152.0 + (c.rows * h * (576 + 512) * 2) as f64;
            let flops = visible.iter().sum::<usize>() as f64 * c.heads as f64 * 1088.0 * 2.0;
            (bytes, flops)
        };
        let bound = (cost.0 / (copy_gbs * 1e9)).max(cost.1 / (MMA_SYNC_TFLOPS * 1e12));
        let row_cells = |secs: f64| {
            format!(
                "{:.1} | {:.0} | {:.1} | {:.1}%",
                secs * 1e6,
                cost.0 / secs / 1e9,
                cost.1 / secs / 1e12,
                100.0 * bound / secs
            )
        };
        // The same row for bench/render.py (scripts/gpu_test_result.py adds the header).
        let mut entry = |label: &str,
                         kernels: &str,
                         err: &str,
                         secs: f64,
                         read_us: Option<f64>,
                         alone: &[(String, f64)]| {
            let mut e = serde_json::json!({
                "case": format!("{}{label}", c.name),
                "phase": c.phase,
                "heads": c.heads,
                "rows": c.rows,
                "context": c.context,
                "kernels": kernels,
                "error": err,
                "time_us": secs * 1e6,
                "bytes": cost.0,
                "flops": cost.1,
                "roofline_us": bound * 1e6,
            });
            if let Some(us) = read_us {
                e["read_us"] = us.into();
            }
            if !alone.is_empty() {
                let us: serde_json::Map<_, _> = alone
                    .iter()
                    .map(|(k, s)| (k.clone(), (s * 1e6).into()))
                    .collect();
                e["alone_us"] = us.into();
            }
            timed.push(e)
        };
        // A case of several kernels (a split and its merge): each kernel alone, a line of its own.
        let alone_line = |label: &str, alone: &[(String, f64)]| {
            (!alone.is_empty()).then(|| {
                let each: Vec<String> = alone
                    .iter()
                    .map(|(k, s)| format!("{k} {:.1} us", s * 1e6))
                    .collect();
                format!(
                    "| {}{label} (each kernel alone) | {} | {} | {} | {} | | | | | | |",
                    c.name,
                    c.heads,
                    c.rows,
                    c.context,
                    each.join(", ")
                )
            })
        };
        let secs = run.seconds_per_run.unwrap();
        let alone = run.seconds_per_launch.clone();
        drop(run);
        let listed = c.sparse && c.context > c.dense_until as usize && !prefill;
        // The gather ceiling of a batch's top-k keys (`ceiling::gather_ceiling`): a kernel that
        // only reads the keys the lists name (1152 bytes each), timed the same way. Only for a
        // case with lists (ins[5]: a dense one has none) whose listed keys span twice the L2:
        // the probe reads the same keys launch after launch, so fewer would come from L2, not
        // DRAM, where the kernel's rotated copies do not.
        let gathered = (listed && !c.ragged).then(|| {
            let named = ins[5].as_i64().unwrap().iter().filter(|&&j| j >= 0).count() as u64;
            named * Gather::ENTRY_BYTES
        });
        let from_dram = gathered.filter(|&g| g >= ceiling::ROTATION_BYTES as u64);
        let read = from_dram.map(|gathered| {
            let upload = |t: &Tensor, dtype| dev.gpu.upload(&t.to_bytes(dtype).unwrap()).unwrap();
            let (k1, k2, topk) = (
                upload(&ins[2], DType::BF16),
                upload(&ins[3], DType::BF16),
                upload(&ins[5], DType::I64),
            );
            let context = c.context as u64;
            let gather = Gather {
                rows: c.rows as u64,
                keys: 2048,
                topk: dev.gpu.address(&topk),
                topk_row: 2048,
                k1: dev.gpu.address(&k1),
                k1_seq_bytes: context * 1024,
                k1_key_bytes: 1024,
                k2: dev.gpu.address(&k2),
                k2_seq_bytes: context * 128,
                k2_key_bytes: 128,
            };
            (reads.gather(&dev, &gather), gathered)
        });
        if let Some((ceiling, bytes)) = &read {
            let line = format!(
                "| {} (gather ceiling: {}) | {} | {} | {} | | | | {:.1} | {:.0} | | |",
                c.name,
                ceiling.config,
                c.heads,
                c.rows,
                c.context,
                ceiling.secs * 1e6,
                *bytes as f64 / ceiling.secs / 1e9
            );
            println!("{line}");
            writeln!(report, "{line}").unwrap();
        }
        let read_us = read.map(|(ceiling, _)| ceiling.secs * 1e6);
        let mut baseline_line = None;
        if c.baseline {
            let m32 =
                absorbed_attention_module(c.phase, c.heads, c.sparse, c.dense_until, DType::F32);
            let base = run_on_gpu(&dev, &m32, limits, &ins, &b, true);
            let at = &base.phase.results[0].1;
            let reference = gather(&bytes_of(&base, at), at, &b);
            match compare(&gpu, &reference, DType::BF16) {
                Ok(e) => err = format!("{err}; all rows vs baseline {e:.1e}"),
                Err(why) => {
                    failures.push(format!(
                        "{} {}h {}×{} vs the baseline: {why}",
                        c.name, c.heads, c.rows, c.context
                    ));
                    err = format!("{err}; baseline FAIL");
                }
            }
            baseline_line = Some(format!(
                "| {} (baseline, f32) | {} | {} | {} | {} | - | - | {} |",
                c.name,
                c.heads,
                c.rows,
                c.context,
                launched(&base.phase, &b).join(","),
                row_cells(base.seconds_per_run.unwrap())
            ));
        }
        entry("", &kernels, &err, secs, read_us, &alone);
        let line = format!(
            "| {} | {} | {} | {} | {kernels} | {} | {err} | {} |",
            c.name,
            c.heads,
            c.rows,
            c.context,
            checked.len(),
            row_cells(secs)
        );
        for l in std::iter::once(line).chain(alone_line("", &alone)) {
            println!("{l}");
            writeln!(report, "{l}").unwrap();
        }
        if let Some(l) = baseline_line {
            println!("{l}");
            writeln!(report, "{l}").unwrap();
        }
        // A row sees at most its top-k list, so at a few rows the splits that fill the GPU hold
        // a key tile or two each and the merge reads all of them: other split lengths are timed
        // against the shipped one, each checked against the interpreter, and at batch 64 fewer
        // splits; so is the narrow kernel (16 heads a block) where the heads take the wide one
        // on many rows, the key ring filled by bulk copies everywhere, and the 64-head kernel
        // wherever the wide one runs 64 heads.
        let tiles_per_split: &[u64] = match c.rows {
            ..=8 if listed => &MLA_TILES_PER_SPLIT_VARIANTS,
            64.. if listed && c.context == 32768 => &MLA_WAVE_TILES_PER_SPLIT_VARIANTS,
            _ => &[],
        };
        let mut variants: Vec<(String, Variant)> = tiles_per_split
            .iter()
            .map(|t| {
                (
                    format!("≥ {t} tiles a split"),
                    Variant::MlaTilesPerSplit(*t),
                )
            })
            .collect();
        if kernels.contains("mla_absorbed_wide") && c.rows >= 64 && c.context >= 2048 {
            variants.push(("16 heads a block".into(), Variant::Mla(MlaKernel::Narrow)));
        }
        variants.push((
            "keys by bulk copy".into(),
            Variant::Mla(MlaKernel::BulkCopy),
        ));
        if kernels.contains("mla_absorbed_wide") && c.heads % 64 == 0 {
            variants.push(("64 heads a block".into(), Variant::Mla(MlaKernel::Wide64)));
        }
        for (label, variant) in &variants {
            let lower = |m: &Module, t, l| lower_module_with(m, t, l, *variant).unwrap();
            let run = run_on_gpu_with(&dev, &module, limits, &ins, &b, Timing::EachToo, &lower);
            let at = &run.phase.results[0].1;
            let out = gather(&bytes_of(&run, at), at, &b);
            let got: Vec<f64> = checked
                .iter()
                .flat_map(|&r| out[r * per_row..(r + 1) * per_row].iter().copied())
                .collect();
            let err = match compare(&got, &want, DType::BF16) {
                Ok(e) => format!("{e:.1e}"),
                Err(why) => {
                    failures.push(format!(
                        "{} {}h {}×{}, {label}: {why}",
                        c.name, c.heads, c.rows, c.context
                    ));
                    "FAIL".into()
                }
            };
            let kernels = launched(&run.phase, &b).join(",");
            let secs = run.seconds_per_run.unwrap();
            let label = format!(" ({label})");
            entry(
                &label,
                &kernels,
                &err,
                secs,
                read_us,
                &run.seconds_per_launch,
            );
            let line = format!(
                "| {}{label} | {} | {} | {} | {kernels} | {} | {err} | {} |",
                c.name,
                c.heads,
                c.rows,
                c.context,
                checked.len(),
                row_cells(secs)
            );
            for l in std::iter::once(line).chain(alone_line(&label, &run.seconds_per_launch)) {
                println!("{l}");
                writeln!(report, "{l}").unwrap();
            }
        }
    }
    print!("{report}");
    std::fs::write(out_dir().join("attention.md"), &report).unwrap();
    let doc =
        serde_json::json!({"copy_gbs": copy_gbs, "mma_tflops": MMA_SYNC_TFLOPS, "cases": timed});
    std::fs::write(
        out_dir().join("attention.json"),
        serde_json::to_string_pretty(&doc).unwrap(),
    )
    .unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A timed run with its own byte and FLOP counts (causal work, which the cost model does not
/// halve), against the same roofline as [`timed`].
fn timed_as(secs: f64, moved: f64, flops: f64, copy_gbs: f64) -> Timed {
    Timed {
        secs,
        moved,
        flops,
        bound: (moved / (copy_gbs * 1e9)).max(flops / (MMA_SYNC_TFLOPS * 1e12)),
    }
}

/// Attention outputs `[rows, heads, dv]` within tolerance: one bf16 ulp of the value for the
/// output rounding on each side, plus 2^-7 of the largest value of its row and head for the
/// probabilities the flash kernel rounds to bf16 before P·V (their errors average over the keys,
/// as the output does). Returns the worst error relative to that largest value.
fn attention_close(gpu: &[f64], reference: &[f64], dv: usize) -> Result<f64, String> {
    assert_eq!(gpu.len(), reference.len());
    let mut worst = 0f64;
    for (c, (g, r)) in gpu.chunks(dv).zip(reference.chunks(dv)).enumerate() {
        let m = r.iter().fold(1e-30f64, |m, x| m.max(x.abs()));
        for (d, (a, b)) in g.iter().zip(r).enumerate() {
            let err = (a - b).abs();
            if err.is_nan() || err > 2f64.powi(-8) * b.abs() + 2f64.powi(-7) * m {
                return Err(format!(
                    "row × head {c}, dim {d}: gpu {a} vs reference {b} (largest {m})"
                ));
            }
            worst = worst.max(err / m);
        }
    }
    Ok(worst)
}

/// Dense expanded `mla.attend` at GLM-5's sizes (64 heads, 192 + 64 query dims, 256 value dims,
/// scale 1/16, bf16) as a dense prefill lowers it: a 4096-token prefill, chunked prefills of 512
/// tokens after 3584 and after 15872 cached, and small odd sizes (one token; rows and caches that
/// are no multiple of the 64-row tiles). The flash kernel is checked against the baseline kernel
/// on the GPU on every row (the baseline runs when the inputs are f32: the same values, in a
/// dtype the flash kernel does not take) and against the interpreter on sampled rows (it is f64
/// and slow). Timed by `run_on_gpu` with the causal FLOPs; written to `prefill_attention.md`.
#[test]
#[ignore = "gpu"]
fn glm5_prefill_attention_matches_and_is_timed() {
    use glmc_ir::Dim;
    const HEADS: usize = 64;
    const D1: usize = 192;
    const D2: usize = 64;
    const DV: usize = 256;
    let dev = Device::open();
    let copy_gbs = measure_copy_bandwidth(&dev);
    let mut rng = Rng(0xf1a5);
    let limits = Limits {
        max_prefill_tokens: 4096,
        max_batch: 1,
        max_context: 16384,
    };
    let attend = |dtype: DType| {
        let (s, t) = (Dim::Sym("s".into()), Dim::Sym("t".into()));
        let c = |n: usize| Dim::Const(n as u64);
        let ty = |dtype, shape: Vec<Dim>| TensorType::new(dtype, shape);
        let mut f = Function::new("prefill");
        let q1 = f.push_input(0, "q_nope", ty(dtype, vec![s.clone(), c(HEADS), c(D1)]));
        let q2 = f.push_input(1, "q_pe", ty(dtype, vec![s.clone(), c(HEADS), c(D2)]));
        let k1 = f.push_input(2, "k_nope", ty(dtype, vec![t.clone(), c(HEADS), c(D1)]));
        let k2 = f.push_input(3, "k_pe", ty(dtype, vec![t.clone(), c(D2)]));
        let v = f.push_input(4, "v", ty(dtype, vec![t.clone(), c(HEADS), c(DV)]));
        let p = f.push_input(5, "positions", ty(DType::I64, vec![s.clone()]));
        let op = Op::MlaAttend {
            dense_until: 0,
            scale: 1.0 / 16.0,
            sparse: false,
        };
        let node = f.push(op, "attn", &[q1, q2, k1, k2, v, p]).unwrap();
        f.results.push(("out".into(), node.into()));
        let mut m = Module::new("attention");
        m.functions.push(f.clone());
        (m, f)
    };
    let (flash_module, flash_fn) = attend(DType::BF16);
    let (baseline_module, _) = attend(DType::F32);
    let mut report = format!(
        "copy roofline measured in this run: {copy_gbs:.0} GB/s; mma.sync ceiling {MMA_SYNC_TFLOPS} TFLOP/s; FLOPs are the causal ones, 2 · 64 heads · (256 + 256) per visible key\n\
         | case | rows | cache | kernel | err vs baseline | err vs interpreter (rows) | time (us) | GB/s | TFLOP/s | of roofline | baseline (us) | speedup |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    let mut failures = Vec::new();
    // Logits of standard deviation about 2.7 (q in ±4, k in ±2 over 256 dims, scale 1/16): a
    // softmax neither flat nor one-hot.
    let big_cache = [
        random_bf16(&mut rng, vec![4096, HEADS, D1], 2.0),
        random_bf16(&mut rng, vec![4096, D2], 2.0),
        random_bf16(&mut rng, vec![4096, HEADS, DV], 1.0),
    ];
    let big_q = [
        random_bf16(&mut rng, vec![4096, HEADS, D1], 4.0),
        random_bf16(&mut rng, vec![4096, HEADS, D2], 4.0),
    ];
    for (case, rows, cache, start) in [
        ("prefill", 4096usize, 4096usize, 0usize),
        ("chunked prefill after 3584", 512, 4096, 3584),
        ("one token", 1, 1, 0),
        ("odd, after a cache", 7, 19, 12),
        ("odd prefill", 67, 67, 0),
        ("odd chunk", 100, 300, 200),
        ("chunked prefill after 15872", 512, 16384, 15872),
    ] {
        let (k_all, q_all): (Vec<Tensor>, Vec<Tensor>) = if cache == 4096 {
            let q_rows: Vec<usize> = (start..start + rows).collect();
            (
                big_cache.to_vec(),
                big_q.iter().map(|q| pick_rows(q, &q_rows)).collect(),
            )
        } else {
            (
                vec![
                    random_bf16(&mut rng, vec![cache, HEADS, D1], 2.0),
                    random_bf16(&mut rng, vec![cache, D2], 2.0),
                    random_bf16(&mut rng, vec![cache, HEADS, DV], 1.0),
                ],
                vec![
                    random_bf16(&mut rng, vec![rows, HEADS, D1], 4.0),
                    random_bf16(&mut rng, vec![rows, HEADS, D2], 4.0),
                ],
            )
        };
        let positions =
            Tensor::i64(vec![rows], (start as i64..(start + rows) as i64).collect()).unwrap();
        let ins = vec![
            q_all[0].clone(),
            q_all[1].clone(),
            k_all[0].clone(),
            k_all[1].clone(),
            k_all[2].clone(),
            positions.clone(),
        ];
        let b = Bindings::from([("s".into(), rows as u64), ("t".into(), cache as u64)]);
        let flash = run_on_gpu(&dev, &flash_module, limits, &ins, &b, true);
        let kernel = launched(&flash.phase, &b).join(",");
        let at = &flash.phase.results[0].1;
        let got = gather(&bytes_of(&flash, at), at, &b);
        drop(flash.arena);
        let base = run_on_gpu(&dev, &baseline_module, limits, &ins, &b, true);
        let base_kernel = launched(&base.phase, &b).join(",");
        assert!(
            base_kernel.starts_with("glmc_attention_") && !base_kernel.contains("flash"),
            "{base_kernel}"
        );
        let at = &base.phase.results[0].1;
        let want = gather(&bytes_of(&base, at), at, &b);
        let vs_base = match attention_close(&got, &want, DV) {
            Ok(e) => format!("{e:.1e}"),
            Err(why) => {
                failures.push(format!("{case}: flash vs baseline: {why}"));
                "FAIL".into()
            }
        };
        // The first, last and a spread of rows in between.
        let mut sample: Vec<usize> = (0..8).map(|i| i * rows / 8).chain([rows - 1]).collect();
        sample.dedup();
        let sampled: Vec<Tensor> = ins
            .iter()
            .enumerate()
            .map(|(i, t)| {
                if [0, 1, 5].contains(&i) {
                    pick_rows(t, &sample)
                } else {
                    t.clone()
                }
            })
            .collect();
        let reference = interpret(&flash_module, &flash_fn, &sampled).unwrap();
        let reference: Vec<f64> = reference[0]
            .as_f32()
            .unwrap()
            .iter()
            .map(|x| *x as f64)
            .collect();
        let got_sampled: Vec<f64> = sample
            .iter()
            .flat_map(|&r| got[r * HEADS * DV..(r + 1) * HEADS * DV].iter().copied())
            .collect();
        let vs_interp = match attention_close(&got_sampled, &reference, DV) {
            Ok(e) => format!("{e:.1e} ({})", sample.len()),
            Err(why) => {
                failures.push(format!("{case}: flash vs interpreter: {why}"));
                "FAIL".into()
            }
        };
        let visible: f64 = (start..start + rows).map(|p| (p + 1) as f64).sum();
        let flops = 2.0 * HEADS as f64 * (D1 + D2 + DV) as f64 * visible;
        let moved = 2.0 * (rows * HEADS * (D1 + D2 + DV) + cache * (HEADS * (D1 + DV) + D2)) as f64;
        let t = timed_as(flash.seconds_per_run.unwrap(), moved, flops, copy_gbs);
        let base_secs = base.seconds_per_run.unwrap();
        let line = format!(
            "| {case} | {rows} | {cache} | {kernel} | {vs_base} | {vs_interp} | {} | {:.1} | {:.1}× |",
            t.cells(),
            base_secs * 1e6,
            base_secs / t.secs
        );
        println!("{line}");
        writeln!(report, "{line}").unwrap();
    }
    print!("{report}");
    std::fs::write(out_dir().join("prefill_attention.md"), &report).unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The DSA indexer at GLM-5's sizes (32 heads × 128 dims, top-2048, bf16 queries and keys, bf16
/// head weights): decode of one sequence at contexts of 1, 2048, 8192 and 32768, of 8 at 2048,
/// 8192 and 32768, of 64 at 8192 (each sequence's own cache, its last position) and of 64 at
/// random positions of a 4096 context (ragged), and a 4096-row prefill over one cache.
/// `dsa.score` is checked against the interpreter (f32 within 1e-5 of the largest score; the
/// prefill on sampled rows) and on every row against codegen II's SIMT kernel (which f32 inputs
/// of the same values take), `dsa.topk` exactly against the interpreter's top-k of the same GPU
/// scores, and as a set against the interpreter's top-k of its own scores in the rows where the
/// k-th and (k+1)-th best differ by more than that tolerance. Where a case runs the decode kernel
/// (`dsa_score_decode.cu`), its other key rings (`SCORE_RING_VARIANTS`) are checked against the
/// interpreter and timed beside it. Timed by `run_on_gpu`; written to `indexer.md`.
#[test]
#[ignore = "gpu"]
fn glm5_indexer_matches_and_is_timed() {
    use glmc_ir::Dim;
    const HEADS: usize = 32;
    const DIM: usize = 128;
    const TOP_K: usize = 2048;
    let dev = Device::open();
    let copy_gbs = measure_copy_bandwidth(&dev);
    let mut rng = Rng(0x1d5a);
    let mut report = format!(
        "copy roofline measured in this run: {copy_gbs:.0} GB/s; mma.sync ceiling {MMA_SYNC_TFLOPS} TFLOP/s; score FLOPs are the causal ones\n\
         | case | op | kernel | check | time (us) | GB/s | TFLOP/s | of roofline |\n|---|---|---|---|---|---|---|---|\n"
    );
    let mut failures = Vec::new();
    // Every timed case for bench/render.py (scripts/gpu_test_result.py adds the header).
    let mut cases: Vec<serde_json::Value> = Vec::new();
    let mut entry = |case: &str,
                     rows,
                     context,
                     op: &str,
                     variant: Option<String>,
                     kernels: &str,
                     check: &str,
                     t: &Timed| {
        let mut e = serde_json::json!({
            "case": case,
            "rows": rows,
            "context": context,
            "op": op,
            "variant": variant,
            "kernels": kernels,
            "check": check,
        });
        e.as_object_mut()
            .unwrap()
            .extend(t.json().as_object().unwrap().clone());
        cases.push(e);
    };
    for (case, phase, rows, context) in [
        ("decode", "decode", 1usize, 1usize),
        ("decode", "decode", 1, 2048),
        ("decode", "decode", 1, 8192),
        ("decode", "decode", 1, 32768),
        ("decode", "decode", 8, 2048),
        ("decode", "decode", 8, 8192),
        ("decode", "decode", 8, 32768),
        ("decode", "decode", 64, 8192),
        ("decode, ragged", "decode", 64, 4096),
        ("prefill", "prefill", 4096, 4096),
    ] {
        let decode = phase == "decode";
        let sym = if decode { "b" } else { "s" };
        let (row, t) = (Dim::Sym(sym.into()), Dim::Sym("t".into()));
        let c = |n: usize| Dim::Const(n as u64);
        let ty = |dtype, shape: Vec<Dim>| TensorType::new(dtype, shape);
        let k_shape = if decode {
            vec![row.clone(), t.clone(), c(DIM)]
        } else {
            vec![t.clone(), c(DIM)]
        };
        // bf16 takes the tensor cores; f32 inputs of the same values the SIMT baseline.
        let score = |dtype: DType| {
            let mut f = Function::new(phase);
            let q = f.push_input(0, "q", ty(dtype, vec![row.clone(), c(HEADS), c(DIM)]));
            let w = f.push_input(1, "w", ty(dtype, vec![row.clone(), c(HEADS)]));
            let k = f.push_input(2, "k", ty(dtype, k_shape.clone()));
            let p = f.push_input(3, "positions", ty(DType::I64, vec![row.clone()]));
            // GLM-5's head-weight scale, as fuse-elementwise folds it: (32 × 128)^-0.5 = 2^-6,
            // exact in bf16, so the interpreter's unrounded product is the kernels' too.
            let op = Op::DsaScore {
                weight_scale: ((HEADS * DIM) as f64).powf(-0.5),
            };
            let node = f.push(op, "scores", &[q, w, k, p]).unwrap();
            f.results.push(("scores".into(), node.into()));
            let mut m = Module::new("indexer");
            m.functions.push(f.clone());
            (m, f)
        };
        let (score_module, score_fn) = score(DType::BF16);
        let (baseline_module, _) = score(DType::F32);
        let (topk_module, topk_fn) = topk_module(phase, sym, TOP_K);

        let positions: Vec<i64> = if case.contains("ragged") {
            (0..rows)
                .map(|_| (rng.next() % context as u64) as i64)
                .collect()
        } else if decode {
            vec![context as i64 - 1; rows]
        } else {
            (0..rows as i64).collect()
        };
        let k_rows = if decode { rows * context } else { context };
        let ins = vec![
            random_bf16(&mut rng, vec![rows, HEADS, DIM], 1.0),
            random_bf16(&mut rng, vec![rows, HEADS], 0.1),
            if decode {
                random_bf16(&mut rng, vec![rows, context, DIM], 1.0)
            } else {
                random_bf16(&mut rng, vec![k_rows, DIM], 1.0)
            },
            Tensor::i64(vec![rows], positions.clone()).unwrap(),
        ];
        let b = Bindings::from([(sym.into(), rows as u64), ("t".into(), context as u64)]);
        let limits = Limits {
            max_prefill_tokens: 4096,
            max_batch: 64,
            max_context: context as u64,
        };
        let run = run_on_gpu(&dev, &score_module, limits, &ins, &b, true);
        let kernel = launched(&run.phase, &b).join(",");
        let scores_of = |run: &Run| {
            let at = &run.phase.results[0].1;
            gather(&bytes_of(run, at), at, &b)
        };
        let scores = scores_of(&run);
        let sample: Vec<usize> = if decode {
            (0..rows).collect()
        } else {
            (0..16).map(|i| i * rows / 16).chain([rows - 1]).collect()
        };
        let sampled: Vec<Tensor> = ins
            .iter()
            .enumerate()
            .map(|(i, t)| {
                if i == 2 && !decode {
                    t.clone()
                } else {
                    pick_rows(t, &sample)
                }
            })
            .collect();
        let want = interpret(&score_module, &score_fn, &sampled).unwrap();
        let want: Vec<f64> = want[0]
            .as_f32()
            .unwrap()
            .iter()
            .map(|x| *x as f64)
            .collect();
        let check_scores = |scores: &[f64], what: &str, failures: &mut Vec<String>| {
            let got: Vec<f64> = sample
                .iter()
                .flat_map(|&r| scores[r * context..(r + 1) * context].iter().copied())
                .collect();
            match compare(&got, &want, DType::F32) {
                Ok(e) => format!("{e:.1e} ({} rows)", sample.len()),
                Err(why) => {
                    failures.push(format!("{case} {rows}×{context} {what}: {why}"));
                    "FAIL".into()
                }
            }
        };
        let mut check = check_scores(&scores, "dsa.score", &mut failures);
        let base = run_on_gpu(&dev, &baseline_module, limits, &ins, &b, false);
        let base_kernel = launched(&base.phase, &b).join(",");
        assert!(base_kernel.starts_with("glmc_dsa_score_") && !base_kernel.contains("mma"));
        let base_scores = scores_of(&base);
        drop(base);
        match compare(&scores, &base_scores, DType::F32) {
            Ok(e) => write!(check, "; all rows vs baseline {e:.1e}").unwrap(),
            Err(why) => {
                failures.push(format!(
                    "{case} {rows}×{context} dsa.score vs baseline: {why}"
                ));
                check.push_str("; vs baseline FAIL");
            }
        }
        let visible: f64 = positions.iter().map(|p| (p + 1) as f64).sum();
        let moved =
            2.0 * (rows * HEADS * (DIM + 1) + k_rows * DIM) as f64 + 4.0 * (rows * context) as f64;
        let mut record = |run: &Run, ring: Option<ScoreRing>, check: &str, report: &mut String| {
            let t = timed_as(
                run.seconds_per_run.unwrap(),
                moved,
                2.0 * (HEADS * DIM) as f64 * visible,
                copy_gbs,
            );
            let what = match ring {
                Some(r) => format!("dsa.score, {r}"),
                None => "dsa.score".into(),
            };
            let kernels = launched(&run.phase, &b).join(",");
            let line = format!(
                "| {case} {rows} × {context} | {what} | {kernels} | {check} | {} |",
                t.cells()
            );
            println!("{line}");
            writeln!(report, "{line}").unwrap();
            entry(
                case,
                rows,
                context,
                "dsa.score",
                ring.map(|r| r.to_string()),
                &kernels,
                check,
                &t,
            );
        };
        record(&run, None, &check, &mut report);
        drop(run);
        // The decode kernel's other key rings, checked and timed like the shipped one.
        if kernel.contains("dsa_score_decode") {
            for ring in SCORE_RING_VARIANTS {
                let lower = |m: &Module, t: Target, l: Limits| {
                    lower_module_with(m, t, l, Variant::ScoreRing(ring)).unwrap()
                };
                let run = run_on_gpu_with(&dev, &score_module, limits, &ins, &b, true, &lower);
                let check = check_scores(
                    &scores_of(&run),
                    &format!("dsa.score, {ring}"),
                    &mut failures,
                );
                record(&run, Some(ring), &check, &mut report);
            }
        }

        // The top-k of the GPU's scores: exactly the interpreter's top-k of the same scores.
        let gpu_scores = Tensor::f32(
            vec![rows, context],
            scores.iter().map(|x| *x as f32).collect(),
        )
        .unwrap();
        let topk_ins = vec![gpu_scores, ins[3].clone()];
        let (run, picked, differs) =
            topk_on_gpu(&dev, &topk_module, &topk_fn, limits, &topk_ins, &b, TOP_K);
        let kernel = launched(&run.phase, &b).join(",");
        let mut check = if let Some(row) = differs {
            failures.push(format!(
                "{case} {rows}×{context} dsa.topk: row {row} differs from the interpreter's on the same scores"
            ));
            "FAIL".to_string()
        } else {
            "equal to the interpreter's".to_string()
        };
        // Against the interpreter's own scores, as sets, where the cut is clear.
        let scale = want
            .iter()
            .filter(|x| x.is_finite())
            .fold(0f64, |m, x| m.max(x.abs()));
        let (mut clear, mut differ) = (0, 0);
        for (i, &r) in sample.iter().enumerate() {
            let valid = positions[r] as usize + 1;
            if valid <= TOP_K {
                continue;
            }
            let mut row: Vec<(f64, usize)> = want[i * context..i * context + valid]
                .iter()
                .copied()
                .zip(0..)
                .collect();
            row.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            if row[TOP_K - 1].0 - row[TOP_K].0 <= 1e-5 * scale {
                continue;
            }
            clear += 1;
            let mut want_set: Vec<i64> = row[..TOP_K].iter().map(|(_, j)| *j as i64).collect();
            let mut got_set = picked[r * TOP_K..(r + 1) * TOP_K].to_vec();
            want_set.sort_unstable();
            got_set.sort_unstable();
            if want_set != got_set {
                differ += 1;
            }
        }
        if differ > 0 {
            failures.push(format!(
                "{case} {rows}×{context} dsa.topk: {differ} of {clear} rows with a clear cut select other keys than the interpreter's scores"
            ));
        }
        write!(
            check,
            "; sets equal in {}/{clear} clear rows",
            clear - differ
        )
        .unwrap();
        let moved = 4.0 * visible + 8.0 * (rows * TOP_K) as f64;
        let t_topk = timed_as(run.seconds_per_run.unwrap(), moved, 0.0, copy_gbs);
        let line = format!(
            "| {case} {rows} × {context} | dsa.topk | {kernel} | {check} | {} |",
            t_topk.cells()
        );
        println!("{line}");
        writeln!(report, "{line}").unwrap();
        entry(
            case, rows, context, "dsa.topk", None, &kernel, &check, &t_topk,
        );
    }
    print!("{report}");
    std::fs::write(out_dir().join("indexer.md"), &report).unwrap();
    let doc =
        serde_json::json!({"copy_gbs": copy_gbs, "mma_tflops": MMA_SYNC_TFLOPS, "cases": cases});
    std::fs::write(
        out_dir().join("indexer.json"),
        serde_json::to_string_pretty(&doc).unwrap(),
    )
    .unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A module of one `dsa.topk` node in function `phase`: scores `f32 [rows, t]` and positions
/// `i64 [rows]` in, the `k` best keys of each row out.
fn topk_module(phase: &str, rows: &str, k: usize) -> (Module, Function) {
    use glmc_ir::Dim;
    let (r, t) = (Dim::Sym(rows.into()), Dim::Sym("t".into()));
    let mut f = Function::new(phase);
    let s_in = f.push_input(0, "scores", TensorType::new(DType::F32, vec![r.clone(), t]));
    let p = f.push_input(1, "positions", TensorType::new(DType::I64, vec![r]));
    let node = f
        .push(Op::DsaTopk { k: k as u64 }, "topk", &[s_in, p])
        .unwrap();
    f.results.push(("topk".into(), node.into()));
    let mut m = Module::new("topk");
    m.functions.push(f.clone());
    (m, f)
}

/// `dsa.topk` of `f` (in `m`) on the GPU, timed, and in the interpreter on the same inputs: the
/// run, the GPU's lists of `k` keys, and the first row whose lists differ.
fn topk_on_gpu(
    dev: &Device,
    m: &Module,
    f: &Function,
    limits: Limits,
    ins: &[Tensor],
    b: &Bindings,
    k: usize,
) -> (Run, Vec<i64>, Option<usize>) {
    let run = run_on_gpu(dev, m, limits, ins, b, true);
    let at = &run.phase.results[0].1;
    let picked: Vec<i64> = gather(&bytes_of(&run, at), at, b)
        .iter()
        .map(|x| *x as i64)
        .collect();
    let exact = interpret(m, f, ins).unwrap();
    let exact = exact[0].as_i64().unwrap();
    let differs =
        (0..picked.len() / k).find(|&r| picked[r * k..(r + 1) * k] != exact[r * k..(r + 1) * k]);
    (run, picked, differs)
}

/// `dsa.topk` where the cut falls inside long runs of equal scores, exactly against the
/// interpreter (the lower keys of a run make the cut): every score equal over 40000 keys (a zero
/// range: the kernels' fallback bins, and keys beyond the 31744 the one-block kernel holds on
/// chip), three levels over 20000 keys (a cut bin too full to rank, of one value), signed zeros
/// below 1000 positive scores over 5000 keys (−0.0 and +0.0 are one value), 65536 scores within
/// 2^-10 of 1, uniform scores with one outlier of 10^30 over 40000 keys (every other key in one
/// linear bin: radix passes, on chip and beyond it, and across the split path's blocks), and
/// 131072 uniform scores (the split path's 16 keys a thread). Each case runs in 3 rows, the split
/// path (the whole context, about half of it, and 1000 keys: at most k, listed whole), and in 9,
/// the one-block kernel (the same three rows, repeated).
#[test]
#[ignore = "gpu"]
fn dsa_topk_cuts_runs_of_equal_scores_like_the_interpreter() {
    const TOP_K: usize = 2048;
    const SPLIT_ROWS: usize = 3;
    const WHOLE_ROWS: usize = 9;
    let dev = Device::open();
    let mut rng = Rng(0x7135);
    let (m, f) = topk_module("decode", "b", TOP_K);
    let mut failures = Vec::new();
    for (case, context) in [
        ("every score equal", 40000usize),
        ("three levels", 20000),
        ("signed zeros", 5000),
        ("within 2^-10 of 1", 65536),
        ("one outlier", 40000),
        ("uniform", 131072),
    ] {
        let score = |j: usize, rng: &mut Rng| -> f32 {
            match case {
                "every score equal" => 0.25,
                "three levels" => [1.0, 0.5, -0.5][(rng.next() % 3) as usize],
                "signed zeros" if j.is_multiple_of(5) => rng.uniform() + 1e-3,
                "signed zeros" => [0.0, -0.0, -1.0][(rng.next() % 3) as usize],
                "within 2^-10 of 1" => 1.0 + rng.uniform() / 1024.0,
                "one outlier" if j == 777 => 1e30,
                _ => rng.uniform(),
            }
        };
        let limits = Limits {
            max_prefill_tokens: 1,
            max_batch: WHOLE_ROWS as u64,
            max_context: context as u64,
        };
        for rows in [SPLIT_ROWS, WHOLE_ROWS] {
            let scores: Vec<f32> = (0..rows * context)
                .map(|i| score(i % context, &mut rng))
                .collect();
            let positions: Vec<i64> = (0..rows)
                .map(|r| [context as i64 - 1, context as i64 / 2 + 7, 999][r % 3])
                .collect();
            let ins = vec![
                Tensor::f32(vec![rows, context], scores).unwrap(),
                Tensor::i64(vec![rows], positions).unwrap(),
            ];
            let bindings =
                Bindings::from([("b".into(), rows as u64), ("t".into(), context as u64)]);
            let (run, _, differs) = topk_on_gpu(&dev, &m, &f, limits, &ins, &bindings, TOP_K);
            let kernel = launched(&run.phase, &bindings).join(",");
            let verdict = match differs {
                None => "equal to the interpreter's".to_string(),
                Some(r) => {
                    failures.push(format!(
                        "{case}, {rows} rows: row {r} differs from the interpreter's"
                    ));
                    format!("row {r} FAILS")
                }
            };
            println!(
                "dsa.topk, {case}, {rows} rows of {context} ({kernel}): {verdict}, {:.1} us",
                run.seconds_per_run.unwrap() * 1e6
            );
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
