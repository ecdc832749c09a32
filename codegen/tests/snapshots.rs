//! The lowered schedule and the generated CUDA of a tiny model: reviewing these diffs is how a
//! change to the lowering or a template is reviewed.

mod common;

use common::{lowered, module_with, LIMITS};
use glmc_codegen::{lower_module, render, Target};
use glmc_ir::DType;

#[test]
fn tiny_sparse_decode_schedule() {
    let l = lowered("tiny-sparse.ron", Target::Sm120);
    let decode = l.phases.iter().find(|p| p.function == "decode").unwrap();
    insta::assert_snapshot!(decode.print(&l.kernels));
}

#[test]
fn tiny_sparse_prefill_schedule() {
    let l = lowered("tiny-sparse.ron", Target::Sm120);
    let prefill = l.phases.iter().find(|p| p.function == "prefill").unwrap();
    insta::assert_snapshot!(prefill.print(&l.kernels));
}

#[test]
fn tiny_sparse_kernels_cu() {
    let l = lowered("tiny-sparse.ron", Target::Sm120);
    insta::assert_snapshot!(render::render(&l.kernels).unwrap());
}

/// The tensor-core GEMMs (tiled for prefill, skinny for decode, with the rope epilogue and per
/// head), which the f32 tiny models never use: the same model in bf16.
#[test]
fn tiny_sparse_bf16_gemm_kernels_cu() {
    let (_, m) = module_with("tiny-sparse.ron", |c| c.dtype = DType::BF16);
    let l = lower_module(&m, Target::Sm120, LIMITS).unwrap();
    let gemms: Vec<_> = l
        .kernels
        .iter()
        .filter(|k| k.template.starts_with("gemm_"))
        .cloned()
        .collect();
    let templates: std::collections::BTreeSet<_> =
        gemms.iter().map(|k| k.template.as_str()).collect();
    assert_eq!(
        templates.into_iter().collect::<Vec<_>>(),
        ["gemm_mma", "gemm_skinny"]
    );
    insta::assert_snapshot!(render::render(&gemms).unwrap());
}

/// The grouped expert GEMMs in bf16 (the f32 tiny models take the skinny kernel throughout):
/// the tensor-core one at prefill, gate/up's skinny one and the down projection's stream form
/// at decode.
#[test]
fn tiny_sparse_bf16_moe_kernels_cu() {
    let (_, m) = module_with("tiny-sparse.ron", |c| c.dtype = DType::BF16);
    let l = lower_module(&m, Target::Sm120, LIMITS).unwrap();
    let moe: Vec<_> = l
        .kernels
        .iter()
        .filter(|k| k.template.starts_with("moe_gemm") || k.template == "moe_down_stream")
        .cloned()
        .collect();
    let templates: std::collections::BTreeSet<_> =
        moe.iter().map(|k| k.template.as_str()).collect();
    assert_eq!(
        templates.into_iter().collect::<Vec<_>>(),
        ["moe_down_stream", "moe_gemm_mma", "moe_gemm_skinny"]
    );
    insta::assert_snapshot!(render::render(&moe).unwrap());
}

/// GLM-5's tensor-core absorbed attention (64 heads, and 8 a rank at TP=8) and its merge.
#[test]
fn glm5_absorbed_attention_kernels_cu() {
    let (_, m) = common::module("glm5.ron");
    let rank = glmc_passes::partition(&m, 8).unwrap().remove(0);
    let mut kernels = Vec::new();
    for module in [&m, &rank] {
        let l = lower_module(module, Target::Sm120, LIMITS).unwrap();
        kernels.extend(
            l.kernels
                .into_iter()
                .filter(|k| k.template.starts_with("mla_")),
        );
    }
    insta::assert_snapshot!(render::render(&kernels).unwrap());
}
