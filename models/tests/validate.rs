//! Impossible configs are rejected, each naming the field and the bad value.

mod common;

use std::path::Path;

use glmc_ir::DType;
use glmc_models::{AttentionMode, ConfigError, IndexerLayerType, ModelConfig};

type Mutation = fn(&mut ModelConfig);

/// (case, base config, mutation, field the error must name, text the message must contain).
const CASES: &[(&str, &str, Mutation, &str, &str)] = &[
    (
        "empty name",
        "tiny-sparse.ron",
        |c| c.name = " ".into(),
        "name",
        "empty",
    ),
    (
        "zero vocab",
        "tiny-sparse.ron",
        |c| c.vocab_size = 0,
        "vocab_size",
        "is 0",
    ),
    (
        "zero hidden",
        "tiny-sparse.ron",
        |c| c.hidden_size = 0,
        "hidden_size",
        "is 0",
    ),
    (
        "zero layers",
        "tiny-dense.ron",
        |c| {
            c.num_hidden_layers = 0;
            c.first_k_dense_replace = 0
        },
        "num_hidden_layers",
        "is 0",
    ),
    (
        "zero heads",
        "tiny-sparse.ron",
        |c| c.num_attention_heads = 0,
        "num_attention_heads",
        "is 0",
    ),
    (
        "zero q_lora",
        "tiny-sparse.ron",
        |c| c.q_lora_rank = 0,
        "q_lora_rank",
        "is 0",
    ),
    (
        "zero kv_lora",
        "tiny-sparse.ron",
        |c| c.kv_lora_rank = 0,
        "kv_lora_rank",
        "is 0",
    ),
    (
        "zero v_head",
        "tiny-sparse.ron",
        |c| c.v_head_dim = 0,
        "v_head_dim",
        "is 0",
    ),
    (
        "zero intermediate",
        "tiny-sparse.ron",
        |c| c.intermediate_size = 0,
        "intermediate_size",
        "is 0",
    ),
    (
        "zero moe inter",
        "tiny-sparse.ron",
        |c| c.moe.moe_intermediate_size = 0,
        "moe.moe_intermediate_size",
        "is 0",
    ),
    (
        "zero experts",
        "tiny-sparse.ron",
        |c| c.moe.n_routed_experts = 0,
        "moe.n_routed_experts",
        "is 0",
    ),
    (
        "zero experts per token",
        "tiny-sparse.ron",
        |c| c.moe.num_experts_per_tok = 0,
        "moe.num_experts_per_tok",
        "is 0",
    ),
    (
        "huge hidden",
        "tiny-sparse.ron",
        |c| c.hidden_size = 1 << 40,
        "hidden_size",
        "1099511627776",
    ),
    (
        "huge mtp count",
        "tiny-sparse.ron",
        |c| c.num_nextn_predict_layers = usize::MAX,
        "num_nextn_predict_layers",
        "at most 4092",
    ),
    (
        "odd rope dim",
        "tiny-sparse.ron",
        |c| c.qk_rope_head_dim = 7,
        "qk_rope_head_dim",
        "7 is odd",
    ),
    (
        "indexer head not above rope",
        "tiny-sparse.ron",
        |c| c.indexer.as_mut().unwrap().index_head_dim = 8,
        "indexer.index_head_dim",
        "8 is not larger",
    ),
    (
        "zero index_topk",
        "tiny-sparse.ron",
        |c| c.indexer.as_mut().unwrap().index_topk = 0,
        "indexer.index_topk",
        "is 0",
    ),
    (
        "zero indexer heads",
        "tiny-sparse.ron",
        |c| c.indexer.as_mut().unwrap().index_n_heads = 0,
        "indexer.index_n_heads",
        "is 0",
    ),
    (
        "indexer types too short",
        "tiny-sparse.ron",
        |c| {
            c.indexer.as_mut().unwrap().layer_types.pop();
        },
        "indexer.layer_types",
        "3 entries for 4 layers",
    ),
    (
        "first indexer layer shared",
        "tiny-sparse.ron",
        |c| c.indexer.as_mut().unwrap().layer_types[0] = IndexerLayerType::Shared,
        "indexer.layer_types[0]",
        "is shared",
    ),
    (
        "sparse without indexer",
        "tiny-dense.ron",
        |c| c.attention = AttentionMode::Sparse,
        "attention",
        "no indexer",
    ),
    (
        "topk_group above n_group",
        "tiny-sparse.ron",
        |c| c.moe.topk_group = 3,
        "moe.topk_group",
        "3 exceeds n_group (2)",
    ),
    (
        "n_group not dividing experts",
        "tiny-sparse.ron",
        |c| c.moe.n_group = 3,
        "moe.n_group",
        "3 does not divide n_routed_experts (8)",
    ),
    (
        "more experts per token than experts",
        "tiny-sparse.ron",
        |c| c.moe.num_experts_per_tok = 9,
        "moe.num_experts_per_tok",
        "9 exceeds n_routed_experts (8)",
    ),
    (
        "too few experts in kept groups",
        "tiny-sparse.ron",
        |c| c.moe.num_experts_per_tok = 5,
        "moe.num_experts_per_tok",
        "5 exceeds the 4 experts",
    ),
    (
        "dense prefix longer than model",
        "tiny-sparse.ron",
        |c| c.first_k_dense_replace = 5,
        "first_k_dense_replace",
        "5 exceeds num_hidden_layers (4)",
    ),
    (
        "zero rms eps",
        "tiny-sparse.ron",
        |c| c.rms_norm_eps = 0.0,
        "rms_norm_eps",
        "is 0",
    ),
    (
        "negative latent eps",
        "tiny-sparse.ron",
        |c| c.latent_norm_eps = -1e-6,
        "latent_norm_eps",
        "is -0.000001",
    ),
    (
        "nan k_norm eps",
        "tiny-sparse.ron",
        |c| c.indexer.as_mut().unwrap().k_norm_eps = f64::NAN,
        "indexer.k_norm_eps",
        "is NaN",
    ),
    (
        "negative theta",
        "tiny-sparse.ron",
        |c| c.rope_theta = -10000.0,
        "rope_theta",
        "is -10000",
    ),
    (
        "infinite theta",
        "tiny-sparse.ron",
        |c| c.rope_theta = f64::INFINITY,
        "rope_theta",
        "is inf",
    ),
    (
        "zero scaling",
        "tiny-sparse.ron",
        |c| c.moe.routed_scaling_factor = 0.0,
        "moe.routed_scaling_factor",
        "is 0",
    ),
    (
        "i32 activations",
        "tiny-sparse.ron",
        |c| c.dtype = DType::I32,
        "dtype",
        "\"i32\"",
    ),
    (
        "i64 activations",
        "tiny-sparse.ron",
        |c| c.dtype = DType::I64,
        "dtype",
        "\"i64\"",
    ),
    (
        "f8 activations",
        "tiny-sparse.ron",
        |c| c.dtype = DType::F8E4M3,
        "dtype",
        "\"f8e4m3\"",
    ),
    (
        "eos outside vocab",
        "tiny-sparse.ron",
        |c| c.eos_token_ids = vec![1, 256],
        "eos_token_ids",
        "contains 256",
    ),
];

