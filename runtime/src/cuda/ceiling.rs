//! The GPU's ceilings, measured in the run that is held against them (`glmc bench`): the copy
//! bandwidth (a device-to-device copy, every byte read once and written once) and the bf16
//! `mma.sync` rate (the instruction glmc's tensor-core kernels use, from registers). A roofline
//! from these is what this GPU, at this clock, can reach; datasheet numbers are not.
//!
//! And the read ceilings of the GPU tests: the time of a kernel that only reads the bytes a
//! decode GEMM's weight holds ([`read_ceiling`]) or the absorbed attention gathers
//! ([`gather_ceiling`]), launched as glmc launches its kernels and timed as the tests time them.
//! A kernel launch costs microseconds that no bandwidth figure counts, so for short kernels
//! this, not the bytes at the copy bandwidth, is the best any kernel can do.

use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;

use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags};
use cudarc::driver::{CudaGraph, CudaStream, LaunchConfig, PushKernelArg};

use super::{driver, graphs, launch_raw, CudaError, Gpu, Kernels, LaunchMode};

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
    let blocks = sm_count(gpu)? * MMA_BLOCKS_PER_SM;
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

fn sm_count(gpu: &Gpu) -> Result<u32, CudaError> {
    let sms = gpu
        .ctx
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(driver("reading the SM count"))?;
    Ok(sms.max(1) as u32)
}

/// The CUDA source of the read probes: read_rate.cu after the generated kernels' helpers
/// (`glmc_codegen::render::COMMON`), whose loads and dependency wait the probes use. Compiled
/// by the caller for the GPU's target (`glmc_codegen::nvcc::compile`), loaded with
/// [`Gpu::load`] (any [`LaunchMode`]: the probes always launch programmatically) and handed to
/// [`read_ceiling`] and [`gather_ceiling`].
pub fn read_source() -> String {
    format!(
        "{}\n{}",
        glmc_codegen::render::COMMON,
        include_str!("read_rate.cu")
    )
}

/// Bytes of operands a timed kernel rotates through, so that they come from DRAM: twice the
/// 60 MB L2 issue 14 names. The GPU harness (runtime/tests/gpu_kernels.rs) times glmc's kernels
/// by the same rule, [`rotation_copies`].
pub const ROTATION_BYTES: usize = 120 << 20;
/// At most this many copies: operands under 2 MB stay partly in L2, for glmc's kernels and the
/// probe alike.
pub const MAX_ROTATION_COPIES: usize = 64;

/// How many copies of `bytes` of operands a timed run rotates through.
pub fn rotation_copies(bytes: usize) -> usize {
    ROTATION_BYTES
        .div_ceil(bytes.max(1))
        .clamp(1, MAX_ROTATION_COPIES)
}

/// A probe's graph runs about this long, so that the events' resolution and the replay's start
/// are lost in it.
const GRAPH_SECS: f64 = 2e-3;
/// More than any GPU glmc targets reads a second (an H200 4.8 TB/s), and less than any launch
/// takes, so that [`graph_launches`] launches take at least about [`GRAPH_SECS`].
const FASTEST_READ_BYTES_PER_SEC: f64 = 5e12;
const SHORTEST_LAUNCH_SECS: f64 = 2e-6;

/// Launches of a probe's graph reading `bytes` each, cycling through `copies`: a whole number
/// of cycles, so that every copy is read as often.
fn graph_launches(bytes: usize, copies: usize) -> usize {
    let launch = (bytes as f64 / FASTEST_READ_BYTES_PER_SEC).max(SHORTEST_LAUNCH_SECS);
    let launches = (GRAPH_SECS / launch).ceil() as usize;
    launches.div_ceil(copies) * copies
}

