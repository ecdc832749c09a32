//! Random weights made on the GPU (`glmc run --device cuda --random-weights SEED`): each weight is
//! generated straight into its device buffer, one launch per piece of its recipe
//! ([`crate::random_weights::pieces`]), so no weight ever passes through host memory.

use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};
use glmc_codegen::artifact::WeightEntry;
use glmc_ir::DType;

use super::{driver, CudaError, Gpu, Kernels};
use crate::random_weights::{pieces, row_major, Piece, RandomWeights};

/// The CUDA source of the generator, compiled by the caller with the model's kernels' compiler
/// (`glmc_codegen::nvcc::compile`) and handed to [`crate::cuda::CudaExecutor::load_random`].
pub const SOURCE: &str = include_str!("random_weights.cu");
const KERNEL: &str = "glmc_random_weights";
/// The most axes a piece may have: `Geometry`'s arrays in the kernel.
const MAX_RANK: usize = 8;
const BLOCK: u32 = 256;
/// Enough blocks to fill an H200; the kernel strides over larger pieces.
const MAX_BLOCKS: u64 = 1 << 16;

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Geometry {
    rank: i64,
    start: [i64; MAX_RANK],
    len: [i64; MAX_RANK],
    out_stride: [i64; MAX_RANK],
    leaf_stride: [i64; MAX_RANK],
}

// SAFETY: a plain #[repr(C)] struct of i64s, laid out as the kernel's `Geometry`.
unsafe impl DeviceRepr for Geometry {}

/// Weight `w` generated on the device, or `None` when it must be made on the host: a dtype the
/// kernel does not write, or a recipe with no pieces or pieces of more than [`MAX_RANK`] axes.
pub fn generate(
    gpu: &Gpu,
    kernels: &mut Kernels,
    random: &RandomWeights,
    w: &WeightEntry,
) -> Result<Option<CudaSlice<u8>>, CudaError> {
    let out_bf16: i32 = match w.dtype {
        DType::F32 => 0,
        DType::BF16 => 1,
        _ => return Ok(None),
    };
    let Some(pieces) = pieces(&w.recipe).filter(|p| p.iter().all(|p| p.len.len() <= MAX_RANK))
    else {
        return Ok(None);
    };
    let numel: u64 = w.shape.iter().product();
    let buf = gpu.alloc((numel * w.dtype.size_bytes()) as usize)?;
    let out = gpu.address(&buf);
    let out_strides = row_major(&w.shape);
    let f = kernels.function(KERNEL, 0)?;
    for p in &pieces {
        let g = random.generator(&p.leaf, &p.leaf_shape);
        let stored: i32 = match g.stored {
            DType::BF16 => 1,
            DType::F16 => 2,
            _ => 0,
        };
        let geometry = geometry(p, &out_strides);
        let count = p.count() as i64;
        let blocks = p.count().div_ceil(u64::from(BLOCK)).min(MAX_BLOCKS) as u32;
        let mut builder = gpu.stream.launch_builder(f);
        builder
            .arg(&out)
            .arg(&geometry)
            .arg(&p.base)
            .arg(&count)
            .arg(&g.key)
            .arg(&g.scale.offset)
            .arg(&g.scale.amplitude)
            .arg(&stored)
            .arg(&out_bf16);
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments follow glmc_random_weights's parameter list; every element the
        // piece covers lies inside `buf`, which the caller keeps for as long as the weight.
        unsafe { builder.launch(cfg) }.map_err(driver(format!(
            "launching {KERNEL} for \"{}\" ({})",
            w.name, p.leaf
        )))?;
    }
    Ok(Some(buf))
}

fn geometry(p: &Piece, out_strides: &[u64]) -> Geometry {
    let mut g = Geometry {
        rank: p.len.len() as i64,
        ..Default::default()
    };
    let axes = p.start.iter().zip(&p.len).zip(out_strides).zip(&p.stride);
    for (k, (((&start, &len), &out), &leaf)) in axes.enumerate() {
        g.start[k] = start as i64;
        g.len[k] = len as i64;
        g.out_stride[k] = out as i64;
        g.leaf_stride[k] = leaf;
    }
    g
}

/// Fills `numel` elements of `dtype` (f32 or bf16) at device address `out` with the generator's
/// uniform on [−amplitude, amplitude) under `key`: benchmark contents for buffers that have no
/// recipe, such as KV caches stated without a prefill.
pub fn fill_uniform(
    gpu: &Gpu,
    kernels: &mut Kernels,
    out: u64,
    numel: u64,
    dtype: DType,
    key: u64,
    amplitude: f32,
) -> Result<(), CudaError> {
    let out_bf16: i32 = match dtype {
        DType::F32 => 0,
        DType::BF16 => 1,
        other => {
            return Err(CudaError::Artifact(format!(
                "random contents of {other} are not supported (f32 and bf16 are)"
            )))
        }
    };
    if numel == 0 {
        return Ok(());
    }
    let mut geometry = Geometry {
        rank: 1,
        ..Default::default()
    };
    geometry.len[0] = numel as i64;
    geometry.out_stride[0] = 1;
    geometry.leaf_stride[0] = 1;
    let (base, count, offset, stored) = (0i64, numel as i64, 0f32, 0i32);
    let f = kernels.function(KERNEL, 0)?;
    let mut builder = gpu.stream.launch_builder(f);
    builder
        .arg(&out)
        .arg(&geometry)
        .arg(&base)
        .arg(&count)
        .arg(&key)
        .arg(&offset)
        .arg(&amplitude)
        .arg(&stored)
        .arg(&out_bf16);
    let cfg = LaunchConfig {
        grid_dim: (
            numel.div_ceil(u64::from(BLOCK)).min(MAX_BLOCKS) as u32,
            1,
            1,
        ),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments follow glmc_random_weights's parameter list; the caller owns the
    // `numel` elements at `out`.
    unsafe { builder.launch(cfg) }
        .map_err(driver(format!("launching {KERNEL} to fill a buffer")))?;
    Ok(())
}
