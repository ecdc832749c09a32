//! `ModelConfig`: every hyperparameter of a GLM-5 (`glm_moe_dsa`) model, as `model.ron` holds it.
//!
//! Tensor extents are `u64` (what `glmc_ir::Dim` holds); layer counts and indices are `usize`.
//! Serde defaults exist only where GLM-5's value is also what an absent key naturally means
//! (interleaved RoPE, sigmoid router with correction bias, no group routing, no MTP, ...); the
//! dimensions must always be written out.

use std::path::Path;

use glmc_ir::DType;
use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// A GLM-5-family model. Field order is the order `to_ron_string` writes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Name of the IR module built from this config.
    pub name: String,
    /// Activation (and dense weight) dtype: `f32`, `bf16` or `f16`.
    #[serde(with = "dtype_name", default = "default_dtype")]
    pub dtype: DType,
    pub vocab_size: u64,
    pub hidden_size: u64,
    /// Main decoder layers, without the MTP layers.
    pub num_hidden_layers: usize,
    pub num_attention_heads: u64,
    pub q_lora_rank: u64,
    pub kv_lora_rank: u64,
    pub qk_nope_head_dim: u64,
    pub qk_rope_head_dim: u64,
    pub v_head_dim: u64,
    /// Eps of the input, post-attention and final RMSNorms.
    pub rms_norm_eps: f64,
    /// Eps of `q_a_layernorm` and `kv_a_layernorm`. transformers 5.17 hard-codes 1e-6 and is the
    /// oracle glmc matches, so that is the default; vLLM uses `rms_norm_eps` (1e-5) for them
    /// instead. Which one GLM-5 was trained with is unknown (GLM5-SPEC §6).
    #[serde(default = "default_latent_norm_eps")]
    pub latent_norm_eps: f64,
    pub rope_theta: f64,
    /// Whether the MLA RoPE rotates adjacent pairs `(x[2i], x[2i+1])` rather than NeoX halves.
    #[serde(default = "yes")]
    pub rope_interleave: bool,
    pub max_position_embeddings: u64,
    /// Hidden size of the dense MLP of the first `first_k_dense_replace` layers.
    pub intermediate_size: u64,
    /// Layers `0..first_k_dense_replace` have a dense MLP; the rest are MoE.
    pub first_k_dense_replace: usize,
    /// The DSA lightning indexer; `None` for a model without one (dense MLA only).
    #[serde(default)]
    pub indexer: Option<IndexerConfig>,
    #[serde(default)]
    pub attention: AttentionMode,
    pub moe: MoeConfig,
    /// Multi-token-prediction layers stored after the main layers (`model.layers.<n>`).
    #[serde(default)]
    pub num_nextn_predict_layers: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub eos_token_ids: Vec<u64>,
}

/// The DSA indexer that picks the `index_topk` context tokens each query attends to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IndexerConfig {
    pub index_topk: u64,
    pub index_n_heads: u64,
    /// Per-head dim; the first `qk_rope_head_dim` dims carry RoPE, so it must be larger.
    pub index_head_dim: u64,
    /// `indexer_rope_interleave`: GLM-5 interleaves, DeepSeek-V3.2 uses NeoX halves.
    #[serde(default = "yes")]
    pub rope_interleave: bool,
    /// Eps of the indexer's `k_norm` LayerNorm (1e-6 in transformers and vLLM).
    #[serde(default = "default_latent_norm_eps")]
    pub k_norm_eps: f64,
    /// Per main layer: run its own indexer, or reuse the previous full layer's top-k (GLM-5.2
    /// IndexShare). Empty means every layer is full.
    #[serde(default)]
    pub layer_types: Vec<IndexerLayerType>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IndexerLayerType {
    /// The layer has indexer weights and computes its own top-k.
    Full,
    /// The layer ships no indexer weights and reuses the top-k of the nearest full layer before it.
    Shared,
}

/// Which attention the compiled model uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionMode {
    /// Sparse when the model has an indexer, dense otherwise: what the checkpoint was trained for.
    #[default]
    Auto,
    /// Dense causal MLA; the indexer is dropped. Exact while the context is <= `index_topk`.
    Dense,
    /// Top-k sparse MLA through the indexer; needs `indexer`.
    Sparse,
}

/// The routed-expert MLP of layers `first_k_dense_replace..` (and of the MTP layers).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoeConfig {
    pub n_routed_experts: u64,
    /// Always-on experts, each of `moe_intermediate_size`.
    pub n_shared_experts: u64,
    pub num_experts_per_tok: u64,
    pub moe_intermediate_size: u64,
    /// Expert groups for group-limited routing; 1 disables it.
    #[serde(default = "one")]
    pub n_group: u64,
    /// Groups kept per token before the expert top-k.
    #[serde(default = "one")]
    pub topk_group: u64,
    pub routed_scaling_factor: f64,
    #[serde(default = "yes")]
    pub norm_topk_prob: bool,
    #[serde(default)]
    pub scoring_func: ScoringFunc,
    #[serde(default)]
    pub topk_method: TopkMethod,
}

