//! GLM-5-sized runs on the GPU (issue 11), driven through the `glmc` binary the way a user runs
//! it, on random weights: `models/glm5-2layer.ron` (real dimensions, one dense and one MoE
//! layer, f32) against the interpreter on the GPU host's CPU, and `models/glm5-slice.ron` (four
//! layers, bf16) through a long prefill and many decode steps. Run by `scripts/gpu-test.sh`.

mod common_oracle;

use std::path::Path;

use common_oracle::{glmc, glmc_run, repo_root, row_errors};

/// The f32 tolerance of the oracle tests: max |GPU − CPU| / max |CPU| per logits row.
const F32_TOL: f64 = 1e-4;
/// bf16 against f32, per traced value (compare-trace's relative difference), while the two runs
/// make the same top-k picks: the oracle's bound for bf16 logits (`BF16_TOL` in tests/oracle.rs).
const BF16_RTOL: &str = "3e-2";

/// `n` token ids spread over GLM-5's vocabulary (a fixed pseudo-random walk, so every run of the
/// test feeds the same prompt).
fn prompt(n: usize) -> String {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 154_880).to_string()
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn model(file: &str) -> String {
    repo_root()
        .join("models")
        .join(file)
        .to_str()
        .expect("a UTF-8 path")
        .to_string()
}

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
/// interpreter's within 1e-4 at every position, with the same greedy tokens; and the bf16 GPU
/// run's trace of the prompt lines up with the interpreter's f32 trace up to the first top-k
/// decision that differs (compare-trace at the bf16 tolerance either finds no divergence, or
/// finds a top-k decision first; the interpreter's decode steps have no counterpart there).
#[test]
#[ignore = "gpu"]
fn glm5_2layer_on_the_gpu_matches_the_interpreter() {
    let model = model("glm5-2layer.ron");
    let prompt = prompt(64);
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let (cpu_trace, bf16_trace) = (tmp.path().join("cpu.trace"), tmp.path().join("bf16.trace"));
    let args = ["--prompt-ids", prompt.as_str(), "--random-weights", "11"];
    let cpu = glmc_run(
        Path::new(&model),
        4,
        &[&args[..], &["--trace", cpu_trace.to_str().unwrap()]].concat(),
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

    traced(
        &model,
        &prompt,
        &bf16_trace,
        &["--device", "cuda", "--dtype", "bf16"],
    );
    let out = glmc(&[
        "compare-trace",
        cpu_trace.to_str().unwrap(),
        bf16_trace.to_str().unwrap(),
        "--rtol",
        BF16_RTOL,
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    println!("glm5-2layer, interpreter f32 vs cuda bf16 trace:\n{text}");
    match out.status.code() {
        Some(0) => {}
        Some(1) => assert!(
            text.contains("top-k decision that differs: here"),
            "a value diverged past {BF16_RTOL} before any top-k decision differed:\n{text}"
        ),
        _ => panic!(
            "compare-trace failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// `glm5-slice` (bf16, four layers at GLM-5's size, ~64 GB of random weights made on the GPU):
/// an 8192-token prefill and 256 decode steps, every node's output finite (`--check-finite`
/// stops at the first that is not, naming it), 256 tokens generated.
#[test]
#[ignore = "gpu"]
fn glm5_slice_runs_an_8k_prefill_and_256_decode_steps_with_finite_outputs() {
    let model = model("glm5-slice.ron");
    let prompt = prompt(8192);
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
