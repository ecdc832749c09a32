//! The shipped configs: they load, validate, round-trip, are written in canonical form, and
//! glm5.ron holds exactly GLM5-SPEC §1.1.

mod common;

use std::path::Path;

use glmc_ir::DType;
use glmc_models::{
    AttentionMode, IndexerConfig, IndexerLayerType, ModelConfig, MoeConfig, ScoringFunc,
    TopkMethod, SHIPPED_CONFIGS,
};
use IndexerLayerType::{Full, Shared};

/// GLM-5 / GLM-5.1 per GLM5-SPEC §1.1, written out field by field.
fn glm5_per_spec() -> ModelConfig {
    ModelConfig {
        name: "glm5".into(),
        dtype: DType::BF16,
        vocab_size: 154880,
        hidden_size: 6144,
        num_hidden_layers: 78,
        num_attention_heads: 64,
        q_lora_rank: 2048,
        kv_lora_rank: 512,
        qk_nope_head_dim: 192,
        qk_rope_head_dim: 64,
        v_head_dim: 256,
        rms_norm_eps: 1e-5,
        latent_norm_eps: 1e-6,
        rope_theta: 1e6,
        rope_interleave: true,
        max_position_embeddings: 202752,
        intermediate_size: 12288,
        first_k_dense_replace: 3,
        indexer: Some(IndexerConfig {
            index_topk: 2048,
            index_n_heads: 32,
            index_head_dim: 128,
            rope_interleave: true,
            k_norm_eps: 1e-6,
            layer_types: vec![],
        }),
        attention: AttentionMode::Auto,
        moe: MoeConfig {
            n_routed_experts: 256,
            n_shared_experts: 1,
            num_experts_per_tok: 8,
            moe_intermediate_size: 2048,
            n_group: 1,
            topk_group: 1,
            routed_scaling_factor: 2.5,
            norm_topk_prob: true,
            scoring_func: ScoringFunc::Sigmoid,
            topk_method: TopkMethod::NoauxTc,
        },
        num_nextn_predict_layers: 1,
        tie_word_embeddings: false,
        eos_token_ids: vec![154820, 154827, 154829],
    }
}

#[test]
fn every_shipped_config_loads_round_trips_and_is_canonical() {
    for file in SHIPPED_CONFIGS {
        let config = common::shipped(file);
        let text = config.to_ron_string();
        let again = ModelConfig::from_ron_str(&text, Path::new(file)).unwrap();
        assert_eq!(again, config, "{file} does not round-trip");
        assert_eq!(
            text,
            common::shipped_text(file),
            "{file} is not in to_ron_string form; regenerate it with to_ron_string"
        );
    }
}

#[test]
fn glm5_ron_is_the_spec() {
    assert_eq!(common::shipped("glm5.ron"), glm5_per_spec());
}

#[test]
fn glm5_helpers() {
    let c = glm5_per_spec();
    assert_eq!(c.qk_head_dim(), 256);
    assert_eq!(c.softmax_scale(), 0.0625);
    assert_eq!(c.kv_cache_dim(), 576);
    assert_eq!(c.num_layers_with_mtp(), 79);
    assert!(!c.is_moe_layer(2));
    assert!(c.is_moe_layer(3));
    assert!(c.is_moe_layer(77));
    assert!(c.is_moe_layer(78), "the MTP layer is MoE");
    assert!(!c.is_moe_layer(79));
    assert!((0..78).all(|i| c.indexer_layer_type(i) == Some(Full)));
    assert!(c.uses_sparse_attention());
}

#[test]
fn tiny_sparse_has_sparse_attention_shared_layers_and_groups() {
    let c = common::shipped("tiny-sparse.ron");
    assert!(c.uses_sparse_attention());
    let types: Vec<_> = (0..4).map(|i| c.indexer_layer_type(i).unwrap()).collect();
    assert_eq!(types, [Full, Full, Shared, Full]);
    let sources: Vec<_> = (0..4).map(|i| c.indexer_source_layer(i).unwrap()).collect();
    assert_eq!(sources, [0, 1, 1, 3]);
    assert!(c.moe.n_group > 1);
    assert!(!c.is_moe_layer(0) && c.is_moe_layer(1));
}

#[test]
fn tiny_dense_has_no_indexer() {
    let c = common::shipped("tiny-dense.ron");
    assert_eq!(c.indexer, None);
    assert!(!c.uses_sparse_attention());
    assert_eq!(c.indexer_layer_type(0), None);
    assert_eq!(c.indexer_source_layer(2), None);
    let sparse = common::shipped("tiny-sparse.ron");
    assert_eq!(
        ModelConfig {
            name: sparse.name.clone(),
            indexer: sparse.indexer.clone(),
            ..c
        },
        sparse,
        "tiny-dense is tiny-sparse without the indexer"
    );
}

#[test]
fn attention_mode_overrides_auto() {
    let mut c = common::shipped("tiny-sparse.ron");
    c.attention = AttentionMode::Dense;
    assert!(!c.uses_sparse_attention());
    c.attention = AttentionMode::Sparse;
    assert!(c.uses_sparse_attention());
    c.validate().unwrap();
}

#[test]
fn defaults_fill_omitted_fields() {
    let text = common::shipped_text("tiny-dense.ron");
    let omitted = [
        "dtype:",
        "latent_norm_eps:",
        "rope_interleave:",
        "attention:",
        "n_group:",
        "topk_group:",
        "norm_topk_prob:",
        "scoring_func:",
        "topk_method:",
        "num_nextn_predict_layers:",
        "tie_word_embeddings:",
        "eos_token_ids:",
        "indexer:",
    ];
    let short: String = text
        .lines()
        .filter(|l| !omitted.iter().any(|k| l.trim_start().starts_with(k)))
        .map(|l| format!("{l}\n"))
        .collect();
    let c = ModelConfig::from_ron_str(&short, Path::new("short.ron")).unwrap();
    assert_eq!(c.dtype, DType::BF16);
    assert_eq!(c.latent_norm_eps, 1e-6);
    assert!(c.rope_interleave && c.moe.norm_topk_prob);
    assert_eq!(c.attention, AttentionMode::Auto);
    assert_eq!((c.moe.n_group, c.moe.topk_group), (1, 1));
    assert_eq!(c.moe.topk_method, TopkMethod::NoauxTc);
    assert_eq!(c.num_nextn_predict_layers, 0);
    assert!(!c.tie_word_embeddings && c.eos_token_ids.is_empty() && c.indexer.is_none());
}
