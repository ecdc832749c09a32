//! Tensor-parallel loading: each rank reads only its slice of every sharded checkpoint tensor.

use std::collections::BTreeMap;
use std::path::PathBuf;

use glmc_ir::{DType, Module, Op, Recipe};
use glmc_passes::{partition, pipeline, PipelineOptions};
use glmc_runtime::Checkpoint;

mod support;

use support::by_tensor_ops;

fn fixture(case: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/oracle/fixtures")
        .join(case)
}

fn module(dir: &std::path::Path) -> Module {
    let config = glmc_models::import_hf(dir).unwrap().config;
    let mut m = glmc_models::builder::build(&config, &Default::default()).unwrap();
    pipeline(&PipelineOptions::default())
        .unwrap()
        .run(&mut m)
        .unwrap();
    m
}

/// Every weight of `m` by name, with its recipe.
fn weights(m: &Module) -> BTreeMap<String, Recipe> {
    m.functions
        .iter()
        .flat_map(|f| {
            f.canonical_order()
                .into_iter()
                .filter_map(|n| match &f.node(n).op {
                    Op::Weight { recipe } => Some((f.node(n).name.clone(), recipe.clone())),
                    _ => None,
                })
        })
        .collect()
}

/// At TP=3 on the six-heads fixture, each rank's weights read exactly their own elements from
/// the checkpoint (a sharded q_b_proj a third of the tensor, a replicated norm all of it), so
/// a rank's bytes are a fraction of the whole; and what it reads is the whole tensor's slice.
#[test]
fn a_tensor_parallel_rank_reads_only_its_slices() {
    let dir = fixture("six-heads");
    let m = module(&dir);
    let reference = Checkpoint::open(&dir).unwrap();
    let total: u64 = weights(&m)
        .values()
        .map(|r| {
            let before = reference.bytes_read();
            reference.materialize_as(r, DType::F32).unwrap();
            reference.bytes_read() - before
        })
        .sum();
    for (rank, rm) in partition(&m, 3).unwrap().iter().enumerate() {
        let ckpt = Checkpoint::open(&dir).unwrap();
        let mut sharded = 0;
        for (name, recipe) in weights(rm) {
            let before = ckpt.bytes_read();
            let t = ckpt.materialize_as(&recipe, DType::F32).unwrap();
            let read = ckpt.bytes_read() - before;
            let stored = recipe_leaf_size(&ckpt, &recipe);
            assert_eq!(
                read,
                t.numel() as u64 * stored,
                "rank {rank}: {name} read {read} bytes"
            );
            let want = by_tensor_ops(
                &|name, shape| {
                    reference
                        .materialize(&Recipe::tensor(name, shape.to_vec()))
                        .unwrap()
                },
                &recipe,
            );
            assert_eq!(t.shape(), want.shape(), "rank {rank}: {name}");
            assert_eq!(
                t.as_f32().unwrap(),
                want.as_f32().unwrap(),
                "rank {rank}: {name}"
            );
            if name.contains("q_b_proj") || name.contains("o_proj") {
                sharded += 1;
            }
        }
        assert!(sharded > 0, "rank {rank} has sharded projections");
        let read = ckpt.bytes_read();
        assert!(
            read < total * 2 / 3,
            "rank {rank} read {read} of the checkpoint's {total} bytes"
        );
    }
}

/// The stored element size of the tensors `recipe` reads (one dtype per fixture).
fn recipe_leaf_size(ckpt: &Checkpoint, recipe: &Recipe) -> u64 {
    let mut r = recipe;
    loop {
        match r {
            Recipe::Tensor { name, .. } => {
                let s = ckpt.stored(name).unwrap();
                return s.bytes as u64 / s.shape.iter().product::<usize>() as u64;
            }
            Recipe::Stack { pattern, .. } => {
                let s = ckpt.stored(&Recipe::stack_member(pattern, 0)).unwrap();
                return s.bytes as u64 / s.shape.iter().product::<usize>() as u64;
            }
            Recipe::Slice { src, .. }
            | Recipe::Reshape { src, .. }
            | Recipe::Transpose { src, .. } => r = src,
            Recipe::Concat { parts, .. } => r = &parts[0],
        }
    }
}
