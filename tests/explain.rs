//! `glmc compile --explain` and `glmc dump --after`: the choices the compiler made, stated.

use std::path::Path;
use std::process::Command;

fn glmc_stdout(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_glmc"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .expect("glmc runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn explain(model: &str, extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("artifact");
    let mut args = vec![
        "compile",
        model,
        "--target",
        "sm120",
        "-o",
        out.to_str().unwrap(),
        "--explain",
    ];
    args.extend_from_slice(extra);
    let text = glmc_stdout(&args);
    assert_eq!(
        std::fs::read_to_string(out.join("explain.txt")).unwrap(),
        text
    );
    text
}

#[test]
fn explain_states_each_phase_and_layer_kind() {
    let mut all = String::new();
    for (model, extra) in [
        ("models/glm5.ron", &[][..]),
        ("models/glm5.ron", &["--attention", "dense"][..]),
        ("models/tiny-sparse.ron", &[][..]),
        ("models/tiny-sparse.ron", &["-O0"][..]),
        ("models/tiny-dense.ron", &[][..]),
    ] {
        all.push_str(&format!(
            "$ glmc compile {model} --explain {}\n",
            extra.join(" ")
        ));
        all.push_str(&explain(model, extra));
        all.push('\n');
    }
    insta::assert_snapshot!(all);
}

#[test]
fn explain_of_glm5_matches_the_spec() {
    let text = explain("models/glm5.ron", &[]);
    for phase in ["prefill", "decode"] {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{phase}, layers 0-77: ")))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(line.contains("sparse (top-2048, own indexer"), "{line}");
        assert!(line.contains("absorbed MLA"), "{line}");
        // GLM5-SPEC §3.3: 512 latent + 64 rope values per token and layer, plus the indexer key.
        assert!(
            line.contains("cache 576 values/token + indexer keys 128"),
            "{line}"
        );
    }
}

#[test]
fn dump_after_prints_a_section_per_matching_pass() {
    let model = Path::new("models/tiny-sparse.ron").to_str().unwrap();
    let text = glmc_stdout(&["dump", model, "--phase", "decode", "--after", ".*"]);
    let headers: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("// ===== after pass "))
        .collect();
    let expected: Vec<String> = glmc_passes::PIPELINE
        .iter()
        .map(|p| {
            // fuse-lm-head-argmax changes greedy builds (`--greedy`) only.
            let changed = !matches!(*p, "cse" | "dce" | "fuse-lm-head-argmax");
            format!(
                "// ===== after pass {p} ({}) =====",
                if changed { "changed" } else { "unchanged" }
            )
        })
        .collect();
    assert_eq!(headers, expected);
    // A module follows each changed pass only; decode alone was asked for.
    assert_eq!(text.matches("glmc.module \"tiny_sparse\"").count(), 7);
    assert_eq!(text.matches("func @decode").count(), 7);
    assert_eq!(text.matches("func @prefill").count(), 0);
    let only = glmc_stdout(&["dump", model, "--after", "absorb-mla"]);
    assert!(
        only.starts_with("// ===== after pass absorb-mla (changed) =====\n"),
        "{only}"
    );
    assert_eq!(only.matches("// ===== after pass").count(), 1);
    assert!(only.contains("mla.attend.absorbed"));
}