const READ_BLOCK: u32 = 256;
/// The stream probe's 16-byte loads in flight a thread, and the gather probe's top-k entries
/// (nine such loads each). With [`BLOCKS_PER_SM`], as far as the registers let blocks fit
/// (ptxas 13.0 on sm_90a: 32, 48 and 80 registers for the stream, 56 and 89 for the gather),
/// that is 16 to 128 KiB in flight an SM for the stream and 36 to 144 KiB for the gather; an
/// H200 needs about 4.8 TB/s × ~1 µs of loaded latency / 132 SMs ≈ 36 KiB. Deeper, fewer blocks
/// fit: the same bytes in flight, fewer warps to issue them.
const STREAM_DEPTHS: [u32; 3] = [4, 8, 16];
const GATHER_DEPTHS: [u32; 2] = [1, 2];
/// Blocks an SM, as many as fit (8 × 256 threads is an SM's most on sm_90; a configuration
/// whose blocks do not all fit at once is skipped: its second wave is never the fastest).
const BLOCKS_PER_SM: [u32; 4] = [1, 2, 4, 8];
/// The read probes' kernels: the stream's, then the gather's, by depth.
pub fn read_kernels() -> impl Iterator<Item = String> {
    let stream = STREAM_DEPTHS.map(|d| read_kernel("stream", d));
    let gather = GATHER_DEPTHS.map(|d| read_kernel("gather", d));
    stream.into_iter().chain(gather)
}

fn read_kernel(family: &str, depth: u32) -> String {
    format!("glmc_read_{family}_{depth}")
}

/// What a thread's XOR of its reads is compared with: the stream probe reads zeros, and a
/// 32-bit fold of the gather's bytes matches it once in 2^32 threads (a harmless store).
const NEVER: u64 = 0x9e37_79b9;

/// A read probe's configuration: its kernel's DEPTH (16-byte loads in flight a thread in the
/// stream probe, top-k entries in the gather probe) and blocks an SM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadConfig {
    pub depth: u32,
    pub blocks_per_sm: u32,
}

impl fmt::Display for ReadConfig {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "depth {}, {} blocks/SM", self.depth, self.blocks_per_sm)
    }
}

/// A read probe's fastest configuration and its seconds a launch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReadCeiling {
    pub secs: f64,
    pub config: ReadConfig,
}

/// The fastest a kernel can read `bytes` (a positive multiple of 16) under issue 14's decode
/// GEMM protocol, as the GPU harness times glmc's kernels: contiguous buffers of `bytes`
/// rotated through [`rotation_copies`] copies (from DRAM), launched back to back in one CUDA
/// graph as programmatic dependents, each launch issuing its first loads before it waits for
/// the one before (as the skinny GEMM means to with its weights: read_rate.cu says why its
/// loads there are coherent ones). The best of [`STREAM_DEPTHS`] × [`BLOCKS_PER_SM`];
/// `kernels` are [`read_source`]'s.
pub fn read_ceiling(
    gpu: &Gpu,
    kernels: &mut Kernels,
    bytes: usize,
) -> Result<ReadCeiling, CudaError> {
    if bytes == 0 || !bytes.is_multiple_of(16) {
        return Err(CudaError::Artifact(format!(
            "the read probe reads 16-byte vectors: {bytes} bytes is no positive multiple of 16"
        )));
    }
    let copies = rotation_copies(bytes);
    // Zeros: DRAM costs the same whatever the bytes (plain allocations are not compressed).
    let buffers = (0..copies)
        .map(|_| gpu.alloc(bytes))
        .collect::<Result<Vec<_>, _>>()?;
    let addresses: Vec<u64> = buffers.iter().map(|b| gpu.address(b)).collect();
    let vecs = (bytes / 16) as u64;
    let launches = graph_launches(bytes, copies);
    fastest(gpu, kernels, "stream", &STREAM_DEPTHS, launches, &|r| {
        vec![addresses[r % copies], vecs]
    })
}

