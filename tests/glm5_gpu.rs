//! GLM-5-sized runs on the GPU (issue 11), driven through the `glmc` binary the way a user runs
//! it, on random weights: `models/glm5-2layer.ron` (real dimensions, one dense and one MoE
//! layer, f32) against the interpreter on the GPU host's CPU, and `models/glm5-slice.ron` (four
//! layers, bf16) through a long prefill and many decode steps. Run by `scripts/gpu-test.sh`.

mod common_oracle;

use std::collections::HashMap;
use std::path::Path;

use common_oracle::{glmc, glmc_run, model_file, row_errors, walk_prompt, GLM5_VOCAB};
use glmc_runtime::trace::{difference, read_trace, TraceEntry};

/// The f32 tolerance of the oracle tests: max |GPU − CPU| / max |CPU| per logits row.
const F32_TOL: f64 = 1e-4;

/// `glmc run MODEL --random-weights 11 --prompt-ids P --max-new-tokens 0 --trace FILE EXTRA…`:
/// the prompt's prefill alone.
fn traced(model: &str, prompt: &str, trace: &Path, extra: &[&str]) {
    let mut args = vec![
        "run",
        model,
        "--random-weights",
        "11",
        "--prompt-ids",
        prompt,
        "--max-new-tokens",
        "0",
        "--trace",
        trace.to_str().expect("a UTF-8 path"),
    ];
    args.extend_from_slice(extra);
    let out = glmc(&args);
    assert!(
        out.status.success(),
        "glmc run {extra:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// GLM-5's real dimensions in f32 (`glm5-2layer`, 64-token prompt): the GPU's logits match the
/// interpreter's within 1e-4 at every position, with the same greedy tokens. In bf16, the GPU
/// run's trace of the prompt strays from the interpreter's f32 trace, node by node until the
/// first top-k decision that differs, no further than [`BF16_SPREAD`] times what the
/// interpreter's own bf16 run (bf16 weights, values held in f32) strays there.
///
/// Why a measured bound and not one tolerance: at these widths bf16 rounding of the weights
/// alone moves the interpreter's values by up to 2.6e-2 of a typical element at the attention
/// output and 1e-1 after the dense MLP's SiLU·mul (compare-trace's measure; a one-layer cut of
/// this model on the CPU, 2026-12-01, tests/gpu/README.md), so a fixed 3e-2 failed the
/// interpreter against itself; a wrong kernel parts by O(1), far past the bound.
#[test]
#[ignore = "gpu"]
fn glm5_2layer_on_the_gpu_matches_the_interpreter() {
    let model = model_file("glm5-2layer.ron");
    let prompt = walk_prompt(64, GLM5_VOCAB);
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let trace = |name: &str| tmp.path().join(format!("{name}.trace"));
    let args = ["--prompt-ids", prompt.as_str(), "--random-weights", "11"];
    let cpu = glmc_run(
        Path::new(&model),
        4,
        &[&args[..], &["--trace", trace("f32").to_str().unwrap()]].concat(),
    );
    let cuda = glmc_run(
        Path::new(&model),
        4,
        &[&args[..], &["--device", "cuda"]].concat(),
    );
    let rows = cpu.dump.logits.rows;
    assert_eq!(cuda.dump.logits.rows, rows);
    let e = row_errors(&cuda.dump.logits, &cpu.dump.logits, rows);
    println!(
        "glm5-2layer f32, --device cuda vs the interpreter, {rows} rows: {}",
        e.summary()
    );
    assert!(e.rows_over(F32_TOL).is_empty(), "{}", e.summary());
    assert_eq!(cuda.dump.generated, cpu.dump.generated);

    traced(&model, &prompt, &trace("cpu-bf16"), &["--dtype", "bf16"]);
    traced(
        &model,
        &prompt,
        &trace("cuda-bf16"),
        &["--device", "cuda", "--dtype", "bf16"],
    );
    let read = |name: &str| read_trace(&trace(name)).expect("a trace the run wrote");
    let spread = bf16_spread(&read("f32"), &read("cpu-bf16"), &read("cuda-bf16"));
    println!("glm5-2layer bf16 against the interpreter's f32, per node before the first top-k difference:");
    println!("| node | interpreter bf16 | cuda bf16 |\n|---|---|---|");
    for (node, reference, gpu) in &spread {
        println!("| {node} | {reference:.2e} | {gpu:.2e} |");
    }
    assert!(
        spread.len() > 20,
        "too few nodes before the first top-k difference: {spread:?}"
    );
    let over: Vec<_> = spread
        .iter()
        .filter(|(_, reference, gpu)| *gpu > BF16_SPREAD * reference.max(BF16_ULP))
        .collect();
    assert!(
        over.is_empty(),
        "the GPU's bf16 run strays past {BF16_SPREAD}× the interpreter's: {over:?}"
    );
}

/// How far the GPU's bf16 trace may stray from the f32 reference, as a multiple of how far the
/// interpreter's bf16 run strays: the GPU also rounds every value it stores to bf16, a second
/// rounding of the same size as the weights' (about √2 of the spread), and a kernel defect
/// moves values by O(1).
const BF16_SPREAD: f64 = 3.0;
/// A spread below bf16's own rounding (2^-8 relative) is judged against that.
const BF16_ULP: f64 = 1.0 / 256.0;

/// Per node of `reference` (in execution order), the largest difference from it of `a` and of
/// `b` (`trace::difference`), over the entries before either run's first top-k decision that
/// differs from the reference's.
fn bf16_spread(
    reference: &[TraceEntry],
    a: &[TraceEntry],
    b: &[TraceEntry],
) -> Vec<(String, f64, f64)> {
    let key = |e: &TraceEntry| (e.call.clone(), e.node.clone(), e.output, e.position);
    let index = |t: &[TraceEntry]| -> HashMap<_, TraceEntry> {
        t.iter().map(|e| (key(e), e.clone())).collect()
    };
    let (a, b) = (index(a), index(b));
    let mut spread: Vec<(String, f64, f64)> = Vec::new();
    for e in reference {
        let (Some(ea), Some(eb)) = (a.get(&key(e)), b.get(&key(e))) else {
            continue;
        };
        let (da, db) = (difference(e, ea), difference(e, eb));
        if e.is_topk() {
            if da > 0.0 || db > 0.0 {
                break;
            }
            continue;
        }
        match spread.last_mut() {
            Some((node, worst_a, worst_b)) if *node == e.node => {
                *worst_a = worst_a.max(da);
                *worst_b = worst_b.max(db);
            }
            _ => spread.push((e.node.clone(), da, db)),
        }
    }
    spread
}

/// `glm5-slice` (bf16, four layers at GLM-5's size, ~64 GB of random weights made on the GPU):
/// an 8192-token prefill and 256 decode steps, every node's output finite (`--check-finite`
/// stops at the first that is not, naming it), 256 tokens generated.
#[test]
#[ignore = "gpu"]
fn glm5_slice_runs_an_8k_prefill_and_256_decode_steps_with_finite_outputs() {
    let model = model_file("glm5-slice.ron");
    let prompt = walk_prompt(8192, GLM5_VOCAB);
    let started = std::time::Instant::now();
    let out = glmc(&[
        "run",
        &model,
        "--random-weights",
        "5",
        "--device",
        "cuda",
        "--prompt-ids",
        &prompt,
        "--max-new-tokens",
        "256",
        "--check-finite",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "glmc run: {stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let generated: Vec<u64> = stdout
        .split_whitespace()
        .map(|t| t.parse().expect("token ids"))
        .collect();
    println!(
        "glm5-slice, 8192-token prefill + up to 256 decode steps with --check-finite: {} tokens in {:.1} s (compile, weights and per-node read-backs included)",
        generated.len(),
        started.elapsed().as_secs_f64()
    );
    // Generation stops early only at one of the model's end-of-sequence ids.
    const EOS: [u64; 3] = [154_820, 154_827, 154_829];
    let early = generated.len() < 256 && generated.last().is_some_and(|t| EOS.contains(t));
    assert!(generated.len() == 256 || early, "stdout: {stdout}");
}