#[test]
fn impossible_configs_are_rejected_naming_the_field() {
    let mut report = String::new();
    for &(case, base, mutate, field, needle) in CASES {
        let mut config = common::shipped(base);
        mutate(&mut config);
        let err = config.validate().expect_err(case);
        assert_eq!(err.field, field, "{case}: {err}");
        assert!(
            err.message.contains(needle),
            "{case}: {err:?} lacks {needle:?}"
        );
        let message = err.in_file(Path::new("models/bad.ron")).to_string();
        assert!(
            !message.contains('\n'),
            "{case}: not one paragraph: {message}"
        );
        report += &format!("{case}:\n  {message}\n");
    }
    insta::assert_snapshot!(report);
}

#[test]
fn from_ron_str_validates_and_names_the_file() {
    let text = common::replace_line(
        &common::shipped_text("tiny-sparse.ron"),
        "topk_group:",
        "        topk_group: 3,",
    );
    let err = ModelConfig::from_ron_str(&text, Path::new("cfg/x.ron")).unwrap_err();
    match &err {
        ConfigError::Invalid { path, field, .. } => {
            assert_eq!(path, Path::new("cfg/x.ron"));
            assert_eq!(field, "moe.topk_group");
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    assert!(err
        .to_string()
        .starts_with("cfg/x.ron: invalid `moe.topk_group`: 3 exceeds"));
}

#[test]
fn shared_layers_reuse_the_nearest_full_layer() {
    let mut c = common::shipped("tiny-sparse.ron");
    c.indexer.as_mut().unwrap().layer_types = vec![
        IndexerLayerType::Full,
        IndexerLayerType::Shared,
        IndexerLayerType::Shared,
        IndexerLayerType::Full,
    ];
    c.validate().unwrap();
    let sources: Vec<_> = (0..4).map(|i| c.indexer_source_layer(i).unwrap()).collect();
    assert_eq!(sources, [0, 0, 0, 3]);
}