/// The absorbed attention's reads, for [`gather_ceiling`]; addresses are device addresses,
/// strides bytes. Query row `row` < `rows` has `keys` top-k entries, the i64s at
/// `topk + 8·(row·topk_row + e)`. An entry `j` ≥ 0 names a cache row, of which the attention
/// reads 1024 bytes (512 bf16 latent values) at `k1 + row·k1_seq_bytes + j·k1_key_bytes` and
/// 128 (64 bf16 rope values) at `k2 + row·k2_seq_bytes + j·k2_key_bytes`; `j` < 0 names none.
/// Cache rows are below 2^31, `k1`, `k2` and their strides multiples of 16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gather {
    pub rows: u64,
    pub keys: u64,
    pub topk: u64,
    pub topk_row: u64,
    pub k1: u64,
    pub k1_seq_bytes: u64,
    pub k1_key_bytes: u64,
    pub k2: u64,
    pub k2_seq_bytes: u64,
    pub k2_key_bytes: u64,
}

impl Gather {
    /// Bytes an entry that names a cache row reads.
    pub const ENTRY_BYTES: u64 = 1024 + 128;

    /// Its entries (rows × keys), where the probe can read them: below 2^31, with 16-byte
    /// aligned caches, and enough that, all naming rows, they span [`ROTATION_BYTES`] (the probe
    /// reads the same keys launch after launch: fewer would stay in L2).
    fn entries(&self) -> Result<u64, CudaError> {
        let entries = self.rows * self.keys;
        let aligned = [self.k1, self.k1_seq_bytes, self.k1_key_bytes]
            .into_iter()
            .chain([self.k2, self.k2_seq_bytes, self.k2_key_bytes])
            .all(|x| x.is_multiple_of(16))
            && self.topk.is_multiple_of(8);
        if entries == 0 || entries >= 1 << 31 || !aligned {
            return Err(CudaError::Artifact(format!(
                "the gather probe takes 1 to 2^31 entries and 16-byte aligned caches: {self:?}"
            )));
        }
        if entries * Self::ENTRY_BYTES < ROTATION_BYTES as u64 {
            return Err(CudaError::Artifact(format!(
                "the gather probe's {entries} entries read at most {} bytes, under the \
                 {ROTATION_BYTES} that keep them from staying in L2: gather more rows",
                entries * Self::ENTRY_BYTES
            )));
        }
        Ok(entries)
    }

    fn args(&self) -> Vec<u64> {
        vec![
            self.topk,
            self.topk_row,
            self.rows,
            self.keys,
            self.k1,
            self.k1_seq_bytes,
            self.k1_key_bytes,
            self.k2,
            self.k2_seq_bytes,
            self.k2_key_bytes,
        ]
    }
}

/// The fastest a kernel can read what the absorbed attention reads of its caches (`gather`),
/// timed as [`read_ceiling`] times the stream but with nothing rotated and nothing read before
/// the dependency wait (the top-k list is written by the kernel before). Every launch reads the
/// same keys, so they come from DRAM only if they span twice the L2: the caller sees to that
/// (its entries ≥ 0 times [`Gather::ENTRY_BYTES`], the bytes it counts, at least
/// [`ROTATION_BYTES`]); fewer entries than that are refused. The best of [`GATHER_DEPTHS`] ×
/// [`BLOCKS_PER_SM`]; `kernels` are [`read_source`]'s.
pub fn gather_ceiling(
    gpu: &Gpu,
    kernels: &mut Kernels,
    gather: &Gather,
) -> Result<ReadCeiling, CudaError> {
    let entries = gather.entries()?;
    let launches = graph_launches((entries * Gather::ENTRY_BYTES) as usize, 1);
    let args = gather.args();
    fastest(gpu, kernels, "gather", &GATHER_DEPTHS, launches, &|_| {
        args.clone()
    })
}

