//! `glmc run --trace`, `--check-finite` and `glmc compare-trace` on a committed oracle
//! checkpoint, on the CPU and (the `gpu` tests, run by scripts/gpu-test.sh) across devices.

mod common_oracle;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common_oracle::repo_root;
use glmc_codegen::artifact::Manifest;
use glmc_codegen::schedule::Step;
use glmc_ir::Shard;
use glmc_models::ModelConfig;
use glmc_runtime::trace::{read_trace, Fault, TraceEntry};

const PROMPT: &str = "5,9,200,17,3,3,41,7,99,12";

/// `glmc ARGS` (the binary cargo built, or `$GLMC_BIN` on the GPU machine) with `env` set.
fn glmc_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let bin = std::env::var_os("GLMC_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_glmc")));
    Command::new(bin)
        .args(args)
        .current_dir(repo_root())
        .env_remove(Fault::ENV)
        .envs(env.iter().copied())
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("glmc runs")
}

fn glmc(args: &[&str]) -> Output {
    glmc_env(args, &[])
}

fn fixture(case: &str) -> PathBuf {
    repo_root().join("tests/oracle/fixtures").join(case)
}

fn succeeded(out: &Output) -> String {
    assert!(
        out.status.success(),
        "glmc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// `glmc run MODEL` of the sparse fixture's prompt and three new tokens, traced to `dir/name`.
fn traced(model: &Path, dir: &Path, name: &str, extra: &[&str], env: &[(&str, &str)]) -> PathBuf {
    let trace = dir.join(name);
    let mut args = vec![
        "run",
        model.to_str().unwrap(),
        "--prompt-ids",
        PROMPT,
        "--max-new-tokens",
        "3",
        "--trace",
        trace.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    succeeded(&glmc_env(&args, env));
    trace
}

fn traced_run(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    traced(&fixture("sparse"), dir, name, extra, &[])
}

/// `glmc compare-trace A B EXTRA…`: its exit code and stdout.
fn compare(a: &Path, b: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let out = glmc(
        &[
            &["compare-trace", a.to_str().unwrap(), b.to_str().unwrap()],
            extra,
        ]
        .concat(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).to_string() + &stderr,
    )
}

fn first_divergence(stdout: &str) -> &str {
    stdout
        .lines()
        .find(|l| l.starts_with("first divergence:"))
        .unwrap_or_else(|| panic!("the traces part: {stdout}"))
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
    let (code, stdout) = compare(&a, &b, &[]);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(stdout.contains("no divergence beyond rtol"), "{stdout}");
    let words: Vec<&str> = stdout.split_whitespace().collect();
    let compared: usize = words[1].parse().unwrap();
    let nodes: usize = words[4].parse().unwrap();
    assert!(compared > 500 && nodes > 50, "{stdout}");
}

/// Dense attention on a sparse-trained model parts from it first at the attention of a query
/// whose context exceeds index_topk (8 in this checkpoint).
#[test]
fn compare_trace_names_where_dense_attention_parts_from_sparse() {
    let dir = tempfile::tempdir().unwrap();
    let sparse = traced_run(dir.path(), "sparse.jsonl", &[]);
    let dense = traced_run(dir.path(), "dense.jsonl", &["--attention", "dense"]);
    let (code, stdout) = compare(&sparse, &dense, &[]);
    assert_eq!(code, Some(1), "the traces part, as cmp says: {stdout}");
    let line = first_divergence(&stdout);
    assert!(
        line.contains("prefill@0 node \"model.layers.0.self_attn.attn\" ("),
        "{stdout}"
    );
    assert!(line.contains("output 0 position 8:"), "{stdout}");
    // Dense attention has no indexer top-k to compare; the first router choice that differs
    // comes a layer later.
    assert!(
        stdout.contains(
            "top-k decision that differs: only later, at prefill@0 node \"model.layers.1.mlp.router\" (moe.route, layer 1) output 1"
        ),
        "{stdout}"
    );
}

/// The negative control of the CPU side of the test hook: a node broken in one run is the
/// first divergence, named with its layer, and every node before it agrees.
#[test]
fn compare_trace_names_a_broken_node() {
    let dir = tempfile::tempdir().unwrap();
    let node = "model.layers.1.self_attn.o_proj";
    let good = traced_run(dir.path(), "good.jsonl", &[]);
    let bad = traced(
        &fixture("sparse"),
        dir.path(),
        "bad.jsonl",
        &[],
        &[(Fault::ENV, node)],
    );
    let (code, stdout) = compare(&good, &bad, &["--rtol", "1e-4"]);
    assert_eq!(code, Some(1), "{stdout}");
    let line = first_divergence(&stdout);
    assert!(
        line.contains(&format!(
            "prefill@0 node \"{node}\" (matmul, layer 1) output 0"
        )),
        "{stdout}"
    );
}

/// A top-k decision that differs is reported as such.
#[test]
fn compare_trace_says_when_a_top_k_decision_differs() {
    let dir = tempfile::tempdir().unwrap();
    let good = traced_run(dir.path(), "good.jsonl", &[]);
    let mut entries = read_trace(&good).unwrap();
    let topk = entries
        .iter()
        .position(|e| e.op == "dsa.topk" && e.position == Some(9))
        .expect("the sparse fixture selects keys");
    entries[topk].first[0] += 1.0;
    let flipped = dir.path().join("flipped.jsonl");
    write_trace(&flipped, &entries);
    let (code, stdout) = compare(&good, &flipped, &[]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        first_divergence(&stdout).contains("(dsa.topk, layer 0)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("top-k decision that differs: here"),
        "{stdout}"
    );
}

fn write_trace(path: &Path, entries: &[TraceEntry]) {
    let lines: Vec<String> = entries
        .iter()
        .map(|e| serde_json::to_string(e).unwrap())
        .collect();
    std::fs::write(path, lines.join("\n")).unwrap();
}

/// Bad input exits 2 with a message naming the file, as `cmp` does, never 1.
#[test]
fn compare_trace_exits_2_on_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let good = traced_run(dir.path(), "good.jsonl", &[]);
    let missing = dir.path().join("missing.jsonl");
    let (code, text) = compare(&good, &missing, &[]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("missing.jsonl"), "{text}");

    let garbage = dir.path().join("garbage.jsonl");
    std::fs::write(&garbage, "{\"call\": 3}\n").unwrap();
    let (code, text) = compare(&good, &garbage, &[]);
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("garbage.jsonl:1: not a glmc trace line"),
        "{text}"
    );

    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let (code, text) = compare(&good, &empty, &[]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("no record in common"), "{text}");

    let (code, text) = compare(&good, &good, &["--rtol=-1"]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("--rtol -1"), "{text}");
}

/// `run --tp N --trace` records every rank, each entry tagged with its rank; `compare-trace`
/// lines each rank up with the TP=1 trace: replicated values and the whole values after each
/// all_reduce and all_gather in full, a rank's block of a split value (heads, intermediate
/// columns, vocabulary) against the same blocks of the single-device value.
#[test]
fn rank_traces_line_up_with_the_single_device_trace() {
    let dir = tempfile::tempdir().unwrap();
    for (case, tp) in [("sparse", "2"), ("six-heads", "3")] {
        let one = traced(
            &fixture(case),
            dir.path(),
            &format!("{case}1.jsonl"),
            &[],
            &[],
        );
        let ranks = traced(
            &fixture(case),
            dir.path(),
            &format!("{case}{tp}.jsonl"),
            &["--tp", tp],
            &[],
        );
        let entries = read_trace(&ranks).unwrap();
        let degree: u64 = tp.parse().unwrap();
        let seen: HashSet<u64> = entries.iter().filter_map(|e| e.rank).collect();
        assert_eq!(seen, (0..degree).collect(), "{case}: every rank is traced");
        let attn = entries
            .iter()
            .find(|e| e.node == "model.layers.0.self_attn.attn" && e.rank == Some(1))
            .expect("rank 1's attention");
        assert_eq!(attn.shard, Some(Shard::Split { axis: 1 }), "{case}");
        let (code, stdout) = compare(&one, &ranks, &["--rtol", "1e-5"]);
        assert_eq!(code, Some(0), "{case} TP={tp}: {stdout}");
        assert!(
            stdout.contains(&format!(
                "against each of B's {tp} ranks (0 of A have no counterpart in B)"
            )) && stdout.contains("as partial sums")
                && stdout.contains("no divergence beyond rtol 0.00001"),
            "{case} TP={tp}: {stdout}"
        );
    }
}

/// The negative control: rank 1 of 2 holds its two heads of W_UV (from kv_b_proj) in the wrong
/// order. The first divergence is the node that reads them, on rank 1, at its first head's
/// block of the single-device value; every node before it agrees on both ranks.
#[test]
fn compare_trace_names_a_wrong_shard_at_its_node_and_rank() {
    let dir = tempfile::tempdir().unwrap();
    let one = traced_run(dir.path(), "tp1.jsonl", &[]);
    let fault = "model.layers.0.self_attn.kv_b_proj.weight:uv@1=swap";
    let bad = traced(
        &fixture("sparse"),
        dir.path(),
        "bad.jsonl",
        &["--tp", "2"],
        &[(Fault::ENV, fault)],
    );
    let (code, stdout) = compare(&one, &bad, &["--rtol", "1e-5"]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        first_divergence(&stdout).contains(
            "prefill@0 rank 1 node \"model.layers.0.self_attn.attn\" (matmul.heads, layer 0) output 0 position 0: block 2 of the 4 along axis 1 (the rank holds blocks 2..4)"
        ),
        "{stdout}"
    );
}

/// Traces that cannot be lined up exit 2 naming why: the ranks' trace first, another prompt,
/// another model (six heads against four: the shapes of the blocks do not line up).
#[test]
fn rank_traces_of_another_run_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let one = traced_run(dir.path(), "tp1.jsonl", &[]);
    let two = traced_run(dir.path(), "tp2.jsonl", &["--tp", "2"]);
    let (code, text) = compare(&two, &one, &[]);
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains(
            "A is a trace of 2 tensor-parallel ranks; give the single-device (TP=1) trace first"
        ),
        "{text}"
    );

    let trace = dir.path().join("other-prompt.jsonl");
    let model = fixture("sparse");
    succeeded(&glmc(&[
        "run",
        model.to_str().unwrap(),
        "--prompt-ids",
        "5,9,200",
        "--max-new-tokens",
        "1",
        "--tp",
        "2",
        "--trace",
        trace.to_str().unwrap(),
    ]));
    let (code, text) = compare(&one, &trace, &[]);
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("the traces are of different prompts"),
        "{text}"
    );

    let six = traced(&fixture("six-heads"), dir.path(), "six.jsonl", &[], &[]);
    let (code, text) = compare(&six, &two, &[]);
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("node \"model.layers.0.self_attn.q_b_proj+rope\" output 0: A holds [10, 144], rank 0 of B [10, 48], which is not 1/2 of it along axis 1; were the traces made from the same model?"),
        "{text}"
    );
}

