//! The checkpoint checked against the config wherever both are at hand (`run`, `compile` on a
//! checkpoint directory, `inspect`), from the safetensors headers only.

use std::path::Path;

use glmc_passes::AttentionChoice;
use glmc_runtime::{check_against_config, graph_tensors, CheckReport, Checkpoint, WeightError};

use crate::compile::Built;

/// Whether the built graph runs the indexer.
pub fn sparse(built: &Built) -> bool {
    match built.attention {
        AttentionChoice::Auto => built.config.indexer.is_some(),
        AttentionChoice::Dense => false,
        AttentionChoice::Sparse => true,
    }
}

/// Compares the checkpoint with what the built graph reads.
pub fn report(built: &Built, checkpoint: &Checkpoint) -> CheckReport {
    check_against_config(
        &built.config,
        sparse(built),
        &graph_tensors(&built.module),
        checkpoint,
    )
}

/// [`report`], with its warning and note on stderr; an error when the checkpoint cannot run.
pub fn check(built: &Built, checkpoint: &Checkpoint) -> anyhow::Result<CheckReport> {
    let report = report(built, checkpoint);
    if let Some(error) = report.error() {
        return Err(error.into());
    }
    if let Some(warning) = report.unused_warning() {
        eprintln!("warning: {warning}");
    }
    if let Some(note) = report.mtp_note() {
        eprintln!("note: {note}");
    }
    Ok(report)
}

/// [`check`] when `dir` holds weights; a directory with only a config.json has nothing to check.
pub fn check_if_present(built: &Built, dir: &Path) -> anyhow::Result<()> {
    match Checkpoint::open(dir) {
        Ok(checkpoint) => check(built, &checkpoint).map(drop),
        Err(WeightError::NoWeights { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
