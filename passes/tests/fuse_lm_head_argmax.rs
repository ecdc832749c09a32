//! `fuse-lm-head-argmax`: where it applies (a greedy build that returns no logits, in f32 and
//! bf16, at decode and at prefill's last row), where it must not (a sampling build, a greedy
//! build that returns the logits, logits with another reader), its snapshot, and translation
//! validation: the reference interpreter gives the same tokens before and after the pass, and
//! the same as the sampling build at temperature 0.

#![allow(clippy::result_large_err)] // PassError is the crate's error type, returned as is

mod support;

use glmc_ir::{print_module, DType, Module, Op, Value};
use glmc_models::builder::{build, BuildOptions, LogitRows, Sampler};
use glmc_passes::fuse_lm_head_argmax::NAME;
use glmc_passes::AttentionChoice;
use support::{apply, shipped, stages, Weights, Workload};

fn greedy() -> BuildOptions {
    BuildOptions {
        sampler: Sampler::Greedy,
        ..Default::default()
    }
}

/// `file` in `dtype`, built with `options`, through the pipeline up to (not including) the pass.
fn before_pass(file: &str, dtype: DType, options: &BuildOptions) -> Module {
    let mut config = shipped(file);
    config.dtype = dtype;
    let module = build(&config, options).expect("the shipped config builds");
    stages(&module, AttentionChoice::Auto)
        .into_iter()
        .take_while(|(name, _, _)| *name != NAME)
        .last()
        .expect("the builder's stage at least")
        .1
}

fn ops(m: &Module, function: &str) -> Vec<&'static str> {
    let f = m.function(function).unwrap();
    f.canonical_order()
        .into_iter()
        .map(|n| f.node(n).op.name())
        .collect()
}

#[test]
fn a_greedy_build_fuses_lm_head_with_the_argmax_in_both_phases() {
    for file in ["tiny-sparse.ron", "tiny-dense.ron"] {
        for dtype in [DType::F32, DType::BF16] {
            let before = before_pass(file, dtype, &greedy());
            let (after, changed) = apply(NAME, AttentionChoice::Auto, &before).unwrap();
            assert!(changed, "{file} {dtype}");
            for phase in ["prefill", "decode"] {
                let f = after.function(phase).unwrap();
                let names: Vec<&str> = f.results.iter().map(|(n, _)| n.as_str()).collect();
                assert_eq!(names, ["next_token"], "{file} {dtype} @{phase}");
                let v = f.results[0].1;
                let node = f.node(v.node);
                assert_eq!(
                    (&node.op, node.name.as_str()),
                    (&Op::MatmulArgmax {}, "next_token")
                );
                let [x, w] = f.operands(v.node)[..] else {
                    panic!("two operands")
                };
                assert_eq!(f.node(w.node).name, "lm_head.weight");
                assert_eq!(f.node(x.node).name, "model.norm", "{file} {dtype} @{phase}");
                assert!(!ops(&after, phase).contains(&"sample.argmax"));
                // Neither the product nor its cast to f32 is left.
                assert!(f.find("lm_head").is_none() && f.find("logits").is_none());
            }
        }
    }
}

/// A sampling build, a greedy build that returns the logits (`--dump-logits`) and logits read
/// by anything but the argmax keep their logits path.
#[test]
fn the_logits_path_stays_where_anything_needs_the_logits() {
    let sampling = before_pass("tiny-sparse.ron", DType::BF16, &BuildOptions::default());
    let all = BuildOptions {
        logits: LogitRows::All,
        sampler: Sampler::Greedy,
    };
    let returned = before_pass("tiny-sparse.ron", DType::BF16, &all);
    assert!(ops(&returned, "decode").contains(&"sample.argmax"));
    let mut read = before_pass("tiny-sparse.ron", DType::F32, &greedy());
    let f = read.function_mut("decode").unwrap();
    let lm_head = Value::from(f.find("lm_head").unwrap());
    f.results.push(("lm_head".into(), lm_head));
    for (what, m) in [
        ("sampling", sampling),
        ("logits returned", returned),
        ("lm_head read", read),
    ] {
        let (after, changed) = apply(NAME, AttentionChoice::Auto, &m).unwrap();
        let decode_changed = ops(&after, "decode") != ops(&m, "decode");
        assert!(!decode_changed, "{what}: the decode graph changed");
        if what != "lm_head read" {
            assert!(!changed, "{what}");
        }
    }
}

#[test]
fn tiny_sparse_bf16_greedy_after_the_pass() {
    let before = before_pass("tiny-sparse.ron", DType::BF16, &greedy());
    let (after, _) = apply(NAME, AttentionChoice::Auto, &before).unwrap();
    insta::assert_snapshot!(print_module(&after));
}

/// Translation validation on random weights and random prompts (a sequence prefilled at once,
/// one in two chunks, then decoded together as a batch of two): the fused graph's tokens are
/// the unfused greedy graph's, which are the sampling build's at temperature 0.
#[test]
fn the_fused_graph_picks_the_same_tokens() {
    for dtype in [DType::F32, DType::BF16] {
        let unfused = before_pass("tiny-sparse.ron", dtype, &greedy());
        let (fused, _) = apply(NAME, AttentionChoice::Auto, &unfused).unwrap();
        let sampling = before_pass("tiny-sparse.ron", dtype, &BuildOptions::default());
        for seed in 0..3 {
            let weights = Weights::random(&sampling, seed);
            let workload = Workload::random(support::vocab(&sampling), 5, (3, 2), 3, seed);
            let want = support::next_tokens(&sampling, &weights, &workload).unwrap();
            assert_eq!(want.len(), 3 + 3 * 2);
            assert_eq!(
                support::next_tokens(&unfused, &weights, &workload).unwrap(),
                want,
                "{dtype} {seed}"
            );
            assert_eq!(
                support::next_tokens(&fused, &weights, &workload).unwrap(),
                want,
                "{dtype} {seed}"
            );
        }
    }
}
