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

/// Checks that `idx [n,k]` holds expert ids below `ne`; the message names the first bad pair.
fn check_ids(id: &[i64], k: usize, ne: usize) -> KResult<()> {
    match id.iter().position(|&e| e < 0 || e as u64 >= ne as u64) {
        Some(a) => Err(format!(
            "expert {} (row {}, slot {}) is outside the {ne} experts",
            id[a],
            a / k.max(1),
            a % k.max(1)
        )),
        None => Ok(()),
    }
}

/// `moe.sort`: the counting sort of the (token, slot) pairs by expert, stable. Returns
/// `(offsets [E+1], order [n,k], position [n,k])`.
pub(super) fn sort(idx: &Tensor, ne: usize) -> KResult<(Tensor, Tensor, Tensor)> {
    let id = i64s(idx, "experts")?;
    rank(idx, "experts", 2)?;
    check_ids(id, idx.shape()[1], ne)?;
    let mut offsets = vec![0i64; ne + 1];
    for &e in id {
        offsets[e as usize + 1] += 1;
    }
    for e in 0..ne {
        offsets[e + 1] += offsets[e];
    }
    let mut next = offsets.clone();
    let (mut order, mut position) = (vec![0i64; id.len()], vec![0i64; id.len()]);
    for (pair, &e) in id.iter().enumerate() {
        let row = next[e as usize];
        next[e as usize] += 1;
        order[row as usize] = pair as i64;
        position[pair] = row;
    }
    let shape = idx.shape().to_vec();
    Ok((
        make_i64(vec![ne + 1], offsets)?,
        make_i64(shape.clone(), order)?,
        make_i64(shape, position)?,
    ))
}

/// The expert owning each routed row, from `offsets [E+1]`, checked to be a partition of the
/// `rows` routed rows.
fn owners(offsets: &Tensor, rows: usize) -> KResult<Vec<usize>> {
    let off = i64s(offsets, "offsets")?;
    rank(offsets, "offsets", 1)?;
    let ok = off.first() == Some(&0)
        && off.last() == Some(&(rows as i64))
        && off.windows(2).all(|w| w[0] <= w[1]);
    if !ok {
        return Err(format!(
            "offsets {off:?} do not split the {rows} routed rows among the experts"
        ));
    }
    let mut owner = Vec::with_capacity(rows);
    for (e, w) in off.windows(2).enumerate() {
        owner.extend(std::iter::repeat_n(e, (w[1] - w[0]) as usize));
    }
    Ok(owner)
}

/// Runs `f(e, rows of e)` for each expert with routed rows, in parallel, and scatters its
/// `[m, n]` result into the `[rows, n]` output at the expert's rows.
fn per_expert(
    owner: &[usize],
    n: usize,
    f: impl Fn(usize, std::ops::Range<usize>) -> Vec<f32> + Sync,
) -> Vec<f32> {
    let mut spans: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
    for (r, &e) in owner.iter().enumerate() {
        match spans.last_mut() {
            Some((last, span)) if *last == e => span.end = r + 1,
            _ => spans.push((e, r..r + 1)),
        }
    }
    let outs: Vec<Vec<f32>> = spans
        .par_iter()
        .map(|(e, span)| f(*e, span.clone()))
        .collect();
    let mut y = vec![0f32; owner.len() * n];
    for ((_, span), out) in spans.iter().zip(outs) {
        y[span.start * n..span.end * n].copy_from_slice(&out);
    }
    y
}

