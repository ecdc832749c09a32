//! The host tensor of the reference interpreter.
//!
//! The interpreter is the oracle the compiled code is checked against, so it favours one simple
//! representation over speed: every float type is computed in f32 and every integer type in i64,
//! in a dense row-major buffer. The layout operations here are the ones weight recipes need; each
//! is a single O(n) pass that copies contiguous runs where it can and never allocates per element.

use glmc_ir::DType;

/// A dense, row-major tensor on the host.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    shape: Vec<usize>,
    data: Data,
}

/// The element buffer of a [`Tensor`]: f32 stands in for every float type, i64 for every integer
/// type, so the interpreter needs one kernel per op and element class, not one per dtype.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    I64(Vec<i64>),
}

/// Why a tensor operation cannot be done; names the op and the shapes involved.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TensorError {
    #[error("{op}: shape {shape:?} holds {expected} elements but {actual} were given")]
    Numel {
        op: &'static str,
        shape: Vec<usize>,
        expected: usize,
        actual: usize,
    },
    #[error("{op}: expected {expected} data, got {actual} (shape {shape:?})")]
    DType {
        op: &'static str,
        expected: DType,
        actual: DType,
        shape: Vec<usize>,
    },
    #[error("{op}: no {dtype} device layout (f32, bf16 and i64 only)")]
    DeviceDType { op: &'static str, dtype: DType },
    #[error("{op}: element at byte {offset} is past the {len} bytes given")]
    Bytes {
        op: &'static str,
        offset: u64,
        len: usize,
    },
    #[error("{op}: axis {axis} out of range for shape {shape:?}")]
    Axis {
        op: &'static str,
        axis: usize,
        shape: Vec<usize>,
    },
    #[error("slice {start}..{end} of axis {axis} is outside shape {shape:?}")]
    SliceBounds {
        axis: usize,
        start: usize,
        end: usize,
        shape: Vec<usize>,
    },
    #[error("{op}: shapes {a:?} and {b:?} do not fit together")]
    Mismatch {
        op: &'static str,
        a: Vec<usize>,
        b: Vec<usize>,
    },
    #[error("{op} of no tensors")]
    Empty { op: &'static str },
    #[error("reshape of {from:?} ({from_n} elements) to {to:?} ({to_n} elements)")]
    Reshape {
        from: Vec<usize>,
        from_n: usize,
        to: Vec<usize>,
        to_n: usize,
    },
    #[error("transpose permutation {perm:?} does not fit shape {shape:?}")]
    Perm { perm: Vec<usize>, shape: Vec<usize> },
}

impl Data {
    /// The element class, as the IR names it.
    pub fn dtype(&self) -> DType {
        match self {
            Data::F32(_) => DType::F32,
            Data::I64(_) => DType::I64,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::I64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `x` rounded to nearest-even to the float type `dtype` (f32, or bf16 and f16, whose values
/// an f32 holds exactly); any other `dtype` is treated as f32.
///
/// An f64 is not rounded to bf16 through a plain f32 (or through `half`'s `from_f64`, which drops
/// the low mantissa bits first): both round twice, and a value just past a bf16 tie lands on the
/// tie and then goes to even, the wrong way. Rounding to odd in f32 keeps the lost bits as a
/// sticky bit, and with 16 spare bits over bf16 (13 over f16) the second rounding is then exact.
pub fn round_to(x: f64, dtype: DType) -> f32 {
    let narrow: fn(f32) -> f32 = match dtype {
        DType::BF16 => |v| half::bf16::from_f32(v).to_f32(),
        DType::F16 => |v| half::f16::from_f32(v).to_f32(),
        _ => return x as f32,
    };
    let nearest = x as f32;
    if nearest.is_nan() || nearest.is_infinite() || f64::from(nearest) == x {
        return narrow(nearest);
    }
    // One step toward zero when rounding went away from it: truncation, then the sticky bit.
    let truncated = if f64::from(nearest).abs() > x.abs() {
        f32::from_bits(nearest.to_bits() - 1)
    } else {
        nearest
    };
    narrow(f32::from_bits(truncated.to_bits() | 1))
}

/// The parts of a concat or stack, all of one element class.
enum Parts<'a> {
    F32(Vec<&'a [f32]>),
    I64(Vec<&'a [i64]>),
}

impl Tensor {
    /// A tensor from shape and data; the data length must equal the product of the shape.
    pub fn new(shape: Vec<usize>, data: Data) -> Result<Tensor, TensorError> {
        let expected = shape.iter().product::<usize>();
        if data.len() != expected {
            return Err(TensorError::Numel {
                op: "new",
                shape,
                expected,
                actual: data.len(),
            });
        }
        Ok(Tensor { shape, data })
    }

    pub fn f32(shape: Vec<usize>, data: Vec<f32>) -> Result<Tensor, TensorError> {
        Tensor::new(shape, Data::F32(data))
    }

    pub fn i64(shape: Vec<usize>, data: Vec<i64>) -> Result<Tensor, TensorError> {
        Tensor::new(shape, Data::I64(data))
    }

    /// The elements as a device holds them in `dtype`, little-endian: f32 values rounded to
    /// nearest-even for bf16.
    pub fn to_bytes(&self, dtype: DType) -> Result<Vec<u8>, TensorError> {
        let op = "to_bytes";
        Ok(match (dtype, &self.data) {
            (DType::F32, Data::F32(v)) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            (DType::BF16, Data::F32(v)) => v
                .iter()
                .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                .collect(),
            (DType::I64, Data::I64(v)) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            (DType::F32 | DType::BF16 | DType::I64, _) => {
                return Err(TensorError::DType {
                    op,
                    expected: dtype,
                    actual: self.dtype(),
                    shape: self.shape.clone(),
                })
            }
            _ => return Err(TensorError::DeviceDType { op, dtype }),
        })
    }

    /// The tensor as a node of `dtype` holds it: f32 data rounded to nearest-even to bf16 or
    /// f16 values (still held in f32), everything else unchanged. Rounding a value that is
    /// already of `dtype` leaves it as it is.
    pub fn rounded_to(self, dtype: DType) -> Tensor {
        match self.data {
            Data::F32(v) if matches!(dtype, DType::BF16 | DType::F16) => Tensor {
                shape: self.shape,
                data: Data::F32(v.into_iter().map(|x| round_to(x.into(), dtype)).collect()),
            },
            _ => self,
        }
    }

    /// A tensor of `shape` whose elements, in row-major order, are the `dtype` values at
    /// `offsets` (bytes) of `bytes`: how a strided device tensor reads back.
    pub fn from_device_bytes(
        shape: Vec<usize>,
        dtype: DType,
        bytes: &[u8],
        offsets: &[u64],
    ) -> Result<Tensor, TensorError> {
        Tensor::from_device_runs(shape, dtype, bytes, offsets, 1)
    }

    /// The same for elements in runs of `run` consecutive values starting at `starts` (bytes):
    /// the rows of a tensor whose last axis is contiguous, converted a row at a time.
    pub fn from_device_runs(
        shape: Vec<usize>,
        dtype: DType,
        bytes: &[u8],
        starts: &[u64],
        run: usize,
    ) -> Result<Tensor, TensorError> {
        let op = "from_device_bytes";
        let size = dtype.size_bytes() as usize;
        let runs = starts.iter().map(|&o| {
            usize::try_from(o)
                .ok()
                .filter(|s| s + run * size <= bytes.len())
                .map(|s| bytes[s..s + run * size].chunks_exact(size))
                .ok_or(TensorError::Bytes {
                    op,
                    offset: o,
                    len: bytes.len(),
                })
        });
        fn gather<'a, T>(
            runs: impl ExactSizeIterator<Item = Result<std::slice::ChunksExact<'a, u8>, TensorError>>,
            run: usize,
            value: impl Fn(&[u8]) -> T,
        ) -> Result<Vec<T>, TensorError> {
            let mut out = Vec::with_capacity(runs.len() * run);
            for r in runs {
                out.extend(r?.map(&value));
            }
            Ok(out)
        }
        let data = match dtype {
            DType::F32 => Data::F32(gather(runs, run, |b| {
                f32::from_le_bytes([b[0], b[1], b[2], b[3]])
            })?),
            DType::BF16 => Data::F32(gather(runs, run, |b| {
                half::bf16::from_le_bytes([b[0], b[1]]).to_f32()
            })?),
            DType::I64 => Data::I64(gather(runs, run, |b| {
                i64::from_le_bytes(b.try_into().expect("8 bytes"))
            })?),
            _ => return Err(TensorError::DeviceDType { op, dtype }),
        };
        Tensor::new(shape, data)
    }

    /// An f32 tensor of zeros.
    pub fn zeros(shape: Vec<usize>) -> Tensor {
        let n = shape.iter().product();
        Tensor {
            shape,
            data: Data::F32(vec![0.0; n]),
        }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn numel(&self) -> usize {
        self.data.len()
    }

    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    pub fn data(&self) -> &Data {
        &self.data
    }

    pub fn as_f32(&self) -> Result<&[f32], TensorError> {
        match &self.data {
            Data::F32(v) => Ok(v),
            Data::I64(_) => Err(self.dtype_error("as_f32", DType::F32)),
        }
    }

    pub fn as_i64(&self) -> Result<&[i64], TensorError> {
        match &self.data {
            Data::I64(v) => Ok(v),
            Data::F32(_) => Err(self.dtype_error("as_i64", DType::I64)),
        }
    }

    pub fn into_f32(self) -> Result<Vec<f32>, TensorError> {
        match self.data {
            Data::F32(v) => Ok(v),
            Data::I64(_) => Err(self.dtype_error("into_f32", DType::F32)),
        }
    }

    pub fn into_i64(self) -> Result<Vec<i64>, TensorError> {
        match self.data {
            Data::I64(v) => Ok(v),
            Data::F32(_) => Err(self.dtype_error("into_i64", DType::I64)),
        }
    }

    fn dtype_error(&self, op: &'static str, expected: DType) -> TensorError {
        TensorError::DType {
            op,
            expected,
            actual: self.dtype(),
            shape: self.shape.clone(),
        }
    }

    /// Indices `start..end` of `axis`, all other axes whole.
    pub fn slice(&self, axis: usize, start: usize, end: usize) -> Result<Tensor, TensorError> {
        let len = *self.shape.get(axis).ok_or_else(|| TensorError::Axis {
            op: "slice",
            axis,
            shape: self.shape.clone(),
        })?;
        if start > end || end > len {
            return Err(TensorError::SliceBounds {
                axis,
                start,
                end,
                shape: self.shape.clone(),
            });
        }
        let mut shape = self.shape.clone();
        shape[axis] = end - start;
        let inner = inner_size(&self.shape, axis);
        let (run, skip) = ((end - start) * inner, start * inner);
        let data = match &self.data {
            Data::F32(v) => Data::F32(copy_runs(v, len * inner, skip, run)),
            Data::I64(v) => Data::I64(copy_runs(v, len * inner, skip, run)),
        };
        Ok(Tensor { shape, data })
    }

    /// Joins `parts` along `axis`; they must agree on every other axis and on element class.
    pub fn concat(axis: usize, parts: &[Tensor]) -> Result<Tensor, TensorError> {
        let first = parts.first().ok_or(TensorError::Empty { op: "concat" })?;
        if axis >= first.shape.len() {
            return Err(TensorError::Axis {
                op: "concat",
                axis,
                shape: first.shape.clone(),
            });
        }
        let mut shape = first.shape.clone();
        shape[axis] = 0;
        for p in parts {
            let fits = p.shape.len() == first.shape.len()
                && (0..shape.len()).all(|i| i == axis || p.shape[i] == first.shape[i]);
            if !fits {
                return Err(TensorError::Mismatch {
                    op: "concat",
                    a: first.shape.clone(),
                    b: p.shape.clone(),
                });
            }
            shape[axis] += p.shape[axis];
        }
        let outer = first.shape[..axis].iter().product::<usize>();
        let inner = inner_size(&first.shape, axis);
        let runs: Vec<usize> = parts.iter().map(|p| p.shape[axis] * inner).collect();
        let data = match same_class("concat", parts)? {
            Parts::F32(v) => Data::F32(interleave(&v, &runs, outer)),
            Parts::I64(v) => Data::I64(interleave(&v, &runs, outer)),
        };
        Ok(Tensor { shape, data })
    }

    /// Stacks tensors of one shape on a new leading axis (how per-expert weights become one
    /// `[experts, ...]` weight).
    pub fn stack(parts: &[Tensor]) -> Result<Tensor, TensorError> {
        let first = parts.first().ok_or(TensorError::Empty { op: "stack" })?;
        if let Some(p) = parts.iter().find(|p| p.shape != first.shape) {
            return Err(TensorError::Mismatch {
                op: "stack",
                a: first.shape.clone(),
                b: p.shape.clone(),
            });
        }
        let mut shape = vec![parts.len()];
        shape.extend(&first.shape);
        let data = match same_class("stack", parts)? {
            Parts::F32(v) => Data::F32(v.concat()),
            Parts::I64(v) => Data::I64(v.concat()),
        };
        Ok(Tensor { shape, data })
    }

    /// The same elements under a new shape of equal size; moves the buffer, copies nothing.
    pub fn reshape(self, shape: Vec<usize>) -> Result<Tensor, TensorError> {
        let to_n = shape.iter().product::<usize>();
        if to_n != self.numel() {
            return Err(TensorError::Reshape {
                from_n: self.numel(),
                from: self.shape,
                to: shape,
                to_n,
            });
        }
        Ok(Tensor {
            shape,
            data: self.data,
        })
    }

    /// Axis `i` of the result is axis `perm[i]` of `self`.
    pub fn transpose(&self, perm: &[usize]) -> Result<Tensor, TensorError> {
        if !is_permutation(perm, self.shape.len()) {
            return Err(TensorError::Perm {
                perm: perm.to_vec(),
                shape: self.shape.clone(),
            });
        }
        let shape: Vec<usize> = perm.iter().map(|&p| self.shape[p]).collect();
        let data = match &self.data {
            Data::F32(v) => Data::F32(permute(v, &self.shape, perm)),
            Data::I64(v) => Data::I64(permute(v, &self.shape, perm)),
        };
        Ok(Tensor { shape, data })
    }
}

/// Elements per step of `axis`: the product of the axes after it.
fn inner_size(shape: &[usize], axis: usize) -> usize {
    shape[axis + 1..].iter().product()
}

fn is_permutation(perm: &[usize], rank: usize) -> bool {
    let mut seen = vec![false; rank];
    perm.len() == rank
        && perm
            .iter()
            .all(|&p| p < rank && !std::mem::replace(&mut seen[p], true))
}

/// From every block of `block` elements, the `run` elements after the first `skip`.
fn copy_runs<T: Copy>(src: &[T], block: usize, skip: usize, run: usize) -> Vec<T> {
    if run == 0 {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(src.len() / block * run);
    for b in src.chunks_exact(block) {
        out.extend_from_slice(&b[skip..skip + run]);
    }
    out
}

/// For each of `outer` rows, the next `runs[i]` elements of each part `i`, in part order.
fn interleave<T: Copy>(parts: &[&[T]], runs: &[usize], outer: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
    for o in 0..outer {
        for (p, &run) in parts.iter().zip(runs) {
            out.extend_from_slice(&p[o * run..(o + 1) * run]);
        }
    }
    out
}

fn same_class<'a>(op: &'static str, parts: &'a [Tensor]) -> Result<Parts<'a>, TensorError> {
    let mismatch = |t: &Tensor, expected| t.dtype_error(op, expected);
    match parts[0].data {
        Data::F32(_) => parts
            .iter()
            .map(|t| t.as_f32().map_err(|_| mismatch(t, DType::F32)))
            .collect::<Result<_, _>>()
            .map(Parts::F32),
        Data::I64(_) => parts
            .iter()
            .map(|t| t.as_i64().map_err(|_| mismatch(t, DType::I64)))
            .collect::<Result<_, _>>()
            .map(Parts::I64),
    }
}

/// The elements of a row-major `src` of `shape` in the order of axes `perm`.
///
/// Walks the output in order with an odometer over its outer axes, keeping the source offset
/// up to date incrementally, so the cost is O(n) with no index arithmetic per element beyond one
/// multiply-add along the innermost output axis.
fn permute<T: Copy>(src: &[T], shape: &[usize], perm: &[usize]) -> Vec<T> {
    let rank = shape.len();
    if rank == 0 || src.is_empty() {
        return src.to_vec();
    }
    let mut strides = vec![1usize; rank];
    for d in (0..rank - 1).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    let dims: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let steps: Vec<usize> = perm.iter().map(|&p| strides[p]).collect();
    let (inner_len, inner_step) = (dims[rank - 1], steps[rank - 1]);
    let mut out = Vec::with_capacity(src.len());
    let mut index = vec![0usize; rank - 1];
    let mut base = 0usize;
    loop {
        out.extend((0..inner_len).map(|i| src[base + i * inner_step]));
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            index[d] += 1;
            base += steps[d];
            if index[d] < dims[d] {
                break;
            }
            base -= steps[d] * dims[d];
            index[d] = 0;
        }
    }
}
