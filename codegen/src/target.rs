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

    /// Whether Hopper's warpgroup mma (`wgmma`) is available: only on sm_90a.
    pub fn has_wgmma(self) -> bool {
        self == Target::Sm90a
    }

    /// Whether fp8 `mma.sync` runs natively; ptxas emulates it on sm_90 with bf16 mma.
    pub fn has_native_fp8_mma(self) -> bool {
        matches!(self, Target::Sm120 | Target::Sm120a)
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
    fn sm120_kernels_fit_the_smaller_shared_memory() {
        assert_eq!(Target::Sm120.max_shared_memory_per_block(), 101376);
        assert!(
            Target::Sm90.max_shared_memory_per_block()
                > Target::Sm120.max_shared_memory_per_block()
        );
    }
}
