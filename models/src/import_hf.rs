//! `glmc import-hf`: a Hugging Face `config.json` of model_type `glm_moe_dsa`, as transformers 5.17
//! writes it (and as the GLM-5/5.1/5.2 checkpoints ship it), turned into a validated
//! [`ModelConfig`].
//!
//! Keys whose absence has one meaning (interleaved RoPE, sigmoid/noaux_tc router, no group
//! routing, no MTP, untied embeddings) default to it; every dimension is required, since guessing
//! one would build a graph that does not fit the weights. Unrelated keys (`architectures`,
//! `num_key_value_heads`, `quantization_config`, ...) are ignored.

use std::path::{Path, PathBuf};

use glmc_ir::DType;
use serde_json::Value;

use crate::config::{
    AttentionMode, IndexerConfig, ModelConfig, MoeConfig, ScoringFunc, TopkMethod,
};
use crate::error::ConfigError;
use crate::hf_json::{short, HfJson};
use crate::hf_layers::{dense_prefix, indexer_layer_types};
use crate::validate::MAX_LAYERS;

/// The only `model_type` glmc compiles.
pub const HF_MODEL_TYPE: &str = "glm_moe_dsa";

/// Imports an HF checkpoint directory, or its `config.json`. The module is named after the
/// checkpoint directory.
pub fn import_hf(path: &Path) -> Result<ModelConfig, ConfigError> {
    let file = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    let text = std::fs::read_to_string(&file).map_err(|source| ConfigError::Io {
        path: file.clone(),
        source,
    })?;
    import_hf_str(&text, &file, &module_name(&file))
}

/// Imports `config.json` text; `path` only labels errors, `name` names the module.
pub fn import_hf_str(text: &str, path: &Path, name: &str) -> Result<ModelConfig, ConfigError> {
    let json = HfJson::parse(text, path)?;
    match json.opt_str("model_type")? {
        Some(HF_MODEL_TYPE) => {}
        Some(found) => {
            return Err(ConfigError::UnsupportedModelType {
                path: path.to_path_buf(),
                found: found.to_string(),
            })
        }
        None => return Err(json.missing("model_type")),
    }
    check_unsupported(&json)?;
    let layers = json.req_usize("num_hidden_layers")?;
    if layers > MAX_LAYERS {
        return Err(json.invalid(
            "num_hidden_layers",
            format!("is {layers}; glmc supports at most {MAX_LAYERS} layers"),
        ));
    }
    let qk_rope_head_dim = json.req_u64("qk_rope_head_dim")?;
    let qk_nope_head_dim = json.req_u64("qk_nope_head_dim")?;
    check_derived(&json, qk_nope_head_dim, qk_rope_head_dim)?;
    let config = ModelConfig {
        name: name.to_string(),
        dtype: dtype(&json)?,
        vocab_size: json.req_u64("vocab_size")?,
        hidden_size: json.req_u64("hidden_size")?,
        num_hidden_layers: layers,
        num_attention_heads: json.req_u64("num_attention_heads")?,
        q_lora_rank: json.req_u64("q_lora_rank")?,
        kv_lora_rank: json.req_u64("kv_lora_rank")?,
        qk_nope_head_dim,
        qk_rope_head_dim,
        v_head_dim: json.req_u64("v_head_dim")?,
        rms_norm_eps: json.req_f64("rms_norm_eps")?,
        // transformers 5.17 hard-codes 1e-6 for q_a_layernorm/kv_a_layernorm; see ModelConfig.
        latent_norm_eps: 1e-6,
        rope_theta: rope_theta(&json)?,
        rope_interleave: json.opt_bool("rope_interleave")?.unwrap_or(true),
        max_position_embeddings: json.req_u64("max_position_embeddings")?,
        intermediate_size: json.req_u64("intermediate_size")?,
        first_k_dense_replace: dense_prefix(&json, layers)?,
        indexer: indexer(&json, layers)?,
        attention: AttentionMode::Auto,
        moe: moe(&json)?,
        num_nextn_predict_layers: json.opt_usize("num_nextn_predict_layers")?.unwrap_or(0),
        tie_word_embeddings: json.opt_bool("tie_word_embeddings")?.unwrap_or(false),
        eos_token_ids: eos_token_ids(&json)?,
    };
    config.validate().map_err(|mut e| {
        e.field = json_key(&e.field);
        e.in_file(path)
    })?;
    Ok(config)
}