/// How router logits become expert scores. GLM-5 and DeepSeek-V3 use sigmoid; softmax routers
/// (DeepSeek-V2) are not supported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoringFunc {
    #[default]
    Sigmoid,
}

/// How experts are selected from the scores. Only `noaux_tc` exists in the glm_moe_dsa family
/// (every checkpoint ships `e_score_correction_bias`), so it is the only method glmc builds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TopkMethod {
    /// Select on score + `e_score_correction_bias` (an fp32 per-expert weight), weight by the
    /// unbiased score.
    #[default]
    NoauxTc,
}

impl ModelConfig {
    /// Parses `model.ron` text and validates it; `path` only labels errors.
    pub fn from_ron_str(text: &str, path: &Path) -> Result<ModelConfig, ConfigError> {
        let config: ModelConfig = ron::from_str(text).map_err(|e| ConfigError::Syntax {
            path: path.to_path_buf(),
            line: e.span.start.line,
            col: e.span.start.col,
            message: e.code.to_string(),
        })?;
        config.validate().map_err(|e| e.in_file(path))?;
        Ok(config)
    }

    /// Reads and validates a `model.ron` file.
    pub fn load(path: &Path) -> Result<ModelConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_ron_str(&text, path)
    }

    /// Pretty RON in declaration order with struct names; `from_ron_str` reads it back equal.
    pub fn to_ron_string(&self) -> String {
        let pretty = ron::ser::PrettyConfig::new()
            .struct_names(true)
            .compact_arrays(true)
            .indentor("    ");
        let mut text = ron::ser::to_string_pretty(self, pretty).expect(
            "a ModelConfig has only strings, numbers, bools, options, sequences and structs",
        );
        text.push('\n');
        text
    }

    /// Query/key head dim of the main attention: nope part + rope part.
    pub fn qk_head_dim(&self) -> u64 {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// Attention softmax scale `qk_head_dim^-0.5`; plain RoPE (no YaRN) adds no mscale term.
    pub fn softmax_scale(&self) -> f64 {
        (self.qk_head_dim() as f64).powf(-0.5)
    }

    /// Width of one token's MLA cache entry: the compressed KV plus the shared rope key.
    pub fn kv_cache_dim(&self) -> u64 {
        self.kv_lora_rank + self.qk_rope_head_dim
    }

    /// Decoder layers including the MTP layers, which follow the main ones.
    pub fn num_layers_with_mtp(&self) -> usize {
        self.num_hidden_layers + self.num_nextn_predict_layers
    }

    /// Whether layer `i` (main or MTP) has a MoE MLP rather than the dense one.
    pub fn is_moe_layer(&self, i: usize) -> bool {
        i >= self.first_k_dense_replace && i < self.num_layers_with_mtp()
    }

    /// Whether layer `i` runs its own indexer; `None` when the model has no indexer. Layers past
    /// `indexer.layer_types` (the MTP layers, or every layer when it is empty) are full.
    pub fn indexer_layer_type(&self, i: usize) -> Option<IndexerLayerType> {
        let indexer = self.indexer.as_ref()?;
        Some(
            indexer
                .layer_types
                .get(i)
                .copied()
                .unwrap_or(IndexerLayerType::Full),
        )
    }

    /// The layer whose indexer top-k layer `i` uses: `i` itself when full, the nearest full layer
    /// before it when shared; `None` when the model has no indexer.
    pub fn indexer_source_layer(&self, i: usize) -> Option<usize> {
        (0..=i)
            .rev()
            .find(|&j| self.indexer_layer_type(j) == Some(IndexerLayerType::Full))
    }

    /// Whether the compiled attention is sparse, resolving `attention: auto`.
    pub fn uses_sparse_attention(&self) -> bool {
        match self.attention {
            AttentionMode::Auto => self.indexer.is_some(),
            AttentionMode::Dense => false,
            AttentionMode::Sparse => true,
        }
    }
}

fn default_dtype() -> DType {
    DType::BF16
}

fn default_latent_norm_eps() -> f64 {
    1e-6
}

fn yes() -> bool {
    true
}

fn one() -> u64 {
    1
}

/// Writes a `DType` as its IR name (`"bf16"`), the spelling users see everywhere else.
mod dtype_name {
    use glmc_ir::DType;
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(dtype: &DType, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(dtype.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DType, D::Error> {
        let name = String::deserialize(d)?;
        DType::from_name(&name).ok_or_else(|| {
            let known: Vec<&str> = DType::ALL.iter().map(|t| t.name()).collect();
            D::Error::custom(format!(
                "unknown dtype {name:?}, expected one of {}",
                known.join(", ")
            ))
        })
    }
}
