//! What each op becomes: a template, its compile-time parameters, the launch shape and the
//! arguments. One function per kernel family; the kernel bodies are in `templates/*.cu`.
//!
//! Every row-wise kernel addresses its tensors as rows of contiguous elements a stride apart
//! ([`TensorRef::rows`]); the lowering only hands it tensors that have that form, so a slice of
//! a fused projection's output is read in place.

use std::collections::BTreeMap;

use glmc_ir::{DType, Node, Op, RopeSpan};

use crate::expr::{Bindings, GridDim, Guard, Poly};
use crate::layout::{Rows, TensorRef};
use crate::schedule::{Arg, ArgValue, Kernel};
use crate::target::Target;

mod prefill;
pub use prefill::{ScoreRing, SCORE_DECODE_RING, SCORE_RING_VARIANTS};

/// Threads per block of the one-thread-per-element kernels: enough warps to hide latency, small
/// enough that a tail block wastes little.
const ELEMENTWISE_THREADS: u32 = 256;
/// Threads per block of the row-per-block kernels (norms) before they widen for long rows.
const ROW_THREADS: u32 = 256;
/// Register-resident values per thread in a norm beyond which it takes more threads instead.
const MAX_NORM_ITEMS: u64 = 8;
/// Threads of `sample.argmax`: one block per row of the vocabulary.
const SAMPLE_THREADS: u32 = 1024;
/// Threads of each block of `sample.top_p`'s stages, and the tokens each thread holds: a block
/// takes a 2048-token slice of its row, so GLM-5's vocabulary spreads over 76 SMs.
const TOP_P_THREADS: u32 = 256;
const TOP_P_PER_THREAD: u64 = 8;
/// Bins of `sample.top_p`'s histogram (256 per binade of 1 + d, d in nats below the maximum,
/// up to d = 255; `sample.cu`), fewer for a short row.
const TOP_P_BINS: u64 = 2048;
/// Candidates a refining stage of `sample.top_p` sorts in shared memory (32 KiB; a power of two,
/// as the bitonic sort needs); a bin with more is refined by passes over the row.
const TOP_P_CAP: u64 = 2048;
/// Threads of the baseline attention kernel (one block per query row and head).
const ATTENTION_THREADS: u32 = 128;
/// Keys per block of `dsa.score`.
const SCORE_TILE: u64 = 128;
/// What a kernel may allocate statically; more is dynamic shared memory, passed at launch.
const STATIC_SHARED_LIMIT: u64 = 48 * 1024;

/// A kernel specialisation before it is named.
#[derive(Clone, Debug)]
pub struct Spec {
    pub template: &'static str,
    pub params: BTreeMap<String, String>,
    pub threads: u32,
    pub shared_bytes: u32,
    /// Whether `shared_bytes` is dynamic shared memory, passed at launch.
    pub dynamic_shared: bool,
}

/// A launch before its kernel is named.
#[derive(Clone, Debug)]
pub struct Planned {
    pub spec: Spec,
    pub grid: GridDim,
    pub args: Vec<Arg>,
    pub when: Option<Guard>,
    /// Why the node took this kernel over a faster one, shown in the schedule.
    pub note: Option<String>,
}

/// What an op lowers to.
pub enum Lowering {
    Launch(Planned),
    /// Launches in the order they run, each with the [`Source`] of its pointer arguments; one
    /// with a guard runs only at the sizes it names (alternatives for one step have disjoint
    /// guards), one without always runs (the second kernel of a pair).
    Launches(Vec<(Planned, Vec<Source>)>),
    /// Not in this version (a GEMM, attention, the indexer, MoE), or not in this form; the
    /// reason is shown in the schedule.
    NotYet(String),
}

/// What the lowering of one node sees.
pub struct NodeCtx<'a> {
    pub node: &'a Node,
    pub operands: &'a [TensorRef],
    pub outputs: &'a [TensorRef],
    /// Cache capacity in tokens per sequence.
    pub max_context: u64,
    /// The GPU the artifact is for: only a persistent grid's size depends on it (its tiles are
    /// SM120's on every target).
    pub target: Target,
    /// The tile of every tiled tensor-core GEMM (a variant being timed), or None for the shipped
    /// one of its K ([`shipped_tiled_gemm`]).
    pub tiled_gemm: Option<TiledGemm>,
    /// What a decode GEMM runs above 16 rows ([`Variant::DecodeGemm`]; [`DECODE_GEMM`] shipped).
    pub decode_gemm: DecodeGemm,
    /// The fewest 32-key tiles a split of the sparse absorbed attention holds, where its top-k
    /// bounds the keys ([`Variant::MlaTilesPerSplit`]; [`MLA_SPARSE_TILES_PER_SPLIT`] shipped).
    pub mla_tiles_per_split: u64,
    /// The absorbed attention's kernel where a variant replaces the shipped choice
    /// ([`Variant::Mla`]), or None.
    pub mla_kernel: Option<MlaKernel>,
    /// The form of every bf16 `moe.down` at decode ([`Variant::MoeDown`]), or None for the
    /// shipped one by token count ([`shipped_moe_down`]).
    pub moe_down: Option<MoeDown>,
    /// The decode indexer kernel's key ring ([`Variant::ScoreRing`]; [`SCORE_DECODE_RING`]
    /// shipped).
    pub score_ring: ScoreRing,
    /// A prefill's `slot` input, where its `cache.update`s name one: the cache slot whose
    /// caches the node's cache operands are, read on the device so that a launch does not
    /// depend on it.
    pub slot: Option<TensorRef>,
    /// The largest sizes of the phase's symbols (the artifact's limits).
    pub limits: &'a Bindings,
    /// The [`Source`] of each pointer argument made so far, in order.
    pub sources: std::cell::RefCell<Vec<Source>>,
    /// The scratch buffers asked for, in order ([`NodeCtx::scratch`]).
    pub scratch: std::cell::RefCell<Vec<TensorRef>>,
}

fn ctype(d: DType) -> Option<&'static str> {
    match d {
        DType::F32 => Some("float"),
        DType::BF16 => Some("bf16"),
        DType::I64 => Some("i64"),
        _ => None,
    }
}

/// Which of the node's tensors a pointer argument points into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Operand(usize),
    Output(usize),
    /// Scratch buffer `k` of the node ([`NodeCtx::scratch`]).
    Scratch(usize),
    /// Neither: memory outside the arena (a cache's base).
    Other,
}

/// A scratch buffer of one node, by its order of request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scratch(usize);

impl NodeCtx<'_> {
    /// A workspace of `elements` × `dtype` for this node's launches alone: the lowering gives it
    /// a buffer of the arena live only while the node runs, sized at the limits (so `elements`
    /// may use the phase's symbols), which later nodes reuse.
    pub fn scratch(&self, dtype: DType, elements: Poly) -> Scratch {
        let mut list = self.scratch.borrow_mut();
        list.push(TensorRef {
            buf: crate::layout::Buf::Arena,
            offset_bytes: Poly::zero(),
            dtype,
            shape: vec![elements],
            strides: vec![Poly::constant(1)],
        });
        Scratch(list.len() - 1)
    }

    /// A pointer argument to scratch buffer `s`.
    fn scratch_ptr(&self, name: &str, s: Scratch) -> Arg {
        self.sources.borrow_mut().push(Source::Scratch(s.0));
        Arg {
            name: name.to_string(),
            value: ArgValue::Ptr(self.scratch.borrow()[s.0].clone()),
        }
    }

    /// A pointer argument to `r`, one of this node's operands or outputs (told apart by
    /// identity, since two buffers may hold tensors of equal layout).
    fn ptr(&self, name: &str, r: &TensorRef) -> Arg {
        let source = if let Some(i) = self.operands.iter().position(|o| std::ptr::eq(o, r)) {
            Source::Operand(i)
        } else if let Some(k) = self.outputs.iter().position(|o| std::ptr::eq(o, r)) {
            Source::Output(k)
        } else {
            Source::Other
        };
        self.sources.borrow_mut().push(source);
        Arg {
            name: name.to_string(),
            value: ArgValue::Ptr(r.clone()),
        }
    }
}

impl NodeCtx<'_> {
    /// With a prefill's cache slot: marks the kernel `slotted` and appends to `args` the slot
    /// and, per tensor of `tensors` (by argument name), how far apart its slots lie, which the
    /// kernel adds to the tensor's base (see [`slot_stride`]).
    fn slotted(&self, b: Builder, args: &mut Vec<Arg>, tensors: &[(&str, &TensorRef)]) -> Builder {
        let Some(slot) = &self.slot else {
            return b;
        };
        args.push(self.ptr("cache_slot", slot));
        for (name, r) in tensors {
            args.push(int(
                &format!("{name}_slot"),
                slot_stride(r, self.max_context),
            ));
        }
        b.param("slotted", true)
    }
}

/// Elements between two cache slots of `r`: a cache state's `[t, ..]` view lies in a
/// `[max_batch, max_context, ..]` allocation; anything else (the arena) is one for all slots.
pub fn slot_stride(r: &TensorRef, max_context: u64) -> Poly {
    match (&r.buf, r.strides.first()) {
        (crate::layout::Buf::State(_), Some(key)) => key.scale(max_context as i64),
        _ => Poly::zero(),
    }
}

fn ptr(name: &str, r: &TensorRef) -> Arg {
    Arg {
        name: name.to_string(),
        value: ArgValue::Ptr(r.clone()),
    }
}

fn int(name: &str, p: Poly) -> Arg {
    Arg {
        name: name.to_string(),
        value: ArgValue::Int(p),
    }
}

fn float(name: &str, x: f64) -> Arg {
    Arg {
        name: name.to_string(),
        value: ArgValue::F32(x),
    }
}

struct Builder {
    spec: Spec,
}

impl Builder {
    fn new(template: &'static str, threads: u32) -> Builder {
        Builder {
            spec: Spec {
                template,
                params: BTreeMap::new(),
                threads,
                shared_bytes: 0,
                dynamic_shared: false,
            },
        }
    }

    fn param(mut self, k: &str, v: impl ToString) -> Builder {
        self.spec.params.insert(k.to_string(), v.to_string());
        self
    }

    fn dtype(self, k: &str, d: DType) -> Result<Builder, String> {
        let c = ctype(d).ok_or_else(|| format!("no {d} kernels yet (f32, bf16 and i64 only)"))?;
        Ok(self.param(k, c))
    }

    fn shared(mut self, bytes: u32, dynamic: bool) -> Builder {
        self.spec.shared_bytes = bytes;
        self.spec.dynamic_shared = dynamic;
        self
    }

    fn planned(self, grid: GridDim, args: Vec<Arg>) -> Planned {
        Planned {
            spec: self.spec,
            grid,
            args,
            when: None,
            note: None,
        }
    }

    fn launch(self, grid: GridDim, args: Vec<Arg>) -> Lowering {
        Lowering::Launch(self.planned(grid, args))
    }
}

/// Whether `r` is bf16, starts on 16 bytes and each of `strides` is a whole number of 8-element
/// (16-byte) vectors, as the tensor-core kernels' `cp.async` copies need.
fn bf16_vectors(r: &TensorRef, strides: &[&Poly], what: &str) -> Result<(), String> {
    if r.dtype != DType::BF16 {
        return Err(format!(
            "{what} is {} (the tensor cores take bf16)",
            r.dtype
        ));
    }
    if !r.offset_bytes.divisible_by(16) || !strides.iter().all(|s| s.divisible_by(8)) {
        return Err(format!("{what} is not in 16-byte vectors ({r})"));
    }
    Ok(())
}

/// The rows view of operand or output `what`, or why there is none.
fn rows_of(r: &TensorRef, what: &str) -> Result<Rows, String> {
    r.rows()
        .ok_or_else(|| format!("{what} is not rows of contiguous elements ({r})"))
}

fn const_cols(rows: &Rows, what: &str) -> Result<u64, String> {
    rows.cols
        .as_const()
        .map(|c| c as u64)
        .ok_or_else(|| format!("{what} has a symbolic row length {}", rows.cols))
}

/// The widest vector (elements) every tensor's rows allow: at most 16 bytes, a divisor of the
/// row length, with every row start aligned to it.
fn vector_width(cols: u64, tensors: &[(&TensorRef, &Poly)]) -> u64 {
    let widest = tensors
        .iter()
        .map(|(r, _)| 16 / r.dtype.size_bytes())
        .min()
        .unwrap_or(1);
    let mut v = widest;
    while v > 1 {
        let fits = cols.is_multiple_of(v)
            && tensors.iter().all(|(r, stride)| {
                stride.divisible_by(v as i64)
                    && r.offset_bytes
                        .divisible_by((v * r.dtype.size_bytes()) as i64)
            });
        if fits {
            break;
        }
        v /= 2;
    }
    v
}

pub fn lower(cx: &NodeCtx) -> Lowering {
    match lower_op(cx) {
        Ok(l) => l,
        Err(why) => Lowering::NotYet(why),
    }
}

fn lower_op(cx: &NodeCtx) -> Result<Lowering, String> {
    let node = cx.node;
    match &node.op {
        Op::Add {} => elementwise(cx, "xv + yv", 0.0),
        Op::Mul {} => elementwise(cx, "xv * yv", 0.0),
        Op::Swiglu {} => {
            let out_t = ctype(cx.outputs[0].dtype).unwrap_or("float");
            elementwise(cx, &format!("rnd<{out_t}>(silu(xv)) * yv"), 0.0)
        }
        Op::Scale { factor } => elementwise(cx, "xv * factor", *factor),
        Op::Silu {} => elementwise(cx, "silu(xv)", 0.0),
        Op::Relu {} => elementwise(cx, "fmaxf(xv, 0.f)", 0.0),
        Op::Cast { .. } => elementwise(cx, "xv", 0.0),
        Op::RmsNorm { eps } => norm(cx, false, false, *eps),
        Op::AddRmsNorm { eps } => norm(cx, true, false, *eps),
        Op::LayerNorm { eps } => norm(cx, false, true, *eps),
        Op::Rope { interleaved, theta } => rope(cx, *interleaved, *theta),
        Op::Embed {} => embed(cx, None),
        Op::EmbedShard { start } => embed(cx, Some(*start)),
        Op::CacheUpdate { batched, .. } => cache_update(cx, *batched),
        Op::CacheUpdateNorm {
            batched,
            eps,
            layernorm,
            rope,
            ..
        } => cache_update_norm(cx, *batched, *layernorm, *eps, rope.as_ref()),
        Op::SampleArgmax {} => sample_argmax(cx),
        Op::SampleTopP {} => sample_top_p(cx),
        Op::Matmul {} => gemm(cx, false, None),
        Op::MatmulArgmax {} => gemm_argmax(cx),
        Op::MatmulHeads {} => gemm(cx, true, None),
        Op::MatmulRope {
            end,
            interleaved,
            period,
            start,
            theta,
        } => gemm(
            cx,
            false,
            Some(&RopeColumns {
                interleaved: *interleaved,
                theta: *theta,
                period: *period,
                start: *start,
                end: *end,
            }),
        ),
        Op::MlaAttend {
            dense_until,
            scale,
            sparse,
        } => attention(cx, false, *sparse, *dense_until, *scale),
        Op::MlaAttendAbsorbed {
            dense_until,
            scale,
            sparse,
        } => attention(cx, true, *sparse, *dense_until, *scale),
        Op::DsaScore { weight_scale } => dsa_score(cx, *weight_scale),
        Op::DsaTopk { k } => dsa_topk(cx, *k),
        Op::MoeRoute {
            n_group,
            norm_topk_prob,
            routed_scaling_factor,
            top_k,
            topk_group,
        } => moe_route(
            cx,
            *n_group,
            *topk_group,
            *top_k,
            *norm_topk_prob,
            *routed_scaling_factor,
        ),
        Op::MoeExperts {} => moe_experts(cx),
        Op::MoeSort { experts } => moe_sort(cx, *experts),
        Op::MoeGateUp {} => moe_gemm(cx, true),
        Op::MoeDown {} => moe_gemm(cx, false),
        Op::MoeCombine { shared } => moe_combine(cx, *shared),
        other => Err(format!("`{}` has no kernel", other.name())),
    }
}

fn elementwise(cx: &NodeCtx, expr: &str, factor: f64) -> Result<Lowering, String> {
    let out = &cx.outputs[0];
    let a = &cx.operands[0];
    let (out_rows, a_rows) = (rows_of(out, "the output")?, rows_of(a, "operand 0")?);
    let cols = const_cols(&out_rows, "the output")?;
    let binary = cx.operands.len() == 2;
    let b_rows = if binary {
        let b = &cx.operands[1];
        let r = rows_of(b, "operand 1")?;
        if r.cols != out_rows.cols {
            return Err(format!(
                "operand 1's rows ({}) differ from the output's ({})",
                r.cols, out_rows.cols
            ));
        }
        Some(r)
    } else {
        None
    };
    let mut tensors = vec![(out, &out_rows.stride), (a, &a_rows.stride)];
    if let Some(r) = &b_rows {
        tensors.push((&cx.operands[1], &r.stride));
    }
    let vec = vector_width(cols, &tensors);
    let mut k = Builder::new("elementwise", ELEMENTWISE_THREADS)
        .param("op", cx.node.op.name())
        .param("expr", expr)
        .param("cols", cols)
        .param("vec", vec)
        .param("binary", binary)
        .dtype("out_t", out.dtype)?
        .dtype("a_t", a.dtype)?;
    let mut args = vec![
        cx.ptr("out", out),
        int("out_stride", out_rows.stride.clone()),
        cx.ptr("a", a),
        int("a_stride", a_rows.stride),
    ];
    if let Some(r) = b_rows {
        k = k.dtype("b_t", cx.operands[1].dtype)?;
        args.push(cx.ptr("b", &cx.operands[1]));
        args.push(int("b_stride", r.stride));
        args.push(int("b_rows", r.rows));
    }
    args.push(int("rows", out_rows.rows.clone()));
    args.push(float("factor", factor));
    let work = out_rows.rows.scale((cols / vec) as i64);
    Ok(k.launch(
        GridDim {
            work,
            per_block: ELEMENTWISE_THREADS as u64,
        },
        args,
    ))
}

/// Threads and register-resident vectors per thread for a row of `vecs` vectors.
fn row_threads(vecs: u64) -> (u32, u64) {
    let mut threads = vecs.div_ceil(32).clamp(1, (ROW_THREADS / 32) as u64) * 32;
    if vecs.div_ceil(threads) > MAX_NORM_ITEMS {
        threads = vecs.div_ceil(MAX_NORM_ITEMS).div_ceil(32).min(32) * 32;
    }
    (threads as u32, vecs.div_ceil(threads))
}

