//! `glmc run`: stopping at EOS, sampling, and bad input (exit 2, a message naming the file or
//! tensor, never a panic), on copies of a committed oracle checkpoint.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn glmc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_glmc"))
        .args(args)
        .output()
        .expect("glmc runs")
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/fixtures/sparse")
}

/// A writable copy of the `sparse` checkpoint.
fn copy_fixture(dir: &Path) -> PathBuf {
    let to = dir.join("ckpt");
    fs::create_dir(&to).unwrap();
    for entry in fs::read_dir(fixture()).unwrap() {
        let entry = entry.unwrap();
        fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
    to
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "glmc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn failure(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

const PROMPT: &str = "5,9,200,17,3,3,41,7,99,12";

#[test]
fn generation_stops_after_an_eos_id_of_generation_config() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixture();
    let all = stdout(&glmc(&[
        "run",
        model.to_str().unwrap(),
        "--prompt-ids",
        PROMPT,
        "--max-new-tokens",
        "6",
    ]));
    let ids: Vec<&str> = all.split_whitespace().collect();
    assert_eq!(ids.len(), 6);
    // Make the third generated token an end-of-sequence id, next to an unrelated one.
    let ckpt = copy_fixture(dir.path());
    let config = format!("{{\"eos_token_id\": [255, {}]}}", ids[2]);
    fs::write(ckpt.join("generation_config.json"), config).unwrap();
    let stopped = stdout(&glmc(&[
        "run",
        ckpt.to_str().unwrap(),
        "--prompt-ids",
        PROMPT,
        "--max-new-tokens",
        "6",
    ]));
    assert_eq!(stopped, ids[..3].join(" "));
}

#[test]
fn sampling_is_reproducible_from_the_seed() {
    let model = fixture();
    let sample = |seed: &str| {
        stdout(&glmc(&[
            "run",
            model.to_str().unwrap(),
            "--prompt-ids",
            PROMPT,
            "--max-new-tokens",
            "12",
            "--temperature",
            "1.5",
            "--top-p",
            "0.95",
            "--seed",
            seed,
        ]))
    };
    let greedy = stdout(&glmc(&[
        "run",
        model.to_str().unwrap(),
        "--prompt-ids",
        PROMPT,
        "--max-new-tokens",
        "12",
    ]));
    assert_eq!(sample("7"), sample("7"));
    let draws: Vec<String> = ["1", "2", "3"].iter().map(|s| sample(s)).collect();
    assert!(
        draws.iter().any(|d| *d != greedy),
        "sampling at temperature 1.5 never left the greedy path: {draws:?}"
    );
    let bad = failure(&glmc(&[
        "run",
        model.to_str().unwrap(),
        "--prompt-ids",
        PROMPT,
        "--top-p",
        "0",
    ]));
    assert!(bad.contains("--top-p must be in (0, 1]"), "{bad}");
}

#[test]
fn a_truncated_checkpoint_is_named_before_any_compute() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = copy_fixture(dir.path());
    let weights = ckpt.join("model.safetensors");
    let bytes = fs::read(&weights).unwrap();
    fs::write(&weights, &bytes[..bytes.len() - 100]).unwrap();
    let err = failure(&glmc(&[
        "run",
        ckpt.to_str().unwrap(),
        "--prompt-ids",
        PROMPT,
    ]));
    assert!(
        err.contains("model.safetensors") && err.contains("truncated"),
        "{err}"
    );
}

#[test]
fn a_missing_tensor_is_named_with_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = copy_fixture(dir.path());
    // The weights of another fixture lack the dense MLP of layer 0 that this config asks for.
    let other = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/oracle/fixtures/no-dense/model.safetensors");
    fs::copy(other, ckpt.join("model.safetensors")).unwrap();
    let err = failure(&glmc(&[
        "run",
        ckpt.to_str().unwrap(),
        "--prompt-ids",
        PROMPT,
    ]));
    assert!(
        err.contains("\"model.layers.0.mlp.gate_proj.weight\" is not in the checkpoint"),
        "{err}"
    );
}

