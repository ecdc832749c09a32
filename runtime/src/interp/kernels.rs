//! Dense kernels: matmul, elementwise, norms, rope, embedding, cast.
//!
//! Every kernel takes host tensors and returns a tensor or a message; the executor adds the node.
//! Shapes are re-checked here at run time (symbol sizes are only known now), so a bad operand is
//! an error, never an out-of-bounds panic.

use glmc_ir::DType;
use rayon::prelude::*;

use crate::tensor::Tensor;

pub(super) type KResult<T> = Result<T, String>;

pub(super) fn f32s<'a>(t: &'a Tensor, what: &str) -> KResult<&'a [f32]> {
    t.as_f32()
        .map_err(|_| format!("{what} must be float, got {} data", t.dtype()))
}

pub(super) fn i64s<'a>(t: &'a Tensor, what: &str) -> KResult<&'a [i64]> {
    t.as_i64()
        .map_err(|_| format!("{what} must be integer, got {} data", t.dtype()))
}

pub(super) fn make(shape: Vec<usize>, data: Vec<f32>) -> KResult<Tensor> {
    Tensor::f32(shape, data).map_err(|e| e.to_string())
}

pub(super) fn make_i64(shape: Vec<usize>, data: Vec<i64>) -> KResult<Tensor> {
    Tensor::i64(shape, data).map_err(|e| e.to_string())
}

/// Requires `t` to have rank `rank`.
pub(super) fn rank(t: &Tensor, what: &str, rank: usize) -> KResult<()> {
    if t.shape().len() == rank {
        Ok(())
    } else {
        Err(format!(
            "{what} must have rank {rank}, has shape {:?}",
            t.shape()
        ))
    }
}

