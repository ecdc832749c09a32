//! The sigmoid router and the routed SwiGLU experts.

use rayon::prelude::*;

use super::kernels::{f32s, i64s, linear, make, make_i64, rank, KResult};
use crate::tensor::Tensor;

pub(super) struct RouteParams {
    pub n_group: usize,
    pub topk_group: usize,
    pub top_k: usize,
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f64,
}

/// Indices of the `k` largest of `v`, largest first, ties to the lower index.
fn top_indices(v: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[b].partial_cmp(&v[a]).expect("no NaN").then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// GLM-5 / DeepSeek-V3 routing as transformers 5.17 does it, in f64: `s = sigmoid(logits)`,
/// `choice = s + bias`; groups of `E/n_group` experts scored by the sum of their two best choices
/// (the best one for groups of one; group ties: lower index), the best `topk_group` groups kept
/// and the other experts' choices set to −inf (`masked_fill(~score_mask, -inf)` in
/// `GlmMoeDsaTopkRouter.forward`, as the op table and the `group-routing` oracle fixture say; a
/// 0.0 fill would let a dropped group's expert beat a negative kept one); the `top_k` best
/// choices (ties: lower index) select experts whose weights are `s`, normalised by `Σ + 1e-20`
/// when `norm_topk_prob`, then scaled.
/// Returns `(weights f32 [n,k], experts i64 [n,k])`, best choice first.
pub(super) fn route(logits: &Tensor, bias: &Tensor, p: &RouteParams) -> KResult<(Tensor, Tensor)> {
    let (ld, bd) = (f32s(logits, "logits")?, f32s(bias, "bias")?);
    rank(logits, "logits", 2)?;
    let (n, e) = (logits.shape()[0], logits.shape()[1]);
    if bias.shape() != [e] {
        return Err(format!(
            "bias has shape {:?}, the logits have {e} experts",
            bias.shape()
        ));
    }
    if p.n_group == 0 || e % p.n_group != 0 || p.topk_group == 0 || p.topk_group > p.n_group {
        return Err(format!(
            "{e} experts cannot form {} groups keeping {}",
            p.n_group, p.topk_group
        ));
    }
    let group = e / p.n_group;
    if p.top_k == 0 || p.top_k > p.topk_group * group {
        return Err(format!(
            "top_k {} exceeds the {} experts of the kept groups",
            p.top_k,
            p.topk_group * group
        ));
    }
    if let Some(i) = ld.iter().chain(bd).position(|x| x.is_nan()) {
        return Err(format!("NaN in the router logits or bias (element {i})"));
    }
    let k = p.top_k;
    let rows: Vec<(Vec<f32>, Vec<i64>)> = ld
        .par_chunks(e.max(1))
        .take(n)
        .map(|row| {
            let s: Vec<f64> = row
                .iter()
                .map(|&x| 1.0 / (1.0 + (-(x as f64)).exp()))
                .collect();
            let mut choice: Vec<f64> = s.iter().zip(bd).map(|(&s, &b)| s + b as f64).collect();
            if p.topk_group < p.n_group {
                let scores: Vec<f64> = choice
                    .chunks(group)
                    .map(|g| top_indices(g, 2).iter().map(|&i| g[i]).sum())
                    .collect();
                let kept = top_indices(&scores, p.topk_group);
                for (g, chunk) in choice.chunks_mut(group).enumerate() {
                    if !kept.contains(&g) {
                        chunk.fill(f64::NEG_INFINITY);
                    }
                }
            }
            let idx = top_indices(&choice, k);
            let mut w: Vec<f64> = idx.iter().map(|&i| s[i]).collect();
            if p.norm_topk_prob {
                let sum: f64 = w.iter().sum();
                w.iter_mut().for_each(|x| *x /= sum + 1e-20);
            }
            (
                w.iter()
                    .map(|&x| (x * p.routed_scaling_factor) as f32)
                    .collect(),
                idx.into_iter().map(|i| i as i64).collect(),
            )
        })
        .collect();
    let (w, idx): (Vec<Vec<f32>>, Vec<Vec<i64>>) = rows.into_iter().unzip();
    Ok((
        make(vec![n, k], w.concat())?,
        make_i64(vec![n, k], idx.concat())?,
    ))
}

/// Experts processed in parallel at a time; bounds the memory of their outputs.
const EXPERT_CHUNK: usize = 32;

/// `y[i] = Σ_j w[i,j] · down_e(silu(gate_e x[i]) ⊙ up_e x[i])`, `e = experts[i,j]`: `x [n,D]`,
/// `gate/up [E,I,D]`, `down [E,D,I]`. Tokens are grouped by expert; the experts' contributions
/// are added in expert-index order (then slot order) in f64, whatever the thread count.
pub(super) fn experts(
    x: &Tensor,
    w: &Tensor,
    idx: &Tensor,
    gate: &Tensor,
    up: &Tensor,
    down: &Tensor,
) -> KResult<Tensor> {
    let xd = f32s(x, "x")?;
    let wd = f32s(w, "weights")?;
    let id = i64s(idx, "experts")?;
    let (gd, ud, dd) = (f32s(gate, "gate")?, f32s(up, "up")?, f32s(down, "down")?);
    rank(x, "x", 2)?;
    rank(w, "weights", 2)?;
    rank(gate, "gate", 3)?;
    let (n, d) = (x.shape()[0], x.shape()[1]);
    let k = w.shape()[1];
    if w.shape()[0] != n || idx.shape() != w.shape() {
        return Err(format!(
            "weights {:?} and experts {:?} must both be [{n}, k]",
            w.shape(),
            idx.shape()
        ));
    }
    let (ne, inter) = (gate.shape()[0], gate.shape()[1]);
    if gate.shape() != [ne, inter, d]
        || up.shape() != gate.shape()
        || down.shape() != [ne, d, inter]
    {
        return Err(format!(
            "gate {:?}, up {:?}, down {:?} do not fit x {:?}",
            gate.shape(),
            up.shape(),
            down.shape(),
            x.shape()
        ));
    }
    let mut assigned: Vec<Vec<(usize, usize)>> = vec![Vec::new(); ne];
    for (a, &e) in id.iter().enumerate() {
        if e < 0 || e as u64 >= ne as u64 {
            return Err(format!(
                "expert {e} (row {}, slot {}) is outside the {ne} experts",
                a / k.max(1),
                a % k.max(1)
            ));
        }
        assigned[e as usize].push((a / k, a % k));
    }
    let mut y = vec![0f64; n * d];
    let (gsz, dsz) = (inter * d, d * inter);
    let used: Vec<usize> = (0..ne).filter(|&e| !assigned[e].is_empty()).collect();
    for chunk in used.chunks(EXPERT_CHUNK) {
        let outs: Vec<Vec<f32>> = chunk
            .par_iter()
            .map(|&e| {
                let rows = &assigned[e];
                let m = rows.len();
                let mut xe = Vec::with_capacity(m * d);
                for &(i, _) in rows {
                    xe.extend_from_slice(&xd[i * d..(i + 1) * d]);
                }
                let g = linear(&xe, m, d, &gd[e * gsz..(e + 1) * gsz], inter);
                let u = linear(&xe, m, d, &ud[e * gsz..(e + 1) * gsz], inter);
                let h: Vec<f32> = g
                    .iter()
                    .zip(&u)
                    .map(|(&g, &u)| {
                        let g = g as f64;
                        (g / (1.0 + (-g).exp()) * u as f64) as f32
                    })
                    .collect();
                linear(&h, m, inter, &dd[e * dsz..(e + 1) * dsz], d)
            })
            .collect();
        for (&e, out) in chunk.iter().zip(&outs) {
            for (r, &(i, j)) in assigned[e].iter().enumerate() {
                let wt = wd[i * k + j] as f64;
                for (acc, &v) in y[i * d..(i + 1) * d]
                    .iter_mut()
                    .zip(&out[r * d..(r + 1) * d])
                {
                    *acc += wt * v as f64;
                }
            }
        }
    }
    make(vec![n, d], y.into_iter().map(|v| v as f32).collect())
}