/// The fastest configuration of probe `family` (kernels `glmc_read_{family}_{depth}`), each
/// captured in a CUDA graph of `launches` launches, the `r`-th with `args(r)` and then the
/// sink and [`NEVER`], replayed once to warm and once between events.
fn fastest(
    gpu: &Gpu,
    kernels: &mut Kernels,
    family: &str,
    depths: &[u32],
    launches: usize,
    args: &dyn Fn(usize) -> Vec<u64>,
) -> Result<ReadCeiling, CudaError> {
    let sms = sm_count(gpu)?;
    let most_blocks = sms * BLOCKS_PER_SM[BLOCKS_PER_SM.len() - 1];
    let sink = gpu.alloc((most_blocks * READ_BLOCK) as usize * 4)?;
    let tail = [gpu.address(&sink), NEVER];
    let stream = gpu
        .ctx
        .new_stream()
        .map_err(driver("creating the stream a read probe is captured on"))?;
    // The operands were written on the GPU's stream, which the probe's does not wait for.
    gpu.synchronize()?;
    let mut best: Option<ReadCeiling> = None;
    for &depth in depths {
        let name = read_kernel(family, depth);
        let f = kernels.function(&name, 0)?.clone();
        let fit = f
            .occupancy_max_active_blocks_per_multiprocessor(READ_BLOCK, 0, None)
            .map_err(driver(format!(
                "asking how many blocks of {name} an SM holds"
            )))?;
        for blocks_per_sm in BLOCKS_PER_SM.into_iter().filter(|&b| b <= fit) {
            let grid = sms * blocks_per_sm;
            let graph = graphs::capture(&stream, &format!("{name} on {grid} blocks"), |s| {
                for r in 0..launches {
                    let mut values = args(r);
                    values.extend(tail);
                    let mut params: Vec<*mut c_void> = values
                        .iter_mut()
                        .map(|v| v as *mut u64 as *mut c_void)
                        .collect();
                    let shape = (grid, READ_BLOCK, 0);
                    // SAFETY: every parameter of the read kernels is 8 bytes, `values` holds
                    // them in order and outlives the call (which copies them), and the memory
                    // they name outlives the graph.
                    unsafe { launch_raw(s, &f, shape, LaunchMode::Programmatic, &mut params) }
                        .map_err(driver(format!("launching {name}")))?;
                }
                Ok(())
            })?;
            let secs = replay_secs(&stream, &graph)? / launches as f64;
            if best.is_none_or(|b| secs < b.secs) {
                let config = ReadConfig {
                    depth,
                    blocks_per_sm,
                };
                best = Some(ReadCeiling { secs, config });
            }
        }
    }
    best.ok_or_else(|| {
        CudaError::Artifact(format!(
            "no glmc_read_{family} kernel fits 256 threads on an SM"
        ))
    })
}

