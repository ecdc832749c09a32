//! `glmc dump`: the IR on stdout.

use glmc_ir::{dot::to_dot, print_module, print_module_summary, serial::to_ron};

use crate::cli::{DumpArgs, Format, PhaseArg};
use crate::compile::build_module;

pub fn run(args: &DumpArgs) -> anyhow::Result<()> {
    let mut module = build_module(&args.model)?;
    if let Some(phase) = args.phase {
        let name = match phase {
            PhaseArg::Prefill => "prefill",
            PhaseArg::Decode => "decode",
        };
        module.functions.retain(|f| f.name == name);
    }
    let text = match args.format {
        Format::Text if args.full => print_module(&module),
        Format::Text => print_module_summary(&module),
        Format::Dot => module.functions.iter().map(to_dot).collect(),
        Format::Ron => to_ron(&module)?,
    };
    print!("{text}");
    Ok(())
}
