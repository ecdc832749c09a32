//! The runtime's own CUDA sources (not generated from templates) compile for every target with
//! the pinned nvcc, without local memory: the random-weight generator, the kernel `glmc bench`
//! measures the bf16 `mma.sync` rate with (a spill would measure the memory, not the tensor
//! cores), and the read probes the GPU tests hold kernels against (a spill would be bytes the
//! probe reads and the kernels need not). `scripts/test.sh` installs the compiler and sets
//! GLMC_NVCC, so in CI these never skip.

use glmc_codegen::{nvcc, Target};
use glmc_runtime::cuda::{ceiling, random_fill};

fn compiles_without_local_memory(source: &str, kernel: &str) {
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
            source,
            target,
            nvcc::default_cache_dir().as_deref(),
        )
        .unwrap_or_else(|e| panic!("{target}: {e}"));
        let usage = nvcc::parse_ptxas(&compiled.ptxas);
        let k = usage
            .iter()
            .find(|u| u.name == kernel)
            .unwrap_or_else(|| panic!("{target}: ptxas says nothing of {kernel}"));
        assert_eq!(
            (k.stack_bytes, k.spill_store_bytes, k.spill_load_bytes),
            (0, 0, 0),
            "{target}: local memory"
        );
    }
}

#[test]
fn the_device_generator_compiles_for_every_target() {
    compiles_without_local_memory(random_fill::SOURCE, "glmc_random_weights");
}

#[test]
fn the_mma_rate_kernel_compiles_for_every_target() {
    compiles_without_local_memory(ceiling::MMA_SOURCE, "glmc_mma_rate");
}

#[test]
fn the_read_probes_compile_for_every_target() {
    let kernels: Vec<String> = ceiling::read_kernels().collect();
    assert!(!kernels.is_empty());
    let source = ceiling::read_source();
    for kernel in &kernels {
        compiles_without_local_memory(&source, kernel);
    }
}