/// `--check-finite` passes a healthy run (the indexer's masked −inf scores are by design), and
/// stops at the first node that produces NaN, naming it with its layer and call.
#[test]
fn check_finite_names_the_first_non_finite_node() {
    check_finite_on("cpu");
}

/// A healthy `--check-finite` run of the sparse fixture on `device` passes; with a NaN injected
/// at layer 0's up_proj it must stop there with exit 2.
fn check_finite_on(device: &str) {
    let node = "model.layers.0.mlp.up_proj";
    let out = stopped_by_check_finite(
        &["--device", device],
        &format!("{node}=nan"),
        &format!("node \"{node}\" (slice, in layer 0) produced 1 non-finite value(s) in output 0"),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("during prefill@0"), "{device}: {stderr}");
    assert!(out.stdout.is_empty(), "no tokens after the stop");
}

/// Under tensor parallelism `--check-finite` checks every rank and names the one whose node
/// went non-finite: a NaN injected into rank 1's shard of layer 0's up_proj.
#[test]
fn check_finite_names_the_rank_of_a_tensor_parallel_run() {
    let node = "model.layers.0.mlp.up_proj";
    stopped_by_check_finite(
        &["--tp", "2"],
        &format!("{node}@1=nan"),
        &format!("node \"{node}\" (slice, in layer 0, on rank 1) produced"),
    );
}

