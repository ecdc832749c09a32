//! The GPU architectures glmc compiles for, and what each can do.
//!
//! Kernels are written for SM120 (RTX PRO 6000 Blackwell: `mma.sync`, at most 99 KiB of shared
//! memory per block). The same kernels run on SM90 (H100/H200), which is what the test machines
//! have; the `a` variants additionally allow architecture-specific instructions (wgmma on
//! sm_90a, block-scaled fp8/fp4 mma on sm_120a).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Target {
    Sm90,
    Sm90a,
    Sm120,
    Sm120a,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown target `{0}`: glmc compiles for sm90, sm90a, sm120 and sm120a (RTX PRO 6000 Blackwell is sm120)")]
pub struct TargetError(pub String);

impl Target {
    pub const ALL: [Target; 4] = [Target::Sm90, Target::Sm90a, Target::Sm120, Target::Sm120a];

    /// The name users type and dumps print.
    pub fn name(self) -> &'static str {
        match self {
            Target::Sm90 => "sm90",
            Target::Sm90a => "sm90a",
            Target::Sm120 => "sm120",
            Target::Sm120a => "sm120a",
        }
    }

    /// The architecture name nvcc takes (`-arch`).
    pub fn nvcc_arch(self) -> &'static str {
        match self {
            Target::Sm90 => "sm_90",
            Target::Sm90a => "sm_90a",
            Target::Sm120 => "sm_120",
            Target::Sm120a => "sm_120a",
        }
    }

    /// Largest dynamic shared memory one block may use, in bytes.
    pub fn max_shared_memory_per_block(self) -> u32 {
        match self {
            Target::Sm90 | Target::Sm90a => 227 * 1024,
            Target::Sm120 | Target::Sm120a => 99 * 1024,
        }
    }

    /// Shared memory of one SM, in bytes, which its resident blocks share (CUDA C++ Programming
    /// Guide, "Technical Specifications per Compute Capability": 228 KB for 9.0, 100 KB for 12.0;
    /// each block also takes 1 KB of it for the system).
    pub fn shared_memory_per_sm(self) -> u32 {
        match self {
            Target::Sm90 | Target::Sm90a => 228 * 1024,
            Target::Sm120 | Target::Sm120a => 100 * 1024,
        }
    }

    /// Blocks of `shared` bytes of shared memory each that one SM's shared memory holds at once
    /// (at least one: a kernel's launch checks that a block fits); registers and the SM's block
    /// limit may allow fewer.
    pub fn blocks_fitting_shared_memory(self, shared: u64) -> u64 {
        (u64::from(self.shared_memory_per_sm()) / (shared + 1024)).max(1)
    }

    /// The shared memory a kernel's tile may use on this target: SM120's 99 KiB everywhere, so
    /// the configuration tested on an H200 is the one an RTX PRO 6000 runs (Hopper's 227 KiB is
    /// only the ceiling of a later Hopper-specific variant).
    pub fn tile_shared_memory_limit(self) -> u32 {
        Target::Sm120.max_shared_memory_per_block()
    }

    /// Whether Hopper's warpgroup mma (`wgmma`) is available: only on sm_90a.
    pub fn has_wgmma(self) -> bool {
        self == Target::Sm90a
    }

    /// Whether fp8 `mma.sync` runs natively; ptxas emulates it on sm_90 with bf16 mma.
    pub fn has_native_fp8_mma(self) -> bool {
        matches!(self, Target::Sm120 | Target::Sm120a)
    }

    /// Whether the block-scaled `mma.sync … kind::f8f6f4` / `kind::mxf4nvf4` forms exist: only
    /// on sm_120a (not plain sm_120, not sm_90).
    pub fn has_block_scaled_mma(self) -> bool {
        self == Target::Sm120a
    }

    /// Whether kernels launch as programmatic dependents of the one before them (PDL: the launch
    /// attribute `PROGRAMMATIC_STREAM_SERIALIZATION` and `griddepcontrol` in every kernel), so a
    /// kernel's blocks are resident and waiting while its predecessor drains instead of the SMs
    /// idling between the two. `griddepcontrol` needs sm_90 or later, which every target is.
    pub fn has_programmatic_launch(self) -> bool {
        match self {
            Target::Sm90 | Target::Sm90a | Target::Sm120 | Target::Sm120a => true,
        }
    }

    /// The target to build for a GPU of compute capability `major.minor`: the `a` variant on the
    /// GPU it was made for, plain sm_120 on the other 12.x parts (sm_121, GB10), where `a` code
    /// does not run; `None` for a GPU glmc has no target for.
    pub fn for_gpu(major: i32, minor: i32) -> Option<Target> {
        match (major, minor) {
            (9, 0) => Some(Target::Sm90a),
            (12, 0) => Some(Target::Sm120a),
            (12, _) => Some(Target::Sm120),
            _ => None,
        }
    }

    /// Whether code built for this target runs on a GPU of compute capability `major.minor`.
    pub fn runs_on(self, major: i32, minor: i32) -> bool {
        match self {
            Target::Sm90 | Target::Sm90a => (major, minor) == (9, 0),
            Target::Sm120 => major == 12,
            Target::Sm120a => (major, minor) == (12, 0),
        }
    }

    /// The GPU whose numbers the cost model uses for this target.
    pub fn reference_gpu(self) -> &'static str {
        match self {
            Target::Sm90 | Target::Sm90a => "H200",
            Target::Sm120 | Target::Sm120a => "RTX PRO 6000 Blackwell",
        }
    }

    pub fn sm_count(self) -> u32 {
        match self {
            Target::Sm90 | Target::Sm90a => 132,
            Target::Sm120 | Target::Sm120a => 188,
        }
    }

    /// DRAM bandwidth a streaming kernel can reach, GB/s. H200: the copy bandwidth measured on
    /// the test machine (4.24 TB/s, 2026-11-30); RTX PRO 6000: its datasheet's 1792 GB/s (no such
    /// card has been measured here).
    pub fn memory_bandwidth_gbs(self) -> f64 {
        match self {
            Target::Sm90 | Target::Sm90a => 4240.0,
            Target::Sm120 | Target::Sm120a => 1792.0,
        }
    }

    /// Dense bf16 `mma.sync` (f32 accumulate) rate, TFLOP/s: what SM120-style kernels can reach.
    /// H200: measured from registers on the test machine (646, 2026-11-30; wgmma reaches more);
    /// RTX PRO 6000: about 500, from the datasheet's 4 PFLOP/s sparse FP4 (÷2 dense, ÷4 bf16),
    /// not measured.
    pub fn mma_bf16_tflops(self) -> f64 {
        match self {
            Target::Sm90 | Target::Sm90a => 646.0,
            Target::Sm120 | Target::Sm120a => 500.0,
        }
    }

    /// The instructions the tensor-core kernels may use, for `--help` and the manifest.
    pub fn instructions(self) -> &'static str {
        match self {
            Target::Sm90 => "mma.sync m16n8k16 bf16; e4m3 mma.sync m16n8k32 emulated by ptxas",
            Target::Sm90a => "mma.sync m16n8k16 bf16; e4m3 mma.sync m16n8k32 emulated by ptxas; wgmma",
            Target::Sm120 => "mma.sync m16n8k16 bf16; e4m3 mma.sync m16n8k32 native (no wgmma, no tcgen05)",
            Target::Sm120a => "mma.sync m16n8k16 bf16; e4m3 mma.sync m16n8k32 native; block-scaled kind::f8f6f4 and mxf4nvf4 (no wgmma, no tcgen05); sm_120a cubins do not run on sm_121 (GB10)",
        }
    }
}

