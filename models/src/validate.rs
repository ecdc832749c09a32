//! `ModelConfig::validate`: rejects configs no GLM-5 graph can be built from, before the builder
//! sees them, with the field, the bad value and the fix in one message.

use glmc_ir::DType;

use crate::config::{AttentionMode, IndexerConfig, IndexerLayerType, ModelConfig, MoeConfig};
use crate::error::InvalidConfig;

type Check = Result<(), InvalidConfig>;

/// Most decoder layers (main plus MTP) a config may have. Real models have ~100; the cap keeps a
/// corrupt layer count from allocating per-layer lists or building a graph without end.
pub const MAX_LAYERS: usize = 4096;
/// Largest width, head count, rank or expert count. With it, products of three extents (a weight's
/// element count, e.g. heads x head_dim x rank) stay within u64; GLM-5's largest is 12288.
pub const MAX_DIM: u64 = 1 << 20;
/// Largest vocabulary (GLM-5: 154880).
pub const MAX_VOCAB: u64 = 1 << 24;
/// Largest context length and `index_topk` (GLM-5.2: 1048576 positions).
pub const MAX_POSITIONS: u64 = 1 << 32;

impl ModelConfig {
    /// The first impossible or unsupported value, if any.
    pub fn validate(&self) -> Check {
        if self.name.trim().is_empty() {
            return Err(InvalidConfig::new(
                "name",
                "is empty; name the module, e.g. name: \"glm5\"",
            ));
        }
        if !matches!(self.dtype, DType::F32 | DType::BF16 | DType::F16) {
            return Err(InvalidConfig::new(
                "dtype",
                format!(
                    "{:?} is not an activation dtype; use \"bf16\" (the checkpoint's), \"f16\" or \
                     \"f32\" (fp8 checkpoints are dequantized by the weight recipes)",
                    self.dtype.name()
                ),
            ));
        }
        for (field, value, max) in [
            ("vocab_size", self.vocab_size, MAX_VOCAB),
            ("hidden_size", self.hidden_size, MAX_DIM),
            (
                "num_hidden_layers",
                self.num_hidden_layers as u64,
                MAX_LAYERS as u64,
            ),
            ("num_attention_heads", self.num_attention_heads, MAX_DIM),
            ("q_lora_rank", self.q_lora_rank, MAX_DIM),
            ("kv_lora_rank", self.kv_lora_rank, MAX_DIM),
            ("qk_nope_head_dim", self.qk_nope_head_dim, MAX_DIM),
            ("qk_rope_head_dim", self.qk_rope_head_dim, MAX_DIM),
            ("v_head_dim", self.v_head_dim, MAX_DIM),
            (
                "max_position_embeddings",
                self.max_position_embeddings,
                MAX_POSITIONS,
            ),
            ("intermediate_size", self.intermediate_size, MAX_DIM),
        ] {
            extent(field, value, max)?;
        }
        if self.num_nextn_predict_layers > MAX_LAYERS - self.num_hidden_layers {
            return Err(InvalidConfig::new(
                "num_nextn_predict_layers",
                format!(
                    "is {}; with {} main layers it may be at most {} (GLM-5: 1)",
                    self.num_nextn_predict_layers,
                    self.num_hidden_layers,
                    MAX_LAYERS - self.num_hidden_layers
                ),
            ));
        }
        if !self.qk_rope_head_dim.is_multiple_of(2) {
            return Err(InvalidConfig::new(
                "qk_rope_head_dim",
                format!(
                    "{} is odd; RoPE rotates pairs of dims, so it must be even (GLM-5: 64)",
                    self.qk_rope_head_dim
                ),
            ));
        }
        positive_real("rms_norm_eps", self.rms_norm_eps)?;
        positive_real("latent_norm_eps", self.latent_norm_eps)?;
        positive_real("rope_theta", self.rope_theta)?;
        if self.first_k_dense_replace > self.num_hidden_layers {
            return Err(InvalidConfig::new(
                "first_k_dense_replace",
                format!(
                    "{} exceeds num_hidden_layers ({}); set it to at most {} (the number of leading \
                     dense-MLP layers)",
                    self.first_k_dense_replace, self.num_hidden_layers, self.num_hidden_layers
                ),
            ));
        }
        match &self.indexer {
            Some(indexer) => self.validate_indexer(indexer)?,
            None if self.attention == AttentionMode::Sparse => {
                return Err(InvalidConfig::new(
                    "attention",
                    "is sparse, but the model has no indexer to pick the top-k tokens; use \
                     attention: auto or dense, or add an `indexer`",
                ))
            }
            None => {}
        }
        validate_moe(&self.moe)?;
        if let Some(&id) = self.eos_token_ids.iter().find(|&&id| id >= self.vocab_size) {
            return Err(InvalidConfig::new(
                "eos_token_ids",
                format!(
                    "contains {id}, outside the vocabulary (vocab_size {}); every id must be below {}",
                    self.vocab_size, self.vocab_size
                ),
            ));
        }
        Ok(())
    }

