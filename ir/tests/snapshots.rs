//! Snapshots of the text dump, the DOT view and the layer-collapsing summary. Review a changed
//! snapshot like a diff of the IR: it is one.

mod common;

use common::*;
use glmc_ir::dot::to_dot;
use glmc_ir::{print_module, print_module_summary, Module};

#[test]
fn little_module_text() {
    insta::assert_snapshot!(print_module(&little_module(1)));
}

#[test]
fn tiny_function_dot() {
    insta::assert_snapshot!(to_dot(&tiny_function()));
}

fn four_layers() -> Module {
    little_module(4)
}

#[test]
fn summary_collapses_identical_layers() {
    let m = four_layers();
    let summary = print_module_summary(&m);
    // Layer 0 reads the embedding rather than a previous layer, so it is shown on its own;
    // layers 1..=3 are one run.
    assert_eq!(summary.matches("// layer 0\n").count(), 2, "{summary}");
    assert_eq!(
        summary
            .matches("// layers 1..=3: 3 layers identical up to the layer index; layer 1 shown")
            .count(),
        2,
        "{summary}"
    );
    assert!(!summary.contains("model.layers.2."), "{summary}");
    assert!(!summary.contains("model.layers.3."), "{summary}");
    // The histogram counts every node of the function, collapsed or not.
    let f = m.function("prefill").unwrap();
    let n = f.graph.node_count();
    assert!(
        summary.contains(&format!("// @prefill op histogram ({n} nodes):")),
        "{summary}"
    );
    let cache_updates = 3 * 4;
    assert!(
        summary.contains(&format!("//   cache.update           {cache_updates}\n")),
        "{summary}"
    );
    insta::assert_snapshot!(summary);
}

#[test]
fn summary_keeps_a_layer_that_differs() {
    // Make layer 2 differ (another norm eps): the run breaks around it.
    let mut m = four_layers();
    for f in &mut m.functions {
        let n = node(f, "model.layers.2.input_layernorm");
        f.graph[n].op = glmc_ir::Op::RmsNorm { eps: 1e-6 };
    }
    let summary = print_module_summary(&m);
    assert!(summary.contains("  // layer 1\n"), "{summary}");
    assert!(summary.contains("  // layer 2\n"), "{summary}");
    assert!(summary.contains("  // layer 3\n"), "{summary}");
    assert!(!summary.contains("// layers"), "{summary}");
}

#[test]
fn dot_marks_outputs_of_multi_output_nodes() {
    let m = little_module(1);
    let f = m.function("prefill").unwrap();
    let dot = to_dot(f);
    let ids = f.canonical_ids();
    let route = ids[&node(f, "model.layers.0.mlp.route")];
    let experts = ids[&node(f, "model.layers.0.mlp.experts")];
    assert!(
        dot.contains(&format!("  n{route} -> n{experts} [label=\"1\"];\n")),
        "{dot}"
    );
    assert!(
        dot.contains(&format!("  n{route} -> n{experts} [label=\"2 #1\"];\n")),
        "{dot}"
    );
    // One box per node, one edge per operand, one oval per result.
    assert_eq!(dot.matches("[label=\"%").count(), f.graph.node_count());
    assert_eq!(dot.matches(" -> n").count(), f.graph.edge_count(), "{dot}");
    assert_eq!(dot.matches("[shape=oval]").count(), f.results.len());
}
