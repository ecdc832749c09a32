//! The GPU's ceilings, measured in the run that is held against them (`glmc bench`): the copy
//! bandwidth (a device-to-device copy, every byte read once and written once) and the bf16
//! `mma.sync` rate (the instruction glmc's tensor-core kernels use, from registers). A roofline
//! from these is what this GPU, at this clock, can reach; datasheet numbers are not.

use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags};
use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{driver, CudaError, Gpu, Kernels};

/// The CUDA source of the MMA-rate kernel, compiled by the caller for the GPU's target
/// (`glmc_codegen::nvcc::compile`) and handed to [`mma_tflops`].
pub const MMA_SOURCE: &str = include_str!("mma_rate.cu");
const MMA_KERNEL: &str = "glmc_mma_rate";
/// FLOPs of one m16n8k16 MMA, and how many each warp issues a round.
const FLOPS_PER_MMA: f64 = 2.0 * 16.0 * 8.0 * 16.0;
const MMAS_PER_ROUND: f64 = 8.0;
const MMA_BLOCK: u32 = 256;
/// Blocks per SM: 8 warps each, 32 warps per SM, enough to hide the MMA latency.
const MMA_BLOCKS_PER_SM: u32 = 4;
const MMA_ROUNDS: i64 = 4096;
const REPS: usize = 10;

/// Seconds between two events around `reps` runs of `work`, per run, after one warm-up run.
fn timed(
    gpu: &Gpu,
    reps: usize,
    mut work: impl FnMut() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    work()?;
    gpu.synchronize()?;
    let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let start = gpu
        .stream
        .record_event(flags)
        .map_err(driver("recording an event"))?;
    for _ in 0..reps {
        work()?;
    }
    let end = gpu
        .stream
        .record_event(flags)
        .map_err(driver("recording an event"))?;
    end.synchronize().map_err(driver("waiting for an event"))?;
    let ms = start
        .elapsed_ms(&end)
        .map_err(driver("reading an event's time"))?;
    Ok(f64::from(ms) * 1e-3 / reps as f64)
}

/// GB/s of a device-to-device copy of `bytes` (read and written, so `2 · bytes` per copy).
pub fn copy_gbs(gpu: &Gpu, bytes: usize) -> Result<f64, CudaError> {
    let src = gpu.alloc(bytes)?;
    let mut dst = gpu.alloc(bytes)?;
    let secs = timed(gpu, REPS, || {
        gpu.stream
            .memcpy_dtod(&src, &mut dst)
            .map_err(driver(format!("copying {bytes} bytes")))
    })?;
    Ok(2.0 * bytes as f64 / secs / 1e9)
}

/// TFLOP/s of bf16 `mma.sync` m16n8k16 with f32 accumulators, with `kernels` loaded from
/// [`MMA_SOURCE`] compiled for this GPU.
pub fn mma_tflops(gpu: &Gpu, kernels: &mut Kernels) -> Result<f64, CudaError> {
    let sms = gpu
        .ctx
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(driver("reading the SM count"))?;
    let blocks = sms as u32 * MMA_BLOCKS_PER_SM;
    let sink = gpu.alloc((blocks * MMA_BLOCK) as usize * 4)?;
    let sink_address = gpu.address(&sink);
    let f = kernels.function(MMA_KERNEL, 0)?;
    let (rounds, write) = (MMA_ROUNDS, 0i32);
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (MMA_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    let secs = timed(gpu, REPS, || {
        let mut builder = gpu.stream.launch_builder(f);
        builder.arg(&sink_address).arg(&rounds).arg(&write);
        // SAFETY: the arguments follow glmc_mma_rate's parameter list; `sink` holds one f32
        // per thread and outlives the launch (the kernel never writes it: `write` is 0).
        unsafe { builder.launch(cfg) }.map_err(driver(format!("launching {MMA_KERNEL}")))?;
        Ok(())
    })?;
    let warps = f64::from(blocks * MMA_BLOCK / 32);
    let flops = warps * MMA_ROUNDS as f64 * MMAS_PER_ROUND * FLOPS_PER_MMA;
    Ok(flops / secs / 1e12)
}
