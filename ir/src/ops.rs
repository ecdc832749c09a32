//! The op table. One macro invocation gives the `Op` enum, each op's text name, its arity and
//! its attributes; the printer, the parser and RON all go through it.
//!
//! Conventions shared by the ops below:
//! - `matmul` is a linear layer in the HF layout: `x [.., K] · W [N, K]ᵀ → [.., N]`.
//! - Positions are absolute token indices (`i64`), one per query row. A query at position `p` may
//!   see cached keys `0..=p`; in `decode`, query row `i` belongs to sequence `i` of the batch and
//!   its caches carry a leading batch dimension.
//! - Attention and indexer ops take the caches returned by `cache.update`, so the KV state is
//!   explicit in the graph.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::lit::{expected, AttrValue, Lit};
use crate::{DType, Dim, Recipe};

/// How many operands an op takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arity {
    Exact(usize),
    AtLeast(usize),
    /// From the first to the second, both included.
    Between(usize, usize),
}

impl Arity {
    pub fn accepts(self, n: usize) -> bool {
        match self {
            Arity::Exact(k) => n == k,
            Arity::AtLeast(k) => n >= k,
            Arity::Between(lo, hi) => (lo..=hi).contains(&n),
        }
    }
}

impl std::fmt::Display for Arity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Arity::Exact(k) => write!(f, "{k}"),
            Arity::AtLeast(k) => write!(f, "at least {k}"),
            Arity::Between(lo, hi) => write!(f, "{lo} to {hi}"),
        }
    }
}

