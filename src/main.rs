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
            if a_tensor_parallel_group_failed(&e) {
                leave(2);
            }
            ExitCode::from(2)
        }
        Err(_) => {
            eprintln!("error: glmc hit an internal error (the message above); this is a glmc bug, please report it");
            ExitCode::from(2)
        }
    }
}

fn a_tensor_parallel_group_failed(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<glmc_runtime::GenerateError>(),
            Some(glmc_runtime::GenerateError::Tp(_))
        )
    })
}

/// Exits at once with `code`, running no exit handlers: a failed tensor-parallel group's
/// threads may still be inside NCCL or CUDA (an abort waits for its graphs, which are never
/// destroyed), and the libraries' exit handlers would tear them down underneath it.
fn leave(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit ends the process; nothing after it runs.
    unsafe { libc::_exit(code) }
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
