//! Argument definitions.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(
    name = "glmc",
    version,
    about = "A compiler for the GLM-5 model family (glm_moe_dsa)"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Build and verify the model's graph and write the artifact (IR dumps, manifest) to a directory.
    Compile(CompileArgs),
    /// Print the model's IR.
    Dump(DumpArgs),
    /// Convert an HF checkpoint's config.json (model_type glm_moe_dsa) into a model.ron.
    ImportHf(ImportHfArgs),
}

#[derive(Args)]
pub struct CompileArgs {
    /// A model.ron, or an HF checkpoint directory (its config.json is imported on the fly).
    pub model: PathBuf,
    /// GPU architecture: sm90, sm90a, sm120 or sm120a.
    #[arg(long)]
    pub target: String,
    /// Output directory; replaced as a whole, never left half-written. Default: `<model name>.glmc`.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PhaseArg {
    Prefill,
    Decode,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// The canonical text form (a summary for deep models unless --full).
    Text,
    /// Graphviz.
    Dot,
    /// The module as RON.
    Ron,
}

#[derive(Args)]
pub struct DumpArgs {
    /// A model.ron, or an HF checkpoint directory.
    pub model: PathBuf,
    /// Only this entry function (default: both).
    #[arg(long, value_enum)]
    pub phase: Option<PhaseArg>,
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
    /// Print every layer; by default runs of identical layers are printed once, with an op histogram.
    #[arg(long)]
    pub full: bool,
}

#[derive(Args)]
pub struct ImportHfArgs {
    /// An HF checkpoint directory or its config.json.
    pub path: PathBuf,
    /// Where to write the model.ron.
    #[arg(short, long)]
    pub output: PathBuf,
}
