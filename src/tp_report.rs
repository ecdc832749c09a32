//! `glmc compile --tp N --report`: the tensor-parallel section of the report, from rank 0's
//! partitioned module (every rank has the same shapes): per-rank weights, KV cache and
//! activation arenas, the collectives of one decode step with a ring-model latency over NVLink
//! and PCIe, and what fits on an RTX PRO 6000 and an H200, up to which context.

use std::collections::BTreeMap;
use std::fmt::Write;

use anyhow::Context;
use glmc_codegen::expr::Poly;
use glmc_ir::{DType, Module, Op, Tp};
use glmc_passes::plan_memory::{
    decode_bindings, kv_cache_bytes, plan_memory, prefill_bindings, Storage, REPORT_DECODE_BATCH,
    REPORT_DECODE_CONTEXT, REPORT_PREFILL_TOKENS,
};
use glmc_passes::{PassError, PassManager, TpPartition};

use crate::report::{fold_layer, grouped, human_bytes};

/// An interconnect in the ring model. The numbers are datasheet-level assumptions, not
/// measurements: they say what order of cost the collectives have, not what NCCL reaches.
struct Link {
    name: &'static str,
    gpu: &'static str,
    /// Usable bandwidth per direction per GPU for a ring, GB/s.
    bandwidth_gbs: f64,
    /// Latency of one ring step, µs.
    hop_latency_us: f64,
}

/// H200: NVLink 4 is 900 GB/s bidirectional per GPU, so 450 GB/s per direction; a few µs per
/// hop through NVSwitch.
const NVLINK: Link = Link {
    name: "NVLink 4",
    gpu: "H200",
    bandwidth_gbs: 450.0,
    hop_latency_us: 3.0,
};
/// RTX PRO 6000 Blackwell has no NVLink: PCIe Gen5 x16 is 64 GB/s raw per direction, about
/// 50 usable; ~10 µs per hop through the host bridge or a PCIe switch.
const PCIE: Link = Link {
    name: "PCIe Gen5 x16",
    gpu: "RTX PRO 6000 Blackwell",
    bandwidth_gbs: 50.0,
    hop_latency_us: 10.0,
};
const LINKS: [Link; 2] = [NVLINK, PCIE];

/// A GPU the fit question is asked for.
struct Card {
    name: &'static str,
    /// As the datasheet states it.
    label: &'static str,
    bytes: u64,
}

const CARDS: [Card; 2] = [
    Card {
        name: "RTX PRO 6000 Blackwell",
        label: "96 GiB",
        bytes: 96 << 30,
    },
    Card {
        name: "H200",
        label: "141 GB",
        bytes: 141_000_000_000,
    },
];

/// Held back on every GPU for the CUDA context, cuBLAS/NCCL workspaces and NCCL's buffers.
const HEADROOM: u64 = 4 << 30;

/// The two batch sizes the collectives and the fit are given at.
const BATCHES: [u64; 2] = [1, REPORT_DECODE_BATCH];

/// Rank 0's module of a TP group of `degree`: the divisibility check and the partition, without
/// building the other ranks (every rank has the same shapes).
pub fn rank_zero(module: &Module, degree: u64) -> Result<Module, PassError> {
    let mut m = module.clone();
    let mut pm = PassManager::new();
    pm.add(TpPartition {
        tp: Tp { degree, rank: 0 },
    });
    pm.run(&mut m)?;
    Ok(m)
}

