//! The checkpoint checked against the config, from the safetensors headers alone (no tensor data
//! is read, so `compile` stays fast): tensors the graph reads but the checkpoint lacks or stores
//! in another shape, each with the config key that asked for it, and tensors the checkpoint has
//! that the graph will not read, grouped by the key that explains them. `run`, `compile` and
//! `inspect` share it.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::path::PathBuf;

use glmc_ir::{Module, Op};
use glmc_models::ModelConfig;

use crate::tensor_roles::{
    asked_by, is_mtp_layer, kind_of, layer_of, shape_formula, unused_reason,
};
use crate::weights::{Checkpoint, Dtype};

/// How many problems [`CheckpointMismatch`] lists before summarising the rest.
const MAX_LISTED: usize = 20;

/// A number of tensors and their bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TensorGroup {
    pub count: usize,
    pub bytes: u64,
}

impl TensorGroup {
    fn add(&mut self, bytes: usize) {
        self.count += 1;
        self.bytes += bytes as u64;
    }
}

impl fmt::Display for TensorGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let noun = if self.count == 1 { "tensor" } else { "tensors" };
        write!(f, "{} {noun}, {}", self.count, human_bytes(self.bytes))
    }
}

/// A reason the checkpoint cannot run with this config.
#[derive(Clone, Debug, PartialEq)]
pub enum Problem {
    /// The graph reads `tensor`, which the checkpoint lacks; `asked_by` is the config key.
    Missing {
        tensor: String,
        asked_by: String,
        similar: Option<String>,
    },
    /// The checkpoint stores `tensor` as `actual`, the config gives `expected`; `formula` shows
    /// the keys the expected shape comes from.
    Shape {
        tensor: String,
        expected: Vec<usize>,
        actual: Vec<usize>,
        formula: Option<String>,
    },
    /// The checkpoint stores `tensor` in a dtype glmc cannot load (FP8, ...).
    DType { tensor: String, dtype: Dtype },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Missing {
                tensor,
                asked_by,
                similar,
            } => {
                write!(f, "tensor {tensor:?} is not in the checkpoint; the config asks for it through {asked_by}")?;
                if let Some(s) = similar {
                    write!(f, " (a similarly named tensor exists: {s:?})")?;
                }
                Ok(())
            }
            Problem::Shape {
                tensor,
                expected,
                actual,
                formula,
            } => {
                write!(
                    f,
                    "tensor {tensor:?} has shape {actual:?} in the checkpoint, but the config gives {expected:?}"
                )?;
                if let Some(formula) = formula {
                    write!(f, " ({formula})")?;
                }
                Ok(())
            }
            Problem::DType { tensor, dtype } => write!(
                f,
                "tensor {tensor:?} is stored as {dtype}, which glmc cannot load (supported: F32, \
                 BF16, F16, F64, I64, I32); dequantize the checkpoint to bf16"
            ),
        }
    }
}

/// The checkpoint does not fit the config: every problem, so one run diagnoses them all.
#[derive(Debug, thiserror::Error)]
#[error("{}", list(.dir, .problems))]
pub struct CheckpointMismatch {
    pub dir: PathBuf,
    pub problems: Vec<Problem>,
}

fn list(dir: &std::path::Path, problems: &[Problem]) -> String {
    let mut s = format!(
        "the checkpoint {} does not fit its config ({} problem{}):",
        dir.display(),
        problems.len(),
        if problems.len() == 1 { "" } else { "s" }
    );
    for p in problems.iter().take(MAX_LISTED) {
        let _ = write!(s, "\n  - {p}");
    }
    if problems.len() > MAX_LISTED {
        let _ = write!(s, "\n  and {} more", problems.len() - MAX_LISTED);
    }
    s
}

/// Everything the headers say about the checkpoint against the config.
#[derive(Clone, Debug, Default)]
pub struct CheckReport {
    pub dir: PathBuf,
    /// Why the checkpoint cannot run; empty when it can.
    pub problems: Vec<Problem>,
    /// Tensors the graph will not read, by the config key that explains them (`None`: no key
    /// does, an unknown name).
    pub unused: BTreeMap<Option<String>, (TensorGroup, String)>,
    /// The multi-token-prediction layer, which glmc does not run.
    pub mtp: TensorGroup,
    pub total: TensorGroup,
    pub by_dtype: BTreeMap<String, TensorGroup>,
    pub by_kind: BTreeMap<&'static str, TensorGroup>,
}

