//! Random weights (`--random-weights SEED`): the generator matches its documented definition, is
//! deterministic, differs per tensor and seed, has the scale of its rule, rounds to the stored
//! dtype; weights generated straight into a recipe's layout equal the recipe applied to the
//! generated tensors; every weight of GLM-5 takes that direct path (so the GPU never falls back
//! to the host); and the GPU memory prediction refuses GLM-5 and accepts the 4-layer slice on an
//! H200.

mod support;

use std::path::PathBuf;
use support::by_tensor_ops;

use glmc_codegen::artifact::Manifest;
use glmc_codegen::{lower_module, Limits, Target};
use glmc_ir::{DType, Module, Op, Recipe};
use glmc_models::ModelConfig;
use glmc_passes::{pipeline, PipelineOptions};
use glmc_runtime::cuda::DeviceBytes;
use glmc_runtime::random_weights::{pieces, Scale};
use glmc_runtime::RandomWeights;
use half::bf16;

/// The definition of the module doc, written out again from its text.
fn by_the_definition(seed: u64, name: &str, index: u64, offset: f32, amplitude: f32) -> f32 {
    fn splitmix_out(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    }
    let mut fnv: u64 = 0xcbf29ce484222325;
    for b in name.bytes() {
        fnv ^= b as u64;
        fnv = fnv.wrapping_mul(0x100000001b3);
    }
    let key = splitmix_out(seed ^ splitmix_out(fnv));
    let bits = splitmix_out(key.wrapping_add(index.wrapping_mul(0x9E3779B97F4A7C15)));
    let u = ((bits >> 40) as f64 - 8388608.0) / 8388608.0;
    offset + amplitude * u as f32
}

fn values(w: &RandomWeights, name: &str, shape: &[u64]) -> Vec<f32> {
    w.leaf(name, shape).as_f32().unwrap().to_vec()
}