/// One kind of collective of a decode step: (op, node name with the layer folded, bytes per
/// call at each of [`BATCHES`]) → calls.
type Collectives = BTreeMap<(&'static str, String, [u64; 2]), u64>;

fn collectives(rank0: &Module) -> anyhow::Result<Collectives> {
    let f = rank0
        .function("decode")
        .context("the module has no @decode (a glmc bug)")?;
    let mut out = Collectives::new();
    for n in f.canonical_order() {
        let node = f.node(n);
        let op = match node.op {
            Op::AllReduce { .. } => "all_reduce",
            Op::AllGather { .. } => "all_gather",
            _ => continue,
        };
        // An all_gather's result is the gathered tensor, an all_reduce's the reduced one: in
        // both the ring moves (a fraction of) exactly these bytes.
        let ty = &node.outputs[0];
        let mut bytes = [0u64; 2];
        for (b, batch) in bytes.iter_mut().zip(BATCHES) {
            let bindings = decode_bindings(batch, REPORT_DECODE_CONTEXT);
            let numel = ty.shape.iter().try_fold(1u64, |acc, d| {
                let v = u64::try_from(Poly::from_dim(d).eval(&bindings)?).ok()?;
                acc.checked_mul(v)
            });
            *b = numel
                .and_then(|n| n.checked_mul(ty.dtype.size_bytes()))
                .with_context(|| {
                    format!(
                        "{}: {ty} does not evaluate at batch {batch} (a glmc bug)",
                        node.name
                    )
                })?;
        }
        *out.entry((op, fold_layer(&node.name), bytes)).or_default() += 1;
    }
    Ok(out)
}

/// Seconds one call takes on a ring of `ranks` over `link`: an all_reduce is a reduce-scatter
/// and an all_gather, 2(N−1) steps each moving bytes/N; an all_gather alone is N−1 of them.
fn ring_seconds(op: &str, bytes: u64, ranks: u64, link: &Link) -> f64 {
    let steps = match op {
        "all_reduce" => 2 * (ranks - 1),
        _ => ranks - 1,
    } as f64;
    steps * link.hop_latency_us * 1e-6
        + steps / ranks as f64 * bytes as f64 / (link.bandwidth_gbs * 1e9)
}

/// What one rank holds, apart from the cache: weights (and those in bf16), and the activation
/// arenas of prefill and decode.
#[derive(Clone, Copy)]
struct RankMemory {
    weights: u64,
    bf16_weights: u64,
    prefill_arena: u64,
    /// Per [`BATCHES`], at the model's longest context.
    decode_arena: [u64; 2],
}

fn rank_memory(rank: &Module, max_context: u64) -> anyhow::Result<RankMemory> {
    let function = |name: &str| {
        rank.function(name)
            .with_context(|| format!("the module has no @{name} (a glmc bug)"))
    };
    let prefill = plan_memory(
        function("prefill")?,
        &prefill_bindings(REPORT_PREFILL_TOKENS, 0),
    )?;
    let mut decode_arena = [0u64; 2];
    let mut decode = None;
    for (arena, batch) in decode_arena.iter_mut().zip(BATCHES) {
        let plan = plan_memory(function("decode")?, &decode_bindings(batch, max_context))?;
        *arena = plan.arena_bytes;
        decode = Some(plan);
    }
    let decode = decode.expect("BATCHES is not empty");
    let bf16_weights = decode
        .values
        .iter()
        .filter(|v| matches!(v.storage, Storage::Weight) && v.ty.dtype == DType::BF16)
        .map(|v| v.bytes)
        .sum();
    Ok(RankMemory {
        weights: decode.weights_bytes,
        bf16_weights,
        prefill_arena: prefill.arena_bytes,
        decode_arena,
    })
}

/// The bytes of `m`'s weights (each named weight once, at its dtype).
fn weight_bytes(m: &Module) -> u64 {
    let mut seen = std::collections::BTreeMap::new();
    for f in &m.functions {
        for n in f.canonical_order() {
            let node = f.node(n);
            if let Op::Weight { .. } = node.op {
                let ty = &node.outputs[0];
                let numel: u64 = ty.shape.iter().filter_map(|d| d.as_const()).product();
                seen.insert(node.name.clone(), numel * ty.dtype.size_bytes());
            }
        }
    }
    seen.values().sum()
}

/// The section's text. `module` is the single-device module, `rank0` its rank 0 of `degree`,
/// `max_context` the model's `max_position_embeddings`.
pub fn section(
    module: &Module,
    rank0: &Module,
    degree: u64,
    max_context: u64,
) -> anyhow::Result<String> {
    let mut out = String::new();
    let kv = kv_cache_bytes(rank0)?;
    let mem = rank_memory(rank0, max_context)?;
    let report_decode = plan_memory(
        rank0
            .function("decode")
            .context("the module has no @decode (a glmc bug)")?,
        &decode_bindings(REPORT_DECODE_BATCH, REPORT_DECODE_CONTEXT),
    )?;
    writeln!(
        out,
        "\ntensor parallelism: TP={degree}, per rank (rank 0's graph; every rank has the same shapes)"
    )?;
    writeln!(out, "  weights                {}", human_bytes(mem.weights))?;
    writeln!(
        out,
        "  checkpoint reads       {} per rank, at the model's dtype: its slice of each sharded tensor, never the rest (the whole model's weights are {})",
        human_bytes(weight_bytes(rank0)),
        human_bytes(weight_bytes(module))
    )?;
    writeln!(
        out,
        "  kv cache per token     {} on every rank: the latent cache and the indexer keys are replicated (GLM5-SPEC §4)",
        human_bytes(kv.per_token)
    )?;
    writeln!(
        out,
        "  activation arena       prefill of {REPORT_PREFILL_TOKENS} tokens {}; decode at batch {REPORT_DECODE_BATCH}, context {REPORT_DECODE_CONTEXT} {}",
        human_bytes(mem.prefill_arena),
        human_bytes(report_decode.arena_bytes)
    )?;

    let calls = collectives(rank0)?;
    writeln!(
        out,
        "\ncollectives per decode step ({} calls; ring model: an all_reduce takes 2(N-1) hops x latency + 2(N-1)/N x bytes / bandwidth, an all_gather (N-1) hops x latency + (N-1)/N x bytes / bandwidth):",
        calls.values().sum::<u64>()
    )?;
    for link in &LINKS {
        writeln!(
            out,
            "  {} ({}): {} GB/s per direction per GPU, {} us per hop",
            link.name, link.gpu, link.bandwidth_gbs, link.hop_latency_us
        )?;
    }
    writeln!(
        out,
        "  (datasheet-level assumptions, not measurements; no overlap with compute assumed; the us columns are all the row's calls of one step)"
    )?;
    writeln!(
        out,
        "  {:>5}  {:<10}  {:<34}  {:>12}  {:>12}  {:>18}  {:>18}",
        "calls",
        "op",
        "node",
        format!("B/call b={}", BATCHES[0]),
        format!("B/call b={}", BATCHES[1]),
        format!("NVLink us b={}/{}", BATCHES[0], BATCHES[1]),
        format!("PCIe us b={}/{}", BATCHES[0], BATCHES[1])
    )?;
    let mut totals = [[0f64; 2]; 2];
    for ((op, name, bytes), count) in &calls {
        let mut cells = Vec::new();
        for (l, link) in LINKS.iter().enumerate() {
            let us: Vec<f64> = bytes
                .iter()
                .map(|&b| ring_seconds(op, b, degree, link) * *count as f64 * 1e6)
                .collect();
            totals[l][0] += us[0];
            totals[l][1] += us[1];
            cells.push(format!("{:.1} / {:.1}", us[0], us[1]));
        }
        writeln!(
            out,
            "  {count:>5}  {op:<10}  {name:<34}  {:>12}  {:>12}  {:>18}  {:>18}",
            grouped(bytes[0]),
            grouped(bytes[1]),
            cells[0],
            cells[1]
        )?;
    }
    for (link, total) in LINKS.iter().zip(totals) {
        writeln!(
            out,
            "  per decode step over {}: {:.3} ms at batch 1, {:.3} ms at batch {REPORT_DECODE_BATCH}",
            link.name,
            total[0] / 1e3,
            total[1] / 1e3
        )?;
    }

    fit(&mut out, module, &mem, kv.per_token, degree, max_context)?;
    Ok(out)
}

/// One way to lay the weights out: a label, the weights per rank, and the rest of the rank.
struct Layout {
    label: String,
    weights: u64,
    mem: RankMemory,
}

/// The fit question per card: weights + arenas + KV cache × tokens ≤ memory − headroom, for
/// bf16 weights at TP=`degree`, for FP8 weights at that degree, and for bf16 at the smallest
/// larger degree that fits (doubling while the model still divides).
fn fit(
    out: &mut String,
    module: &Module,
    mem: &RankMemory,
    kv_per_token: u64,
    degree: u64,
    max_context: u64,
) -> anyhow::Result<()> {
    writeln!(
        out,
        "\nwhat fits per GPU: weights + activation arenas (prefill of {REPORT_PREFILL_TOKENS} tokens and decode at the batch, at {max_context} tokens of context) + kv cache x tokens <= memory - {} held for the CUDA context and NCCL buffers:",
        human_bytes(HEADROOM)
    )?;
    let fp8 = mem.weights - mem.bf16_weights / 2;
    writeln!(
        out,
        "  bf16 weights need {} per rank at TP={degree}; with every bf16 weight in FP8 (1 byte) {}",
        human_bytes(mem.weights),
        human_bytes(fp8)
    )?;
    let same = |label: String, weights| Layout {
        label,
        weights,
        mem: *mem,
    };
    let mut layouts = vec![
        same(format!("bf16, TP={degree}"), mem.weights),
        same(format!("FP8 weights, TP={degree}"), fp8),
    ];
    // Larger degrees, only as far as one is needed for a card whose usable memory the bf16
    // weights at `degree` exceed.
    let mut larger = degree * 2;
    let smallest_usable = CARDS.iter().map(|c| c.bytes - HEADROOM).min().unwrap_or(0);
    let mut last = mem.weights;
    while last + mem.prefill_arena + mem.decode_arena[0] > smallest_usable {
        let Ok(rank) = rank_zero(module, larger) else {
            writeln!(
                out,
                "  TP={larger} does not divide the model's heads, intermediate sizes or vocabulary"
            )?;
            break;
        };
        let m = rank_memory(&rank, max_context)?;
        last = m.weights;
        layouts.push(Layout {
            label: format!("bf16, TP={larger}"),
            weights: m.weights,
            mem: m,
        });
        larger *= 2;
    }
    for card in &CARDS {
        let usable = card.bytes - HEADROOM;
        writeln!(
            out,
            "  {} ({}, {} usable):",
            card.name,
            card.label,
            human_bytes(usable)
        )?;
        for layout in &layouts {
            let fixed = layout.weights + layout.mem.prefill_arena;
            let mut cells = Vec::new();
            for (&arena, batch) in layout.mem.decode_arena.iter().zip(BATCHES) {
                let need = fixed + arena;
                if need > usable {
                    cells.push(format!("batch {batch}: does not fit"));
                    continue;
                }
                let tokens = (usable - need) / kv_per_token;
                let cap = batch * max_context;
                cells.push(if tokens >= cap {
                    format!(
                        "batch {batch}: {} tokens (every sequence at the model's limit, {})",
                        grouped(cap),
                        grouped(max_context)
                    )
                } else {
                    format!(
                        "batch {batch}: {} tokens ({} per sequence)",
                        grouped(tokens),
                        grouped(tokens / batch)
                    )
                });
            }
            let verdict = if layout.weights > usable {
                format!(
                    "weights {} do not fit: {} over",
                    human_bytes(layout.weights),
                    human_bytes(layout.weights - usable)
                )
            } else {
                format!(
                    "weights {} fit; largest kv cache {}",
                    human_bytes(layout.weights),
                    cells.join(", ")
                )
            };
            writeln!(out, "    {:<22} {verdict}", layout.label)?;
        }
    }
    Ok(())
}
