//! `glmc compile --explain`: which attention each phase and layer runs, and why, read off the
//! compiled graph itself rather than from the options, so it cannot disagree with the code.

use std::fmt::Write;

use glmc_ir::{Function, Module, Op};
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
    for f in &built.module.functions {
        for (first, last, what) in runs(&built.module, f) {
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
fn runs(module: &Module, f: &Function) -> Vec<(u64, u64, String)> {
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
        let cache: u64 = module
            .states
            .iter()
            .filter(|(name, _)| layer_of(name) == Some(layer))
            .filter_map(|(_, row)| row.const_numel())
            .sum();
        if absorbed {
            write!(what, ", absorbed MLA over the latent cache").unwrap();
        } else {
            write!(what, ", expanded MLA (per-head K/V from kv_b_proj)").unwrap();
        }
        write!(what, "; kv cache {cache} values/token/layer").unwrap();
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
