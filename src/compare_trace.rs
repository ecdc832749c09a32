//! `glmc compare-trace A B`: the first node where two traces part.

use glmc_runtime::trace::{compare, read_trace};

use crate::cli::CompareTraceArgs;

pub fn run(args: &CompareTraceArgs) -> anyhow::Result<()> {
    let a = read_trace(&args.a)?;
    let b = read_trace(&args.b)?;
    let c = compare(&a, &b, args.rtol);
    println!(
        "compared {} entries ({} of A have no counterpart in B)",
        c.compared, c.only_in_a
    );
    match c.first_divergence {
        None => println!("no divergence beyond rtol {}", args.rtol),
        Some(d) => {
            let at =
                d.a.position
                    .map_or(String::new(), |p| format!(" position {p}"));
            println!(
                "first divergence: {} node \"{}\" ({}) output {}{at}: L2 {:.6e} vs {:.6e}, first values {:?} vs {:?} (relative difference {:.3e})",
                d.a.call, d.a.node, d.a.op, d.a.output, d.a.l2, d.b.l2, d.a.first, d.b.first, d.relative
            );
        }
    }
    Ok(())
}
