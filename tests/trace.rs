//! `glmc run --trace` and `glmc compare-trace` on a committed oracle checkpoint.

use std::path::{Path, PathBuf};
use std::process::Command;

fn glmc(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_glmc"))
        .args(args)
        .output()
        .expect("glmc runs")
}

fn fixture(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/oracle/fixtures")
        .join(case)
}

fn traced_run(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let trace = dir.join(name);
    let model = fixture("sparse");
    let mut args = vec![
        model.to_str().unwrap(),
        "--prompt-ids",
        "5,9,200,17,3,3,41,7,99,12",
        "--max-new-tokens",
        "3",
    ];
    args.extend_from_slice(&["--trace", trace.to_str().unwrap()]);
    args.extend_from_slice(extra);
    let out = glmc(&[&["run"], &args[..]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    trace
}

#[test]
fn trace_records_every_named_intermediate_per_position() {
    let dir = tempfile::tempdir().unwrap();
    let trace = traced_run(dir.path(), "t.jsonl", &[]);
    let entries = glmc_runtime::trace::read_trace(&trace).unwrap();
    let attn: Vec<_> = entries
        .iter()
        .filter(|e| e.node == "model.layers.0.self_attn.attn")
        .collect();
    // Ten prompt positions in the prefill, then one per decode step (three generated tokens).
    let positions: Vec<_> = attn.iter().map(|e| (e.call.as_str(), e.position)).collect();
    let mut expected: Vec<(&str, Option<usize>)> =
        (0..10).map(|p| ("prefill@0", Some(p))).collect();
    expected.extend([
        ("decode@10", Some(10)),
        ("decode@11", Some(11)),
        ("decode@12", Some(12)),
    ]);
    assert_eq!(positions, expected);
    assert!(attn.iter().all(|e| e.l2 > 0.0 && e.first.len() == 4));
    assert!(entries.iter().all(|e| e.op != "weight" && e.op != "input"));
}

/// Passes keep HF module names, so a trace of the optimised graph lines up with one of the
/// builder's graph and the two agree node by node.
#[test]
fn optimised_and_unoptimised_traces_agree() {
    let dir = tempfile::tempdir().unwrap();
    let a = traced_run(dir.path(), "o0.jsonl", &["-O0"]);
    let b = traced_run(dir.path(), "o1.jsonl", &[]);
    let out = glmc(&["compare-trace", a.to_str().unwrap(), b.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("no divergence beyond rtol"), "{stdout}");
    let compared: usize = stdout.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(compared > 500, "{stdout}");
}

/// Dense attention on a sparse-trained model parts from it first at the attention of a query
/// whose context exceeds index_topk (8 in this checkpoint).
#[test]
fn compare_trace_names_where_dense_attention_parts_from_sparse() {
    let dir = tempfile::tempdir().unwrap();
    let sparse = traced_run(dir.path(), "sparse.jsonl", &[]);
    let dense = traced_run(dir.path(), "dense.jsonl", &["--attention", "dense"]);
    let out = glmc(&[
        "compare-trace",
        sparse.to_str().unwrap(),
        dense.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    let line = stdout
        .lines()
        .find(|l| l.starts_with("first divergence:"))
        .expect("the traces part");
    assert!(
        line.contains("prefill@0 node \"model.layers.0.self_attn.attn\" ("),
        "{stdout}"
    );
    assert!(line.contains("output 0 position 8:"), "{stdout}");
}
