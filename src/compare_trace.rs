//! `glmc compare-trace A B`: the first node where two traces part. Like `cmp`, it exits 0 when
//! they agree, 1 when they part and 2 on bad input, so scripts can branch on it.

use std::process::ExitCode;

use anyhow::bail;
use glmc_runtime::trace::{compare, layer_of, read_trace, Divergence};

use crate::cli::CompareTraceArgs;

pub fn run(args: &CompareTraceArgs) -> anyhow::Result<ExitCode> {
    if args.rtol.is_nan() || args.rtol < 0.0 {
        bail!("--rtol {}: give a tolerance of 0 or more", args.rtol);
    }
    let a = read_trace(&args.a)?;
    let b = read_trace(&args.b)?;
    let c = compare(&a, &b, args.rtol);
    if c.compared == 0 {
        bail!(
            "{} and {} have no record in common ({} and {} records): were they traced from the same model and prompt?",
            args.a.display(),
            args.b.display(),
            a.len(),
            b.len()
        );
    }
    println!(
        "compared {} entries of {} nodes ({} of A have no counterpart in B)",
        c.compared, c.nodes, c.only_in_a
    );
    let Some(d) = &c.first_divergence else {
        println!("no divergence beyond rtol {}", args.rtol);
        return Ok(ExitCode::SUCCESS);
    };
    println!("first divergence: {}", describe(d));
    let topk = match &c.first_topk_divergence {
        _ if d.is_topk() => "here: the selected indices differ".to_string(),
        Some(t) => format!("only later, at {}", describe(t)),
        None => "none".to_string(),
    };
    println!("top-k decision that differs: {topk}");
    Ok(ExitCode::from(1))
}

fn describe(d: &Divergence) -> String {
    let at =
        d.a.position
            .map_or(String::new(), |p| format!(" position {p}"));
    let layer = layer_of(&d.a.node).map_or(String::new(), |l| format!(", layer {l}"));
    format!(
        "{} node \"{}\" ({}{layer}) output {}{at}: L2 {:.6e} vs {:.6e}, first values {:?} vs {:?} (relative difference {:.3e})",
        d.a.call, d.a.node, d.a.op, d.a.output, d.a.l2, d.b.l2, d.a.first, d.b.first, d.relative
    )
}
