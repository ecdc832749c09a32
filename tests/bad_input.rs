//! Bad input to the `glmc` CLI: every case exits with status 2, prints one error on stderr (no
//! panic), prints nothing on stdout, and leaves the `-o` target alone: a fresh one is not
//! created, an existing one is not touched. The messages are snapshotted, with the temporary
//! directory replaced by `[TMP]`.

mod common;

use std::path::Path;

use common::{read_repo, redact, replace_line, stderr_of, stdout_of, tree};

/// What `-o` the case gets.
#[derive(Clone, Copy, PartialEq)]
enum Output {
    /// No `-o` (dump, usage errors).
    None,
    /// `-o DIR` (compile): run once with a fresh name, once with an existing directory.
    Dir,
    /// `-o FILE` (import-hf): run once with a fresh name, once with an existing file.
    File,
}

struct Case {
    name: &'static str,
    /// Files to create in the temporary working directory (relative path, contents).
    files: Vec<(&'static str, String)>,
    /// Empty directories to create there.
    dirs: Vec<&'static str>,
    args: Vec<&'static str>,
    output: Output,
    /// Substrings the message must contain (the file, the field, the position).
    expect: Vec<&'static str>,
}

fn case(
    name: &'static str,
    files: Vec<(&'static str, String)>,
    args: &[&'static str],
    output: Output,
    expect: &[&'static str],
) -> Case {
    Case {
        name,
        files,
        dirs: vec![],
        args: args.to_vec(),
        output,
        expect: expect.to_vec(),
    }
}

/// tiny-sparse.ron with one line replaced.
fn tiny(needle: &str, line: &str) -> Vec<(&'static str, String)> {
    vec![(
        "model.ron",
        replace_line(&read_repo("models/tiny-sparse.ron"), needle, line),
    )]
}

/// `glmc compile model.ron --target sm120` (the `-o` is added by the runner).
const COMPILE: &[&str] = &["compile", "model.ron", "--target", "sm120"];

/// GLM-5's config.json with `edit` applied to its JSON object.
fn glm5_json(edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) -> String {
    let text = std::fs::read_to_string(common::repo_path("tests/data/glm5-config.json")).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(json.as_object_mut().unwrap());
    serde_json::to_string_pretty(&json).unwrap()
}

fn cases() -> Vec<Case> {
    use Output::*;
    let glm5_json_text =
        std::fs::read_to_string(common::repo_path("tests/data/glm5-config.json")).unwrap();
    let mut cases = vec![
        // model.ron front end
        case(
            "malformed RON",
            tiny("hidden_size:", "    hidden_size: 64 64,"),
            COMPILE,
            Dir,
            &["model.ron:5:21:"],
        ),
        case(
            "unterminated RON",
            vec![("model.ron", "ModelConfig(\n    name: \"x\",\n".into())],
            COMPILE,
            Dir,
            &["model.ron:"],
        ),
        case(
            "empty model.ron",
            vec![("model.ron", String::new())],
            COMPILE,
            Dir,
            &["model.ron:1:1:"],
        ),
        case(
            "unknown field",
            tiny("n_group:", "        n_groups: 2,"),
            COMPILE,
            Dir,
            &["model.ron:34:", "`n_groups`"],
        ),
        case(
            "missing field",
            tiny("v_head_dim:", ""),
            COMPILE,
            Dir,
            &["model.ron:", "`v_head_dim`"],
        ),
        case(
            "wrong type",
            tiny("hidden_size:", "    hidden_size: \"64\","),
            COMPILE,
            Dir,
            &["model.ron:5:"],
        ),
        // impossible configs
        case(
            "index_head_dim not above the rope dim",
            tiny("index_head_dim:", "        index_head_dim: 8,"),
            COMPILE,
            Dir,
            &["model.ron", "`indexer.index_head_dim`"],
        ),
        case(
            "odd rope dim",
            tiny("qk_rope_head_dim:", "    qk_rope_head_dim: 7,"),
            COMPILE,
            Dir,
            &["model.ron", "`qk_rope_head_dim`"],
        ),
        case(
            "topk_group above n_group",
            tiny("topk_group:", "        topk_group: 3,"),
            COMPILE,
            Dir,
            &["model.ron", "`moe.topk_group`"],
        ),
        case(
            "more experts per token than experts",
            tiny("num_experts_per_tok:", "        num_experts_per_tok: 9,"),
            COMPILE,
            Dir,
            &["model.ron", "`moe.num_experts_per_tok`"],
        ),
        case(
            "zero hidden size",
            tiny("hidden_size:", "    hidden_size: 0,"),
            COMPILE,
            Dir,
            &["model.ron", "`hidden_size`"],
        ),
        case(
            "zero kv_lora_rank",
            tiny("kv_lora_rank:", "    kv_lora_rank: 0,"),
            COMPILE,
            Dir,
            &["model.ron", "`kv_lora_rank`"],
        ),
        case(
            "impossible config, dump",
            tiny("qk_rope_head_dim:", "    qk_rope_head_dim: 7,"),
            &["dump", "model.ron"],
            None,
            &["model.ron", "`qk_rope_head_dim`"],
        ),
        // targets and paths
        case(
            "unknown target",
            vec![("model.ron", read_repo("models/tiny-sparse.ron"))],
            &["compile", "model.ron", "--target", "sm100"],
            Dir,
            &["sm100", "sm120a"],
        ),
        case(
            "empty target",
            vec![("model.ron", read_repo("models/tiny-sparse.ron"))],
            &["compile", "model.ron", "--target", ""],
            Dir,
            &["target"],
        ),
        case(
            "nonexistent MODEL",
            vec![],
            &["compile", "missing.ron", "--target", "sm120"],
            Dir,
            &["missing.ron"],
        ),
        case(
            "nonexistent MODEL, dump",
            vec![],
            &["dump", "missing.ron"],
            None,
            &["missing.ron"],
        ),
        Case {
            dirs: vec!["empty"],
            ..case(
                "empty directory as MODEL",
                vec![],
                &["compile", "empty", "--target", "sm120"],
                Dir,
                &["empty/config.json"],
            )
        },
        Case {
            // A config.json that cannot be read (a directory: works even as root, where file
            // permissions do not stop reads).
            dirs: vec!["ckpt/config.json"],
            ..case(
                "unreadable config.json in MODEL",
                vec![],
                &["compile", "ckpt", "--target", "sm120"],
                Dir,
                &["ckpt/config.json"],
            )
        },
        case(
            "checkpoint directory of another model_type",
            vec![(
                "ckpt/config.json",
                glm5_json(|j| {
                    j.insert("model_type".into(), "llama".into());
                }),
            )],
            &["compile", "ckpt", "--target", "sm120"],
            Dir,
            &["ckpt/config.json", "\"llama\"", "glm_moe_dsa"],
        ),
        // import-hf
        case(
            "import-hf of another model_type",
            vec![(
                "config.json",
                glm5_json(|j| {
                    j.insert("model_type".into(), "llama".into());
                }),
            )],
            &["import-hf", "config.json"],
            File,
            &["config.json", "\"llama\""],
        ),
        case(
            "import-hf of malformed config.json",
            vec![(
                "config.json",
                replace_line(
                    &glm5_json_text,
                    "\"hidden_size\"",
                    "  \"hidden_size\": 6144,,",
                ),
            )],
            &["import-hf", "config.json"],
            File,
            &["config.json:14:23:"],
        ),
        case(
            "import-hf of truncated config.json",
            vec![("config.json", glm5_json_text[..200].to_string())],
            &["import-hf", "config.json"],
            File,
            &["config.json:"],
        ),
        case(
            "import-hf of config.json missing the RoPE theta",
            vec![(
                "config.json",
                glm5_json(|j| {
                    j.remove("rope_parameters");
                }),
            )],
            &["import-hf", "config.json"],
            File,
            &["config.json", "`rope_parameters`", "1000000", "8000000"],
        ),
        case(
            "import-hf of rope_interleave false",
            vec![(
                "config.json",
                glm5_json(|j| {
                    j.insert("rope_interleave".into(), false.into());
                }),
            )],
            &["import-hf", "config.json"],
            File,
            &[
                "`rope_interleave`",
                "transformers 5.17",
                "vLLM",
                "half-split",
            ],
        ),
        case(
            "import-hf of an impossible config.json",
            vec![(
                "config.json",
                glm5_json(|j| {
                    j.insert("topk_group".into(), 2.into());
                }),
            )],
            &["import-hf", "config.json"],
            File,
            &["config.json", "topk_group"],
        ),
        case(
            "import-hf of a nonexistent path",
            vec![],
            &["import-hf", "missing/config.json"],
            File,
            &["missing/config.json"],
        ),
        // usage errors (clap)
        case(
            "no arguments",
            vec![],
            &[],
            None,
            &["Usage: glmc <COMMAND>", "compile", "dump", "import-hf"],
        ),
        case(
            "unknown subcommand",
            vec![],
            &["frobnicate"],
            None,
            &["frobnicate"],
        ),
        case(
            "compile without --target",
            vec![("model.ron", read_repo("models/tiny-sparse.ron"))],
            &["compile", "model.ron"],
            Dir,
            &["--target"],
        ),
        case(
            "dump with an unknown format",
            vec![("model.ron", read_repo("models/tiny-sparse.ron"))],
            &["dump", "model.ron", "--format", "xml"],
            None,
            &["xml"],
        ),
        case(
            "compile with --dtype f16, which has no kernels",
            vec![("model.ron", read_repo("models/tiny-sparse.ron"))],
            &[
                "compile",
                "model.ron",
                "--target",
                "sm120",
                "--dtype",
                "f16",
            ],
            Dir,
            &["'f16'", "--dtype", "f32, bf16"],
        ),
        case(
            "dump with an unknown dtype",
            vec![("model.ron", read_repo("models/tiny-sparse.ron"))],
            &["dump", "model.ron", "--dtype", "foo"],
            None,
            &["'foo'", "--dtype", "f32, bf16"],
        ),
        case(
            "run with an unknown dtype",
            vec![("model.ron", read_repo("models/tiny-sparse.ron"))],
            &["run", "model.ron", "--prompt-ids", "1", "--dtype", "fp32"],
            None,
            &["'fp32'", "--dtype", "f32, bf16"],
        ),
        case(
            "dump with an unknown phase",
            vec![("model.ron", read_repo("models/tiny-sparse.ron"))],
            &["dump", "model.ron", "--phase", "train"],
            None,
            &["train"],
        ),
        case(
            "import-hf without -o",
            vec![("config.json", glm5_json_text.clone())],
            &["import-hf", "config.json"],
            None,
            &["--output"],
        ),
    ];
    // `-o` naming an existing regular file: compile must not replace or delete it.
    cases.push(Case {
        output: None,
        ..case(
            "compile -o naming an existing file",
            vec![
                ("model.ron", read_repo("models/tiny-sparse.ron")),
                ("artifact", "a file, not a directory\n".into()),
            ],
            &[
                "compile",
                "model.ron",
                "--target",
                "sm120",
                "-o",
                "artifact",
            ],
            None,
            &["artifact"],
        )
    });
    cases
}

/// Runs one case in a fresh temporary directory; returns its redacted stderr.
fn run(case: &Case, out: Option<(&str, bool)>) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    for (rel, text) in &case.files {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    for dir in &case.dirs {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    let mut args = case.args.clone();
    if let Some((name, existing)) = out {
        if existing {
            let path = root.join(name);
            match case.output {
                Output::Dir => {
                    std::fs::create_dir_all(path.join("ir")).unwrap();
                    std::fs::write(path.join("manifest.ron"), "previous artifact\n").unwrap();
                    std::fs::write(path.join("ir/module.txt"), "previous\n").unwrap();
                }
                Output::File => std::fs::write(&path, "previous model.ron\n").unwrap(),
                Output::None => unreachable!(),
            }
        }
        args.extend(["-o", name]);
    }
    let before = tree(root);
    let o = common::glmc_in(root, &args);
    let what = format!("{} (glmc {})", case.name, args.join(" "));
    let stderr = stderr_of(&o);
    assert_eq!(o.status.code(), Some(2), "{what}: exit status\n{stderr}");
    common::assert_no_panic(&stderr, &what);
    assert_eq!(stdout_of(&o), "", "{what}: stdout");
    assert!(
        stderr.starts_with("error: ")
            || stderr.starts_with("Usage: ")
            || stderr.contains("\nUsage: "),
        "{what}: {stderr}"
    );
    for needle in &case.expect {
        assert!(
            stderr.contains(needle),
            "{what}: no {needle:?} in\n{stderr}"
        );
    }
    assert!(
        tree(root) == before,
        "{what}: the working directory changed (an output was created, or an existing one \
         touched, or a staging file left behind)"
    );
    redact(&stderr, root, "[TMP]")
}

#[test]
fn bad_input_exits_2_with_a_message_and_writes_nothing() {
    let mut report = String::new();
    for case in cases() {
        let stderr = match case.output {
            Output::None => run(&case, None),
            Output::Dir | Output::File => {
                let fresh = if case.output == Output::Dir {
                    "out"
                } else {
                    "out.ron"
                };
                let a = run(&case, Some((fresh, false)));
                let b = run(&case, Some((fresh, true)));
                assert_eq!(
                    a, b,
                    "{}: the message depends on whether -o exists",
                    case.name
                );
                a
            }
        };
        // The help text that comes with a usage error is the help snapshot's business
        // (cli.rs); keep only its usage line here, so a new subcommand changes one snapshot.
        let stderr = match stderr.find("\nUsage: ") {
            Some(at) if !stderr.starts_with("error: ") => {
                stderr[at + 1..].lines().next().unwrap().to_string()
            }
            _ => stderr,
        };
        report.push_str(&format!("{}:\n", case.name));
        for line in stderr.lines() {
            report.push_str(&format!("  {line}\n").replace("  \n", "\n"));
        }
    }
    insta::assert_snapshot!("bad_input_messages", report);
}

/// The messages of errors about files name the file as given on the command line (relative
/// here), so nothing in them depends on the temporary directory.
#[test]
fn redaction_replaces_the_temporary_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path();
    let text = format!("error: {}/x.ron: bad", p.display());
    assert_eq!(redact(&text, p, "[TMP]"), "error: [TMP]/x.ron: bad");
    assert_eq!(
        redact("no path", Path::new("/nonexistent/dir"), "[TMP]"),
        "no path"
    );
}
