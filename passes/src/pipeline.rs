//! The optimisation pipeline `glmc compile` runs, in order, and its options.

use crate::absorb_mla::AbsorbMla;
use crate::cse::Cse;
use crate::dce::Dce;
use crate::fuse_cache_update::FuseCacheUpdate;
use crate::fuse_elementwise::FuseElementwise;
use crate::fuse_lm_head_argmax::FuseLmHeadArgmax;
use crate::fuse_mla_projections::FuseMlaProjections;
use crate::fuse_mlp_projections::FuseMlpProjections;
use crate::lower_moe::LowerMoe;
use crate::manager::PassManager;
use crate::pass::PassError;
use crate::select_attention::{AttentionChoice, SelectAttention};

/// Every pass of the pipeline, in the order it runs.
pub const PIPELINE: [&str; 10] = [
    "fuse-mla-projections",
    "fuse-mlp-projections",
    "select-attention",
    "absorb-mla",
    "fuse-elementwise",
    "fuse-cache-update",
    "fuse-lm-head-argmax",
    "lower-moe",
    "cse",
    "dce",
];

#[derive(Clone, Debug, Default)]
pub struct PipelineOptions {
    /// `-O0`: only `select-attention`, which decides what the model computes rather than how
    /// fast, runs.
    pub no_optimization: bool,
    pub attention: AttentionChoice,
    /// `--disable-pass NAME`, each checked against the pipeline.
    pub disabled: Vec<String>,
}

pub fn pipeline(options: &PipelineOptions) -> Result<PassManager, PassError> {
    for name in &options.disabled {
        if !PIPELINE.contains(&name.as_str()) {
            return Err(PassError::Options {
                pass: "pipeline",
                message: format!(
                    "--disable-pass {name}: no such pass; the passes are {}",
                    PIPELINE.join(", ")
                ),
            });
        }
    }
    let mut pm = PassManager::new();
    pm.add(FuseMlaProjections);
    pm.add(FuseMlpProjections);
    pm.add(SelectAttention {
        choice: options.attention,
    });
    pm.add(AbsorbMla);
    pm.add(FuseElementwise);
    // After fuse-elementwise: once the latent k_pe is rotated in the projection's epilogue, its
    // cache update writes a plain slice and joins the c_kv update as its tail.
    pm.add(FuseCacheUpdate);
    // A no-op unless the build is greedy and returns no logits (`Sampler::Greedy`), which the
    // graph itself says (its `sample.argmax`, no `logits` result), so the pass needs no option.
    pm.add(FuseLmHeadArgmax);
    pm.add(LowerMoe);
    pm.add(Cse);
    pm.add(Dce);
    for name in PIPELINE {
        let semantic = name == "select-attention";
        if options.disabled.iter().any(|d| d == name) || (options.no_optimization && !semantic) {
            pm.disable(name);
        }
    }
    Ok(pm)
}
