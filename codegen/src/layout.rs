//! Where a tensor's elements are: a buffer, an offset and strides. Views (`reshape`, `slice`) are
//! layouts over their producer's bytes, so they cost no kernel and no copy.

use std::fmt;

use glmc_ir::{DType, TensorType};
use serde::{Deserialize, Serialize};

use crate::expr::{Bindings, Poly};

/// The memory a tensor lives in.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Buf {
    /// The phase's activation arena (one allocation, planned by liveness).
    Arena,
    /// Function argument `index`, owned by the caller.
    Input(u64),
    /// A weight, by its graph node name (the manifest gives its recipe).
    Weight(String),
    /// A persistent cache, by state name. It is allocated as `[max_batch, max_context, row]`; in
    /// `prefill` the runtime passes the base of the one sequence being prefilled.
    State(String),
}

impl fmt::Display for Buf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Buf::Arena => f.write_str("arena"),
            Buf::Input(i) => write!(f, "input{i}"),
            Buf::Weight(w) => write!(f, "@{w:?}"),
            Buf::State(s) => write!(f, "state {s:?}"),
        }
    }
}

/// A tensor in memory: `element(i…) = base(buf) + offset + Σ i_k · strides[k]` (bytes for the
/// offset, elements for the strides).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorRef {
    pub buf: Buf,
    pub offset_bytes: Poly,
    pub dtype: DType,
    pub shape: Vec<Poly>,
    pub strides: Vec<Poly>,
}

/// Row-major strides of `shape`.
pub fn contiguous_strides(shape: &[Poly]) -> Vec<Poly> {
    let mut strides = vec![Poly::constant(1); shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        strides[k] = strides[k + 1].mul(&shape[k + 1]);
    }
    strides
}

impl TensorRef {
    /// A fresh row-major tensor of type `ty` at `offset_bytes` of `buf`.
    pub fn contiguous(buf: Buf, offset_bytes: Poly, ty: &TensorType) -> TensorRef {
        let shape: Vec<Poly> = ty.shape.iter().map(Poly::from_dim).collect();
        TensorRef {
            buf,
            offset_bytes,
            dtype: ty.dtype,
            strides: contiguous_strides(&shape),
            shape,
        }
    }

    pub fn numel(&self) -> Poly {
        Poly::product(&self.shape)
    }

    pub fn bytes(&self) -> Poly {
        self.numel().scale(self.dtype.size_bytes() as i64)
    }

    /// The sizes of its axes under `bindings`; `None` when a symbol is unbound.
    pub fn dims(&self, bindings: &Bindings) -> Option<Vec<usize>> {
        self.shape
            .iter()
            .map(|d| d.eval(bindings).and_then(|v| usize::try_from(v).ok()))
            .collect()
    }

    /// The byte offset, from its buffer's base, of every element in row-major order, under
    /// `bindings`: how a host reads or writes the tensor in a copy of its buffer. `None` when a
    /// symbol is unbound or an offset is negative.
    pub fn element_offsets(&self, bindings: &Bindings) -> Option<Vec<u64>> {
        let (starts, run) = self.element_runs(bindings)?;
        let size = self.dtype.size_bytes();
        Some(
            starts
                .iter()
                .flat_map(|&s| (0..run as u64).map(move |j| s + j * size))
                .collect(),
        )
    }

    /// The same offsets as runs of consecutive elements: the byte offset where each run starts,
    /// in row-major order, and the elements of a run (the last axis when its stride is 1, else
    /// one). Reading a large node back this way costs per row, not per element.
    pub fn element_runs(&self, bindings: &Bindings) -> Option<(Vec<u64>, usize)> {
        let dims = self.dims(bindings)?;
        let strides: Vec<i64> = self
            .strides
            .iter()
            .map(|s| s.eval(bindings))
            .collect::<Option<_>>()?;
        let base = self.offset_bytes.eval(bindings)?;
        let size = self.dtype.size_bytes() as i64;
        let (outer, run) = match (dims.split_last(), strides.last()) {
            (Some((&last, outer)), Some(1)) => (outer, last),
            _ => (&dims[..], 1),
        };
        let count: usize = outer.iter().product();
        let starts = (0..count)
            .map(|mut i| {
                let mut e = 0i64;
                for k in (0..outer.len()).rev() {
                    e += (i % outer[k]) as i64 * strides[k];
                    i /= outer[k];
                }
                u64::try_from(base + e * size).ok()
            })
            .collect::<Option<Vec<u64>>>()?;
        Some((starts, run))
    }

    pub fn is_contiguous(&self) -> bool {
        self.strides == contiguous_strides(&self.shape)
    }

    /// Elements `start..end` of `axis`: the same memory, moved and narrowed.
    pub fn slice(&self, axis: usize, start: u64, end: u64) -> TensorRef {
        let mut out = self.clone();
        out.offset_bytes = self
            .offset_bytes
            .add(&self.strides[axis].scale(start as i64 * self.dtype.size_bytes() as i64));
        out.shape[axis] = Poly::constant((end - start) as i64);
        out
    }

