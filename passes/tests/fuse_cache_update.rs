//! `fuse-cache-update` on the tiny sparse model: its snapshot after the pass (the module before
//! it is `fuse-elementwise`'s "after" snapshot), what it fuses, and where it must not: a
//! normalised value with another reader, and a latent `k_pe` still rotated by its own `rope`.
//! Translation validation covers it with every pass of the pipeline (`translation.rs`).

mod support;

use std::collections::BTreeMap;

use glmc_ir::{print_module, Module, Op};
use glmc_passes::fuse_cache_update::FuseCacheUpdate;
use glmc_passes::{AttentionChoice, Pass};
use support::*;

/// tiny-sparse through the pipeline up to `fuse-cache-update` (without it, and without the
/// passes `without`).
fn before(without: &[&str]) -> Module {
    let mut m = build(&shipped("tiny-sparse.ron"));
    for name in [
        "fuse-mla-projections",
        "select-attention",
        "absorb-mla",
        "fuse-elementwise",
    ] {
        if !without.contains(&name) {
            m = apply(name, AttentionChoice::Auto, &m).unwrap().0;
        }
    }
    m
}

fn after(m: &Module) -> Module {
    let (fused, changed) = apply("fuse-cache-update", AttentionChoice::Auto, m).unwrap();
    assert!(changed);
    fused
}

fn histogram(m: &Module, function: &str) -> BTreeMap<&'static str, usize> {
    let mut h = BTreeMap::new();
    for n in m.function(function).unwrap().graph.node_weights() {
        *h.entry(n.op.name()).or_default() += 1;
    }
    h
}

fn count(h: &BTreeMap<&str, usize>, op: &str) -> usize {
    h.get(op).copied().unwrap_or(0)
}

#[test]
fn tiny_sparse_after() {
    insta::assert_snapshot!(print_module(&after(&before(&[]))));
}

#[test]
fn every_cache_update_is_fused() {
    // 4 layers: each latent pair (c_kv normalised, k_pe its tail) becomes one node, and each of
    // the 3 indexer key caches (layer 2 shares layer 1's indexer) another.
    let (b, a) = (before(&[]), after(&before(&[])));
    for phase in ["prefill", "decode"] {
        let (hb, ha) = (histogram(&b, phase), histogram(&a, phase));
        assert_eq!(count(&hb, "cache.update"), 11, "{phase}: {hb:?}");
        assert_eq!(count(&ha, "cache.update"), 0, "{phase}: {ha:?}");
        assert_eq!(count(&ha, "cache.update.norm"), 7, "{phase}");
        assert_eq!(count(&ha, "layernorm") + count(&ha, "rope"), 0, "{phase}");
        assert_eq!(count(&ha, "rmsnorm"), count(&hb, "rmsnorm") - 4, "{phase}");
        assert_eq!(count(&ha, "concat"), count(&hb, "concat") - 3, "{phase}");
    }
    let f = a.function("decode").unwrap();
    let latent = f.node(f.find("model.layers.0.self_attn.cache.c_kv").unwrap());
    assert_eq!(
        latent.op.cache_states(),
        [
            "model.layers.0.self_attn.cache.c_kv",
            "model.layers.0.self_attn.cache.k_pe"
        ]
    );
    let key = f.node(f.find("model.layers.0.self_attn.indexer.cache.k").unwrap());
    assert!(
        matches!(&key.op, Op::CacheUpdateNorm { layernorm: true, rope: Some(r), .. } if r.start == 0 && r.end == 8),
        "{:?}",
        key.op
    );
    // A second run finds nothing left.
    let mut again = a.clone();
    assert!(!FuseCacheUpdate.run(&mut again).unwrap());
    assert_eq!(print_module(&again), print_module(&a));
}

#[test]
fn a_normalised_value_with_another_reader_stays() {
    let mut m = before(&[]);
    let f = m.function_mut("decode").unwrap();
    let norm = f.find("model.layers.0.self_attn.kv_a_layernorm").unwrap();
    let k_norm = f.find("model.layers.0.self_attn.indexer.k_norm").unwrap();
    f.results.push(("normed".into(), norm.into()));
    f.results.push(("k_normed".into(), k_norm.into()));
    let a = after(&m);
    let f = a.function("decode").unwrap();
    for name in [
        "model.layers.0.self_attn.cache.c_kv",
        "model.layers.0.self_attn.cache.k_pe",
        "model.layers.0.self_attn.indexer.cache.k",
    ] {
        let op = &f.node(f.find(name).unwrap()).op;
        assert!(matches!(op, Op::CacheUpdate { .. }), "{name}: {op:?}");
    }
    let op = &f
        .node(f.find("model.layers.1.self_attn.cache.c_kv").unwrap())
        .op;
    assert_eq!(op.cache_states().len(), 2, "{op:?}");
}

#[test]
fn a_rotated_k_pe_is_no_tail() {
    // Without fuse-elementwise the latent k_pe is rope(slice), not the columns after c_kv.
    let a = after(&before(&["fuse-elementwise"]));
    let f = a.function("decode").unwrap();
    let latent = &f
        .node(f.find("model.layers.0.self_attn.cache.c_kv").unwrap())
        .op;
    assert_eq!(
        latent.cache_states(),
        ["model.layers.0.self_attn.cache.c_kv"]
    );
    let k_pe = &f
        .node(f.find("model.layers.0.self_attn.cache.k_pe").unwrap())
        .op;
    assert!(matches!(k_pe, Op::CacheUpdate { .. }), "{k_pe:?}");
}
