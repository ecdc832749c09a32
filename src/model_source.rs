//! MODEL arguments: a `model.ron`, or an HF checkpoint directory whose config.json is imported.

use std::path::Path;

use anyhow::Context;
use glmc_models::ModelConfig;

use crate::cli::ImportHfArgs;

/// Loads and validates the model config MODEL names.
pub fn load_config(model: &Path) -> anyhow::Result<ModelConfig> {
    if model.is_dir() {
        Ok(glmc_models::import_hf(model)?)
    } else if model.exists() {
        Ok(ModelConfig::load(model)?)
    } else {
        anyhow::bail!(
            "{}: no such file or directory; MODEL is a model.ron file or an HF checkpoint directory with a config.json",
            model.display()
        )
    }
}

pub fn import_hf(args: &ImportHfArgs) -> anyhow::Result<()> {
    let config = glmc_models::import_hf(&args.path)?;
    crate::compile::write_atomically(&args.output, config.to_ron_string().as_bytes())
        .with_context(|| format!("writing {}", args.output.display()))?;
    eprintln!(
        "wrote {} ({} layers)",
        args.output.display(),
        config.num_hidden_layers
    );
    Ok(())
}
