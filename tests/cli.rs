//! `glmc compile`: the artifact directory, determinism, the accepted targets; `--help`.

mod common;

use std::path::Path;

use common::{glmc, glmc_in, glmc_ok, read_repo, stderr_of, stdout_of, success, tree};
use glmc_codegen::artifact::Manifest;
use glmc_models::ModelConfig;

const IR_FILES: [&str; 4] = [
    "ir/module.txt",
    "ir/summary.txt",
    "ir/prefill.txt",
    "ir/decode.txt",
];

fn compile(model: &str, target: &str, out: &Path) -> String {
    let o = glmc(&[
        "compile",
        model,
        "--target",
        target,
        "-o",
        out.to_str().unwrap(),
    ]);
    let what = format!("glmc compile {model} --target {target}");
    assert_eq!(
        success(&o, &what),
        "",
        "{what}: compile prints nothing on stdout"
    );
    common::stderr_of(&o)
}

/// `glmc compile models/glm5.ron --target sm120 -o DIR` writes the manifest and the IR dumps,
/// and the dumps are those `glmc dump` prints.
#[test]
fn compile_glm5_writes_the_artifact() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("glm5.glmc");
    let stderr = compile("models/glm5.ron", "sm120", &out);
    assert!(
        stderr.contains("compiled glm5 (bf16) for sm120"),
        "{stderr}"
    );

    let files = tree(&out);
    for f in ["manifest.ron"].iter().chain(IR_FILES.iter()) {
        assert!(
            out.join(f).is_file(),
            "{f} is missing; wrote {:?}",
            files.keys()
        );
    }
    let text = std::fs::read_to_string(out.join("manifest.ron")).unwrap();
    let manifest: Manifest<ModelConfig> =
        ron::from_str(&text).unwrap_or_else(|e| panic!("manifest.ron does not parse: {e}"));
    assert_eq!(
        (manifest.model.as_str(), manifest.target.as_str()),
        ("glm5", "sm120")
    );
    assert_eq!(manifest.arch, "sm_120");
    let phases: Vec<&str> = manifest
        .phases
        .iter()
        .map(|p| p.function.as_str())
        .collect();
    assert_eq!(phases, ["prefill", "decode"]);
    // 78 layers × (c_kv, k_pe, indexer k).
    assert_eq!(manifest.states.len(), 234);
    assert!(
        manifest.complete,
        "every op has a kernel: {:?}",
        manifest.missing_ops
    );
    assert!(manifest.missing_ops.is_empty());
    assert!(!stderr.contains("the artifact is incomplete"), "{stderr}");
    // scripts/test.sh puts the pinned nvcc in GLMC_NVCC, so the cubin is always built here.
    assert!(
        std::env::var_os("GLMC_NVCC").is_some(),
        "run the suite through scripts/test.sh (it installs nvcc)"
    );
    for f in [
        "kernels.cu",
        "kernels.sm120.cubin",
        "ptxas.sm120.txt",
        "ir/decode.lowered.txt",
    ] {
        assert!(
            out.join(f).is_file(),
            "{f} is missing; wrote {:?}",
            files.keys()
        );
    }
    assert_eq!(manifest.cubin.as_deref(), Some("kernels.sm120.cubin"));
    assert!(manifest.ptxas.iter().all(|k| k.spill_store_bytes == 0));
    assert_eq!(manifest.ptxas.len(), manifest.kernels.len());

    let read = |f: &str| std::fs::read_to_string(out.join(f)).unwrap();
    let full = glmc_ok(&["dump", "models/glm5.ron", "--full"]);
    assert!(
        read("ir/module.txt") == full,
        "ir/module.txt is not `dump --full`"
    );
    assert!(
        read("ir/summary.txt") == glmc_ok(&["dump", "models/glm5.ron"]),
        "ir/summary.txt is not `dump`"
    );
    for phase in ["prefill", "decode"] {
        let text = read(&format!("ir/{phase}.txt"));
        assert!(
            text.starts_with(&format!("func @{phase} {{\n")),
            "{text:.80}"
        );
        assert!(text.ends_with("}\n"));
        assert!(
            full.contains(&text),
            "ir/{phase}.txt is not the function in module.txt"
        );
    }
    // Nothing but the artifact: no staging directory left next to it.
    let siblings: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(siblings, ["glm5.glmc"]);
}

