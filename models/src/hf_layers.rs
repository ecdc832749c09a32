//! The per-layer lists of a `config.json`: which layers run their own indexer and which have a
//! dense MLP, in every spelling transformers 5.17 accepts.

use crate::config::IndexerLayerType;
use crate::error::ConfigError;
use crate::hf_json::HfJson;
use crate::import_hf::Reader;
use crate::import_note::ImportNote;

/// Indexer layer types as transformers' `GlmMoeDsaConfig.__post_init__` derives them:
/// `indexer_types`, else `index_topk_pattern` ("F"/"S" per layer), else layer i is full iff
/// `max(i - index_skip_topk_offset + 1, 0) % index_topk_freq == 0` (defaults 1 and 2: all full).
/// All-full comes back empty, the canonical `model.ron` spelling. With none of the four keys the
/// all-full default is noted, since it decides which layers need indexer weights.
pub(crate) fn indexer_layer_types(
    r: &mut Reader,
    layers: usize,
) -> Result<Vec<IndexerLayerType>, ConfigError> {
    let json = &r.json;
    let types = if let Some(names) = json.opt_str_list("indexer_types", false)? {
        parse_list(
            json,
            "indexer_types",
            &names,
            layers,
            "\"full\" or \"shared\"",
            |s| match s {
                "full" => Some(IndexerLayerType::Full),
                "shared" => Some(IndexerLayerType::Shared),
                _ => None,
            },
        )?
    } else if let Some(marks) = json.opt_str_list("index_topk_pattern", true)? {
        let expected = "\"F\" (full) or \"S\" (shared)";
        parse_list(
            json,
            "index_topk_pattern",
            &marks,
            layers,
            expected,
            |s| match s {
                "F" | "full" => Some(IndexerLayerType::Full),
                "S" | "shared" => Some(IndexerLayerType::Shared),
                _ => None,
            },
        )?
    } else {
        periodic(r, layers)?
    };
    if types.iter().all(|&t| t == IndexerLayerType::Full) {
        return Ok(Vec::new());
    }
    Ok(types)
}

fn periodic(r: &mut Reader, layers: usize) -> Result<Vec<IndexerLayerType>, ConfigError> {
    let freq = r.json.opt_usize("index_topk_freq")?;
    let offset = r.json.opt_usize("index_skip_topk_offset")?;
    if freq.is_none() && offset.is_none() {
        r.notes.push(ImportNote::defaulted(
            "indexer_types",
            "(every layer \"full\", from index_topk_freq 1 and index_skip_topk_offset 2)",
        ));
    }
    let freq = match offset {
        Some(_) => r.or_default("index_topk_freq", freq, 1),
        None => freq.unwrap_or(1),
    };
    let offset = match freq {
        1 => offset.unwrap_or(2),
        _ => r.or_default("index_skip_topk_offset", offset, 2),
    };
    if freq == 0 {
        return Err(r.json.invalid(
            "index_topk_freq",
            "is 0; it must be at least 1 (1: every layer runs its own indexer)",
        ));
    }
    Ok((0..layers)
        .map(|i| {
            if (i + 1).saturating_sub(offset) % freq == 0 {
                IndexerLayerType::Full
            } else {
                IndexerLayerType::Shared
            }
        })
        .collect())
}

/// Number of leading dense-MLP layers from `mlp_layer_types` ("dense"... then "sparse"...),
/// checked against `first_k_dense_replace` when both are present; transformers' default 3 when
/// neither is.
pub(crate) fn dense_prefix(r: &mut Reader, layers: usize) -> Result<usize, ConfigError> {
    let declared = r.json.opt_usize("first_k_dense_replace")?;
    let Some(names) = r.json.opt_str_list("mlp_layer_types", false)? else {
        return Ok(r.or_default("first_k_dense_replace", declared, 3));
    };
    let json = &r.json;
    let dense = parse_list(
        json,
        "mlp_layer_types",
        &names,
        layers,
        "\"dense\" or \"sparse\"",
        |s| match s {
            "dense" => Some(true),
            "sparse" => Some(false),
            _ => None,
        },
    )?;
    let k = dense.iter().take_while(|&&d| d).count();
    if let Some(i) = dense[k..].iter().position(|&d| d) {
        return Err(json.invalid(
            "mlp_layer_types",
            format!(
                "layer {} is \"dense\" after a \"sparse\" layer {k}; glmc supports only dense \
                 layers first, then MoE (\"sparse\") layers to the end",
                k + i
            ),
        ));
    }
    if let Some(declared) = declared.filter(|&d| d != k) {
        return Err(json.invalid(
            "mlp_layer_types",
            format!(
                "starts with {k} \"dense\" layers but first_k_dense_replace is {declared}; make \
                 them agree"
            ),
        ));
    }
    Ok(k)
}

fn parse_list<T>(
    json: &HfJson,
    key: &str,
    names: &[String],
    layers: usize,
    expected: &str,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<Vec<T>, ConfigError> {
    if names.len() != layers {
        return Err(json.invalid(
            key,
            format!(
                "has {} entries for num_hidden_layers {layers}; give exactly one per layer",
                names.len()
            ),
        ));
    }
    names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            parse(name).ok_or_else(|| {
                json.invalid(key, format!("entry {i} is {name:?}; expected {expected}"))
            })
        })
        .collect()
}
