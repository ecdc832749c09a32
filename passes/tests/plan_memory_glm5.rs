//! `plan_memory` and `kv_cache_bytes` on the real GLM-5 graph (models/glm5.ron), before and
//! after the pass pipeline: the KV cache per token from GLM5-SPEC §3.3's arithmetic, sizes that
//! follow from the config by hand, and the arena invariant checked on every pair of buffers.

use glmc_ir::Module;
use glmc_models::ModelConfig;
use glmc_passes::plan_memory::{
    default_bindings, kv_cache_bytes, plan_memory, Buffer, MemoryPlan, Storage, ALIGNMENT,
};
use glmc_passes::{pipeline, AttentionChoice, PipelineOptions};

const MIB: u64 = 1 << 20;

fn glm5_config() -> ModelConfig {
    let path = glmc_models::shipped_config_path("glm5.ron");
    ModelConfig::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The builder's module (expanded MLA), and with `optimize` the pipeline's.
fn glm5(optimize: bool, attention: AttentionChoice) -> Module {
    let options = glmc_models::builder::BuildOptions::default();
    let mut m = glmc_models::builder::build(&glm5_config(), &options).unwrap();
    let options = PipelineOptions {
        no_optimization: !optimize,
        attention,
        disabled: vec![],
    };
    pipeline(&options).unwrap().run(&mut m).unwrap();
    m
}

fn plan(m: &Module, phase: &str) -> MemoryPlan {
    let f = m.function(phase).unwrap();
    plan_memory(f, &default_bindings(phase).unwrap()).unwrap()
}

/// Exhaustive: no two buffers live at a common step share a byte; offsets aligned; the peak
/// is the most bytes live at one step, and the arena at least that.
fn assert_invariants(plan: &MemoryPlan) {
    let bufs: Vec<&Buffer> = plan.buffers.iter().filter(|b| b.bytes > 0).collect();
    for (i, a) in bufs.iter().enumerate() {
        assert_eq!(a.offset % ALIGNMENT, 0);
        assert!(a.offset + a.bytes <= plan.arena_bytes);
        for b in &bufs[i + 1..] {
            assert!(
                !(a.live.overlaps(b.live) && a.intersects(b)),
                "@{}: {} and {} are live together and share bytes",
                plan.function,
                plan.value(a.value).unwrap().name,
                plan.value(b.value).unwrap().name,
            );
        }
    }
    let naive: Vec<u64> = (0..plan.order.len())
        .map(|s| plan.live_at(s).map(|b| b.bytes).sum())
        .collect();
    assert_eq!(plan.peak_live_bytes, naive.into_iter().max().unwrap());
    assert!(plan.arena_bytes >= plan.peak_live_bytes);
}

/// GLM5-SPEC §3.3, "Cache per token per layer": latent c 512 + k_pe 64 = 576 values, plus the
/// indexer key's 128 values; bf16 is 2 bytes; GLM-5 has 78 decoder layers (§1.1).
#[test]
fn kv_cache_per_token_is_the_spec_arithmetic() {
    let per_layer_values: u64 = 512 + 64 + 128;
    let expected = per_layer_values * 2 * 78;
    assert_eq!(expected, 109_824);
    for optimize in [false, true] {
        let kv = kv_cache_bytes(&glm5(optimize, AttentionChoice::Auto)).unwrap();
        assert_eq!(kv.per_token, expected, "optimize={optimize}");
        assert_eq!(kv.layers.len(), 78);
        assert!(kv.layers.iter().all(|&(_, b)| b == per_layer_values * 2));
        // Decode at batch 64 with a 128k context: 64 · 131072 · 109824 B = 858 GiB exactly.
        assert_eq!(kv.for_tokens(64 * 131_072), Some(858 << 30));
    }
    // Dense attention drops the indexer and its key cache: 576 values a layer.
    let kv = kv_cache_bytes(&glm5(true, AttentionChoice::Dense)).unwrap();
    assert_eq!(kv.per_token, 576 * 2 * 78);
}

#[test]
fn compiled_glm5_plans_soundly_with_hand_checked_sizes() {
    let m = glm5(true, AttentionChoice::Auto);
    let (s, b, t) = (8192u64, 64u64, 131_072u64);
    let (hidden, vocab, heads, latent) = (6144u64, 154_880u64, 64u64, 512u64);
    for phase in ["prefill", "decode"] {
        let plan = plan(&m, phase);
        assert_invariants(&plan);
        let rows = if phase == "prefill" { s } else { b };
        let value = |name: &str| {
            plan.values
                .iter()
                .find(|v| v.name == name)
                .unwrap_or_else(|| panic!("@{phase}: no value {name}"))
        };
        // A hidden state: rows × 6144 × bf16 (96 MiB for an 8192-token prefill).
        assert_eq!(value("model.embed_tokens").bytes, rows * hidden * 2);
        if phase == "prefill" {
            assert_eq!(value("model.embed_tokens").bytes, 96 * MIB);
        }
        // The logits, f32, of one row per sequence: prefill's last position, decode's batch.
        let sequences = if phase == "prefill" { 1 } else { b };
        assert_eq!(value("logits").bytes, sequences * vocab * 4, "@{phase}");
        // Decode's logits are its largest intermediate; prefill's (605 KiB) no longer are, nor
        // is the absorbed query s × 64 heads × 512 (bf16, 512 MiB): the routed rows out of the
        // experts' down projection, s × 8 slots × 6144 (bf16, 768 MiB), are.
        assert_eq!(
            value("model.layers.0.self_attn.q_absorbed").bytes,
            rows * heads * latent * 2
        );
        let largest = plan.largest_intermediate().unwrap();
        let (name, bytes) = match phase {
            "prefill" => ("model.layers.3.mlp.experts.down", rows * 8 * hidden * 2),
            _ => ("logits", rows * vocab * 4),
        };
        assert_eq!(
            (largest.name.as_str(), largest.bytes),
            (name, bytes),
            "@{phase}"
        );
        // Absorbed attention: the latent output rows × 64 heads × 512, bf16.
        assert_eq!(
            value("model.layers.5.self_attn.attn_latent").bytes,
            rows * heads * latent * 2
        );
        // The caches are read in place.
        for v in plan.values.iter().filter(|v| v.name.contains(".cache.")) {
            assert!(matches!(v.storage, Storage::Cache { .. }), "{}", v.name);
        }
        // After absorb-mla no per-head K/V is expanded from the cache: no kv_b_proj output.
        assert!(
            !plan
                .values
                .iter()
                .any(|v| v.name.ends_with("kv_b_proj") || v.name.ends_with(".value")),
            "@{phase}: an expanded K/V intermediate survived the pipeline"
        );
        // Greedy by size lands close to the lower bound.
        assert!(
            plan.arena_bytes <= plan.peak_live_bytes + plan.peak_live_bytes / 20,
            "@{phase}: arena {} vs peak {}",
            plan.arena_bytes,
            plan.peak_live_bytes
        );
        // The weights are about 744 B parameters at 2 bytes each (the router's f32 gate at 4).
        assert!((1_400_000_000_000..1_600_000_000_000).contains(&plan.weights_bytes));
        // Both settings' context: the decode's dsa.score over the whole cache, f32 [b, t].
        if phase == "decode" {
            assert_eq!(
                value("model.layers.5.self_attn.indexer.scores").bytes,
                b * t * 4
            );
        }
    }
}

/// The builder's expanded form materialises per-head K/V from the whole cache:
/// `[(b,) t, 64 × (192 + 256)]` bf16 per layer, which the absorbed form never does.
#[test]
fn the_expanded_form_is_planned_too_and_is_large() {
    let m = glm5(false, AttentionChoice::Auto);
    for (phase, tokens) in [("prefill", 8192u64), ("decode", 64 * 131_072)] {
        let plan = plan(&m, phase);
        assert_invariants(&plan);
        let kv = plan
            .values
            .iter()
            .find(|v| v.name == "model.layers.5.self_attn.kv_b_proj")
            .unwrap();
        assert_eq!(kv.bytes, tokens * 64 * (192 + 256) * 2);
        assert!(matches!(kv.storage, Storage::Arena { .. }));
        assert!(plan.peak_live_bytes >= kv.bytes);
    }
}

#[test]
fn glm5_plans_are_deterministic() {
    let a = glm5(true, AttentionChoice::Auto);
    let b = glm5(true, AttentionChoice::Auto);
    for phase in ["prefill", "decode"] {
        let (pa, pb) = (plan(&a, phase), plan(&b, phase));
        let key = |p: &MemoryPlan| {
            p.values
                .iter()
                .map(|v| (v.name.clone(), v.bytes, v.live, p.offset(v.value)))
                .collect::<Vec<_>>()
        };
        assert_eq!(key(&pa), key(&pb));
        assert_eq!(pa.arena_bytes, pb.arena_bytes);
        assert_eq!(pa, plan(&a, phase));
    }
}