#[test]
fn bad_prompts_and_missing_weights_are_user_errors() {
    let model = fixture();
    let m = model.to_str().unwrap();
    let out_of_vocab = failure(&glmc(&["run", m, "--prompt-ids", "3,256"]));
    assert!(
        out_of_vocab.contains("token id 256 is outside the vocabulary (0..256)"),
        "{out_of_vocab}"
    );
    let no_prompt = failure(&glmc(&["run", m]));
    assert!(no_prompt.contains("--prompt-ids"), "{no_prompt}");
    let ron = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tiny-sparse.ron");
    let no_weights = failure(&glmc(&[
        "run",
        ron.to_str().unwrap(),
        "--prompt-ids",
        "1,2",
    ]));
    assert!(no_weights.contains("pass --weights DIR"), "{no_weights}");
    let tokenizerless =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/fixtures/no-dense");
    let no_tokenizer = failure(&glmc(&[
        "run",
        tokenizerless.to_str().unwrap(),
        "--prompt",
        "hello",
    ]));
    assert!(no_tokenizer.contains("no tokenizer.json"), "{no_tokenizer}");
}

#[test]
fn time_passes_lists_every_pass_in_pipeline_order() {
    let dir = tempfile::tempdir().unwrap();
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tiny-sparse.ron");
    let out_dir = dir.path().join("out");
    let out = glmc(&[
        "compile",
        model.to_str().unwrap(),
        "--target",
        "sm120",
        "-o",
        out_dir.to_str().unwrap(),
        "--time-passes",
    ]);
    stdout(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let listed: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(" ms  "))
        .map(|l| l.split_whitespace().nth(2).unwrap())
        .collect();
    assert_eq!(listed, glmc_passes::PIPELINE);
    assert!(!fs::read_to_string(out_dir.join("manifest.ron"))
        .unwrap()
        .contains(" ms"));
}

/// `--device cuda` where there is no NVIDIA driver (CI) exits 2 and says so, before compiling
/// anything.
#[test]
fn cuda_without_a_driver_says_so() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        return; // a GPU machine: the GPU tests cover --device cuda there
    }
    let out = glmc(&[
        "run",
        "tests/oracle/fixtures/sparse",
        "--prompt-ids",
        "3,17",
        "--max-new-tokens",
        "1",
        "--device",
        "cuda",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no NVIDIA driver") && stderr.contains("--device cpu"),
        "{stderr}"
    );
}

/// `--no-cuda-graphs` without `--device cuda` is refused with exit 2, naming the flag.
#[test]
fn no_cuda_graphs_needs_the_gpu() {
    let out = glmc(&[
        "run",
        "tests/oracle/fixtures/sparse",
        "--prompt-ids",
        "3,17",
        "--no-cuda-graphs",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--no-cuda-graphs") && stderr.contains("--device cuda"),
        "{stderr}"
    );
}

fn tiny_sparse() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("models/tiny-sparse.ron")
        .to_str()
        .unwrap()
        .to_string()
}

/// `glmc run MODEL --random-weights SEED --dump-logits` on the CPU: the printed ids and the
/// dump's bytes.
fn random_run(model: &str, seed: &str, dump: &Path) -> (String, Vec<u8>) {
    let ids = stdout(&glmc(&[
        "run",
        model,
        "--random-weights",
        seed,
        "--prompt-ids",
        PROMPT,
        "--max-new-tokens",
        "5",
        "--dump-logits",
        dump.to_str().unwrap(),
    ]));
    (ids, fs::read(dump).unwrap())
}

#[test]
fn random_weights_run_a_model_ron_without_a_checkpoint_identically_twice() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_sparse();
    let (ids, dump) = random_run(&model, "7", &dir.path().join("a.safetensors"));
    assert!(!ids.is_empty(), "no tokens generated");
    let again = random_run(&model, "7", &dir.path().join("b.safetensors"));
    assert_eq!((ids.clone(), dump.clone()), again);
    let other = random_run(&model, "8", &dir.path().join("c.safetensors"));
    assert_ne!(dump, other.1, "seeds 7 and 8 gave the same logits");
}

#[test]
fn random_weights_ignore_the_checkpoint_of_a_model_directory() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = copy_fixture(dir.path());
    let with = random_run(
        ckpt.to_str().unwrap(),
        "7",
        &dir.path().join("a.safetensors"),
    );
    fs::remove_file(ckpt.join("model.safetensors")).unwrap();
    let without = random_run(
        ckpt.to_str().unwrap(),
        "7",
        &dir.path().join("b.safetensors"),
    );
    assert_eq!(with, without);
}

