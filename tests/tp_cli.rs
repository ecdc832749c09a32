//! `--tp N` on the command line: `run` on the CPU gives the single-device tokens and logits,
//! `dump` prints one rank's sharded graph, and a degree that does not divide is refused with
//! exit 2 naming the size.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn glmc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_glmc"))
        .args(args)
        .output()
        .expect("glmc runs")
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "glmc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn failure(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

fn logits(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor("logits").unwrap();
    t.data()
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// The stderr of `glmc run DIR --device cuda --tp TP` on random weights, which must fail.
fn cuda_run_failure(dir: &Path, tp: &str) -> String {
    failure(&glmc(&[
        "run",
        dir.to_str().unwrap(),
        "--device",
        "cuda",
        "--tp",
        tp,
        "--random-weights",
        "1",
        "--prompt-ids",
        "1,2",
    ]))
}

#[test]
fn run_on_tp_2_and_4_gives_the_single_device_tokens_and_logits() {
    same_tokens_and_logits("sparse", &["2", "4"]);
}

/// The six-head oracle fixture divides by 3 and 6, what `--device cpu --tp 3` needs.
#[test]
fn run_on_tp_3_and_6_gives_the_single_device_tokens_and_logits() {
    same_tokens_and_logits("six-heads", &["3", "6"]);
}

fn same_tokens_and_logits(case: &str, degrees: &[&str]) {
    let fixture = repo(&format!("tests/oracle/fixtures/{case}"));
    let dir = tempfile::tempdir().unwrap();
    let run = |tp: &str| {
        let dump = dir.path().join(format!("tp{tp}.safetensors"));
        let out = glmc(&[
            "run",
            fixture.to_str().unwrap(),
            "--prompt-ids",
            "5,9,200,17,3,3,41,7,99,12",
            "--max-new-tokens",
            "6",
            "--device",
            "cpu",
            "--tp",
            tp,
            "--dump-logits",
            dump.to_str().unwrap(),
        ]);
        (stdout(&out), logits(&dump))
    };
    let (tokens, reference) = run("1");
    for &tp in degrees {
        let (t, l) = run(tp);
        assert_eq!(t, tokens, "{case} TP={tp}");
        let scale = reference.iter().fold(0f32, |m, x| m.max(x.abs()));
        let diff = reference
            .iter()
            .zip(&l)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            l.len() == reference.len() && diff / scale <= 1e-5,
            "{case} TP={tp}: rel. {}",
            diff / scale
        );
    }
}

#[test]
fn a_degree_that_does_not_divide_the_heads_exits_2_naming_them() {
    let fixture = repo("tests/oracle/fixtures/sparse");
    let out = glmc(&[
        "run",
        fixture.to_str().unwrap(),
        "--prompt-ids",
        "5,9",
        "--tp",
        "3",
    ]);
    let e = failure(&out);
    assert!(
        e.contains("num_attention_heads 4 is not divisible by the TP degree 3"),
        "{e}"
    );
    let out = glmc(&["dump", "models/tiny-sparse.ron", "--tp", "2", "--rank", "2"]);
    assert!(failure(&out).contains("--rank 2 is not a rank of --tp 2"));
}

/// GLM-5 at TP=2: rank 1 holds 32 of the 64 heads (q_b_proj 8192 rows, its half of
/// kv_b_proj's head blocks, o_proj's matching 8192 columns) and reduces after o_proj and the MLP.
#[test]
fn dump_shows_a_rank_of_glm5_with_its_shapes_and_collectives() {
    let out = stdout(&glmc(&[
        "dump",
        "models/glm5.ron",
        "--phase",
        "decode",
        "--tp",
        "2",
        "--rank",
        "1",
    ]));
    assert!(
        out.starts_with("glmc.module \"glm5\" tp=2 rank=1\n"),
        "{}",
        &out[..80]
    );
    for line in [
        "weight {recipe=slice(hf(\"model.layers.0.self_attn.q_b_proj.weight\", [16384, 2048]), 0, 8192, 16384)} : bf16[8192,2048]",
        "slice(hf(\"model.layers.0.self_attn.kv_b_proj.weight\", [28672, 512]), 0, 14336, 28672), [32, 448, 512])",
        "weight {recipe=slice(hf(\"model.layers.0.self_attn.o_proj.weight\", [6144, 16384]), 1, 8192, 16384)} : bf16[6144,8192]",
        "all_reduce %43 {op=sum, ranks=2} : bf16[b,6144] \"model.layers.0.self_attn.o_proj\"",
        "embed.shard %5, %0 {start=77440} : bf16[b,6144] \"model.embed_tokens.partial\"",
        "all_gather",
    ] {
        assert!(out.contains(line), "missing {line}");
    }
}