fn mean_std(v: &[f32]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

#[test]
fn values_follow_the_documented_definition() {
    let w = RandomWeights::new(7, DType::F32);
    let shape = [3u64, 50];
    let got = values(&w, "model.layers.0.mlp.gate_proj.weight", &shape);
    let amplitude = (3.0f64 / 50.0).sqrt() as f32;
    for (i, &g) in got.iter().enumerate() {
        let want = by_the_definition(
            7,
            "model.layers.0.mlp.gate_proj.weight",
            i as u64,
            0.0,
            amplitude,
        );
        assert_eq!(g.to_bits(), want.to_bits(), "element {i}");
    }
    let norm = values(&w, "model.norm.weight", &[40]);
    for (i, &g) in norm.iter().enumerate() {
        let want = by_the_definition(7, "model.norm.weight", i as u64, 1.0, 0.05);
        assert_eq!(g.to_bits(), want.to_bits(), "norm element {i}");
    }
}

#[test]
fn generation_is_deterministic_and_differs_per_tensor_and_seed() {
    let shape = [64u64, 128];
    let a = RandomWeights::new(7, DType::BF16);
    let name = "model.layers.1.self_attn.o_proj.weight";
    let first = values(&a, name, &shape);
    assert_eq!(first, values(&a, name, &shape));
    assert_eq!(
        first,
        values(&RandomWeights::new(7, DType::BF16), name, &shape)
    );
    let same = |x: &[f32], y: &[f32]| x.iter().zip(y).filter(|(p, q)| p == q).count();
    let other_tensor = values(&a, "model.layers.2.self_attn.o_proj.weight", &shape);
    let other_seed = values(&RandomWeights::new(8, DType::BF16), name, &shape);
    // bf16 values of a uniform with 2^24 levels collide now and then, never for most elements.
    for (what, other) in [("tensor", other_tensor), ("seed", other_seed)] {
        let n = same(&first, &other);
        assert!(n < first.len() / 50, "another {what}: {n} equal elements");
    }
}

#[test]
fn each_kind_of_tensor_has_the_scale_of_the_rule() {
    let w = RandomWeights::new(3, DType::F32);
    let fan_in = 1024u64;
    let m = values(&w, "model.layers.0.mlp.up_proj.weight", &[512, fan_in]);
    let (mean, std) = mean_std(&m);
    let want = 1.0 / (fan_in as f64).sqrt();
    assert!(mean.abs() < 0.01 * want, "matrix mean {mean}");
    assert!(
        (std / want - 1.0).abs() < 0.01,
        "matrix std {std}, want {want}"
    );
    let bound = (3.0 / fan_in as f64).sqrt() as f32;
    assert!(m.iter().all(|x| x.abs() <= bound));

    let norm = values(&w, "model.layers.0.input_layernorm.weight", &[6144]);
    let (mean, _) = mean_std(&norm);
    assert!((mean - 1.0).abs() < 0.005, "norm mean {mean}");
    assert!(norm.iter().all(|x| (0.95..=1.05).contains(x)));

    let bias = values(
        &w,
        "model.layers.3.mlp.gate.e_score_correction_bias",
        &[256],
    );
    assert!(bias.iter().all(|x| x.abs() <= 0.01));
    assert!(bias.iter().any(|x| x.abs() > 0.005));
    assert_eq!(
        Scale::of("model.layers.3.mlp.gate.e_score_correction_bias", &[256]),
        Scale::of("model.layers.0.self_attn.indexer.k_norm.bias", &[128])
    );
}

#[test]
fn values_are_rounded_to_the_stored_dtype() {
    let w = RandomWeights::new(11, DType::BF16);
    let is_bf16 = |x: &f32| bf16::from_f32(*x).to_f32() == *x;
    let m = values(&w, "model.embed_tokens.weight", &[100, 64]);
    assert!(m.iter().all(is_bf16));
    // GLM-5 stores the router's bias in f32, so it keeps f32 precision.
    let bias = values(
        &w,
        "model.layers.3.mlp.gate.e_score_correction_bias",
        &[256],
    );
    assert!(bias.iter().filter(|x| !is_bf16(x)).count() > 200);
    let f32_model = values(
        &RandomWeights::new(11, DType::F32),
        "model.embed_tokens.weight",
        &[100, 64],
    );
    assert!(f32_model.iter().filter(|x| !is_bf16(x)).count() > 6000);
    let rounded: Vec<f32> = f32_model
        .iter()
        .map(|&x| bf16::from_f32(x).to_f32())
        .collect();
    assert_eq!(m, rounded);
}

fn t(name: &str, shape: &[u64]) -> Recipe {
    Recipe::tensor(name, shape.to_vec())
}

#[test]
fn weights_made_in_place_equal_the_recipe_applied_to_the_tensors() {
    let kv_b = || t("l.kv_b_proj.weight", &[4 * (3 + 5), 6]);
    let per_head = || kv_b().reshape(vec![4, 3 + 5, 6]);
    let stack = || Recipe::Stack {
        pattern: "l.experts.{e}.up_proj.weight".into(),
        count: 5,
        shape: vec![6, 4],
    };
    let direct = [
        ("a leaf", t("l.q_a_proj.weight", &[7, 9])),
        ("a stack", stack()),
        ("a stack cut for a rank", stack().slice(1, 2, 5)),
        ("a stack's expert range", stack().slice(0, 1, 4)),
        (
            "absorbed MLA's w_uk",
            per_head().slice(1, 0, 3).transpose(vec![0, 2, 1]),
        ),
        ("absorbed MLA's w_uv", per_head().slice(1, 3, 8)),
        (
            "fused projections",
            Recipe::Concat {
                axis: 0,
                parts: vec![t("l.q_a.weight", &[5, 6]), t("l.kv_a.weight", &[3, 6])],
            },
        ),
        (
            "a concat on the inner axis, sliced across the seam",
            Recipe::Concat {
                axis: 1,
                parts: vec![t("l.a.weight", &[4, 3]), t("l.b.weight", &[4, 5])],
            }
            .slice(1, 2, 6)
            .transpose(vec![1, 0]),
        ),
        (
            "a split and merged reshape",
            t("l.c.weight", &[6, 10])
                .reshape(vec![3, 2, 5, 2])
                .reshape(vec![6, 10, 1]),
        ),
        ("a vector", t("l.norm.weight", &[13])),
        (
            "a reshape to a scalar",
            t("l.s.weight", &[1]).reshape(vec![]),
        ),
    ];
    let w = RandomWeights::new(5, DType::BF16);
    for (what, recipe) in direct {
        assert!(pieces(&recipe).is_some(), "{what}: no pieces");
        let made = w.materialize(&recipe).unwrap();
        assert_eq!(
            made,
            by_tensor_ops(&|n, sh| w.leaf(n, sh), &recipe),
            "{what}"
        );
    }
    // A transpose then a merging reshape is no box: it is evaluated whole, with the same result.
    let whole = t("l.d.weight", &[3, 4])
        .transpose(vec![1, 0])
        .reshape(vec![12]);
    assert!(pieces(&whole).is_none());
    assert_eq!(
        w.materialize(&whole).unwrap(),
        by_tensor_ops(&|n, sh| w.leaf(n, sh), &whole)
    );
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn module(file: &str) -> (ModelConfig, Module) {
    let config = ModelConfig::load(&repo().join("models").join(file)).unwrap();
    let mut m = glmc_models::builder::build(&config, &Default::default()).unwrap();
    pipeline(&PipelineOptions::default())
        .unwrap()
        .run(&mut m)
        .unwrap();
    (config, m)
}

#[test]
fn every_glm5_weight_is_generated_in_place_at_tp_1_and_8() {
    let (_, m) = module("glm5-slice.ron");
    for tp in [1, 8] {
        for rank in glmc_passes::partition(&m, tp).unwrap() {
            for f in &rank.functions {
                for n in f.canonical_order() {
                    if let Op::Weight { recipe } = &f.node(n).op {
                        let p = pieces(recipe)
                            .unwrap_or_else(|| panic!("tp {tp}: {} has no pieces", f.node(n).name));
                        let covered: u64 = p.iter().map(|p| p.count()).sum();
                        let numel: u64 = recipe.shape().unwrap().iter().product();
                        assert_eq!(covered, numel, "tp {tp}: {}", f.node(n).name);
                    }
                }
            }
        }
    }
}

const H200: u64 = 139 << 30;

fn device_bytes(file: &str) -> DeviceBytes {
    let (config, m) = module(file);
    let limits = Limits {
        max_prefill_tokens: 4096,
        max_batch: 1,
        max_context: 8192,
    };
    let lowered = lower_module(&m, Target::Sm90a, limits).unwrap();
    DeviceBytes::of(&Manifest::new(
        &m,
        config.dtype,
        &lowered,
        Vec::new(),
        &config,
    ))
}

#[test]
fn glm5_is_predicted_not_to_fit_an_h200_and_its_slice_to_fit() {
    let full = device_bytes("glm5.ron");
    let err = full.check(H200).unwrap_err().to_string();
    assert!(
        err.contains("use --tp or a quantised weight format"),
        "{err}"
    );
    assert!(
        err.contains("1.4 TiB") && err.contains("139.0 GiB free"),
        "{err}"
    );

    let slice = device_bytes("glm5-slice.ron");
    slice.check(H200).unwrap();
    // `glmc compile --report`'s weights, and its 1408 B per token and layer of cache.
    assert_eq!(slice.weights, 63_882_007_552);
    assert_eq!(slice.states, 4 * 1408 * 8192);
    assert!(slice.arena > 0);
    assert_eq!(slice.total(), slice.weights + slice.states + slice.arena);
    slice.check(slice.total()).unwrap();
    assert!(slice.check(slice.total() - 1).is_err());
}