macro_rules! ops {
    ($(
        $(#[$doc:meta])*
        $variant:ident $text:literal [$($arity:tt)*] { $($field:ident : $ty:ty),* $(,)? }
    )*) => {
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        pub enum Op {
            $( $(#[$doc])* $variant { $($field: $ty),* }, )*
        }

        impl Op {
            /// Every op's text name, in table order.
            pub const NAMES: &'static [&'static str] = &[$($text),*];

            pub fn name(&self) -> &'static str {
                match self { $( Op::$variant { .. } => $text, )* }
            }

            #[allow(unused_variables)]
            pub fn arity(&self) -> Arity {
                match self { $( Op::$variant { $($field),* } => { $($arity)* } )* }
            }

            /// The attributes, sorted by name.
            pub fn attrs(&self) -> Vec<(&'static str, Lit)> {
                let mut attrs: Vec<(&'static str, Lit)> = match self {
                    $( Op::$variant { $($field),* } => vec![$((stringify!($field), $field.to_lit())),*], )*
                };
                attrs.sort_by_key(|(k, _)| *k);
                attrs
            }

            /// Builds an op from its text name and attributes; the error says which attribute is
            /// missing, unknown or of the wrong kind.
            pub fn from_parts(name: &str, attrs: &BTreeMap<String, Lit>) -> Result<Op, String> {
                match name {
                    $( $text => {
                        let known: &[&str] = &[$(stringify!($field)),*];
                        if let Some(k) = attrs.keys().find(|k| !known.contains(&k.as_str())) {
                            return Err(format!("op `{}` has no attribute `{k}` (it has: {})", $text, known.join(", ")));
                        }
                        Ok(Op::$variant { $(
                            $field: {
                                let lit = attrs.get(stringify!($field)).ok_or_else(|| {
                                    format!("op `{}` needs attribute `{}`", $text, stringify!($field))
                                })?;
                                <$ty as AttrValue>::from_lit(lit)
                                    .map_err(|e| format!("attribute `{}` of `{}`: {e}", stringify!($field), $text))?
                            },
                        )* })
                    } )*
                    other => Err(format!("unknown op `{other}`")),
                }
            }
        }
    };
}

ops! {
    /// Function argument number `index`; its type is declared on the node.
    Input "input" [Arity::Exact(0)] { index: u64 }
    /// A weight made from checkpoint tensors by `recipe`; the node's dtype is the compute dtype.
    Weight "weight" [Arity::Exact(0)] { recipe: Recipe }
    /// `table [V, D]`, `ids int[..]` → `[.., D]`.
    Embed "embed" [Arity::Exact(2)] {}
    /// One rank's part of a vocab-parallel lookup: `table [V/N, D]` holds vocabulary rows
    /// `start..start + V/N`, `ids int[..]` → `[.., D]`, the row of an id in that range and zeros
    /// for any other id, so an `all_reduce` over the ranks gives `embed` of the whole table.
    EmbedShard "embed.shard" [Arity::Exact(2)] { start: u64 }
    /// `x [.., K]`, `w [N, K]` → `[.., N]` in w's dtype. x has w's dtype, or is bf16 or f16
    /// against an f32 `w` (`fuse-elementwise` folds the widening `cast` of x into the matmul):
    /// widening is exact, so that equals the matmul of x cast to f32.
    Matmul "matmul" [Arity::Exact(2)] {}
    /// Per-head linear: `x [.., H, K]`, `w [H, N, K]` → `[.., H, N]`.
    MatmulHeads "matmul.heads" [Arity::Exact(2)] {}
    /// Elementwise; the right operand may be a trailing suffix of the left's shape (broadcast).
    Add "add" [Arity::Exact(2)] {}
    Mul "mul" [Arity::Exact(2)] {}
    /// `silu(g) ⊙ u` (`fuse-elementwise`): `g`, `u` of one type → that type. Equal to
    /// `mul(silu(g), u)`, the activation rounded to the node's dtype before the product.
    Swiglu "swiglu" [Arity::Exact(2)] {}
    /// Multiplication by a constant.
    Scale "scale" [Arity::Exact(1)] { factor: f64 }
    Silu "silu" [Arity::Exact(1)] {}
    Relu "relu" [Arity::Exact(1)] {}
    Cast "cast" [Arity::Exact(1)] { dtype: DType }
    /// `w ⊙ x / sqrt(mean(x²) + eps)` over the last axis; `x [.., D]`, `w [D]`.
    RmsNorm "rmsnorm" [Arity::Exact(2)] { eps: f64 }
    /// A residual add and the RMSNorm that reads it (`fuse-elementwise`): `h [.., D]`, `d` (as
    /// `add`'s rhs), `w [D]` → two outputs of `h`'s type: `rmsnorm(r, w)` and the sum
    /// `r = h + d` (for the next residual add). Each equals its unfused op (the norm reads the
    /// sum as stored). The normalised value is output 0 because the node carries the norm's
    /// name, and a name stands for a node's output 0 wherever values are compared by name.
    AddRmsNorm "add.rmsnorm" [Arity::Exact(3)] { eps: f64 }
    /// `(x − μ) / sqrt(var + eps) · w + b` over the last axis.
    LayerNorm "layernorm" [Arity::Exact(3)] { eps: f64 }
    /// Rotary embedding of the whole last axis of `x [n, .., R]` at `positions [n]`, with
    /// frequencies `theta^(−2i/R)`; `interleaved` rotates pairs `(2i, 2i+1)`, otherwise `(i, i+R/2)`.
    Rope "rope" [Arity::Exact(2)] { interleaved: bool, theta: f64 }
    /// `matmul` with rope in its epilogue (`fuse-elementwise`): `x [n, .., K]`, `w [N, K]`,
    /// `positions [n]` → `[n, .., N]`, the matmul's output where, in every block of `period`
    /// consecutive columns, columns `start..end` are rotated as one rope vector (`rope` with
    /// `interleaved`, `theta` and R = `end − start`) at the position of the row (axis 0).
    /// `period` divides N; `period` = N rotates one range per row, `period` = head dim one per
    /// head of a `[n, H, D]` view.
    MatmulRope "matmul.rope" [Arity::Exact(3)] {
        end: u64, interleaved: bool, period: u64, start: u64, theta: f64,
    }
    Reshape "reshape" [Arity::Exact(1)] { shape: Vec<Dim> }
    /// Elements `start..end` of `axis`.
    Slice "slice" [Arity::Exact(1)] { axis: u64, start: u64, end: u64 }
    Concat "concat" [Arity::AtLeast(1)] { axis: u64 }
    /// The last row of axis 0: `x [n, ..]` → `[1, ..]`, `x[n−1]`. `slice` cannot say this when
    /// `n` is symbolic; prefill uses it to run the final norm and `lm_head` on the one position
    /// whose logits generation needs.
    SliceLast "slice.last" [Arity::Exact(1)] {}
    /// Writes `new [n, ..]` at `positions [n]` into the cache `state` and returns the cache up
    /// to the furthest position: `[t, ..]`, or `[b, t, ..]` with one sequence per row when
    /// `batched` (decode: row `i` is cache slot `i`). Unbatched (prefill), an optional third
    /// operand `slot i64[1]` names the cache slot the `n` rows of one sequence go to (slot 0
    /// without it); the attention and indexer ops reading the result read that slot.
    CacheUpdate "cache.update" [if *batched { Arity::Exact(2) } else { Arity::Between(2, 3) }] { batched: bool, state: String }
    /// A `cache.update` that makes its rows (`fuse-cache-update`): `x [n, C]`, `w [D]` (D ≤ C),
    /// `bias [D]` when `layernorm`, `positions [n]` and, unbatched, an optional `slot` as for
    /// `cache.update` → one cache per entry of `states`, as `cache.update` returns it. Columns
    /// `0..D` of each row are normalised over the last axis (`rmsnorm` with `w`, or `layernorm`
    /// with `w`, `bias`; `eps`), then `rope` (when given) rotates columns `start..end` of that
    /// at the row's position, and the row goes to `states[0]`; when C > D, columns `D..C` go
    /// unchanged to `states[1]`. Equal to `cache.update`s of the unfused ops, the normalised
    /// row rounded to x's dtype before it is rotated (as the unfused norm stores it).
    CacheUpdateNorm "cache.update.norm" [{
        let fixed = 3 + usize::from(*layernorm);
        if *batched { Arity::Exact(fixed) } else { Arity::Between(fixed, fixed + 1) }
    }] {
        batched: bool, eps: f64, layernorm: bool, rope: Option<RopeSpan>, states: Vec<String>,
    }
    /// Expanded MLA attention: `q_nope [n,H,P]`, `q_pe [n,H,R]`, `k_nope [(b,)t,H,P]`,
    /// `k_pe [(b,)t,R]` (one rope key shared by all heads), `v [(b,)t,H,V]`, `positions [n]`, and
    /// when `sparse` the selected keys `topk [n,K]` (−1 = none) → `[n,H,V]`.
    ///
    /// `dense_until` states the exactness rule of top-k attention: a query whose context holds at
    /// most that many keys selects every key, so the top-k operand may be ignored for it and the
    /// indexer skipped (0: no such claim). The result is the same either way.
    MlaAttend "mla.attend" [Arity::Exact(if *sparse { 7 } else { 6 })] { dense_until: u64, scale: f64, sparse: bool }
    /// Absorbed MLA attention over the latent cache: `q_abs [n,H,L]`, `q_pe [n,H,R]`,
    /// `c_kv [(b,)t,L]`, `k_pe [(b,)t,R]`, `positions [n]`, (`topk [n,K]`) → `[n,H,L]`.
    MlaAttendAbsorbed "mla.attend.absorbed" [Arity::Exact(if *sparse { 6 } else { 5 })] {
        dense_until: u64, scale: f64, sparse: bool,
    }
    /// DSA indexer scores `Σ_h w'[n,h] · relu(q[n,h]·k[t])`: `q [n,Hi,D]`, `w [n,Hi]`,
    /// `k [(b,)t,D]`, `positions [n]` → `f32 [n,t]`, `−inf` where `t > position`. `w'` is `w`
    /// scaled as `scale` with factor `weight_scale` would (the product rounded to w's dtype):
    /// the builder sets 1, and `fuse-elementwise` folds the head weights' `scale` in.
    DsaScore "dsa.score" [Arity::Exact(4)] { weight_scale: f64 }
    /// The `k` best keys per row of `scores [n,t]` among `t ≤ position` (higher score, then lower
    /// index) → `i64 [n,k]` in ascending key order, padded with −1 when a row has fewer than `k`
    /// keys. A set, not a ranking: attention over it does not depend on the order, and key order
    /// spares the kernel a sort and gathers cache rows in address order.
    DsaTopk "dsa.topk" [Arity::Exact(2)] { k: u64 }
    /// Sigmoid router: `logits f32 [n,E]`, `bias [E]` (selection only) → `weights f32 [n,k]`,
    /// `experts i64 [n,k]`. Groups of `E/n_group` experts, scored by the sum of their two best,
    /// keep `topk_group` groups and the experts of the other groups cannot be chosen (−inf, as
    /// transformers 5.17 does; the `group-routing` oracle fixture tells this apart from a 0
    /// fill); weights are normalised when `norm_topk_prob`, then scaled.
    MoeRoute "moe.route" [Arity::Exact(2)] {
        n_group: u64, norm_topk_prob: bool, routed_scaling_factor: f64, top_k: u64, topk_group: u64,
    }
    /// Routed SwiGLU experts: `x [n,D]`, `weights [n,k]`, `experts [n,k]`, `gate [E,I,D]`,
    /// `up [E,I,D]`, `down [E,D,I]` → `Σ_j weights[j] · down(silu(gate x) ⊙ up x)`, `[n,D]`.
    MoeExperts "moe.experts" [Arity::Exact(6)] {}
    /// `lower-moe`'s counting sort of the routed (token, slot) pairs by expert: `experts i64
    /// [n,k]` (ids below `experts`) → `offsets i64 [experts+1]`, `order i64 [n,k]`,
    /// `position i64 [n,k]`. The n·k routed rows are the pairs grouped by expert, expert `e`
    /// owning rows `offsets[e]..offsets[e+1]`, stable (within an expert, pairs in index order
    /// `t·k + j`); `order` (read flat) gives each routed row its pair index and `position` each
    /// pair its routed row. Only the split among experts depends on the data, so every shape
    /// is static.
    MoeSort "moe.sort" [Arity::Exact(1)] { experts: u64 }
    /// The routed experts' SwiGLU (`lower-moe`): `x [n,D]`, `order [n,k]`, `offsets [E+1]`
    /// (from `moe.sort`), `gate [E,I,D]`, `up [E,I,D]` → `[n,k,I]` in x's dtype, routed row `r`
    /// (read flat) = `silu(gate_e · x[t]) ⊙ (up_e · x[t])` with `t = order[r] / k` and `e` the
    /// expert owning `r`.
    MoeGateUp "moe.gate_up" [Arity::Exact(5)] {}
    /// The routed experts' down projection (`lower-moe`): `h [n,k,I]` (routed rows), `offsets
    /// [E+1]`, `down [E,D,I]` → `[n,k,D]`, routed row `r` = `down_e · h[r]`.
    MoeDown "moe.down" [Arity::Exact(3)] {}
    /// The weighted sum of each token's routed rows (`lower-moe`): `rows [n,k,D]`, `position
    /// [n,k]`, `weights f32 [n,k]`, and when `shared` the shared experts' output `[n,D]` →
    /// `[n,D]`, `y[t] = Σ_j weights[t,j] · rows[position[t,j]] (+ shared[t])`, summed in slot
    /// order.
    MoeCombine "moe.combine" [Arity::Exact(if *shared { 4 } else { 3 })] { shared: bool }
    /// Greedy choice: `logits [n, V]` (any float dtype) → `i64 [n]`, per row the index of the
    /// largest value. Ties go to the lowest index. NaN is never chosen (it compares below every
    /// number, −inf included); a row of only NaN gives −1.
    SampleArgmax "sample.argmax" [Arity::Exact(1)] {}
    /// `lm_head` and the greedy choice in one (`fuse-lm-head-argmax`): `x [n, K]`, `w [N, K]`
    /// (one float dtype) → `i64 [n]`, equal to `sample.argmax(matmul(x, w))`: per row the index
    /// of the largest logit, ties to the lowest index, NaN never chosen, −1 for a row of only
    /// NaN. The logits are those `matmul` gives in x's dtype (a GPU rounds them to it, as the
    /// unfused `matmul` stores them, so both forms pick the same token).
    MatmulArgmax "matmul.argmax" [Arity::Exact(2)] {}
    /// Temperature and nucleus (top-p) sampling: `logits [n, V]` (any float dtype),
    /// `temperature f32 [n]`, `top_p f32 [n]`, `uniform f32 [n]` → `i64 [n]`. `uniform[i]` is
    /// one draw in [0, 1) supplied by the caller (`glmc_runtime::sampling::uniform`, a
    /// counter-based generator, so every device draws the same numbers). Per row `i`, with
    /// `x = logits[i]`, `T = temperature[i]`, `P = top_p[i]`, `u = uniform[i]`:
    ///
    /// 1. Unless `T > 0` (so for 0, negative and NaN), the result is `sample.argmax` of the row.
    ///    NaN entries are left out of every step below; a row of only NaN gives −1.
    /// 2. `m = max_j x_j`. When `m` is not finite (+inf, or every entry −inf) the result is
    ///    the argmax, as in 1.
    /// 3. `e_j = exp((x_j − m) / T)`, `Z = Σ_j e_j`, `p_j = e_j / Z` (the interpreter computes
    ///    in f64 from the f32 values and sums `Z` in index order).
    /// 4. Order the tokens by `p` descending, ties by lower index. `c_k` is the cumulative sum
    ///    of the first `k` probabilities in that order. The nucleus is the first `K` tokens,
    ///    `K` the smallest `k ≥ 1` with `c_k ≥ P`, or every token when no prefix reaches `P`
    ///    (rounding can keep `c_V` just below 1). `M = c_K` is the nucleus mass.
    /// 5. The result is the first token `k` of the nucleus (in that order) with `c_k > u · M`;
    ///    the last nucleus token if rounding leaves none. Tokens of probability 0 are never
    ///    chosen.
    SampleTopP "sample.top_p" [Arity::Exact(4)] {}
    /// Tensor parallelism: every one of the `ranks` ranks holds its `x` (one type on all ranks)
    /// and each gets the elementwise reduction of them all (`op`: `sum`). The sum is taken in
    /// rank order, so every rank holds the same bits.
    AllReduce "all_reduce" [Arity::Exact(1)] { op: Reduce, ranks: u64 }
    /// Tensor parallelism: rank `r`'s `x` becomes block `r` of `axis` in the result, whose
    /// `axis` is `ranks` times as long (a constant); every rank gets the whole result.
    AllGather "all_gather" [Arity::Exact(1)] { axis: u64, ranks: u64 }
}

/// The reduction of an `all_reduce`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reduce {
    Sum,
}

