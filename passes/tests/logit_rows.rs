//! `LogitRows::Last` (the default: the final norm and `lm_head` on the last position only)
//! computes what `LogitRows::All` computes for that position, and both draw the same
//! `next_token`, as built and after the whole pipeline.

mod support;

use glmc_ir::Module;
use glmc_models::builder::{BuildOptions, LogitRows};
use glmc_passes::{pipeline, PipelineOptions};
use glmc_runtime::{prefill_inputs, Interpreter, Sampling, SequenceCache, Tensor};
use support::*;

/// `prefill` of `ids` from an empty cache: (logits, next_token).
fn prefill(m: &Module, weights: &Weights, ids: &[i64], sampling: &Sampling) -> (Tensor, i64) {
    let positions: Vec<i64> = (0..ids.len() as i64).collect();
    let inputs = prefill_inputs(ids, &positions, sampling, 0, 0);
    let f = m.function("prefill").expect("a prefill function");
    let mut cache = SequenceCache::new();
    let mut out = Interpreter::new()
        .run(m, f, weights, &mut [&mut cache], &inputs)
        .unwrap_or_else(|e| panic!("prefill: {e}"));
    let next = out[1].as_i64().expect("integer next_token")[0];
    (out.swap_remove(0), next)
}

#[test]
fn last_position_logits_are_the_last_row_of_all() {
    let sampled = Sampling {
        temperature: 1.5,
        top_p: 0.9,
        seed: 11,
    };
    for file in ["tiny-sparse.ron", "tiny-dense.ron"] {
        let config = shipped(file);
        let all = build(&config);
        let last = glmc_models::builder::build(&config, &BuildOptions::default())
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(BuildOptions::default().logits, LogitRows::Last);
        let weights = Weights::random(&all, 5);
        let ids = random_ids(vocab(&all), 7, 3);
        for optimize in [false, true] {
            let mut pair = [all.clone(), last.clone()];
            if optimize {
                for m in &mut pair {
                    pipeline(&PipelineOptions::default())
                        .unwrap()
                        .run(m)
                        .unwrap_or_else(|e| panic!("{file}: {e}"));
                }
            }
            for sampling in [Sampling::default(), sampled] {
                let (every, next_all) = prefill(&pair[0], &weights, &ids, &sampling);
                let (one, next_last) = prefill(&pair[1], &weights, &ids, &sampling);
                let vocab = every.shape()[1];
                assert_eq!(every.shape(), [ids.len(), vocab], "{file}");
                assert_eq!(one.shape(), [1, vocab], "{file}");
                let every = every.as_f32().unwrap();
                let row = &every[(ids.len() - 1) * vocab..];
                let one = one.as_f32().unwrap();
                let worst = row
                    .iter()
                    .zip(one)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(worst <= 1e-5, "{file} optimize={optimize}: max |Δ| {worst}");
                assert_eq!(
                    next_all, next_last,
                    "{file} optimize={optimize} {sampling:?}"
                );
            }
            let greedy = prefill(&pair[1], &weights, &ids, &Sampling::default());
            let argmax = glmc_runtime::sampling::argmax(greedy.0.as_f32().unwrap());
            assert_eq!(
                greedy.1,
                argmax.unwrap() as i64,
                "{file}: greedy is the argmax"
            );
        }
    }
}
