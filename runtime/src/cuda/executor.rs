//! The CUDA executor: runs a compiled artifact's phases on one GPU, for one sequence.
//!
//! It reads only what the artifact holds (the manifest and the cubin) and the weights: every
//! weight is made by its recipe and uploaded once (or, for random weights, generated on the GPU),
//! the caches and one arena (the larger phase's) are allocated once, and each call uploads its
//! inputs, runs the phase's launches in order and reads back its results. Before any of that the
//! bytes the manifest needs are compared with the GPU's free memory, so a model that cannot fit
//! fails in a second with the numbers, not with an allocation error after minutes of loading.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use glmc_codegen::artifact::{Manifest, WeightEntry};
use glmc_codegen::expr::Bindings;
use glmc_codegen::layout::{Buf, TensorRef};
use glmc_codegen::schedule::Phase;
use glmc_codegen::Target;

use super::{driver, launch, random_fill, CudaError, Gpu, Kernels, Memory};
use crate::against_config::human_bytes;
use crate::generate::{Call, Executor, GenerateError, PhaseKind};
use crate::interp::WeightSource;
use crate::random_weights::RandomWeights;
use crate::tensor::Tensor;

/// What an artifact allocates on the GPU, from its manifest alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceBytes {
    pub weights: u64,
    /// The KV caches and indexer states, at the manifest's batch and context.
    pub states: u64,
    /// The activation arena: the larger phase's.
    pub arena: u64,
}

impl DeviceBytes {
    pub fn of<C>(manifest: &Manifest<C>) -> DeviceBytes {
        DeviceBytes {
            weights: manifest
                .weights
                .iter()
                .map(|w| w.shape.iter().product::<u64>() * w.dtype.size_bytes())
                .sum(),
            states: manifest
                .states
                .iter()
                .map(|s| {
                    s.max_batch
                        * s.max_context
                        * s.row.iter().product::<u64>()
                        * s.dtype.size_bytes()
                })
                .sum(),
            arena: manifest
                .phases
                .iter()
                .map(|p| p.arena_bytes)
                .max()
                .unwrap_or(0),
        }
    }

    pub fn total(&self) -> u64 {
        self.weights + self.states + self.arena
    }

    /// Whether they fit in `free` bytes of GPU memory.
    pub fn check(&self, free: u64) -> Result<(), OutOfMemory> {
        if self.total() > free {
            return Err(OutOfMemory { needs: *self, free });
        }
        Ok(())
    }
}

/// A model predicted not to fit the GPU, before anything is allocated.
#[derive(Debug, thiserror::Error)]
#[error(
    "the model needs {} ({} of weights, {} of KV caches and states, {} of activations), the GPU has {} free: use --tp or a quantised weight format",
    human_bytes(.needs.total()),
    human_bytes(.needs.weights),
    human_bytes(.needs.states),
    human_bytes(.needs.arena),
    human_bytes(*.free)
)]
pub struct OutOfMemory {
    pub needs: DeviceBytes,
    pub free: u64,
}

/// Where the executor's weights come from.
enum Weights<'a> {
    /// Made on the host by their recipes (from a checkpoint) and uploaded one by one.
    Host(&'a dyn WeightSource),
    /// Generated on the GPU by the kernel of `cubin` (compiled from [`random_fill::SOURCE`]).
    Random {
        weights: &'a RandomWeights,
        cubin: &'a [u8],
    },
}

/// A loaded artifact on one GPU.
pub struct CudaExecutor {
    gpu: Gpu,
    kernels: Kernels,
    // Shared, so a call holds its schedule while it launches without copying it.
    prefill: Arc<Phase>,
    decode: Arc<Phase>,
    vocab: Option<usize>,
    max: glmc_codegen::Limits,
    memory: Memory,
    // The allocations `memory` points into: they live as long as the executor.
    _arena: CudaSlice<u8>,
    _weights: Vec<CudaSlice<u8>>,
    _states: Vec<CudaSlice<u8>>,
}

fn artifact_error(why: impl Into<String>) -> CudaError {
    CudaError::Artifact(why.into())
}

impl CudaExecutor {
    /// Loads `manifest` and `cubin` on GPU 0 with weights from `weights`.
    pub fn load<C>(
        manifest: &Manifest<C>,
        cubin: &[u8],
        weights: &dyn WeightSource,
    ) -> Result<CudaExecutor, GenerateError> {
        CudaExecutor::load_with(manifest, cubin, Weights::Host(weights))
    }

