//! What an HF `glm_moe_dsa` tensor name means to the config: which part of a layer it belongs
//! to, which config key makes the graph read it, the formula of its expected shape, and why the
//! graph would not read it. These name the key a user edits when the checkpoint and the config
//! disagree.

use glmc_models::ModelConfig;

/// The decoder layer a tensor belongs to (`model.layers.<n>.…`), if any.
pub fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("model.layers.")?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// The routed expert a tensor belongs to (`….mlp.experts.<e>.…`), if any.
fn expert_of(name: &str) -> Option<u64> {
    let (_, rest) = name.split_once(".mlp.experts.")?;
    rest.split('.').next()?.parse().ok()
}

fn is_dense_mlp(name: &str) -> bool {
    [".mlp.gate_proj.", ".mlp.up_proj.", ".mlp.down_proj."]
        .iter()
        .any(|p| name.contains(p))
}

fn is_moe(name: &str) -> bool {
    [".mlp.experts.", ".mlp.shared_experts.", ".mlp.gate."]
        .iter()
        .any(|p| name.contains(p))
}

/// The part of the model a tensor belongs to, for the per-kind totals of `glmc inspect`.
pub fn kind_of(config: &ModelConfig, name: &str, mtp: bool) -> &'static str {
    if mtp {
        "MTP layer"
    } else if name.contains(".self_attn.indexer.") {
        "indexer"
    } else if name.contains(".self_attn.") {
        "attention (MLA)"
    } else if name.contains(".mlp.experts.") {
        "routed experts"
    } else if name.contains(".mlp.shared_experts.") {
        "shared experts"
    } else if name.contains(".mlp.gate.") {
        "router"
    } else if is_dense_mlp(name) {
        "dense MLP"
    } else if name.contains("layernorm") || name == "model.norm.weight" {
        "norms"
    } else if name == "model.embed_tokens.weight" || name == "lm_head.weight" {
        "embedding and head"
    } else if layer_of(name).is_some_and(|l| l < config.num_hidden_layers) {
        "other layer tensors"
    } else {
        "other"
    }
}

/// The config key (with its value) that makes the graph read `name`.
pub fn asked_by(config: &ModelConfig, name: &str) -> String {
    let c = config;
    if let Some(ix) = c
        .indexer
        .as_ref()
        .filter(|_| name.contains(".self_attn.indexer."))
    {
        let layer = layer_of(name).unwrap_or(0);
        return format!(
            "index_topk = {} (sparse attention; indexer_types has layer {layer} \"full\")",
            ix.index_topk
        );
    }
    if let Some(e) = expert_of(name) {
        return format!("n_routed_experts = {} (expert {e})", c.moe.n_routed_experts);
    }
    if name.contains(".mlp.shared_experts.") {
        return format!("n_shared_experts = {}", c.moe.n_shared_experts);
    }
    if name.contains(".mlp.gate.") {
        return format!(
            "first_k_dense_replace = {} (layer {} is MoE)",
            c.first_k_dense_replace,
            layer_of(name).unwrap_or(0)
        );
    }
    if is_dense_mlp(name) {
        return format!(
            "first_k_dense_replace = {} (layer {} has a dense MLP)",
            c.first_k_dense_replace,
            layer_of(name).unwrap_or(0)
        );
    }
    match layer_of(name) {
        Some(_) => format!("num_hidden_layers = {}", c.num_hidden_layers),
        None if name == "lm_head.weight" => {
            format!("tie_word_embeddings = {}", c.tie_word_embeddings)
        }
        None => format!(
            "vocab_size = {}, hidden_size = {}",
            c.vocab_size, c.hidden_size
        ),
    }
}

