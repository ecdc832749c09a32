//! `glmc compile`, and the build every command shares: config → graph → pass pipeline.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context;
use glmc_codegen::Target;
use glmc_ir::{print_function, print_module, print_module_summary, verify_module, Module};
use glmc_models::{AttentionMode, ImportNote, ModelConfig};
use glmc_passes::{pipeline, AttentionChoice, PassRecord, PipelineOptions};
use regex::Regex;

use crate::cli::{AttentionArg, CompileArgs, PipelineArgs};
use crate::explain::explain;
use crate::model_source::load_config;

/// A model after the pipeline.
pub struct Built {
    pub config: ModelConfig,
    /// What the config.json import took from transformers' defaults.
    pub notes: Vec<ImportNote>,
    pub module: Module,
    pub records: Vec<PassRecord>,
    pub attention: AttentionChoice,
}

/// The attention the user asked for: the command line wins over the config.
pub fn attention_choice(config: &ModelConfig, arg: Option<AttentionArg>) -> AttentionChoice {
    match arg {
        Some(AttentionArg::Auto) => AttentionChoice::Auto,
        Some(AttentionArg::Dense) => AttentionChoice::Dense,
        Some(AttentionArg::Sparse) => AttentionChoice::Sparse,
        None => match config.attention {
            AttentionMode::Auto => AttentionChoice::Auto,
            AttentionMode::Dense => AttentionChoice::Dense,
            AttentionMode::Sparse => AttentionChoice::Sparse,
        },
    }
}

/// Loads MODEL, builds and verifies its graph, and runs the pass pipeline; `dump_after` keeps
/// the module after the passes it matches.
pub fn build(
    model: &Path,
    args: &PipelineArgs,
    dump_after: Option<Regex>,
) -> anyhow::Result<Built> {
    let imported = load_config(model)?;
    let config = imported.config;
    let mut module = glmc_models::builder::build(&config).with_context(|| {
        format!(
            "building the graph of {} (a glmc bug: the config validated)",
            model.display()
        )
    })?;
    verify_module(&module).context("verifying the built graph (a glmc bug)")?;
    let attention = attention_choice(&config, args.attention);
    let options = PipelineOptions {
        no_optimization: args.opt_level == 0,
        attention,
        disabled: args.disable_pass.clone(),
    };
    let mut pm = pipeline(&options)?;
    if let Some(re) = dump_after {
        pm.dump_after(re);
    }
    let records = pm.run(&mut module)?;
    Ok(Built {
        config,
        notes: imported.notes,
        module,
        records,
        attention,
    })
}

pub fn run(args: &CompileArgs) -> anyhow::Result<()> {
    let target: Target = args.target.parse()?;
    let built = build(&args.model, &args.pipeline, None)?;
    if args.model.is_dir() {
        crate::checkpoint::check_if_present(&built, &args.model)?;
    }
    let module = &built.module;
    let out = args
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{}.glmc", module.name)));
    let explanation = explain(&built);
    let mut files: Vec<(PathBuf, String)> = vec![
        (
            "manifest.ron".into(),
            manifest(module, target, &built.records, &built.notes),
        ),
        ("explain.txt".into(), explanation.clone()),
        ("ir/module.txt".into(), print_module(module)),
        ("ir/summary.txt".into(), print_module_summary(module)),
    ];
    for f in &module.functions {
        files.push((format!("ir/{}.txt", f.name).into(), print_function(f)));
    }
    let report = if args.report {
        let text = crate::report::report(module, target)?;
        files.push(("report.txt".into(), text.clone()));
        Some(text)
    } else {
        None
    };
    write_dir_atomically(&out, &files)?;
    if args.explain {
        print!("{explanation}");
    }
    if let Some(text) = &report {
        print!("{text}");
    }
    if args.time_passes {
        for r in &built.records {
            let status = if r.changed { "changed" } else { "unchanged" };
            eprintln!(
                "{:>10.3} ms  {:<22} {status}",
                r.elapsed.as_secs_f64() * 1e3,
                r.name
            );
        }
    }
    eprintln!(
        "compiled {} for {target} into {}",
        module.name,
        out.display()
    );
    Ok(())
}

fn manifest(
    module: &Module,
    target: Target,
    records: &[PassRecord],
    notes: &[ImportNote],
) -> String {
    let quoted = |names: Vec<&str>| {
        names
            .iter()
            .map(|n| format!("{n:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "(\n    model: {:?},\n    target: {:?},\n    functions: [{}],\n    passes: [{}],\n    states: {},\n    notes: [{}],\n)\n",
        module.name,
        target.name(),
        quoted(module.functions.iter().map(|f| f.name.as_str()).collect()),
        quoted(records.iter().map(|r| r.name).collect()),
        module.states.len(),
        notes
            .iter()
            .map(|n| format!("{:?}", n.to_string()))
            .collect::<Vec<_>>()
            .join(", ")
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
