//! Graphviz export, for looking at a small graph.

use std::fmt::Write;

use crate::graph::Function;

pub fn to_dot(f: &Function) -> String {
    let ids = f.canonical_ids();
    let mut order: Vec<_> = ids.iter().map(|(n, i)| (*i, *n)).collect();
    order.sort();
    let mut out = format!(
        "digraph \"{}\" {{\n  node [shape=box, fontname=monospace];\n",
        f.name
    );
    for (i, n) in &order {
        let node = &f.graph[*n];
        let types: Vec<String> = node.outputs.iter().map(ToString::to_string).collect();
        let label = format!(
            "%{i} {}\\n{}\\n{}",
            node.op.name(),
            types.join(", "),
            node.name
        );
        writeln!(out, "  n{i} [label=\"{}\"];", label.replace('"', "\\\"")).unwrap();
    }
    for (i, n) in &order {
        for (k, v) in f.operands(*n).iter().enumerate() {
            writeln!(
                out,
                "  n{} -> n{i} [label=\"{k}{}\"];",
                ids[&v.node],
                output_suffix(v.output)
            )
            .unwrap();
        }
    }
    for (name, v) in &f.results {
        writeln!(
            out,
            "  \"{name}\" [shape=oval];\n  n{} -> \"{name}\"{};",
            ids[&v.node],
            match v.output {
                0 => String::new(),
                k => format!(" [label=\"#{k}\"]"),
            }
        )
        .unwrap();
    }
    out.push_str("}\n");
    out
}

/// ` #k` for output `k` of a multi-output node; nothing for output 0.
fn output_suffix(output: u32) -> String {
    if output == 0 {
        String::new()
    } else {
        format!(" #{output}")
    }
}