impl FromStr for Target {
    type Err = TargetError;

    /// Accepts `sm120`, `sm_120`, `SM120a` and the like.
    fn from_str(s: &str) -> Result<Target, TargetError> {
        let norm = s.to_ascii_lowercase().replace('_', "");
        Target::ALL
            .into_iter()
            .find(|t| t.name() == norm)
            .ok_or_else(|| TargetError(s.to_string()))
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_sm_holds_the_blocks_its_shared_memory_fits() {
        // The attention's 96.75 KiB block with its 1 KiB for the system: two in an H200's 228
        // KiB, one in SM120's 100.
        assert_eq!(Target::Sm90a.blocks_fitting_shared_memory(99_072), 2);
        assert_eq!(Target::Sm120a.blocks_fitting_shared_memory(99_072), 1);
        assert_eq!(Target::Sm120.blocks_fitting_shared_memory(200 * 1024), 1);
    }

    #[test]
    fn parses_every_spelling() {
        for (text, t) in [
            ("sm120", Target::Sm120),
            ("sm_120a", Target::Sm120a),
            ("SM90", Target::Sm90),
            ("sm_90a", Target::Sm90a),
        ] {
            assert_eq!(text.parse::<Target>(), Ok(t));
        }
    }

    #[test]
    fn rejects_unknown_targets_with_the_valid_list() {
        let err = "sm100".parse::<Target>().unwrap_err().to_string();
        assert!(
            err.contains("sm100") && err.contains("sm90, sm90a, sm120 and sm120a"),
            "{err}"
        );
    }

    #[test]
    fn every_target_launches_its_kernels_programmatically() {
        for t in Target::ALL {
            assert!(t.has_programmatic_launch(), "{t}");
        }
    }

    #[test]
    fn gpus_get_the_target_their_code_runs_on() {
        for (cc, t) in [
            ((9, 0), Target::Sm90a),
            ((12, 0), Target::Sm120a),
            ((12, 1), Target::Sm120),
        ] {
            let target = Target::for_gpu(cc.0, cc.1).unwrap();
            assert_eq!(target, t);
            assert!(target.runs_on(cc.0, cc.1));
        }
        assert_eq!(Target::for_gpu(8, 0), None);
        assert!(
            !Target::Sm120a.runs_on(12, 1),
            "sm_120a cubins do not run on sm_121"
        );
        assert!(!Target::Sm90a.runs_on(12, 0));
    }

    #[test]
    fn sm120_kernels_fit_the_smaller_shared_memory() {
        assert_eq!(Target::Sm120.max_shared_memory_per_block(), 101376);
        assert!(
            Target::Sm90.max_shared_memory_per_block()
                > Target::Sm120.max_shared_memory_per_block()
        );
    }
}
