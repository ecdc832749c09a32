//! The `glmc` command line.
//!
//! Exit codes: 0 on success, 2 on any failure (bad input, a missing file, an unknown target);
//! errors go to stderr, one paragraph each, naming the file or field and the fix. Like `cmp`,
//! `compare-trace` exits 1 when the traces part.

mod bench;
mod checkpoint;
mod cli;
mod compare_trace;
mod compile;
mod dump;
mod explain;
mod inspect;
mod model_source;
mod report;
mod run;
mod tp_report;
mod tp_run;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // clap prints help and version to stdout with success, usage errors to stderr.
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match std::panic::catch_unwind(|| run(cli)) {
        Ok(Ok(code)) => code,
        Ok(Err(e)) => {
            eprintln!("error: {}", report(&e));
            ExitCode::from(2)
        }
        Err(_) => {
            eprintln!("error: glmc hit an internal error (the message above); this is a glmc bug, please report it");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Compile(args) => compile::run(&args),
        Command::Dump(args) => dump::run(&args),
        Command::ImportHf(args) => model_source::import_hf(&args),
        Command::Run(args) => run::run(&args),
        Command::CompareTrace(args) => return compare_trace::run(&args),
        Command::Inspect(args) => inspect::run(&args),
        Command::Bench(args) => bench::run(&args),
    }
    .map(|()| ExitCode::SUCCESS)
}

/// The error and its causes, `: `-separated like `{e:#}`, but a cause whose text already ends the
/// message is not repeated (a `thiserror` variant that prints `{source}` and also returns it from
/// `source()` would otherwise show the OS error twice).
fn report(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if text.ends_with(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}