fn norm(cx: &NodeCtx, add: bool, layernorm: bool, eps: f64) -> Result<Lowering, String> {
    let y = &cx.outputs[0];
    let x = &cx.operands[0];
    let (y_rows, x_rows) = (rows_of(y, "the output")?, rows_of(x, "operand 0")?);
    let cols = const_cols(&y_rows, "the output")?;
    let w = &cx.operands[if add { 2 } else { 1 }];
    let mut tensors = vec![(y, &y_rows.stride), (x, &x_rows.stride), (w, &y_rows.cols)];
    let extra = if add {
        let sum = &cx.outputs[1];
        let d = &cx.operands[1];
        Some((
            rows_of(sum, "the sum output")?,
            rows_of(d, "operand 1")?,
            sum,
            d,
        ))
    } else {
        None
    };
    if let Some((sr, dr, sum, d)) = &extra {
        tensors.push((sum, &sr.stride));
        tensors.push((d, &dr.stride));
    }
    if layernorm {
        tensors.push((&cx.operands[2], &y_rows.cols));
    }
    let vec = vector_width(cols, &tensors);
    let (threads, items) = row_threads(cols / vec);
    let is_weight = |t: &TensorRef| matches!(t.buf, crate::layout::Buf::Weight(_));
    let weights_first = is_weight(w) && (!layernorm || is_weight(&cx.operands[2]));
    let mut k = Builder::new("norm", threads)
        .param("op", cx.node.op.name())
        .param("cols", cols)
        .param("vec", vec)
        .param("items", items)
        .param("threads", threads)
        .param("add", add)
        .param("layernorm", layernorm)
        .param("weights_first", weights_first)
        .dtype("y_t", y.dtype)?
        .dtype("x_t", x.dtype)?
        .dtype("w_t", w.dtype)?
        .shared(32 * 4, false);
    let mut args = vec![cx.ptr("y", y), int("y_stride", y_rows.stride.clone())];
    if let Some((sr, dr, sum, d)) = &extra {
        k = k.dtype("r_t", sum.dtype)?.dtype("d_t", d.dtype)?;
        args.push(cx.ptr("sum_out", sum));
        args.push(int("sum_stride", sr.stride.clone()));
        args.push(cx.ptr("x", x));
        args.push(int("x_stride", x_rows.stride.clone()));
        args.push(cx.ptr("d", d));
        args.push(int("d_stride", dr.stride.clone()));
        args.push(int("d_rows", dr.rows.clone()));
    } else {
        args.push(cx.ptr("x", x));
        args.push(int("x_stride", x_rows.stride.clone()));
    }
    args.push(cx.ptr("w", w));
    if layernorm {
        let b = &cx.operands[2];
        k = k.dtype("bias_t", b.dtype)?;
        args.push(cx.ptr("bias", b));
    }
    args.push(int("rows", y_rows.rows.clone()));
    args.push(float("eps", eps));
    Ok(k.launch(GridDim::one_block_each(y_rows.rows), args))
}

/// The interpreter's frequencies, `theta^(−2i/R)` in f64, written so that the f64 literal in the
/// kernel is the same number.
pub fn inv_freq(theta: f64, dim: u64) -> Vec<f64> {
    (0..dim / 2)
        .map(|i| theta.powf(-((2 * i) as f64) / dim as f64))
        .collect()
}

fn rope(cx: &NodeCtx, interleaved: bool, theta: f64) -> Result<Lowering, String> {
    let (y, x, positions) = (&cx.outputs[0], &cx.operands[0], &cx.operands[1]);
    let (y_rows, x_rows) = (rows_of(y, "the output")?, rows_of(x, "operand 0")?);
    let dim = const_cols(&y_rows, "the output")?;
    if dim % 2 != 0 {
        return Err(format!("rotary dim {dim} is odd"));
    }
    if !positions.is_contiguous() || positions.dtype != DType::I64 {
        return Err("positions must be contiguous i64".into());
    }
    let heads = Poly::product(&y.shape[1..y.shape.len() - 1]);
    let freqs: Vec<String> = inv_freq(theta, dim)
        .iter()
        .map(|f| format!("{f:e}"))
        .collect();
    let k = Builder::new("rope", ELEMENTWISE_THREADS)
        .param("dim", dim)
        .param("half", dim / 2)
        .param("interleaved", interleaved)
        .param("theta", theta)
        .param("inv_freq", freqs.join(", "))
        .dtype("y_t", y.dtype)?
        .dtype("x_t", x.dtype)?;
    let args = vec![
        cx.ptr("y", y),
        int("y_stride", y_rows.stride.clone()),
        cx.ptr("x", x),
        int("x_stride", x_rows.stride),
        cx.ptr("positions", positions),
        int("rows", y_rows.rows.clone()),
        int("heads", heads),
    ];
    Ok(k.launch(
        GridDim {
            work: y_rows.rows.scale((dim / 2) as i64),
            per_block: ELEMENTWISE_THREADS as u64,
        },
        args,
    ))
}

/// `embed`, or with `shard` (the first vocabulary row the table holds) `embed.shard`.
fn embed(cx: &NodeCtx, shard: Option<u64>) -> Result<Lowering, String> {
    let (y, table, ids) = (&cx.outputs[0], &cx.operands[0], &cx.operands[1]);
    let y_rows = rows_of(y, "the output")?;
    let cols = const_cols(&y_rows, "the output")?;
    let vocab = table.shape[0]
        .as_const()
        .ok_or("the table has a symbolic vocabulary")?;
    if !table.is_contiguous() || !ids.is_contiguous() {
        return Err("the table and the ids must be contiguous".into());
    }
    let vec = vector_width(cols, &[(y, &y_rows.stride), (table, &y_rows.cols)]);
    let threads = ((cols / vec)
        .div_ceil(32)
        .clamp(1, (ROW_THREADS / 32) as u64)
        * 32) as u32;
    let k = Builder::new("embed", threads)
        .param("shard", shard.is_some())
        .param("cols", cols)
        .param("vec", vec)
        .param("vocab", vocab)
        .param("threads", threads)
        .dtype("y_t", y.dtype)?
        .dtype("table_t", table.dtype)?;
    let args = vec![
        cx.ptr("y", y),
        int("y_stride", y_rows.stride.clone()),
        cx.ptr("table", table),
        cx.ptr("ids", ids),
        int("rows", y_rows.rows.clone()),
        int("start", Poly::constant(shard.unwrap_or(0) as i64)),
    ];
    Ok(k.launch(GridDim::one_block_each(y_rows.rows), args))
}

fn cache_update(cx: &NodeCtx, batched: bool) -> Result<Lowering, String> {
    let (cache, x, positions) = (&cx.outputs[0], &cx.operands[0], &cx.operands[1]);
    let x_rows = rows_of(x, "the new rows")?;
    let cols = const_cols(&x_rows, "the new rows")?;
    let vec = vector_width(cols, &[(x, &x_rows.stride), (cache, &x_rows.cols)]);
    let k = Builder::new("cache", ELEMENTWISE_THREADS)
        .param("cols", cols)
        .param("vec", vec)
        .param("batched", batched)
        .dtype("c_t", cache.dtype)?
        .dtype("x_t", x.dtype)?;
    let seq_stride = if batched || cx.slot.is_some() {
        Poly::constant((cx.max_context * cols) as i64)
    } else {
        Poly::zero()
    };
    let base = TensorRef {
        shape: Vec::new(),
        strides: Vec::new(),
        ..cache.clone()
    };
    let mut args = vec![
        cx.ptr("cache", &base),
        int("seq_stride", seq_stride),
        int("capacity", Poly::constant(cx.max_context as i64)),
        cx.ptr("x", x),
        int("x_stride", x_rows.stride.clone()),
        cx.ptr("positions", positions),
        int("rows", x_rows.rows.clone()),
    ];
    let k = match (&cx.slot, batched) {
        (Some(slot), false) => {
            args.push(cx.ptr("cache_slot", slot));
            k.param("slotted", true)
        }
        _ => k,
    };
    Ok(k.launch(
        GridDim {
            work: x_rows.rows.scale((cols / vec) as i64),
            per_block: ELEMENTWISE_THREADS as u64,
        },
        args,
    ))
}

/// `cache.update.norm`: one block per row, the norm's (`norm`'s threads, vectors and reduction,
/// so its statistics round as the unfused kernel's do), the rows written straight into the
/// cache at their positions and the tail copied into the second cache by the same block.
fn cache_update_norm(
    cx: &NodeCtx,
    batched: bool,
    layernorm: bool,
    eps: f64,
    rope: Option<&RopeSpan>,
) -> Result<Lowering, String> {
    let (x, w) = (&cx.operands[0], &cx.operands[1]);
    let p = cx.node.op.positions_operand().ok_or("not a cache op")?;
    let positions = &cx.operands[p];
    if !positions.is_contiguous() || positions.dtype != DType::I64 {
        return Err("positions must be contiguous i64".into());
    }
    let x_rows = rows_of(x, "x")?;
    let cols = const_cols(&x_rows, "x")?;
    let d = w.shape[0]
        .as_const()
        .ok_or("the norm's weight has a symbolic length")? as u64;
    let tail = cols - d;
    let cache = &cx.outputs[0];
    let width = Poly::constant(d as i64);
    let mut tensors = vec![(x, &x_rows.stride), (cache, &width), (w, &width)];
    if layernorm {
        tensors.push((&cx.operands[2], &width));
    }
    let mut vec = vector_width(d, &tensors);
    // The tail starts D columns into x's row and fills rows of its own width.
    while vec > 1 && !tail.is_multiple_of(vec) {
        vec /= 2;
    }
    let (threads, items) = row_threads(d / vec);
    let seq_stride = |row: u64| {
        if batched || cx.slot.is_some() {
            Poly::constant((cx.max_context * row) as i64)
        } else {
            Poly::zero()
        }
    };
    let base = |c: &TensorRef| TensorRef {
        shape: Vec::new(),
        strides: Vec::new(),
        ..c.clone()
    };
    let mut k = Builder::new("cache_norm", threads)
        .param("op", cx.node.op.name())
        .param("cols", d)
        .param("vec", vec)
        .param("items", items)
        .param("threads", threads)
        .param("batched", batched)
        .param("layernorm", layernorm)
        .param("rope", rope.is_some())
        .dtype("c_t", cache.dtype)?
        .dtype("x_t", x.dtype)?
        .dtype("w_t", w.dtype)?;
    let mut shared = 32 * 4;
    if let Some(r) = rope {
        let dim = r.end - r.start;
        let freqs: Vec<String> = inv_freq(r.theta, dim)
            .iter()
            .map(|f| format!("{f:e}"))
            .collect();
        k = k
            .param("rope_start", r.start)
            .param("rope_end", r.end)
            .param("half", dim / 2)
            .param("interleaved", r.interleaved)
            .param("theta", r.theta)
            .param("inv_freq", freqs.join(", "));
        shared += 4 * dim as u32;
    }
    let cache_base = base(cache);
    let mut args = vec![
        cx.ptr("cache", &cache_base),
        int("seq_stride", seq_stride(d)),
    ];
    if tail > 0 {
        k = k.param("tail", tail);
        args.push(cx.ptr("tail_cache", &base(&cx.outputs[1])));
        args.push(int("tail_seq_stride", seq_stride(tail)));
    }
    args.extend([
        int("capacity", Poly::constant(cx.max_context as i64)),
        cx.ptr("x", x),
        int("x_stride", x_rows.stride.clone()),
        cx.ptr("positions", positions),
        cx.ptr("w", w),
    ]);
    if layernorm {
        let b = &cx.operands[2];
        k = k.dtype("bias_t", b.dtype)?;
        args.push(cx.ptr("bias", b));
    }
    args.push(int("rows", x_rows.rows.clone()));
    args.push(float("eps", eps));
    if let (Some(slot), false) = (&cx.slot, batched) {
        args.push(cx.ptr("cache_slot", slot));
        k = k.param("slotted", true);
    }
    Ok(k.shared(shared, false)
        .launch(GridDim::one_block_each(x_rows.rows), args))
}

/// A copy of `src` into `dst` (same shape and dtype, any strides, rank ≤ 4); with `slot` (a
/// prefill's `slot` input, and how many elements apart the slots of `src` lie), the copy reads
/// `src` in that cache slot.
pub fn copy(
    dst: &TensorRef,
    src: &TensorRef,
    slot: Option<(&TensorRef, Poly)>,
) -> Result<Planned, String> {
    let rank = src.shape.len();
    if rank > 4 {
        return Err(format!("a copy of rank {rank} (at most 4)"));
    }
    let pad = 4 - rank;
    let dims: Vec<Poly> = std::iter::repeat_n(Poly::constant(1), pad)
        .chain(src.shape.iter().cloned())
        .collect();
    let stride = |r: &TensorRef| -> Vec<Poly> {
        std::iter::repeat_n(Poly::zero(), pad)
            .chain(r.strides.iter().cloned())
            .collect()
    };
    let (ys, xs) = (stride(dst), stride(src));
    let mut b = Builder::new("copy", ELEMENTWISE_THREADS).dtype("t", src.dtype)?;
    if slot.is_some() {
        b = b.param("slotted", true);
    }
    let Lowering::Launch(mut planned) = b.launch(
        GridDim {
            work: src.numel(),
            per_block: ELEMENTWISE_THREADS as u64,
        },
        Vec::new(),
    ) else {
        unreachable!("Builder::launch makes a launch")
    };
    let mut args = vec![ptr("y", dst)];
    args.extend(
        ys.iter()
            .enumerate()
            .map(|(i, s)| int(&format!("ys{i}"), s.clone())),
    );
    args.push(ptr("x", src));
    args.extend(
        xs.iter()
            .enumerate()
            .map(|(i, s)| int(&format!("xs{i}"), s.clone())),
    );
    args.extend(
        dims.iter()
            .enumerate()
            .map(|(i, d)| int(&format!("n{i}"), d.clone())),
    );
    if let Some((slot, stride)) = slot {
        args.push(ptr("cache_slot", slot));
        args.push(int("x_slot", stride));
    }
    planned.args = args;
    Ok(planned)
}

/// `sample.argmax` over rows of logits: one block per row.
fn sample_argmax(cx: &NodeCtx) -> Result<Lowering, String> {
    let (out, logits) = (&cx.outputs[0], &cx.operands[0]);
    let rows = rows_of(logits, "the logits")?;
    let cols = const_cols(&rows, "the logits")?;
    let k = Builder::new("sample", SAMPLE_THREADS)
        .param("op", cx.node.op.name())
        .param("cols", cols)
        .param("threads", SAMPLE_THREADS)
        .param("top_p", false)
        .dtype("x_t", logits.dtype)?
        .shared(32 * 4 + SAMPLE_THREADS * 8, false);
    let args = vec![
        cx.ptr("out", out),
        cx.ptr("logits", logits),
        int("stride", rows.stride),
        int("rows", rows.rows.clone()),
    ];
    Ok(k.launch(GridDim::one_block_each(rows.rows), args))
}

/// `sample.top_p`'s layout for rows of `cols` tokens: (slices per row, bins, candidates, the
/// fixed-point shift of a probability, 64-bit words of scratch per row), as `sample.cu` lays
/// out a row's scratch (its static_assert checks the words).
fn top_p_layout(cols: u64) -> (u64, u64, u64, u64, u64) {
    let slices = cols.div_ceil(TOP_P_THREADS as u64 * TOP_P_PER_THREAD);
    let bins = cols.next_power_of_two().min(TOP_P_BINS);
    // A power of two: the bitonic sort pads its candidates to one, in arrays of `cap`.
    let cap = cols.next_power_of_two().min(TOP_P_CAP);
    // Σ q ≤ cols · 2^shift ≤ 2^63.
    let shift = 63 - cols.next_power_of_two().trailing_zeros() as u64;
    // The histogram, one (max, argmax) per slice, the candidates' keys and masses, 11 words of
    // counters and results (`Ctl`).
    let words = bins + slices + 2 * cap + 11;
    (slices, bins, cap, shift, words)
}

/// `sample.top_p`: four kernels over rows × slices blocks (`sample.cu` says what each does)
/// sharing one scratch of `top_p_layout`'s words per row.
fn sample_top_p(cx: &NodeCtx) -> Result<Lowering, String> {
    let (out, logits) = (&cx.outputs[0], &cx.operands[0]);
    let rows = rows_of(logits, "the logits")?;
    let cols = const_cols(&rows, "the logits")?;
    if cols == 0 || cols > i32::MAX as u64 {
        return Err(format!(
            "{cols} tokens: the kernels hold a token in an int (1 to 2^31 - 1)"
        ));
    }
    if out.dtype != DType::I64 || !out.is_contiguous() {
        return Err(format!("the tokens must be contiguous i64 ({out})"));
    }
    let operands: Vec<&TensorRef> = cx.operands[1..4].iter().collect();
    for (r, name) in operands.iter().zip(["temperature", "top_p", "uniform"]) {
        if r.dtype != DType::F32 || !r.is_contiguous() {
            return Err(format!("{name} must be contiguous f32"));
        }
    }
    let (slices, bins, cap, shift, words) = top_p_layout(cols);
    let scratch = cx.scratch(DType::I64, rows.rows.scale(words as i64));
    let grid = GridDim::one_block_each(rows.rows.scale(slices as i64));
    let mut launches = Vec::new();
    for (stage, shared) in [
        ("max", 0),
        ("hist", 8 * bins),
        ("nucleus", 16 * cap),
        ("draw", 16 * cap),
    ] {
        let k = Builder::new("sample", TOP_P_THREADS)
            .param("op", cx.node.op.name())
            .param("stage", stage)
            .param("cols", cols)
            .param("top_p", true)
            .param("per", TOP_P_PER_THREAD)
            .param("slices", slices)
            .param("bins", bins)
            .param("cap", cap)
            .param("qshift", shift)
            .param("row_words", words)
            .dtype("x_t", logits.dtype)?
            .shared(shared as u32 + 256, false);
        let mut args = vec![
            cx.ptr("out", out),
            cx.ptr("logits", logits),
            int("stride", rows.stride.clone()),
        ];
        for (r, name) in operands.iter().zip(["temperature", "top_p", "uniform"]) {
            args.push(cx.ptr(name, r));
        }
        args.push(cx.scratch_ptr("scratch", scratch));
        args.push(int("rows", rows.rows.clone()));
        launches.push((k.planned(grid.clone(), args), cx.sources.take()));
    }
    Ok(Lowering::Launches(launches))
}