/// The `config.json` key of a `ModelConfig` field path, so validation errors name what the user
/// can edit (`moe.topk_group` -> `topk_group`, `indexer.layer_types[0]` -> `indexer_types[0]`).
fn json_key(field: &str) -> String {
    if let Some(rest) = field.strip_prefix("indexer.layer_types") {
        return format!("indexer_types{rest}");
    }
    match field {
        "indexer.rope_interleave" => "indexer_rope_interleave".to_string(),
        "eos_token_ids" => "eos_token_id".to_string(),
        _ => field
            .strip_prefix("moe.")
            .or_else(|| field.strip_prefix("indexer."))
            .unwrap_or(field)
            .to_string(),
    }
}

/// The checkpoint directory's name (`GLM-5.1` for `GLM-5.1/config.json`), or "model" when the path
/// has none.
fn module_name(file: &Path) -> String {
    let dir = match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let absolute: Option<PathBuf> = dir.canonicalize().ok();
    dir.file_name()
        .or_else(|| absolute.as_deref().and_then(Path::file_name))
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".to_string())
}

/// Keys whose non-default values describe a model the GLM-5 builder does not build.
fn check_unsupported(json: &HfJson) -> Result<(), ConfigError> {
    if let Some(v) = json.get("rope_scaling") {
        return Err(json.invalid(
            "rope_scaling",
            format!(
                "is {}; RoPE scaling (YaRN) is not supported, GLM-5 uses plain RoPE; remove the \
                 key or set it to null",
                short(v)
            ),
        ));
    }
    if let Some(act) = json.opt_str("hidden_act")?.filter(|&a| a != "silu") {
        return Err(json.invalid(
            "hidden_act",
            format!("is {act:?}; only \"silu\" (SwiGLU) is supported"),
        ));
    }
    if json.opt_bool("attention_bias")? == Some(true) {
        return Err(json.invalid(
            "attention_bias",
            "is true; GLM-5 attention has no biases, set it to false",
        ));
    }
    if json.opt_bool("mlp_bias")? == Some(true) {
        return Err(json.invalid(
            "mlp_bias",
            "is true; GLM-5 MLPs have no biases, set it to false",
        ));
    }
    if let Some(freq) = json.opt_u64("moe_layer_freq")?.filter(|&f| f != 1) {
        return Err(json.invalid(
            "moe_layer_freq",
            format!("is {freq}; only 1 (every layer after the dense prefix is MoE) is supported"),
        ));
    }
    Ok(())
}

/// `head_dim` and `qk_head_dim` repeat other keys; a disagreement means a corrupt config.
fn check_derived(json: &HfJson, nope: u64, rope: u64) -> Result<(), ConfigError> {
    if let Some(head_dim) = json.opt_u64("head_dim")?.filter(|&h| h != rope) {
        return Err(json.invalid(
            "head_dim",
            format!(
                "is {head_dim}, but transformers sets it to qk_rope_head_dim ({rope}); set it to \
                 {rope} or remove it"
            ),
        ));
    }
    let sum = nope.checked_add(rope);
    if let Some(qk) = json.opt_u64("qk_head_dim")?.filter(|&q| Some(q) != sum) {
        return Err(json.invalid(
            "qk_head_dim",
            format!(
                "is {qk}, but qk_nope_head_dim + qk_rope_head_dim is {nope} + {rope}; set it to \
                 their sum or remove it"
            ),
        ));
    }
    Ok(())
}

/// `dtype` (transformers >= 4.56) or `torch_dtype`. float64 (tiny oracle checkpoints) maps to
/// f32, glmc's widest activation dtype; absent means float32, as transformers loads it.
fn dtype(json: &HfJson) -> Result<DType, ConfigError> {
    let key = if json.get("dtype").is_some() {
        "dtype"
    } else {
        "torch_dtype"
    };
    match json.opt_str(key)? {
        None | Some("float32" | "float64") => Ok(DType::F32),
        Some("bfloat16") => Ok(DType::BF16),
        Some("float16") => Ok(DType::F16),
        Some(other) => Err(json.invalid(
            key,
            format!("is {other:?}; expected \"bfloat16\", \"float16\", \"float32\" or \"float64\""),
        )),
    }
}

