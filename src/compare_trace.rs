//! `glmc compare-trace A B`: the first node where two traces part. Like `cmp`, it exits 0 when
//! they agree, 1 when they part and 2 on bad input, so scripts can branch on it. B may be the
//! trace of a `--tp N` run with A a single-device one: each rank is then lined up with A, a
//! rank's block of a split value with the same block of A's (see `compare_ranks`).

use std::process::ExitCode;

use anyhow::bail;
use glmc_runtime::trace::{compare_traces, layer_of, read_trace_file, Divergence};

use crate::cli::CompareTraceArgs;

pub fn run(args: &CompareTraceArgs) -> anyhow::Result<ExitCode> {
    if args.rtol.is_nan() || args.rtol < 0.0 {
        bail!("--rtol {}: give a tolerance of 0 or more", args.rtol);
    }
    let a = read_trace_file(&args.a)?;
    let b = read_trace_file(&args.b)?;
    let c = compare_traces(&a, &b, args.rtol)
        .map_err(|e| anyhow::anyhow!("{} and {}: {e}", args.a.display(), args.b.display()))?;
    if c.compared == 0 {
        bail!(
            "{} and {} have no record in common ({} and {} records): were they traced from the same model and prompt?",
            args.a.display(),
            args.b.display(),
            a.entries.len(),
            b.entries.len()
        );
    }
    let against = match c.ranks {
        1 => String::new(),
        n => format!(" against each of B's {n} ranks"),
    };
    println!(
        "compared {} entries of {} nodes{against} ({} of A have no counterpart in B)",
        c.compared, c.nodes, c.only_in_a
    );
    if c.partial_skipped > 0 {
        println!(
            "skipped {} entries of A that B's ranks hold as partial sums: the all_reduce that makes a sum whole is compared, under its node's name",
            c.partial_skipped
        );
    }
    if c.stacked_skipped > 0 {
        println!(
            "skipped {} entries of A that B's ranks hold as their block of each part of a stacked GEMM output (the fused MLP gate/up): the slices that take each part are compared, block by block",
            c.stacked_skipped
        );
    }
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
    let rank = d.b.rank.map_or(String::new(), |r| format!(" rank {r}"));
    let values = match &d.block {
        None => format!(
            "L2 {:.6e} vs {:.6e}, first values {:?} vs {:?}",
            d.a.l2, d.b.l2, d.a.first, d.b.first
        ),
        Some(b) => {
            let per_rank = d.b.parts.as_ref().map_or(1, |p| p.blocks.len());
            let first = b.index - b.index % per_rank.max(1);
            let named = if d.b.node == d.a.node {
                String::new()
            } else {
                format!(", as node \"{}\"", d.b.node)
            };
            format!(
                "block {} of the {} along axis {} (the rank holds blocks {first}..{}{named}): L2 {:.6e} vs {:.6e}, first values {:?} vs {:?}",
                b.index,
                b.count,
                b.axis,
                first + per_rank,
                b.a.l2,
                b.b.l2,
                b.a.first,
                b.b.first
            )
        }
    };
    format!(
        "{}{rank} node \"{}\" ({}{layer}) output {}{at}: {values} (relative difference {:.3e})",
        d.a.call, d.a.node, d.a.op, d.a.output, d.relative
    )
}
