//! Random weights (`glmc run --random-weights SEED`): a model's weights from a counter-based
//! generator instead of a checkpoint, so a model of any size runs without files, and the
//! interpreter and the GPU make the very same model.
//!
//! Values are defined per checkpoint tensor (by its HF name) and element index, so a fused,
//! sliced or transposed weight is exactly what its recipe makes of a checkpoint holding these
//! tensors. Element `i` (row-major) of tensor `name` under seed `s`:
//!
//! ```text
//! key   = mix(s ^ mix(fnv1a64(name)))
//! bits  = mix(key + i · 0x9E3779B97F4A7C15)          (u64, wrapping)
//! u     = ((bits >> 40) − 2^23) · 2^−23             (exact: uniform on [−1, 1) in steps of 2^−23)
//! value = round_stored(offset + amplitude · u)       (one f32 multiply, one f32 add)
//! ```
//!
//! `mix` is splitmix64's finaliser; `round_stored` rounds to nearest-even to the dtype the tensor
//! would be stored in: the model's dtype, but f32 for `e_score_correction_bias`, as GLM-5's
//! checkpoint stores it. Integer hashing, exact conversions and two correctly rounded f32
//! operations make every value bit-identical here and in `cuda/random_weights.cu`.
//!
//! The scale rule, [`Scale::of`], is the one place that decides how large values are, like a
//! trained model's:
//! * a matrix (two or more dims, HF's `[out, in]` layout): std 1/√fan_in, fan_in its last dim
//!   (amplitude √(3/fan_in)), so every projection keeps activations near unit RMS;
//! * a vector named `…bias` (the router's `e_score_correction_bias`, the indexer's `k_norm.bias`):
//!   amplitude 0.01 around 0;
//! * any other vector (a norm's weight): amplitude 0.05 around 1.

use glmc_ir::{DType, Recipe};
use half::{bf16, f16};
use rayon::prelude::*;

use crate::interp::{InterpError, WeightSource};
use crate::tensor::Tensor;
use crate::weights::{evaluate, WeightError};

/// splitmix64's increment: consecutive elements are this far apart in the hash's input.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
/// 2^23: the uniform's 24 bits are centred on it and scaled by its inverse.
const HALF_RANGE: i32 = 1 << 23;

/// splitmix64's output function: a bijection of u64 that mixes every input bit into every output
/// bit.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a over the name's UTF-8 bytes: computed on the host for both generators.
pub fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// The generator's uniform on [-1, 1) for element `index` of the tensor with `key`.
pub fn uniform(key: u64, index: u64) -> f32 {
    let bits = mix(key.wrapping_add(index.wrapping_mul(GOLDEN)));
    ((bits >> 40) as i32 - HALF_RANGE) as f32 * (1.0 / HALF_RANGE as f32)
}

/// A tensor's values are `offset + amplitude · u`, `u` uniform on [-1, 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scale {
    pub offset: f32,
    pub amplitude: f32,
}

impl Scale {
    /// The scale of checkpoint tensor `name` of `shape` (the rule in the module doc).
    pub fn of(name: &str, shape: &[u64]) -> Scale {
        match shape {
            [.., fan_in] if shape.len() >= 2 => Scale {
                offset: 0.0,
                amplitude: (3.0 / (*fan_in).max(1) as f64).sqrt() as f32,
            },
            _ if name.ends_with("bias") => Scale {
                offset: 0.0,
                amplitude: 0.01,
            },
            _ => Scale {
                offset: 1.0,
                amplitude: 0.05,
            },
        }
    }
}

/// Everything that makes one checkpoint tensor's values: what the GPU kernel is given.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LeafGenerator {
    pub key: u64,
    pub scale: Scale,
    /// The dtype the value is rounded to: F32, BF16 or F16.
    pub stored: DType,
}

impl LeafGenerator {
    pub fn value(&self, index: u64) -> f32 {
        let v = self.scale.offset + self.scale.amplitude * uniform(self.key, index);
        match self.stored {
            DType::BF16 => bf16::from_f32(v).to_f32(),
            DType::F16 => f16::from_f32(v).to_f32(),
            _ => v,
        }
    }
}

