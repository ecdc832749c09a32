//! `glmc compile --report`: per phase, the memory plan of the compiled graph in a fixed serving
//! setting (`glmc_passes::plan_memory::default_bindings`), the weights, and the KV cache in that
//! setting and per token. The text depends only on the module, so it is the same on every run.

use std::collections::BTreeMap;
use std::fmt::Write;

use anyhow::Context;
use glmc_codegen::cost::{function_cost, Cost};
use glmc_codegen::schedule::Step;
use glmc_codegen::{Lowered, Target};
use glmc_ir::{Function, Module};
use glmc_passes::plan_memory::{
    decode_bindings, default_bindings, kv_cache_bytes, layer_of, plan_memory, prefill_bindings,
    Bindings, KvCacheBytes, REPORT_DECODE_CONTEXT, REPORT_PREFILL_TOKENS,
};

/// `1234567` → `1,234,567`.
pub(crate) fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let groups: Vec<&str> = digits
        .as_bytes()
        .rchunks(3)
        .rev()
        .map(|g| std::str::from_utf8(g).expect("ASCII digits"))
        .collect();
    groups.join(",")
}

/// `7.09 GiB (7,612,661,760 B)`; below 1 KiB just `N B`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (unit, size) in UNITS {
        if n >= size {
            return format!("{:.2} {unit} ({} B)", n as f64 / size as f64, grouped(n));
        }
    }
    format!("{n} B")
}

/// The rows of the table, in order; each phase gives one cell per row.
const ROWS: [&str; 12] = [
    "setting",
    "bindings",
    "arena",
    "peak live activations",
    "  at",
    "peak inside the layers",
    "  at",
    "largest intermediate",
    "",
    "weights",
    "kv cache in the setting",
    "",
];

/// One phase's column.
fn column(f: &Function, kv: &KvCacheBytes) -> anyhow::Result<Option<Vec<String>>> {
    let Some(bindings) = default_bindings(&f.name) else {
        return Ok(None);
    };
    let plan =
        plan_memory(f, &bindings).with_context(|| format!("planning the memory of @{}", f.name))?;
    let get = |s: &str| bindings.get(s).copied().unwrap_or(0);
    let setting = match f.name.as_str() {
        "prefill" if get("t") == get("s") => format!("{} tokens, empty cache", get("s")),
        "prefill" => format!("{} tokens after {}", get("s"), get("t") - get("s")),
        _ => format!("batch {}, {}-token context", get("b"), get("t")),
    };
    let name_at = |step: usize| f.node(plan.order[step]).name.clone();
    let live = plan.live_bytes();
    // The head's logits often dominate; the peak inside the decoder layers is the other number
    // a reader wants.
    let (layer_step, layer_peak) = live
        .iter()
        .enumerate()
        .filter(|(s, _)| layer_of(&name_at(*s)).is_some())
        .fold(
            (0, 0),
            |best, (s, &b)| if b > best.1 { (s, b) } else { best },
        );
    let (largest, largest_size) = match plan.largest_intermediate() {
        Some(v) => (format!("{} {}", v.name, v.ty), human_bytes(v.bytes)),
        None => ("none".into(), String::new()),
    };
    let sequences = bindings.get("b").copied().unwrap_or(1);
    let tokens = get("t").saturating_mul(sequences);
    let kv_setting = match kv.for_tokens(tokens) {
        Some(bytes) => human_bytes(bytes),
        None => "more than 2^64 B".into(),
    };
    Ok(Some(vec![
        setting,
        bindings
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" "),
        human_bytes(plan.arena_bytes),
        human_bytes(plan.peak_live_bytes),
        name_at(plan.peak_step),
        human_bytes(layer_peak),
        name_at(layer_step),
        largest,
        largest_size,
        human_bytes(plan.weights_bytes),
        format!("{} tokens × {} B", grouped(tokens), grouped(kv.per_token)),
        kv_setting,
    ]))
}

