//! `glmc inspect CHECKPOINT`: what a user checks before serving a checkpoint. The config as glmc
//! reads it (transformers' defaults marked), the tensors by dtype and by kind, the attention path
//! `auto` takes and the key it follows, and every inconsistency between the checkpoint and the
//! config. Exit 0 when it can run (warnings allowed), 2 when it cannot.

use std::fmt::Write as _;

use anyhow::bail;
use glmc_models::{ImportNote, IndexerLayerType, ModelConfig};
use glmc_passes::AttentionChoice;
use glmc_runtime::{CheckReport, Checkpoint};

use crate::checkpoint::{report, sparse};
use crate::cli::{InspectArgs, PipelineArgs};
use crate::compile::{build, Built};

pub fn run(args: &InspectArgs) -> anyhow::Result<()> {
    if !args.checkpoint.is_dir() {
        bail!(
            "{}: not a directory; inspect takes an HF checkpoint directory (config.json + model.safetensors)",
            args.checkpoint.display()
        );
    }
    // The checkpoint is checked against the graph of its own dtype: weights of any float dtype
    // load into either, so the dtype changes nothing inspect reports.
    let pipeline = PipelineArgs {
        dtype: None,
        opt_level: 0,
        disable_pass: Vec::new(),
        attention: args.attention,
    };
    let built = build(
        &args.checkpoint,
        &glmc_models::builder::BuildOptions::default(),
        &pipeline,
        None,
    )?;
    let checkpoint = Checkpoint::open(&args.checkpoint)?;
    let report = report(&built, &checkpoint);
    print!("{}", render(&built, &report));
    match report.error() {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

fn render(built: &Built, report: &CheckReport) -> String {
    let mut out = String::new();
    let c = &built.config;
    writeln!(out, "checkpoint {}", report.dir.display()).unwrap();
    writeln!(out, "\nconfig as glmc reads it (* = absent from config.json, transformers' default; ! = overridden as transformers does):").unwrap();
    for (key, value) in config_lines(c) {
        let mark = match built.notes.iter().find(|n| n.key() == key) {
            Some(ImportNote::Defaulted { .. }) => "*",
            Some(ImportNote::Overridden { .. }) => "!",
            None => " ",
        };
        writeln!(out, "  {mark} {key:<26} {value}").unwrap();
    }
    for note in built.notes.iter().filter(|n| n.key() == "head_dim") {
        writeln!(out, "  ! {note}").unwrap();
    }
    writeln!(out, "\ntensors: {}", report.total).unwrap();
    for (dtype, group) in &report.by_dtype {
        writeln!(out, "  {dtype:<26} {group}").unwrap();
    }
    writeln!(out, "by kind:").unwrap();
    for (kind, group) in &report.by_kind {
        writeln!(out, "  {kind:<26} {group}").unwrap();
    }
    writeln!(out, "\nattention: {}", attention_line(built)).unwrap();
    writeln!(out, "\nchecks:").unwrap();
    for p in &report.problems {
        writeln!(out, "  error: {p}").unwrap();
    }
    if let Some(w) = report.unused_warning() {
        writeln!(out, "  warning: {}", w.replace('\n', "\n  ")).unwrap();
    }
    if let Some(n) = report.mtp_note() {
        writeln!(out, "  note: {n}").unwrap();
    }
    if report.can_run() {
        writeln!(out, "  the checkpoint fits its config: it can run").unwrap();
    }
    out
}

/// The attention path the built graph takes and the key it follows.
fn attention_line(built: &Built) -> String {
    let c = &built.config;
    let via = match built.attention {
        AttentionChoice::Auto => "auto",
        AttentionChoice::Dense => "dense (forced)",
        AttentionChoice::Sparse => "sparse (forced)",
    };
    match (&c.indexer, sparse(built)) {
        (Some(ix), true) => {
            let source = if built.notes.iter().any(|n| n.key() == "index_topk") {
                "absent from config.json: transformers' default"
            } else {
                "from config.json"
            };
            format!(
                "{via} takes sparse (DSA top-k), following index_topk = {} ({source})",
                ix.index_topk
            )
        }
        (Some(ix), false) => format!(
            "{via} takes dense, though the model has an indexer (index_topk = {}): outputs differ once a context passes it",
            ix.index_topk
        ),
        (None, _) => format!("{via} takes dense: the config has no indexer"),
    }
}

/// The config's values under their config.json keys.
fn config_lines(c: &ModelConfig) -> Vec<(&'static str, String)> {
    let mut lines = vec![
        ("dtype", c.dtype.name().to_string()),
        ("vocab_size", c.vocab_size.to_string()),
        ("hidden_size", c.hidden_size.to_string()),
        ("num_hidden_layers", c.num_hidden_layers.to_string()),
        ("num_attention_heads", c.num_attention_heads.to_string()),
        ("q_lora_rank", c.q_lora_rank.to_string()),
        ("kv_lora_rank", c.kv_lora_rank.to_string()),
        ("qk_nope_head_dim", c.qk_nope_head_dim.to_string()),
        ("qk_rope_head_dim", c.qk_rope_head_dim.to_string()),
        ("v_head_dim", c.v_head_dim.to_string()),
        ("rms_norm_eps", c.rms_norm_eps.to_string()),
        ("rope_parameters", format!("rope_theta {}", c.rope_theta)),
        (
            "max_position_embeddings",
            c.max_position_embeddings.to_string(),
        ),
        ("intermediate_size", c.intermediate_size.to_string()),
        ("first_k_dense_replace", c.first_k_dense_replace.to_string()),
    ];
    if let Some(ix) = &c.indexer {
        let full = (0..c.num_hidden_layers)
            .filter(|&i| c.indexer_layer_type(i) == Some(IndexerLayerType::Full))
            .count();
        lines.extend([
            ("index_topk", ix.index_topk.to_string()),
            ("index_n_heads", ix.index_n_heads.to_string()),
            ("index_head_dim", ix.index_head_dim.to_string()),
            (
                "indexer_types",
                format!("{full} full, {} shared", c.num_hidden_layers - full),
            ),
        ]);
    }
    let m = &c.moe;
    lines.extend([
        ("n_routed_experts", m.n_routed_experts.to_string()),
        ("n_shared_experts", m.n_shared_experts.to_string()),
        ("num_experts_per_tok", m.num_experts_per_tok.to_string()),
        ("moe_intermediate_size", m.moe_intermediate_size.to_string()),
        ("n_group", m.n_group.to_string()),
        ("topk_group", m.topk_group.to_string()),
        ("routed_scaling_factor", m.routed_scaling_factor.to_string()),
        ("norm_topk_prob", m.norm_topk_prob.to_string()),
        (
            "num_nextn_predict_layers",
            c.num_nextn_predict_layers.to_string(),
        ),
        ("tie_word_embeddings", c.tie_word_embeddings.to_string()),
    ]);
    lines
}