/// The random weights of one seed, for a model whose checkpoint would be stored in `dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RandomWeights {
    pub seed: u64,
    pub dtype: DType,
}

impl RandomWeights {
    /// `dtype` is the model's (the config's `dtype`); integer dtypes are treated as f32.
    pub fn new(seed: u64, dtype: DType) -> RandomWeights {
        let dtype = match dtype {
            DType::BF16 | DType::F16 => dtype,
            _ => DType::F32,
        };
        RandomWeights { seed, dtype }
    }

    /// How checkpoint tensor `name` of `shape` is generated.
    pub fn generator(&self, name: &str, shape: &[u64]) -> LeafGenerator {
        LeafGenerator {
            key: mix(self.seed ^ mix(name_hash(name))),
            scale: Scale::of(name, shape),
            stored: if name.ends_with("e_score_correction_bias") {
                DType::F32
            } else {
                self.dtype
            },
        }
    }

    /// Checkpoint tensor `name` of `shape`, as f32.
    pub fn leaf(&self, name: &str, shape: &[u64]) -> Tensor {
        let g = self.generator(name, shape);
        let values = (0..shape.iter().product::<u64>() as usize)
            .into_par_iter()
            .map(|i| g.value(i as u64))
            .collect();
        Tensor::f32(dims(shape), values).expect("one value per element")
    }

    /// The weight `recipe` makes of these tensors, generated straight into its layout (no
    /// intermediate copies: a stack of 256 experts never exists twice).
    pub fn materialize(&self, recipe: &Recipe) -> Result<Tensor, WeightError> {
        let shape = recipe.shape()?;
        match pieces(recipe) {
            Some(pieces) => Ok(Tensor::f32(dims(&shape), self.fill(&shape, &pieces))?),
            None => evaluate(recipe, &|name, shape| Ok(self.leaf(name, shape))),
        }
    }

    /// The elements of a weight of `shape` made of `pieces`.
    fn fill(&self, shape: &[u64], pieces: &[Piece]) -> Vec<f32> {
        let gens: Vec<LeafGenerator> = pieces
            .iter()
            .map(|p| self.generator(&p.leaf, &p.leaf_shape))
            .collect();
        fill_pieces(shape, pieces, &|piece, index| gens[piece].value(index))
    }
}

/// Generated at their stored precision, then rounded to the weight's dtype (a no-op unless the
/// weight is narrower than the model's storage).
impl WeightSource for RandomWeights {
    fn weight(&self, name: &str, recipe: &Recipe, dtype: DType) -> Result<Tensor, InterpError> {
        self.materialize(recipe)
            .map(|t| t.rounded_to(dtype))
            .map_err(|source| InterpError::Checkpoint {
                name: name.to_string(),
                source: Box::new(source),
            })
    }
}

/// The elements of a weight of `shape` made of `pieces`, in parallel over its first axis:
/// `value(p, i)` is element `i` (row-major) of piece `p`'s leaf. Only the leaf elements the
/// pieces cover are asked for.
pub(crate) fn fill_pieces(
    shape: &[u64],
    pieces: &[Piece],
    value: &(dyn Fn(usize, u64) -> f32 + Sync),
) -> Vec<f32> {
    let numel = shape.iter().product::<u64>() as usize;
    let mut out = vec![0.0f32; numel];
    if numel == 0 {
        return out;
    }
    let strides = row_major(shape);
    let slab = shape.get(1..).map_or(1, |s| s.iter().product::<u64>()) as usize;
    out.par_chunks_mut(slab).enumerate().for_each(|(i0, slab)| {
        for (k, p) in pieces.iter().enumerate() {
            if let Some(base) = p.slab_base(i0 as u64) {
                p.fill_slab(slab, base, &strides, &|i| value(k, i));
            }
        }
    });
    out
}

