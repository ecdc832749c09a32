//! Shared by the codegen tests: shipped models through the pass pipeline, lowered.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::PathBuf;

use glmc_codegen::{lower_module, Limits, Lowered, Target};
use glmc_ir::Module;
use glmc_models::builder::{BuildOptions, Sampler};
use glmc_models::ModelConfig;
use glmc_passes::{pipeline, PipelineOptions};

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("codegen/ sits in the repository")
        .to_path_buf()
}

/// A shipped config (`models/NAME`) through the default pipeline.
pub fn module(file: &str) -> (ModelConfig, Module) {
    module_with(file, |_| {})
}

/// [`module`] with the config changed first.
pub fn module_with(file: &str, change: impl FnOnce(&mut ModelConfig)) -> (ModelConfig, Module) {
    built_with(file, &BuildOptions::default(), change)
}

/// [`module_with`] built for a greedy run that returns no logits (`glmc compile --greedy`):
/// both phases end in `matmul.argmax`.
pub fn greedy_module(file: &str, change: impl FnOnce(&mut ModelConfig)) -> Module {
    let options = BuildOptions {
        sampler: Sampler::Greedy,
        ..Default::default()
    };
    built_with(file, &options, change).1
}

fn built_with(
    file: &str,
    options: &BuildOptions,
    change: impl FnOnce(&mut ModelConfig),
) -> (ModelConfig, Module) {
    let mut config = ModelConfig::load(&repo_root().join("models").join(file))
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    change(&mut config);
    let mut module =
        glmc_models::builder::build(&config, options).expect("the shipped config builds");
    pipeline(&PipelineOptions::default())
        .expect("the default pipeline")
        .run(&mut module)
        .expect("the pipeline runs");
    (config, module)
}

/// A shipped config through the default pipeline less the passes `disabled`
/// (`--disable-pass`).
pub fn module_without(file: &str, disabled: &[&str]) -> Module {
    let config = ModelConfig::load(&repo_root().join("models").join(file))
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut module = glmc_models::builder::build(&config, &Default::default())
        .expect("the shipped config builds");
    let options = PipelineOptions {
        disabled: disabled.iter().map(|p| p.to_string()).collect(),
        ..Default::default()
    };
    pipeline(&options)
        .expect("the pipeline")
        .run(&mut module)
        .expect("the pipeline runs");
    module
}

/// A shipped config through the default pipeline with dense attention (`--attention dense`):
/// the prefill keeps expanded `mla.attend`.
pub fn dense_module(file: &str) -> Module {
    let config = ModelConfig::load(&repo_root().join("models").join(file))
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut module = glmc_models::builder::build(&config, &Default::default())
        .expect("the shipped config builds");
    let options = PipelineOptions {
        attention: glmc_passes::AttentionChoice::Dense,
        ..Default::default()
    };
    pipeline(&options)
        .expect("the pipeline")
        .run(&mut module)
        .expect("the pipeline runs");
    module
}

pub const LIMITS: Limits = Limits {
    max_prefill_tokens: 256,
    max_batch: 8,
    max_context: 1024,
};

pub fn lowered(file: &str, target: Target) -> Lowered {
    let (_, m) = module(file);
    lower_module(&m, target, LIMITS).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// The shipped configs every kernel is generated for.
pub const MODELS: [&str; 3] = ["tiny-sparse.ron", "tiny-dense.ron", "glm5.ron"];