/// Two compiles of the same model give byte-identical artifacts.
#[test]
fn compile_is_deterministic() {
    for model in ["models/glm5.ron", "models/tiny-sparse.ron"] {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        compile(model, "sm120a", &a);
        compile(model, "sm120a", &b);
        let (ta, tb) = (tree(&a), tree(&b));
        assert!(ta.len() >= 5, "{model}: {:?}", ta.keys());
        assert_eq!(
            ta.keys().collect::<Vec<_>>(),
            tb.keys().collect::<Vec<_>>(),
            "{model}"
        );
        for (file, bytes) in &ta {
            assert!(tb[file] == *bytes, "{model}: {} differs", file.display());
        }
    }
}

/// Every supported spelling of a target compiles, and the manifest names it canonically.
#[test]
fn compile_accepts_every_target() {
    for (arg, name) in [
        ("sm90", "sm90"),
        ("sm90a", "sm90a"),
        ("sm120", "sm120"),
        ("sm120a", "sm120a"),
        ("sm_120a", "sm120a"),
        ("sm_90a", "sm90a"),
        ("SM120", "sm120"),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        compile("models/tiny-sparse.ron", arg, &out);
        let manifest = std::fs::read_to_string(out.join("manifest.ron")).unwrap();
        assert!(
            manifest.contains(&format!("target: \"{name}\"")),
            "--target {arg}: {manifest}"
        );
    }
}

/// Compiling into an existing artifact replaces it as a whole (no stale files survive).
#[test]
fn compile_replaces_an_existing_artifact() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    std::fs::create_dir_all(out.join("ir")).unwrap();
    std::fs::write(out.join("stale.txt"), "old").unwrap();
    std::fs::write(out.join("ir/module.txt"), "old").unwrap();
    compile("models/tiny-dense.ron", "sm90", &out);
    assert!(!out.join("stale.txt").exists());
    assert_eq!(
        std::fs::read_to_string(out.join("ir/module.txt")).unwrap(),
        glmc_ok(&["dump", "models/tiny-dense.ron", "--full"])
    );
    let names: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["out"], "staging directories left behind");
}

/// Without `-o`, the artifact is `<model name>.glmc` in the working directory.
#[test]
fn compile_default_output_is_named_after_the_model() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::repo_path("models/tiny-sparse.ron");
    let o = glmc_in(
        tmp.path(),
        &["compile", model.to_str().unwrap(), "--target", "sm90a"],
    );
    success(&o, "compile without -o");
    assert!(tmp.path().join("tiny_sparse.glmc/manifest.ron").is_file());
}

/// A model.ron with comments, reordered fields and defaults left out compiles like the shipped
/// one (the front end is RON, not a fixed layout).
#[test]
fn compile_accepts_an_edited_model_ron() {
    let tmp = tempfile::tempdir().unwrap();
    let text = read_repo("models/tiny-dense.ron");
    let edited = format!(
        "// a comment\n{}",
        text.replace("    dtype: \"f32\",\n", "")
    )
    .replace(
        "ModelConfig(\n",
        "ModelConfig(\n    dtype: \"f32\", // moved\n",
    );
    let path = tmp.path().join("edited.ron");
    std::fs::write(&path, edited).unwrap();
    let a = glmc_ok(&["dump", path.to_str().unwrap(), "--full"]);
    let b = glmc_ok(&["dump", "models/tiny-dense.ron", "--full"]);
    assert_eq!(a, b);
}

