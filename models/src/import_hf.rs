//! `glmc import-hf`: a Hugging Face `config.json` of model_type `glm_moe_dsa` turned into a
//! validated [`ModelConfig`], read the way transformers 5.17's `GlmMoeDsaConfig` reads it.
//!
//! A deployment that silently read a config differently from the checkpoint's own library (a
//! loader that dropped `index_topk` and served the sparse model dense) produced fluent garbage
//! with no error. So glmc never departs silently from transformers' reading: every key
//! transformers fills in when it is absent either gets the same default and an [`ImportNote`], or
//! is refused with exit 2 naming the key. Every command that reads a `config.json` prints the
//! notes, and `compile` records them in the artifact.
//!
//! The rule: a default is taken (with a note) when transformers' value is known and either the
//! checkpoint's tensor shapes check it (the sizes: `glmc inspect`, `run` and `compile` on a
//! checkpoint directory compare them) or it is the value every GLM-5 release ships. A key whose
//! default is not known for certain, or differs between releases in a way no tensor shows, is
//! refused.
//!
//! | key(s) absent | what glmc does |
//! |---|---|
//! | `vocab_size` 154880, `hidden_size` 6144, `intermediate_size` 12288, `moe_intermediate_size` 2048, `num_hidden_layers` 78, `num_attention_heads` 64, `q_lora_rank` 2048, `kv_lora_rank` 512, `qk_nope_head_dim` 192, `qk_rope_head_dim` 64, `v_head_dim` 256, `n_routed_experts` 256, `n_shared_experts` 1 | default + note (the checkpoint check compares them with the tensors) |
//! | `index_topk` 2048, `index_n_heads` 32, `index_head_dim` 128 | default + note: every `glm_moe_dsa` model has an indexer |
//! | `indexer_types` (else `index_topk_pattern`, else `index_topk_freq` 1 / `index_skip_topk_offset` 2) | default + note: every layer runs its own indexer |
//! | `first_k_dense_replace` 3 (when `mlp_layer_types` is absent too) | default + note |
//! | `num_experts_per_tok` 8, `routed_scaling_factor` 2.5, `norm_topk_prob` true, `n_group` 1, `topk_group` 1 | default + note |
//! | `rms_norm_eps` 1e-5, `max_position_embeddings` 202752, `hidden_act` "silu", `attention_bias` false, `mlp_bias` false, `tie_word_embeddings` false | default + note |
//! | `dtype` / `torch_dtype` | float32 + note, as transformers loads a config without one |
//! | `rope_parameters.rope_theta` (and no legacy `rope_theta`) | refused: GLM-5/5.1 use 1e6, GLM-5.2/5.3 8e6, and no tensor shows which |
//! | `model_type` | refused |
//!
//! Values transformers replaces: `head_dim` is overwritten with `qk_rope_head_dim` (published
//! GLM-5.2/5.3 files say 192); glmc does the same and notes it when they differ. Keys
//! transformers 5.17 does not read and hard-codes instead (`scoring_func` sigmoid, `topk_method`
//! noaux_tc, `moe_layer_freq` 1, interleaved `rope_interleave` / `indexer_rope_interleave`) are
//! silent when absent or equal to that, and refused otherwise; `rope_interleave: false` and
//! `indexer_rope_interleave: false` are refused because transformers 5.17 still interleaves while
//! vLLM then rotates NeoX halves, and glmc will not pick one. `num_nextn_predict_layers` (absent:
//! 0) only says which checkpoint tensors are the MTP layer, which glmc does not run. Keys that do
//! not change the computation (`attention_dropout`, `initializer_range`, `use_cache`,
//! `architectures`, `num_key_value_heads`, token ids, `layer_types`, `quantization_config`,
//! `moe_router_dtype`, `index_share_for_mtp_iteration`, ...) are ignored silently.

use std::path::{Path, PathBuf};

use glmc_ir::DType;
use serde_json::Value;

use crate::config::{
    AttentionMode, IndexerConfig, ModelConfig, MoeConfig, ScoringFunc, TopkMethod,
};
use crate::error::ConfigError;
use crate::hf_json::{short, HfJson};
use crate::hf_layers::{dense_prefix, indexer_layer_types};
use crate::import_note::ImportNote;
use crate::validate::MAX_LAYERS;

/// The only `model_type` glmc compiles.
pub const HF_MODEL_TYPE: &str = "glm_moe_dsa";

/// A config as imported, and what was taken from transformers' defaults rather than the file.
#[derive(Clone, Debug, PartialEq)]
pub struct Imported {
    pub config: ModelConfig,
    pub notes: Vec<ImportNote>,
}

/// Imports an HF checkpoint directory, or its `config.json`. The module is named after the
/// checkpoint directory.
pub fn import_hf(path: &Path) -> Result<Imported, ConfigError> {
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

/// The keys of one `config.json` and the notes taken while reading them.
pub(crate) struct Reader<'a> {
    pub(crate) json: HfJson<'a>,
    pub(crate) notes: Vec<ImportNote>,
}

