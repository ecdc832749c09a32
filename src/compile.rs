//! `glmc compile`: config → verified graph → artifact directory.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context;
use glmc_codegen::Target;
use glmc_ir::{print_function, print_module, print_module_summary, verify_module, Module};

use crate::cli::CompileArgs;
use crate::model_source::load_config;

/// Builds and verifies the module of MODEL.
pub fn build_module(model: &Path) -> anyhow::Result<Module> {
    let config = load_config(model)?;
    let module = glmc_models::builder::build(&config).with_context(|| {
        format!(
            "building the graph of {} (a glmc bug: the config validated)",
            model.display()
        )
    })?;
    verify_module(&module).context("verifying the built graph (a glmc bug)")?;
    Ok(module)
}

pub fn run(args: &CompileArgs) -> anyhow::Result<()> {
    let target: Target = args.target.parse()?;
    let module = build_module(&args.model)?;
    let out = args
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{}.glmc", module.name)));
    let mut files: Vec<(PathBuf, String)> = vec![
        ("manifest.ron".into(), manifest(&module, target)),
        ("ir/module.txt".into(), print_module(&module)),
        ("ir/summary.txt".into(), print_module_summary(&module)),
    ];
    for f in &module.functions {
        files.push((format!("ir/{}.txt", f.name).into(), print_function(f)));
    }
    write_dir_atomically(&out, &files)?;
    eprintln!(
        "compiled {} for {target} into {}",
        module.name,
        out.display()
    );
    Ok(())
}

fn manifest(module: &Module, target: Target) -> String {
    let functions: Vec<String> = module
        .functions
        .iter()
        .map(|f| format!("{:?}", f.name))
        .collect();
    format!(
        "(\n    model: {:?},\n    target: {:?},\n    functions: [{}],\n    states: {},\n)\n",
        module.name,
        target.name(),
        functions.join(", "),
        module.states.len()
    )
}

/// Writes every file into a fresh sibling directory, then swaps it into place, so a failure
/// leaves either the old directory or none, never a mix.
fn write_dir_atomically(out: &Path, files: &[(PathBuf, String)]) -> anyhow::Result<()> {
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = out
        .file_name()
        .with_context(|| format!("{}: not a directory name", out.display()))?;
    let staging = parent.join(format!(
        ".{}.tmp{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| -> anyhow::Result<()> {
        if staging.exists() {
            fs::remove_dir_all(&staging)?;
        }
        for (rel, text) in files {
            let path = staging.join(rel);
            fs::create_dir_all(path.parent().expect("relative paths have a parent"))?;
            fs::write(&path, text)?;
        }
        if out.exists() {
            fs::remove_dir_all(out).with_context(|| format!("replacing {}", out.display()))?;
        }
        fs::rename(&staging, out)?;
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_dir_all(&staging);
    }
    result.with_context(|| format!("writing the artifact to {}", out.display()))
}

/// Writes one file through a temporary sibling and a rename.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    fs::write(&tmp, bytes)
        .and_then(|()| fs::rename(&tmp, path))
        .inspect_err(|_| {
            let _ = fs::remove_file(&tmp);
        })
}