impl AttrValue for Reduce {
    fn to_lit(&self) -> Lit {
        match self {
            Reduce::Sum => Lit::Ident("sum".into()),
        }
    }
    fn from_lit(lit: &Lit) -> Result<Self, String> {
        match lit {
            Lit::Ident(s) if s == "sum" => Ok(Reduce::Sum),
            other => expected("a reduction (sum)", other),
        }
    }
}

/// Columns `start..end` of a row rotated as one `rope` vector (`interleaved`, `theta`), printed
/// `interleaved(start, end, theta)` or `halves(start, end, theta)` after the pairing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RopeSpan {
    pub start: u64,
    pub end: u64,
    pub interleaved: bool,
    pub theta: f64,
}

impl AttrValue for RopeSpan {
    fn to_lit(&self) -> Lit {
        let pairing = if self.interleaved {
            "interleaved"
        } else {
            "halves"
        };
        Lit::Call(
            pairing.to_string(),
            vec![self.start.to_lit(), self.end.to_lit(), self.theta.to_lit()],
        )
    }
    fn from_lit(lit: &Lit) -> Result<Self, String> {
        let Lit::Call(pairing, args) = lit else {
            return expected("a rope span such as interleaved(0, 64, 10000.0)", lit);
        };
        let interleaved = match pairing.as_str() {
            "interleaved" => true,
            "halves" => false,
            other => {
                return Err(format!(
                    "unknown rope pairing `{other}` (interleaved, halves)"
                ))
            }
        };
        let [start, end, theta] = &args[..] else {
            return Err(format!(
                "`{pairing}` takes start, end and theta, found {} arguments",
                args.len()
            ));
        };
        Ok(RopeSpan {
            start: u64::from_lit(start)?,
            end: u64::from_lit(end)?,
            interleaved,
            theta: f64::from_lit(theta)?,
        })
    }
}

impl Op {
    /// Ops with an effect beyond their outputs; dead-code elimination keeps them.
    pub fn has_side_effect(&self) -> bool {
        !self.cache_states().is_empty()
    }

    /// The cache states an op writes, output `k` being the cache of `states[k]`.
    pub fn cache_states(&self) -> &[String] {
        match self {
            Op::CacheUpdate { state, .. } => std::slice::from_ref(state),
            Op::CacheUpdateNorm { states, .. } => states,
            _ => &[],
        }
    }

    /// Where a cache-writing op's positions operand is, the optional `slot` coming right after.
    pub fn positions_operand(&self) -> Option<usize> {
        match self {
            Op::CacheUpdate { .. } => Some(1),
            Op::CacheUpdateNorm { layernorm, .. } => Some(2 + usize::from(*layernorm)),
            _ => None,
        }
    }

    /// Whether a cache-writing op writes one sequence per row (decode).
    pub fn batched_cache(&self) -> bool {
        matches!(
            self,
            Op::CacheUpdate { batched: true, .. } | Op::CacheUpdateNorm { batched: true, .. }
        )
    }
}