/// `glmc run` of the sparse fixture with `--check-finite` and `extra` passes; with the fault
/// `fault` injected it exits 2 saying `named`. The faulty run's output.
fn stopped_by_check_finite(extra: &[&str], fault: &str, named: &str) -> Output {
    let model = fixture("sparse");
    let mut args = vec![
        "run",
        model.to_str().unwrap(),
        "--prompt-ids",
        PROMPT,
        "--max-new-tokens",
        "3",
        "--check-finite",
    ];
    args.extend_from_slice(extra);
    succeeded(&glmc(&args));
    let out = glmc_env(&args, &[(Fault::ENV, fault)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
    assert!(stderr.contains(named), "{extra:?}: {stderr}");
    out
}

/// The GPU's nvidia-smi compute capability as a glmc target: `sm90a` on an H200.
fn gpu_target() -> String {
    let out = Command::new("nvidia-smi")
        .args(["--query-gpu=compute_cap", "--format=csv,noheader"])
        .output()
        .expect("nvidia-smi runs on the GPU machine");
    let cap = String::from_utf8_lossy(&out.stdout);
    let cap = cap.lines().next().expect("one GPU").trim().replace('.', "");
    format!("sm{cap}a")
}

/// `glmc compile` of the sparse fixture for `target` into `dir/name`, and its manifest.
fn compile(dir: &Path, name: &str, target: &str) -> (PathBuf, Manifest<ModelConfig>) {
    let out_dir = dir.join(name);
    let model = fixture("sparse");
    succeeded(&glmc(&[
        "compile",
        model.to_str().unwrap(),
        "--target",
        target,
        "--max-prefill-tokens",
        "16",
        "--max-batch",
        "1",
        "--max-context",
        "32",
        "-o",
        out_dir.to_str().unwrap(),
    ]));
    let text = std::fs::read_to_string(out_dir.join("manifest.ron")).unwrap();
    let manifest = ron::from_str(&text).expect("manifest.ron parses");
    (out_dir, manifest)
}

/// The GPU runs the artifact of `glmc compile` (with the fixture's weights) and traces it: the
/// trace lines up with the interpreter's at 1e-4 (the fixture is f32, so every kernel runs in
/// f32), and every node the schedule launches a kernel for is compared, in both phases, in
/// every layer.
#[test]
#[ignore = "gpu"]
fn cuda_trace_lines_up_with_the_cpu_trace() {
    let dir = tempfile::tempdir().unwrap();
    let (artifact, manifest) = compile(dir.path(), "artifact", &gpu_target());
    let weights = fixture("sparse");
    let gpu_args = ["--device", "cuda", "--weights", weights.to_str().unwrap()];
    let cpu = traced_run(dir.path(), "cpu.jsonl", &[]);
    let gpu = traced(&artifact, dir.path(), "gpu.jsonl", &gpu_args, &[]);
    let (code, stdout) = compare(&cpu, &gpu, &["--rtol", "1e-4"]);
    println!("cpu vs cuda trace: {stdout}");
    assert_eq!(code, Some(0), "{stdout}");

    let nodes = |path: &Path| -> HashSet<(String, String)> {
        read_trace(path)
            .unwrap()
            .into_iter()
            .map(|e| (e.call.split('@').next().unwrap().to_string(), e.node))
            .collect()
    };
    let (cpu, gpu) = (nodes(&cpu), nodes(&gpu));
    let mut launched = 0;
    let mut layers = HashSet::new();
    for phase in &manifest.phases {
        for step in &phase.steps {
            let Step::Launch(l) = step else { continue };
            let key = (phase.function.clone(), l.node.clone());
            assert!(
                cpu.contains(&key) && gpu.contains(&key),
                "{} node \"{}\" ({}) is launched but not in both traces (cpu: {}, gpu: {})",
                phase.function,
                l.node,
                l.op,
                cpu.contains(&key),
                gpu.contains(&key)
            );
            launched += 1;
            layers.extend(glmc_runtime::trace::layer_of(&l.node));
        }
    }
    assert!(
        launched > 50 && layers.len() >= 2,
        "{launched} launches, layers {layers:?}"
    );
}

/// A deliberately broken kernel output on the GPU (the `GLMC_TEST_BREAK_NODE` hook) is named at
/// its node, and every node before it agrees with the interpreter.
#[test]
#[ignore = "gpu"]
fn compare_trace_names_a_broken_kernel_on_the_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let node = "model.layers.1.self_attn.o_proj";
    let cpu = traced_run(dir.path(), "cpu.jsonl", &[]);
    let gpu = traced(
        &fixture("sparse"),
        dir.path(),
        "gpu.jsonl",
        &["--device", "cuda"],
        &[(Fault::ENV, node)],
    );
    let (code, stdout) = compare(&cpu, &gpu, &["--rtol", "1e-4"]);
    println!("cpu vs broken cuda trace: {stdout}");
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        first_divergence(&stdout).contains(&format!(
            "prefill@0 node \"{node}\" (matmul, layer 1) output 0"
        )),
        "{stdout}"
    );
}