/// Dot product accumulated in f64, in eight independent lanes (vectorizes; the order of the
/// additions depends only on the length).
#[inline]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f64 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f64; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] as f64 * y[l] as f64;
        }
    }
    let mut tail = 0f64;
    for (x, y) in ra.iter().zip(rb) {
        tail += *x as f64 * *y as f64;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// `x [rows, k] · w [n, k]ᵀ → [rows, n]`, parallel over tiles of 8 rows × 32 columns so that a
/// weight row is read once per 8 input rows.
pub(super) fn linear(x: &[f32], rows: usize, k: usize, w: &[f32], n: usize) -> Vec<f32> {
    const RB: usize = 8;
    const CB: usize = 32;
    let mut out = vec![0f32; rows * n];
    if rows == 0 || n == 0 || k == 0 {
        return out;
    }
    out.par_chunks_mut(RB * n)
        .enumerate()
        .for_each(|(rb, block)| {
            let r0 = rb * RB;
            let nr = block.len() / n;
            let tiles: Vec<(usize, Vec<f32>)> = (0..n.div_ceil(CB))
                .into_par_iter()
                .map(|cb| {
                    let (c0, c1) = (cb * CB, ((cb + 1) * CB).min(n));
                    let width = c1 - c0;
                    let mut tile = vec![0f32; nr * width];
                    for c in c0..c1 {
                        let wr = &w[c * k..(c + 1) * k];
                        for r in 0..nr {
                            let xr = &x[(r0 + r) * k..(r0 + r + 1) * k];
                            tile[r * width + c - c0] = dot(xr, wr) as f32;
                        }
                    }
                    (c0, tile)
                })
                .collect();
            for (c0, tile) in tiles {
                let width = tile.len() / nr;
                for r in 0..nr {
                    block[r * n + c0..r * n + c0 + width]
                        .copy_from_slice(&tile[r * width..(r + 1) * width]);
                }
            }
        });
    out
}

/// `x [.., K] · w [N, K]ᵀ → [.., N]`.
pub(super) fn matmul(x: &Tensor, w: &Tensor) -> KResult<Tensor> {
    let (xd, wd) = (f32s(x, "x")?, f32s(w, "w")?);
    rank(w, "w", 2)?;
    let (n, k) = (w.shape()[0], w.shape()[1]);
    if x.shape().last() != Some(&k) {
        return Err(format!(
            "inner dims differ: x {:?}, w {:?}",
            x.shape(),
            w.shape()
        ));
    }
    let rows: usize = x.shape()[..x.shape().len() - 1].iter().product();
    debug_assert!(k == 0 || rows == xd.len() / k);
    let mut shape = x.shape().to_vec();
    *shape.last_mut().unwrap() = n;
    make(shape, linear(xd, rows, k, wd, n))
}

/// Per-head linear: `x [.., H, K]`, `w [H, N, K]` → `[.., H, N]`.
pub(super) fn matmul_heads(x: &Tensor, w: &Tensor) -> KResult<Tensor> {
    let (xd, wd) = (f32s(x, "x")?, f32s(w, "w")?);
    rank(w, "w", 3)?;
    let (h, n, k) = (w.shape()[0], w.shape()[1], w.shape()[2]);
    let r = x.shape().len();
    if r < 2 || x.shape()[r - 2] != h || x.shape()[r - 1] != k {
        return Err(format!(
            "x {:?} does not end in [heads {h}, inner {k}] of w {:?}",
            x.shape(),
            w.shape()
        ));
    }
    let rows: usize = x.shape()[..r - 2].iter().product();
    let per_head: Vec<Vec<f32>> = (0..h)
        .into_par_iter()
        .map(|hh| {
            let mut xh = Vec::with_capacity(rows * k);
            for row in 0..rows {
                xh.extend_from_slice(&xd[(row * h + hh) * k..(row * h + hh + 1) * k]);
            }
            linear(&xh, rows, k, &wd[hh * n * k..(hh + 1) * n * k], n)
        })
        .collect();
    let mut out = vec![0f32; rows * h * n];
    for (hh, y) in per_head.iter().enumerate() {
        for row in 0..rows {
            out[(row * h + hh) * n..(row * h + hh + 1) * n]
                .copy_from_slice(&y[row * n..(row + 1) * n]);
        }
    }
    let mut shape = x.shape().to_vec();
    shape[r - 1] = n;
    make(shape, out)
}

/// Elementwise `f(x, y)` where `y`'s shape is a trailing suffix of `x`'s (broadcast).
pub(super) fn binary(x: &Tensor, y: &Tensor, f: fn(f32, f32) -> f32) -> KResult<Tensor> {
    let (xd, yd) = (f32s(x, "lhs")?, f32s(y, "rhs")?);
    if !x.shape().ends_with(y.shape()) {
        return Err(format!(
            "rhs shape {:?} is not a trailing part of lhs shape {:?}",
            y.shape(),
            x.shape()
        ));
    }
    let out: Vec<f32> = if yd.is_empty() {
        Vec::new()
    } else {
        xd.par_chunks(yd.len())
            .flat_map_iter(|c| c.iter().zip(yd).map(|(&a, &b)| f(a, b)))
            .collect()
    };
    make(x.shape().to_vec(), out)
}

/// Elementwise `f`, computed in f64.
pub(super) fn unary(x: &Tensor, f: impl Fn(f64) -> f64 + Sync) -> KResult<Tensor> {
    let xd = f32s(x, "x")?;
    let out: Vec<f32> = xd.par_iter().map(|&v| f(v as f64) as f32).collect();
    make(x.shape().to_vec(), out)
}

/// No-op between floats; rounds float to integer; converts integer to float.
pub(super) fn cast(x: &Tensor, dtype: DType) -> KResult<Tensor> {
    match (x.as_f32(), x.as_i64(), dtype.is_float()) {
        (Ok(_), _, true) | (_, Ok(_), false) => Ok(x.clone()),
        (Ok(v), _, false) => {
            let out = v
                .iter()
                .enumerate()
                .map(|(i, &f)| {
                    let r = f.round();
                    if r.is_finite() && (r as f64).abs() < 9.2e18 {
                        Ok(r as i64)
                    } else {
                        Err(format!("element {i} ({f}) cannot be cast to {dtype}"))
                    }
                })
                .collect::<KResult<Vec<i64>>>()?;
            make_i64(x.shape().to_vec(), out)
        }
        (_, Ok(v), true) => make(x.shape().to_vec(), v.iter().map(|&i| i as f32).collect()),
        _ => unreachable!("a tensor holds f32 or i64 data"),
    }
}

/// The length of the last axis, checked against a 1-D parameter (norm weight or bias).
fn normalised_dim(x: &Tensor, params: &[(&Tensor, &str)]) -> KResult<usize> {
    let d = *x
        .shape()
        .last()
        .ok_or_else(|| "x must have at least one axis".to_string())?;
    for (p, what) in params {
        if p.shape() != [d] {
            return Err(format!(
                "{what} has shape {:?}, the normalised axis of x {:?} is {d}",
                p.shape(),
                x.shape()
            ));
        }
    }
    Ok(d)
}

/// `w ⊙ x / sqrt(mean(x²) + eps)` over the last axis, statistics in f64.
pub(super) fn rmsnorm(x: &Tensor, w: &Tensor, eps: f64) -> KResult<Tensor> {
    let (xd, wd) = (f32s(x, "x")?, f32s(w, "weight")?);
    let d = normalised_dim(x, &[(w, "weight")])?;
    let mut out = vec![0f32; xd.len()];
    if d > 0 {
        out.par_chunks_mut(d)
            .zip(xd.par_chunks(d))
            .for_each(|(o, row)| {
                let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / d as f64;
                let inv = 1.0 / (ms + eps).sqrt();
                for ((o, &v), &g) in o.iter_mut().zip(row).zip(wd) {
                    *o = (g as f64 * (v as f64 * inv)) as f32;
                }
            });
    }
    make(x.shape().to_vec(), out)
}

/// `(x − μ) / sqrt(var + eps) · w + b` over the last axis (biased variance), in f64.
pub(super) fn layernorm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> KResult<Tensor> {
    let (xd, wd, bd) = (f32s(x, "x")?, f32s(w, "weight")?, f32s(b, "bias")?);
    let d = normalised_dim(x, &[(w, "weight"), (b, "bias")])?;
    let mut out = vec![0f32; xd.len()];
    if d > 0 {
        out.par_chunks_mut(d)
            .zip(xd.par_chunks(d))
            .for_each(|(o, row)| {
                let mean = row.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
                let var = row
                    .iter()
                    .map(|&v| (v as f64 - mean) * (v as f64 - mean))
                    .sum::<f64>()
                    / d as f64;
                let inv = 1.0 / (var + eps).sqrt();
                for (i, o) in o.iter_mut().enumerate() {
                    *o = ((row[i] as f64 - mean) * inv * wd[i] as f64 + bd[i] as f64) as f32;
                }
            });
    }
    make(x.shape().to_vec(), out)
}

/// Rotary embedding of the last axis of `x [n, .., R]`, row `i` at `positions[i]`; angles and
/// rotations in f64.
pub(super) fn rope(
    x: &Tensor,
    positions: &[usize],
    interleaved: bool,
    theta: f64,
) -> KResult<Tensor> {
    let xd = f32s(x, "x")?;
    let shape = x.shape();
    if shape.len() < 2 {
        return Err(format!("x must have rank ≥ 2, has shape {shape:?}"));
    }
    let r = shape[shape.len() - 1];
    if !r.is_multiple_of(2) {
        return Err(format!("rotary dim {r} must be even"));
    }
    if positions.len() != shape[0] {
        return Err(format!(
            "{} positions for {} rows",
            positions.len(),
            shape[0]
        ));
    }
    let half = r / 2;
    let inv_freq: Vec<f64> = (0..half)
        .map(|i| theta.powf(-((2 * i) as f64) / r as f64))
        .collect();
    let row_len: usize = shape[1..].iter().product();
    let mut out = vec![0f32; xd.len()];
    if row_len > 0 && r > 0 {
        out.par_chunks_mut(row_len)
            .zip(xd.par_chunks(row_len))
            .zip(positions.par_iter())
            .for_each(|((o, row), &p)| {
                let cs: Vec<(f64, f64)> = inv_freq
                    .iter()
                    .map(|&f| {
                        let (s, c) = (p as f64 * f).sin_cos();
                        (c, s)
                    })
                    .collect();
                for (ov, xv) in o.chunks_mut(r).zip(row.chunks(r)) {
                    for (i, &(c, s)) in cs.iter().enumerate() {
                        let (a, b) = if interleaved {
                            (2 * i, 2 * i + 1)
                        } else {
                            (i, i + half)
                        };
                        let (xa, xb) = (xv[a] as f64, xv[b] as f64);
                        ov[a] = (xa * c - xb * s) as f32;
                        ov[b] = (xb * c + xa * s) as f32;
                    }
                }
            });
    }
    make(shape.to_vec(), out)
}

/// Rows of `table [V, D]` at `ids [..]` → `[.., D]`.
pub(super) fn embed(table: &Tensor, ids: &Tensor) -> KResult<Tensor> {
    let td = f32s(table, "table")?;
    let id = i64s(ids, "ids")?;
    rank(table, "table", 2)?;
    let (v, d) = (table.shape()[0], table.shape()[1]);
    let mut out = Vec::with_capacity(id.len() * d);
    for (i, &t) in id.iter().enumerate() {
        if t < 0 || t as u64 >= v as u64 {
            return Err(format!(
                "token id {t} (element {i} of ids) is outside the vocabulary of {v}"
            ));
        }
        let t = t as usize;
        out.extend_from_slice(&td[t * d..(t + 1) * d]);
    }
    let mut shape = ids.shape().to_vec();
    shape.push(d);
    make(shape, out)
}

/// `embed.shard`: the rows of `table [V/N, D]`, which holds vocabulary rows
/// `start..start + V/N`, at `ids [..]`; zeros for an id outside that range (another rank's).
pub(super) fn embed_shard(table: &Tensor, ids: &Tensor, start: u64) -> KResult<Tensor> {
    let td = f32s(table, "table")?;
    let id = i64s(ids, "ids")?;
    rank(table, "table", 2)?;
    let (v, d) = (table.shape()[0], table.shape()[1]);
    let mut out = vec![0.0; id.len() * d];
    for (i, &t) in id.iter().enumerate() {
        if t < 0 {
            return Err(format!("token id {t} (element {i} of ids) is negative"));
        }
        let Some(row) = (t as u64).checked_sub(start).filter(|&r| r < v as u64) else {
            continue;
        };
        let row = row as usize;
        out[i * d..(i + 1) * d].copy_from_slice(&td[row * d..(row + 1) * d]);
    }
    let mut shape = ids.shape().to_vec();
    shape.push(d);
    make(shape, out)
}