/// The expected shape of `name` as config keys, e.g. `[num_attention_heads × (qk_nope_head_dim
/// + v_head_dim), kv_lora_rank] = [4 × (16 + 16), 16]`; `None` for names without a formula.
pub fn shape_formula(config: &ModelConfig, name: &str) -> Option<String> {
    const TEMPLATES: &[(&str, &str)] = &[
        ("model.embed_tokens.weight", "[vocab_size, hidden_size]"),
        ("lm_head.weight", "[vocab_size, hidden_size]"),
        ("self_attn.q_a_proj.weight", "[q_lora_rank, hidden_size]"),
        (
            "self_attn.q_b_proj.weight",
            "[num_attention_heads × (qk_nope_head_dim + qk_rope_head_dim), q_lora_rank]",
        ),
        (
            "self_attn.kv_a_proj_with_mqa.weight",
            "[kv_lora_rank + qk_rope_head_dim, hidden_size]",
        ),
        (
            "self_attn.kv_b_proj.weight",
            "[num_attention_heads × (qk_nope_head_dim + v_head_dim), kv_lora_rank]",
        ),
        (
            "self_attn.o_proj.weight",
            "[hidden_size, num_attention_heads × v_head_dim]",
        ),
        (
            "indexer.wq_b.weight",
            "[index_n_heads × index_head_dim, q_lora_rank]",
        ),
        ("indexer.wk.weight", "[index_head_dim, hidden_size]"),
        (
            "indexer.weights_proj.weight",
            "[index_n_heads, hidden_size]",
        ),
        ("mlp.gate.weight", "[n_routed_experts, hidden_size]"),
        ("mlp.gate.e_score_correction_bias", "[n_routed_experts]"),
        ("gate_proj.weight", "[FFN, hidden_size]"),
        ("up_proj.weight", "[FFN, hidden_size]"),
        ("down_proj.weight", "[hidden_size, FFN]"),
    ];
    let (_, template) = TEMPLATES
        .iter()
        .find(|(suffix, _)| name.ends_with(suffix))?;
    let ffn = if name.contains(".mlp.experts.") {
        "moe_intermediate_size"
    } else if name.contains(".mlp.shared_experts.") {
        "n_shared_experts × moe_intermediate_size"
    } else {
        "intermediate_size"
    };
    let keys = template.replace("FFN", ffn);
    let mut values = keys.clone();
    // Longest names first, so `intermediate_size` does not eat `moe_intermediate_size`.
    let mut known = key_values(config);
    known.sort_by_key(|(k, _)| std::cmp::Reverse(k.len()));
    for (key, value) in known {
        values = values.replace(key, &value.to_string());
    }
    Some(if values == keys {
        keys
    } else {
        format!("{keys} = {values}")
    })
}

fn key_values(c: &ModelConfig) -> Vec<(&'static str, u64)> {
    let ix = c.indexer.as_ref();
    vec![
        ("vocab_size", c.vocab_size),
        ("hidden_size", c.hidden_size),
        ("q_lora_rank", c.q_lora_rank),
        ("kv_lora_rank", c.kv_lora_rank),
        ("num_attention_heads", c.num_attention_heads),
        ("qk_nope_head_dim", c.qk_nope_head_dim),
        ("qk_rope_head_dim", c.qk_rope_head_dim),
        ("v_head_dim", c.v_head_dim),
        ("index_n_heads", ix.map_or(0, |ix| ix.index_n_heads)),
        ("index_head_dim", ix.map_or(0, |ix| ix.index_head_dim)),
        ("n_routed_experts", c.moe.n_routed_experts),
        ("n_shared_experts", c.moe.n_shared_experts),
        ("moe_intermediate_size", c.moe.moe_intermediate_size),
        ("intermediate_size", c.intermediate_size),
    ]
}

/// Why the graph does not read a checkpoint tensor, as the config key that explains it; `None`
/// for a name no key accounts for (an unknown prefix).
pub fn unused_reason(config: &ModelConfig, sparse: bool, name: &str) -> Option<String> {
    let c = config;
    if name.ends_with("_scale_inv") || name.ends_with(".weight_scale") {
        return Some(
            "quantization_config: FP8 block scales, which glmc does not read (its weights must \
             be bf16/f16/f32)"
                .to_string(),
        );
    }
    let layer = layer_of(name);
    if let Some(l) = layer.filter(|&l| l >= c.num_hidden_layers) {
        return Some(format!(
            "num_hidden_layers = {}: layer {l} is past the model's layers",
            c.num_hidden_layers
        ));
    }
    if name.contains(".self_attn.indexer.") {
        return Some(match (&c.indexer, sparse) {
            (None, _) => "the config has no indexer (indexer: None in model.ron), so the \
                          attention is dense"
                .to_string(),
            (Some(_), false) => "attention = dense (--attention dense or the config's \
                                 `attention`): the indexer does not run"
                .to_string(),
            (Some(_), true) => format!(
                "indexer_types: layer {} is \"shared\" and reuses an earlier layer's top-k",
                layer.unwrap_or(0)
            ),
        });
    }
    if let Some(e) = expert_of(name).filter(|&e| e >= c.moe.n_routed_experts) {
        return Some(format!(
            "n_routed_experts = {}: expert {e} and above are beyond it",
            c.moe.n_routed_experts
        ));
    }
    let l = layer?;
    if (is_dense_mlp(name) && c.is_moe_layer(l)) || (is_moe(name) && !c.is_moe_layer(l)) {
        return Some(format!(
            "first_k_dense_replace = {}: layer {l} has the other kind of MLP",
            c.first_k_dense_replace
        ));
    }
    None
}

/// Whether layer `l` of the checkpoint is a multi-token-prediction layer: one of the
/// `num_nextn_predict_layers` after the main layers, or any later layer with the MTP-only
/// `eh_proj` (a config that omits the key still ships GLM-5's layer 78).
pub fn is_mtp_layer(config: &ModelConfig, l: usize, has_eh_proj: bool) -> bool {
    l >= config.num_hidden_layers && (l < config.num_layers_with_mtp() || has_eh_proj)
}
