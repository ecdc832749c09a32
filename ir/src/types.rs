//! Element types, dimensions and tensor types.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Element type of a tensor. `F8E4M3` is the OCP fp8 format GLM-5-FP8 checkpoints use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DType {
    F32,
    BF16,
    F16,
    F8E4M3,
    I32,
    I64,
}

impl DType {
    pub const ALL: [DType; 6] = [
        DType::F32,
        DType::BF16,
        DType::F16,
        DType::F8E4M3,
        DType::I32,
        DType::I64,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::F8E4M3 => "f8e4m3",
            DType::I32 => "i32",
            DType::I64 => "i64",
        }
    }

    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    pub fn size_bytes(self) -> u64 {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::F8E4M3 => 1,
            DType::I64 => 8,
        }
    }

    pub fn is_float(self) -> bool {
        !matches!(self, DType::I32 | DType::I64)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A dimension: a constant, or a symbol bound at run time.
///
/// The symbols glmc uses are `s` (new tokens of a prefill chunk), `t` (context length: cached plus
/// new tokens) and `b` (sequences in a decode batch).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Dim {
    Const(u64),
    Sym(String),
}

impl Dim {
    pub fn sym(s: &str) -> Dim {
        Dim::Sym(s.to_string())
    }

    pub fn as_const(&self) -> Option<u64> {
        match self {
            Dim::Const(n) => Some(*n),
            Dim::Sym(_) => None,
        }
    }
}

impl From<u64> for Dim {
    fn from(n: u64) -> Dim {
        Dim::Const(n)
    }
}

impl From<&str> for Dim {
    fn from(s: &str) -> Dim {
        Dim::Sym(s.to_string())
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Const(n) => write!(f, "{n}"),
            Dim::Sym(s) => f.write_str(s),
        }
    }
}

/// Builds a shape from a mix of constants and symbol names: `shape![Dim::sym("s"), 256]`.
#[macro_export]
macro_rules! shape {
    ($($d:expr),* $(,)?) => { vec![$($crate::Dim::from($d)),*] };
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Vec<Dim>,
}

impl TensorType {
    pub fn new(dtype: DType, shape: Vec<Dim>) -> Self {
        TensorType { dtype, shape }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The number of elements when every dimension is constant (and the count fits in `u64`).
    pub fn const_numel(&self) -> Option<u64> {
        self.shape
            .iter()
            .try_fold(1u64, |n, d| n.checked_mul(d.as_const()?))
    }

    pub fn with_dtype(&self, dtype: DType) -> TensorType {
        TensorType {
            dtype,
            shape: self.shape.clone(),
        }
    }

    pub fn with_shape(&self, shape: Vec<Dim>) -> TensorType {
        TensorType {
            dtype: self.dtype,
            shape,
        }
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}