/// A tensor's leading axes (all but the last `keep`) as rows: `inner` rows `row_stride` apart,
/// repeated every `outer_stride` elements, which is how a batched cache `[b, t, ..]` whose
/// sequences lie a capacity apart is addressed. Axes merge where their strides allow.
struct Lead {
    rows: Poly,
    inner: Poly,
    outer_stride: Poly,
    row_stride: Poly,
}

fn lead(r: &TensorRef, keep: usize, what: &str) -> Result<Lead, String> {
    let rank = r.shape.len();
    if rank < keep || r.strides[rank - 1] != Poly::constant(1) {
        return Err(format!("{what} does not end in contiguous rows ({r})"));
    }
    // Groups of mergeable axes, innermost first: (extent, stride).
    let mut groups: Vec<(Poly, Poly)> = Vec::new();
    for k in (0..rank - keep).rev() {
        match groups.last_mut() {
            Some((extent, stride)) if r.strides[k] == extent.mul(stride) => {
                *extent = extent.mul(&r.shape[k]);
            }
            _ => groups.push((r.shape[k].clone(), r.strides[k].clone())),
        }
    }
    match groups.as_slice() {
        [] => Ok(Lead {
            rows: Poly::constant(1),
            inner: Poly::constant(1),
            outer_stride: Poly::zero(),
            row_stride: Poly::zero(),
        }),
        [(extent, stride)] => Ok(Lead {
            rows: extent.clone(),
            inner: extent.clone(),
            outer_stride: Poly::zero(),
            row_stride: stride.clone(),
        }),
        [(inner, row_stride), (outer, outer_stride)] => Ok(Lead {
            rows: outer.mul(inner),
            inner: inner.clone(),
            outer_stride: outer_stride.clone(),
            row_stride: row_stride.clone(),
        }),
        _ => Err(format!("{what}'s leading axes do not form rows ({r})")),
    }
}

/// The leading axes as plain rows `stride` apart (one group, see [`lead`]).
fn plain_rows(r: &TensorRef, keep: usize, what: &str) -> Result<(Poly, Poly), String> {
    let l = lead(r, keep, what)?;
    if l.outer_stride != Poly::zero() {
        return Err(format!(
            "{what}'s leading axes do not merge into rows ({r})"
        ));
    }
    Ok((l.rows, l.row_stride))
}

fn const_dim(r: &TensorRef, axis: usize, what: &str) -> Result<u64, String> {
    r.shape[axis]
        .as_const()
        .map(|c| c as u64)
        .ok_or_else(|| format!("{what} has a symbolic axis {axis} ({r})"))
}

fn positions_ok(p: &TensorRef) -> Result<(), String> {
    if p.dtype != DType::I64 || !p.is_contiguous() {
        return Err(format!("positions must be contiguous i64 ({p})"));
    }
    Ok(())
}

/// Positions below which the GEMMs' rope epilogue (gemm_head.cuh's `rotate2`, its angle reduced
/// in f32) is within 5e-7 of the f64 angle (`rope_angle_in_f32_holds_below_rope_positions`); a
/// longer context leaves `matmul.rope` without a kernel, saying so, rather than rotating wrong.
pub const ROPE_POSITIONS: u64 = 1 << 18;

/// Columns `start..end` of every block of `period` that `matmul.rope` rotates.
struct RopeColumns {
    interleaved: bool,
    theta: f64,
    period: u64,
    start: u64,
    end: u64,
}

/// A GEMM kernel and the output tile one block computes; the template fixes the tile, this
/// mirrors it for the launch shape and the shared-memory check.
#[derive(Clone, Copy)]
struct GemmTile {
    template: &'static str,
    rows: u64,
    cols: u64,
    /// Shared memory a block uses, and whether it is dynamic (over 48 KiB needs that).
    shared: u32,
    dynamic: bool,
    /// Template parameters that shape the tile.
    params: &'static [(&'static str, u64)],
    /// The tiled GEMM's tile, whose fields are its template parameters and give its threads
    /// and shared memory (`rows`, `cols` and `shared` then repeat them).
    tiled: Option<TiledGemm>,
}

/// Any dtype, any shape: f32 FMA on 64 × 64 tiles (`matmul.cu`).
const SIMT_GEMM: GemmTile = GemmTile {
    template: "matmul",
    rows: 64,
    cols: 64,
    shared: 2 * 16 * 68 * 4,
    dynamic: false,
    params: &[],
    tiled: None,
};
/// A tile of the tiled tensor-core GEMM (`gemm_mma.cu`), each field one of its template
/// parameters: `bm × bn` outputs a block on `warps_m × warps_n` warps (each of
/// `bm / warps_m × bn / warps_n`), K in steps of `bk` (32 or 64) through a `stages`-deep
/// cp.async ring, `min_blocks` blocks an SM asked of ptxas (registers are held to
/// 65536 / (min_blocks · threads)), and `group` row tiles walked down before the blocks move
/// one tile right.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TiledGemm {
    pub bm: u64,
    pub bn: u64,
    pub warps_m: u64,
    pub warps_n: u64,
    pub bk: u64,
    pub stages: u64,
    pub min_blocks: u64,
    pub group: u64,
}

impl TiledGemm {
    pub fn threads(&self) -> u32 {
        (32 * self.warps_m * self.warps_n) as u32
    }

    /// Shared memory a block uses for an output of `y`: the ring of operand tiles, or the
    /// output tile staged for 16-byte stores (rows one 16-byte vector longer) where larger.
    pub fn shared_bytes(&self, y: DType) -> u32 {
        let ring = self.stages * (self.bm + self.bn) * self.bk * 2;
        let size = y.size_bytes();
        let staged = self.bm * (self.bn + 16 / size) * size;
        ring.max(staged) as u32
    }

    fn params(&self) -> [(&'static str, u64); 8] {
        [
            ("bm", self.bm),
            ("bn", self.bn),
            ("warps_m", self.warps_m),
            ("warps_n", self.warps_n),
            ("bk", self.bk),
            ("stages", self.stages),
            ("min_blocks", self.min_blocks),
            ("group", self.group),
        ]
    }
}

impl std::fmt::Display for TiledGemm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}x{} w{}x{} k{} s{} b{} g{}",
            self.bm,
            self.bn,
            self.warps_m,
            self.warps_n,
            self.bk,
            self.stages,
            self.min_blocks,
            self.group
        )
    }
}

/// The tiled GEMM's tile for K below [`LONG_K`]: 128 × 128 on 8 warps of 32 × 64 through a
/// 4-stage ring of K steps of 32 (64 KiB of swizzled tiles), the blocks walking 16 row tiles
/// down before they move right. Two blocks may share an SM where shared memory allows (an H200;
/// not SM120's 100 KiB), so registers are held to 128 a thread. At K ≤ 512 (attn, kv_b_proj,
/// q_absorbed) a block's few K steps make its ring's fill and its epilogue a large share of its
/// time, which the second block of an SM hides: in the sweep on an H100
/// (tests/gpu/results/2026-12-06a, call D) 256 × 128 tiles took q_absorbed 256.2 µs against
/// 234.0 and attn 228.9 against 220.0 (kv_b_proj 364.3 against 366.5). Grouping 16 row tiles
/// took attn from 249.1 µs (none) to 220.0.
pub const TILED_GEMM: TiledGemm = TiledGemm {
    bm: 128,
    bn: 128,
    warps_m: 4,
    warps_n: 2,
    bk: 32,
    stages: 4,
    min_blocks: 2,
    group: 16,
};

/// The tiles the sweep times besides [`TILED_GEMM`]: [`TILED_GEMM_LONG_K`], each of the two
/// grouped otherwise, and 128 × 256 on 8 warps of 64 × 64. 64 × 64 warp tiles read shared memory
/// a third less per MMA than 32 × 64 ones (8 ldmatrix.x4 for 32 MMAs against 6 for 16). Timed
/// until 2026-12-06 and never ahead by more than 1%: 4 warps of 64 × 64 on 128 × 128 (231–254
/// registers, 8–12% slower at K ≤ 2048; tests/gpu/results/2026-12-01r), 3 and 6 stages, and
/// 64 × 128 tiles on 8 warps of 32 × 32 at two or three blocks an SM (7–147% slower than the
/// best tile on every shape, q_absorbed too, whose output rather than its FLOPs sets the time;
/// 2026-12-06a, call A). K steps of 64 (`bk`, half the barriers per MMA) spill with either warp
/// tile: 44 bytes on sm_90a at 32 × 64 (128 registers), 8 bytes on sm_120a at 64 × 64 (255), the
/// 16 copies' addresses a stage the difference.
pub const TILED_GEMM_VARIANTS: [TiledGemm; 5] = {
    let t = TILED_GEMM;
    let long = TILED_GEMM_LONG_K;
    [
        long,
        TiledGemm { group: 1, ..t },
        TiledGemm { group: 8, ..t },
        TiledGemm { group: 1, ..long },
        TiledGemm {
            bm: 128,
            bn: 256,
            warps_m: 2,
            warps_n: 4,
            ..long
        },
    ]
};

/// The tile from K = [`LONG_K`]: 256 × 128 on 8 warps of 64 × 64, one block an SM (96 KiB of
/// ring), walking 8 row tiles down. Its warp tile reads shared memory a third less per MMA. In
/// the sweep on an H100 (tests/gpu/results/2026-12-06a, call D) it was the fastest on every GLM-5
/// prefill GEMM with K ≥ 2048 against 128 × 128 (q_b_proj 664.8 µs against 724.1, wq_b 175.3
/// against 189.6, the shared expert's down projection 233.8 against 270.6, o_proj 1725 against
/// 2057) and against itself ungrouped (q_b_proj 679.6, the dense MLP's gate/up 2868 against 3002).
pub const TILED_GEMM_LONG_K: TiledGemm = TiledGemm {
    bm: 256,
    bn: 128,
    warps_m: 4,
    warps_n: 2,
    min_blocks: 1,
    group: 8,
    ..TILED_GEMM
};
/// The K from which [`TILED_GEMM_LONG_K`] ships.
pub const LONG_K: u64 = 2048;

/// The tile the compiler ships for a tiled GEMM of reduction length `k`.
pub fn shipped_tiled_gemm(k: u64) -> TiledGemm {
    if k >= LONG_K {
        TILED_GEMM_LONG_K
    } else {
        TILED_GEMM
    }
}

/// The tiled GEMM's tile for a decode batch of 17 to 64 rows: one 64-row tile (a 128-row one
/// would be half empty or more), 128 columns on 8 warps of 32 × 32, K steps of 32 through a
/// 4-stage ring (48 KiB: two blocks an SM on SM120, and 12 KiB a stage of which three are in
/// flight, 36 KiB a block). At these rows a GEMM is bound by its weight's bytes, and the 64-row
/// skinny GEMM it replaces reads x (64 rows) for every 16 weight columns: four bytes of x from L2
/// for each weight byte from DRAM (GLM-5's lm_head at 64 rows: 1392 µs against torch.matmul's
/// 468 on an H200, bench/RESULTS.md); here half a byte. Where a weight's 128-column tiles are
/// too few to fill the GPU, K is split ([`k_splits`]).
pub const DECODE_TILED_GEMM: TiledGemm = TiledGemm {
    bm: 64,
    bn: 128,
    warps_m: 2,
    warps_n: 4,
    bk: 32,
    stages: 4,
    min_blocks: 2,
    group: 1,
};

/// What a decode GEMM runs above 16 rows (up to 16 the 16-row skinny GEMMs run).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeGemm {
    /// The 64-row skinny GEMM (`gemm_skinny.cu`), the tiles of 64 × 16.
    Skinny,
    /// The tiled GEMM on this tile, split over K where its tiles are few ([`k_splits`]).
    Tiled(TiledGemm),
}

/// The decode GEMM that ships above 16 rows.
pub const DECODE_GEMM: DecodeGemm = DecodeGemm::Tiled(DECODE_TILED_GEMM);

/// What the decode GEMM sweep (`glm5_decode_gemm_variants_are_timed`) times besides
/// [`DECODE_GEMM`]: the skinny GEMM it replaced, 64-column tiles on 4 warps at four blocks an SM
/// (twice the tiles, so fewer splits; a 6-stage ring), and 256-column tiles at one block an SM
/// (x read once for 256 weight columns).
pub const DECODE_GEMM_VARIANTS: [DecodeGemm; 3] = [
    DecodeGemm::Skinny,
    DecodeGemm::Tiled(TiledGemm {
        bn: 64,
        warps_n: 2,
        stages: 6,
        min_blocks: 4,
        ..DECODE_TILED_GEMM
    }),
    DecodeGemm::Tiled(TiledGemm {
        bn: 256,
        stages: 3,
        min_blocks: 1,
        ..DECODE_TILED_GEMM
    }),
];

/// K steps a split takes at least, so that its ring's fill and the partial sums it stores and
/// the reduce reads stay small against its weight bytes (8 steps of 32 on a 128-column tile:
/// 64 KiB of weight for 32 KiB of f32 partial sums).
const MIN_SPLIT_STEPS: u64 = 8;

/// The ways K of a tiled GEMM of `tiles` output tiles (one row tile) and `steps` K steps is
/// split at `per_sm` blocks an SM on `target`: the most for which every block is resident at
/// once (no second wave to wait for), each split at least [`MIN_SPLIT_STEPS`]; one where the
/// tiles alone fill the GPU. GLM-5 at 64 rows on an H200 (264 slots): o_proj's 48 tiles of 512
/// steps split 5 ways, the dense MLP's gate 96 tiles 2 ways, the lm_head's 1210 tiles not at all.
pub fn k_splits(tiles: u64, steps: u64, per_sm: u64, target: Target) -> u64 {
    let slots = u64::from(target.sm_count()) * per_sm.max(1);
    (slots / tiles.max(1)).min(steps / MIN_SPLIT_STEPS).max(1)
}

const fn tiled(v: TiledGemm) -> GemmTile {
    GemmTile {
        template: TILED_TEMPLATE,
        rows: v.bm,
        cols: v.bn,
        shared: 0,
        dynamic: true,
        params: &[],
        tiled: Some(v),
    }
}

const TILED_TEMPLATE: &str = "gemm_mma";

/// bf16 on the tensor cores for a few rows: 64 × 16 tiles, split-K over 8 warps, two chunks of
/// weight loads in flight per warp (`gemm_skinny.cu`).
const SKINNY_GEMM: GemmTile = GemmTile {
    template: "gemm_skinny",
    rows: 64,
    cols: 16,
    shared: 8 * 32 * 32 * 4,
    dynamic: false,
    params: &[
        ("depth", 2),
        ("mt", 4),
        ("nt", 2),
        ("prefetch", 0),
        ("warps_k", 8),
    ],
    tiled: None,
};

/// The skinny GEMM whose blocks walk the tiles of a persistent grid ([`persistent_blocks`]).
const PERSISTENT_SKINNY: &str = "gemm_skinny_persistent";

/// The same for at most 16 rows (a decode batch of up to 16, a prefill's last rows): one row
/// tile, so a quarter of the accumulators. ptxas gave the 64-row kernel 115 registers on sm_90a
/// (two blocks an SM), and every GLM-5 decode projection but the lm_head reached only 50-66% of
/// the copy roofline on an H200 (tests/gpu/results/2026-12-01l/gemm.md). This one keeps three
/// chunks in flight per warp at three blocks an SM, x a chunk ahead and 256-byte L2 prefetches.
/// In two sweeps on an H200 of every variant of depth, blocks an SM and prefetch
/// (tests/gpu/results/2026-12-01q, calls A and C), it was the fastest or within 1 µs of it on
/// o_proj, the dense MLP, the shared expert's down projection and the lm_head at 1 and 8 rows,
/// 86–103% of the copy bandwidth; four chunks at two blocks won one sweep at 8 rows and lost the
/// other by up to 20%. Prefetching won on every shape.
const SKINNY_GEMM_16: GemmTile = GemmTile {
    template: "gemm_skinny",
    rows: 16,
    cols: 16,
    shared: 8 * 8 * 32 * 4,
    dynamic: false,
    params: &[
        ("depth", 3),
        ("min_blocks", 3),
        ("mt", 1),
        ("nt", 2),
        ("prefetch", 256),
        ("warps_k", 8),
    ],
    tiled: None,
};

/// The 16-column tile on a persistent grid (`gemm_skinny_persistent.cu`), for a short K (at most
/// 64 chunks of 32) over more than two waves of [`SKINNY_GEMM_16`]'s tiles: GLM-5's q_b_proj
/// (16384 × 2048). A block per tile streams only 16 columns × K (64 KB at K = 2048) and then
/// drains its ring, reduces and exits, so that shape stayed near 75% of the copy bandwidth
/// whatever the ring's depth (tests/gpu/results/2026-12-01q, call D); a persistent block refills
/// its ring from its next tile before reducing this one. In the sweep on an H200
/// (tests/gpu/results/2026-12-01r, call 1) four chunks at two blocks an SM took q_b_proj from
/// 21.4 to 19.0 µs at one row (82.5% of the copy bandwidth) and from 23.0 to 20.2 at eight; where
/// the tiles fit about one wave (o_proj, the shared expert's down projection) or K is long, the
/// block per tile stayed faster.
const SKINNY_GEMM_16_STREAMED: GemmTile = GemmTile {
    template: PERSISTENT_SKINNY,
    params: &[
        ("depth", 4),
        ("min_blocks", 2),
        ("mt", 1),
        ("nt", 2),
        ("prefetch", 256),
        ("warps_k", 8),
    ],
    ..SKINNY_GEMM_16
};

/// The 16-row one for a narrow weight: 8 columns a block, so twice the blocks. Four chunks in
/// flight: in the same sweep the indexer's wq_b (4096 × 2048) took 7.2 µs against 9.6 with six
/// chunks (at four blocks an SM against three), and the fused q_a projection and the shared
/// expert were within 1 µs of their best variants. Four blocks an SM (64 registers) now spill
/// on sm_90a, so three. It keeps the narrow weights of more than 16 chunks whose tiles fit
/// neither [`SKINNY_GEMM_16_NARROW_DEEP`]'s wave nor [`SKINNY_GEMM_16_ONE_WAVE`]'s (the fused
/// q_a projection on an H200).
const SKINNY_GEMM_16_NARROW: GemmTile = GemmTile {
    template: "gemm_skinny",
    rows: 16,
    cols: 8,
    shared: 8 * 4 * 32 * 4,
    dynamic: false,
    params: &[
        ("depth", 4),
        ("min_blocks", 3),
        ("mt", 1),
        ("nt", 1),
        ("prefetch", 256),
        ("warps_k", 8),
    ],
    tiled: None,
};

