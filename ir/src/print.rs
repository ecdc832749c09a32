//! The canonical text form. Ids come from `Function::canonical_order`, attributes are sorted,
//! floats have one spelling and every line ends with the node's stable name, so a dump is a
//! function of the graph's content alone and a pass is reviewed as a diff of two dumps.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

use petgraph::stable_graph::NodeIndex;

use crate::graph::{Function, Module, Shard, Value};
use crate::lit::write_quoted;
use crate::TensorType;

pub fn print_module(module: &Module) -> String {
    let mut out = header(module);
    for f in &module.functions {
        out.push('\n');
        out.push_str(&print_function(f));
    }
    out
}

fn header(module: &Module) -> String {
    let mut out = String::from("glmc.module ");
    write_quoted(&mut out, &module.name);
    out.push_str(&tp_text(module));
    out.push('\n');
    for (name, row) in &module.states {
        out.push_str("state ");
        write_quoted(&mut out, name);
        writeln!(out, " : {row}").unwrap();
    }
    out
}

/// ` tp=N rank=R` for one rank of a partitioned module; nothing for a whole one, whose dumps
/// predate tensor parallelism.
fn tp_text(module: &Module) -> String {
    if module.tp.is_single() {
        String::new()
    } else {
        format!(" tp={} rank={}", module.tp.degree, module.tp.rank)
    }
}

pub fn print_function(f: &Function) -> String {
    let order = f.canonical_order();
    let ids: HashMap<NodeIndex, usize> = order.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let mut out = format!("func @{} {{\n", f.name);
    for &n in &order {
        out.push_str("  ");
        out.push_str(&node_line(f, n, &ids));
        out.push('\n');
    }
    out.push_str(&results_line(f, &ids));
    out.push_str("}\n");
    out
}

fn value_ref(v: Value, ids: &HashMap<NodeIndex, usize>) -> String {
    if v.output == 0 {
        format!("%{}", ids[&v.node])
    } else {
        format!("%{}#{}", ids[&v.node], v.output)
    }
}

fn types_text(types: &[TensorType]) -> String {
    match types {
        [t] => t.to_string(),
        ts => format!(
            "({})",
            ts.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// `%ID = OP OPERANDS {ATTRS} : TYPES "NAME"`, then ` tp=split(AXIS)` or ` tp=partial` for
/// a node a rank holds a block or a partial sum of.
fn node_line(f: &Function, n: NodeIndex, ids: &HashMap<NodeIndex, usize>) -> String {
    let node = &f.graph[n];
    let mut line = format!("%{} = {}", ids[&n], node.op.name());
    let operands: Vec<String> = f
        .operands(n)
        .into_iter()
        .map(|v| value_ref(v, ids))
        .collect();
    if !operands.is_empty() {
        line.push(' ');
        line.push_str(&operands.join(", "));
    }
    let attrs = node.op.attrs();
    if !attrs.is_empty() {
        line.push_str(" {");
        for (i, (k, v)) in attrs.iter().enumerate() {
            if i > 0 {
                line.push_str(", ");
            }
            line.push_str(k);
            line.push('=');
            v.write(&mut line);
        }
        line.push('}');
    }
    write!(line, " : {} ", types_text(&node.outputs)).unwrap();
    write_quoted(&mut line, &node.name);
    match node.shard {
        None => {}
        Some(Shard::Split { axis }) => write!(line, " tp=split({axis})").unwrap(),
        Some(Shard::Partial) => line.push_str(" tp=partial"),
        Some(Shard::Stacked { axis, parts }) => {
            write!(line, " tp=stacked({axis}, {parts})").unwrap()
        }
    }
    line
}

fn results_line(f: &Function, ids: &HashMap<NodeIndex, usize>) -> String {
    let mut line = String::from("  return");
    for (i, (name, v)) in f.results.iter().enumerate() {
        line.push_str(if i == 0 { " " } else { ", " });
        line.push_str(&value_ref(*v, ids));
        line.push(' ');
        write_quoted(&mut line, name);
    }
    line.push('\n');
    line
}

/// The layer a node belongs to, from its `model.layers.N.` name prefix.
fn layer_of(name: &str) -> Option<u64> {
    let rest = name.strip_prefix("model.layers.")?;
    rest.split('.').next()?.parse().ok()
}

/// A readable summary for deep models: every node outside the layers, each run of consecutive
/// layers that are identical up to the layer index printed once (ids as in the full dump), and
/// a histogram of ops over the whole function. Not parseable; `print_module` is.
pub fn print_module_summary(module: &Module) -> String {
    let mut out = String::from("glmc.module ");
    write_quoted(&mut out, &module.name);
    out.push_str(&tp_text(module));
    out.push('\n');
    out.push_str(&summarize_states(module));
    for f in &module.functions {
        out.push('\n');
        out.push_str(&summarize_function(f));
    }
    out
}

/// States that differ only in their layer index, as one line with the layers listed as ranges.
fn summarize_states(module: &Module) -> String {
    let mut groups: BTreeMap<(String, String), Vec<u64>> = BTreeMap::new();
    for (name, row) in &module.states {
        let key = match layer_of(name) {
            Some(l) => (
                name.replacen(&format!("model.layers.{l}."), "model.layers.{L}.", 1),
                row.to_string(),
            ),
            None => (name.clone(), row.to_string()),
        };
        groups.entry(key).or_default().extend(layer_of(name));
    }
    let mut out = String::new();
    for ((name, row), mut layers) in groups {
        out.push_str("state ");
        write_quoted(&mut out, &name);
        write!(out, " : {row}").unwrap();
        if !layers.is_empty() {
            layers.sort();
            write!(out, "  // L in {}", ranges(&layers)).unwrap();
        }
        out.push('\n');
    }
    out
}

/// `[0, 1, 2, 4]` as `0..=2, 4`.
fn ranges(sorted: &[u64]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            sorted[i].to_string()
        } else {
            format!("{}..={}", sorted[i], sorted[j])
        });
        i = j + 1;
    }
    parts.join(", ")
}

