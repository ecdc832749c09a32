//! Choosing the next token. This module is the one definition of the sampling math: the
//! interpreter's `sample.argmax` and `sample.top_p` kernels call [`argmax`] and [`sample_row`]
//! (the op table in `glmc_ir::ops` states the same rules for GPU kernels). Around it: the
//! counter-based generator of the ops' `uniform` operand, so a run is reproducible from its
//! command line on any device, and [`check_frequencies`], the statistical check of drawn tokens
//! that the CPU tests and a GPU harness share.

/// How to pick tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`.
    pub top_p: f32,
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    #[error("--temperature must be a finite number >= 0 (0 = greedy), got {0}")]
    Temperature(f32),
    #[error("--top-p must be in (0, 1], got {0}")]
    TopP(f32),
    #[error("the logits row holds only NaN; nothing can be sampled")]
    BadLogits,
}

impl Sampling {
    pub fn validate(&self) -> Result<(), SamplingError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(SamplingError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplingError::TopP(self.top_p));
        }
        Ok(())
    }

    /// The uniform draw of batch row `row` at generation step `step` (see [`uniform`]).
    pub fn uniform(&self, step: u64, row: u64) -> f32 {
        uniform(self.seed, step, row)
    }
}

/// SplitMix64's output function of `x` (one step from state `x`): a small, well-known mixer,
/// reproducible across platforms and releases, which a dependency's generator does not promise.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The `uniform` operand of `sample.top_p` for `(seed, step, row)`:
/// `h = splitmix64(splitmix64(splitmix64(seed) ^ step) ^ row)`, then `(h >> 40) / 2^24`.
///
/// Counter-based (no state carried between draws), so a GPU computes the same value for the
/// same triple; 24 bits make it exact in f32 and strictly below 1.
pub fn uniform(seed: u64, step: u64, row: u64) -> f32 {
    let h = splitmix64(splitmix64(splitmix64(seed) ^ step) ^ row);
    (h >> 40) as f32 / (1u64 << 24) as f32
}

/// `sample.argmax` of one row: the index of the largest value, the lowest on ties; NaN is never
/// chosen, and a row of only NaN (or an empty row) gives `None`.
pub fn argmax(xs: &[f32]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, &x) in xs.iter().enumerate() {
        if x.is_nan() {
            continue;
        }
        if best.is_none_or(|b| x > xs[b]) {
            best = Some(i);
        }
    }
    best
}

/// `sample.top_p` of one row (the rules are those of the op's documentation): the token drawn
/// from the nucleus of `softmax(logits / temperature)` by `uniform` in [0, 1). `None` only for
/// a row of only NaN.
pub fn sample_row(logits: &[f32], temperature: f32, top_p: f32, uniform: f32) -> Option<usize> {
    let Some((order, kept)) = nucleus(logits, temperature, top_p) else {
        return argmax(logits);
    };
    let acc = cumulative(&order[..kept]);
    let r = uniform as f64 * acc[kept - 1];
    let k = acc.iter().position(|&c| c > r).unwrap_or(kept - 1);
    Some(order[k].0)
}

/// The distribution [`sample_row`] draws from when `uniform` is uniform on [0, 1): one
/// probability per token, the softmax restricted to the nucleus and renormalised, 0 outside it.
/// For a row that [`sample_row`] answers by argmax, all the mass is on the argmax.
pub fn nucleus_probabilities(logits: &[f32], temperature: f32, top_p: f32) -> Vec<f64> {
    let mut out = vec![0.0; logits.len()];
    match nucleus(logits, temperature, top_p) {
        Some((order, kept)) => {
            let mass: f64 = order[..kept].iter().map(|p| p.1).sum();
            for &(i, p) in &order[..kept] {
                out[i] = p / mass;
            }
        }
        None => {
            if let Some(i) = argmax(logits) {
                out[i] = 1.0;
            }
        }
    }
    out
}

/// Steps 2–4 of `sample.top_p`: `(token, probability)` most likely first (ties by lower index)
/// and the nucleus size `K`; `None` when the op falls back to argmax (`T` not > 0, no finite
/// maximum).
fn nucleus(logits: &[f32], temperature: f32, top_p: f32) -> Option<(Vec<(usize, f64)>, usize)> {
    if temperature.is_nan() || temperature <= 0.0 {
        return None;
    }
    let max = logits
        .iter()
        .filter(|x| !x.is_nan())
        .fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    if !max.is_finite() {
        return None;
    }
    let (t, max) = (temperature as f64, max as f64);
    let mut probs: Vec<(usize, f64)> = logits
        .iter()
        .enumerate()
        .filter(|(_, x)| !x.is_nan())
        .map(|(i, &x)| (i, ((x as f64 - max) / t).exp()))
        .collect();
    let total: f64 = probs.iter().map(|p| p.1).sum();
    probs.iter_mut().for_each(|p| p.1 /= total);
    probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let acc = cumulative(&probs);
    let kept = acc
        .iter()
        .position(|&c| c >= top_p as f64)
        .map_or(probs.len(), |k| k + 1);
    Some((probs, kept))
}

