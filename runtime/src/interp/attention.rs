//! MLA attention (expanded and absorbed) and the DSA indexer (scores and top-k).
//!
//! Keys come from caches of shape `[t, ..]` (prefill: every query row reads the same cache) or
//! `[b, t, ..]` (decode: query row `i` reads batch row `i`). Query row `i` sees key `j` iff
//! `j ≤ positions[i]`, and, when sparse, `j` is among `topk[i]` (−1 entries are padding).
//! Logits, softmax and the weighted value sums are computed in f64.

use rayon::prelude::*;

use super::kernels::{dot, f32s, i64s, make, make_i64, KResult};
use crate::tensor::Tensor;

/// A cache operand: `[(b,) t, (H,) d]`.
struct Keys<'a> {
    data: &'a [f32],
    batched: bool,
    t: usize,
    /// Per-head (`H` vectors per key) or shared by all heads.
    heads: usize,
    dim: usize,
}

impl<'a> Keys<'a> {
    /// Reads a cache of shape `[(b,) t, H, d]` (`per_head`) or `[(b,) t, d]`.
    fn new(t: &'a Tensor, what: &str, per_head: bool, rows: usize) -> KResult<Keys<'a>> {
        let data = f32s(t, what)?;
        let s = t.shape();
        let tail = if per_head { 2 } else { 1 };
        if s.len() != tail + 1 && s.len() != tail + 2 {
            return Err(format!(
                "{what} must have rank {} or {} (batched), has shape {s:?}",
                tail + 1,
                tail + 2
            ));
        }
        let batched = s.len() == tail + 2;
        if batched && s[0] != rows {
            return Err(format!(
                "{what} {s:?} has {} sequences for {rows} query rows",
                s[0]
            ));
        }
        let t_axis = s.len() - tail - 1;
        Ok(Keys {
            data,
            batched,
            t: s[t_axis],
            heads: if per_head { s[s.len() - 2] } else { 1 },
            dim: s[s.len() - 1],
        })
    }

    /// Key `j` of query row `i`, head `h`.
    #[inline]
    fn at(&self, i: usize, j: usize, h: usize) -> &[f32] {
        let b = if self.batched { i } else { 0 };
        let hh = if self.heads == 1 { 0 } else { h };
        let off = ((b * self.t + j) * self.heads + hh) * self.dim;
        &self.data[off..off + self.dim]
    }
}

/// A query operand `[n, H, d]`.
struct Queries<'a> {
    data: &'a [f32],
    heads: usize,
    dim: usize,
}

