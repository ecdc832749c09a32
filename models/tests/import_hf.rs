//! The HF `config.json` importer.
//!
//! `tests/data/glm5-config.json` is hand-written as GLM-5.1's raw config.json (GLM5-SPEC §1.1);
//! `tests/data/tf517-*.json` were written by transformers 5.17.0's `GlmMoeDsaConfig.save_pretrained`
//! (a tiny config with `indexer_types` [full, shared, full, shared], and the default GLM-5 config
//! with `index_topk_freq=4, index_skip_topk_offset=3`).

mod common;

use std::path::{Path, PathBuf};

use glmc_ir::DType;
use glmc_models::{import_hf, import_hf_str, ConfigError, Imported, IndexerLayerType, ModelConfig};
use serde_json::{json, Value};

fn glm5_json() -> Value {
    let text = std::fs::read_to_string(common::data("glm5-config.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn import_value(v: &Value) -> Result<ModelConfig, ConfigError> {
    import_noted(v).map(|i| i.config)
}

fn import_noted(v: &Value) -> Result<Imported, ConfigError> {
    import_hf_str(&v.to_string(), Path::new("ckpt/config.json"), "ckpt")
}

/// The notes of importing `v`, as the CLI prints them.
fn notes_of(v: &Value) -> Vec<String> {
    let imported = import_noted(v).unwrap_or_else(|e| panic!("{e}"));
    imported.notes.iter().map(ToString::to_string).collect()
}

/// GLM-5's config.json with `edit` applied to its object.
fn glm5_with(edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> Value {
    let mut v = glm5_json();
    edit(v.as_object_mut().unwrap());
    v
}

fn full_layers(c: &ModelConfig) -> Vec<usize> {
    (0..c.num_hidden_layers)
        .filter(|&i| c.indexer_layer_type(i) == Some(IndexerLayerType::Full))
        .collect()
}

#[test]
fn glm5_config_json_imports_to_glm5_ron() {
    let imported = import_hf(&common::data("glm5-config.json")).unwrap().config;
    assert_eq!(imported.name, "data", "named after the directory");
    let ron = common::shipped("glm5.ron");
    assert_eq!(
        ModelConfig {
            name: ron.name.clone(),
            ..imported
        },
        ron
    );
}

#[test]
fn a_checkpoint_directory_imports_its_config_json_and_names_the_module() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("GLM-5.1");
    std::fs::create_dir(&ckpt).unwrap();
    std::fs::copy(common::data("glm5-config.json"), ckpt.join("config.json")).unwrap();
    let imported = import_hf(&ckpt).unwrap().config;
    assert_eq!(imported.name, "GLM-5.1");
    let err = import_hf(dir.path()).unwrap_err();
    assert!(matches!(err, ConfigError::Io { ref path, .. } if path.ends_with("config.json")));
}

#[test]
fn glm5_2_freq_and_offset_give_21_full_layers() {
    let v = glm5_with(|m| {
        m.insert("index_topk_freq".into(), json!(4));
        m.insert("index_skip_topk_offset".into(), json!(3));
        m.insert(
            "rope_parameters".into(),
            json!({"rope_theta": 8000000, "rope_type": "default"}),
        );
        m.insert("max_position_embeddings".into(), json!(1048576));
    });
    let c = import_value(&v).unwrap();
    let expected: Vec<usize> = [0, 1, 2].into_iter().chain((6..78).step_by(4)).collect();
    assert_eq!(expected.len(), 21);
    assert_eq!(*expected.last().unwrap(), 74);
    assert_eq!(full_layers(&c), expected);
    assert_eq!(c.indexer_source_layer(5), Some(2));
    assert_eq!(c.indexer_source_layer(75), Some(74));
    assert_eq!(c.rope_theta, 8e6);
}

#[test]
fn transformers_written_freq_config_agrees_with_the_rule() {
    let c = import_hf(&common::data("tf517-glm5-freq4-offset3.json"))
        .unwrap()
        .config;
    let expected: Vec<usize> = [0, 1, 2].into_iter().chain((6..78).step_by(4)).collect();
    assert_eq!(full_layers(&c), expected);
    // The same file with transformers' expanded list removed: the rule alone must agree.
    let text = std::fs::read_to_string(common::data("tf517-glm5-freq4-offset3.json")).unwrap();
    let mut v: Value = serde_json::from_str(&text).unwrap();
    v.as_object_mut().unwrap().remove("indexer_types");
    assert_eq!(import_value(&v).unwrap().indexer, c.indexer);
}

#[test]
fn transformers_written_tiny_config_imports() {
    let c = import_hf(&common::data("tf517-tiny-shared.json"))
        .unwrap()
        .config;
    use IndexerLayerType::{Full, Shared};
    assert_eq!(
        c.indexer.as_ref().unwrap().layer_types,
        [Full, Shared, Full, Shared]
    );
    assert_eq!(
        c.dtype,
        DType::F32,
        "no dtype key: transformers loads float32"
    );
    assert_eq!(c.first_k_dense_replace, 1);
    assert_eq!(c.eos_token_ids, [1]);
    assert_eq!(c.qk_head_dim(), 40);
    assert_eq!(c.rope_theta, 1e6);
}

#[test]
fn index_topk_pattern_and_indexer_types_agree() {
    let pattern: String = (0..78)
        .map(|i| if i % 3 == 0 { 'F' } else { 'S' })
        .collect();
    let types: Vec<&str> = pattern
        .chars()
        .map(|ch| if ch == 'F' { "full" } else { "shared" })
        .collect();
    let a = import_value(&glm5_with(|m| {
        m.insert("index_topk_pattern".into(), json!(pattern));
    }))
    .unwrap();
    let b = import_value(&glm5_with(|m| {
        m.insert("indexer_types".into(), json!(types));
        m.insert("index_topk_pattern".into(), json!("F".repeat(78)));
    }))
    .unwrap();
    assert_eq!(
        a, b,
        "indexer_types takes precedence over index_topk_pattern"
    );
    assert_eq!(full_layers(&a), (0..78).step_by(3).collect::<Vec<_>>());
}

/// Replaces the old `no_index_topk_means_no_indexer`: a GLM-5 config that lost `index_topk` (the
/// deployment bug glmc exists for) must not turn dense without a word. transformers gives every
/// glm_moe_dsa model an indexer, so glmc takes its default and says so.
#[test]
fn absent_index_topk_takes_transformers_default_and_says_so() {
    let v = glm5_with(|m| {
        m.remove("index_topk");
    });
    let c = import_value(&v).unwrap();
    assert_eq!(c.indexer.as_ref().map(|ix| ix.index_topk), Some(2048));
    assert!(c.uses_sparse_attention());
    assert!(
        notes_of(&v).contains(&"index_topk absent: transformers' default 2048 used".to_string()),
        "{:?}",
        notes_of(&v)
    );
}

#[test]
fn absent_indexer_sizes_take_transformers_defaults_and_say_so() {
    let v = glm5_with(|m| {
        m.remove("index_n_heads");
        m.remove("index_head_dim");
    });
    let ix = import_value(&v).unwrap().indexer.unwrap();
    assert_eq!((ix.index_n_heads, ix.index_head_dim), (32, 128));
    let notes = notes_of(&v);
    for key in [
        "index_n_heads absent: transformers' default 32",
        "index_head_dim absent: transformers' default 128",
    ] {
        assert!(notes.iter().any(|n| n.starts_with(key)), "{key}: {notes:?}");
    }
}

/// Every key transformers 5.17 defaults, removed from GLM-5's config: the same model, with one
/// note per key naming it and the value taken.
#[test]
fn every_transformers_default_is_taken_and_noted() {
    let defaulted = [
        ("vocab_size", "154880"),
        ("hidden_size", "6144"),
        ("intermediate_size", "12288"),
        ("moe_intermediate_size", "2048"),
        ("num_hidden_layers", "78"),
        ("num_attention_heads", "64"),
        ("n_shared_experts", "1"),
        ("n_routed_experts", "256"),
        ("routed_scaling_factor", "2.5"),
        ("kv_lora_rank", "512"),
        ("q_lora_rank", "2048"),
        ("qk_rope_head_dim", "64"),
        ("v_head_dim", "256"),
        ("qk_nope_head_dim", "192"),
        ("n_group", "1"),
        ("topk_group", "1"),
        ("num_experts_per_tok", "8"),
        ("norm_topk_prob", "true"),
        ("hidden_act", "\"silu\""),
        ("max_position_embeddings", "202752"),
        ("rms_norm_eps", "0.00001"),
        ("tie_word_embeddings", "false"),
        ("attention_bias", "false"),
        ("index_topk", "2048"),
        ("index_head_dim", "128"),
        ("index_n_heads", "32"),
        ("first_k_dense_replace", "3"),
    ];
    let glm5 = import_value(&glm5_json()).unwrap();
    let v = glm5_with(|m| {
        for (key, _) in defaulted {
            m.remove(key);
        }
        m.remove("mlp_layer_types");
        m.remove("head_dim");
        m.remove("qk_head_dim");
    });
    let imported = import_noted(&v).unwrap();
    assert_eq!(
        imported.config, glm5,
        "transformers' defaults are GLM-5's values"
    );
    let notes: Vec<String> = imported.notes.iter().map(ToString::to_string).collect();
    for (key, value) in defaulted {
        let want = format!("{key} absent: transformers' default {value} used");
        assert!(notes.contains(&want), "{want}: {notes:?}");
        assert_eq!(
            imported.notes.iter().filter(|n| n.key() == key).count(),
            1,
            "{key}"
        );
    }
}

#[test]
fn published_glm5_config_notes_only_the_absent_schedule_and_mlp_bias() {
    assert_eq!(
        notes_of(&glm5_json()),
        [
            "mlp_bias absent: transformers' default false used",
            "indexer_types absent: transformers' default (every layer \"full\", from index_topk_freq 1 and index_skip_topk_offset 2) used",
        ]
    );
}

/// Configs laid out as the published GLM-5 family ships them (`tests/data/published`, from
/// GLM5-SPEC §1.1: GLM-5.2/5.3 with `head_dim` 192, their shared-indexer schedule,
/// `moe_router_dtype` and `index_share_for_mtp_iteration`; GLM-5-FP8 with its
/// `quantization_config`) all import as transformers 5.17 reads them.
#[test]
fn published_layout_corpus_imports() {
    let glm5 = import_value(&glm5_json()).unwrap();
    let dir = common::data("published");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let Imported { config, notes } = import_hf(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
        let notes: Vec<String> = notes.iter().map(ToString::to_string).collect();
        seen += 1;
        if file.starts_with("glm-5.2") || file.starts_with("glm-5.3") {
            assert_eq!(
                notes,
                ["head_dim is 192: transformers 5.17 overrides it with qk_rope_head_dim (64), used"],
                "{file}"
            );
            assert_eq!(config.qk_rope_head_dim, 64, "{file}");
            assert_eq!(config.rope_theta, 8e6, "{file}");
            assert_eq!(config.max_position_embeddings, 1 << 20, "{file}");
            let expected: Vec<usize> = [0, 1, 2].into_iter().chain((6..78).step_by(4)).collect();
            assert_eq!(full_layers(&config), expected, "{file}");
        } else {
            assert_eq!(config.indexer, glm5.indexer, "{file}");
            assert_eq!(config.dtype, DType::BF16, "{file}");
        }
    }
    assert_eq!(seen, 3, "{}", dir.display());
}

#[test]
fn absent_rope_theta_is_refused_naming_the_key() {
    let err = import_value(&glm5_with(|m| {
        m.remove("rope_parameters");
    }))
    .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(&err, ConfigError::MissingKey { key, .. } if key == "rope_parameters"),
        "{err:?}"
    );
    assert!(
        text.contains("1000000") && text.contains("8000000"),
        "{text}"
    );
}

#[test]
fn rope_interleave_false_is_refused_naming_both_readings() {
    for key in ["rope_interleave", "indexer_rope_interleave"] {
        let err = import_value(&glm5_with(|m| {
            m.insert(key.into(), json!(false));
        }))
        .unwrap_err()
        .to_string();
        assert!(err.contains(&format!("invalid `{key}`")), "{err}");
        assert!(
            err.contains("transformers 5.17") && err.contains("interleaved"),
            "{err}"
        );
        assert!(err.contains("vLLM") && err.contains("half-split"), "{err}");
    }
}

/// A default that does not fit the rest of the config fails validation, and the message says
/// which defaults were taken, so the user sees where the impossible value came from.
#[test]
fn a_validation_error_names_the_defaults_taken() {
    let err = import_value(&glm5_with(|m| {
        m.insert("qk_rope_head_dim".into(), json!(128));
        m.remove("qk_head_dim");
        m.remove("index_head_dim");
    }))
    .unwrap_err()
    .to_string();
    assert!(err.contains("invalid `index_head_dim`"), "{err}");
    assert!(
        err.contains("index_head_dim absent: transformers' default 128 used"),
        "{err}"
    );
}

#[test]
fn legacy_spellings_are_accepted() {
    let c = import_value(&glm5_with(|m| {
        m.remove("rope_parameters");
        m.insert("rope_theta".into(), json!(1000000.0));
        m.remove("dtype");
        m.insert("torch_dtype".into(), json!("bfloat16"));
        m.insert("eos_token_id".into(), json!(154820));
        m.remove("mlp_layer_types");
        m.insert("rope_scaling".into(), Value::Null);
    }))
    .unwrap();
    assert_eq!(c.rope_theta, 1e6);
    assert_eq!(c.dtype, DType::BF16);
    assert_eq!(c.eos_token_ids, [154820]);
    assert_eq!(c.first_k_dense_replace, 3);
}

#[test]
fn float64_checkpoints_compute_in_f32() {
    let c = import_value(&glm5_with(|m| {
        m.insert("dtype".into(), json!("float64"));
    }))
    .unwrap();
    assert_eq!(c.dtype, DType::F32);
}

#[test]
fn other_model_types_are_rejected() {
    let err = import_value(&glm5_with(|m| {
        m.insert("model_type".into(), json!("deepseek_v32"));
    }))
    .unwrap_err();
    match &err {
        ConfigError::UnsupportedModelType { found, .. } => assert_eq!(found, "deepseek_v32"),
        other => panic!("expected UnsupportedModelType, got {other:?}"),
    }
}

#[test]
fn malformed_json_points_at_the_position() {
    let text = "{\n  \"model_type\": \"glm_moe_dsa\",\n  \"hidden_size\": 6144,,\n}";
    match import_hf_str(text, Path::new("ckpt/config.json"), "ckpt").unwrap_err() {
        ConfigError::Syntax { line, col, .. } => assert_eq!((line, col), (3, 23)),
        other => panic!("expected Syntax, got {other:?}"),
    }
}

fn invalid_field(v: &Value) -> String {
    match import_value(v).unwrap_err() {
        ConfigError::Invalid { field, .. } => field,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn rope_scaling_and_yarn_are_rejected() {
    let yarn = json!({"type": "yarn", "factor": 40});
    assert_eq!(
        invalid_field(&glm5_with(|m| {
            m.insert("rope_scaling".into(), yarn);
        })),
        "rope_scaling"
    );
    let v = glm5_with(|m| {
        m.insert(
            "rope_parameters".into(),
            json!({"rope_theta": 10000, "rope_type": "yarn", "factor": 40}),
        );
    });
    assert_eq!(invalid_field(&v), "rope_parameters.rope_type");
}

#[test]
fn bad_input_messages() {
    let cases: Vec<(&str, String)> = vec![
        ("malformed", "{\"model_type\": \"glm_moe_dsa\",, }".into()),
        (
            "truncated",
            "{\"model_type\": \"glm_moe_dsa\", \"hidden_size\": 61".into(),
        ),
        ("not an object", "[1, 2, 3]".into()),
        (
            "other model type",
            glm5_with(|m| {
                m.insert("model_type".into(), json!("deepseek_v3"));
            })
            .to_string(),
        ),
        (
            "no model type",
            glm5_with(|m| {
                m.remove("model_type");
            })
            .to_string(),
        ),
        (
            "missing rope",
            glm5_with(|m| {
                m.remove("rope_parameters");
            })
            .to_string(),
        ),
        (
            "wrong type",
            glm5_with(|m| {
                m.insert("hidden_size".into(), json!("6144"));
            })
            .to_string(),
        ),
        (
            "negative size",
            glm5_with(|m| {
                m.insert("v_head_dim".into(), json!(-256));
            })
            .to_string(),
        ),
        (
            "rope_scaling",
            glm5_with(|m| {
                m.insert(
                    "rope_scaling".into(),
                    json!({"type": "yarn", "factor": 40.0}),
                );
            })
            .to_string(),
        ),
        (
            "yarn rope_type",
            glm5_with(|m| {
                m.insert(
                    "rope_parameters".into(),
                    json!({"rope_theta": 10000, "rope_type": "yarn"}),
                );
            })
            .to_string(),
        ),
        (
            "rope_parameters not an object",
            glm5_with(|m| {
                m.insert("rope_parameters".into(), json!(1e6));
            })
            .to_string(),
        ),
        (
            "legacy theta disagrees",
            glm5_with(|m| {
                m.insert("rope_theta".into(), json!(10000));
            })
            .to_string(),
        ),
        (
            "rope_interleave false",
            glm5_with(|m| {
                m.insert("rope_interleave".into(), json!(false));
            })
            .to_string(),
        ),
        (
            "indexer_rope_interleave false",
            glm5_with(|m| {
                m.insert("indexer_rope_interleave".into(), json!(false));
            })
            .to_string(),
        ),
        (
            "qk_head_dim mismatch",
            glm5_with(|m| {
                m.insert("qk_head_dim".into(), json!(192));
            })
            .to_string(),
        ),
        (
            "dense after sparse",
            glm5_with(|m| {
                m["mlp_layer_types"][5] = json!("dense");
            })
            .to_string(),
        ),
        (
            "mlp types vs first_k",
            glm5_with(|m| {
                m.insert("first_k_dense_replace".into(), json!(1));
            })
            .to_string(),
        ),
        (
            "mlp types too short",
            glm5_with(|m| {
                m.insert("mlp_layer_types".into(), json!(["dense", "sparse"]));
            })
            .to_string(),
        ),
        (
            "unknown mlp type",
            glm5_with(|m| {
                m["mlp_layer_types"][7] = json!("moe");
            })
            .to_string(),
        ),
        (
            "indexer types length",
            glm5_with(|m| {
                m.insert("indexer_types".into(), json!(["full", "shared"]));
            })
            .to_string(),
        ),
        (
            "unknown indexer type",
            glm5_with(|m| {
                m.insert("index_topk_pattern".into(), json!("FX".repeat(39)));
            })
            .to_string(),
        ),
        (
            "first layer shared",
            glm5_with(|m| {
                m.insert("index_topk_pattern".into(), json!("S".repeat(78)));
            })
            .to_string(),
        ),
        (
            "zero freq",
            glm5_with(|m| {
                m.insert("index_topk_freq".into(), json!(0));
            })
            .to_string(),
        ),
        (
            "softmax router",
            glm5_with(|m| {
                m.insert("scoring_func".into(), json!("softmax"));
            })
            .to_string(),
        ),
        (
            "group-limited greedy",
            glm5_with(|m| {
                m.insert("topk_method".into(), json!("group_limited_greedy"));
            })
            .to_string(),
        ),
        (
            "gelu",
            glm5_with(|m| {
                m.insert("hidden_act".into(), json!("gelu"));
            })
            .to_string(),
        ),
        (
            "attention bias",
            glm5_with(|m| {
                m.insert("attention_bias".into(), json!(true));
            })
            .to_string(),
        ),
        (
            "mlp bias",
            glm5_with(|m| {
                m.insert("mlp_bias".into(), json!(true));
            })
            .to_string(),
        ),
        (
            "moe every other layer",
            glm5_with(|m| {
                m.insert("moe_layer_freq".into(), json!(2));
            })
            .to_string(),
        ),
        (
            "fp8 dtype",
            glm5_with(|m| {
                m.insert("dtype".into(), json!("float8_e4m3fn"));
            })
            .to_string(),
        ),
        (
            "eos not ids",
            glm5_with(|m| {
                m.insert("eos_token_id".into(), json!(["</s>"]));
            })
            .to_string(),
        ),
        (
            "too many layers",
            glm5_with(|m| {
                m.insert("num_hidden_layers".into(), json!(1u64 << 40));
            })
            .to_string(),
        ),
        (
            "validation",
            glm5_with(|m| {
                m.insert("topk_group".into(), json!(2));
            })
            .to_string(),
        ),
    ];
    let mut report = String::new();
    for (case, text) in cases {
        let err = import_hf_str(&text, Path::new("GLM-5/config.json"), "GLM-5")
            .expect_err(case)
            .to_string();
        assert!(err.starts_with("GLM-5/config.json"), "{case}: {err}");
        assert!(!err.contains('\n'), "{case}: not one paragraph: {err}");
        report += &format!("{case}:\n  {err}\n");
    }
    insta::assert_snapshot!(report);
}

/// The transformers-written oracle fixtures (`tests/oracle/fixtures/<case>/config.json`), when
/// they have been generated: each must import and validate.
#[test]
fn oracle_fixture_configs_import() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/oracle/fixtures");
    let mut imported = 0;
    for entry in std::fs::read_dir(&root).unwrap_or_else(|e| panic!("{}: {e}", root.display())) {
        let dir = entry.unwrap().path();
        let result = import_hf(&dir).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            result.notes,
            [],
            "{}: transformers wrote every key",
            dir.display()
        );
        let c = result.config;
        assert_eq!(c.name, dir.file_name().unwrap().to_string_lossy());
        imported += 1;
    }
    assert!(
        imported >= 6,
        "only {imported} oracle fixtures under {}",
        root.display()
    );
}