/// The report's text.
pub fn report(module: &Module, target: Target, lowered: &Lowered) -> anyhow::Result<String> {
    let kv = kv_cache_bytes(module)?;
    let mut columns: Vec<(String, Vec<String>)> = Vec::new();
    let mut skipped = Vec::new();
    for f in &module.functions {
        match column(f, &kv)? {
            Some(cells) => columns.push((f.name.clone(), cells)),
            None => skipped.push(f.name.clone()),
        }
    }

    let mut out = String::new();
    writeln!(
        out,
        "memory report: {} for {} (the compiled graph; one activation arena per phase)",
        module.name,
        target.name()
    )?;
    let label = ROWS.iter().map(|r| r.len()).max().unwrap_or(0);
    let widths: Vec<usize> = columns
        .iter()
        .map(|(name, cells)| {
            cells
                .iter()
                .chain([name])
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut line = |label_text: &str, cells: Vec<&str>| -> std::fmt::Result {
        let mut l = format!("{label_text:label$}");
        for (cell, w) in cells.iter().zip(&widths) {
            write!(l, "  {cell:w$}")?;
        }
        writeln!(out, "{}", l.trim_end())
    };
    line("", columns.iter().map(|(n, _)| n.as_str()).collect())?;
    for (r, row) in ROWS.iter().enumerate() {
        line(row, columns.iter().map(|(_, c)| c[r].as_str()).collect())?;
    }
    for name in skipped {
        writeln!(out, "@{name}: no serving setting to plan it in")?;
    }
    kv_per_token(&mut out, &kv)?;
    schedule_summary(&mut out, lowered)?;
    costs(&mut out, module, target)?;
    Ok(out)
}

/// What the lowering made of each phase.
fn schedule_summary(out: &mut String, lowered: &Lowered) -> std::fmt::Result {
    let l = &lowered.limits;
    writeln!(
        out,
        "\nlaunch schedule (arena sized for prefill chunks of {} tokens, decode batches of {}, {} tokens of context):",
        l.max_prefill_tokens, l.max_batch, l.max_context
    )?;
    for p in &lowered.phases {
        let count = |f: fn(&Step) -> bool| p.steps.iter().filter(|s| f(s)).count();
        // A node with guarded alternatives runs one of them a step.
        let guarded: std::collections::BTreeSet<&str> = p
            .launches()
            .filter(|l| l.when.is_some())
            .map(|l| l.node.as_str())
            .collect();
        let alternatives = count(|s| matches!(s, Step::Launch(l) if l.when.is_some()));
        let picks = match guarded.len() {
            0 => String::new(),
            n => format!("; {n} of them pick their kernel by row count"),
        };
        writeln!(
            out,
            "  @{}: arena {}, {} launches a step (copies included{picks}), {} views, {} ops not lowered yet",
            p.function,
            human_bytes(p.arena_bytes),
            count(|s| matches!(s, Step::Launch(_))) - alternatives + guarded.len(),
            count(|s| matches!(s, Step::View { .. })),
            count(|s| matches!(s, Step::Missing { .. })),
        )?;
    }
    let launches = if lowered.programmatic_launch {
        "programmatic (PDL): a kernel may start while the one before it drains, and waits in griddepcontrol.wait before it touches memory"
    } else {
        "plain: a kernel starts once the one before it is done"
    };
    writeln!(out, "  launches: {launches}")?;
    Ok(())
}

/// The roofline cost of each phase on the target, by kind of node (layer numbers folded), and
/// the predicted step time.
fn costs(out: &mut String, module: &Module, target: Target) -> std::fmt::Result {
    writeln!(
        out,
        "\ncost model for {} ({}: {} GB/s, {} TFLOP/s bf16 mma.sync; each op at max(bytes / bandwidth, FLOPs / rate), launch gaps not counted):",
        target.name(),
        target.reference_gpu(),
        target.memory_bandwidth_gbs(),
        target.mma_bf16_tflops()
    )?;
    let settings: [(&str, String, Bindings); 3] = [
        (
            "prefill",
            format!("prefill of {REPORT_PREFILL_TOKENS} tokens"),
            prefill_bindings(REPORT_PREFILL_TOKENS, 0),
        ),
        (
            "decode",
            format!("decode step, batch 1, context {REPORT_DECODE_CONTEXT}"),
            decode_bindings(1, REPORT_DECODE_CONTEXT),
        ),
        (
            "decode",
            format!("decode step, batch 64, context {REPORT_DECODE_CONTEXT}"),
            decode_bindings(64, REPORT_DECODE_CONTEXT),
        ),
    ];
    for (function, title, bindings) in settings {
        let Some(f) = module.function(function) else {
            continue;
        };
        let ops = function_cost(f, &bindings);
        // (op, node name with the layer number folded) → (count, summed cost)
        let mut groups: BTreeMap<(&str, String), (u64, Cost)> = BTreeMap::new();
        for c in &ops {
            let key = (c.op, fold_layer(&c.node));
            let e = groups.entry(key).or_default();
            e.0 += 1;
            e.1.bytes += c.cost.bytes;
            e.1.flops += c.cost.flops;
        }
        let total: f64 = ops.iter().map(|c| c.cost.seconds(target)).sum();
        let bytes: f64 = ops.iter().map(|c| c.cost.bytes).sum();
        let flops: f64 = ops.iter().map(|c| c.cost.flops).sum();
        writeln!(
            out,
            "  {title}: predicted {:.3} ms ({:.2} GB moved, {:.2} TFLOP), {} ops",
            total * 1e3,
            bytes / 1e9,
            flops / 1e12,
            ops.len()
        )?;
        let mut rows: Vec<_> = groups.into_iter().collect();
        rows.sort_by(|a, b| {
            let ta = a.1 .1.seconds(target);
            let tb = b.1 .1.seconds(target);
            tb.total_cmp(&ta).then(a.0.cmp(&b.0))
        });
        for ((op, name), (count, cost)) in rows.iter().take(8) {
            writeln!(
                out,
                "    {:>9.1} us  {count:>3} x {op:<20} {name}  ({:.1} MB, {:.1} GFLOP)",
                cost.seconds(target) * 1e6,
                cost.bytes / 1e6,
                cost.flops / 1e9
            )?;
        }
        if rows.len() > 8 {
            writeln!(out, "    … {} more kinds of node", rows.len() - 8)?;
        }
    }
    Ok(())
}

/// `model.layers.12.mlp.gate` → `model.layers.*.mlp.gate`.
pub(crate) fn fold_layer(name: &str) -> String {
    match layer_of(name) {
        Some(l) => name.replacen(&format!("model.layers.{l}."), "model.layers.*.", 1),
        None => name.to_string(),
    }
}

/// The cache per token: the total, then runs of layers with the same states.
fn kv_per_token(out: &mut String, kv: &KvCacheBytes) -> std::fmt::Result {
    writeln!(out, "kv cache per token: {}", human_bytes(kv.per_token))?;
    let mut per_layer: BTreeMap<Option<u64>, Vec<(String, u64)>> = BTreeMap::new();
    for (state, bytes) in &kv.states {
        let layer = layer_of(state);
        let local = match layer {
            Some(l) => state
                .strip_prefix(&format!("model.layers.{l}."))
                .unwrap_or(state)
                .to_string(),
            None => state.clone(),
        };
        per_layer.entry(layer).or_default().push((local, *bytes));
    }
    // (first layer, last layer, the states of each: (name inside the layer, bytes)).
    type Run = (Option<u64>, Option<u64>, Vec<(String, u64)>);
    let mut runs: Vec<Run> = Vec::new();
    for (layer, states) in per_layer {
        match runs.last_mut() {
            Some((_, Some(last), prev)) if layer == Some(*last + 1) && *prev == states => {
                *last += 1
            }
            _ => runs.push((layer, layer, states)),
        }
    }
    for (first, last, states) in runs {
        let total: u64 = states.iter().map(|(_, b)| b).sum();
        let parts = states
            .iter()
            .map(|(s, b)| format!("{s} {b}"))
            .collect::<Vec<_>>()
            .join(" + ");
        let which = match (first, last) {
            (Some(a), Some(b)) if a == b => format!("layer {a}:"),
            (Some(a), Some(b)) => format!("layers {a}-{b} ({} layers):", b - a + 1),
            _ => "outside the layers:".into(),
        };
        writeln!(out, "  {which} {total} B each = {parts}")?;
    }
    Ok(())
}
