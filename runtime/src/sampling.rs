//! Choosing the next token from a row of logits: greedy by default, or temperature and nucleus
//! (top-p) sampling from a seeded generator, so a run is reproducible from its command line.

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
    #[error("the logits row is empty or holds NaN; nothing can be sampled")]
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
}

/// A small, well-known generator (SplitMix64): reproducible across platforms and releases,
/// which a dependency's default generator does not promise.
pub struct Sampler {
    config: Sampling,
    state: u64,
}

impl Sampler {
    pub fn new(config: Sampling) -> Result<Sampler, SamplingError> {
        config.validate()?;
        Ok(Sampler {
            config,
            state: config.seed,
        })
    }

    fn next_f64(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The next token for one row of logits.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u64, SamplingError> {
        if logits.is_empty() || logits.iter().any(|x| x.is_nan()) {
            return Err(SamplingError::BadLogits);
        }
        if self.config.temperature == 0.0 {
            return Ok(argmax(logits));
        }
        let t = self.config.temperature as f64;
        let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
        let mut probs: Vec<(usize, f64)> = logits
            .iter()
            .enumerate()
            .map(|(i, &x)| (i, ((x as f64 - max) / t).exp()))
            .collect();
        let total: f64 = probs.iter().map(|p| p.1).sum();
        probs.iter_mut().for_each(|p| p.1 /= total);
        // Most likely first; ties by token id so the order is total.
        probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut kept = 0;
        let mut mass = 0.0;
        for p in &probs {
            kept += 1;
            mass += p.1;
            if mass >= self.config.top_p as f64 {
                break;
            }
        }
        let r = self.next_f64() * mass;
        let mut acc = 0.0;
        for &(i, p) in &probs[..kept] {
            acc += p;
            if r < acc {
                return Ok(i as u64);
            }
        }
        Ok(probs[kept - 1].0 as u64)
    }
}

/// The index of the largest value; the first one on ties.
pub fn argmax(xs: &[f32]) -> u64 {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] {
            best = i;
        }
    }
    best as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(Sampling::default()).unwrap();
        assert_eq!(s.sample(&[0.5, 2.0, -1.0, 2.0]).unwrap(), 1);
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // Probabilities ~ [0.665, 0.245, 0.09]: top_p 0.5 keeps the first token only.
        let logits = [2.0, 1.0, 0.0];
        let mut s = Sampler::new(Sampling {
            temperature: 1.0,
            top_p: 0.5,
            seed: 7,
        })
        .unwrap();
        for _ in 0..200 {
            assert_eq!(s.sample(&logits).unwrap(), 0);
        }
    }

    #[test]
    fn sampling_follows_the_softmax_and_the_seed() {
        let logits = [0.0f32, (3.0f32).ln()]; // probabilities 1/4, 3/4
        let config = Sampling {
            temperature: 1.0,
            top_p: 1.0,
            seed: 42,
        };
        let mut s = Sampler::new(config).unwrap();
        let draws: Vec<u64> = (0..4000).map(|_| s.sample(&logits).unwrap()).collect();
        let ones = draws.iter().filter(|&&t| t == 1).count() as f64 / draws.len() as f64;
        assert!((ones - 0.75).abs() < 0.03, "fraction of token 1: {ones}");
        let mut again = Sampler::new(config).unwrap();
        let replay: Vec<u64> = (0..4000).map(|_| again.sample(&logits).unwrap()).collect();
        assert_eq!(draws, replay);
    }

    #[test]
    fn rejects_bad_settings_and_nan() {
        assert_eq!(
            Sampler::new(Sampling {
                temperature: -1.0,
                ..Default::default()
            })
            .err(),
            Some(SamplingError::Temperature(-1.0))
        );
        assert_eq!(
            Sampler::new(Sampling {
                top_p: 0.0,
                ..Default::default()
            })
            .err(),
            Some(SamplingError::TopP(0.0))
        );
        let mut s = Sampler::new(Sampling::default()).unwrap();
        assert_eq!(s.sample(&[f32::NAN]), Err(SamplingError::BadLogits));
    }
}