impl<'a> Queries<'a> {
    fn new(t: &'a Tensor, what: &str, n: usize, heads: usize) -> KResult<Queries<'a>> {
        let data = f32s(t, what)?;
        let s = t.shape();
        if s.len() != 3 || s[0] != n || s[1] != heads {
            return Err(format!("{what} must be [{n}, {heads}, d], has shape {s:?}"));
        }
        Ok(Queries {
            data,
            heads,
            dim: s[2],
        })
    }

    #[inline]
    fn at(&self, i: usize, h: usize) -> &[f32] {
        let off = (i * self.heads + h) * self.dim;
        &self.data[off..off + self.dim]
    }
}

/// The keys one query row sees.
enum Visible {
    /// Keys `0..=last`.
    Causal(usize),
    /// These keys, ascending, without duplicates.
    List(Vec<usize>),
}

impl Visible {
    fn for_each(&self, mut f: impl FnMut(usize)) {
        match self {
            Visible::Causal(last) => (0..=*last).for_each(f),
            Visible::List(l) => l.iter().for_each(|&j| f(j)),
        }
    }
}

/// Each row's visible keys: causal, intersected with the row's top-k when given.
fn visible(positions: &[usize], t: usize, topk: Option<&Tensor>) -> KResult<Vec<Visible>> {
    let n = positions.len();
    if let Some(i) = positions.iter().position(|&p| p >= t) {
        return Err(format!(
            "query row {i} is at position {}, but the cache holds {t} keys",
            positions[i]
        ));
    }
    let Some(topk) = topk else {
        return Ok(positions.iter().map(|&p| Visible::Causal(p)).collect());
    };
    let idx = i64s(topk, "topk")?;
    let s = topk.shape();
    if s.len() != 2 || s[0] != n {
        return Err(format!("topk must be [{n}, K], has shape {s:?}"));
    }
    let k = s[1];
    (0..n)
        .map(|i| {
            let mut list = Vec::with_capacity(k);
            for &j in &idx[i * k..(i + 1) * k] {
                if j < -1 {
                    return Err(format!("topk row {i} holds index {j}"));
                }
                if j >= 0 && j as u64 <= positions[i] as u64 {
                    list.push(j as usize);
                }
            }
            list.sort_unstable();
            list.dedup();
            Ok(Visible::List(list))
        })
        .collect()
}

/// `out(i,h) = Σ_j softmax_j(scale · Σ_parts q_part(i,h)·k_part(i,j,h)) · v(i,j,h)`, `[n, H, dv]`.
/// A row that sees no key gets zeros.
fn attend(
    parts: &[(Queries, Keys)],
    v: &Keys,
    rows: &[Visible],
    heads: usize,
    scale: f64,
) -> Vec<f32> {
    let dv = v.dim;
    let n = rows.len();
    let mut out = vec![0f32; n * heads * dv];
    if dv == 0 {
        return out;
    }
    out.par_chunks_mut(dv).enumerate().for_each(|(ih, o)| {
        let (i, h) = (ih / heads, ih % heads);
        let mut keys = Vec::new();
        let mut logits = Vec::new();
        rows[i].for_each(|j| {
            let l: f64 = parts
                .iter()
                .map(|(q, k)| dot(q.at(i, h), k.at(i, j, h)))
                .sum();
            keys.push(j);
            logits.push(scale * l);
        });
        if keys.is_empty() {
            return;
        }
        let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut z = 0.0;
        for l in &mut logits {
            *l = (*l - max).exp();
            z += *l;
        }
        let mut acc = vec![0f64; dv];
        for (&j, &p) in keys.iter().zip(&logits) {
            let p = p / z;
            for (a, &x) in acc.iter_mut().zip(v.at(i, j, h)) {
                *a += p * x as f64;
            }
        }
        for (o, a) in o.iter_mut().zip(acc) {
            *o = a as f32;
        }
    });
    out
}

fn same_context(what: &str, a: &Keys, b: &Keys, a_name: &str) -> KResult<()> {
    if a.t != b.t || a.batched != b.batched {
        return Err(format!(
            "{what} and {a_name} disagree on the context (t {} vs {}, batched {} vs {})",
            b.t, a.t, b.batched, a.batched
        ));
    }
    Ok(())
}

fn check_dims(what: &str, a: usize, b: usize) -> KResult<()> {
    if a != b {
        return Err(format!("{what} differ: {a} vs {b}"));
    }
    Ok(())
}

/// Expanded MLA: `q_nope [n,H,P]`, `q_pe [n,H,R]`, `k_nope [(b,)t,H,P]`, `k_pe [(b,)t,R]`,
/// `v [(b,)t,H,V]` → `[n,H,V]`.
#[allow(clippy::too_many_arguments)]
pub(super) fn mla_expanded(
    q_nope: &Tensor,
    q_pe: &Tensor,
    k_nope: &Tensor,
    k_pe: &Tensor,
    v: &Tensor,
    positions: &[usize],
    topk: Option<&Tensor>,
    scale: f64,
) -> KResult<Tensor> {
    let n = positions.len();
    let heads = q_nope.shape().get(1).copied().unwrap_or(0);
    let qn = Queries::new(q_nope, "q_nope", n, heads)?;
    let qp = Queries::new(q_pe, "q_pe", n, heads)?;
    let kn = Keys::new(k_nope, "k_nope", true, n)?;
    let kp = Keys::new(k_pe, "k_pe", false, n)?;
    let vv = Keys::new(v, "v", true, n)?;
    same_context("k_pe", &kn, &kp, "k_nope")?;
    same_context("v", &kn, &vv, "k_nope")?;
    check_dims("heads of q and k_nope", heads, kn.heads)?;
    check_dims("heads of q and v", heads, vv.heads)?;
    check_dims("nope dims of q and k", qn.dim, kn.dim)?;
    check_dims("rope dims of q and k", qp.dim, kp.dim)?;
    let rows = visible(positions, kn.t, topk)?;
    let dv = vv.dim;
    let out = attend(&[(qn, kn), (qp, kp)], &vv, &rows, heads, scale);
    make(vec![n, heads, dv], out)
}

/// Absorbed MLA: `q_abs [n,H,L]`, `q_pe [n,H,R]`, `c_kv [(b,)t,L]`, `k_pe [(b,)t,R]` →
/// `[n,H,L]` (the value is the latent itself).
pub(super) fn mla_absorbed(
    q_abs: &Tensor,
    q_pe: &Tensor,
    c_kv: &Tensor,
    k_pe: &Tensor,
    positions: &[usize],
    topk: Option<&Tensor>,
    scale: f64,
) -> KResult<Tensor> {
    let n = positions.len();
    let heads = q_abs.shape().get(1).copied().unwrap_or(0);
    let qa = Queries::new(q_abs, "q_abs", n, heads)?;
    let qp = Queries::new(q_pe, "q_pe", n, heads)?;
    let c = Keys::new(c_kv, "c_kv", false, n)?;
    let kp = Keys::new(k_pe, "k_pe", false, n)?;
    let cv = Keys::new(c_kv, "c_kv", false, n)?;
    same_context("k_pe", &c, &kp, "c_kv")?;
    check_dims("latent dims of q_abs and c_kv", qa.dim, c.dim)?;
    check_dims("rope dims of q and k", qp.dim, kp.dim)?;
    let rows = visible(positions, c.t, topk)?;
    let l = cv.dim;
    let out = attend(&[(qa, c), (qp, kp)], &cv, &rows, heads, scale);
    make(vec![n, heads, l], out)
}

/// Indexer scores `I(i,j) = Σ_h w[i,h] · relu(q[i,h]·k[j])` in f64: `q [n,Hi,D]`, `w [n,Hi]`,
/// `k [(b,)t,D]` → `f32 [n,t]`, `−inf` where `j > positions[i]`.
pub(super) fn dsa_score(
    q: &Tensor,
    w: &Tensor,
    k: &Tensor,
    positions: &[usize],
) -> KResult<Tensor> {
    let n = positions.len();
    let heads = q.shape().get(1).copied().unwrap_or(0);
    let qq = Queries::new(q, "q", n, heads)?;
    let wd = f32s(w, "w")?;
    if w.shape() != [n, heads] {
        return Err(format!(
            "w must be [{n}, {heads}], has shape {:?}",
            w.shape()
        ));
    }
    let kk = Keys::new(k, "k", false, n)?;
    check_dims("dims of q and k", qq.dim, kk.dim)?;
    let t = kk.t;
    if let Some(i) = positions.iter().position(|&p| p >= t) {
        return Err(format!(
            "query row {i} is at position {}, but the cache holds {t} keys",
            positions[i]
        ));
    }
    let mut out = vec![f32::NEG_INFINITY; n * t];
    if t > 0 {
        out.par_chunks_mut(t).enumerate().for_each(|(i, row)| {
            for (j, o) in row.iter_mut().enumerate().take(positions[i] + 1) {
                let key = kk.at(i, j, 0);
                let mut s = 0f64;
                for h in 0..heads {
                    let d = dot(qq.at(i, h), key);
                    if d > 0.0 {
                        s += wd[i * heads + h] as f64 * d;
                    }
                }
                *o = s as f32;
            }
        });
    }
    make(vec![n, t], out)
}

/// Per row, the `k` best keys among `j ≤ positions[i]` (higher score, ties to the lower index),
/// in ascending key order; a row with at most `k` keys gets all of them, padded with −1.
pub(super) fn dsa_topk(scores: &Tensor, positions: &[usize], k: usize) -> KResult<Tensor> {
    let sd = f32s(scores, "scores")?;
    let s = scores.shape();
    let n = positions.len();
    if s.len() != 2 || s[0] != n {
        return Err(format!("scores must be [{n}, t], has shape {s:?}"));
    }
    let t = s[1];
    if k == 0 {
        return Err("k must be positive".into());
    }
    if let Some(i) = positions.iter().position(|&p| p >= t) {
        return Err(format!(
            "row {i} is at position {}, but the scores cover {t} keys",
            positions[i]
        ));
    }
    let rows: Vec<Vec<i64>> = (0..n)
        .into_par_iter()
        .map(|i| {
            let valid = positions[i] + 1;
            let row = &sd[i * t..i * t + valid];
            if let Some(j) = row.iter().position(|x| x.is_nan()) {
                return Err(format!("score ({i}, {j}) is NaN"));
            }
            let mut picked: Vec<i64> = if valid <= k {
                (0..valid as i64).collect()
            } else {
                let better = |a: &usize, b: &usize| {
                    row[*b]
                        .partial_cmp(&row[*a])
                        .expect("no NaN")
                        .then(a.cmp(b))
                };
                let mut idx: Vec<usize> = (0..valid).collect();
                idx.select_nth_unstable_by(k - 1, better);
                idx.truncate(k);
                idx.sort_unstable();
                idx.into_iter().map(|j| j as i64).collect()
            };
            picked.resize(k, -1);
            Ok(picked)
        })
        .collect::<KResult<_>>()?;
    make_i64(vec![n, k], rows.concat())
}