/// The subcommands `glmc --help` lists (without `help`); at least compile, dump and import-hf.
fn subcommands() -> Vec<String> {
    let help = stdout_of(&glmc(&["--help"]));
    let commands = help
        .split_once("Commands:\n")
        .unwrap_or_else(|| panic!("no Commands: in\n{help}"))
        .1;
    let subs: Vec<String> = commands
        .lines()
        .take_while(|l| l.starts_with("  "))
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .filter(|s| s != "help")
        .collect();
    for known in ["compile", "dump", "import-hf"] {
        assert!(subs.iter().any(|s| s == known), "{known} not in {subs:?}");
    }
    subs
}

/// `--help` on glmc and every subcommand: exit 0, usage on stdout, nothing on stderr.
#[test]
fn help_on_every_subcommand() {
    let check = |args: &[&str], usage: &str| {
        let o = glmc(args);
        let what = format!("glmc {}", args.join(" "));
        assert_eq!(o.status.code(), Some(0), "{what}");
        let stdout = stdout_of(&o);
        assert!(stdout.contains(usage), "{what}: no {usage:?} in\n{stdout}");
        assert_eq!(common::stderr_of(&o), "", "{what}");
    };
    for args in [&["--help"][..], &["-h"], &["help"]] {
        check(args, "Usage: glmc <COMMAND>");
    }
    for sub in subcommands() {
        let usage = format!("Usage: glmc {sub}");
        check(&[&sub, "--help"], &usage);
        check(&[&sub, "-h"], &usage);
        check(&["help", &sub], &usage);
    }
    let o = glmc(&["--version"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout_of(&o).starts_with("glmc "), "{}", stdout_of(&o));
}

/// The help texts name what each subcommand takes (snapshotted so changes are reviewed).
#[test]
fn help_texts() {
    let mut all = String::new();
    for sub in ["compile", "dump", "import-hf"] {
        all.push_str(&format!("$ glmc {sub} --help\n"));
        all.push_str(&stdout_of(&glmc(&[sub, "--help"])));
        all.push('\n');
    }
    insta::assert_snapshot!("help_texts", all);
}

/// Without a CUDA compiler, compile still writes kernels.cu (and no cubin), and says in one line
/// how to get one; a compiler named with --nvcc that does not exist is an error (exit 2).
#[test]
fn compile_without_nvcc_writes_the_source_and_says_how_to_get_the_cubin() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("a");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_glmc"))
        .args([
            "compile",
            "models/tiny-sparse.ron",
            "--target",
            "sm120a",
            "-o",
        ])
        .arg(&out)
        .current_dir(common::repo())
        .env_remove("GLMC_NVCC")
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    let stderr = stderr_of(&o);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains("no CUDA compiler found") && stderr.contains("scripts/cuda-toolchain.sh"),
        "{stderr}"
    );
    assert!(out.join("kernels.cu").is_file());
    assert!(!out.join("kernels.sm120a.cubin").exists());

    let o = glmc(&[
        "compile",
        "models/tiny-sparse.ron",
        "--target",
        "sm120a",
        "--nvcc",
        "/nonexistent/nvcc",
        "-o",
        tmp.path().join("b").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let stderr = stderr_of(&o);
    assert!(
        stderr.contains("/nonexistent/nvcc") && stderr.contains("--nvcc"),
        "{stderr}"
    );
    assert!(!tmp.path().join("b").exists(), "no partial artifact");
}

/// `dump --lowered` prints the schedule the artifact holds.
#[test]
fn dump_lowered_prints_the_artifacts_schedule() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("a");
    compile("models/tiny-sparse.ron", "sm120", &out);
    let dumped = glmc_ok(&[
        "dump",
        "models/tiny-sparse.ron",
        "--phase",
        "decode",
        "--lowered",
        "--target",
        "sm120",
    ]);
    let written = std::fs::read_to_string(out.join("ir/decode.lowered.txt")).unwrap();
    assert_eq!(dumped, written);
    assert!(dumped.starts_with("schedule @decode"), "{dumped:.80}");
    let o = glmc(&["dump", "models/tiny-sparse.ron", "--lowered"]);
    assert_eq!(o.status.code(), Some(2), "--lowered needs --target");
}