/// `glmc compile models/tiny-sparse.ron --target sm90a EXTRA -o DIR/art`, which must succeed;
/// the artifact's directory.
fn compile_tiny_sparse(dir: &Path, extra: &[&str]) -> PathBuf {
    let out = dir.join("art");
    let model = repo("models/tiny-sparse.ron");
    let mut args = vec!["compile", model.to_str().unwrap(), "--target", "sm90a"];
    args.extend_from_slice(extra);
    args.extend(["-o", out.to_str().unwrap()]);
    let o = glmc(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

#[test]
fn compile_with_tp_writes_every_rank_artifact_complete() {
    let tmp = tempfile::tempdir().unwrap();
    let out = compile_tiny_sparse(tmp.path(), &["--tp", "2"]);
    for r in 0..2 {
        let text = std::fs::read_to_string(out.join(format!("rank{r}/manifest.ron"))).unwrap();
        assert!(text.contains("complete: true"), "rank {r} is incomplete");
        assert!(
            text.contains(&format!("rank: {r}")),
            "rank {r}'s manifest names its rank"
        );
        assert!(text.contains("Collective("), "rank {r} has collectives");
        let lowered =
            std::fs::read_to_string(out.join(format!("rank{r}/ir/decode.lowered.txt"))).unwrap();
        assert!(
            lowered.contains("all_gather \"lm_head\": collective over 2 ranks"),
            "{lowered}"
        );
    }
    // The whole model's artifact is there too, and one of another degree is refused.
    assert!(out.join("manifest.ron").is_file());
    let stderr = cuda_run_failure(&out, "4");
    assert!(
        stderr.contains("rank 0 of --tp 2") && stderr.contains("asks for --tp 4"),
        "{stderr}"
    );
}

#[test]
fn a_rank_directory_holding_another_ranks_artifact_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let out = compile_tiny_sparse(tmp.path(), &["--tp", "2"]);
    let (zero, one, swap) = (out.join("rank0"), out.join("rank1"), out.join("swap"));
    std::fs::rename(&zero, &swap).unwrap();
    std::fs::rename(&one, &zero).unwrap();
    std::fs::rename(&swap, &one).unwrap();
    let stderr = cuda_run_failure(&out, "2");
    assert!(
        stderr
            .contains("rank0/manifest.ron: the artifact is rank 1 of --tp 2, where rank 0 belongs"),
        "{stderr}"
    );
}

#[test]
fn an_artifact_compiled_without_tp_is_refused_at_tp_2_with_the_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let out = compile_tiny_sparse(tmp.path(), &[]);
    let stderr = cuda_run_failure(&out, "2");
    assert!(
        stderr.contains("compiled without --tp; recompile it with glmc compile --tp 2"),
        "{stderr}"
    );
}

/// `--trace` and `--check-finite` run at `--device cuda --tp N` (the GPU tests show it): here,
/// without a GPU, they are refused no more, and a bad timeout or process layout still is,
/// before anything touches a GPU.
#[test]
fn gpu_tp_takes_traces_and_refuses_bad_timeouts_before_touching_a_gpu() {
    let model = repo("models/tiny-sparse.ron");
    let m = model.to_str().unwrap();
    let base = [
        "run",
        m,
        "--device",
        "cuda",
        "--tp",
        "2",
        "--random-weights",
        "1",
        "--prompt-ids",
        "1,2",
    ];
    // Observing used to be refused first; now the run gets as far as placing its processes.
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("ranks.trace");
    for observing in [
        &["--check-finite"][..],
        &["--trace", trace.to_str().unwrap()][..],
    ] {
        let stderr = failure(&glmc(
            &[&base[..], observing, &["--world-size", "2"]].concat(),
        ));
        assert!(
            stderr.contains("MASTER_ADDR") && !stderr.contains("--check-finite"),
            "{observing:?}: {stderr}"
        );
    }
    let stderr = failure(&glmc(&[&base[..], &["--collective-timeout", "0"]].concat()));
    assert!(stderr.contains("positive number of seconds"), "{stderr}");
    let stderr = failure(&glmc(&[&base[..], &["--world-size", "2"]].concat()));
    assert!(stderr.contains("MASTER_ADDR"), "{stderr}");
}
