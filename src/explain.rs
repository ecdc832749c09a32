//! `glmc compile --explain`: which attention each phase and layer runs, and why, read off the
//! compiled graph itself rather than from the options, so it cannot disagree with the code.

use std::fmt::Write;

use glmc_ir::{DType, Function, Module, Op};
use glmc_passes::AttentionChoice;

use crate::compile::Built;

pub fn explain(built: &Built) -> String {
    let mut out = String::new();
    let config = &built.config;
    let topk = config.indexer.as_ref().map(|ix| ix.index_topk);
    let reason = match (built.attention, topk) {
        (AttentionChoice::Auto, Some(k)) => format!("attention=auto and the model has a DSA indexer (index_topk={k}): sparse, as it was trained"),
        (AttentionChoice::Auto, None) => "attention=auto and the model has no indexer: dense".to_string(),
        (AttentionChoice::Sparse, Some(k)) => format!("attention=sparse (index_topk={k})"),
        (AttentionChoice::Sparse, None) => "attention=sparse, but the model has no indexer".to_string(),
        (AttentionChoice::Dense, Some(k)) => format!(
            "attention=dense overrides a model trained with sparse attention: identical while a query's context is <= {k} tokens, different beyond"
        ),
        (AttentionChoice::Dense, None) => "attention=dense and the model has no indexer".to_string(),
    };
    writeln!(out, "{}: {reason}", built.module.name).unwrap();
    let source = if built.dtype_from_flag {
        format!("--dtype {}", config.dtype)
    } else {
        "the model's dtype".to_string()
    };
    let what = match config.dtype {
        DType::F32 => "the f32 validation mode, every kernel in FP32 FMA (no tensor cores or TF32)",
        DType::BF16 => "activations and dense weights in bf16, prefill matmuls on the tensor cores; the router and the logits in f32",
        _ => "activations and dense weights in this dtype; the router and the logits in f32",
    };
    writeln!(
        out,
        "{}: dtype {} ({source}): {what}",
        built.module.name, config.dtype
    )
    .unwrap();
    for note in &built.notes {
        writeln!(out, "config.json: {note}").unwrap();
    }
    let absorb_ran = built.records.iter().any(|r| r.name == "absorb-mla");
    for f in &built.module.functions {
        for (first, last, what) in runs(&built.module, f, absorb_ran) {
            let layers = if first == last {
                format!("layer {first}")
            } else {
                format!("layers {first}-{last}")
            };
            writeln!(out, "{}, {layers}: {what}", f.name).unwrap();
        }
    }
    out
}

/// Consecutive layers with the same description: (first layer, last layer, description).
fn runs(module: &Module, f: &Function, absorb_ran: bool) -> Vec<(u64, u64, String)> {
    let mut runs: Vec<(u64, u64, String)> = Vec::new();
    for n in f.canonical_order() {
        let node = f.node(n);
        let (absorbed, sparse, dense_until) = match node.op {
            Op::MlaAttend {
                sparse,
                dense_until,
                ..
            } => (false, sparse, dense_until),
            Op::MlaAttendAbsorbed {
                sparse,
                dense_until,
                ..
            } => (true, sparse, dense_until),
            _ => continue,
        };
        let Some(layer) = layer_of(&node.name) else {
            continue;
        };
        let mut what = String::new();
        if sparse {
            let operands = f.operands(n);
            let topk = operands
                .last()
                .expect("sparse attention has a top-k operand");
            let k = f.value_type(*topk).shape[1].clone();
            let source = layer_of(&f.node(topk.node).name);
            write!(what, "sparse (top-{k}").unwrap();
            match source {
                Some(l) if l != layer => write!(what, ", indexer shared from layer {l}").unwrap(),
                _ => what.push_str(", own indexer"),
            }
            if dense_until > 0 {
                write!(
                    what,
                    "; exactly dense while the context is <= {dense_until}"
                )
                .unwrap();
            }
            what.push(')');
        } else {
            what.push_str("dense causal");
        }
        let (mut latent, mut index_keys) = (0, 0);
        for (name, row) in module
            .states
            .iter()
            .filter(|(name, _)| layer_of(name) == Some(layer))
        {
            let values = row.const_numel().unwrap_or(0);
            if name.contains(".indexer.") {
                index_keys += values;
            } else {
                latent += values;
            }
        }
        what.push_str(match (absorbed, f.name.as_str(), sparse) {
            (true, "decode", _) => "; absorbed MLA (decode: one query per sequence reads the latent cache directly)",
            (true, _, true) => "; absorbed MLA (sparse: each query reads at most top-k latent entries)",
            (true, _, false) => "; absorbed MLA",
            (false, _, _) if !absorb_ran => "; expanded MLA (absorb-mla did not run)",
            (false, _, _) => "; expanded MLA (dense prefill: per-head K/V from kv_b_proj, cheaper for long prompts)",
        });
        write!(what, "; cache {latent} values/token").unwrap();
        if index_keys > 0 {
            write!(what, " + indexer keys {index_keys}").unwrap();
        }
        match runs.last_mut() {
            Some((_, last, prev)) if *prev == what && *last + 1 == layer => *last = layer,
            _ => runs.push((layer, layer, what)),
        }
    }
    runs
}

fn layer_of(name: &str) -> Option<u64> {
    name.strip_prefix("model.layers.")?
        .split('.')
        .next()?
        .parse()
        .ok()
}
