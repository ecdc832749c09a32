//! `glmc dump`: the IR on stdout, after the whole pipeline or after chosen passes.

use std::io::Write;

use anyhow::Context;
use glmc_ir::{dot::to_dot, print_module, print_module_summary, serial::to_ron, Module};
use glmc_passes::manager::full_match;
use regex::Regex;

use crate::cli::{DumpArgs, Format, PhaseArg};
use crate::compile::build;

pub fn run(args: &DumpArgs) -> anyhow::Result<()> {
    let after = match &args.after {
        Some(pattern) => Some(
            Regex::new(pattern)
                .with_context(|| format!("--after {pattern:?} is not a valid regex"))?,
        ),
        None => None,
    };
    let built = build(
        &args.model,
        &crate::compile::build_options(args.greedy),
        &args.pipeline,
        after.clone(),
    )?;
    if args.rank >= args.tp {
        anyhow::bail!(
            "--rank {} is not a rank of --tp {}: ranks are 0..{}",
            args.rank,
            args.tp,
            args.tp
        );
    }
    // Rank R's graph, with its collectives, when --tp asks for one.
    let rank_module = || -> anyhow::Result<glmc_ir::Module> {
        Ok(match args.tp {
            1 => built.module.clone(),
            tp => glmc_passes::partition(&built.module, tp)?.swap_remove(args.rank as usize),
        })
    };
    let mut out = String::new();
    if args.lowered {
        let target = args
            .target
            .as_deref()
            .expect("clap requires --target with --lowered")
            .parse()?;
        let module = rank_module()?;
        let lowered = crate::compile::lower_rank(&built, &module, target, &args.limits)?;
        for phase in &lowered.phases {
            if args.phase.is_none_or(|p| phase_name(p) == phase.function) {
                out.push_str(&phase.print(&lowered.kernels));
            }
        }
    } else if after.is_some() {
        let matching = built
            .records
            .iter()
            .filter(|r| after.as_ref().is_some_and(|re| full_match(re, r.name)));
        for record in matching {
            let status = if record.changed {
                "changed"
            } else {
                "unchanged"
            };
            out.push_str(&format!(
                "// ===== after pass {} ({status}) =====\n",
                record.name
            ));
            if let Some(module) = &record.snapshot {
                out.push_str(&render(args, module.clone())?);
            }
        }
    } else {
        out = render(args, rank_module()?)?;
    }
    // Not `print!`: it panics when the reader goes away (`glmc dump … | head`); a closed pipe
    // only means nobody wants the rest.
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        result => result.context("writing the dump to stdout"),
    }
}

fn render(args: &DumpArgs, mut module: Module) -> anyhow::Result<String> {
    if let Some(phase) = args.phase {
        module.functions.retain(|f| f.name == phase_name(phase));
    }
    Ok(match args.format {
        Format::Text if args.full => print_module(&module),
        Format::Text => print_module_summary(&module),
        Format::Dot => module.functions.iter().map(to_dot).collect(),
        Format::Ron => to_ron(&module)?,
    })
}

fn phase_name(phase: PhaseArg) -> &'static str {
    match phase {
        PhaseArg::Prefill => "prefill",
        PhaseArg::Decode => "decode",
    }
}
