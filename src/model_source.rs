//! MODEL arguments: a `model.ron`, or an HF checkpoint directory whose config.json is imported.

use std::path::Path;

use anyhow::Context;
use glmc_models::{ImportNote, Imported, ModelConfig};

use crate::cli::ImportHfArgs;

/// Loads and validates the model config MODEL names, with what the import took from
/// transformers' defaults (none for a `model.ron`, which states every value). The notes are
/// printed on stderr here, so every command that reads a config.json shows them.
pub fn load_config(model: &Path) -> anyhow::Result<Imported> {
    let imported = if model.is_dir() {
        glmc_models::import_hf(model)?
    } else if model.exists() {
        Imported {
            config: ModelConfig::load(model)?,
            notes: Vec::new(),
        }
    } else {
        anyhow::bail!(
            "{}: no such file or directory; MODEL is a model.ron file or an HF checkpoint directory with a config.json",
            model.display()
        )
    };
    print_notes(&imported.notes);
    Ok(imported)
}

pub fn print_notes(notes: &[ImportNote]) {
    for note in notes {
        eprintln!("note: {note}");
    }
}

pub fn import_hf(args: &ImportHfArgs) -> anyhow::Result<()> {
    let Imported { config, notes } = glmc_models::import_hf(&args.path)?;
    print_notes(&notes);
    crate::compile::write_atomically(&args.output, config.to_ron_string().as_bytes())
        .with_context(|| format!("writing {}", args.output.display()))?;
    eprintln!(
        "wrote {} ({} layers)",
        args.output.display(),
        config.num_hidden_layers
    );
    Ok(())
}