impl CheckReport {
    /// The checkpoint can run: nothing the graph reads is missing, misshapen or unloadable.
    pub fn can_run(&self) -> bool {
        self.problems.is_empty()
    }

    pub fn error(&self) -> Option<CheckpointMismatch> {
        (!self.can_run()).then(|| CheckpointMismatch {
            dir: self.dir.clone(),
            problems: self.problems.clone(),
        })
    }

    /// One warning, several lines, listing the tensors the graph will not read; `None` when it
    /// reads them all.
    pub fn unused_warning(&self) -> Option<String> {
        if self.unused.is_empty() {
            return None;
        }
        let mut all = TensorGroup::default();
        for (group, _) in self.unused.values() {
            all.count += group.count;
            all.bytes += group.bytes;
        }
        let mut s = format!(
            "the checkpoint {} has {all} that the graph will not read:",
            self.dir.display()
        );
        for (why, (group, first)) in &self.unused {
            let why = why.as_deref().unwrap_or(
                "unknown names that no config key accounts for (another model's checkpoint, or \
                 a converter's leftovers)",
            );
            let _ = write!(s, "\n  - {group} (first {first:?}): {why}");
        }
        Some(s)
    }

    /// A note on the MTP layer's tensors, which are expected and not run; `None` without them.
    pub fn mtp_note(&self) -> Option<String> {
        (self.mtp.count > 0).then(|| {
            format!(
                "the checkpoint's multi-token-prediction layer ({}) is recognised and not run: \
                 glmc does not do speculative decoding",
                self.mtp
            )
        })
    }
}

/// Every checkpoint tensor `module` reads, with the shape it expects, sorted by name.
pub fn graph_tensors(module: &Module) -> BTreeMap<String, Vec<u64>> {
    module
        .functions
        .iter()
        .flat_map(|f| f.graph.node_weights())
        .filter_map(|n| match &n.op {
            Op::Weight { recipe } => Some(recipe.leaves()),
            _ => None,
        })
        .flatten()
        .collect()
}

/// Compares `checkpoint` with the tensors a graph built from `config` reads (`needed`, from
/// [`graph_tensors`]); `sparse` says whether that graph runs the indexer.
pub fn check_against_config(
    config: &ModelConfig,
    sparse: bool,
    needed: &BTreeMap<String, Vec<u64>>,
    checkpoint: &Checkpoint,
) -> CheckReport {
    let mut report = CheckReport {
        dir: checkpoint.dir().to_path_buf(),
        ..CheckReport::default()
    };
    for (name, expected) in needed {
        let expected: Vec<usize> = expected.iter().map(|&d| d as usize).collect();
        let problem = match checkpoint.stored(name) {
            None => Problem::Missing {
                tensor: name.clone(),
                asked_by: asked_by(config, name),
                similar: checkpoint.similar(name),
            },
            Some(t) if t.shape != expected.as_slice() => Problem::Shape {
                tensor: name.clone(),
                expected,
                actual: t.shape.to_vec(),
                formula: shape_formula(config, name),
            },
            Some(t) if !Checkpoint::can_load(t.dtype) => Problem::DType {
                tensor: name.clone(),
                dtype: t.dtype,
            },
            Some(_) => continue,
        };
        report.problems.push(problem);
    }
    for name in checkpoint.names() {
        let stored = checkpoint
            .stored(name)
            .expect("names() lists stored tensors");
        let mtp = layer_of(name).is_some_and(|l| {
            let eh_proj = format!("model.layers.{l}.eh_proj.weight");
            is_mtp_layer(config, l, checkpoint.stored(&eh_proj).is_some())
        });
        report.total.add(stored.bytes);
        report
            .by_dtype
            .entry(stored.dtype.to_string())
            .or_default()
            .add(stored.bytes);
        report
            .by_kind
            .entry(kind_of(config, name, mtp))
            .or_default()
            .add(stored.bytes);
        if needed.contains_key(name) {
            continue;
        }
        if mtp {
            report.mtp.add(stored.bytes);
            continue;
        }
        let (group, _) = report
            .unused
            .entry(unused_reason(config, sparse, name))
            .or_insert_with(|| (TensorGroup::default(), name.to_string()));
        group.add(stored.bytes);
    }
    report
}

/// `bytes` in the largest binary unit that keeps it at least 1.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
