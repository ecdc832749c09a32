//! Helpers shared by the CLI integration tests: run the built `glmc`, find repository files,
//! compare directory trees, make snapshots of error messages stable.

#![allow(dead_code)] // each test binary uses a different subset

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root (the root package's manifest directory).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A path under the repository root.
pub fn repo_path(rel: &str) -> PathBuf {
    repo().join(rel)
}

/// `glmc ARGS`, run in `cwd`, with a stable environment (no backtraces, no colours).
pub fn glmc_in(cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_glmc"))
        .args(args)
        .current_dir(cwd)
        .env("RUST_BACKTRACE", "0")
        .env("NO_COLOR", "1")
        .env_remove("CLICOLOR_FORCE")
        .output()
        .unwrap_or_else(|e| panic!("cannot run glmc: {e}"))
}

/// `glmc ARGS`, run in the repository root (so `models/glm5.ron` resolves).
pub fn glmc(args: &[&str]) -> Output {
    glmc_in(&repo(), args)
}

pub fn stdout_of(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).expect("stdout is UTF-8")
}

pub fn stderr_of(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).expect("stderr is UTF-8")
}

/// Asserts `glmc ARGS` succeeded without any panic text; returns its stdout.
pub fn success(out: &Output, what: &str) -> String {
    let stderr = stderr_of(out);
    assert!(
        out.status.success(),
        "{what}: expected success, got {:?}\nstderr:\n{stderr}",
        out.status
    );
    assert_no_panic(&stderr, what);
    stdout_of(out)
}

/// `glmc ARGS` in the repository root must succeed; its stdout.
pub fn glmc_ok(args: &[&str]) -> String {
    success(&glmc(args), &format!("glmc {}", args.join(" ")))
}

pub fn assert_no_panic(stderr: &str, what: &str) {
    assert!(
        !stderr.contains("panicked") && !stderr.contains("internal error"),
        "{what}: glmc panicked:\n{stderr}"
    );
}

/// The shipped configs: every `models/*.ron`, sorted by file name.
pub fn shipped_configs() -> Vec<PathBuf> {
    let mut configs: Vec<PathBuf> = std::fs::read_dir(repo_path("models"))
        .expect("models/ is readable")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "ron"))
        .collect();
    configs.sort();
    for name in ["glm5.ron", "tiny-dense.ron", "tiny-sparse.ron"] {
        assert!(
            configs.iter().any(|p| p.ends_with(name)),
            "models/{name} is missing"
        );
    }
    configs
}

/// Every file below `dir` (relative path → bytes), so two trees compare with `==`.
pub fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            if path.is_dir() {
                // Empty directories count too: record them with no content.
                out.insert(rel.join(""), Vec::new());
                walk(root, &path, out);
            } else {
                out.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// `text` with every occurrence of each path (as given and canonicalized) replaced by
/// `placeholder`, so snapshots of messages do not depend on where the temporary directory is.
pub fn redact(text: &str, path: &Path, placeholder: &str) -> String {
    let mut forms = vec![path.display().to_string()];
    if let Ok(canon) = path.canonicalize() {
        forms.push(canon.display().to_string());
    }
    // Longest first, so a canonical path that extends the given one is replaced whole.
    forms.sort_by_key(|f| std::cmp::Reverse(f.len()));
    let mut text = text.to_string();
    for form in forms {
        if !form.is_empty() {
            text = text.replace(&form, placeholder);
        }
    }
    text
}

/// `text` with the first line containing `needle` replaced by `with` (the whole line).
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

/// The text of a file under the repository root.
pub fn read_repo(rel: &str) -> String {
    std::fs::read_to_string(repo_path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The GLM-5 `config.json` test fixture: the models crate's, if another engineer has written it,
/// else ours (`tests/data/glm5-config.json`, transcribed from GLM5-SPEC §1.1).
pub fn glm5_config_json() -> PathBuf {
    let theirs = repo_path("models/tests/data/glm5-config.json");
    if theirs.is_file() {
        theirs
    } else {
        repo_path("tests/data/glm5-config.json")
    }
}
