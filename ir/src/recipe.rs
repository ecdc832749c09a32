//! Weight recipes: how a weight node's value is made from checkpoint tensors.
//!
//! A pass that fuses or splits weights rewrites recipes; it never touches data. The runtime applies
//! the recipe at load time, so the checkpoint stays the source of truth and every weight in a dump
//! still names the HF tensors it comes from.

use serde::{Deserialize, Serialize};

/// A recipe is an expression over checkpoint tensors. Every leaf states the shape it expects, so
/// the shape of any recipe is known without the checkpoint, and a loader can check the file
/// against it before any compute.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Recipe {
    /// One checkpoint tensor by its HF name, with its expected shape.
    Tensor {
        name: String,
        shape: Vec<u64>,
    },
    /// `count` tensors named by `pattern` with `{e}` replaced by 0..count, stacked on a new axis 0
    /// (the routed experts of a MoE layer).
    Stack {
        pattern: String,
        count: u64,
        shape: Vec<u64>,
    },
    /// Rows `start..end` of `axis`.
    Slice {
        src: Box<Recipe>,
        axis: u64,
        start: u64,
        end: u64,
    },
    /// Concatenation along `axis`.
    Concat {
        axis: u64,
        parts: Vec<Recipe>,
    },
    Reshape {
        src: Box<Recipe>,
        shape: Vec<u64>,
    },
    Transpose {
        src: Box<Recipe>,
        perm: Vec<u64>,
    },
}

/// Why a recipe cannot be evaluated on shapes.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RecipeError {
    #[error("{op}: axis {axis} out of range for shape {shape:?}")]
    Axis {
        op: &'static str,
        axis: u64,
        shape: Vec<u64>,
    },
    #[error("slice {start}..{end} of axis {axis} is outside shape {shape:?}")]
    SliceBounds {
        axis: u64,
        start: u64,
        end: u64,
        shape: Vec<u64>,
    },
    #[error("concat along axis {axis}: part shapes {a:?} and {b:?} differ off that axis")]
    ConcatMismatch { axis: u64, a: Vec<u64>, b: Vec<u64> },
    #[error("concat of no parts")]
    EmptyConcat,
    #[error("reshape of {from:?} ({from_n} elements) to {to:?} ({to_n} elements)")]
    Reshape {
        from: Vec<u64>,
        from_n: u64,
        to: Vec<u64>,
        to_n: u64,
    },
    #[error("transpose permutation {perm:?} does not fit shape {shape:?}")]
    Perm { perm: Vec<u64>, shape: Vec<u64> },
    #[error("stack pattern {pattern:?} has no `{{e}}` placeholder")]
    Pattern { pattern: String },
    #[error("{op}: the element count of {shape:?} overflows 64 bits")]
    Overflow { op: &'static str, shape: Vec<u64> },
}

impl Recipe {
    pub fn tensor(name: impl Into<String>, shape: Vec<u64>) -> Recipe {
        Recipe::Tensor {
            name: name.into(),
            shape,
        }
    }

    pub fn slice(self, axis: u64, start: u64, end: u64) -> Recipe {
        Recipe::Slice {
            src: Box::new(self),
            axis,
            start,
            end,
        }
    }

    pub fn reshape(self, shape: Vec<u64>) -> Recipe {
        Recipe::Reshape {
            src: Box::new(self),
            shape,
        }
    }

    pub fn transpose(self, perm: Vec<u64>) -> Recipe {
        Recipe::Transpose {
            src: Box::new(self),
            perm,
        }
    }

    /// The name of the `e`-th tensor of a stack.
    pub fn stack_member(pattern: &str, e: u64) -> String {
        pattern.replace("{e}", &e.to_string())
    }

    /// Every checkpoint tensor the recipe reads, with the shape it expects, in order.
    pub fn leaves(&self) -> Vec<(String, Vec<u64>)> {
        let mut out = Vec::new();
        self.collect_leaves(&mut out);
        out
    }

