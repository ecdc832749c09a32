//! Snapshots (`print_module`) of the tiny models after each pass, each applied on top of the
//! previous in pipeline order, so every pass is reviewed as the diff of two consecutive files:
//!
//! - `tiny_sparse_<i>_<pass>`: tiny-sparse (attention auto = sparse) after every pass;
//! - `tiny_sparse_dense_<i>_<pass>`: tiny-sparse with attention=dense, after the passes that
//!   change it from there on (select-attention drops the indexer; absorb-mla leaves dense
//!   prefill expanded);
//! - `tiny_dense_<i>_<pass>`: tiny-dense (no indexer), after the passes that change it.
//!
//! Passes other engineers own (`fuse-elementwise`) are not applied here, so these files change
//! only when the builder or one of the passes below does; their own snapshots cover them.
//! A pass that changes nothing must leave the dump identical, which is asserted instead of
//! writing the same file twice (except for tiny-sparse, where every pass has its file).
//! Review with `cargo insta review`.

mod support;

use glmc_ir::print_module;
use glmc_passes::AttentionChoice;
use support::*;

/// The passes these snapshots follow, in pipeline order.
const PASSES: [&str; 5] = [
    "fuse-mla-projections",
    "select-attention",
    "absorb-mla",
    "cse",
    "dce",
];

#[test]
fn the_passes_are_in_pipeline_order() {
    let order: Vec<&str> = glmc_passes::PIPELINE
        .iter()
        .copied()
        .filter(|p| PASSES.contains(p))
        .collect();
    assert_eq!(order, PASSES);
}

/// Snapshots `config` after each pass; `every`: also the passes that changed nothing.
fn snapshot_stages(prefix: &str, file: &str, choice: AttentionChoice, every: bool, from: usize) {
    let module = build(&shipped(file));
    let stages = stages_of(&module, choice, &PASSES);
    for (i, pair) in stages.windows(2).enumerate() {
        let (before, (pass, after, changed)) = (&pair[0].1, &pair[1]);
        let (previous, dump) = (print_module(before), print_module(after));
        assert_eq!(
            *changed,
            previous != dump,
            "{prefix}: {pass} says changed={changed}, the dump says otherwise"
        );
        let name = format!("{prefix}_{}_{}", i + 1, pass.replace('-', "_"));
        if (every || *changed) && i + 1 >= from {
            insta::assert_snapshot!(name, dump);
        }
    }
    if every {
        let dump = print_module(&stages[0].1);
        insta::assert_snapshot!(format!("{prefix}_0_builder"), dump);
    }
}

#[test]
fn tiny_sparse_after_each_pass() {
    snapshot_stages(
        "tiny_sparse",
        "tiny-sparse.ron",
        AttentionChoice::Auto,
        true,
        0,
    );
}

#[test]
fn tiny_sparse_dense_after_each_pass() {
    // From select-attention on; fuse-mla-projections is the same as in tiny_sparse_1.
    snapshot_stages(
        "tiny_sparse_dense",
        "tiny-sparse.ron",
        AttentionChoice::Dense,
        false,
        2,
    );
}

#[test]
fn tiny_dense_after_each_pass() {
    snapshot_stages(
        "tiny_dense",
        "tiny-dense.ron",
        AttentionChoice::Auto,
        false,
        0,
    );
}