/// The narrow tile with twice the chunks in flight at two blocks an SM, for a narrow weight whose
/// 8-column tiles all fit in one wave at two blocks an SM: each SM then holds at most two blocks
/// and nothing refills it, so a block's own bytes in flight set the SM's. In two sweeps on an
/// H200 (tests/gpu/results/2026-12-01r, calls 1 and 3) the shared expert's gate and up
/// projections (2048 × 6144: 256 tiles, 264 slots) took 8.5–8.6 µs against 10.2 at one row and
/// 10.1–10.2 against 11.4–11.5 at eight; the fused q_a projection (2784 × 6144: 348 tiles, a
/// second wave at two blocks an SM) took 13.6 against 12.0, and keeps [`SKINNY_GEMM_16_NARROW`].
const SKINNY_GEMM_16_NARROW_DEEP: GemmTile = GemmTile {
    params: &[
        ("depth", 8),
        ("min_blocks", 2),
        ("mt", 1),
        ("nt", 1),
        ("prefetch", 256),
        ("warps_k", 8),
    ],
    ..SKINNY_GEMM_16_NARROW
};

/// The 16-row one for a short K (at most 8 chunks of 32: GLM-5's per-head q_absorbed, K = 192):
/// each warp takes all of K for its own 16 columns, all of its chunks in flight at once, a
/// block 128 columns at two blocks an SM. The tile it replaces (8 columns a warp, four chunks in
/// flight, three blocks an SM) took 6.3 µs for q_absorbed's 12.6 MB on an H200 against 5.0 at
/// four blocks (tests/gpu/results/2026-12-01s, call 1): its 512 blocks are 1.3 waves at three
/// blocks an SM and one at four, and a block's time is a DRAM round trip or two whatever its
/// size, so the waves set the time. Here the 256 blocks are one wave at two blocks an SM (264
/// slots on an H200), and every SM has all its bytes (2 × 48 KiB) in flight from the start
/// instead of a block's first four of six chunks. Measured in the sweep
/// (`glm5_skinny_gemm_variants_are_timed`, tests/gpu/results/2026-12-01t, call B): 5.1 µs at
/// one row and 5.3 at eight, against 6.4 and 6.6 for the old tile and torch.matmul's 6.1 and
/// 6.2; the old tile at four blocks an SM took 5.0 and 5.1 but spills on sm_90a.
const SKINNY_GEMM_16_SHORT_K: GemmTile = GemmTile {
    template: "gemm_skinny",
    rows: 16,
    cols: 128,
    shared: 8 * 8 * 32 * 4,
    dynamic: false,
    params: &[
        ("depth", 8),
        ("min_blocks", 2),
        ("mt", 1),
        ("nt", 2),
        ("prefetch", 256),
        ("warps_k", 1),
    ],
    tiled: None,
};

/// The same for K up to 16 chunks (the per-head attn product, K = 512): each warp takes all of
/// K for its own 8 columns, 10 of its 16 chunks in flight; a block 64 columns at two blocks an
/// SM, so attn's 256 blocks are one wave (264 slots on an H200) with 80 KiB in flight an SM, of
/// its 127 KiB share. Ten is the deepest ring without spills on both sm_90a and sm_120 at two
/// blocks an SM for attn and the dense prefill's kv_b_proj (K = 512, 28672 columns): ptxas
/// gives the kernel up to all 128 registers from depth 10, and 11, 12, 13 and 16 spill on one
/// of them for one of those shapes, as do 16 columns on two warps at eight chunks each (one warp
/// on K makes every chunk's bounds a constant). The tile it replaces (two warps on K, four of
/// each one's eight chunks in flight, four blocks an SM: 512 blocks, 64 KiB an SM) took 7.4 µs
/// at one row against torch.matmul's 6.8 (tests/gpu/results/2026-12-01s, call 1). In the
/// sweep of tests/gpu/results/2026-12-01t, call B: 7.2 µs at one row and 7.7 at eight (the old
/// tile 7.3 and 7.5, torch.matmul 7.0 and 7.1); sixteen chunks in flight took 6.6 and 7.1 but
/// spill on sm_120.
const SKINNY_GEMM_16_MID_K: GemmTile = GemmTile {
    template: "gemm_skinny",
    rows: 16,
    cols: 64,
    shared: 8 * 4 * 32 * 4,
    dynamic: false,
    params: &[
        ("depth", 10),
        ("min_blocks", 2),
        ("mt", 1),
        ("nt", 1),
        ("prefetch", 256),
        ("warps_k", 1),
    ],
    tiled: None,
};

/// The 16-column tile with all of K in flight (at most 64 chunks: eight a warp) at two blocks
/// an SM, for a weight whose 16-column tiles fit one wave of them: the indexer's wq_b (4096 ×
/// 2048: 256 tiles, 264 slots on an H200), 128 KiB in flight an SM, all of its share. It took
/// the narrow 8-column tile (512 blocks: 1.3 waves at three blocks an SM, 64 KiB in flight an
/// SM) 8.4 µs at one row and 9.5 at eight, torch.matmul 7.7 and 7.3; four blocks an SM (one
/// wave) 7.2 and 7.8 (tests/gpu/results/2026-12-01s, call 1). In the sweep of
/// tests/gpu/results/2026-12-01t, call B: 7.5 µs at one row and 7.6 at eight (the old tile 8.4
/// and 9.5, four blocks an SM 7.2 and 7.7; torch.matmul 7.9 and 7.5). A narrow weight of a
/// longer K whose 8-column tiles would spill past one wave takes it too, by the same arithmetic:
/// the shared expert's fused gate/up (4096 × 6144, 256 tiles) keeps a third of K in flight,
/// still 128 KiB an SM, against the narrow tile's 512 blocks in 1.3 waves: 15.1 µs at one row
/// and 16.4 at eight against the narrow tile's 17.9 and 19.5 (the sweep of
/// tests/gpu/results/2026-12-01u, call B).
const SKINNY_GEMM_16_ONE_WAVE: GemmTile = GemmTile {
    params: &[
        ("depth", 8),
        ("min_blocks", 2),
        ("mt", 1),
        ("nt", 2),
        ("prefetch", 256),
        ("warps_k", 8),
    ],
    ..SKINNY_GEMM_16
};

/// Most bytes of x a 16-row skinny GEMM block stages in shared memory (`gemm_x_stage.cuh`): with
/// its partial sums beside them a block stays under half of SM120's 99 KiB, so the two blocks an
/// SM that the one-wave and persistent tiles run at still fit.
const SKINNY_X_STAGE_BYTES: u64 = 34 * 1024;

/// The rows of x a 16-row skinny GEMM of reduction length `k` stages in shared memory: the
/// whole 16-row tile where it fits [`SKINNY_X_STAGE_BYTES`], else 8 (a decode batch of up to 8;
/// more rows take the kernel's loads from global memory), else none (K past 2048: GLM-5's long
/// projections, which [`with_x_ahead`] serves instead).
pub fn skinny_x_rows(k: u64) -> Option<u64> {
    [16, 8]
        .into_iter()
        .find(|rows| rows * skinny_x_row(k) * 2 <= SKINNY_X_STAGE_BYTES)
}

/// Elements of a staged row of x: K padded as `gemm_x_stage.cuh` pads it, so that a row starts
/// 16 banks after the one before.
fn skinny_x_row(k: u64) -> u64 {
    k + 2 * ((48 - k / 2 % 32) % 32)
}

/// Kernel `k`, a 16-row skinny GEMM (`gemm_skinny.cu` with one row tile, or
/// `gemm_skinny_persistent.cu`), with its block's rows of x staged in shared memory
/// ([`skinny_x_rows`]) and at most the blocks an SM that SM120's shared memory then holds, or
/// `None` where its K is too long or it is no such kernel. A variant the skinny sweep
/// (`glm5_skinny_gemm_variants_are_timed`) times beside the shipped kernels.
pub fn with_x_staged(k: &Kernel) -> Option<Kernel> {
    let param = |name: &str| k.params.get(name).and_then(|v| v.parse::<u64>().ok());
    let one_row_tile = match k.template.as_str() {
        "gemm_skinny" => param("mt") == Some(1),
        PERSISTENT_SKINNY => true,
        _ => false,
    };
    let kk = param("k")?;
    let rows = skinny_x_rows(kk).filter(|_| one_row_tile)?;
    let mut staged = k.clone();
    staged.params.insert("x_rows".to_string(), rows.to_string());
    staged.shared_bytes += (rows * skinny_x_row(kk) * 2) as u32;
    // A tile asking for more blocks an SM than SM120's shared memory then holds asks for those
    // (and gets their registers).
    let fit = Target::Sm120.blocks_fitting_shared_memory(staged.shared_bytes.into());
    if param("min_blocks").is_some_and(|b| b > fit) {
        staged
            .params
            .insert("min_blocks".to_string(), fit.to_string());
    }
    Some(staged)
}

/// Chunks of x that [`with_x_ahead`] loads ahead of the MMAs: three puts ptxas's x loads beside
/// the ring's weight loads in every GLM-5 tile of K past 2048 on sm_90a, with no more registers
/// than one (`gemm_skinny.cu`'s XA).
const SKINNY_X_AHEAD: u64 = 3;

/// Kernel `k`, a 16-row skinny GEMM of one row tile (`gemm_skinny.cu`) whose K is too long to
/// stage x ([`skinny_x_rows`]), with x's fragments loaded [`SKINNY_X_AHEAD`] chunks ahead of the
/// MMAs instead of one, or `None` for any other kernel. A variant the skinny sweep times beside
/// the shipped kernels, as it does [`with_x_staged`] where K allows staging.
pub fn with_x_ahead(k: &Kernel) -> Option<Kernel> {
    let param = |name: &str| k.params.get(name).and_then(|v| v.parse::<u64>().ok());
    let long_k = param("k").is_some_and(|kk| skinny_x_rows(kk).is_none());
    if k.template != "gemm_skinny" || param("mt") != Some(1) || !long_k {
        return None;
    }
    let mut ahead = k.clone();
    ahead
        .params
        .insert("x_ahead".to_string(), SKINNY_X_AHEAD.to_string());
    Some(ahead)
}

/// Columns (over all heads) below which a weight is narrow and takes [`SKINNY_GEMM_16_NARROW`]
/// or [`SIMT_GEMV_SPLIT`]: 16-column tiles would give fewer than two blocks an SM on the target
/// with the most SMs (188).
pub fn narrow_weight_columns() -> u64 {
    let sms = Target::ALL.iter().map(|t| t.sm_count()).max().unwrap_or(0);
    2 * u64::from(sms) * 16
}

/// Blocks of a persistent grid for `tiles` tiles at `blocks_per_sm` blocks an SM: every block
/// resident at once, and the tiles shared evenly, ⌈tiles / blocks⌉ each, with no more blocks
/// than that share needs, so that all of them finish together instead of some walking one tile
/// more (q_b_proj's 1024 tiles on an H200's 3 × 132 slots: 342 blocks of 3 tiles, not 396 of
/// 2 or 3). Fewer tiles than slots: a block each.
pub fn persistent_blocks(tiles: u64, blocks_per_sm: u64, target: Target) -> u64 {
    let slots = u64::from(target.sm_count()) * blocks_per_sm.max(1);
    tiles.div_ceil(tiles.div_ceil(slots).max(1))
}

/// SIMT for a few rows, any dtype: 8 rows × 16 columns, one warp per column pair, K split over
/// the lanes (`gemv.cu`).
const SIMT_GEMV: GemmTile = GemmTile {
    template: "gemv",
    rows: 8,
    cols: 16,
    shared: 0,
    dynamic: false,
    params: &[("split", 1)],
    tiled: None,
};

/// The same for a narrow weight: the block's 8 warps split K for one column pair, so a weight of
/// N columns gets N / 2 blocks instead of N / 16 (`gemv.cu`).
const SIMT_GEMV_SPLIT: GemmTile = GemmTile {
    template: "gemv",
    rows: 8,
    cols: 2,
    shared: 0,
    dynamic: false,
    params: &[("split", 8)],
    tiled: None,
};

/// A weight's output columns over all its heads (every axis but K), where they are constant.
fn weight_columns(w: &TensorRef) -> Option<u64> {
    w.shape[..w.shape.len() - 1]
        .iter()
        .map(|d| d.as_const().map(|c| c as u64))
        .product()
}

fn is_narrow(w: &TensorRef) -> bool {
    weight_columns(w).is_some_and(|c| c < narrow_weight_columns())
}

/// Whether a GEMM's rows can be many: a prefill's tokens (the symbol `s`) or a whole context
/// (`t`: a dense prefill expands every cached latent through `kv_b_proj`, which on the 64-row
/// skinny kernel took 2.64 ms for 4096 rows of GLM-5 on an H200, 13.6× torch.matmul).
fn many_rows(rows: &Poly) -> bool {
    rows.symbols().any(|s| s == "s" || s == "t")
}

/// Which GEMM computes `y = x · wᵀ`. Many rows ([`many_rows`]) take a tiled kernel, everything
/// else (a decode's batch, the prefill's last rows) a skinny one; both
/// on the tensor cores where the operands are bf16, K is a multiple of 8 and rows are 16-byte
/// aligned, else (f32 validation runs, the f32 router) in f32 FMA.
fn gemm_tile(
    x: &TensorRef,
    w: &TensorRef,
    xl: &Lead,
    x_head: &Poly,
    k: u64,
    tiled_gemm: Option<TiledGemm>,
) -> GemmTile {
    let bf16 = x.dtype == DType::BF16 && w.dtype == DType::BF16;
    let aligned = [&xl.row_stride, &xl.outer_stride, x_head]
        .iter()
        .all(|s| s.divisible_by(8))
        && x.offset_bytes.divisible_by(16);
    let tensor_cores = bf16 && aligned && k.is_multiple_of(8);
    match (tensor_cores, many_rows(&xl.rows)) {
        (true, true) => tiled(tiled_gemm.unwrap_or_else(|| shipped_tiled_gemm(k))),
        (true, false) => SKINNY_GEMM,
        (false, true) => SIMT_GEMM,
        (false, false) if is_narrow(w) => SIMT_GEMV_SPLIT,
        (false, false) => SIMT_GEMV,
    }
}

/// Rows up to which the 16-row skinny GEMM runs (its tile). In a prefill it replaces the tiled
/// GEMM there: measured on an H200 (tests/gpu/README.md), at 1 and 8 rows the tiled kernel's
/// 128-row tiles leave most of the GPU idle (GLM-5's o_proj: 261 us against the skinny kernel's
/// 100), while at 64 rows neither wins everywhere. In a decode it replaces the 64-row tiled one
/// ([`DECODE_GEMM`]).
const NARROW_GEMM_ROWS: i64 = 16;

/// `matmul`, `matmul.heads` (`heads`: one weight matrix per head, x and y `[.., H, d]`) and
/// `matmul.rope` (`rope`: a rotation of some columns at the row's position, as an epilogue). On
/// the tensor cores a node gets two kernels and the row count at run time picks: the 16-row
/// skinny one for up to 16 rows, and above that the tiled one (a prefill: 128-row tiles; a decode
/// batch: [`DECODE_GEMM`], a 64-row tile split over K where its tiles are few, which is two
/// launches).
fn gemm(cx: &NodeCtx, heads: bool, rope: Option<&RopeColumns>) -> Result<Lowering, String> {
    let (wide, rows) = matmul(cx, heads, rope, None, None, None)?;
    let template = wide.spec.template;
    if template != TILED_TEMPLATE && template != SKINNY_GEMM.template {
        return Ok(Lowering::Launch(wide));
    }
    let wide_sources = cx.sources.take();
    let w = &cx.operands[1];
    // More 16-column tiles than two waves at three blocks an SM.
    let sms = u64::from(cx.target.sm_count());
    let many_tiles = weight_columns(w).is_some_and(|c| c.div_ceil(16) > 2 * 3 * sms);
    // Narrow 8-column tiles that fit one wave at two blocks an SM.
    let one_deep_wave = weight_columns(w).is_some_and(|c| c.div_ceil(8) <= 2 * sms);
    // 16-column tiles that do.
    let one_wave = weight_columns(w).is_some_and(|c| c.div_ceil(16) <= 2 * sms);
    // Narrow 8-column tiles past one wave at three blocks an SM.
    let narrow_spills = weight_columns(w).is_some_and(|c| c.div_ceil(8) > 3 * sms);
    // A few rows' time is the weight's bytes over the bytes an SM has in flight, plus a DRAM
    // round trip or two a wave, so a weight that fits one wave gets a tile that puts all of it
    // (or most, at 9–16 chunks) in flight from the start. The short-K, mid-K and one-wave tiles
    // are predictions from that arithmetic, each beside the tile it replaced in
    // `glm5_skinny_gemm_variants_are_timed`; the rest are that sweep's winners on an H200
    // (tests/gpu/results/2026-12-01r and 2026-12-01s).
    let narrow_tile = match const_dim(w, w.shape.len() - 1, "the weight")?.div_ceil(32) {
        0..=8 => SKINNY_GEMM_16_SHORT_K,
        9..=16 => SKINNY_GEMM_16_MID_K,
        _ if is_narrow(w) && one_deep_wave => SKINNY_GEMM_16_NARROW_DEEP,
        17..=64 if one_wave => SKINNY_GEMM_16_ONE_WAVE,
        // The wq_b case at any K: the shared expert's fused gate/up (4096 × 6144) would be 512
        // narrow blocks, 1.3 waves on an H200.
        _ if is_narrow(w) && narrow_spills && one_wave => SKINNY_GEMM_16_ONE_WAVE,
        _ if is_narrow(w) => SKINNY_GEMM_16_NARROW,
        17..=64 if many_tiles => SKINNY_GEMM_16_STREAMED,
        _ => SKINNY_GEMM_16,
    };
    let (mut narrow, _) = matmul(cx, heads, rope, Some(narrow_tile), None, None)?;
    let narrow_sources = cx.sources.take();
    // A row count known to fit the narrow tile (the prefill's last-position lm_head) needs no
    // wide kernel beside it.
    if rows.as_const().is_some_and(|r| r <= NARROW_GEMM_ROWS) {
        cx.sources.replace(narrow_sources);
        return Ok(Lowering::Launch(narrow));
    }
    let mut wide = match cx.decode_gemm {
        DecodeGemm::Tiled(t) if template == SKINNY_GEMM.template => {
            split_tiled(cx, heads, rope, t)?
        }
        _ => vec![(wide, wide_sources)],
    };
    narrow.when = Some(Guard::at_most(rows.clone(), NARROW_GEMM_ROWS));
    for (launch, _) in &mut wide {
        launch.when = Some(Guard::above(rows.clone(), NARROW_GEMM_ROWS));
    }
    wide.insert(0, (narrow, narrow_sources));
    Ok(Lowering::Launches(wide))
}

