//! `manifest.ron`: everything the runtime needs besides the weights and the cubin: the model
//! config, the target, the launch schedule of every phase, the kernels and their tiles, the
//! weights (checkpoint tensors and recipes) and the caches.

use glmc_ir::{DType, Module, Op, Recipe, Tp};
use serde::{Deserialize, Serialize};

use crate::lower::{Limits, Lowered};
use crate::nvcc::KernelUsage;
use crate::schedule::{Kernel, Phase};

/// Bumped whenever the manifest's meaning changes; the runtime refuses other versions (3: a
/// guard is a row range, `above < rows ≤ at_most`, a node may have a launch sequence, and
/// prefill takes the cache slot it fills; 4: a manifest is one tensor-parallel rank's, `tp`,
/// and its schedule may hold collectives).
pub const MANIFEST_VERSION: u32 = 4;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WeightEntry {
    /// The weight node's name, which launches refer to.
    pub name: String,
    pub recipe: Recipe,
    pub dtype: DType,
    pub shape: Vec<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StateEntry {
    pub name: String,
    pub dtype: DType,
    /// One token's row.
    pub row: Vec<u64>,
    /// Allocated as `[max_batch, max_context, row…]`.
    pub max_batch: u64,
    pub max_context: u64,
}

/// ptxas's report of one kernel.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KernelReport {
    pub name: String,
    pub registers: u32,
    pub spill_store_bytes: u32,
    pub spill_load_bytes: u32,
    pub shared_bytes: u32,
}

impl From<&KernelUsage> for KernelReport {
    fn from(k: &KernelUsage) -> KernelReport {
        KernelReport {
            name: k.name.clone(),
            registers: k.registers,
            spill_store_bytes: k.spill_store_bytes,
            spill_load_bytes: k.spill_load_bytes,
            shared_bytes: k.shared_bytes,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest<C> {
    pub version: u32,
    pub model: String,
    pub target: String,
    /// `sm_120a`, what the cubin is built for.
    pub arch: String,
    pub instructions: String,
    /// Whether the runtime launches the schedule's kernels as programmatic dependents of the
    /// kernel before them (PDL), which the kernels' `griddepcontrol.wait` makes safe. Absent
    /// (false) in manifests written before it: those launch plainly.
    #[serde(default)]
    pub programmatic_launch: bool,
    /// The activation and dense-weight dtype the graph was built for: `bf16`, or `f32` for an
    /// f32 validation artifact (FP32 FMA only, no tensor cores). Each weight entry carries its
    /// own dtype, which is what the runtime uploads, so running the artifact uses this one.
    pub dtype: DType,
    /// Which rank of a tensor-parallel group the artifact is (degree 1: the whole model).
    pub tp: Tp,
    /// False while any op has no kernel: such an artifact is never run.
    pub complete: bool,
    pub missing_ops: Vec<String>,
    /// The cubin's file name, when a CUDA compiler made one.
    pub cubin: Option<String>,
    /// The compiler that made it (`nvcc --version`'s last line).
    pub compiler: Option<String>,
    pub passes: Vec<String>,
    /// What the config import took on transformers' word (defaults, overrides), one line each.
    pub notes: Vec<String>,
    pub limits: Limits,
    pub config: C,
    pub weights: Vec<WeightEntry>,
    pub states: Vec<StateEntry>,
    pub kernels: Vec<Kernel>,
    pub ptxas: Vec<KernelReport>,
    pub phases: Vec<Phase>,
}

/// The weights every phase reads, by node name, each once.
pub fn weights(module: &Module) -> Vec<WeightEntry> {
    let mut out: Vec<WeightEntry> = Vec::new();
    for f in &module.functions {
        for n in f.canonical_order() {
            let node = f.node(n);
            if let Op::Weight { recipe } = &node.op {
                if out.iter().any(|w| w.name == node.name) {
                    continue;
                }
                let ty = &node.outputs[0];
                out.push(WeightEntry {
                    name: node.name.clone(),
                    recipe: recipe.clone(),
                    dtype: ty.dtype,
                    shape: ty.shape.iter().filter_map(|d| d.as_const()).collect(),
                });
            }
        }
    }
    out
}

pub fn states(module: &Module, limits: &Limits) -> Vec<StateEntry> {
    module
        .states
        .iter()
        .map(|(name, ty)| StateEntry {
            name: name.clone(),
            dtype: ty.dtype,
            row: ty.shape.iter().filter_map(|d| d.as_const()).collect(),
            max_batch: limits.max_batch,
            max_context: limits.max_context,
        })
        .collect()
}

impl<C: Serialize> Manifest<C> {
    /// The manifest of `module`, built for `dtype`, lowered as `lowered`.
    pub fn new(
        module: &Module,
        dtype: DType,
        lowered: &Lowered,
        passes: Vec<String>,
        config: C,
    ) -> Manifest<C> {
        let missing = lowered.missing_ops();
        Manifest {
            version: MANIFEST_VERSION,
            model: module.name.clone(),
            target: lowered.target.name().to_string(),
            arch: lowered.target.nvcc_arch().to_string(),
            instructions: lowered.target.instructions().to_string(),
            programmatic_launch: lowered.programmatic_launch,
            dtype,
            tp: module.tp,
            complete: missing.is_empty(),
            missing_ops: missing,
            cubin: None,
            compiler: None,
            passes,
            notes: Vec::new(),
            limits: lowered.limits,
            config,
            weights: weights(module),
            states: states(module, &lowered.limits),
            kernels: lowered.kernels.clone(),
            ptxas: Vec::new(),
            phases: lowered.phases.clone(),
        }
    }
}
