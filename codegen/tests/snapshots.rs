//! The lowered schedule and the generated CUDA of a tiny model: reviewing these diffs is how a
//! change to the lowering or a template is reviewed.

mod common;

use common::lowered;
use glmc_codegen::{render, Target};

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