/// One launch of a tiled GEMM split `splits` ways over K (`gemm_mma.cu`): the partial sums of
/// every split into `partials`, or (`reduce`) their sum through the epilogue.
#[derive(Clone, Copy)]
struct SplitK {
    splits: u64,
    reduce: bool,
    partials: Scratch,
}

/// The tiled GEMM on tile `t` for the node, split over K as [`k_splits`] says: one launch, or the
/// partial and the reduce launches with a scratch buffer of f32 partial sums between them (a
/// tile's splits × 64 × 128 floats a row tile).
fn split_tiled(
    cx: &NodeCtx,
    heads: bool,
    rope: Option<&RopeColumns>,
    t: TiledGemm,
) -> Result<Vec<(Planned, Vec<Source>)>, String> {
    let (x, w) = (&cx.operands[0], &cx.operands[1]);
    let rank = w.shape.len();
    let (k, n) = (
        const_dim(w, rank - 1, "the weight")?,
        const_dim(w, rank - 2, "the weight")?,
    );
    let h = if heads {
        const_dim(w, 0, "the weight")?
    } else {
        1
    };
    let tiles = permuted_columns(n, rope).div_ceil(t.bn) * h;
    let splits = k_splits(tiles, k.div_ceil(t.bk), t.min_blocks, cx.target);
    if splits == 1 {
        let (whole, _) = matmul(cx, heads, rope, Some(tiled(t)), None, None)?;
        return Ok(vec![(whole, cx.sources.take())]);
    }
    // Whole row tiles: at most rows + bm - 1 rows.
    let rows = lead(x, if heads { 2 } else { 1 }, "x")?.rows;
    let partials = cx.scratch(
        DType::F32,
        rows.add(&Poly::constant(t.bm as i64 - 1))
            .scale((tiles * splits * t.bn) as i64),
    );
    let mut launches = Vec::new();
    for reduce in [false, true] {
        let split = SplitK {
            splits,
            reduce,
            partials,
        };
        let (launch, _) = matmul(cx, heads, rope, Some(tiled(t)), None, Some(split))?;
        launches.push((launch, cx.sources.take()));
    }
    Ok(launches)
}

/// The columns a GEMM's tiles walk: `n`, or under rope each block of `period` columns padded to
/// an even width (see gemm_head.cuh).
fn permuted_columns(n: u64, rope: Option<&RopeColumns>) -> u64 {
    match rope {
        Some(r) if r.period > 0 => n / r.period * (r.period + r.period % 2),
        _ => n,
    }
}

/// One GEMM kernel for the node (`tile`, or the one [`gemm_tile`] picks) and its row count.
/// With `argmax` (`matmul.argmax`) it stores no output: its epilogue folds each row's logits
/// into that scratch buffer's per-row slot (see `gemm_argmax.cu`). With `split` (a tiled tile)
/// it is one of the two launches of a GEMM split over K.
fn matmul(
    cx: &NodeCtx,
    heads: bool,
    rope: Option<&RopeColumns>,
    tile: Option<GemmTile>,
    argmax: Option<Scratch>,
    split: Option<SplitK>,
) -> Result<(Planned, Poly), String> {
    let (y, x, w) = (&cx.outputs[0], &cx.operands[0], &cx.operands[1]);
    if !w.is_contiguous() {
        return Err(format!("the weight is not contiguous ({w})"));
    }
    let keep = if heads { 2 } else { 1 };
    let xl = lead(x, keep, "x")?;
    let (y_rows, y_row) = match argmax {
        Some(_) => (y.shape[0].clone(), Poly::zero()),
        None => plain_rows(y, keep, "the output")?,
    };
    let (k, n) = (
        const_dim(w, w.shape.len() - 1, "the weight")?,
        const_dim(w, w.shape.len() - 2, "the weight")?,
    );
    let (h, x_head, y_head) = if heads {
        let rank = x.shape.len();
        (
            const_dim(w, 0, "the weight")?,
            x.strides[rank - 2].clone(),
            y.strides[y.shape.len() - 2].clone(),
        )
    } else {
        (1, Poly::zero(), Poly::zero())
    };
    if y_rows != xl.rows {
        return Err(format!("x has {} rows, the output {y_rows}", xl.rows));
    }
    let tile = tile.unwrap_or_else(|| gemm_tile(x, w, &xl, &x_head, k, cx.tiled_gemm));
    // A matmul whose x is narrower than its weight (a folded widening cast) loads each in its
    // own dtype, which only the SIMT kernels do; gemm_tile picks them for anything but bf16.
    let simt = tile.template == SIMT_GEMV.template || tile.template == SIMT_GEMM.template;
    if x.dtype != w.dtype && !simt {
        return Err(format!(
            "x is {} and the weight {}: the {} kernel takes one dtype",
            x.dtype, w.dtype, tile.template
        ));
    }
    let mut cols = n;
    // Under argmax the logits are rounded to the dtype the unfused matmul stores them in.
    let y_dtype = match argmax {
        Some(_) => x.dtype,
        None => y.dtype,
    };
    let (threads, shared) = match tile.tiled {
        Some(v) => (v.threads(), v.shared_bytes(y_dtype)),
        None => (256, tile.shared),
    };
    let shared = match argmax {
        Some(_) => shared + tile.rows as u32 * 8,
        None => shared,
    };
    let mut b = Builder::new(tile.template, threads)
        .param("op", cx.node.op.name())
        .param("k", k)
        .param("n", n)
        .param("heads", h)
        .param("rope", rope.is_some())
        .dtype("y_t", y_dtype)?
        .dtype("x_t", x.dtype)?
        .dtype("w_t", w.dtype)?
        .shared(shared, tile.dynamic);
    if argmax.is_some() {
        b = b.param("argmax", true);
    }
    let tiled_params = tile.tiled.map(|t| t.params());
    for (k, v) in tile.params.iter().chain(tiled_params.iter().flatten()) {
        b = b.param(k, v);
    }
    if tile.tiled.is_some() {
        let (splits, part) = match split {
            None => (1, "whole"),
            Some(s) => (s.splits, if s.reduce { "reduce" } else { "partial" }),
        };
        b = b.param("splits", splits).param("part", part);
    }
    if tile.template == SIMT_GEMV.template {
        let k_poly = Poly::constant(k as i64);
        let v = vector_width(
            k,
            &[
                (x, &xl.row_stride),
                (x, &xl.outer_stride),
                (x, &x_head),
                (w, &k_poly),
            ],
        );
        b = b.param("vec", v);
    }
    let mut args = match argmax {
        Some(best) => vec![cx.scratch_ptr("best", best)],
        None => vec![cx.ptr("y", y), int("y_row", y_row), int("y_head", y_head)],
    };
    args.extend([
        cx.ptr("x", x),
        int("x_outer", xl.outer_stride),
        int("x_row", xl.row_stride),
        int("x_inner_rows", xl.inner),
        int("x_head", x_head),
        cx.ptr("w", w),
    ]);
    if let Some(s) = split {
        args.push(cx.scratch_ptr("partials", s.partials));
    }
    if let Some(r) = rope {
        let fits = r.period > 0
            && n % r.period == 0
            && r.start < r.end
            && r.end <= r.period
            && (r.end - r.start) % 2 == 0;
        if !fits {
            return Err(format!(
                "rope columns {}..{} of every {} do not fit {n} columns",
                r.start, r.end, r.period
            ));
        }
        if cx.max_context > ROPE_POSITIONS {
            return Err(format!(
                "a context of {} is past the {ROPE_POSITIONS} positions the GEMMs' f32 rope \
                 angle is checked for (gemm_head.cuh's rotate2): lower --max-context",
                cx.max_context
            ));
        }
        let positions = &cx.operands[2];
        positions_ok(positions)?;
        let freqs: Vec<String> = inv_freq(r.theta, r.end - r.start)
            .iter()
            .map(|f| format!("{f:e}"))
            .collect();
        cols = permuted_columns(n, rope);
        b = b
            .param("period", r.period)
            .param("start", r.start)
            .param("end", r.end)
            .param("half", (r.end - r.start) / 2)
            .param("interleaved", r.interleaved)
            .param("theta", r.theta)
            .param("inv_freq", freqs.join(", "));
        let per_position = Poly::product(&x.shape[1..x.shape.len() - 1]);
        args.push(cx.ptr("positions", positions));
        args.push(int("rows_per_position", per_position));
    }
    args.push(int("rows", xl.rows.clone()));
    // Whole row tiles times the column tiles of every head (times the splits, in a partial
    // kernel), or the persistent grid for one row tile (the 16-row tiles' rows): its blocks walk
    // every tile, so more rows still compute.
    let splits = match split {
        Some(s) if !s.reduce => s.splits,
        _ => 1,
    };
    let col_tiles = cols.div_ceil(tile.cols) * h * splits;
    let grid = if tile.template == PERSISTENT_SKINNY {
        let per_sm = tile
            .params
            .iter()
            .find_map(|&(k, v)| (k == "min_blocks").then_some(v))
            .unwrap_or(1);
        GridDim::fixed(persistent_blocks(col_tiles, per_sm, cx.target))
    } else {
        GridDim {
            work: xl
                .rows
                .add(&Poly::constant(tile.rows as i64 - 1))
                .scale(col_tiles as i64),
            per_block: tile.rows,
        }
    };
    Ok((b.planned(grid, args), xl.rows))
}

/// Threads of `matmul.argmax`'s init and finish kernels, one per row.
const ARGMAX_THREADS: u32 = 64;

/// `matmul.argmax`: three launches (`gemm_argmax.cu` says why they give `sample.argmax` of the
/// unfused logits): clear one 64-bit slot per row of a scratch buffer, run the GEMM the unfused
/// `matmul` of these rows would run with the argmax epilogue, which folds its logits into the
/// slots, and turn each slot into the token. Any row count takes the few-row GEMMs (the skinny
/// one on the tensor cores, else the SIMT GEMV): their tiles are narrow in columns, which keeps
/// a block's share of a row small, and a greedy build has one row per sequence.
fn gemm_argmax(cx: &NodeCtx) -> Result<Lowering, String> {
    let (out, x, w) = (&cx.outputs[0], &cx.operands[0], &cx.operands[1]);
    if out.dtype != DType::I64 || !out.is_contiguous() {
        return Err(format!("the tokens must be contiguous i64 ({out})"));
    }
    let n = const_dim(w, 0, "the weight")?;
    if n > i32::MAX as u64 {
        return Err(format!(
            "{n} columns: the kernels hold a column in an int (at most 2^31 - 1)"
        ));
    }
    let rows = out.shape[0].clone();
    let best = cx.scratch(DType::I64, rows.clone());
    let xl = lead(x, 1, "x")?;
    let k = const_dim(w, 1, "the weight")?;
    let tile = match gemm_tile(x, w, &xl, &Poly::zero(), k, cx.tiled_gemm).template {
        t if t == SKINNY_GEMM.template || t == TILED_TEMPLATE => SKINNY_GEMM,
        _ => SIMT_GEMV,
    };
    let stage = |stage: &str| {
        Builder::new("gemm_argmax", ARGMAX_THREADS)
            .param("op", cx.node.op.name())
            .param("stage", stage)
    };
    let grid = GridDim {
        work: rows.clone(),
        per_block: ARGMAX_THREADS as u64,
    };
    let init = stage("init").planned(
        grid.clone(),
        vec![cx.scratch_ptr("best", best), int("rows", rows.clone())],
    );
    let init_sources = cx.sources.take();
    let (gemm, _) = matmul(cx, false, None, Some(tile), Some(best), None)?;
    let gemm_sources = cx.sources.take();
    let finish = stage("finish").planned(
        grid,
        vec![
            cx.ptr("out", out),
            cx.scratch_ptr("best", best),
            int("rows", rows),
        ],
    );
    Ok(Lowering::Launches(vec![
        (init, init_sources),
        (gemm, gemm_sources),
        (finish, cx.sources.take()),
    ]))
}

/// A key/value cache operand `[(b,) t, (H,) d]`: (sequence, key, head) strides and `d`.
struct Cache {
    seq: Poly,
    key: Poly,
    head: Poly,
    dim: u64,
}

fn cache_operand(r: &TensorRef, per_head: bool, what: &str) -> Result<Cache, String> {
    let tail = if per_head { 2 } else { 1 };
    let rank = r.shape.len();
    if (rank != tail + 1 && rank != tail + 2) || r.strides[rank - 1] != Poly::constant(1) {
        return Err(format!(
            "{what} is not a [(b,) t, {}d] cache ({r})",
            if per_head { "H, " } else { "" }
        ));
    }
    let t_axis = rank - tail - 1;
    Ok(Cache {
        seq: if t_axis == 1 {
            r.strides[0].clone()
        } else {
            Poly::zero()
        },
        key: r.strides[t_axis].clone(),
        head: if per_head {
            r.strides[rank - 2].clone()
        } else {
            Poly::zero()
        },
        dim: const_dim(r, rank - 1, what)?,
    })
}

/// `[n, H, d]` queries or outputs: (row, head) strides and `d`.
fn per_head_rows(r: &TensorRef, what: &str) -> Result<(Poly, Poly, u64), String> {
    if r.shape.len() != 3 || r.strides[2] != Poly::constant(1) {
        return Err(format!("{what} is not [n, H, d] with contiguous d ({r})"));
    }
    Ok((
        r.strides[0].clone(),
        r.strides[1].clone(),
        const_dim(r, 2, what)?,
    ))
}

/// `mla.attend` (expanded: per-head keys and values) and `mla.attend.absorbed` (the latent is
/// both the first key part and the value).
fn attention(
    cx: &NodeCtx,
    absorbed: bool,
    sparse: bool,
    dense_until: u64,
    scale: f64,
) -> Result<Lowering, String> {
    // The expanded dense form takes the flash kernel where it fits; otherwise the baseline's
    // launch says why not.
    let why_not_flash = if absorbed {
        None
    } else if sparse {
        Some("the flash kernel is dense; top-k attention runs here".to_string())
    } else {
        match prefill::flash_attention(cx, scale) {
            Ok(l) => return Ok(l),
            Err(why) => {
                cx.sources.borrow_mut().clear();
                Some(why)
            }
        }
    };
    let ops = cx.operands;
    let out = &cx.outputs[0];
    let (q1, q2) = (&ops[0], &ops[1]);
    let (k1, k2, v, positions) = if absorbed {
        (&ops[2], &ops[3], &ops[2], &ops[4])
    } else {
        (&ops[2], &ops[3], &ops[4], &ops[5])
    };
    let (q1_row, q1_head, d1) = per_head_rows(q1, "the first query part")?;
    let (q2_row, q2_head, d2) = per_head_rows(q2, "the rope query part")?;
    let (out_row, out_head, dv) = per_head_rows(out, "the output")?;
    let heads = const_dim(q1, 1, "the first query part")?;
    let kc1 = cache_operand(k1, !absorbed, "the first key part")?;
    let kc2 = cache_operand(k2, false, "the rope key")?;
    let vc = cache_operand(v, !absorbed, "the values")?;
    if kc1.dim != d1 || kc2.dim != d2 || vc.dim != dv {
        return Err(format!(
            "query dims {d1}+{d2} and output {dv} do not match the caches ({}+{}, {})",
            kc1.dim, kc2.dim, vc.dim
        ));
    }
    positions_ok(positions)?;
    let note = if absorbed {
        match mla_refusal(cx, heads) {
            None => return mla_absorbed(cx, sparse, dense_until, scale, heads),
            Some(why) => Some(format!("baseline: {why}")),
        }
    } else {
        why_not_flash.map(|why| format!("baseline: {why}"))
    };
    let items = dv.div_ceil(ATTENTION_THREADS as u64).max(1);
    let words = cx.max_context.div_ceil(32).max(1);
    let mut shared = (d1 + d2 + 32) * 4;
    let mut b = Builder::new("attention", ATTENTION_THREADS)
        .param("op", cx.node.op.name())
        .param("d1", d1)
        .param("d2", d2)
        .param("dv", dv)
        .param("heads", heads)
        .param("items", items)
        .param("sparse", sparse)
        .dtype("out_t", out.dtype)?
        .dtype("q1_t", q1.dtype)?
        .dtype("q2_t", q2.dtype)?
        .dtype("k1_t", k1.dtype)?
        .dtype("k2_t", k2.dtype)?
        .dtype("v_t", v.dtype)?;
    let mut args = vec![
        cx.ptr("out", out),
        int("out_row", out_row),
        int("out_head", out_head),
        cx.ptr("q1", q1),
        int("q1_row", q1_row),
        int("q1_head", q1_head),
        cx.ptr("q2", q2),
        int("q2_row", q2_row),
        int("q2_head", q2_head),
        cx.ptr("k1", k1),
        int("k1_seq", kc1.seq),
        int("k1_key", kc1.key),
        int("k1_head", kc1.head),
        cx.ptr("k2", k2),
        int("k2_seq", kc2.seq),
        int("k2_key", kc2.key),
        cx.ptr("v", v),
        int("v_seq", vc.seq),
        int("v_key", vc.key),
        int("v_head", vc.head),
        cx.ptr("positions", positions),
    ];
    if sparse {
        let topk = &ops[if absorbed { 5 } else { 6 }];
        if topk.dtype != DType::I64 {
            return Err(format!("the top-k operand is not i64 ({topk})"));
        }
        let (_, topk_row) = plain_rows(topk, 1, "the top-k operand")?;
        shared += words * 4;
        b = b
            .param(
                "topk",
                const_dim(topk, topk.shape.len() - 1, "the top-k operand")?,
            )
            .param("dense_until", dense_until)
            .param("words", words);
        args.push(cx.ptr("topk", topk));
        args.push(int("topk_row", topk_row));
    }
    if shared > STATIC_SHARED_LIMIT {
        return Err(format!(
            "the baseline's query and key bitmap take {shared} bytes of static shared memory (at most {STATIC_SHARED_LIMIT}): a context of {} is too long for it",
            cx.max_context
        ));
    }
    let rows = out.shape[0].clone();
    args.push(int("rows", rows.clone()));
    args.push(float("scale", scale));
    let b = cx.slotted(b, &mut args, &[("k1", k1), ("k2", k2), ("v", v)]);
    let mut planned = b
        .shared(shared as u32, false)
        .planned(GridDim::one_block_each(rows.scale(heads as i64)), args);
    planned.note = note;
    Ok(Lowering::Launch(planned))
}