    fn collect_leaves(&self, out: &mut Vec<(String, Vec<u64>)>) {
        match self {
            Recipe::Tensor { name, shape } => out.push((name.clone(), shape.clone())),
            Recipe::Stack {
                pattern,
                count,
                shape,
            } => out.extend((0..*count).map(|e| (Recipe::stack_member(pattern, e), shape.clone()))),
            Recipe::Slice { src, .. }
            | Recipe::Reshape { src, .. }
            | Recipe::Transpose { src, .. } => src.collect_leaves(out),
            Recipe::Concat { parts, .. } => parts.iter().for_each(|p| p.collect_leaves(out)),
        }
    }

    /// The shape the recipe produces.
    pub fn shape(&self) -> Result<Vec<u64>, RecipeError> {
        match self {
            Recipe::Tensor { shape, .. } => Ok(shape.clone()),
            Recipe::Stack {
                pattern,
                count,
                shape,
            } => {
                if !pattern.contains("{e}") {
                    return Err(RecipeError::Pattern {
                        pattern: pattern.clone(),
                    });
                }
                let mut s = vec![*count];
                s.extend(shape);
                Ok(s)
            }
            Recipe::Slice {
                src,
                axis,
                start,
                end,
            } => {
                let mut s = src.shape()?;
                let a = *axis as usize;
                if a >= s.len() {
                    return Err(RecipeError::Axis {
                        op: "slice",
                        axis: *axis,
                        shape: s,
                    });
                }
                if start > end || *end > s[a] {
                    return Err(RecipeError::SliceBounds {
                        axis: *axis,
                        start: *start,
                        end: *end,
                        shape: s,
                    });
                }
                s[a] = end - start;
                Ok(s)
            }
            Recipe::Concat { axis, parts } => {
                let first = parts.first().ok_or(RecipeError::EmptyConcat)?.shape()?;
                let a = *axis as usize;
                if a >= first.len() {
                    return Err(RecipeError::Axis {
                        op: "concat",
                        axis: *axis,
                        shape: first,
                    });
                }
                let mut out = first.clone();
                for p in &parts[1..] {
                    let s = p.shape()?;
                    let same_off_axis = s.len() == first.len()
                        && s.iter()
                            .zip(&first)
                            .enumerate()
                            .all(|(i, (x, y))| i == a || x == y);
                    if !same_off_axis {
                        return Err(RecipeError::ConcatMismatch {
                            axis: *axis,
                            a: first,
                            b: s,
                        });
                    }
                    out[a] = out[a].checked_add(s[a]).ok_or(RecipeError::Overflow {
                        op: "concat",
                        shape: s.clone(),
                    })?;
                }
                Ok(out)
            }
            Recipe::Reshape { src, shape } => {
                let from = src.shape()?;
                let numel = |s: &[u64]| {
                    s.iter()
                        .try_fold(1u64, |n, &d| n.checked_mul(d))
                        .ok_or_else(|| RecipeError::Overflow {
                            op: "reshape",
                            shape: s.to_vec(),
                        })
                };
                let (from_n, to_n) = (numel(&from)?, numel(shape)?);
                if from_n != to_n {
                    return Err(RecipeError::Reshape {
                        from,
                        from_n,
                        to: shape.clone(),
                        to_n,
                    });
                }
                Ok(shape.clone())
            }
            Recipe::Transpose { src, perm } => {
                let s = src.shape()?;
                let mut seen = vec![false; s.len()];
                let valid = perm.len() == s.len()
                    && perm.iter().all(|&p| {
                        (p as usize) < s.len() && !std::mem::replace(&mut seen[p as usize], true)
                    });
                if !valid {
                    return Err(RecipeError::Perm {
                        perm: perm.clone(),
                        shape: s,
                    });
                }
                Ok(perm.iter().map(|&p| s[p as usize]).collect())
            }
        }
    }
}
