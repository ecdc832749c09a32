//! What each op becomes: a template, its compile-time parameters, the launch shape and the
//! arguments. One function per kernel family; the kernel bodies are in `templates/*.cu`.
//!
//! Every row-wise kernel addresses its tensors as rows of contiguous elements a stride apart
//! ([`TensorRef::rows`]); the lowering only hands it tensors that have that form, so a slice of
//! a fused projection's output is read in place.

use std::collections::BTreeMap;

use glmc_ir::{DType, Node, Op};

use crate::expr::{GridDim, Poly};
use crate::layout::{Rows, TensorRef};
use crate::schedule::{Arg, ArgValue};

/// Threads per block of the one-thread-per-element kernels: enough warps to hide latency, small
/// enough that a tail block wastes little.
const ELEMENTWISE_THREADS: u32 = 256;
/// Threads per block of the row-per-block kernels (norms) before they widen for long rows.
const ROW_THREADS: u32 = 256;
/// Register-resident values per thread in a norm beyond which it takes more threads instead.
const MAX_NORM_ITEMS: u64 = 8;
/// Threads of the sampling kernels: one block per row of the vocabulary.
const SAMPLE_THREADS: u32 = 1024;
/// Candidates the top-p kernel sorts in shared memory (16 KiB): every token with probability at
/// least 1/this fits, and for a peaked distribution they hold the whole nucleus.
const NUCLEUS_CAP: u32 = 2048;

/// A kernel specialisation before it is named.
#[derive(Clone, Debug)]
pub struct Spec {
    pub template: &'static str,
    pub params: BTreeMap<String, String>,
    pub threads: u32,
    pub shared_bytes: u32,
}

/// A launch before its kernel is named.
#[derive(Clone, Debug)]
pub struct Planned {
    pub spec: Spec,
    pub grid: GridDim,
    pub args: Vec<Arg>,
}

/// What an op lowers to.
pub enum Lowering {
    Launch(Planned),
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
    /// The [`Source`] of each pointer argument made so far, in order.
    pub sources: std::cell::RefCell<Vec<Source>>,
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
    /// Neither: memory outside the arena (a cache's base).
    Other,
}

impl NodeCtx<'_> {
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

    fn shared(mut self, bytes: u32) -> Builder {
        self.spec.shared_bytes = bytes;
        self
    }

    fn launch(self, grid: GridDim, args: Vec<Arg>) -> Lowering {
        Lowering::Launch(Planned {
            spec: self.spec,
            grid,
            args,
        })
    }
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
        Op::Embed {} => embed(cx),
        Op::CacheUpdate { batched, .. } => cache_update(cx, *batched),
        Op::SampleArgmax {} => sample(cx, false),
        Op::SampleTopP {} => sample(cx, true),
        Op::Matmul {} | Op::MatmulHeads {} | Op::MatmulRope { .. } => {
            Err("GEMM kernels land with codegen II".into())
        }
        Op::MlaAttend { .. } | Op::MlaAttendAbsorbed { .. } => {
            Err("attention kernels land with codegen II".into())
        }
        Op::DsaScore {} | Op::DsaTopk { .. } => Err("indexer kernels land with codegen II".into()),
        Op::MoeRoute { .. } | Op::MoeExperts {} => Err("MoE kernels land with codegen II".into()),
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
    let mut k = Builder::new("norm", threads)
        .param("op", cx.node.op.name())
        .param("cols", cols)
        .param("vec", vec)
        .param("items", items)
        .param("threads", threads)
        .param("add", add)
        .param("layernorm", layernorm)
        .dtype("y_t", y.dtype)?
        .dtype("x_t", x.dtype)?
        .dtype("w_t", w.dtype)?
        .shared(32 * 4);
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
    Ok(k.launch(
        GridDim {
            work: y_rows.rows,
            per_block: 1,
        },
        args,
    ))
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

fn embed(cx: &NodeCtx) -> Result<Lowering, String> {
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
    ];
    Ok(k.launch(
        GridDim {
            work: y_rows.rows,
            per_block: 1,
        },
        args,
    ))
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
    let seq_stride = if batched {
        Poly::constant((cx.max_context * cols) as i64)
    } else {
        Poly::zero()
    };
    let base = TensorRef {
        shape: Vec::new(),
        strides: Vec::new(),
        ..cache.clone()
    };
    let args = vec![
        cx.ptr("cache", &base),
        int("seq_stride", seq_stride),
        int("capacity", Poly::constant(cx.max_context as i64)),
        cx.ptr("x", x),
        int("x_stride", x_rows.stride.clone()),
        cx.ptr("positions", positions),
        int("rows", x_rows.rows.clone()),
    ];
    Ok(k.launch(
        GridDim {
            work: x_rows.rows.scale((cols / vec) as i64),
            per_block: ELEMENTWISE_THREADS as u64,
        },
        args,
    ))
}

/// A copy of `src` into `dst` (same shape and dtype, any strides, rank ≤ 4).
pub fn copy(dst: &TensorRef, src: &TensorRef) -> Result<Planned, String> {
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
    let Lowering::Launch(mut planned) = Builder::new("copy", ELEMENTWISE_THREADS)
        .dtype("t", src.dtype)?
        .launch(
            GridDim {
                work: src.numel(),
                per_block: ELEMENTWISE_THREADS as u64,
            },
            Vec::new(),
        )
    else {
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
    planned.args = args;
    Ok(planned)
}

/// `sample.argmax` / `sample.top_p` over rows of logits.
fn sample(cx: &NodeCtx, top_p: bool) -> Result<Lowering, String> {
    let (out, logits) = (&cx.outputs[0], &cx.operands[0]);
    let rows = rows_of(logits, "the logits")?;
    let cols = const_cols(&rows, "the logits")?;
    let k = Builder::new("sample", SAMPLE_THREADS)
        .param("op", cx.node.op.name())
        .param("cols", cols)
        .param("threads", SAMPLE_THREADS)
        .param("top_p", top_p)
        .param("cap", NUCLEUS_CAP)
        .dtype("x_t", logits.dtype)?
        .shared(32 * 4 + SAMPLE_THREADS * 8 + 8 + if top_p { NUCLEUS_CAP * 8 + 12 } else { 0 });
    let mut args = vec![
        cx.ptr("out", out),
        cx.ptr("logits", logits),
        int("stride", rows.stride),
    ];
    if top_p {
        for (i, name) in ["temperature", "top_p", "uniform"].iter().enumerate() {
            let r = &cx.operands[i + 1];
            if r.dtype != DType::F32 || !r.is_contiguous() {
                return Err(format!("{name} must be contiguous f32"));
            }
            args.push(cx.ptr(name, r));
        }
    }
    args.push(int("rows", rows.rows.clone()));
    Ok(k.launch(
        GridDim {
            work: rows.rows,
            per_block: 1,
        },
        args,
    ))
}
