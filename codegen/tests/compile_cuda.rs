//! Every kernel generated for the shipped models compiles for sm_120a and sm_90a with the pinned
//! nvcc, with no local memory (no spills, no stack frame). `scripts/test.sh` installs the
//! compiler and sets GLMC_NVCC, so in CI this never skips.

mod common;

use common::{dense_module, lowered, module, module_with, LIMITS, MODELS};
use glmc_codegen::kernels::{
    with_x_ahead, with_x_staged, DECODE_GEMM_VARIANTS, TILED_GEMM_VARIANTS,
};
use glmc_codegen::nvcc::{self, parse_ptxas};
use glmc_codegen::schedule::Kernel;
use glmc_codegen::{lower_module, lower_module_with, render, MlaKernel, Target, Variant};
use glmc_ir::DType;

fn compiler() -> nvcc::Compiler {
    match nvcc::find(None) {
        Ok(Some(c)) => c,
        Ok(None) => panic!(
            "no CUDA compiler: run the suite through scripts/test.sh, which installs the pinned nvcc 13.0 and sets GLMC_NVCC"
        ),
        Err(e) => panic!("{e}"),
    }
}

/// Lowers `module` for `target` with `variant`, keeps the kernels of `templates`, compiles them
/// and checks each has no local memory and fits SM120's shared memory; returns ptxas's account
/// of each.
fn variant_compiles(
    nvcc: &nvcc::Compiler,
    module: &glmc_ir::Module,
    target: Target,
    variant: Variant,
    templates: &[&str],
) -> Vec<nvcc::KernelUsage> {
    let mut l = lower_module_with(module, target, LIMITS, variant).unwrap();
    l.kernels
        .retain(|k| templates.contains(&k.template.as_str()));
    let source = render::render(&l.kernels).unwrap();
    let compiled = nvcc::compile(nvcc, &source, target, nvcc::default_cache_dir().as_deref())
        .unwrap_or_else(|e| panic!("{variant:?} for {target}: {e}"));
    let usage = parse_ptxas(&compiled.ptxas);
    l.kernels
        .iter()
        .map(|k| {
            let u = usage.iter().find(|u| u.name == k.name).unwrap().clone();
            println!("{variant:?} {target}: {u}");
            assert_eq!(
                (u.spill_store_bytes, u.spill_load_bytes, u.stack_bytes),
                (0, 0, 0),
                "{variant:?} {target}: {u}"
            );
            assert!(
                k.shared_bytes <= target.tile_shared_memory_limit(),
                "{variant:?}: {u}"
            );
            u
        })
        .collect()
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
        // GLM-5 with dense attention and tiny-dense in bf16 too: their prefills take the flash
        // attention kernel (swizzled and padded tiles).
        let dense = dense_module("glm5.ron");
        let (_, tiny) = module_with("tiny-dense.ron", |c| c.dtype = DType::BF16);
        let models = MODELS
            .iter()
            .map(|m| (m.to_string(), lowered(m, target)))
            .chain([
                (
                    "glm5.ron (dense attention)".to_string(),
                    lower_module(&dense, target, LIMITS).unwrap(),
                ),
                (
                    "tiny-dense.ron (bf16)".to_string(),
                    lower_module(&tiny, target, LIMITS).unwrap(),
                ),
            ]);
        for (model, l) in models {
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

/// Every tile the tiled GEMM's sweep times (`glm5_tiled_gemm_variants_are_timed` in
/// runtime/tests/gpu_kernels.rs), and every decode GEMM the decode sweep times
/// (`glm5_decode_gemm_variants_are_timed`: the 64-row skinny GEMM and the tiled decode tiles,
/// split over K), compiles for both targets on every GLM-5 GEMM shape with no local memory, so
/// the sweep's winner is a one-line change.
#[test]
fn every_tiled_gemm_variant_compiles_without_local_memory() {
    let nvcc = compiler();
    let (_, glm5) = module("glm5.ron");
    let variants = TILED_GEMM_VARIANTS
        .map(Variant::TiledGemm)
        .into_iter()
        .chain(DECODE_GEMM_VARIANTS.map(Variant::DecodeGemm));
    for target in [Target::Sm120a, Target::Sm90a] {
        for v in variants.clone() {
            assert!(
                !variant_compiles(&nvcc, &glm5, target, v, &["gemm_mma", "gemm_skinny"]).is_empty()
            );
        }
    }
}

/// Every form of `moe.down` the MoE decode test times (`MOE_DOWN_VARIANTS`, beside the shipped
/// `MOE_DOWN`) compiles for both targets at GLM-5's shape with no local memory.
#[test]
fn every_moe_down_form_compiles_without_local_memory() {
    use glmc_codegen::kernels::{MoeDown, MOE_DOWN, MOE_DOWN_VARIANTS};
    let nvcc = compiler();
    let (_, glm5) = module("glm5.ron");
    for target in [Target::Sm120a, Target::Sm90a] {
        for form in std::iter::once(MoeDown::Stream(MOE_DOWN)).chain(MOE_DOWN_VARIANTS) {
            let v = Variant::MoeDown(form);
            let templates = ["moe_down_stream", "moe_gemm_skinny"];
            assert!(!variant_compiles(&nvcc, &glm5, target, v, &templates).is_empty());
        }
    }
}

/// Every key ring of the decode indexer kernel that the indexer test times
/// (`SCORE_RING_VARIANTS`, beside the shipped `SCORE_DECODE_RING`) compiles for both targets at
/// GLM-5's shape with no local memory, within SM120's shared memory.
#[test]
fn every_score_ring_compiles_without_local_memory() {
    use glmc_codegen::kernels::{SCORE_DECODE_RING, SCORE_RING_VARIANTS};
    let nvcc = compiler();
    let (_, glm5) = module("glm5.ron");
    for target in [Target::Sm120a, Target::Sm90a] {
        for ring in std::iter::once(SCORE_DECODE_RING).chain(SCORE_RING_VARIANTS) {
            let v = Variant::ScoreRing(ring);
            assert_eq!(
                variant_compiles(&nvcc, &glm5, target, v, &["dsa_score_decode"]).len(),
                1
            );
        }
    }
}

/// The distinct kernels of GLM-5 lowered for `target` with sparse and dense attention, each as
/// `pick` makes it (`None`: left out), by name.
fn glm5_kernels(target: Target, pick: impl Fn(&Kernel) -> Option<Kernel>) -> Vec<Kernel> {
    let dense = dense_module("glm5.ron");
    let mut kernels: Vec<_> = [
        lowered("glm5.ron", target),
        lower_module(&dense, target, LIMITS).unwrap(),
    ]
    .iter()
    .flat_map(|l| &l.kernels)
    .filter_map(pick)
    .collect();
    kernels.sort_by(|a, b| a.name.cmp(&b.name));
    kernels.dedup_by(|a, b| a.name == b.name);
    kernels
}

/// `gemm_skinny_persistent.cu`, which the lowering picks for a short K over many tiles only
/// (kernels.rs: SKINNY_GEMM_16_STREAMED; the shipped kernels' test above holds it to no local
/// memory on both targets), in place of every 16-row skinny GEMM of GLM-5 (dense attention too),
/// as the skinny sweep times it: it renders (the wait check included) and compiles for both
/// targets, with no local memory on sm_90a. On sm_120a the attention product's tile (two warps a
/// column tile, four blocks an SM) spills 4 bytes: to be fixed before it ships there.
#[test]
fn the_persistent_skinny_gemm_compiles_for_every_16_row_gemm() {
    let nvcc = compiler();
    for target in [Target::Sm120a, Target::Sm90a] {
        let kernels = glm5_kernels(target, |k| {
            (k.template == "gemm_skinny" && k.params["mt"] == "1").then(|| Kernel {
                template: "gemm_skinny_persistent".into(),
                ..k.clone()
            })
        });
        assert!(kernels.len() >= 10, "{}", kernels.len());
        let source = render::render(&kernels).unwrap();
        let compiled = nvcc::compile(&nvcc, &source, target, nvcc::default_cache_dir().as_deref())
            .unwrap_or_else(|e| panic!("{target}: {e}"));
        if target == Target::Sm90a {
            for u in parse_ptxas(&compiled.ptxas) {
                assert_eq!(
                    (u.spill_store_bytes, u.spill_load_bytes, u.stack_bytes),
                    (0, 0, 0),
                    "{target}: {u}"
                );
            }
        }
    }
}

/// Every 16-row skinny GEMM of GLM-5 (sparse and dense attention) with its rows of x staged in
/// shared memory where K allows (`with_x_staged`), else x loaded further ahead of the MMAs
/// (`with_x_ahead`), as the skinny sweep times it beside the shipped one: it renders (the wait
/// check included) and compiles for both targets with no local memory, within SM120's shared
/// memory at the blocks an SM it asks for.
#[test]
fn the_skinny_gemm_with_x_early_compiles_for_every_16_row_gemm() {
    let nvcc = compiler();
    for target in [Target::Sm120a, Target::Sm90a] {
        let kernels = glm5_kernels(target, |k| with_x_staged(k).or_else(|| with_x_ahead(k)));
        // Staged: q_absorbed, attn, wq_b, q_b_proj (persistent on an H200) and the shared
        // expert's down projection; ahead: the fused q_a projection, both gate/up projections,
        // o_proj, the dense down projection and the lm_head.
        let staged = kernels.iter().filter(|k| k.params.contains_key("x_rows"));
        assert!(
            staged.count() >= 5 && kernels.len() >= 10,
            "{}",
            kernels.len()
        );
        let source = render::render(&kernels).unwrap();
        let compiled = nvcc::compile(&nvcc, &source, target, nvcc::default_cache_dir().as_deref())
            .unwrap_or_else(|e| panic!("{target}: {e}"));
        let usage = parse_ptxas(&compiled.ptxas);
        for k in &kernels {
            let u = usage.iter().find(|u| u.name == k.name).unwrap();
            let x = ["x_rows", "x_ahead"].map(|p| k.params.get(p).map_or("-", String::as_str));
            println!(
                "{target} {} x_rows {} x_ahead {}: {u}",
                k.template, x[0], x[1]
            );
            assert_eq!(
                (u.spill_store_bytes, u.spill_load_bytes, u.stack_bytes),
                (0, 0, 0),
                "{target}: {u}"
            );
            assert_eq!(u.shared_bytes, k.shared_bytes, "{target}: {u}");
            let blocks: u64 = k.params["min_blocks"].parse().unwrap();
            assert!(
                Target::Sm120a.blocks_fitting_shared_memory(k.shared_bytes.into()) >= blocks,
                "{target}: {u}"
            );
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

/// GLM-5's prefill GEMMs run on the tensor cores: the SASS of the tensor-core kernel has HMMA
/// (read with cuobjdump, which the pinned toolchain installs next to nvcc).
#[test]
fn glm5_prefill_gemms_use_hmma() {
    let nvcc = compiler();
    let l = lowered("glm5.ron", Target::Sm120);
    let prefill = l.phases.iter().find(|p| p.function == "prefill").unwrap();
    let o_proj = prefill
        .launches()
        .find(|x| {
            x.node == "model.layers.0.self_attn.o_proj" && x.kernel.starts_with("glmc_gemm_mma_")
        })
        .expect("the tiled tensor-core GEMM for many rows");
    let sass = sass_by_kernel(&nvcc, &l.kernels, Target::Sm120);
    let body = sass
        .get(&o_proj.kernel)
        .unwrap_or_else(|| panic!("no SASS for {}", o_proj.kernel));
    assert!(
        body.contains("HMMA.16816.F32.BF16"),
        "no bf16 HMMA in {}",
        o_proj.kernel
    );
}

/// `kernels` compiled for `target`, each kernel's SASS by name (read with cuobjdump, which the
/// pinned toolchain installs next to nvcc).
fn sass_by_kernel(
    nvcc: &nvcc::Compiler,
    kernels: &[glmc_codegen::schedule::Kernel],
    target: Target,
) -> std::collections::HashMap<String, String> {
    let source = render::render(kernels).unwrap();
    let compiled =
        nvcc::compile(nvcc, &source, target, nvcc::default_cache_dir().as_deref()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cubin = dir.path().join("k.cubin");
    std::fs::write(&cubin, &compiled.cubin).unwrap();
    let bin = nvcc.path.parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new(bin.join("cuobjdump"))
        .arg("-sass")
        .arg(&cubin)
        .env("PATH", path)
        .output()
        .expect("cuobjdump next to nvcc (scripts/cuda-toolchain.sh installs it)");
    String::from_utf8_lossy(&out.stdout)
        .split("Function : ")
        .skip(1)
        .map(|f| {
            let name = f.split_whitespace().next().unwrap_or_default().to_string();
            (name, f.to_string())
        })
        .collect()
}

/// A kernel that reads its weights before its programmatic-launch wait (`weights_before_wait`,
/// so that a kernel launched early has them on the way while the kernel before it ends) issues
/// them there in the SASS: ptxas 13.0 puts the wait (ACQBULK) above every `ld.global.nc`,
/// whatever the source order, so those loads must be coherent ones (`ld_early16`).
#[test]
fn weights_read_before_the_wait_are_issued_before_it() {
    let nvcc = compiler();
    let mut templates = std::collections::BTreeSet::new();
    for target in [Target::Sm120a, Target::Sm90a] {
        let l = lowered("glm5.ron", target);
        let early: Vec<_> = l
            .kernels
            .iter()
            .filter(|k| {
                render::render(std::slice::from_ref(*k))
                    .unwrap()
                    .contains("    weights_before_wait();")
            })
            .cloned()
            .collect();
        templates.extend(early.iter().map(|k| k.template.clone()));
        let sass = sass_by_kernel(&nvcc, &early, target);
        for k in &early {
            let body = sass
                .get(&k.name)
                .unwrap_or_else(|| panic!("no SASS for {}", k.name));
            let first_load = body.find("LDG").expect("a global load");
            let wait = body.find("ACQBULK").expect("the wait");
            assert!(
                first_load < wait,
                "{target}: {} ({}) issues no load before its wait",
                k.name,
                k.template
            );
        }
    }
    // The skinny GEMMs of both forms and the norms take their weights first.
    for t in ["gemm_skinny", "gemm_skinny_persistent", "norm"] {
        assert!(templates.contains(t), "no {t} kernel reads weights first");
    }
}

/// The tensor-core absorbed attention of GLM-5 at TP=1 (64 heads, the wide kernel's 2 groups of
/// 32 a block) and at TP=8 (8 heads a rank, one half-empty m16 tile), with its merge: no local
/// memory, and, but for the wide kernel (one block an SM), few enough registers (≤ 128 a
/// thread) that an H200 holds two blocks an SM.
#[test]
fn glm5_absorbed_attention_compiles_for_64_and_8_heads_without_local_memory() {
    let nvcc = compiler();
    let (_, m) = common::module("glm5.ron");
    let rank = glmc_passes::partition(&m, 8).unwrap().remove(0);
    let mut kernels = Vec::new();
    for module in [&m, &rank] {
        let l = glmc_codegen::lower_module(module, Target::Sm120a, common::LIMITS).unwrap();
        kernels.extend(
            l.kernels
                .into_iter()
                .filter(|k| k.template.starts_with("mla_")),
        );
    }
    // 64 heads take the wide kernel (32 a block), a rank's 8 the narrow one.
    let heads: std::collections::BTreeSet<(&str, &str)> = kernels
        .iter()
        .filter(|k| k.template.starts_with("mla_absorbed"))
        .map(|k| (k.template.as_str(), k.params["heads"].as_str()))
        .collect();
    assert_eq!(
        heads.into_iter().collect::<Vec<_>>(),
        [("mla_absorbed", "8"), ("mla_absorbed_wide", "64")]
    );
    let source = render::render(&kernels).unwrap();
    for target in [Target::Sm120a, Target::Sm90a] {
        let compiled = nvcc::compile(&nvcc, &source, target, nvcc::default_cache_dir().as_deref())
            .unwrap_or_else(|e| panic!("{target}: {e}"));
        for u in parse_ptxas(&compiled.ptxas) {
            assert_eq!(
                (u.spill_store_bytes, u.spill_load_bytes, u.stack_bytes),
                (0, 0, 0),
                "{target}: {u}"
            );
            // Two narrow blocks share an SM of an H200; the wide kernel holds its queries in
            // registers at one block an SM (SM120's shared memory holds one of either).
            if !u.name.contains("wide") {
                assert!(u.registers <= 128, "{target}: {u}");
            }
        }
    }
}

/// The bulk-copy key ring (`Variant::Mla(MlaKernel::BulkCopy)`, which the attention test times)
/// in both kernels that have the two-stage ring: GLM-5's 64 heads (the wide kernel) and a TP=8
/// rank's 8 (`mla_absorbed.cu`, at most 128 registers: two blocks an SM of an H200), both phases,
/// for both targets with no local memory and within SM120's shared memory.
#[test]
fn the_bulk_copy_key_ring_compiles_without_local_memory() {
    let nvcc = compiler();
    let (_, m) = common::module("glm5.ron");
    let rank = glmc_passes::partition(&m, 8).unwrap().remove(0);
    let bulk = Variant::Mla(MlaKernel::BulkCopy);
    for target in [Target::Sm120a, Target::Sm90a] {
        // Decode, split and unsplit, and the prefill's.
        let wide = variant_compiles(&nvcc, &m, target, bulk, &["mla_absorbed_wide"]);
        assert_eq!(wide.len(), 3, "{target}");
        let narrow = variant_compiles(&nvcc, &rank, target, bulk, &["mla_absorbed"]);
        assert_eq!(narrow.len(), 3, "{target}");
        for u in narrow {
            assert!(u.registers <= 128, "{target}: {u}");
        }
    }
}

/// The 64-head absorbed attention (`MlaKernel::Wide64`) at GLM-5's heads, decode split and
/// unsplit and the prefill's: no local memory on either target, with its 72 query and 128 output
/// registers a thread.
#[test]
fn the_64_head_attention_compiles_without_local_memory() {
    let nvcc = compiler();
    let (_, m) = common::module("glm5.ron");
    for target in [Target::Sm120a, Target::Sm90a] {
        let wide = variant_compiles(
            &nvcc,
            &m,
            target,
            Variant::Mla(MlaKernel::Wide64),
            &["mla_absorbed_wide64"],
        );
        assert_eq!(wide.len(), 3, "{target}");
    }
}

/// The kernels of a greedy build's `matmul.argmax` (the slot clearing and finishing kernels,
/// and the skinny GEMM and the GEMV with the argmax epilogue) at the tiny and GLM-5 sizes, in
/// bf16 and f32: no local memory on either target.
#[test]
fn greedy_lm_head_kernels_compile_without_local_memory() {
    let nvcc = compiler();
    let mut kernels = Vec::new();
    for file in ["tiny-sparse.ron", "glm5.ron"] {
        for dtype in [DType::BF16, DType::F32] {
            let m = common::greedy_module(file, |c| c.dtype = dtype);
            let l = lower_module(&m, Target::Sm120a, LIMITS).unwrap();
            let names: Vec<String> = l
                .phases
                .iter()
                .flat_map(|p| p.launches())
                .filter(|x| x.op == "matmul.argmax")
                .map(|x| x.kernel.clone())
                .collect();
            kernels.extend(l.kernels.into_iter().filter(|k| names.contains(&k.name)));
        }
    }
    kernels.sort_by(|a, b| a.name.cmp(&b.name));
    kernels.dedup_by(|a, b| a.name == b.name);
    let templates: std::collections::BTreeSet<&str> =
        kernels.iter().map(|k| k.template.as_str()).collect();
    assert_eq!(
        templates.into_iter().collect::<Vec<_>>(),
        ["gemm_argmax", "gemm_skinny", "gemv"]
    );
    let source = render::render(&kernels).unwrap();
    for target in [Target::Sm120a, Target::Sm90a] {
        let compiled = nvcc::compile(&nvcc, &source, target, nvcc::default_cache_dir().as_deref())
            .unwrap_or_else(|e| panic!("{target}: {e}"));
        let usage = parse_ptxas(&compiled.ptxas);
        for k in &kernels {
            let u = usage
                .iter()
                .find(|u| u.name == k.name)
                .unwrap_or_else(|| panic!("{target}: ptxas says nothing of {}", k.name));
            assert_eq!(
                (u.spill_store_bytes, u.spill_load_bytes, u.stack_bytes),
                (0, 0, 0),
                "{target}: {u}"
            );
            assert!(u.shared_bytes <= target.tile_shared_memory_limit(), "{u}");
        }
    }
}