/// Running sums of the probabilities, in order; the nucleus and the draw use the same sums so
/// their boundaries agree bit for bit.
fn cumulative(probs: &[(usize, f64)]) -> Vec<f64> {
    let mut acc = 0.0;
    probs
        .iter()
        .map(|p| {
            acc += p.1;
            acc
        })
        .collect()
}

/// What [`check_frequencies`] measured.
#[derive(Clone, Debug, PartialEq)]
pub struct FrequencyCheck {
    pub draws: usize,
    /// Pearson's statistic over the tokens of nonzero probability.
    pub chi_square: f64,
    /// Its degrees of freedom: those tokens less one.
    pub degrees_of_freedom: usize,
}

/// Why drawn tokens do not follow the expected distribution.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FrequencyError {
    #[error("no draws to check")]
    NoDraws,
    #[error("draw {index} is token {token}, outside the {vocab} tokens of the row")]
    OutOfRange {
        index: usize,
        token: i64,
        vocab: usize,
    },
    #[error("token {token} has probability 0 (outside the nucleus) but was drawn {count} times")]
    Impossible { token: usize, count: usize },
    #[error(
        "token {token}: frequency {frequency:.5} over {draws} draws, expected {expected:.5} \
         (allowed deviation {bound:.5}, 5 standard errors)"
    )]
    Frequency {
        token: usize,
        frequency: f64,
        expected: f64,
        bound: f64,
        draws: usize,
    },
    #[error(
        "chi-square {chi_square:.1} with {degrees_of_freedom} degrees of freedom exceeds \
         {bound:.1} (df + 10·sqrt(2·df))"
    )]
    ChiSquare {
        chi_square: f64,
        degrees_of_freedom: usize,
        bound: f64,
    },
}

