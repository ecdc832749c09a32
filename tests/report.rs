//! `glmc compile --report`: the memory report of GLM-5 (snapshotted, reviewed by hand), written
//! to the artifact as report.txt too, the same on every run; every shipped config reports.
//! `--tp N` adds the tensor-parallel section (snapshotted for GLM-5 at TP=8), `--tp 1` changes
//! nothing, and a degree that does not divide the model exits 2 naming the size.

mod common;

use common::{glmc, glmc_ok, read_repo, shipped_configs, stderr_of};

/// `glmc compile MODEL --target T --report -o DIR EXTRA…`: (stdout, DIR/report.txt).
fn report_with(model: &str, target: &str, extra: &[&str]) -> (String, String) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("artifact");
    let mut args = vec![
        "compile",
        model,
        "--target",
        target,
        "--report",
        "-o",
        out.to_str().unwrap(),
    ];
    args.extend(extra);
    let stdout = glmc_ok(&args);
    let file = std::fs::read_to_string(out.join("report.txt")).unwrap();
    (stdout, file)
}

fn report(model: &str, target: &str) -> (String, String) {
    report_with(model, target, &[])
}

#[test]
fn glm5_report() {
    let (stdout, file) = report("models/glm5.ron", "sm120");
    assert_eq!(stdout, file, "stdout and report.txt differ");
    // GLM5-SPEC §3.3: (576 latent + 128 indexer key values) × 2 bytes × 78 layers per token.
    let per_token = (576 + 128) * 2 * 78;
    assert_eq!(per_token, 109_824);
    assert!(
        stdout.contains("kv cache per token: 107.25 KiB (109,824 B)"),
        "{stdout}"
    );
    // 64 sequences × 131072 tokens × 109824 B = 858 GiB.
    assert!(
        stdout.contains("858.00 GiB (921,270,484,992 B)"),
        "{stdout}"
    );
    insta::assert_snapshot!("glm5_report", stdout);
    let (again, _) = report("models/glm5.ron", "sm120");
    assert_eq!(stdout, again, "the report differs between two runs");
}

#[test]
fn without_report_there_is_no_report() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("artifact");
    let stdout = glmc_ok(&[
        "compile",
        "models/tiny-dense.ron",
        "--target",
        "sm90",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(stdout, "");
    assert!(!out.join("report.txt").exists());
}

#[test]
fn every_shipped_config_reports() {
    for config in shipped_configs() {
        let (stdout, _) = report(config.to_str().unwrap(), "sm90a");
        for row in [
            "arena",
            "peak live activations",
            "largest intermediate",
            "weights",
            "kv cache per token",
        ] {
            assert!(
                stdout.contains(row),
                "{}: no {row} in\n{stdout}",
                config.display()
            );
        }
    }
}

/// The line of `text` containing `needle`, its words joined by single spaces.
fn row(text: &str, needle: &str) -> String {
    let line = text
        .lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no {needle:?} in\n{text}"));
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn tp_1_leaves_the_report_unchanged() {
    let (plain, _) = report("models/glm5.ron", "sm120");
    let (tp1, file) = report_with("models/glm5.ron", "sm120", &["--tp", "1"]);
    assert_eq!(tp1, plain);
    assert_eq!(file, plain);
    assert!(!tp1.contains("tensor parallelism"), "{tp1}");
}

/// GLM-5 at TP=8 on sm120: the single-device report, then the tensor-parallel section. The
/// numbers checked by hand here are the ones the README quotes, and the README shows the section
/// verbatim.
#[test]
fn glm5_tp8_report() {
    let (stdout, file) = report_with("models/glm5.ron", "sm120", &["--tp", "8"]);
    assert_eq!(stdout, file, "stdout and report.txt differ");
    let (plain, _) = report("models/glm5.ron", "sm120");
    let section = stdout
        .strip_prefix(plain.as_str())
        .expect("the TP report starts with the single-device report");
    // Replicated latent cache and indexer keys: the per-token cache is the single device's.
    assert!(
        section.contains("kv cache per token     107.25 KiB (109,824 B) on every rank"),
        "{section}"
    );
    // 78 after o_proj, 3 after the dense MLPs, 75 after the MoE blocks, the embedding's, and
    // lm_head's all_gather.
    assert!(section.contains("(158 calls;"), "{section}");
    // o_proj's all_reduce: bf16[b, 6144] is 12,288 B at batch 1; over NVLink 14 hops of 3 us
    // plus 14/8 x 12,288 B / 450 GB/s, times 78 layers = 3279.7 us.
    let per_call = 14.0 * 3e-6 + 14.0 / 8.0 * 12_288.0 / 450e9;
    assert_eq!(format!("{:.1}", per_call * 78.0 * 1e6), "3279.7");
    assert_eq!(
        row(section, "model.layers.*.self_attn.o_proj"),
        "78 all_reduce model.layers.*.self_attn.o_proj 12,288 786,432 3279.7 / 3514.6 10953.5 / 13067.0"
    );
    // lm_head's all_gather gathers bf16[b, 154880]: 309,760 B at batch 1; 7 hops of 3 us plus
    // 7/8 x 309,760 B / 450 GB/s = 21.6 us.
    let gather = 7.0 * 3e-6 + 7.0 / 8.0 * 309_760.0 / 450e9;
    assert_eq!(format!("{:.1}", gather * 1e6), "21.6");
    assert_eq!(
        row(section, " lm_head "),
        "1 all_gather lm_head 309,760 19,824,640 21.6 / 59.5 75.4 / 416.9"
    );
    // bf16 GLM-5 does not fit at TP=8 on either card: ~177 GiB per rank.
    assert_eq!(
        section
            .matches("bf16, TP=8             weights 176.86 GiB (189,902,180,352 B) do not fit")
            .count(),
        2,
        "{section}"
    );
    assert!(
        read_repo("README.md").contains(section.trim_start()),
        "README's tensor-parallelism section no longer shows this report:\n{section}"
    );
    insta::assert_snapshot!("glm5_tp8_report", stdout);
}

#[test]
fn a_tp_degree_that_does_not_divide_exits_2_naming_the_size_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("artifact");
    let vocab = tmp.path().join("vocab251.ron");
    let ron = read_repo("models/tiny-dense.ron");
    assert!(ron.contains("vocab_size: 256,"));
    std::fs::write(&vocab, ron.replace("vocab_size: 256,", "vocab_size: 251,")).unwrap();
    for (model, tp, message) in [
        (
            "models/glm5.ron",
            "3",
            "num_attention_heads 64 is not divisible by the TP degree 3",
        ),
        (
            vocab.to_str().unwrap(),
            "2",
            "vocab_size 251 is not divisible by the TP degree 2",
        ),
    ] {
        let result = glmc(&[
            "compile",
            model,
            "--target",
            "sm120",
            "--tp",
            tp,
            "--report",
            "-o",
            out.to_str().unwrap(),
        ]);
        let stderr = stderr_of(&result);
        assert_eq!(result.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(message), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(!out.exists(), "a failed compile wrote {}", out.display());
    }
    let zero = glmc(&[
        "compile",
        "models/tiny-dense.ron",
        "--target",
        "sm90",
        "--tp",
        "0",
    ]);
    assert_eq!(zero.status.code(), Some(2), "{}", stderr_of(&zero));
}