impl Reader<'_> {
    fn u64_or(&mut self, key: &str, default: u64) -> Result<u64, ConfigError> {
        let value = self.json.opt_u64(key)?;
        Ok(self.or_default(key, value, default))
    }

    fn f64_or(&mut self, key: &str, default: f64) -> Result<f64, ConfigError> {
        let value = self.json.opt_f64(key)?;
        Ok(self.or_default(key, value, default))
    }

    fn bool_or(&mut self, key: &str, default: bool) -> Result<bool, ConfigError> {
        let value = self.json.opt_bool(key)?;
        Ok(self.or_default(key, value, default))
    }

    pub(crate) fn or_default<T: std::fmt::Display>(
        &mut self,
        key: &str,
        value: Option<T>,
        default: T,
    ) -> T {
        value.unwrap_or_else(|| {
            self.notes.push(ImportNote::defaulted(key, &default));
            default
        })
    }
}

/// Imports `config.json` text; `path` only labels errors, `name` names the module.
pub fn import_hf_str(text: &str, path: &Path, name: &str) -> Result<Imported, ConfigError> {
    let mut r = Reader {
        json: HfJson::parse(text, path)?,
        notes: Vec::new(),
    };
    match r.json.opt_str("model_type")? {
        Some(HF_MODEL_TYPE) => {}
        Some(found) => {
            return Err(ConfigError::UnsupportedModelType {
                path: path.to_path_buf(),
                found: found.to_string(),
            })
        }
        None => {
            return Err(r.json.missing(
                "model_type",
                "glmc reads only glm_moe_dsa configs; add \"model_type\": \"glm_moe_dsa\" if \
                 this is a GLM-5 checkpoint",
            ))
        }
    }
    check_unsupported(&mut r)?;
    let layers = r.json.opt_usize("num_hidden_layers")?;
    let layers = r.or_default("num_hidden_layers", layers, 78);
    if layers > MAX_LAYERS {
        return Err(r.json.invalid(
            "num_hidden_layers",
            format!("is {layers}; glmc supports at most {MAX_LAYERS} layers"),
        ));
    }
    let qk_rope_head_dim = r.u64_or("qk_rope_head_dim", 64)?;
    let qk_nope_head_dim = r.u64_or("qk_nope_head_dim", 192)?;
    check_derived(&mut r, qk_nope_head_dim, qk_rope_head_dim)?;
    let config = ModelConfig {
        name: name.to_string(),
        dtype: dtype(&mut r)?,
        vocab_size: r.u64_or("vocab_size", 154880)?,
        hidden_size: r.u64_or("hidden_size", 6144)?,
        num_hidden_layers: layers,
        num_attention_heads: r.u64_or("num_attention_heads", 64)?,
        q_lora_rank: r.u64_or("q_lora_rank", 2048)?,
        kv_lora_rank: r.u64_or("kv_lora_rank", 512)?,
        qk_nope_head_dim,
        qk_rope_head_dim,
        v_head_dim: r.u64_or("v_head_dim", 256)?,
        rms_norm_eps: r.f64_or("rms_norm_eps", 1e-5)?,
        // transformers 5.17 hard-codes 1e-6 for q_a_layernorm/kv_a_layernorm; see ModelConfig.
        latent_norm_eps: 1e-6,
        rope_theta: rope_theta(&r.json)?,
        rope_interleave: interleave(&r.json, "rope_interleave", "MLA")?,
        max_position_embeddings: r.u64_or("max_position_embeddings", 202752)?,
        intermediate_size: r.u64_or("intermediate_size", 12288)?,
        first_k_dense_replace: dense_prefix(&mut r, layers)?,
        indexer: Some(indexer(&mut r, layers)?),
        attention: AttentionMode::Auto,
        moe: moe(&mut r)?,
        num_nextn_predict_layers: r.json.opt_usize("num_nextn_predict_layers")?.unwrap_or(0),
        tie_word_embeddings: r.bool_or("tie_word_embeddings", false)?,
        eos_token_ids: eos_token_ids(&r.json)?,
    };
    let notes = r.notes;
    config.validate().map_err(|mut e| {
        e.field = json_key(&e.field);
        // A default the value clashes with is named, so the user sees where it came from.
        let taken: Vec<String> = notes
            .iter()
            .filter(|n| e.field == n.key() || e.message.contains(n.key()))
            .map(ToString::to_string)
            .collect();
        if !taken.is_empty() {
            e.message = format!("{} (note: {})", e.message, taken.join("; "));
        }
        e.in_file(path)
    })?;
    Ok(Imported { config, notes })
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

/// Keys whose non-default values describe a model the GLM-5 builder does not build; absent ones
/// get transformers' defaults, which are the supported values.
fn check_unsupported(r: &mut Reader) -> Result<(), ConfigError> {
    let json = &r.json;
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
    // Present values were checked above; only an absent key still needs its note.
    if r.json.get("hidden_act").is_none() {
        r.notes
            .push(ImportNote::defaulted("hidden_act", "\"silu\""));
    }
    r.bool_or("attention_bias", false)?;
    r.bool_or("mlp_bias", false)?;
    Ok(())
}

/// `head_dim` is overwritten by transformers with `qk_rope_head_dim` (GLM-5.2/5.3 files say 192);
/// `qk_head_dim` repeats the sum of the two parts, and a disagreement means a corrupt config.
fn check_derived(r: &mut Reader, nope: u64, rope: u64) -> Result<(), ConfigError> {
    if let Some(head_dim) = r.json.opt_u64("head_dim")?.filter(|&h| h != rope) {
        r.notes.push(ImportNote::Overridden {
            key: "head_dim".into(),
            found: head_dim.to_string(),
            by: "qk_rope_head_dim".into(),
            value: rope.to_string(),
        });
    }
    let sum = nope.checked_add(rope);
    if let Some(qk) = r.json.opt_u64("qk_head_dim")?.filter(|&q| Some(q) != sum) {
        return Err(r.json.invalid(
            "qk_head_dim",
            format!(
                "is {qk}, but qk_nope_head_dim + qk_rope_head_dim is {nope} + {rope}; set it to \
                 their sum or remove it"
            ),
        ));
    }
    Ok(())
}

/// `rope_interleave` / `indexer_rope_interleave`: true or absent is what transformers 5.17 always
/// computes. false is read two ways (transformers still interleaves, vLLM rotates NeoX halves),
/// so glmc refuses it rather than pick one.
fn interleave(json: &HfJson, key: &str, what: &str) -> Result<bool, ConfigError> {
    match json.opt_bool(key)? {
        None | Some(true) => Ok(true),
        Some(false) => Err(json.invalid(
            key,
            format!(
                "is false, which the two reference implementations read differently: \
                 transformers 5.17 ignores it and rotates the {what} RoPE in interleaved pairs, \
                 vLLM rotates NeoX halves (half-split); glmc will not guess which one this \
                 checkpoint was trained with. GLM-5 interleaves: set it to true or remove it"
            ),
        )),
    }
}

/// `dtype` (transformers >= 4.56) or `torch_dtype`. float64 (tiny oracle checkpoints) maps to
/// f32, glmc's widest activation dtype; absent means float32, as transformers loads it.
fn dtype(r: &mut Reader) -> Result<DType, ConfigError> {
    let key = if r.json.get("dtype").is_some() {
        "dtype"
    } else {
        "torch_dtype"
    };
    let name = r.json.opt_str(key)?.map(str::to_string);
    match r.or_default("dtype", name, "float32".to_string()).as_str() {
        "float32" | "float64" => Ok(DType::F32),
        "bfloat16" => Ok(DType::BF16),
        "float16" => Ok(DType::F16),
        other => Err(r.json.invalid(
            key,
            format!("is {other:?}; expected \"bfloat16\", \"float16\", \"float32\" or \"float64\""),
        )),
    }
}

/// Why an absent RoPE theta is refused rather than defaulted.
const NO_THETA_DEFAULT: &str = "glmc takes no default for it, since GLM-5/5.1 use 1000000 and \
    GLM-5.2/5.3 8000000 and no tensor shows which; add \"rope_parameters\": {\"rope_theta\": \
    1000000, \"rope_type\": \"default\"} with the checkpoint's theta";

/// `rope_parameters.rope_theta` (transformers 5), else the legacy top-level `rope_theta`.
fn rope_theta(json: &HfJson) -> Result<f64, ConfigError> {
    let legacy = json.opt_f64("rope_theta")?;
    let Some(params) = json.get("rope_parameters") else {
        return legacy.ok_or_else(|| json.missing("rope_parameters", NO_THETA_DEFAULT));
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
        None => {
            legacy.ok_or_else(|| json.missing("rope_parameters.rope_theta", NO_THETA_DEFAULT))?
        }
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

/// The DSA indexer: transformers gives every glm_moe_dsa model one, so an absent `index_topk`
/// takes its default 2048 rather than turning the model dense.
fn indexer(r: &mut Reader, layers: usize) -> Result<IndexerConfig, ConfigError> {
    Ok(IndexerConfig {
        index_topk: r.u64_or("index_topk", 2048)?,
        index_n_heads: r.u64_or("index_n_heads", 32)?,
        index_head_dim: r.u64_or("index_head_dim", 128)?,
        rope_interleave: interleave(&r.json, "indexer_rope_interleave", "indexer")?,
        k_norm_eps: 1e-6,
        layer_types: indexer_layer_types(r, layers)?,
    })
}

fn moe(r: &mut Reader) -> Result<MoeConfig, ConfigError> {
    let json = &r.json;
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
        n_routed_experts: r.u64_or("n_routed_experts", 256)?,
        n_shared_experts: r.u64_or("n_shared_experts", 1)?,
        num_experts_per_tok: r.u64_or("num_experts_per_tok", 8)?,
        moe_intermediate_size: r.u64_or("moe_intermediate_size", 2048)?,
        n_group: r.u64_or("n_group", 1)?,
        topk_group: r.u64_or("topk_group", 1)?,
        routed_scaling_factor: r.f64_or("routed_scaling_factor", 2.5)?,
        norm_topk_prob: r.bool_or("norm_topk_prob", true)?,
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
