//! A model compiled for the GPU at hand, as `glmc run --device cuda` needs it: lowered at the
//! run's limits, rendered, compiled by nvcc (cubins cached by content hash, so a second run does
//! not call it) and described by its manifest.

use std::path::Path;

use glmc_codegen::artifact::Manifest;
use glmc_codegen::lower::LowerError;
use glmc_codegen::nvcc::{self, Compiler, NvccError};
use glmc_codegen::render::{self, RenderError};
use glmc_codegen::{lower_module, Limits, Target};
use glmc_ir::{DType, Module};
use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error(transparent)]
    Lower(#[from] LowerError),
    #[error("{model} cannot run on the GPU yet: glmc has no kernels for {ops}; use --device cpu")]
    Incomplete { model: String, ops: String },
    #[error("--device cuda compiles kernels for this GPU and found no CUDA compiler: pass --nvcc PATH, set GLMC_NVCC, or put nvcc on PATH (scripts/cuda-toolchain.sh installs the pinned nvcc 13.0)")]
    NoCompiler,
    #[error(transparent)]
    Nvcc(#[from] NvccError),
    #[error(transparent)]
    Render(#[from] RenderError),
}

/// A compiled model: its manifest and cubin, and the compiler that made it (for the kernels a
/// run compiles besides the model's, such as the random-weight generator).
pub struct Compiled<C> {
    pub manifest: Manifest<C>,
    pub cubin: Vec<u8>,
    pub compiler: Compiler,
}

/// `module` (built from `config` in `dtype`) compiled for `target` at `limits`, with the CUDA
/// compiler `nvcc` names or the one [`nvcc::find`] finds.
pub fn compile<C: Serialize>(
    module: &Module,
    config: C,
    dtype: DType,
    target: Target,
    limits: Limits,
    nvcc: Option<&Path>,
) -> Result<Compiled<C>, CompileError> {
    let lowered = lower_module(module, target, limits)?;
    let manifest = Manifest::new(module, dtype, &lowered, Vec::new(), config);
    if !manifest.complete {
        return Err(CompileError::Incomplete {
            model: module.name.clone(),
            ops: manifest.missing_ops.join(", "),
        });
    }
    let compiler = nvcc::find(nvcc)?.ok_or(CompileError::NoCompiler)?;
    let source = render::render(&lowered.kernels)?;
    let cubin = nvcc::compile(
        &compiler,
        &source,
        target,
        nvcc::default_cache_dir().as_deref(),
    )?
    .cubin;
    Ok(Compiled {
        manifest,
        cubin,
        compiler,
    })
}
