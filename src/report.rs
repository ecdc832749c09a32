//! `glmc compile --report`: per phase, the memory plan of the compiled graph in a fixed serving
//! setting (`glmc_passes::plan_memory::default_bindings`), the weights, and the KV cache in that
//! setting and per token. The text depends only on the module, so it is the same on every run.

use std::collections::BTreeMap;
use std::fmt::Write;

use anyhow::Context;
use glmc_codegen::Target;
use glmc_ir::{Function, Module};
use glmc_passes::plan_memory::{
    default_bindings, kv_cache_bytes, layer_of, plan_memory, KvCacheBytes,
};

/// `1234567` → `1,234,567`.
fn grouped(n: u64) -> String {
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
pub fn report(module: &Module, target: Target) -> anyhow::Result<String> {
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
    Ok(out)
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