    /// Loads `manifest` and `cubin` on GPU 0 with `weights` generated on the GPU by
    /// `random_cubin`, [`random_fill::SOURCE`] compiled for it.
    pub fn load_random<C>(
        manifest: &Manifest<C>,
        cubin: &[u8],
        weights: &RandomWeights,
        random_cubin: &[u8],
    ) -> Result<CudaExecutor, GenerateError> {
        let weights = Weights::Random {
            weights,
            cubin: random_cubin,
        };
        CudaExecutor::load_with(manifest, cubin, weights)
    }

    fn load_with<C>(
        manifest: &Manifest<C>,
        cubin: &[u8],
        weights: Weights,
    ) -> Result<CudaExecutor, GenerateError> {
        if !manifest.complete {
            return Err(artifact_error(format!(
                "the artifact is incomplete (no kernels yet for {}): it cannot run",
                manifest.missing_ops.join(", ")
            ))
            .into());
        }
        let gpu = Gpu::open(0)?;
        let (major, minor) = gpu.compute_capability()?;
        let target: Target = manifest
            .target
            .parse()
            .map_err(|e| artifact_error(format!("manifest.ron: {e}")))?;
        if !target.runs_on(major, minor) {
            let fix = Target::for_gpu(major, minor)
                .map_or("a target glmc has for it".to_string(), |t| {
                    t.name().to_string()
                });
            return Err(artifact_error(format!(
                "the artifact is {}, this GPU is sm_{major}{minor}: recompile with --target {fix}",
                manifest.arch
            ))
            .into());
        }
        let phase = |name: &str| {
            manifest
                .phases
                .iter()
                .find(|p| p.function == name)
                .map(|p| Arc::new(p.clone()))
                .ok_or_else(|| artifact_error(format!("the manifest has no `{name}` phase")))
        };
        let (prefill, decode) = (phase("prefill")?, phase("decode")?);
        let (free, _total) = gpu
            .ctx
            .mem_get_info()
            .map_err(driver("reading the free GPU memory"))?;
        DeviceBytes::of(manifest).check(free as u64)?;
        let kernels = gpu.load(cubin)?;
        let arena = gpu.alloc(prefill.arena_bytes.max(decode.arena_bytes) as usize)?;
        let mut memory = Memory {
            arena: gpu.address(&arena),
            ..Default::default()
        };
        let mut held = Vec::with_capacity(manifest.weights.len());
        let mut generator = match &weights {
            Weights::Random { cubin, .. } => Some(gpu.load(cubin)?),
            Weights::Host(_) => None,
        };
        // Each weight is uploaded in the dtype the artifact was compiled for, whatever the
        // checkpoint stores: an f32 validation artifact gets f32 weights from a bf16 checkpoint.
        for w in &manifest.weights {
            let on_device = match (&weights, generator.as_mut()) {
                (Weights::Random { weights, .. }, Some(kernels)) => {
                    random_fill::generate(&gpu, kernels, weights, w)?
                }
                _ => None,
            };
            let buf = match on_device {
                Some(buf) => buf,
                None => upload(&gpu, &weights, w)?,
            };
            memory.weights.insert(w.name.clone(), gpu.address(&buf));
            held.push(buf);
        }
        let mut states = Vec::with_capacity(manifest.states.len());
        for s in &manifest.states {
            let row: u64 = s.row.iter().product();
            let buf =
                gpu.alloc((s.max_batch * s.max_context * row * s.dtype.size_bytes()) as usize)?;
            memory.states.insert(s.name.clone(), gpu.address(&buf));
            states.push(buf);
        }
        let vocab = prefill
            .results
            .iter()
            .find(|(n, _)| n == "logits")
            .and_then(|(_, r)| r.shape.last())
            .and_then(|d| d.as_const())
            .map(|v| v as usize);
        Ok(CudaExecutor {
            gpu,
            kernels,
            prefill,
            decode,
            vocab,
            max: manifest.limits,
            memory,
            _arena: arena,
            _weights: held,
            _states: states,
        })
    }

    fn phase(&self, kind: PhaseKind) -> &Arc<Phase> {
        match kind {
            PhaseKind::Prefill => &self.prefill,
            PhaseKind::Decode => &self.decode,
        }
    }

