//! `glmc compile --report`: the memory report of GLM-5 (snapshotted, reviewed by hand), written
//! to the artifact as report.txt too, the same on every run; every shipped config reports.

mod common;

use common::{glmc_ok, shipped_configs};

/// `glmc compile MODEL --target T --report -o DIR`: (stdout, DIR/report.txt).
fn report(model: &str, target: &str) -> (String, String) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("artifact");
    let stdout = glmc_ok(&[
        "compile",
        model,
        "--target",
        target,
        "--report",
        "-o",
        out.to_str().unwrap(),
    ]);
    let file = std::fs::read_to_string(out.join("report.txt")).unwrap();
    (stdout, file)
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