fn summarize_function(f: &Function) -> String {
    let order = f.canonical_order();
    let ids: HashMap<NodeIndex, usize> = order.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    // Lines grouped into segments: a run of nodes of one layer, or of no layer.
    let mut segments: Vec<(Option<u64>, Vec<NodeIndex>)> = Vec::new();
    for &n in &order {
        let layer = layer_of(&f.graph[n].name);
        match segments.last_mut() {
            Some((l, nodes)) if *l == layer => nodes.push(n),
            _ => segments.push((layer, vec![n])),
        }
    }
    let mut out = format!("func @{} {{\n", f.name);
    let mut i = 0;
    while i < segments.len() {
        let (layer, nodes) = &segments[i];
        let Some(first) = layer else {
            for &n in nodes {
                writeln!(out, "  {}", node_line(f, n, &ids)).unwrap();
            }
            i += 1;
            continue;
        };
        let shape = layer_shape(f, nodes, *first, &ids);
        let mut j = i + 1;
        while j < segments.len() {
            match &segments[j] {
                (Some(l), ns) if layer_shape(f, ns, *l, &ids) == shape => j += 1,
                _ => break,
            }
        }
        let last = segments[j - 1].0.unwrap();
        if j - i == 1 {
            writeln!(out, "  // layer {first}").unwrap();
        } else {
            writeln!(out, "  // layers {first}..={last}: {} layers identical up to the layer index; layer {first} shown", j - i).unwrap();
        }
        for &n in nodes {
            writeln!(out, "  {}", node_line(f, n, &ids)).unwrap();
        }
        i = j;
    }
    out.push_str(&results_line(f, &ids));
    out.push_str("}\n");
    let mut histogram: BTreeMap<&str, usize> = BTreeMap::new();
    for n in f.graph.node_indices() {
        *histogram.entry(f.graph[n].op.name()).or_default() += 1;
    }
    writeln!(
        out,
        "// @{} op histogram ({} nodes):",
        f.name,
        f.graph.node_count()
    )
    .unwrap();
    for (op, count) in histogram {
        writeln!(out, "//   {op:<22} {count}").unwrap();
    }
    out
}

/// A layer's lines with the layer index and ids made relative, so that layers of one kind
/// compare equal: ids inside the layer count from its first node, ids outside it are replaced
/// by the name they refer to.
fn layer_shape(
    f: &Function,
    nodes: &[NodeIndex],
    layer: u64,
    ids: &HashMap<NodeIndex, usize>,
) -> Vec<String> {
    let base = ids[&nodes[0]];
    let prefix = format!("model.layers.{layer}.");
    let end = base + nodes.len();
    let mut local: HashMap<NodeIndex, String> = HashMap::new();
    for &n in nodes {
        local.insert(n, format!("L{}", ids[&n] - base));
    }
    nodes
        .iter()
        .map(|&n| {
            let node = &f.graph[n];
            let operands: Vec<String> = f
                .operands(n)
                .into_iter()
                .map(|v| match local.get(&v.node) {
                    Some(id) if (base..end).contains(&ids[&v.node]) => format!("{id}#{}", v.output),
                    _ => format!(
                        "{}#{}",
                        relative_name(&f.graph[v.node].name, layer),
                        v.output
                    ),
                })
                .collect();
            let mut attrs = String::new();
            for (k, v) in node.op.attrs() {
                attrs.push_str(k);
                v.write(&mut attrs);
            }
            format!(
                "{} {} {} {} {}",
                node.op.name(),
                operands.join(","),
                attrs.replace(&prefix, "model.layers.L."),
                types_text(&node.outputs),
                node.name.replace(&prefix, "model.layers.L.")
            )
        })
        .collect()
}

/// A name outside the layer, relative to it: `model.layers.{layer-k}.x` becomes `L-k.x`.
fn relative_name(name: &str, layer: u64) -> String {
    match layer_of(name) {
        Some(l) if l <= layer => {
            let rest = &name[format!("model.layers.{l}.").len()..];
            format!("L-{}.{rest}", layer - l)
        }
        _ => name.to_string(),
    }
}