/// Latent and rope widths the tensor-core absorbed attention is tiled for (GLM-5's, and
/// DeepSeek-V3's).
const MLA_LATENT: u64 = 512;
const MLA_ROPE: u64 = 64;
/// Heads per block of it: one m16 MMA tile of query rows (`mla_absorbed.cu` says why), or, where
/// the heads come in multiples of [`MLA_WIDE_HEAD_TILE`], that many with the queries in
/// registers (`mla_absorbed_wide.cu`).
const MLA_HEAD_TILE: u64 = 16;
const MLA_WIDE_HEAD_TILE: u64 = 32;
const MLA_THREADS: u32 = 256;
/// Its dynamic shared memory: the Q tile, two key stages, the score halves and probabilities
/// (rows padded by 8 bf16), three floats and two visibility flags per row or key.
const MLA_SHARED: u32 =
    (16 * 584 * 2 + 2 * 32 * 584 * 2 + 2 * 16 * 32 * 4 + 16 * 40 * 2 + 3 * 16 * 4 + 2 * 32) as u32;
/// The wide kernel's: two key stages, four score partials and the probabilities of 32 heads
/// (rows padded by 8), three floats per head and two visibility flags per key.
const MLA_WIDE_SHARED: u32 =
    (2 * 32 * 584 * 2 + 4 * 32 * 40 * 4 + 32 * 40 * 2 + 3 * 32 * 4 + 2 * 32) as u32;
/// Heads per block of [`MlaKernel::Wide64`] (`mla_absorbed_wide64.cu`).
const MLA_WIDE64_HEAD_TILE: u64 = 64;
/// The 64-head kernel's: two key stages, two score halves of 64 heads (swizzled, unpadded), the
/// probabilities (rows padded by 8), three floats per head and two visibility flags per key.
const MLA_WIDE64_SHARED: u32 =
    (2 * 32 * 584 * 2 + 2 * 64 * 32 * 4 + 64 * 40 * 2 + 3 * 64 * 4 + 2 * 32) as u32;
/// Most context splits per (row, head group): beyond it the merge reads more than a split
/// computes at GLM-5's top-k of 2048.
const MLA_MAX_SPLITS: u64 = 128;
/// The fewest 32-key tiles a split of the sparse attention holds. A top-k list bounds a row's
/// keys (GLM-5: 2048, 64 tiles), so at batch 1 the 64 splits of 16 heads that fill the GPU held
/// one tile each and the merge read 64 partial results a head. On an H200
/// (tests/gpu/results/2026-12-01s, call 2), batch 1 of 64 heads past 2048 keys took 15.5–16.0
/// µs at one tile a split, 11.1–11.8 at two, 11.9–12.7 at four, 17.8–18.8 at eight; 8 heads
/// 9.4–10.5 at one, 9.0–10.1 at two.
pub const MLA_SPARSE_TILES_PER_SPLIT: u64 = 2;

/// A kernel choice that a GPU sweep times in place of the shipped one
/// ([`crate::lower::lower_module_with`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Variant {
    /// Every tiled tensor-core GEMM of many rows takes this tile ([`shipped_tiled_gemm`]
    /// otherwise).
    TiledGemm(TiledGemm),
    /// Every decode GEMM above 16 rows runs this ([`DECODE_GEMM`] otherwise).
    DecodeGemm(DecodeGemm),
    /// Every split of the sparse absorbed attention holds at least this many 32-key tiles
    /// ([`MLA_SPARSE_TILES_PER_SPLIT`] otherwise).
    MlaTilesPerSplit(u64),
    /// The absorbed attention takes this kernel in place of the shipped choice.
    Mla(MlaKernel),
    /// Every bf16 `moe.down` at decode takes this form, whatever its token count
    /// ([`shipped_moe_down`] otherwise).
    MoeDown(MoeDown),
    /// The decode indexer kernel's key ring ([`SCORE_DECODE_RING`] otherwise).
    ScoreRing(ScoreRing),
}
/// An absorbed-attention kernel that a GPU sweep times in place of the shipped choice (the wide
/// kernel, `mla_absorbed_wide.cu`, where a block's 32 heads divide the heads; `mla_absorbed.cu`
/// otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlaKernel {
    /// 16 heads a block (`mla_absorbed.cu`) also where the wide kernel's 32 would fit.
    Narrow,
    /// The two-stage ring of `mla_absorbed.cu` and the wide kernel is filled by bulk copies
    /// (`cp.async.bulk`, the TMA that SM90 and SM120 share), warp 0's lane k copying key k's
    /// latent and rope rows onto the stage's mbarrier, instead of 9 cp.async of 16 bytes in each
    /// of the 256 threads ([`MLA_BULK_BARRIERS`] more bytes of shared memory).
    BulkCopy,
    /// 64 heads a block (`mla_absorbed_wide64.cu`) where they divide the heads: one block reads a
    /// row's keys for all of GLM-5's heads, with twice the wide kernel's registers a thread.
    Wide64,
}

/// The bulk-copy ring's two mbarriers ([`MlaKernel::BulkCopy`]).
const MLA_BULK_BARRIERS: u32 = 16;

/// Threads of the merge kernel: 4 of the 512 latent columns each.
const MLA_MERGE_THREADS: u32 = 128;

/// The split count for a range of row counts, `above < rows ≤ at_most`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitTier {
    pub above: Option<u64>,
    pub at_most: Option<u64>,
    pub splits: u64,
}

/// The context splits of the tensor-core absorbed attention by row count, for `groups` blocks
/// of heads per row and at most `max_rows` rows, on a GPU that holds `resident` of its blocks
/// at once: each row count takes the most splits (a power of two, at most `max_splits`, itself
/// at most [`MLA_MAX_SPLITS`]) whose blocks still fit one wave, so s splits take the rows in
/// (resident / (2s · groups), resident / (s · groups)], and one split every count past one
/// wave unsplit. A block is latency bound on its tiles, so a second wave of shorter blocks is no
/// faster than one of longer ones, and splitting adds the merge: GLM-5's 64 heads at batch 64 ×
/// 32k (128 blocks of 32 heads on an H100's 132 SMs, one block an SM) took 142.9 µs unsplit
/// against 160.4 in two splits and a merge (tests/gpu/results/2026-12-07c).
pub fn mla_split_tiers(
    groups: u64,
    max_rows: u64,
    max_splits: u64,
    resident: u64,
) -> Vec<SplitTier> {
    let mut splits = 1 << max_splits.clamp(1, MLA_MAX_SPLITS).ilog2();
    let mut tiers: Vec<SplitTier> = Vec::new();
    let mut above = 0u64;
    loop {
        let at_most = (splits > 1).then(|| resident / (splits * groups));
        // A split count that fits no row count past the last range's takes none.
        if at_most.is_none_or(|hi| hi > above) {
            tiers.push(SplitTier {
                above: (above > 0).then_some(above),
                at_most,
                splits,
            });
            match at_most {
                Some(hi) if hi < max_rows => above = hi,
                _ => break,
            }
        }
        splits /= 2;
    }
    tiers
}

/// Blocks of the absorbed attention a target holds at once: the wide kernels one an SM (their
/// registers a thread), the others as many as the SM's shared memory holds of their `shared`
/// bytes.
fn mla_resident_blocks(target: Target, wide: bool, shared: u32) -> u64 {
    let per_sm = if wide {
        1
    } else {
        target.blocks_fitting_shared_memory(shared.into())
    };
    u64::from(target.sm_count()) * per_sm
}

/// Why the tensor-core absorbed attention cannot take this node, if it cannot: it is tiled for
/// bf16, 512 + 64 dims, 16 heads per block (or all of 16 or fewer), 16-byte aligned rows.
fn mla_refusal(cx: &NodeCtx, heads: u64) -> Option<String> {
    let ops = cx.operands;
    let out = &cx.outputs[0];
    let tensors = [
        (&ops[0], "q_abs"),
        (&ops[1], "q_pe"),
        (&ops[2], "the latent cache"),
        (&ops[3], "the rope cache"),
        (out, "the output"),
    ];
    for (t, what) in tensors {
        let strides: Vec<&Poly> = t.strides[..t.strides.len() - 1].iter().collect();
        if let Err(why) = bf16_vectors(t, &strides, what) {
            return Some(why);
        }
    }
    let width = |t: &TensorRef| t.shape.last().and_then(|d| d.as_const());
    if width(&ops[0]) != Some(MLA_LATENT as i64) || width(&ops[1]) != Some(MLA_ROPE as i64) {
        return Some(format!(
            "the tensor-core kernel is tiled for {MLA_LATENT} latent + {MLA_ROPE} rope dims, not {} + {}",
            ops[0].shape.last().map(|d| d.to_string()).unwrap_or_default(),
            ops[1].shape.last().map(|d| d.to_string()).unwrap_or_default()
        ));
    }
    if heads > MLA_HEAD_TILE && !heads.is_multiple_of(MLA_HEAD_TILE) {
        return Some(format!(
            "the tensor-core kernel takes {MLA_HEAD_TILE} heads a block (or all of at most {MLA_HEAD_TILE}), not {heads}"
        ));
    }
    if out.shape[0].eval(cx.limits).is_none() {
        return Some(format!(
            "the row count {} is not bound by the limits",
            out.shape[0]
        ));
    }
    None
}

/// `mla.attend.absorbed` on the tensor cores (`mla_absorbed.cu`): for each range of row counts
/// ([`mla_split_tiers`]) one guarded launch with its split count, followed, where it splits,
/// by the merge (`mla_merge.cu`) of the partial results, which go through a scratch buffer
/// sized for the largest split range.
fn mla_absorbed(
    cx: &NodeCtx,
    sparse: bool,
    dense_until: u64,
    scale: f64,
    heads: u64,
) -> Result<Lowering, String> {
    let ops = cx.operands;
    let out = &cx.outputs[0];
    let (q1, q2, k1, k2, positions) = (&ops[0], &ops[1], &ops[2], &ops[3], &ops[4]);
    let (q1_row, q1_head, _) = per_head_rows(q1, "the first query part")?;
    let (q2_row, q2_head, _) = per_head_rows(q2, "the rope query part")?;
    let (out_row, out_head, _) = per_head_rows(out, "the output")?;
    let kc1 = cache_operand(k1, false, "the latent cache")?;
    let kc2 = cache_operand(k2, false, "the rope key")?;
    let rows = out.shape[0].clone();
    let max_rows = rows
        .eval(cx.limits)
        .ok_or_else(|| format!("the row count {rows} is not bound by the limits"))?
        .max(1) as u64;
    let wide64 =
        cx.mla_kernel == Some(MlaKernel::Wide64) && heads.is_multiple_of(MLA_WIDE64_HEAD_TILE);
    let wide = wide64
        || cx.mla_kernel != Some(MlaKernel::Narrow) && heads.is_multiple_of(MLA_WIDE_HEAD_TILE);
    let (template, shared, head_tile) = if wide64 {
        (
            "mla_absorbed_wide64",
            MLA_WIDE64_SHARED,
            MLA_WIDE64_HEAD_TILE,
        )
    } else if wide {
        ("mla_absorbed_wide", MLA_WIDE_SHARED, MLA_WIDE_HEAD_TILE)
    } else {
        ("mla_absorbed", MLA_SHARED, heads.min(MLA_HEAD_TILE))
    };
    let groups = heads / head_tile;
    let bulk = cx.mla_kernel == Some(MlaKernel::BulkCopy);
    let shared = shared + if bulk { MLA_BULK_BARRIERS } else { 0 };
    let topk = if sparse {
        let topk = &ops[5];
        if topk.dtype != DType::I64 {
            return Err(format!("the top-k operand is not i64 ({topk})"));
        }
        let (_, topk_row) = plain_rows(topk, 1, "the top-k operand")?;
        Some((
            topk,
            topk_row,
            const_dim(topk, topk.shape.len() - 1, "the top-k operand")?,
        ))
    } else {
        None
    };
    // A sparse row sees at most its top-k list, or every key up to dense_until.
    let max_splits = match &topk {
        Some((_, _, k)) => {
            let tiles = (*k).max(dense_until).div_ceil(32);
            let most = (tiles / cx.mla_tiles_per_split.max(1)).max(1);
            1 << most.ilog2()
        }
        None => MLA_MAX_SPLITS,
    };
    let tiers = mla_split_tiers(
        groups,
        max_rows,
        max_splits,
        mla_resident_blocks(cx.target, wide, shared),
    );
    let part_elements = tiers
        .iter()
        .filter(|t| t.splits > 1)
        .map(|t| t.at_most.unwrap_or(max_rows).min(max_rows) * t.splits * heads * (MLA_LATENT + 1))
        .max();
    let part = part_elements.map(|n| cx.scratch(DType::F32, Poly::constant(n as i64)));
    let spec = |template: &'static str, threads: u32| {
        Builder::new(template, threads)
            .param("op", cx.node.op.name())
            .param("heads", heads)
    };
    let single = tiers.len() == 1;
    let mut launches = Vec::new();
    for tier in &tiers {
        let when = (!single).then(|| Guard {
            rows: rows.clone(),
            above: tier.above.map(|a| a as i64),
            at_most: tier.at_most.map(|m| m as i64),
        });
        let direct = tier.splits == 1;
        let mut b = spec(template, MLA_THREADS).shared(shared, true);
        if !wide {
            b = b.param("hg", head_tile);
        }
        b = b
            .param("sparse", sparse)
            .param("direct", direct)
            .param("bulk", bulk);
        let mut args = if direct {
            vec![
                cx.ptr("out", out),
                int("out_row", out_row.clone()),
                int("out_head", out_head.clone()),
            ]
        } else {
            vec![cx.scratch_ptr("part", part.expect("a scratch for the split ranges"))]
        };
        args.extend([
            cx.ptr("q1", q1),
            int("q1_row", q1_row.clone()),
            int("q1_head", q1_head.clone()),
            cx.ptr("q2", q2),
            int("q2_row", q2_row.clone()),
            int("q2_head", q2_head.clone()),
            cx.ptr("k1", k1),
            int("k1_seq", kc1.seq.clone()),
            int("k1_key", kc1.key.clone()),
            cx.ptr("k2", k2),
            int("k2_seq", kc2.seq.clone()),
            int("k2_key", kc2.key.clone()),
            cx.ptr("positions", positions),
        ]);
        if let Some((topk, topk_row, k)) = &topk {
            b = b.param("topk", k).param("dense_until", dense_until);
            args.push(cx.ptr("topk", topk));
            args.push(int("topk_row", topk_row.clone()));
        }
        args.extend([
            int("rows", rows.clone()),
            int("splits", Poly::constant(tier.splits as i64)),
            float("scale_log2", scale * std::f64::consts::LOG2_E),
        ]);
        let b = cx.slotted(b, &mut args, &[("k1", k1), ("k2", k2)]);
        let grid = GridDim::one_block_each(rows.scale((groups * tier.splits) as i64));
        let mut planned = b.planned(grid, args);
        planned.when = when.clone();
        launches.push((planned, cx.sources.take()));
        if !direct {
            let args = vec![
                cx.ptr("out", out),
                int("out_row", out_row.clone()),
                int("out_head", out_head.clone()),
                cx.scratch_ptr("part", part.expect("a scratch for the split ranges")),
                cx.ptr("positions", positions),
                int("rows", rows.clone()),
                int("splits", Poly::constant(tier.splits as i64)),
            ];
            let grid = GridDim::one_block_each(rows.scale(heads as i64));
            // The merge counts a row's keys as the first kernel does (mla_split.cuh).
            let mut merge = spec("mla_merge", MLA_MERGE_THREADS).param("sparse", sparse);
            if let Some((_, _, k)) = &topk {
                merge = merge.param("topk", k).param("dense_until", dense_until);
            }
            let mut planned = merge.planned(grid, args);
            planned.when = when;
            launches.push((planned, cx.sources.take()));
        }
    }
    Ok(Lowering::Launches(launches))
}

/// `dsa.score`'s operands as both of its kernels address them.
pub(super) struct ScoreOperands<'a> {
    out: &'a TensorRef,
    q: &'a TensorRef,
    w: &'a TensorRef,
    k: &'a TensorRef,
    positions: &'a TensorRef,
    q_row: Poly,
    q_head: Poly,
    w_row: Poly,
    /// The folded head-weight `scale` (1 when none): each kernel rounds `w · w_scale` to w's
    /// dtype, as `elementwise.cu` stores a scale (the factor passed as f32).
    w_scale: f64,
    rows: Poly,
    out_row: Poly,
    /// Keys per row of the scores.
    keys: Poly,
    kc: Cache,
    heads: u64,
    dim: u64,
}

impl ScoreOperands<'_> {
    /// The pointer and stride arguments both kernels take, in their order, and `b` marked for
    /// a prefill's cache slot.
    fn args(&self, cx: &NodeCtx, b: Builder) -> (Builder, Vec<Arg>) {
        let mut args = vec![
            cx.ptr("out", self.out),
            int("out_row", self.out_row.clone()),
            cx.ptr("q", self.q),
            int("q_row", self.q_row.clone()),
            int("q_head", self.q_head.clone()),
            cx.ptr("w", self.w),
            int("w_row", self.w_row.clone()),
            float("w_scale", self.w_scale),
            cx.ptr("k", self.k),
            int("k_seq", self.kc.seq.clone()),
            int("k_key", self.kc.key.clone()),
            cx.ptr("positions", self.positions),
            int("rows", self.rows.clone()),
            int("keys", self.keys.clone()),
        ];
        let b = cx.slotted(b, &mut args, &[("k", self.k)]);
        (b, args)
    }
}

pub(super) fn score_operands<'a>(
    cx: &'a NodeCtx,
    w_scale: f64,
) -> Result<ScoreOperands<'a>, String> {
    let out = &cx.outputs[0];
    let (q, w, k, positions) = (
        &cx.operands[0],
        &cx.operands[1],
        &cx.operands[2],
        &cx.operands[3],
    );
    let (q_row, q_head, dim) = per_head_rows(q, "q")?;
    let heads = const_dim(q, 1, "q")?;
    let (_, w_row) = plain_rows(w, 1, "w")?;
    let (rows, out_row) = plain_rows(out, 1, "the scores")?;
    let kc = cache_operand(k, false, "k")?;
    if kc.dim != dim {
        return Err(format!("q has {dim} dims, the keys {}", kc.dim));
    }
    if out.dtype != DType::F32 {
        return Err(format!("scores must be f32 ({out})"));
    }
    positions_ok(positions)?;
    let keys = out.shape[1].clone();
    Ok(ScoreOperands {
        out,
        q,
        w,
        k,
        positions,
        q_row,
        q_head,
        w_row,
        w_scale,
        rows,
        out_row,
        keys,
        kc,
        heads,
        dim,
    })
}