    /// The sizes of this call, checked against what the artifact was planned for.
    fn bindings(&self, kind: PhaseKind, inputs: &[Tensor]) -> Result<Bindings, CudaError> {
        let rows = inputs.first().map(Tensor::numel).unwrap_or(0) as u64;
        let positions = inputs
            .get(1)
            .and_then(|t| t.as_i64().ok())
            .ok_or_else(|| artifact_error("the second input must be the positions"))?;
        let context = positions.iter().max().map_or(0, |&p| p as u64 + 1);
        if context > self.max.max_context {
            return Err(artifact_error(format!(
                "position {} is past the {} tokens of context the artifact was compiled for: recompile with a larger --max-context",
                context - 1,
                self.max.max_context
            )));
        }
        Ok(match kind {
            PhaseKind::Prefill => {
                if rows > self.max.max_prefill_tokens {
                    return Err(artifact_error(format!(
                        "a prefill of {rows} tokens is more than the {} the artifact was compiled for: recompile with a larger --max-prefill-tokens",
                        self.max.max_prefill_tokens
                    )));
                }
                Bindings::from([("s".to_string(), rows), ("t".to_string(), context)])
            }
            PhaseKind::Decode => {
                if rows > self.max.max_batch {
                    return Err(artifact_error(format!(
                        "a decode batch of {rows} is more than the {} the artifact was compiled for",
                        self.max.max_batch
                    )));
                }
                Bindings::from([("b".to_string(), rows), ("t".to_string(), context)])
            }
        })
    }

    /// Reads a result back: the byte range its elements span, then the elements.
    fn read(&self, at: &TensorRef, bindings: &Bindings) -> Result<Tensor, CudaError> {
        let offsets = at
            .element_offsets(bindings)
            .ok_or_else(|| artifact_error(format!("result {at} is not bound by {bindings:?}")))?;
        let dims = at.dims(bindings).unwrap_or_default();
        let (lo, hi) = offsets.iter().fold((u64::MAX, 0), |(lo, hi), &o| {
            (lo.min(o), hi.max(o + at.dtype.size_bytes()))
        });
        if offsets.is_empty() {
            return Tensor::from_device_bytes(dims, at.dtype, &[], &[])
                .map_err(|e| artifact_error(e.to_string()));
        }
        let base = self
            .memory
            .base(&at.buf)
            .ok_or_else(|| artifact_error(format!("no memory for {}", at.buf)))?;
        let bytes = self.gpu.read_bytes(base + lo, (hi - lo) as usize)?;
        let local: Vec<u64> = offsets.iter().map(|o| o - lo).collect();
        Tensor::from_device_bytes(dims, at.dtype, &bytes, &local)
            .map_err(|e| artifact_error(e.to_string()))
    }
}

/// Weight `w` made on the host and uploaded.
fn upload(gpu: &Gpu, weights: &Weights, w: &WeightEntry) -> Result<CudaSlice<u8>, GenerateError> {
    let t = match weights {
        Weights::Host(source) => source.weight(&w.name, &w.recipe, w.dtype)?,
        Weights::Random { weights, .. } => weights.weight(&w.name, &w.recipe, w.dtype)?,
    };
    let bytes = t
        .to_bytes(w.dtype)
        .map_err(|e| artifact_error(format!("weight \"{}\" as {}: {e}", w.name, w.dtype)))?;
    Ok(gpu.upload(&bytes)?)
}

impl Executor for CudaExecutor {
    fn result_names(&self, phase: PhaseKind) -> Vec<String> {
        self.phase(phase)
            .results
            .iter()
            .map(|(n, _)| n.clone())
            .collect()
    }

    fn vocab(&self) -> Option<usize> {
        self.vocab
    }

    fn run(
        &mut self,
        kind: PhaseKind,
        inputs: &[Tensor],
        _call: Call,
        _trace: &mut dyn FnMut(Call, &glmc_ir::Node, &[&Tensor]),
    ) -> Result<Vec<Tensor>, GenerateError> {
        let bindings = self.bindings(kind, inputs)?;
        let phase = Arc::clone(self.phase(kind));
        if phase.inputs.len() != inputs.len() {
            return Err(artifact_error(format!(
                "@{} takes {} inputs, {} given",
                phase.function,
                phase.inputs.len(),
                inputs.len()
            ))
            .into());
        }
        let mut uploads = Vec::with_capacity(inputs.len());
        for ((name, at), t) in phase.inputs.iter().zip(inputs) {
            let Buf::Input(index) = at.buf else {
                return Err(artifact_error(format!("input {name} is not an argument")).into());
            };
            let bytes = t
                .to_bytes(at.dtype)
                .map_err(|e| artifact_error(format!("input {name}: {e}")))?;
            let buf = self.gpu.upload(&bytes)?;
            self.memory.inputs.insert(index, self.gpu.address(&buf));
            uploads.push(buf);
        }
        for l in phase.launches() {
            launch(&self.gpu, &mut self.kernels, l, &self.memory, &bindings)?;
        }
        self.gpu.synchronize()?;
        let results = phase
            .results
            .iter()
            .map(|(_, at)| self.read(at, &bindings))
            .collect::<Result<Vec<_>, _>>()?;
        drop(uploads);
        Ok(results)
    }
}
