//! The ops `fuse-elementwise` makes (`add.rmsnorm`, `swiglu`, `matmul.rope`), the one
//! `fuse-lm-head-argmax` makes (`matmul.argmax`) and the rows of the one `fuse-cache-update`
//! makes (`cache.update.norm`).
//!
//! Each is computed by the very kernels of the ops it replaces, in the same order and with the
//! same intermediate rounding to f32, so a fused graph gives bit-for-bit the unfused graph's
//! values. A GPU kernel fuses them to save memory traffic; this is the reference it is checked
//! against.

use glmc_ir::RopeSpan;

use super::kernels::{self, f32s, make, KResult};
use crate::tensor::Tensor;

/// `[rmsnorm(h + d, w), h + d]`: `add`, then `rmsnorm` reading the stored sum.
pub(super) fn add_rmsnorm(h: &Tensor, d: &Tensor, w: &Tensor, eps: f64) -> KResult<[Tensor; 2]> {
    let sum = kernels::binary(h, d, |x, y| x + y)?;
    let normed = kernels::rmsnorm(&sum, w, eps)?;
    Ok([normed, sum])
}

/// `silu(g) ⊙ u`: `silu`, then `mul` reading the stored activation.
pub(super) fn swiglu(g: &Tensor, u: &Tensor) -> KResult<Tensor> {
    if g.shape() != u.shape() {
        return Err(format!(
            "g {:?} and u {:?} must have one shape",
            g.shape(),
            u.shape()
        ));
    }
    let act = kernels::unary(g, super::silu)?;
    kernels::binary(&act, u, |x, y| x * y)
}

/// Where `matmul.rope` rotates: columns `start..end` of every block of `period` columns.
pub(super) struct RopeColumns {
    pub interleaved: bool,
    pub theta: f64,
    pub period: usize,
    pub start: usize,
    pub end: usize,
}

/// `matmul(x, w)`, then `rope` of columns `start..end` of every `period`-column block at the
/// row's position: the `rope` kernel runs on exactly the `[rows, blocks, R]` tensor the unfused
/// `rope(slice(reshape(matmul)))` reads, and its result is written back in place.
pub(super) fn matmul_rope(
    x: &Tensor,
    w: &Tensor,
    positions: &[usize],
    cols: &RopeColumns,
) -> KResult<Tensor> {
    let y = kernels::matmul(x, w)?;
    let shape = y.shape().to_vec();
    let &RopeColumns {
        interleaved,
        theta,
        period,
        start,
        end,
    } = cols;
    let n = *shape.last().expect("matmul output has an axis");
    if shape.len() < 2 {
        return Err(format!(
            "output {shape:?} must have rank ≥ 2 (rows, columns)"
        ));
    }
    if period == 0 || !n.is_multiple_of(period) || start >= end || end > period {
        return Err(format!(
            "columns {start}..{end} of every {period} do not fit the {n} output columns"
        ));
    }
    let rows = shape[0];
    if rows == 0 || y.numel() == 0 {
        return Ok(y);
    }
    let blocks = y.numel() / rows / period;
    let rotated = {
        let view = y
            .clone()
            .reshape(vec![rows, blocks, period])
            .map_err(|e| e.to_string())?;
        let part = view.slice(2, start, end).map_err(|e| e.to_string())?;
        kernels::rope(&part, positions, interleaved, theta)?
    };
    let mut data = f32s(&y, "matmul output")?.to_vec();
    let r = end - start;
    for (b, v) in f32s(&rotated, "rotated columns")?
        .chunks_exact(r)
        .enumerate()
    {
        let at = b * period + start;
        data[at..at + r].copy_from_slice(v);
    }
    make(shape, data)
}

/// `sample.argmax(matmul(x, w))`: the greedy token of each row of the logits, which are
/// computed as `matmul` computes them (the interpreter keeps every float in f32), so the fused
/// graph picks the unfused graph's token.
pub(super) fn matmul_argmax(x: &Tensor, w: &Tensor) -> KResult<Tensor> {
    if x.shape().len() != 2 {
        return Err(format!("x must be [n, K], is {:?}", x.shape()));
    }
    super::sample::argmax(&kernels::matmul(x, w)?)
}

/// The rows `cache.update.norm` writes, one tensor per state: `norm(x[:, ..D])` with columns
/// `rope.start..rope.end` of it rotated (the `rope` kernel on that slice of the norm's output,
/// written back in place, as the unfused `concat` of the pieces puts it), and `x[:, D..]` when
/// x is wider than the norm's D columns.
pub(super) fn norm_rows(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    eps: f64,
    rope: Option<&RopeSpan>,
    positions: &[usize],
) -> KResult<Vec<Tensor>> {
    let err = |e: crate::tensor::TensorError| e.to_string();
    let [rows, cols] = x.shape()[..] else {
        return Err(format!("x must be [n, C], is {:?}", x.shape()));
    };
    let d = w.shape().first().copied().unwrap_or(0);
    if d > cols {
        return Err(format!("{d} normalised columns of {cols}"));
    }
    let head = x.slice(1, 0, d).map_err(err)?;
    let normed = match bias {
        Some(b) => kernels::layernorm(&head, w, b, eps)?,
        None => kernels::rmsnorm(&head, w, eps)?,
    };
    let normed = match rope {
        None => normed,
        Some(r) => {
            let (start, end) = (r.start as usize, r.end as usize);
            if start >= end || end > d {
                return Err(format!("rope columns {start}..{end} of {d}"));
            }
            let part = normed.slice(1, start, end).map_err(err)?;
            let rotated = kernels::rope(&part, positions, r.interleaved, r.theta)?;
            let mut data = f32s(&normed, "normalised rows")?.to_vec();
            for (i, v) in f32s(&rotated, "rotated columns")?
                .chunks_exact(end - start)
                .enumerate()
            {
                data[i * d + start..i * d + end].copy_from_slice(v);
            }
            make(vec![rows, d], data)?
        }
    };
    let mut out = vec![normed];
    if d < cols {
        out.push(x.slice(1, d, cols).map_err(err)?);
    }
    Ok(out)
}