    fn validate_indexer(&self, indexer: &IndexerConfig) -> Check {
        extent("indexer.index_topk", indexer.index_topk, MAX_POSITIONS)?;
        extent("indexer.index_n_heads", indexer.index_n_heads, MAX_DIM)?;
        at_most("indexer.index_head_dim", indexer.index_head_dim, MAX_DIM)?;
        if indexer.index_head_dim <= self.qk_rope_head_dim {
            return Err(InvalidConfig::new(
                "indexer.index_head_dim",
                format!(
                    "{} is not larger than qk_rope_head_dim ({}); each indexer head is [rope {} | \
                     nope], so set index_head_dim above {} (GLM-5: 128)",
                    indexer.index_head_dim,
                    self.qk_rope_head_dim,
                    self.qk_rope_head_dim,
                    self.qk_rope_head_dim
                ),
            ));
        }
        positive_real("indexer.k_norm_eps", indexer.k_norm_eps)?;
        let types = &indexer.layer_types;
        if !types.is_empty() && types.len() != self.num_hidden_layers {
            return Err(InvalidConfig::new(
                "indexer.layer_types",
                format!(
                    "has {} entries for {} layers; give one full/shared per main layer, or [] for \
                     all full",
                    types.len(),
                    self.num_hidden_layers
                ),
            ));
        }
        if types.first() == Some(&IndexerLayerType::Shared) {
            return Err(InvalidConfig::new(
                "indexer.layer_types[0]",
                "is shared, but no earlier layer computes a top-k to share; layer 0 must be full",
            ));
        }
        Ok(())
    }
}

fn validate_moe(moe: &MoeConfig) -> Check {
    extent("moe.n_routed_experts", moe.n_routed_experts, MAX_DIM)?;
    at_most("moe.n_shared_experts", moe.n_shared_experts, MAX_DIM)?;
    extent("moe.num_experts_per_tok", moe.num_experts_per_tok, MAX_DIM)?;
    extent(
        "moe.moe_intermediate_size",
        moe.moe_intermediate_size,
        MAX_DIM,
    )?;
    extent("moe.n_group", moe.n_group, MAX_DIM)?;
    extent("moe.topk_group", moe.topk_group, MAX_DIM)?;
    positive_real("moe.routed_scaling_factor", moe.routed_scaling_factor)?;
    if moe.num_experts_per_tok > moe.n_routed_experts {
        return Err(InvalidConfig::new(
            "moe.num_experts_per_tok",
            format!(
                "{} exceeds n_routed_experts ({}); pick at most {} experts per token",
                moe.num_experts_per_tok, moe.n_routed_experts, moe.n_routed_experts
            ),
        ));
    }
    if !moe.n_routed_experts.is_multiple_of(moe.n_group) {
        return Err(InvalidConfig::new(
            "moe.n_group",
            format!(
                "{} does not divide n_routed_experts ({}); use a divisor of {} (1 disables group \
                 routing)",
                moe.n_group, moe.n_routed_experts, moe.n_routed_experts
            ),
        ));
    }
    if moe.topk_group > moe.n_group {
        return Err(InvalidConfig::new(
            "moe.topk_group",
            format!(
                "{} exceeds n_group ({}); set topk_group to at most {} (the number of expert groups)",
                moe.topk_group, moe.n_group, moe.n_group
            ),
        ));
    }
    let reachable = moe.topk_group * (moe.n_routed_experts / moe.n_group);
    if moe.num_experts_per_tok > reachable {
        return Err(InvalidConfig::new(
            "moe.num_experts_per_tok",
            format!(
                "{} exceeds the {} experts in the topk_group ({}) groups kept of {} experts each; \
                 lower num_experts_per_tok to at most {} or raise topk_group",
                moe.num_experts_per_tok,
                reachable,
                moe.topk_group,
                moe.n_routed_experts / moe.n_group,
                reachable
            ),
        ));
    }
    Ok(())
}

/// A count that may be 0 but not above `max`.
fn at_most(field: &str, value: u64, max: u64) -> Check {
    if value > max {
        return Err(InvalidConfig::new(
            field,
            format!("is {value}; it must be at most {max}"),
        ));
    }
    Ok(())
}

/// A size that must lie in `1..=max`.
fn extent(field: &str, value: u64, max: u64) -> Check {
    if value == 0 || value > max {
        return Err(InvalidConfig::new(
            field,
            format!("is {value}; it must be between 1 and {max}"),
        ));
    }
    Ok(())
}

fn positive_real(field: &str, value: f64) -> Check {
    if !(value.is_finite() && value > 0.0) {
        return Err(InvalidConfig::new(
            field,
            format!("is {value}; it must be a finite number greater than 0"),
        ));
    }
    Ok(())
}
