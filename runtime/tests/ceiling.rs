//! The ceiling kernel `glmc bench` measures the bf16 `mma.sync` rate with compiles for every
//! target with the pinned nvcc, without local memory (a spill would measure the memory, not the
//! tensor cores). `scripts/test.sh` installs the compiler and sets GLMC_NVCC, so in CI this never
//! skips.

use glmc_codegen::{nvcc, Target};
use glmc_runtime::cuda::ceiling;

#[test]
fn the_mma_rate_kernel_compiles_for_every_target() {
    let compiler = match nvcc::find(None) {
        Ok(Some(c)) => c,
        Ok(None) => panic!(
            "no CUDA compiler: run the suite through scripts/test.sh, which installs the pinned nvcc 13.0 and sets GLMC_NVCC"
        ),
        Err(e) => panic!("{e}"),
    };
    for target in [Target::Sm90a, Target::Sm120a] {
        let compiled = nvcc::compile(
            &compiler,
            ceiling::MMA_SOURCE,
            target,
            nvcc::default_cache_dir().as_deref(),
        )
        .unwrap_or_else(|e| panic!("{target}: {e}"));
        let usage = nvcc::parse_ptxas(&compiled.ptxas);
        let k = usage
            .iter()
            .find(|u| u.name == "glmc_mma_rate")
            .unwrap_or_else(|| panic!("{target}: ptxas says nothing of glmc_mma_rate"));
        assert_eq!(
            (k.stack_bytes, k.spill_store_bytes, k.spill_load_bytes),
            (0, 0, 0),
            "{target}: local memory"
        );
    }
}
