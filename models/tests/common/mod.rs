//! Helpers shared by the models crate's integration tests.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};

use glmc_models::{shipped_config_path, ModelConfig};

/// A shipped config, loaded and validated.
pub fn shipped(file: &str) -> ModelConfig {
    let path = shipped_config_path(file);
    ModelConfig::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

/// The text of a shipped config.
pub fn shipped_text(file: &str) -> String {
    std::fs::read_to_string(shipped_config_path(file)).expect("shipped config is readable")
}

/// A file under `models/tests/data`.
pub fn data(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(file)
}

/// `text` with the first line containing `needle` replaced by `with` (whole line).
pub fn replace_line(text: &str, needle: &str, with: &str) -> String {
    let mut done = false;
    let lines: Vec<&str> = text
        .lines()
        .map(|line| {
            if !done && line.contains(needle) {
                done = true;
                with
            } else {
                line
            }
        })
        .collect();
    assert!(done, "no line contains {needle:?}");
    lines.join("\n") + "\n"
}
