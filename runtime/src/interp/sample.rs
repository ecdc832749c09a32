//! The ends of a phase: `slice.last` and the samplers, whose per-row math is
//! [`crate::sampling`]'s.

use rayon::prelude::*;

use super::kernels::{f32s, make_i64, rank, KResult};
use crate::sampling;
use crate::tensor::Tensor;

/// `x[n−1]` of `x [n, ..]`, as `[1, ..]`.
pub(super) fn slice_last(x: &Tensor) -> KResult<Tensor> {
    match x.shape().first() {
        Some(&n) if n > 0 => x.slice(0, n - 1, n).map_err(|e| e.to_string()),
        _ => Err(format!("no last row in a tensor of shape {:?}", x.shape())),
    }
}

/// `logits [n, V]` as rows.
fn rows(logits: &Tensor) -> KResult<std::slice::Chunks<'_, f32>> {
    rank(logits, "logits", 2)?;
    let v = logits.shape()[1];
    Ok(f32s(logits, "logits")?.chunks(v.max(1)))
}

/// A token id, −1 for "none" (a row of only NaN), as the op says.
fn id(token: Option<usize>) -> i64 {
    token.map_or(-1, |t| t as i64)
}

pub(super) fn argmax(logits: &Tensor) -> KResult<Tensor> {
    let n = logits.shape().first().copied().unwrap_or(0);
    let ids: Vec<i64> = rows(logits)?
        .take(n)
        .map(|r| id(sampling::argmax(r)))
        .collect();
    make_i64(vec![n], ids)
}

pub(super) fn top_p(
    logits: &Tensor,
    temperature: &Tensor,
    top_p: &Tensor,
    uniform: &Tensor,
) -> KResult<Tensor> {
    let n = logits.shape().first().copied().unwrap_or(0);
    let per_row = |t: &Tensor, what: &str| -> KResult<Vec<f32>> {
        let v = f32s(t, what)?;
        if t.shape() != [n] {
            return Err(format!(
                "{what} has shape {:?}, expected [{n}] (one per logits row)",
                t.shape()
            ));
        }
        Ok(v.to_vec())
    };
    let (t, p, u) = (
        per_row(temperature, "temperature")?,
        per_row(top_p, "top_p")?,
        per_row(uniform, "uniform")?,
    );
    if let Some((i, x)) = u.iter().enumerate().find(|(_, x)| !(0.0..1.0).contains(*x)) {
        return Err(format!("uniform of row {i} is {x}, outside [0, 1)"));
    }
    let rows: Vec<&[f32]> = rows(logits)?.take(n).collect();
    let ids: Vec<i64> = rows
        .par_iter()
        .enumerate()
        .map(|(i, r)| id(sampling::sample_row(r, t[i], p[i], u[i])))
        .collect();
    make_i64(vec![n], ids)
}