fn dsa_score(cx: &NodeCtx, w_scale: f64) -> Result<Lowering, String> {
    // bf16 operands in tiles of 16 take the tensor cores; the f32 validation mode and other
    // shapes keep the SIMT kernel below, whose launch says why.
    let why_not_mma = match prefill::mma_score(cx, w_scale) {
        Ok(l) => return Ok(l),
        Err(why) => why,
    };
    cx.sources.borrow_mut().clear();
    let o = score_operands(cx, w_scale)?;
    let (heads, dim) = (o.heads, o.dim);
    let shared = heads * (dim + 1) * 4 + heads * 4;
    if shared > STATIC_SHARED_LIMIT {
        return Err(format!(
            "{heads} indexer heads of {dim} take {shared} bytes of shared memory (at most {STATIC_SHARED_LIMIT})"
        ));
    }
    let b = Builder::new("dsa_score", 256)
        .param("heads", heads)
        .param("dim", dim)
        .param("tile", SCORE_TILE)
        .dtype("q_t", o.q.dtype)?
        .dtype("w_t", o.w.dtype)?
        .dtype("k_t", o.k.dtype)?
        .shared(shared as u32, false);
    let (b, args) = o.args(cx, b);
    let mut planned = b.planned(
        GridDim {
            work: o
                .rows
                .mul(&o.keys.add(&Poly::constant(SCORE_TILE as i64 - 1))),
            per_block: SCORE_TILE,
        },
        args,
    );
    planned.note = Some(format!("baseline: {why_not_mma}"));
    Ok(Lowering::Launch(planned))
}

/// Keys of a row `dsa.topk` holds on chip: 32 a thread of its 1024, a 32k context's row; its
/// template says why.
const TOPK_MAX_SLOTS: u64 = 32;

/// Of those, how many a thread keeps in registers; the rest sit in shared memory (4 KiB a slot,
/// 23 at most next to the histogram within SM120's 99 KiB).
const TOPK_HELD: u64 = 9;

/// At most how many keys of the bin holding the k-th best score `dsa.topk` ranks by comparing
/// each with all the others (64 comparisons a thread); a fuller bin takes radix passes.
const TOPK_RANKED: u64 = 256;

/// `dsa.topk`'s register and total slots (keys a thread) for rows of up to `max_context` keys,
/// and whether a row may be longer. Such rows read the rest from L2 in each pass, and those
/// loads take a register a thread, so they hold one slot less in each place (SM120 would spill).
fn topk_slots(max_context: u64) -> (u64, u64, bool) {
    let slots = max_context.div_ceil(1024).max(1);
    if slots > TOPK_MAX_SLOTS {
        (TOPK_MAX_SLOTS - 1, TOPK_HELD - 1, true)
    } else {
        (slots, slots.min(TOPK_HELD), false)
    }
}

/// Threads of a block of `dsa.topk`'s split path (`dsa_topk_split.cu`).
const TOPK_SPLIT_THREADS: u64 = 512;

/// Blocks a row of the split path: each holds n / 16 of a row's keys (one a thread at 8k).
const TOPK_SPLIT_PARTS: u64 = 16;

/// Keys a thread at most on the split path (in registers), so a context of up to
/// 16 × 16 × 512 = 131072 keys; a longer one takes the one-block kernel.
const TOPK_SPLIT_MAX_SLOTS: u64 = 16;

/// Blocks the split path's grid may have at most: its blocks wait for each other, so all must be
/// resident at once, and at two blocks an SM (512 threads, at most 64 registers) 128 of them need
/// 64 SMs, under half of either target's.
const TOPK_SPLIT_BLOCKS: u64 = 128;

/// `dsa.topk`'s split path for rows of up to `max_context` keys: keys a thread and the most rows
/// it takes (the grid's bound over the parts), or None where the one-block kernel serves every
/// row (no row has more than k keys, or the row would not fit the registers).
fn topk_split(max_context: u64, k: u64) -> Option<(u64, u64)> {
    let slots = max_context.div_ceil(TOPK_SPLIT_PARTS * TOPK_SPLIT_THREADS);
    (max_context > k && slots <= TOPK_SPLIT_MAX_SLOTS)
        .then_some((slots, TOPK_SPLIT_BLOCKS / TOPK_SPLIT_PARTS))
}

/// Words of the split path's scratch a row (`dsa_topk_split.cu`'s layout, which checks it): 32
/// of counters, the row's histogram and four radix passes' (1024 each), each part's bounds and
/// counts (two words each, in whole 32-word lines), its above-counts (1024) and its keys.
fn topk_split_row_words(slots: u64) -> u64 {
    let pairs = (2 * TOPK_SPLIT_PARTS).next_multiple_of(32);
    32 + 5 * 1024 + 2 * pairs + TOPK_SPLIT_PARTS * (1024 + slots * TOPK_SPLIT_THREADS)
}

/// `dsa.topk`: one block of 1024 threads a row (`dsa_topk.cu`), and for few rows the split path
/// (`dsa_topk_split.cu`: 16 blocks a row in two launches through a scratch buffer), the row
/// count at run time choosing where both exist.
fn dsa_topk(cx: &NodeCtx, k: u64) -> Result<Lowering, String> {
    let (out, scores, positions) = (&cx.outputs[0], &cx.operands[0], &cx.operands[1]);
    if scores.dtype != DType::F32 || out.dtype != DType::I64 {
        return Err(format!(
            "scores must be f32 and the result i64 ({scores}, {out})"
        ));
    }
    positions_ok(positions)?;
    let (rows, scores_row) = plain_rows(scores, 1, "the scores")?;
    let (_, out_row) = plain_rows(out, 1, "the result")?;
    if k == 0 || k > i32::MAX as u64 {
        return Err(format!("k = {k}"));
    }
    // The kernel counts keys in 32-bit ints, a chunk past the context included.
    if cx.max_context > 1 << 30 {
        return Err(format!("a context of {} keys", cx.max_context));
    }
    let (slots, held, tail) = topk_slots(cx.max_context);
    let b = Builder::new("dsa_topk", 1024)
        .param("k", k)
        .param("slots", slots)
        .param("held", held)
        .param("tail", tail)
        .param("ranked", TOPK_RANKED);
    // The histogram, the ranked candidates and the spilled slots (a few more words are static).
    let b = b.shared(
        ((1024 + TOPK_RANKED + (slots - held) * 1024) * 4) as u32,
        true,
    );
    let args = vec![
        cx.ptr("out", out),
        int("out_row", out_row.clone()),
        cx.ptr("scores", scores),
        int("scores_row", scores_row.clone()),
        cx.ptr("positions", positions),
        int("rows", rows.clone()),
    ];
    let mut whole = b.planned(GridDim::one_block_each(rows.clone()), args);
    let Some((slots, most_rows)) = topk_split(cx.max_context, k) else {
        return Ok(Lowering::Launch(whole));
    };
    let whole_sources = cx.sources.take();
    let max_rows = rows
        .eval(cx.limits)
        .ok_or_else(|| format!("the row count {rows} is not bound by the limits"))?
        .max(1) as u64;
    let row_words = topk_split_row_words(slots);
    let scratch = cx.scratch(
        DType::F32,
        Poly::constant((max_rows.min(most_rows) * row_words) as i64),
    );
    let stage = |stage: &str| {
        Builder::new("dsa_topk_split", TOPK_SPLIT_THREADS as u32)
            .param("stage", stage)
            .param("k", k)
            .param("parts", TOPK_SPLIT_PARTS)
            .param("slots", slots)
            .param("row_words", row_words)
    };
    let grid = GridDim::one_block_each(rows.scale(TOPK_SPLIT_PARTS as i64));
    // Each warp's least and greatest order-key.
    let mut bounds = stage("bounds").shared(2 * 16 * 4, false).planned(
        grid.clone(),
        vec![
            cx.scratch_ptr("scratch", scratch),
            cx.ptr("scores", scores),
            int("scores_row", scores_row.clone()),
            cx.ptr("positions", positions),
            int("rows", rows.clone()),
        ],
    );
    let bounds_sources = cx.sources.take();
    // The histogram, the candidates, a count per slot and warp, the scan's sums and the pick.
    let select_shared = (1024 + 256 + slots * 16 + 32 + 3) * 4;
    let mut select = stage("select").shared(select_shared as u32, false).planned(
        grid,
        vec![
            cx.ptr("out", out),
            int("out_row", out_row),
            cx.scratch_ptr("scratch", scratch),
            cx.ptr("scores", scores),
            int("scores_row", scores_row),
            cx.ptr("positions", positions),
            int("rows", rows.clone()),
        ],
    );
    let select_sources = cx.sources.take();
    if max_rows <= most_rows {
        return Ok(Lowering::Launches(vec![
            (bounds, bounds_sources),
            (select, select_sources),
        ]));
    }
    let few = Guard::at_most(rows.clone(), most_rows as i64);
    bounds.when = Some(few.clone());
    select.when = Some(few);
    whole.when = Some(Guard::above(rows, most_rows as i64));
    Ok(Lowering::Launches(vec![
        (bounds, bounds_sources),
        (select, select_sources),
        (whole, whole_sources),
    ]))
}

fn moe_route(
    cx: &NodeCtx,
    groups: u64,
    keep: u64,
    top_k: u64,
    normalise: bool,
    scaling: f64,
) -> Result<Lowering, String> {
    let (weights, experts) = (&cx.outputs[0], &cx.outputs[1]);
    let (logits, bias) = (&cx.operands[0], &cx.operands[1]);
    let (rows, logits_row) = plain_rows(logits, 1, "the logits")?;
    let e = const_dim(logits, logits.shape.len() - 1, "the logits")?;
    if !bias.is_contiguous() {
        return Err(format!("the bias is not contiguous ({bias})"));
    }
    if groups == 0
        || e % groups != 0
        || keep == 0
        || keep > groups
        || top_k == 0
        || top_k > keep * (e / groups)
    {
        return Err(format!(
            "{e} experts in {groups} groups keeping {keep} cannot give {top_k}"
        ));
    }
    if weights.dtype != DType::F32 || experts.dtype != DType::I64 {
        return Err(format!(
            "weights must be f32 and experts i64 ({weights}, {experts})"
        ));
    }
    let (_, weights_row) = plain_rows(weights, 1, "the weights")?;
    let (_, experts_row) = plain_rows(experts, 1, "the experts")?;
    // A thread per expert, up to 1024.
    let threads = e.next_multiple_of(32).min(1024);
    let shared = 2 * e * 8 + groups * 8 + threads / 32 * 12 + top_k * 4;
    if shared > STATIC_SHARED_LIMIT {
        return Err(format!("{e} experts take {shared} bytes of shared memory"));
    }
    let b = Builder::new("moe_route", threads as u32)
        .param("experts", e)
        .param("groups", groups)
        .param("keep", keep)
        .param("top_k", top_k)
        .param("normalise", normalise)
        .param("scaling", format!("{scaling:e}"))
        .dtype("logits_t", logits.dtype)?
        .dtype("bias_t", bias.dtype)?
        .shared(shared as u32, false);
    let args = vec![
        cx.ptr("weights", weights),
        int("weights_row", weights_row),
        cx.ptr("experts", experts),
        int("experts_row", experts_row),
        cx.ptr("logits", logits),
        int("logits_row", logits_row),
        cx.ptr("bias", bias),
        int("rows", rows.clone()),
    ];
    Ok(b.launch(GridDim::one_block_each(rows), args))
}

fn moe_experts(cx: &NodeCtx) -> Result<Lowering, String> {
    let y = &cx.outputs[0];
    let [x, weights, experts, gate, up, down] = cx.operands else {
        return Err("moe.experts takes six operands".into());
    };
    let (rows, x_row) = plain_rows(x, 1, "x")?;
    let (_, y_row) = plain_rows(y, 1, "the output")?;
    let (_, weights_row) = plain_rows(weights, 1, "the weights")?;
    let (_, experts_row) = plain_rows(experts, 1, "the experts")?;
    if experts.dtype != DType::I64 {
        return Err(format!("the experts are not i64 ({experts})"));
    }
    if !(gate.is_contiguous() && up.is_contiguous() && down.is_contiguous())
        || gate.shape.len() != 3
    {
        return Err("the expert weights must be contiguous [E, I, D] / [E, D, I]".into());
    }
    let (e, inter, dim) = (
        const_dim(gate, 0, "gate")?,
        const_dim(gate, 1, "gate")?,
        const_dim(gate, 2, "gate")?,
    );
    let top_k = const_dim(weights, weights.shape.len() - 1, "the weights")?;
    // f32 first, so the f32 arrays stay aligned whatever the input's dtype.
    let shared = inter * 4 + dim * 4 + dim * x.dtype.size_bytes();
    let b = Builder::new("moe_experts", 1024)
        .param("dim", dim)
        .param("inter", inter)
        .param("top_k", top_k)
        .param("experts", e)
        .param("shared", shared)
        .dtype("y_t", y.dtype)?
        .dtype("x_t", x.dtype)?
        .dtype("w_t", weights.dtype)?
        .dtype("gate_t", gate.dtype)?
        .dtype("up_t", up.dtype)?
        .dtype("down_t", down.dtype)?
        .shared(shared as u32, true);
    let args = vec![
        cx.ptr("y", y),
        int("y_row", y_row),
        cx.ptr("x", x),
        int("x_row", x_row),
        cx.ptr("weights", weights),
        int("weights_row", weights_row),
        cx.ptr("experts", experts),
        int("experts_row", experts_row),
        cx.ptr("gate", gate),
        cx.ptr("up", up),
        cx.ptr("down", down),
        int("rows", rows.clone()),
    ];
    Ok(b.launch(GridDim::one_block_each(rows), args))
}

/// Threads of `moe.sort`'s one block; the template's chunk of pairs.
const SORT_THREADS: u32 = 1024;

fn moe_sort(cx: &NodeCtx, experts: u64) -> Result<Lowering, String> {
    let ids = &cx.operands[0];
    let [offsets, order, position] = cx.outputs else {
        return Err("moe.sort has three outputs".into());
    };
    let (rows, ids_row) = plain_rows(ids, 1, "the expert ids")?;
    let top_k = const_dim(ids, 1, "the expert ids")?;
    if [ids, offsets, order, position]
        .iter()
        .any(|t| t.dtype != DType::I64)
        || ![offsets, order, position].iter().all(|t| t.is_contiguous())
    {
        return Err("moe.sort reads i64 ids and writes contiguous i64 outputs".into());
    }
    let shared = 32 * experts * 4 + (experts + 1) * 4;
    if shared > STATIC_SHARED_LIMIT {
        return Err(format!(
            "{experts} experts take {shared} bytes of shared memory to sort (at most {STATIC_SHARED_LIMIT})"
        ));
    }
    let b = Builder::new("moe_sort", SORT_THREADS)
        .param("experts", experts)
        .param("top_k", top_k)
        .param("shared", shared)
        .shared(shared as u32, false);
    let args = vec![
        cx.ptr("offsets", offsets),
        cx.ptr("order", order),
        cx.ptr("position", position),
        cx.ptr("ids", ids),
        int("ids_row", ids_row),
        int("rows", rows),
    ];
    Ok(b.launch(GridDim::fixed(1), args))
}

/// Rows of one expert a block of the skinny grouped GEMM takes: at decode (≤ 64 tokens × 8
/// slots over 256 experts) an expert rarely has more, so its weights are read once.
const MOE_SKINNY_ROWS: u64 = 8;
/// Columns one block of the skinny grouped GEMM computes (8 warps × 2).
const MOE_SKINNY_COLS: u64 = 16;
/// Row and column tile of the tensor-core grouped GEMM (`moe_gemm_mma.cu`), its shared memory.
const MOE_MMA_TILE: u64 = 128;
const MOE_MMA_SHARED: u32 = 4 * (128 + 128) * 32 * 2;

/// How `moe.down` runs at decode in bf16 (few rows per expert).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeDown {
    /// `moe_gemm_skinny.cu`, gate/up's kernel: blocks of 16 columns, K two steps at a time.
    Skinny,
    /// `moe_down_stream.cu`: wider blocks whose warps keep a ring of weight loads in flight
    /// across their column pairs.
    Stream(MoeDownStream),
}

/// Blocks of `cols` columns, `depth` steps of K (two 16-byte loads a lane each) in flight a
/// warp, `min_blocks` blocks an SM asked of ptxas (registers held to 65536 / (256 ·
/// min_blocks)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeDownStream {
    pub cols: u64,
    pub depth: u64,
    pub min_blocks: u64,
}

impl std::fmt::Display for MoeDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MoeDown::Skinny => write!(f, "skinny {MOE_SKINNY_COLS} cols"),
            MoeDown::Stream(s) => {
                write!(f, "stream {} cols d{} b{}", s.cols, s.depth, s.min_blocks)
            }
        }
    }
}

/// The stream form that ships up to [`MOE_DOWN_STREAM_TOKENS`] tokens. At one token (GLM-5: 8
/// experts of 6144 × 2048) the skinny form's 3072 blocks of 64 KiB each paid an L2 round trip
/// for the expert, a second for its rows, a DRAM round trip before the first weight and a warp
/// reduction with nothing in flight, at 73 registers (3 blocks an SM, 48 KiB of loads in flight
/// an SM at most): 67% of the copy roofline on an H200 (Nsight Compute, tests/gpu/README.md).
/// A stream block pays that once for 64 columns and keeps four steps in flight a warp across
/// them. The MoE decode test (`glm5_moe_grouped_gemms_match_the_interpreter_and_are_timed`,
/// every form of [`MOE_DOWN_VARIANTS`] beside this one) measured on an H200 (2026-12-02, call A
/// of tests/gpu/README.md's ninth session): at one token 52.4 µs (90.5% of the copy roofline)
/// against the skinny form's 66.5, 128 columns' 60.3 and 256 columns' 51.9; at 8 tokens 349.8
/// µs (99.9%) against 465.2, 352.7 and 365.6. 64 columns are the best at 8 tokens and within 1%
/// of the best at one.
pub const MOE_DOWN: MoeDownStream = MoeDownStream {
    cols: 64,
    depth: 4,
    min_blocks: 4,
};

/// Tokens up to which `moe.down` ships [`MOE_DOWN`]; above, the skinny form, which reads an
/// expert's weights once for up to 8 of its rows where the stream form reads them once a run of
/// [`MOE_STREAM_ROWS`]. At 64 tokens (226 of GLM-5's 256 experts active, about 2.3 rows each)
/// the stream form still wins by far: 1627.0 µs (81.9% of the copy roofline) against the skinny
/// form's 2844.4 (46.8%) on an H200 (2026-12-02, call C of tests/gpu/README.md's ninth session,
/// `glm5_moe_grouped_gemms_at_64_tokens_match_the_interpreter_and_are_timed`). Past 64 tokens
/// (more rows an expert, so more runs) it is unmeasured.
pub const MOE_DOWN_STREAM_TOKENS: u64 = 64;