/// `moe.gate_up`: `x [n,D]`, `order [n,k]`, `offsets [E+1]`, `gate/up [E,I,D]` → `[n,k,I]`.
pub(super) fn gate_up(
    x: &Tensor,
    order: &Tensor,
    offsets: &Tensor,
    gate: &Tensor,
    up: &Tensor,
) -> KResult<Tensor> {
    let (xd, od) = (f32s(x, "x")?, i64s(order, "order")?);
    let (gd, ud) = (f32s(gate, "gate")?, f32s(up, "up")?);
    rank(x, "x", 2)?;
    rank(order, "order", 2)?;
    rank(gate, "gate", 3)?;
    let (n, d) = (x.shape()[0], x.shape()[1]);
    let (k, pairs) = (order.shape()[1], od.len());
    let (ne, inter) = (gate.shape()[0], gate.shape()[1]);
    if order.shape()[0] != n || gate.shape()[2] != d || up.shape() != gate.shape() {
        return Err(format!(
            "x {:?}, order {:?}, gate {:?}, up {:?} do not fit",
            x.shape(),
            order.shape(),
            gate.shape(),
            up.shape()
        ));
    }
    if let Some(r) = od.iter().position(|&p| p < 0 || p as usize >= pairs) {
        return Err(format!(
            "order[{r}] = {} is not one of the {pairs} pairs",
            od[r]
        ));
    }
    if offsets.shape() != [ne + 1] {
        return Err(format!("offsets {:?} for {ne} experts", offsets.shape()));
    }
    let owner = owners(offsets, pairs)?;
    let gsz = inter * d;
    let y = per_expert(&owner, inter, |e, span| {
        let mut xe = Vec::with_capacity(span.len() * d);
        for r in span.clone() {
            let t = od[r] as usize / k;
            xe.extend_from_slice(&xd[t * d..(t + 1) * d]);
        }
        let m = span.len();
        let g = linear(&xe, m, d, &gd[e * gsz..(e + 1) * gsz], inter);
        let u = linear(&xe, m, d, &ud[e * gsz..(e + 1) * gsz], inter);
        g.iter()
            .zip(&u)
            .map(|(&g, &u)| {
                let g = g as f64;
                (g / (1.0 + (-g).exp()) * u as f64) as f32
            })
            .collect()
    });
    make(vec![n, k, inter], y)
}

/// `moe.down`: `h [n,k,I]` (routed rows), `offsets [E+1]`, `down [E,D,I]` → `[n,k,D]`.
pub(super) fn down(h: &Tensor, offsets: &Tensor, down: &Tensor) -> KResult<Tensor> {
    let (hd, dd) = (f32s(h, "h")?, f32s(down, "down")?);
    rank(h, "h", 3)?;
    rank(down, "down", 3)?;
    let (n, k, inter) = (h.shape()[0], h.shape()[1], h.shape()[2]);
    let (ne, d) = (down.shape()[0], down.shape()[1]);
    if down.shape()[2] != inter || offsets.shape() != [ne + 1] {
        return Err(format!(
            "h {:?}, offsets {:?}, down {:?} do not fit",
            h.shape(),
            offsets.shape(),
            down.shape()
        ));
    }
    let owner = owners(offsets, n * k)?;
    let dsz = d * inter;
    let y = per_expert(&owner, d, |e, span| {
        let rows = &hd[span.start * inter..span.end * inter];
        linear(rows, span.len(), inter, &dd[e * dsz..(e + 1) * dsz], d)
    });
    make(vec![n, k, d], y)
}

/// `moe.combine`: `y[t] = Σ_j weights[t,j] · rows[position[t,j]] (+ shared[t])`, in f64, slot
/// order.
pub(super) fn combine(
    rows: &Tensor,
    position: &Tensor,
    weights: &Tensor,
    shared: Option<&Tensor>,
) -> KResult<Tensor> {
    let (rd, pd, wd) = (
        f32s(rows, "rows")?,
        i64s(position, "position")?,
        f32s(weights, "weights")?,
    );
    rank(rows, "rows", 3)?;
    let (n, k, d) = (rows.shape()[0], rows.shape()[1], rows.shape()[2]);
    if position.shape() != [n, k] || weights.shape() != [n, k] {
        return Err(format!(
            "position {:?} and weights {:?} must be [{n}, {k}]",
            position.shape(),
            weights.shape()
        ));
    }
    if let Some(a) = pd.iter().position(|&p| p < 0 || p as usize >= n * k) {
        return Err(format!("position[{a}] = {} is not a routed row", pd[a]));
    }
    let sd = match shared {
        Some(s) if s.shape() != [n, d] => {
            return Err(format!("shared {:?} must be [{n}, {d}]", s.shape()))
        }
        Some(s) => Some(f32s(s, "shared")?),
        None => None,
    };
    let mut y = vec![0f32; n * d];
    y.par_chunks_mut(d.max(1)).enumerate().for_each(|(t, out)| {
        for (c, o) in out.iter_mut().enumerate() {
            let mut acc = sd.map_or(0.0, |s| s[t * d + c] as f64);
            for j in 0..k {
                let r = pd[t * k + j] as usize;
                acc += wd[t * k + j] as f64 * rd[r * d + c] as f64;
            }
            *o = acc as f32;
        }
    });
    make(vec![n, d], y)
}