/// A box of a weight filled from one checkpoint tensor: output coordinates `start[k]..start[k] +
/// len[k]` on each axis `k`, the element at output coordinates `o` being element
/// `base + Σ o[k]·stride[k]` (row-major) of `leaf`. Every recipe operation moves, cuts or
/// relabels such boxes, which lets the CPU and the GPU generate a weight straight into its final
/// layout.
#[derive(Clone, Debug, PartialEq)]
pub struct Piece {
    pub leaf: String,
    pub leaf_shape: Vec<u64>,
    pub start: Vec<u64>,
    pub len: Vec<u64>,
    pub stride: Vec<i64>,
    pub base: i64,
}

impl Piece {
    fn whole(leaf: String, shape: &[u64]) -> Piece {
        Piece {
            leaf,
            leaf_shape: shape.to_vec(),
            start: vec![0; shape.len()],
            len: shape.to_vec(),
            stride: row_major(shape).iter().map(|&s| s as i64).collect(),
            base: 0,
        }
    }

    /// The number of elements the box covers.
    pub fn count(&self) -> u64 {
        self.len.iter().product()
    }

    /// The leaf index of the box's element `(i0, start[1], …)` when `i0` lies in the box on axis
    /// 0 (always, for a scalar).
    fn slab_base(&self, i0: u64) -> Option<i64> {
        match (self.start.first(), self.len.first()) {
            (Some(&s), Some(&l)) if (s..s + l).contains(&i0) => {
                Some(self.base + i0 as i64 * self.stride[0])
            }
            (Some(_), _) => None,
            (None, _) => Some(self.base),
        }
    }

    /// Writes the box's elements on one index of axis 0 into that index's `slab` of the output,
    /// row by row along the last axis. `base` is the leaf index at the slab's origin.
    fn fill_slab(&self, slab: &mut [f32], base: i64, strides: &[u64], value: &dyn Fn(u64) -> f32) {
        let rank = self.start.len();
        if rank <= 1 {
            slab[0] = value(base as u64);
            return;
        }
        let last = rank - 1;
        let rows: u64 = self.len[1..last].iter().product();
        for row in 0..rows {
            let (mut rem, mut at, mut leaf) = (row, self.start[last], base);
            leaf += self.start[last] as i64 * self.stride[last];
            for k in (1..last).rev() {
                let c = self.start[k] + rem % self.len[k];
                rem /= self.len[k];
                at += c * strides[k];
                leaf += c as i64 * self.stride[k];
            }
            let at = at as usize;
            for t in 0..self.len[last] as usize {
                slab[at + t] = value((leaf + t as i64 * self.stride[last]) as u64);
            }
        }
    }
}

/// The pieces of `recipe`, or `None` when its shapes are inconsistent or a reshape regroups a
/// box that is not rectangular in the new shape (no recipe glmc builds does; such a weight is
/// evaluated whole).
pub fn pieces(recipe: &Recipe) -> Option<Vec<Piece>> {
    recipe.shape().ok()?;
    checked_pieces(recipe)
}