    /// The same elements in row-major order under `shape`, when the memory allows it without a
    /// copy: a contiguous tensor always; otherwise when every axis but the last merges into rows
    /// (see [`TensorRef::rows`]) and the new shape keeps the last axis.
    pub fn reshape(&self, shape: &[Poly]) -> Option<TensorRef> {
        if self.is_contiguous() {
            return Some(TensorRef {
                strides: contiguous_strides(shape),
                shape: shape.to_vec(),
                ..self.clone()
            });
        }
        let rows = self.rows()?;
        if shape.last() != self.shape.last() {
            return None;
        }
        let lead = &shape[..shape.len() - 1];
        let mut strides: Vec<Poly> = contiguous_strides(lead)
            .into_iter()
            .map(|s| s.mul(&rows.stride))
            .collect();
        strides.push(Poly::constant(1));
        Some(TensorRef {
            strides,
            shape: shape.to_vec(),
            ..self.clone()
        })
    }

    /// The tensor as `rows × cols` with contiguous rows `stride` elements apart, which is how
    /// every row-wise kernel addresses its operands. `None` when the last axis is strided or the
    /// leading axes do not merge (a slice of a middle axis, say).
    pub fn rows(&self) -> Option<Rows> {
        let r = self.shape.len();
        if r == 0 {
            return Some(Rows {
                rows: Poly::constant(1),
                cols: Poly::constant(1),
                stride: Poly::constant(1),
            });
        }
        if self.strides[r - 1] != Poly::constant(1) {
            return None;
        }
        if r == 1 {
            return Some(Rows {
                rows: Poly::constant(1),
                cols: self.shape[0].clone(),
                stride: self.shape[0].clone(),
            });
        }
        for k in 0..r - 2 {
            if self.strides[k] != self.shape[k + 1].mul(&self.strides[k + 1]) {
                return None;
            }
        }
        Some(Rows {
            rows: Poly::product(&self.shape[..r - 1]),
            cols: self.shape[r - 1].clone(),
            stride: self.strides[r - 2].clone(),
        })
    }
}

/// A tensor seen as rows of contiguous elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rows {
    pub rows: Poly,
    pub cols: Poly,
    /// Elements from one row's start to the next's.
    pub stride: Poly,
}

impl fmt::Display for TensorRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let join = |v: &[Poly]| {
            v.iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        write!(f, "{}", self.buf)?;
        if self.offset_bytes != Poly::zero() {
            write!(f, "+{}", self.offset_bytes)?;
        }
        write!(f, " {}[{}]", self.dtype, join(&self.shape))?;
        if !self.is_contiguous() {
            write!(f, " strides [{}]", join(&self.strides))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use glmc_ir::Dim;

    fn t(shape: &[Dim]) -> TensorRef {
        TensorRef::contiguous(
            Buf::Arena,
            Poly::zero(),
            &TensorType::new(DType::BF16, shape.to_vec()),
        )
    }

    #[test]
    fn a_slice_of_the_last_axis_is_rows_of_the_full_width() {
        let x = t(&[Dim::sym("s"), Dim::Const(74)]);
        let q = x.slice(1, 32, 56);
        assert_eq!(q.offset_bytes, Poly::constant(64));
        let rows = q.rows().unwrap();
        assert_eq!(rows.rows, Poly::sym("s"));
        assert_eq!(rows.cols, Poly::constant(24));
        assert_eq!(rows.stride, Poly::constant(74));
    }

    #[test]
    fn heads_of_a_slice_merge_into_rows() {
        let x = t(&[Dim::sym("s"), Dim::Const(2), Dim::Const(16)]);
        let pe = x.slice(2, 8, 16);
        let rows = pe.rows().unwrap();
        assert_eq!(rows.rows, Poly::sym("s").scale(2));
        assert_eq!(rows.stride, Poly::constant(16));
        // A slice of the middle axis leaves rows that do not merge.
        assert!(x.slice(1, 0, 1).rows().is_none());
    }

    #[test]
    fn element_offsets_follow_the_strides() {
        let x = t(&[Dim::sym("s"), Dim::Const(4)]);
        let b = Bindings::from([("s".to_string(), 2)]);
        // columns 1..3 of a bf16 [2, 4]: elements (0,1) (0,2) (1,1) (1,2)
        assert_eq!(
            x.slice(1, 1, 3).element_offsets(&b),
            Some(vec![2, 4, 10, 12])
        );
        assert_eq!(x.element_offsets(&Bindings::new()), None);
        // Runs: two elements of each row of the slice; each whole row of the tensor.
        assert_eq!(x.slice(1, 1, 3).element_runs(&b), Some((vec![2, 10], 2)));
        assert_eq!(x.element_runs(&b), Some((vec![0, 8], 4)));
    }

    #[test]
    fn reshape_is_free_when_the_last_axis_stays() {
        let x = t(&[Dim::sym("s"), Dim::Const(74)]);
        let part = x.slice(1, 0, 32);
        let heads = part.reshape(&[Poly::sym("s"), Poly::constant(32)]).unwrap();
        assert_eq!(heads.strides, vec![Poly::constant(74), Poly::constant(1)]);
        assert!(part
            .reshape(&[Poly::sym("s"), Poly::constant(2), Poly::constant(16)])
            .is_none());
        let whole = x
            .reshape(&[Poly::sym("s").scale(2), Poly::constant(37)])
            .unwrap();
        assert!(whole.is_contiguous());
    }
}
