//! `glmc bench` without a GPU: its flags, the checks it makes before touching a GPU (each exits
//! 2 naming the flag and the fix), and the results renderer of bench/ on the committed schema
//! fixture.

mod common;

use std::process::Command;

use common::{assert_no_panic, glmc, repo_path, stderr_of, stdout_of};

/// `glmc bench ARGS` fails with exit 2 and a one-paragraph message containing `needle`.
fn fails_with(args: &[&str], needle: &str) {
    let mut all = vec!["bench"];
    all.extend_from_slice(args);
    let o = glmc(&all);
    let stderr = stderr_of(&o);
    let what = format!("glmc {}", all.join(" "));
    assert_no_panic(&stderr, &what);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{what}: exit 2 expected\n{stderr}"
    );
    assert!(
        stderr.contains(needle),
        "{what}: stderr should say {needle:?}:\n{stderr}"
    );
    assert!(stdout_of(&o).is_empty(), "{what}: nothing on stdout");
}

#[test]
fn bench_help_lists_its_flags() {
    let o = glmc(&["bench", "--help"]);
    assert!(o.status.success());
    let help = stdout_of(&o);
    for flag in [
        "--device",
        "--random-weights",
        "--batch",
        "--context",
        "--prefill",
        "--attention",
        "--steps",
        "--json",
    ] {
        assert!(help.contains(flag), "bench --help lacks {flag}:\n{help}");
    }
}

/// This machine has no NVIDIA driver: the command gets as far as opening the GPU and says so.
#[test]
fn bench_without_a_gpu_exits_2_saying_so() {
    fails_with(
        &[
            "models/glm5-slice.ron",
            "--device",
            "cuda",
            "--random-weights",
            "1",
        ],
        "glmc bench measures a GPU and found no NVIDIA driver",
    );
}

#[test]
fn bench_refuses_the_cpu() {
    fails_with(
        &[
            "models/tiny-sparse.ron",
            "--device",
            "cpu",
            "--random-weights",
            "1",
        ],
        "pass --device cuda",
    );
}

#[test]
fn bench_refuses_bad_lists_before_touching_a_gpu() {
    let model = "models/glm5-slice.ron";
    fails_with(
        &[model, "--random-weights", "1", "--batch", "1,0,8"],
        "--batch 0: a decode step holds at least one sequence",
    );
    fails_with(
        &[model, "--random-weights", "1", "--context", "0"],
        "--context 0",
    );
    fails_with(
        &[model, "--random-weights", "1", "--context", "1024,300000"],
        "--context 300000 is past the model's 202752 positions",
    );
    fails_with(
        &[model, "--random-weights", "1", "--prefill", "300000"],
        "--prefill 300000 is past the model's 202752 positions",
    );
    fails_with(
        &[model, "--random-weights", "1", "--steps", "0"],
        "--steps 0",
    );
    fails_with(
        &[model, "--random-weights", "1", "--prefill-steps", "0"],
        "--prefill-steps 0",
    );
    fails_with(&[model, "--random-weights", "1", "--batch", "1,x"], "'x'");
    fails_with(
        &[model, "--random-weights", "1", "--attention", "sparse,fast"],
        "'fast'",
    );
}

#[test]
fn bench_of_a_model_ron_needs_weights() {
    fails_with(
        &["models/glm5-slice.ron"],
        "a model.ron carries no weights; pass --weights DIR",
    );
}

/// bench/render.py (merge the JSON files, write RESULTS.md) passes its unit tests on the
/// committed schema fixture. Python's standard library only: CI needs no extra package.
#[test]
fn the_results_renderer_passes_its_tests() {
    let o = Command::new("python3")
        .arg(repo_path("bench/test_render.py"))
        .current_dir(repo_path("bench"))
        .output()
        .expect("python3 runs (scripts/cuda-toolchain.sh needs it too)");
    assert!(
        o.status.success(),
        "bench/test_render.py failed:\n{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}