/// [`pieces`] of a recipe whose shapes are known to be consistent.
fn checked_pieces(recipe: &Recipe) -> Option<Vec<Piece>> {
    let nonempty = |p: &Piece| p.count() > 0;
    Some(match recipe {
        Recipe::Tensor { name, shape } => vec![Piece::whole(name.clone(), shape)]
            .into_iter()
            .filter(nonempty)
            .collect(),
        Recipe::Stack {
            pattern,
            count,
            shape,
        } => (0..*count)
            .map(|e| {
                let mut p = Piece::whole(Recipe::stack_member(pattern, e), shape);
                p.start.insert(0, e);
                p.len.insert(0, 1);
                p.stride.insert(0, 0);
                p
            })
            .filter(nonempty)
            .collect(),
        Recipe::Slice {
            src,
            axis,
            start,
            end,
        } => {
            let a = *axis as usize;
            checked_pieces(src)?
                .into_iter()
                .filter_map(|mut p| {
                    let lo = p.start[a].max(*start);
                    let hi = (p.start[a] + p.len[a]).min(*end);
                    (lo < hi).then(|| {
                        p.start[a] = lo - start;
                        p.len[a] = hi - lo;
                        p.base += *start as i64 * p.stride[a];
                        p
                    })
                })
                .collect()
        }
        Recipe::Concat { axis, parts } => {
            let a = *axis as usize;
            let mut out = Vec::new();
            let mut offset = 0u64;
            for part in parts {
                for mut p in checked_pieces(part)? {
                    p.start[a] += offset;
                    p.base -= offset as i64 * p.stride[a];
                    out.push(p);
                }
                offset += part.shape().ok()?[a];
            }
            out
        }
        Recipe::Transpose { src, perm } => checked_pieces(src)?
            .into_iter()
            .map(|p| {
                let pick = |v: &[u64]| perm.iter().map(|&k| v[k as usize]).collect();
                Piece {
                    start: pick(&p.start),
                    len: pick(&p.len),
                    stride: perm.iter().map(|&k| p.stride[k as usize]).collect(),
                    ..p
                }
            })
            .collect(),
        Recipe::Reshape { src, shape } => {
            let from = src.shape().ok()?;
            if shape.contains(&0) || from.contains(&0) {
                return Some(Vec::new());
            }
            checked_pieces(src)?
                .into_iter()
                .map(|p| reshape(p, &from, shape))
                .collect::<Option<Vec<_>>>()?
        }
    })
}

/// `p` of a weight of shape `from` in the same weight reshaped to `to` (equal element counts, no
/// zero dims). Axes are grouped where the two shapes' running products meet; each group's box is
/// merged into one axis and split into the new axes, which works when the box is a full run of
/// the inner axes or one row of them.
fn reshape(p: Piece, from: &[u64], to: &[u64]) -> Option<Piece> {
    let mut out = Piece {
        start: Vec::with_capacity(to.len()),
        len: Vec::with_capacity(to.len()),
        stride: Vec::with_capacity(to.len()),
        ..p.clone()
    };
    let (mut i, mut j) = (0, 0);
    while i < from.len() || j < to.len() {
        let (gi, gj) = (i, j);
        let (mut pf, mut pt) = (1u64, 1u64);
        if i < from.len() {
            pf *= from[i];
            i += 1;
        }
        if j < to.len() {
            pt *= to[j];
            j += 1;
        }
        while pf != pt {
            if pf < pt {
                pf *= from[i];
                i += 1;
            } else {
                pt *= to[j];
                j += 1;
            }
        }
        let (mut s, mut l, mut st) = (0u64, 1u64, 0i64);
        let group = p.start[gi..i].iter().zip(&p.len[gi..i]);
        for (((&s2, &l2), &st2), &size) in group.zip(&p.stride[gi..i]).zip(&from[gi..i]) {
            if l == 1 {
                out.base += s as i64 * (st - size as i64 * st2);
                (s, l, st) = (s * size + s2, l2, st2);
            } else if s2 == 0 && l2 == size && st == size as i64 * st2 {
                (s, l, st) = (s * size, l * size, st2);
            } else {
                return None;
            }
        }
        let mut axes = Vec::with_capacity(j - gj);
        for &b in to[gj..j].iter().rev() {
            if s % b == 0 && l % b == 0 {
                axes.push((0, b, st));
                (s, l) = (s / b, l / b);
            } else if s / b == (s + l - 1) / b {
                axes.push((s % b, l, st));
                (s, l) = (s / b, 1);
            } else {
                return None;
            }
            st *= b as i64;
        }
        for (s, l, st) in axes.into_iter().rev() {
            out.start.push(s);
            out.len.push(l);
            out.stride.push(st);
        }
    }
    Some(out)
}

/// Row-major strides of `shape`, in elements.
pub fn row_major(shape: &[u64]) -> Vec<u64> {
    let mut strides = vec![1u64; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        strides[k] = strides[k + 1] * shape[k + 1];
    }
    strides
}

fn dims(d: &[u64]) -> Vec<usize> {
    d.iter().map(|&x| x as usize).collect()
}