/// What the MoE decode test times besides [`MOE_DOWN`]: the skinny form; 128 columns a block
/// (384 blocks at one token, resident at once on an H200); 256 (192 blocks, 1.5 an SM); 256 with
/// all eight steps of GLM-5's K in flight at two blocks an SM.
pub const MOE_DOWN_VARIANTS: [MoeDown; 4] = [
    MoeDown::Skinny,
    MoeDown::Stream(MoeDownStream {
        cols: 128,
        ..MOE_DOWN
    }),
    MoeDown::Stream(MoeDownStream {
        cols: 256,
        ..MOE_DOWN
    }),
    MoeDown::Stream(MoeDownStream {
        cols: 256,
        depth: 8,
        min_blocks: 2,
    }),
];

/// The form `moe.down` ships at `tokens` tokens (bf16, at decode).
pub fn shipped_moe_down(tokens: u64) -> MoeDown {
    if tokens <= MOE_DOWN_STREAM_TOKENS {
        MoeDown::Stream(MOE_DOWN)
    } else {
        MoeDown::Skinny
    }
}

/// Rows of one expert a block of the stream form takes (their h in shared memory): at one token
/// an expert has one; at 8 (uniform routing) about one step in three has an expert with 3 of
/// the 64 routed rows, whose weights are then read twice (25 MB more than 1.5 GB). Each row
/// costs two accumulators a lane out of the 64 registers four blocks an SM leave: 4 rows
/// spilled on sm_90a.
const MOE_STREAM_ROWS: u64 = 2;
/// The most shared memory the stream form's rows may take (static shared memory ends at 48 KiB).
const MOE_STREAM_SHARED: u64 = 32 << 10;

/// The operands of a grouped expert GEMM as `moe_gemm` reads them.
struct MoeGemm<'a> {
    y: &'a TensorRef,
    x: &'a TensorRef,
    x_row: Poly,
    order: Option<&'a TensorRef>,
    offsets: &'a TensorRef,
    weights: Vec<&'a TensorRef>,
    experts: u64,
    n: u64,
    k: u64,
    top_k: u64,
    tokens: Poly,
}

impl MoeGemm<'_> {
    /// The parameters `moe_gemm_mma.cu` and `moe_gemm_skinny.cu` share.
    fn params(&self, cx: &NodeCtx, b: Builder) -> Result<Builder, String> {
        b.param("op", cx.node.op.name())
            .param("swiglu", self.order.is_some())
            .param("k", self.k)
            .param("n", self.n)
            .param("experts", self.experts)
            .param("top_k", self.top_k)
            .dtype("y_t", self.y.dtype)?
            .dtype("x_t", self.x.dtype)?
            .dtype("w_t", self.weights[0].dtype)
    }

    /// Their arguments.
    fn args(&self, cx: &NodeCtx) -> Vec<Arg> {
        let mut args = vec![
            cx.ptr("y", self.y),
            cx.ptr("x", self.x),
            int("x_row", self.x_row.clone()),
        ];
        if let Some(order) = self.order {
            args.push(cx.ptr("order", order));
        }
        args.push(cx.ptr("offsets", self.offsets));
        for (i, w) in self.weights.iter().enumerate() {
            args.push(cx.ptr(&format!("w{i}"), w));
        }
        args.push(int("tokens", self.tokens.clone()));
        args
    }

    /// Routed rows: a grid slot each.
    fn routed(&self) -> Poly {
        self.tokens.mul(&Poly::constant(self.top_k as i64))
    }

    /// `moe_gemm_skinny.cu` with `vec` elements a 16-byte load.
    fn skinny(&self, cx: &NodeCtx, vec: u64) -> Result<Planned, String> {
        let b = Builder::new("moe_gemm_skinny", 256)
            .param("rows", MOE_SKINNY_ROWS)
            .param("vec", vec);
        let tiles = self.n.div_ceil(MOE_SKINNY_COLS);
        let grid = GridDim::one_block_each(self.routed().mul(&Poly::constant(tiles as i64)));
        Ok(self.params(cx, b)?.planned(grid, self.args(cx)))
    }

    /// `moe_down_stream.cu` in form `s`. Its ring holds a whole number of rings a column pair
    /// (the largest depth up to `s.depth` dividing the pair's steps of 256 elements of K).
    fn stream(&self, cx: &NodeCtx, s: MoeDownStream) -> Result<Planned, String> {
        let steps = self.k.div_ceil(256);
        let depth = (1..=s.depth.min(steps))
            .rev()
            .find(|d| steps.is_multiple_of(*d))
            .unwrap_or(1);
        let b = Builder::new("moe_down_stream", 256)
            .param("op", cx.node.op.name())
            .param("k", self.k)
            .param("n", self.n)
            .param("experts", self.experts)
            .param("rows", MOE_STREAM_ROWS)
            .param("cols", s.cols)
            .param("depth", depth)
            .param("min_blocks", s.min_blocks)
            .dtype("y_t", self.y.dtype)?
            .shared((MOE_STREAM_ROWS * self.k * 2 + 20) as u32, false);
        let tiles = self.n.div_ceil(s.cols);
        let grid = GridDim::one_block_each(self.routed().mul(&Poly::constant(tiles as i64)));
        let args = vec![
            cx.ptr("y", self.y),
            cx.ptr("x", self.x),
            int("x_row", self.x_row.clone()),
            cx.ptr("offsets", self.offsets),
            cx.ptr("w0", self.weights[0]),
        ];
        Ok(b.planned(grid, args))
    }

    /// `moe.down` at decode in bf16: the form of the variant being timed, or the shipped one by
    /// token count ([`shipped_moe_down`]), guarded where the count is symbolic.
    fn down(&self, cx: &NodeCtx, vec: u64) -> Result<Lowering, String> {
        let form = |f: MoeDown| match f {
            MoeDown::Skinny => self.skinny(cx, vec),
            MoeDown::Stream(s) => self.stream(cx, s),
        };
        if let Some(f) = cx.moe_down {
            return Ok(Lowering::Launch(form(f)?));
        }
        if let Some(t) = self.tokens.as_const() {
            return Ok(Lowering::Launch(form(shipped_moe_down(t as u64))?));
        }
        let most = MOE_DOWN_STREAM_TOKENS as i64;
        let above = Guard::above(self.tokens.clone(), most);
        // Limits of at most that many tokens never need the other form.
        if above.holds(cx.limits) == Some(false) {
            return Ok(Lowering::Launch(form(shipped_moe_down(
                MOE_DOWN_STREAM_TOKENS,
            ))?));
        }
        let mut few = form(shipped_moe_down(MOE_DOWN_STREAM_TOKENS))?;
        few.when = Some(Guard::at_most(self.tokens.clone(), most));
        let few_sources = cx.sources.take();
        let mut many = form(shipped_moe_down(MOE_DOWN_STREAM_TOKENS + 1))?;
        many.when = Some(above);
        let many_sources = cx.sources.take();
        Ok(Lowering::Launches(vec![
            (few, few_sources),
            (many, many_sources),
        ]))
    }
}

/// `moe.gate_up` (`swiglu`: x gathered through `order`, gate and up weights) and `moe.down`:
/// the tensor-core tiled kernel for the prefill's many rows in bf16, else the skinny FMA one
/// (for `moe.down` in bf16, [`MoeGemm::down`]'s choice).
fn moe_gemm(cx: &NodeCtx, swiglu: bool) -> Result<Lowering, String> {
    let y = &cx.outputs[0];
    let (x, order, offsets, weights) = if swiglu {
        let [x, order, offsets, gate, up] = cx.operands else {
            return Err("moe.gate_up takes five operands".into());
        };
        if gate.dtype != up.dtype {
            return Err(format!("gate {gate} and up {up} differ in dtype"));
        }
        (x, Some(order), offsets, vec![gate, up])
    } else {
        let [h, offsets, down] = cx.operands else {
            return Err("moe.down takes three operands".into());
        };
        (h, None, offsets, vec![down])
    };
    let (x_rows, x_row) = plain_rows(x, 1, "x")?;
    let w = weights[0];
    let contiguous = y.is_contiguous()
        && offsets.is_contiguous()
        && order.is_none_or(|o| o.is_contiguous())
        && weights.iter().all(|w| w.is_contiguous());
    if !contiguous || w.shape.len() != 3 {
        return Err("the routed rows, offsets, order and weights must be contiguous".into());
    }
    let (experts, n, k) = (
        const_dim(w, 0, "the weights")?,
        const_dim(w, 1, "the weights")?,
        const_dim(w, 2, "the weights")?,
    );
    let g = MoeGemm {
        y,
        x,
        x_row: x_row.clone(),
        order,
        offsets,
        weights: weights.clone(),
        experts,
        n,
        k,
        top_k: const_dim(y, 1, "the routed rows")?,
        tokens: y.shape[0].clone(),
    };
    let tensor_cores = x.dtype == DType::BF16
        && w.dtype == DType::BF16
        && k.is_multiple_of(8)
        && x_row.divisible_by(8)
        && x.offset_bytes.divisible_by(16)
        && x_rows.symbols().any(|s| s == "s");
    if tensor_cores {
        let out_cols = if swiglu {
            MOE_MMA_TILE / 2
        } else {
            MOE_MMA_TILE
        };
        let n_tiles = n.div_ceil(out_cols);
        let b = Builder::new("moe_gemm_mma", 256).shared(MOE_MMA_SHARED, true);
        let grid = GridDim {
            work: g
                .routed()
                .add(&Poly::constant((MOE_MMA_TILE * (experts + 1)) as i64))
                .mul(&Poly::constant(n_tiles as i64)),
            per_block: MOE_MMA_TILE,
        };
        return Ok(g.params(cx, b)?.launch(grid, g.args(cx)));
    }
    let vec = 16 / x.dtype.size_bytes().max(w.dtype.size_bytes());
    let aligned =
        k.is_multiple_of(vec) && x_row.divisible_by(vec as i64) && x.offset_bytes.divisible_by(16);
    if !aligned {
        return Err(format!(
            "{}: K = {k} and the rows of x ({x}) must allow {vec}-element vectors",
            cx.node.op.name()
        ));
    }
    let streams = !swiglu
        && x.dtype == DType::BF16
        && w.dtype == DType::BF16
        && MOE_STREAM_ROWS * k * 2 <= MOE_STREAM_SHARED;
    if streams {
        return g.down(cx, vec);
    }
    Ok(Lowering::Launch(g.skinny(cx, vec)?))
}

/// Threads of `moe.combine`'s block per token and column slice.
const COMBINE_THREADS: u32 = 256;

fn moe_combine(cx: &NodeCtx, shared: bool) -> Result<Lowering, String> {
    let y = &cx.outputs[0];
    let (routed, position, weights) = (&cx.operands[0], &cx.operands[1], &cx.operands[2]);
    let (tokens, y_row) = plain_rows(y, 1, "the output")?;
    let (_, weights_row) = plain_rows(weights, 1, "the weights")?;
    if !(routed.is_contiguous() && position.is_contiguous()) || position.dtype != DType::I64 {
        return Err("the routed rows and positions must be contiguous, positions i64".into());
    }
    let dim = const_dim(routed, 2, "the routed rows")?;
    let top_k = const_dim(routed, 1, "the routed rows")?;
    let mut vectors: Vec<(&TensorRef, &Poly)> = vec![(y, &y_row)];
    let shared_rows = if shared {
        let s = &cx.operands[3];
        Some((s, plain_rows(s, 1, "the shared output")?.1))
    } else {
        None
    };
    if let Some((s, row)) = &shared_rows {
        vectors.push((s, row));
    }
    let routed_row = Poly::constant(dim as i64);
    vectors.push((routed, &routed_row));
    let vec = vector_width(dim, &vectors);
    let mut b = Builder::new("moe_combine", COMBINE_THREADS)
        .param("dim", dim)
        .param("top_k", top_k)
        .param("vec", vec)
        .param("shared", shared)
        .dtype("y_t", y.dtype)?
        .dtype("rows_t", routed.dtype)?;
    let mut args = vec![
        cx.ptr("y", y),
        int("y_row", y_row),
        cx.ptr("routed", routed),
        cx.ptr("position", position),
        cx.ptr("weights", weights),
        int("weights_row", weights_row),
    ];
    if let Some((s, row)) = shared_rows {
        b = b.dtype("shared_t", s.dtype)?;
        args.push(cx.ptr("shared", s));
        args.push(int("shared_row", row));
    }
    args.push(int("tokens", tokens.clone()));
    let slices = dim.div_ceil(u64::from(COMBINE_THREADS) * vec);
    Ok(b.launch(GridDim::one_block_each(tokens.scale(slices as i64)), args))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// gemm_head.cuh's `split_freqs` and `rotate2` angle, step for step in f32 (`mul_add` is the
    /// kernel's fmaf, `round_ties_even` its rintf).
    fn rope_angle_f32(position: f32, f: f64) -> f32 {
        const C1: f32 = 6.28125;
        const C2: f32 = 1.935_307_2e-3;
        const INV_TWO_PI: f32 = 0.159_154_94;
        let c3 = (std::f64::consts::TAU - 6.28125 - f64::from(C2)) as f32;
        let (hi, lo) = (f as f32, (f - f64::from(f as f32)) as f32);
        let p = position * hi;
        let n = (p * INV_TWO_PI).round_ties_even();
        let a = (-n).mul_add(C1, p);
        let a = (-n).mul_add(C2, a);
        let a = (-n).mul_add(c3, a);
        a + (position.mul_add(hi, -p) + position * lo)
    }

    #[test]
    fn rope_angle_in_f32_holds_below_rope_positions() {
        // The constants the emulation uses are the kernel's.
        let head = include_str!("../templates/gemm_head.cuh");
        for c in [
            "C1 = 6.28125f, C2 = 1.9353071795864769e-3f",
            "C3 = (float)(6.283185307179586 - 6.28125 - (double)C2), INV_TWO_PI = 0.15915494309189535f",
        ] {
            assert!(head.contains(c), "gemm_head.cuh no longer has {c}");
        }
        let tau = std::f64::consts::TAU;
        let mut worst = 0f64;
        // GLM-5's theta (1e6) and GLM-5.2's (8e6) over 64 rope dims, at every 61st position below
        // ROPE_POSITIONS and its last: the f64 angle as the interpreter computes it, against it.
        for theta in [1e6, 8e6] {
            for f in inv_freq(theta, 64) {
                for p in (0..ROPE_POSITIONS).step_by(61).chain([ROPE_POSITIONS - 1]) {
                    let exact = (p as f64 * f).rem_euclid(tau);
                    let d = (f64::from(rope_angle_f32(p as f32, f)) - exact).rem_euclid(tau);
                    worst = worst.max(d.min(tau - d));
                }
            }
        }
        // Four roundings of half an f32 ulp near π (the fmas against C2 and C3, the error terms'
        // sum and the last add) bound it by 5e-7, the size of __sincosf's own error there.
        assert!(worst < 5e-7, "the f32 angle is {worst:e} from the f64 one");
    }

    #[test]
    fn x_is_staged_where_it_fits_and_loaded_further_ahead_past_that() {
        // GLM-5's K: q_absorbed, attn, wq_b / q_b_proj / the shared expert's down projection,
        // then the long ones.
        let rows: Vec<_> = [192, 512, 2048, 6144, 12288, 16384]
            .into_iter()
            .map(skinny_x_rows)
            .collect();
        assert_eq!(rows, [Some(16), Some(16), Some(8), None, None, None]);
        // Each row starts 16 banks (64 bytes) after the one before, for K of 32 and 64 multiples.
        for k in [192, 512, 544, 2048, 2080] {
            assert_eq!(skinny_x_row(k) / 2 % 32, 16, "K = {k}");
            assert!(skinny_x_row(k) % 8 == 0 && skinny_x_row(k) >= k, "K = {k}");
        }
        // A staged kernel declares the rows with its partial sums; other kernels are not staged.
        let skinny = |template: &str, mt: &str, k: &str| Kernel {
            name: "k".into(),
            template: template.into(),
            params: BTreeMap::from([("mt".into(), mt.into()), ("k".into(), k.into())]),
            threads: 256,
            shared_bytes: 8192,
        };
        let staged = with_x_staged(&skinny("gemm_skinny", "1", "2048")).unwrap();
        assert_eq!(staged.params["x_rows"], "8");
        assert_eq!(staged.shared_bytes, 8192 + 8 * 2080 * 2);
        assert!(with_x_staged(&skinny(PERSISTENT_SKINNY, "1", "512")).is_some());
        // Three blocks an SM of 41 KiB do not fit SM120's shared memory: two do.
        let mut three = skinny("gemm_skinny", "1", "2048");
        three.params.insert("min_blocks".into(), "3".into());
        assert_eq!(with_x_staged(&three).unwrap().params["min_blocks"], "2");
        assert!(with_x_staged(&skinny("gemm_skinny", "4", "2048")).is_none());
        assert!(with_x_staged(&skinny("gemm_skinny", "1", "6144")).is_none());
        assert!(with_x_staged(&skinny("gemm_mma", "1", "2048")).is_none());
        // Past what staging takes, x is loaded further ahead instead, in gemm_skinny.cu alone.
        let ahead = with_x_ahead(&skinny("gemm_skinny", "1", "6144")).unwrap();
        assert_eq!(ahead.params["x_ahead"], "3");
        assert_eq!(ahead.shared_bytes, 8192);
        assert!(with_x_ahead(&skinny("gemm_skinny", "1", "2048")).is_none());
        assert!(with_x_ahead(&skinny("gemm_skinny", "4", "6144")).is_none());
        assert!(with_x_ahead(&skinny(PERSISTENT_SKINNY, "1", "6144")).is_none());
    }

    #[test]
    fn a_persistent_grid_is_resident_and_shares_the_tiles_evenly() {
        // q_b_proj's 1024 tiles at three blocks an SM: 3 each on an H200's 396 slots, 2 each on
        // SM120's 564.
        assert_eq!(persistent_blocks(1024, 3, Target::Sm90a), 342);
        assert_eq!(persistent_blocks(1024, 3, Target::Sm120a), 512);
        // No more tiles than slots: a block each.
        assert_eq!(persistent_blocks(384, 3, Target::Sm90a), 384);
        // The lm_head's 9680: 25 each.
        assert_eq!(persistent_blocks(9680, 3, Target::Sm90a), 388);
        for tiles in 1..2000 {
            let blocks = persistent_blocks(tiles, 3, Target::Sm90a);
            assert!(blocks <= 396);
            assert_eq!(tiles.div_ceil(blocks), tiles.div_ceil(396));
        }
    }
}