/// `rope_parameters.rope_theta` (transformers 5), else the legacy top-level `rope_theta`.
fn rope_theta(json: &HfJson) -> Result<f64, ConfigError> {
    let legacy = json.opt_f64("rope_theta")?;
    let Some(params) = json.get("rope_parameters") else {
        return legacy.ok_or_else(|| json.missing("rope_parameters"));
    };
    let Some(params) = params.as_object() else {
        return Err(json.invalid(
            "rope_parameters",
            format!(
                "is {}; expected an object such as {{\"rope_theta\": 1000000, \"rope_type\": \"default\"}}",
                short(params)
            ),
        ));
    };
    let field = |key: &str| params.get(key).filter(|v| !v.is_null());
    if let Some(t) = field("rope_type").filter(|t| t.as_str() != Some("default")) {
        return Err(json.invalid(
            "rope_parameters.rope_type",
            format!(
                "is {}; only \"default\" RoPE is supported (no YaRN or other scaling)",
                short(t)
            ),
        ));
    }
    let theta = match field("rope_theta") {
        Some(v) => v.as_f64().ok_or_else(|| {
            json.invalid(
                "rope_parameters.rope_theta",
                format!("is {}; expected a number", short(v)),
            )
        })?,
        None => legacy.ok_or_else(|| json.missing("rope_parameters.rope_theta"))?,
    };
    if let Some(old) = legacy.filter(|&old| old != theta) {
        return Err(json.invalid(
            "rope_theta",
            format!(
                "is {old}, but rope_parameters.rope_theta is {theta}; remove the legacy key or \
                 make them agree"
            ),
        ));
    }
    Ok(theta)
}

/// The DSA indexer when `index_topk` is present (vLLM keys sparse attention off the same key).
fn indexer(json: &HfJson, layers: usize) -> Result<Option<IndexerConfig>, ConfigError> {
    let Some(index_topk) = json.opt_u64("index_topk")? else {
        return Ok(None);
    };
    Ok(Some(IndexerConfig {
        index_topk,
        index_n_heads: json.req_u64("index_n_heads")?,
        index_head_dim: json.req_u64("index_head_dim")?,
        rope_interleave: json.opt_bool("indexer_rope_interleave")?.unwrap_or(true),
        k_norm_eps: 1e-6,
        layer_types: indexer_layer_types(json, layers)?,
    }))
}

fn moe(json: &HfJson) -> Result<MoeConfig, ConfigError> {
    let scoring_func = match json.opt_str("scoring_func")? {
        None | Some("sigmoid") => ScoringFunc::Sigmoid,
        Some(other) => {
            return Err(json.invalid(
                "scoring_func",
                format!("is {other:?}; only \"sigmoid\" routers are supported"),
            ))
        }
    };
    let topk_method = match json.opt_str("topk_method")? {
        None | Some("noaux_tc") => TopkMethod::NoauxTc,
        Some(other) => {
            return Err(json.invalid(
                "topk_method",
                format!("is {other:?}; glm_moe_dsa routers select with \"noaux_tc\" (score + e_score_correction_bias), the only method glmc supports"),
            ))
        }
    };
    Ok(MoeConfig {
        n_routed_experts: json.req_u64("n_routed_experts")?,
        n_shared_experts: json.req_u64("n_shared_experts")?,
        num_experts_per_tok: json.req_u64("num_experts_per_tok")?,
        moe_intermediate_size: json.req_u64("moe_intermediate_size")?,
        n_group: json.opt_u64("n_group")?.unwrap_or(1),
        topk_group: json.opt_u64("topk_group")?.unwrap_or(1),
        routed_scaling_factor: json.req_f64("routed_scaling_factor")?,
        norm_topk_prob: json.req_bool("norm_topk_prob")?,
        scoring_func,
        topk_method,
    })
}

/// `eos_token_id`: one id or a list of ids.
fn eos_token_ids(json: &HfJson) -> Result<Vec<u64>, ConfigError> {
    let ids = json.opt("eos_token_id", "an id or a list of ids", |v| match v {
        Value::Array(items) => items.iter().map(Value::as_u64).collect(),
        v => v.as_u64().map(|id| vec![id]),
    })?;
    Ok(ids.unwrap_or_default())
}