#[test]
fn bad_random_weights_arguments_exit_2_naming_the_flag() {
    let model = tiny_sparse();
    let run = |extra: &[&str]| {
        let mut args = vec!["run", model.as_str(), "--prompt-ids", "5"];
        args.extend_from_slice(extra);
        failure(&glmc(&args))
    };
    for seed in ["x", "-1", "1.5", "18446744073709551616"] {
        let err = run(&[&format!("--random-weights={seed}")]);
        assert!(err.contains("--random-weights <SEED>"), "{seed}: {err}");
    }
    let err = run(&["--random-weights"]);
    assert!(
        err.contains("a value is required for '--random-weights <SEED>'"),
        "{err}"
    );
    let err = run(&["--random-weights", "7", "--weights", "/tmp"]);
    assert!(err.contains("cannot be used with"), "{err}");
    let err = failure(&glmc(&[
        "run",
        &model,
        "--random-weights",
        "7",
        "--prompt",
        "hi",
    ]));
    assert!(
        err.contains("--prompt TEXT needs the tokenizer.json") && err.contains("--prompt-ids"),
        "{err}"
    );
}

/// `glmc compile` of the sparse fixture into `dir/artifact` with no CUDA compiler in reach, so
/// the artifact has kernels.cu but no cubin.
fn artifact_without_cubin(dir: &Path) -> PathBuf {
    let out = dir.join("artifact");
    let status = Command::new(env!("CARGO_BIN_EXE_glmc"))
        .args([
            "compile",
            fixture().to_str().unwrap(),
            "--target",
            "sm90a",
            "--max-prefill-tokens",
            "4",
            "--max-batch",
            "1",
            "--max-context",
            "16",
            "-o",
            out.to_str().unwrap(),
        ])
        .env_remove("GLMC_NVCC")
        .env("PATH", "/usr/bin:/bin")
        .output()
        .expect("glmc runs");
    stdout(&status);
    out
}

/// `run ARTIFACT_DIR`: it runs on the GPU only, needs weights and a cubin, and fits the sizes
/// it was compiled for; each refusal exits 2 with the fix, before any GPU is touched.
#[test]
fn an_artifact_directory_is_refused_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let artifact = artifact_without_cubin(dir.path());
    let weights = fixture();
    let run_for = |new_tokens: &str, extra: &[&str]| {
        let mut args = vec![
            "run",
            artifact.to_str().unwrap(),
            "--prompt-ids",
            "3,17",
            "--max-new-tokens",
            new_tokens,
        ];
        args.extend_from_slice(extra);
        failure(&glmc(&args))
    };
    let run = |extra: &[&str]| run_for("2", extra);
    let err = run(&["--weights", weights.to_str().unwrap()]);
    assert!(
        err.contains("is an artifact directory, which runs on the GPU")
            && err.contains("--device cuda"),
        "{err}"
    );
    let err = run(&["--device", "cuda", "-O0"]);
    assert!(
        err.contains("is compiled already: pass them to glmc compile"),
        "{err}"
    );
    let err = run(&["--device", "cuda"]);
    assert!(
        err.contains("holds no weights: pass --weights DIR") && err.contains("--random-weights"),
        "{err}"
    );
    let cuda_with_weights = ["--device", "cuda", "--weights", weights.to_str().unwrap()];
    let err = run(&cuda_with_weights);
    assert!(
        err.contains("manifest.ron: the artifact has kernels.cu but no cubin")
            && err.contains("--nvcc"),
        "{err}"
    );

    // A stand-in cubin: every later check comes before the GPU.
    let manifest = artifact.join("manifest.ron");
    let text = fs::read_to_string(&manifest).unwrap();
    assert!(text.contains("cubin: None"), "{text}");
    fs::write(
        &manifest,
        text.replace("cubin: None", "cubin: Some(\"kernels.sm90a.cubin\")"),
    )
    .unwrap();
    fs::write(artifact.join("kernels.sm90a.cubin"), b"not a cubin").unwrap();
    let err = failure(&glmc(
        &[
            &[
                "run",
                artifact.to_str().unwrap(),
                "--prompt-ids",
                "3,17,4,5,6",
            ][..],
            &cuda_with_weights,
        ]
        .concat(),
    ));
    assert!(
        err.contains("the prompt has 5 tokens, the artifact was compiled for prefills of at most 4: recompile with a larger --max-prefill-tokens"),
        "{err}"
    );
    let err = run_for("20", &cuda_with_weights);
    assert!(
        err.contains("reach 23 tokens, the artifact was compiled for 16 tokens of context"),
        "{err}"
    );
    if Path::new("/dev/nvidiactl").exists() {
        return; // a GPU machine: the GPU tests run artifacts there
    }
    let err = run(&cuda_with_weights);
    assert!(
        err.contains("no NVIDIA driver") && err.contains("--device cpu"),
        "{err}"
    );

    fs::write(&manifest, "(version: 2").unwrap();
    let err = run(&cuda_with_weights);
    assert!(
        err.contains("manifest.ron: not a manifest this glmc reads") && err.contains("recompile"),
        "{err}"
    );
}

