//! Every kernel generated for the shipped models compiles for sm_120a and sm_90a with the pinned
//! nvcc, with no local memory (no spills, no stack frame). `scripts/test.sh` installs the
//! compiler and sets GLMC_NVCC, so in CI this never skips.

mod common;

use common::{lowered, MODELS};
use glmc_codegen::nvcc::{self, parse_ptxas};
use glmc_codegen::{render, Target};

fn compiler() -> nvcc::Compiler {
    match nvcc::find(None) {
        Ok(Some(c)) => c,
        Ok(None) => panic!(
            "no CUDA compiler: run the suite through scripts/test.sh, which installs the pinned nvcc 13.0 and sets GLMC_NVCC"
        ),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn every_generated_kernel_compiles_without_local_memory() {
    let nvcc = compiler();
    assert!(
        nvcc.version.contains("13.0"),
        "the pinned nvcc is 13.0 (the GPU host's driver rejects newer PTX), found {}",
        nvcc.version
    );
    for target in [Target::Sm120a, Target::Sm90a] {
        for model in MODELS {
            let l = lowered(model, target);
            let source = render::render(&l.kernels).unwrap();
            let compiled =
                nvcc::compile(&nvcc, &source, target, nvcc::default_cache_dir().as_deref())
                    .unwrap_or_else(|e| panic!("{model} for {target}: {e}"));
            assert!(!compiled.cubin.is_empty());
            let usage = parse_ptxas(&compiled.ptxas);
            for k in &l.kernels {
                let u = usage.iter().find(|u| u.name == k.name).unwrap_or_else(|| {
                    panic!("{model} {target}: ptxas says nothing of {}", k.name)
                });
                assert_eq!(
                    (u.spill_store_bytes, u.spill_load_bytes, u.stack_bytes),
                    (0, 0, 0),
                    "{model} {target}: {u}"
                );
                assert!(u.shared_bytes <= target.tile_shared_memory_limit(), "{u}");
            }
        }
    }
}

#[test]
fn a_kernel_that_does_not_compile_is_an_error_naming_the_target() {
    let nvcc = compiler();
    let err = nvcc::compile(&nvcc, "this is not CUDA", Target::Sm120a, None).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("sm120a") && text.contains("kernels.cu"),
        "{text}"
    );
}