/// Seconds of one replay of `graph` on `stream`, after one that warms it (the first replay
/// uploads the graph).
fn replay_secs(stream: &Arc<CudaStream>, graph: &CudaGraph) -> Result<f64, CudaError> {
    let replay = || {
        graph
            .launch()
            .map_err(driver("replaying a read probe's graph"))
    };
    let event = || {
        stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver("recording an event"))
    };
    replay()?;
    let start = event()?;
    replay()?;
    let end = event()?;
    end.synchronize().map_err(driver("waiting for an event"))?;
    let ms = start
        .elapsed_ms(&end)
        .map_err(driver("reading an event's time"))?;
    Ok(f64::from(ms) * 1e-3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    // read_rate.cu's index arithmetic, mirrored: which items a block and thread read, and which
    // bytes a gather lane reads of an entry.

    /// The split of `items` among `blocks` blocks in read_rate.cu (`span_begin`): block `block`
    /// takes `[items·block/blocks, items·(block+1)/blocks)`.
    fn block_span(items: u64, block: u64, blocks: u64) -> std::ops::Range<u64> {
        let at = |b: u64| (u128::from(items) * u128::from(b) / u128::from(blocks)) as u64;
        at(block)..at(block + 1)
    }

    /// The items a thread of a block reads in read_rate.cu: from its span's `first`-th on, every
    /// `stride`-th (the thread in the stream, its group of eight lanes in the gather).
    fn thread_items(
        span: std::ops::Range<u64>,
        first: u64,
        stride: u64,
    ) -> impl Iterator<Item = u64> {
        (span.start + first..span.end).step_by(stride as usize)
    }

    const LANES: u64 = 8;
    const PARTS: usize = 9;

    /// The addresses lane `lane` (of [`LANES`]) reads for entry `e` of the flattened rows
    /// × keys when it names cache row `j` ≥ 0, as read_rate.cu's `read_entry`.
    fn lane_reads(g: &Gather, e: u64, j: u64, lane: u64) -> [u64; PARTS] {
        let row = e / g.keys;
        let k1 = g.k1 + row * g.k1_seq_bytes + j * g.k1_key_bytes + lane * 16;
        let k2 = g.k2 + row * g.k2_seq_bytes + j * g.k2_key_bytes + lane * 16;
        std::array::from_fn(|m| {
            if m + 1 < PARTS {
                k1 + m as u64 * LANES * 16
            } else {
                k2
            }
        })
    }

    #[test]
    fn operands_rotate_through_twice_the_l2_in_at_most_64_copies() {
        let mib = 1usize << 20;
        assert_eq!(rotation_copies(16 * mib), 8);
        assert_eq!(rotation_copies(12 * mib), 10);
        assert_eq!(rotation_copies(50 * mib), 3);
        // One copy of 120 MiB or more spans twice the L2 by itself.
        assert_eq!(rotation_copies(120 * mib), 1);
        assert_eq!(rotation_copies(192 * mib), 1);
        assert_eq!(rotation_copies(mib), 64);
        assert_eq!(rotation_copies(16), 64);
        for bytes in [16, 4096, mib, 3 * mib + 16, 16 * mib, 119 * mib, 2 << 30] {
            let copies = rotation_copies(bytes);
            assert!(copies * bytes >= ROTATION_BYTES || copies == MAX_ROTATION_COPIES);
            assert!(
                (copies - 1) * bytes < ROTATION_BYTES,
                "{bytes}: one copy too many"
            );
        }
    }

    #[test]
    fn a_probe_graph_is_whole_cycles_of_at_least_the_graph_time() {
        for bytes in [16, 1 << 20, 12 << 20, 16 << 20, 192 << 20, 1_903_165_440] {
            let copies = rotation_copies(bytes);
            let launches = graph_launches(bytes, copies);
            assert_eq!(launches % copies, 0, "{bytes}");
            let fastest = (bytes as f64 / FASTEST_READ_BYTES_PER_SEC).max(SHORTEST_LAUNCH_SECS);
            assert!(launches as f64 * fastest >= GRAPH_SECS, "{bytes}");
            // Not needlessly long: within one cycle of the time.
            assert!(
                ((launches - copies) as f64) * fastest < GRAPH_SECS,
                "{bytes}"
            );
        }
        assert_eq!(graph_launches(16, 64), 1024);
        assert_eq!(graph_launches(1_903_165_440, 1), 6);
    }

    #[test]
    fn blocks_and_threads_read_every_item_once() {
        // The stream (256 threads, one vector each a step) and the gather (32 groups of eight
        // lanes, one entry each a step), on item counts below, at and past one a thread.
        for (block, group) in [(256, 1), (256, 8)] {
            let stride = block / group;
            for items in [1u64, 31, 255, 4096, 132 * 256 + 5, 1_000_003] {
                for blocks in [1u64, 132, 264, 1056] {
                    let mut seen = vec![0u8; items as usize];
                    let mut last_end = 0;
                    for b in 0..blocks {
                        let span = block_span(items, b, blocks);
                        assert_eq!(span.start, last_end);
                        assert!(span.end - span.start <= items / blocks + 1);
                        last_end = span.end;
                        for first in 0..stride {
                            for i in thread_items(span.clone(), first, stride) {
                                seen[i as usize] += 1;
                            }
                        }
                    }
                    assert_eq!(last_end, items);
                    assert!(
                        seen.iter().all(|&n| n == 1),
                        "{items} items, {blocks} blocks"
                    );
                }
            }
        }
    }

    #[test]
    fn the_gather_probe_takes_only_keys_that_do_not_fit_l2() {
        // GLM-5's top-k: 2048 keys a row at 1152 bytes, 2.25 MiB a row.
        let aligned = Gather {
            rows: 64,
            keys: 2048,
            topk: 0x10_0000,
            topk_row: 2048,
            k1: 0x100_0000,
            k1_seq_bytes: 32768 * 1024,
            k1_key_bytes: 1024,
            k2: 0x200_0000,
            k2_seq_bytes: 32768 * 128,
            k2_key_bytes: 128,
        };
        // Batch 64 (144 MiB) spans twice the L2; batch 53 (119.25 MiB) does not; batch 8 (the
        // 18 MiB that read L2 at 4741 GB/s on an H100) is refused.
        assert_eq!(aligned.entries().unwrap(), 64 * 2048);
        assert!(Gather {
            rows: 54,
            ..aligned
        }
        .entries()
        .is_ok());
        for rows in [53, 8, 0] {
            assert!(Gather { rows, ..aligned }.entries().is_err(), "{rows} rows");
        }
        assert!(Gather {
            rows: 1 << 20,
            ..aligned
        }
        .entries()
        .is_err());
        assert!(Gather {
            k2_key_bytes: 136,
            ..aligned
        }
        .entries()
        .is_err());
        assert!(Gather {
            topk: 0x10_0004,
            ..aligned
        }
        .entries()
        .is_err());
    }

    #[test]
    fn the_gather_reads_each_named_rows_bytes_once() {
        let g = Gather {
            rows: 3,
            keys: 5,
            topk: 0x10_0000,
            topk_row: 7,
            k1: 0x100_0000,
            k1_seq_bytes: 64 * 1024,
            k1_key_bytes: 1024,
            k2: 0x200_0000,
            k2_seq_bytes: 64 * 128,
            k2_key_bytes: 128,
        };
        // Row r's entries; −1 names none.
        let topk = [[4, -1, 0, 9, 2], [1, 1, -1, -1, 63], [-1, -1, -1, -1, -1]];
        let mut read = Vec::new();
        let mut want = BTreeSet::new();
        for e in 0..g.rows * g.keys {
            let (row, k) = ((e / g.keys) as usize, (e % g.keys) as usize);
            let Ok(j) = u64::try_from(topk[row][k]) else {
                continue;
            };
            for lane in 0..LANES {
                read.extend(lane_reads(&g, e, j, lane));
            }
            let row = row as u64;
            let k1 = g.k1 + row * g.k1_seq_bytes + j * g.k1_key_bytes;
            let k2 = g.k2 + row * g.k2_seq_bytes + j * g.k2_key_bytes;
            want.extend((0..1024).step_by(16).map(|b| k1 + b));
            want.extend((0..128).step_by(16).map(|b| k2 + b));
        }
        // Entry (1, 0) and (1, 1) name the same row: each read of it is counted.
        let entries = 7;
        assert_eq!(read.len() as u64 * 16, entries * Gather::ENTRY_BYTES);
        assert_eq!(read.iter().copied().collect::<BTreeSet<_>>(), want);
        // A load of a warp: the eight lanes of an entry read 128 contiguous bytes.
        let first = lane_reads(&g, 0, 4, 0);
        for lane in 1..LANES {
            let reads = lane_reads(&g, 0, 4, lane);
            assert!(reads.iter().zip(first).all(|(&a, f)| a == f + 16 * lane));
        }
    }
}