/// Several prompts are one batch: each line of output is its sequence's, as alone.
#[test]
fn several_prompts_decode_together_each_as_alone() {
    let model = fixture();
    let m = model.to_str().unwrap();
    let prompts = ["5,9,200,17,3,3,41", "12,7", "99,3,4,5"];
    let alone: Vec<String> = prompts
        .iter()
        .map(|p| {
            stdout(&glmc(&[
                "run",
                m,
                "--prompt-ids",
                p,
                "--max-new-tokens",
                "5",
            ]))
        })
        .collect();
    let mut args = vec!["run", m, "--max-new-tokens", "5", "--max-batch", "4"];
    for p in &prompts {
        args.extend(["--prompt-ids", p]);
    }
    let together = stdout(&glmc(&args));
    let want: Vec<String> = alone
        .iter()
        .enumerate()
        .map(|(i, out)| format!("[{i}] {out}"))
        .collect();
    assert_eq!(together, want.join("\n"));
}

/// `--max-batch` and `--max-context` refuse what they cannot hold, naming the flag and the fix.
#[test]
fn batch_and_context_limits_are_user_errors() {
    let model = fixture();
    let m = model.to_str().unwrap();
    let err = failure(&glmc(&[
        "run",
        m,
        "--prompt-ids",
        "3,4",
        "--prompt-ids",
        "5",
        "--max-batch",
        "1",
    ]));
    assert!(
        err.contains("2 prompts were given, more than --max-batch 1: raise --max-batch"),
        "{err}"
    );
    let err = failure(&glmc(&[
        "run",
        m,
        "--prompt-ids",
        "3,4",
        "--max-new-tokens",
        "8",
        "--max-context",
        "6",
    ]));
    assert!(
        err.contains("reach 11 tokens, more than --max-context 6: raise --max-context"),
        "{err}"
    );
    let err = failure(&glmc(&[
        "run",
        m,
        "--prompt-ids",
        "3,4",
        "--max-batch",
        "0",
    ]));
    assert!(err.contains("--max-batch"), "{err}");
    let err = failure(&glmc(&["run", m, "--prompt-ids", "3,x"]));
    assert!(
        err.contains("--prompt-ids") && err.contains("`x` is not a token id"),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    let logits = dir.path().join("l.safetensors");
    let err = failure(&glmc(&[
        "run",
        m,
        "--prompt-ids",
        "3,4",
        "--prompt-ids",
        "5",
        "--dump-logits",
        logits.to_str().unwrap(),
    ]));
    assert!(
        err.contains("--dump-logits and --trace record one sequence") && err.contains("give one"),
        "{err}"
    );
}

/// An artifact serves at most the batch and context it was compiled for (1 and 16 here).
#[test]
fn an_artifacts_batch_and_context_are_its_limits() {
    let dir = tempfile::tempdir().unwrap();
    let artifact = artifact_without_cubin(dir.path());
    // A stand-in cubin: the limits are checked before the GPU.
    let manifest = artifact.join("manifest.ron");
    let text = fs::read_to_string(&manifest).unwrap();
    fs::write(
        &manifest,
        text.replace("cubin: None", "cubin: Some(\"kernels.sm90a.cubin\")"),
    )
    .unwrap();
    fs::write(artifact.join("kernels.sm90a.cubin"), b"not a cubin").unwrap();
    let weights = fixture();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            artifact.to_str().unwrap(),
            "--device",
            "cuda",
            "--weights",
            weights.to_str().unwrap(),
            "--prompt-ids",
            "3,17",
            "--max-new-tokens",
            "2",
        ];
        args.extend_from_slice(extra);
        failure(&glmc(&args))
    };
    let err = run(&["--max-batch", "2"]);
    assert!(
        err.contains("--max-batch 2 is more than the 1 sequences the artifact")
            && err.contains("recompile with glmc compile --max-batch 2"),
        "{err}"
    );
    let err = run(&["--max-context", "17"]);
    assert!(
        err.contains("--max-context 17 is more than the 16 tokens of context the artifact")
            && err.contains("lower --max-context"),
        "{err}"
    );
    let err = run(&["--prompt-ids", "5"]);
    assert!(
        err.contains("2 prompts were given, the artifact was compiled for 1 sequences: recompile with a larger --max-batch"),
        "{err}"
    );
}