/// `--check-finite` on the GPU: a healthy run passes; a NaN injected after a kernel stops the
/// run at that node with exit 2.
#[test]
#[ignore = "gpu"]
fn check_finite_names_the_first_non_finite_node_on_the_gpu() {
    check_finite_on("cuda");
}

/// An artifact compiled for the other architecture is refused with the fix.
#[test]
#[ignore = "gpu"]
fn an_artifact_for_another_gpu_is_refused() {
    let here = gpu_target();
    let other = if here == "sm90a" { "sm120a" } else { "sm90a" };
    let dir = tempfile::tempdir().unwrap();
    let (artifact, manifest) = compile(dir.path(), "artifact", other);
    let weights = fixture("sparse");
    let out = glmc(&[
        "run",
        artifact.to_str().unwrap(),
        "--prompt-ids",
        PROMPT,
        "--max-new-tokens",
        "1",
        "--device",
        "cuda",
        "--weights",
        weights.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let gpu_arch = here.trim_end_matches('a').replace("sm", "sm_");
    assert!(
        stderr.contains(&format!(
            "the artifact is {}, this GPU is {gpu_arch}: recompile with --target {here}",
            manifest.arch
        )),
        "{stderr}"
    );
}

/// `run MODEL --device cuda` compiles its kernels once: a second run finds them in the cache
/// and calls nvcc only for its version.
#[test]
#[ignore = "gpu"]
fn a_second_cuda_run_does_not_call_nvcc() {
    let dir = tempfile::tempdir().unwrap();
    let real = std::env::var("GLMC_NVCC").unwrap_or_else(|_| {
        let out = Command::new("sh")
            .args(["-c", "command -v nvcc"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    });
    assert!(!real.is_empty(), "no nvcc on the GPU machine");
    let log = dir.path().join("nvcc.log");
    let wrapper = dir.path().join("nvcc");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\necho \"$@\" >> '{}'\nexec '{real}' \"$@\"\n",
            log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let cache = dir.path().join("cache");
    let model = fixture("sparse");
    let run = || {
        succeeded(&glmc_env(
            &[
                "run",
                model.to_str().unwrap(),
                "--prompt-ids",
                PROMPT,
                "--max-new-tokens",
                "2",
                "--device",
                "cuda",
                "--nvcc",
                wrapper.to_str().unwrap(),
            ],
            &[("GLMC_CACHE_DIR", cache.to_str().unwrap())],
        ))
    };
    let compiles = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.trim() != "--version")
            .count()
    };
    let first = run();
    let after_first = compiles();
    assert!(after_first > 0, "the first run compiles");
    assert_eq!(run(), first, "the same tokens");
    assert_eq!(compiles(), after_first, "the second run compiled again");
}
