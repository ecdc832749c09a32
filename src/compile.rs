//! `glmc compile`, and the build every command shares: config → graph → pass pipeline.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context;
use glmc_codegen::artifact::Manifest;
use glmc_codegen::{lower_module, nvcc, render, Limits, Lowered, Target};
use glmc_ir::{print_function, print_module, print_module_summary, verify_module, DType, Module};
use glmc_models::builder::{BuildOptions, Sampler};
use glmc_models::{AttentionMode, ImportNote, ModelConfig};
use glmc_passes::{pipeline, AttentionChoice, PassRecord, PipelineOptions};
use regex::Regex;

use crate::cli::{AttentionArg, CompileArgs, DTypeArg, LimitsArgs, PipelineArgs};
use crate::explain::explain;
use crate::model_source::load_config;

/// A model after the pipeline.
pub struct Built {
    /// The config, its `dtype` replaced by `--dtype` when given.
    pub config: ModelConfig,
    /// Whether `config.dtype` is `--dtype`'s rather than the model's own.
    pub dtype_from_flag: bool,
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

/// The dtype the user asked for: the command line wins over the config.
pub fn dtype_choice(config: &ModelConfig, arg: Option<DTypeArg>) -> DType {
    match arg {
        Some(DTypeArg::F32) => DType::F32,
        Some(DTypeArg::Bf16) => DType::BF16,
        None => config.dtype,
    }
}

/// Loads MODEL, applies `--dtype`, builds (with `options`) and verifies its graph, and runs the
/// pass pipeline; `dump_after` keeps the module after the passes it matches.
pub fn build(
    model: &Path,
    options: &BuildOptions,
    args: &PipelineArgs,
    dump_after: Option<Regex>,
) -> anyhow::Result<Built> {
    let imported = load_config(model)?;
    let mut config = imported.config;
    config.dtype = dtype_choice(&config, args.dtype);
    let mut module = glmc_models::builder::build(&config, options).with_context(|| {
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
        dtype_from_flag: args.dtype.is_some(),
        notes: imported.notes,
        module,
        records,
        attention,
    })
}

/// What `--greedy` asks of the builder (see `Sampler::Greedy`).
pub fn build_options(greedy: bool) -> BuildOptions {
    BuildOptions {
        sampler: if greedy {
            Sampler::Greedy
        } else {
            Sampler::TopP
        },
        ..Default::default()
    }
}

/// The artifact's limits: the flags, with the context capped by the model's positions.
pub fn limits(config: &ModelConfig, args: &LimitsArgs) -> Limits {
    Limits {
        max_prefill_tokens: args.max_prefill_tokens,
        max_batch: args.max_batch,
        max_context: args
            .max_context
            .unwrap_or(config.max_position_embeddings.min(32768)),
    }
}

/// Lowers a built model for `target`.
pub fn lower(built: &Built, target: Target, args: &LimitsArgs) -> anyhow::Result<Lowered> {
    lower_rank(built, &built.module, target, args)
}

/// Lowers `module`, the built model or one rank's graph of it, for `target`.
pub fn lower_rank(
    built: &Built,
    module: &Module,
    target: Target,
    args: &LimitsArgs,
) -> anyhow::Result<Lowered> {
    let limits = limits(&built.config, args);
    if limits.max_context > built.config.max_position_embeddings {
        anyhow::bail!(
            "--max-context {} exceeds the model's max_position_embeddings ({}): pass at most that",
            limits.max_context,
            built.config.max_position_embeddings
        );
    }
    Ok(lower_module(module, target, limits)?)
}

pub fn run(args: &CompileArgs) -> anyhow::Result<()> {
    let target: Target = args.target.parse()?;
    let built = build(
        &args.model,
        &build_options(args.greedy),
        &args.pipeline,
        None,
    )?;
    if args.model.is_dir() {
        crate::checkpoint::check_if_present(&built, &args.model)?;
    }
    let lowered = lower(&built, target, &args.limits)?;
    let module = &built.module;
    // Partitioned before anything is written, so a degree that does not divide fails cleanly.
    let ranks = if args.tp > 1 {
        glmc_passes::partition(module, args.tp)?
    } else {
        Vec::new()
    };
    let rank0 = ranks.first();
    let out = args
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{}.glmc", module.name)));
    let explanation = explain(&built);
    let compiler = nvcc::find(args.nvcc.as_deref())?;
    let mut files: Files = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    for (r, rank) in ranks.iter().enumerate() {
        let lowered = lower_rank(&built, rank, target, &args.limits)?;
        let dir = PathBuf::from(format!("rank{r}"));
        let what = format!("rank {r}'s artifact");
        let (rank_files, rank_notes) =
            runnable_artifact(&built, rank, &lowered, compiler.as_ref(), &what)?;
        files.extend(rank_files.into_iter().map(|(p, b)| (dir.join(p), b)));
        notes.extend(rank_notes);
    }
    let (whole, whole_notes) =
        runnable_artifact(&built, module, &lowered, compiler.as_ref(), "the artifact")?;
    files.extend(whole);
    notes.extend(whole_notes);
    if compiler.is_none() {
        notes.push(
            "note: no CUDA compiler found (--nvcc PATH, $GLMC_NVCC or nvcc on PATH), so the artifact has kernels.cu but no cubin; scripts/cuda-toolchain.sh installs the pinned nvcc 13.0"
                .to_string(),
        );
    }
    let mut text_files: Vec<(PathBuf, String)> = vec![
        ("explain.txt".into(), explanation.clone()),
        ("ir/summary.txt".into(), print_module_summary(module)),
    ];
    for f in &module.functions {
        text_files.push((format!("ir/{}.txt", f.name).into(), print_function(f)));
    }
    let report = if args.report {
        let mut text = crate::report::report(module, target, &lowered)?;
        if let Some(rank0) = rank0 {
            text.push_str(&crate::tp_report::section(
                module,
                rank0,
                args.tp,
                built.config.max_position_embeddings,
            )?);
        }
        text_files.push(("report.txt".into(), text.clone()));
        Some(text)
    } else {
        None
    };
    files.extend(text_files.into_iter().map(|(p, t)| (p, t.into_bytes())));
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
    for n in &notes {
        eprintln!("{n}");
    }
    eprintln!(
        "compiled {} ({}) for {target} into {}",
        module.name,
        built.config.dtype,
        out.display()
    );
    Ok(())
}

/// Files of an artifact directory: each path, relative to the directory, and its bytes.
type Files = Vec<(PathBuf, Vec<u8>)>;

/// The runnable part of an artifact for `module` lowered as `lowered` (the whole model's, or a
/// tensor-parallel rank's): its manifest, kernels, cubin and ptxas report (when `compiler` is
/// given) and IR, with the notes to print about it (`what` names it there); the report and
/// explanation are the whole model's.
fn runnable_artifact(
    built: &Built,
    module: &Module,
    lowered: &Lowered,
    compiler: Option<&nvcc::Compiler>,
    what: &str,
) -> anyhow::Result<(Files, Vec<String>)> {
    let source = render::render(&lowered.kernels)?;
    let mut manifest = Manifest::new(
        module,
        built.config.dtype,
        lowered,
        built.records.iter().map(|r| r.name.to_string()).collect(),
        built.config.clone(),
    );
    manifest.notes = built.notes.iter().map(ToString::to_string).collect();
    let mut files: Files = Vec::new();
    let mut notes = Vec::new();
    if let Some(compiler) = compiler {
        // A tensor-parallel group's artifacts share most kernels: nvcc's cache serves them.
        let cache = nvcc::default_cache_dir();
        let compiled = nvcc::compile(compiler, &source, lowered.target, cache.as_deref())?;
        let usage = nvcc::parse_ptxas(&compiled.ptxas);
        for k in usage
            .iter()
            .filter(|k| k.spill_store_bytes + k.spill_load_bytes > 0)
        {
            notes.push(format!(
                "warning: ptxas spills registers to local memory in {k} ({what})"
            ));
        }
        manifest.ptxas = usage.iter().map(Into::into).collect();
        let target = lowered.target.name();
        let cubin = format!("kernels.{target}.cubin");
        manifest.cubin = Some(cubin.clone());
        manifest.compiler = Some(compiler.version.clone());
        files.push((cubin.into(), compiled.cubin));
        files.push((
            format!("ptxas.{target}.txt").into(),
            compiled.ptxas.into_bytes(),
        ));
    }
    if !manifest.complete {
        notes.push(format!(
            "note: {what} is incomplete and cannot run yet: no kernels for {} (ir/*.lowered.txt says why for each node)",
            manifest.missing_ops.join(", ")
        ));
    }
    let manifest_text =
        ron::ser::to_string_pretty(&manifest, ron::ser::PrettyConfig::new().depth_limit(5))
            .context("serialising the manifest (a glmc bug)")?;
    files.push(("manifest.ron".into(), manifest_text.into_bytes()));
    files.push(("kernels.cu".into(), source.into_bytes()));
    files.push(("ir/module.txt".into(), print_module(module).into_bytes()));
    for p in &lowered.phases {
        files.push((
            format!("ir/{}.lowered.txt", p.function).into(),
            p.print(&lowered.kernels).into_bytes(),
        ));
    }
    Ok((files, notes))
}

/// Writes every file into a fresh sibling directory, then swaps it into place, so a failure
/// leaves either the old directory or none, never a mix.
fn write_dir_atomically(out: &Path, files: &[(PathBuf, Vec<u8>)]) -> anyhow::Result<()> {
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