/// Checks that `draws` (token ids, e.g. a GPU kernel's `next_token` over many uniform draws)
/// follow `expected` (one probability per token, e.g. [`nucleus_probabilities`]):
/// - no token of probability 0 is ever drawn;
/// - per token, `|f − p| ≤ 5·sqrt(p(1−p)/N)` for frequency `f` over `N` draws;
/// - Pearson's chi-square over the tokens with `p > 0` is at most `df + 10·sqrt(2·df)` (its
///   mean plus about seven standard deviations).
///
/// The bounds are loose enough that a correct sampler fails about once in millions of runs
/// and tight enough that a probability off by 1% at N = 200 000 fails.
pub fn check_frequencies(
    expected: &[f64],
    draws: &[i64],
) -> Result<FrequencyCheck, FrequencyError> {
    if draws.is_empty() {
        return Err(FrequencyError::NoDraws);
    }
    let mut counts = vec![0usize; expected.len()];
    for (index, &token) in draws.iter().enumerate() {
        match usize::try_from(token).ok().filter(|&t| t < expected.len()) {
            Some(t) => counts[t] += 1,
            None => {
                return Err(FrequencyError::OutOfRange {
                    index,
                    token,
                    vocab: expected.len(),
                })
            }
        }
    }
    let n = draws.len() as f64;
    let mut chi_square = 0.0;
    let mut support = 0usize;
    for (token, (&p, &count)) in expected.iter().zip(&counts).enumerate() {
        if p <= 0.0 {
            if count > 0 {
                return Err(FrequencyError::Impossible { token, count });
            }
            continue;
        }
        support += 1;
        let frequency = count as f64 / n;
        let bound = 5.0 * (p * (1.0 - p) / n).sqrt();
        if (frequency - p).abs() > bound {
            return Err(FrequencyError::Frequency {
                token,
                frequency,
                expected: p,
                bound,
                draws: draws.len(),
            });
        }
        chi_square += (count as f64 - n * p).powi(2) / (n * p);
    }
    let degrees_of_freedom = support.saturating_sub(1);
    let df = degrees_of_freedom as f64;
    let bound = df + 10.0 * (2.0 * df).sqrt();
    if chi_square > bound {
        return Err(FrequencyError::ChiSquare {
            chi_square,
            degrees_of_freedom,
            bound,
        });
    }
    Ok(FrequencyCheck {
        draws: draws.len(),
        chi_square,
        degrees_of_freedom,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_the_first_maximum_and_skips_nan() {
        assert_eq!(argmax(&[0.5, 2.0, -1.0, 2.0]), Some(1));
        assert_eq!(argmax(&[f32::NAN, -3.0, f32::NAN, -2.0]), Some(3));
        assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY]), Some(1));
        assert_eq!(argmax(&[f32::NAN, f32::NAN]), None);
        assert_eq!(argmax(&[]), None);
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // Probabilities ~ [0.665, 0.245, 0.09]: top_p 0.5 keeps the first token only.
        let logits = [2.0, 1.0, 0.0];
        for step in 0..200 {
            assert_eq!(sample_row(&logits, 1.0, 0.5, uniform(7, step, 0)), Some(0));
        }
        // 0.665 < 0.9 ≤ 0.91: two tokens, renormalised to 0.731 / 0.269.
        let p = nucleus_probabilities(&logits, 1.0, 0.9);
        assert!(
            (p[0] - 0.7311).abs() < 1e-3 && (p[1] - 0.2689).abs() < 1e-3,
            "{p:?}"
        );
        assert_eq!(p[2], 0.0);
    }

    #[test]
    fn the_draw_walks_the_cumulative_mass() {
        // Probabilities 1/4, 3/4, sorted as [token 1, token 0]: u·M below 3/4 picks token 1.
        let logits = [0.0f32, (3.0f32).ln()];
        assert_eq!(sample_row(&logits, 1.0, 1.0, 0.0), Some(1));
        assert_eq!(sample_row(&logits, 1.0, 1.0, 0.74), Some(1));
        assert_eq!(sample_row(&logits, 1.0, 1.0, 0.76), Some(0));
        assert_eq!(
            sample_row(&logits, 1.0, 1.0, 1.0 - 1.0 / 16_777_216.0),
            Some(0)
        );
    }

    #[test]
    fn degenerate_rows_fall_back_to_argmax() {
        let logits = [1.0, 3.0, f32::NAN, 2.0];
        for t in [0.0, -1.0, f32::NAN] {
            assert_eq!(sample_row(&logits, t, 0.9, 0.99), Some(1));
        }
        assert_eq!(
            sample_row(&[1.0, f32::INFINITY, f32::INFINITY], 1.0, 1.0, 0.99),
            Some(1)
        );
        assert_eq!(sample_row(&[f32::NEG_INFINITY; 3], 1.0, 1.0, 0.99), Some(0));
        assert_eq!(sample_row(&[f32::NAN; 3], 1.0, 1.0, 0.5), None);
        // NaN is never drawn, even when u sweeps the whole range.
        for k in 0..100 {
            assert_ne!(sample_row(&logits, 5.0, 1.0, k as f32 / 100.0), Some(2));
        }
    }

    #[test]
    fn uniform_is_counter_based_and_in_range() {
        assert_eq!(uniform(42, 3, 1), uniform(42, 3, 1));
        assert_ne!(uniform(42, 3, 1), uniform(42, 3, 0));
        assert_ne!(uniform(42, 3, 1), uniform(42, 4, 1));
        assert_ne!(uniform(42, 3, 1), uniform(43, 3, 1));
        let draws: Vec<f32> = (0..10_000).map(|s| uniform(0, s, 0)).collect();
        assert!(draws.iter().all(|&u| (0.0..1.0).contains(&u)));
        let mean = draws.iter().map(|&u| u as f64).sum::<f64>() / draws.len() as f64;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
        // Pinned, so a GPU port can check its generator against these values.
        assert_eq!(splitmix64(0), 0xe220_a839_7b1d_cdaf);
        assert_eq!(uniform(0, 0, 0), 2_327_157.0 / 16_777_216.0);
        assert_eq!(uniform(42, 3, 1), 6_109_551.0 / 16_777_216.0);
    }

    #[test]
    fn rejects_bad_settings() {
        let bad_t = Sampling {
            temperature: -1.0,
            ..Default::default()
        };
        assert_eq!(bad_t.validate(), Err(SamplingError::Temperature(-1.0)));
        let bad_p = Sampling {
            top_p: 0.0,
            ..Default::default()
        };
        assert_eq!(bad_p.validate(), Err(SamplingError::TopP(0.0)));
        assert_eq!(Sampling::default().validate(), Ok(()));
    }

    #[test]
    fn the_frequency_check_catches_wrong_draws() {
        let expected = [0.5, 0.5, 0.0];
        let fair: Vec<i64> = (0..10_000).map(|i| i % 2).collect();
        assert!(check_frequencies(&expected, &fair).is_ok());
        let biased: Vec<i64> = (0..10_000).map(|i| i64::from(i % 3 == 0)).collect();
        assert!(matches!(
            check_frequencies(&expected, &biased),
            Err(FrequencyError::Frequency { .. })
        ));
        let mut outside = fair.clone();
        outside[17] = 2;
        assert_eq!(
            check_frequencies(&expected, &outside),
            Err(FrequencyError::Impossible { token: 2, count: 1 })
        );
        assert!(matches!(
            check_frequencies(&expected, &[3]),
            Err(FrequencyError::OutOfRange { token: 3, .. })
        ));
        assert_eq!(
            check_frequencies(&expected, &[]),
            Err(FrequencyError::NoDraws)
        );
    }
}
