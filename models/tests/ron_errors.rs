//! The `model.ron` front end reports malformed files as `FILE:LINE:COL: message`, naming unknown
//! and missing fields.

mod common;

use std::path::Path;

use glmc_models::{ConfigError, ModelConfig};

fn syntax_error(text: &str) -> (usize, usize, String) {
    match ModelConfig::from_ron_str(text, Path::new("models/bad.ron")) {
        Err(ConfigError::Syntax {
            line, col, message, ..
        }) => (line, col, message),
        other => panic!("expected a syntax error, got {other:?}"),
    }
}

fn message(text: &str) -> String {
    ModelConfig::from_ron_str(text, Path::new("models/bad.ron"))
        .unwrap_err()
        .to_string()
}

#[test]
fn malformed_ron_points_at_the_line() {
    let text = common::replace_line(
        &common::shipped_text("tiny-sparse.ron"),
        "hidden_size:",
        "    hidden_size: 64 64,",
    );
    let (line, col, _) = syntax_error(&text);
    assert_eq!(line, 5, "hidden_size is on line 5");
    assert!(col > 1);
    assert!(message(&text).starts_with("models/bad.ron:5:"));
}

#[test]
fn unknown_field_is_named_with_its_position() {
    let text = common::replace_line(
        &common::shipped_text("tiny-sparse.ron"),
        "n_group:",
        "        n_groups: 2,",
    );
    let (line, _, message) = syntax_error(&text);
    assert_eq!(line, 34, "n_group is on line 34");
    assert!(message.contains("`n_groups`"), "{message}");
    assert!(message.contains("expected one of"), "{message}");
}

#[test]
fn missing_field_is_named() {
    let text = common::replace_line(&common::shipped_text("tiny-sparse.ron"), "v_head_dim:", "");
    let (_, _, message) = syntax_error(&text);
    assert!(message.contains("`v_head_dim`"), "{message}");
}

#[test]
fn io_error_names_the_file() {
    let err = ModelConfig::load(Path::new("/nonexistent/model.ron")).unwrap_err();
    assert!(matches!(err, ConfigError::Io { .. }), "{err:?}");
    assert!(err
        .to_string()
        .starts_with("/nonexistent/model.ron: cannot read the file: "));
}

#[test]
fn load_reads_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.ron");
    std::fs::write(&path, common::shipped_text("tiny-dense.ron")).unwrap();
    assert_eq!(
        ModelConfig::load(&path).unwrap(),
        common::shipped("tiny-dense.ron")
    );
    std::fs::write(&path, "ModelConfig(").unwrap();
    let err = ModelConfig::load(&path).unwrap_err().to_string();
    assert!(err.starts_with(&format!("{}:1:", path.display())), "{err}");
}

#[test]
fn bad_input_messages() {
    let tiny = common::shipped_text("tiny-sparse.ron");
    let cases = [
        ("empty file", String::new()),
        ("not ron", "{\"hidden_size\": 64}".to_string()),
        ("unclosed", tiny.replace("    )),\n", "")),
        (
            "two values",
            common::replace_line(&tiny, "hidden_size:", "    hidden_size: 64 64,"),
        ),
        (
            "string for int",
            common::replace_line(&tiny, "hidden_size:", "    hidden_size: \"64\","),
        ),
        (
            "negative size",
            common::replace_line(&tiny, "hidden_size:", "    hidden_size: -64,"),
        ),
        (
            "unknown field",
            common::replace_line(&tiny, "n_group:", "        n_groups: 2,"),
        ),
        (
            "missing field",
            common::replace_line(&tiny, "v_head_dim:", ""),
        ),
        (
            "unknown dtype",
            common::replace_line(&tiny, "dtype:", "    dtype: \"bf17\","),
        ),
        (
            "unknown attention",
            common::replace_line(&tiny, "attention:", "    attention: sparse_ish,"),
        ),
        (
            "softmax router",
            common::replace_line(&tiny, "scoring_func:", "        scoring_func: softmax,"),
        ),
        (
            "unknown layer type",
            tiny.replace("shared, full]", "skip, full]"),
        ),
        (
            "wrong struct name",
            tiny.replace("ModelConfig(", "GlmConfig("),
        ),
        (
            "duplicate field",
            common::replace_line(&tiny, "v_head_dim:", "    v_head_dim: 16, v_head_dim: 16,"),
        ),
    ];
    let mut report = String::new();
    for (case, text) in cases {
        let err = ModelConfig::from_ron_str(&text, Path::new("models/bad.ron")).unwrap_err();
        assert!(matches!(err, ConfigError::Syntax { .. }), "{case}: {err:?}");
        report += &format!("{case}:\n  {err}\n");
    }
    insta::assert_snapshot!(report);
}
