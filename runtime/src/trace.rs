//! Per-node traces of a run (`glmc run --trace`) and where two traces first part
//! (`glmc compare-trace`).
//!
//! A trace holds, for every intermediate of every call, its L2 norm and first values, per
//! position where the value has one row per token. Nodes keep their HF module names through
//! every pass, so a trace of an optimised graph lines up with one of the builder's graph, and
//! the classic silent failure (an attention output 100× too small) shows as the first node
//! whose norm parts from the reference.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use glmc_ir::{Node, Op};
use serde::{Deserialize, Serialize};

use crate::generate::Call;
use crate::tensor::{Data, Tensor};

/// Values kept per record.
const FIRST_VALUES: usize = 4;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceEntry {
    /// `prefill` or `decode`, with the call's first position: `prefill@0`, `decode@7`.
    pub call: String,
    pub node: String,
    pub op: String,
    pub output: usize,
    /// The token position of this row, or none when the value is not one row per token.
    pub position: Option<usize>,
    pub shape: Vec<usize>,
    /// Integer values compare exactly, floats within a tolerance.
    pub integer: bool,
    pub l2: f64,
    pub first: Vec<f64>,
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}: not a glmc trace line: {message}")]
    Format {
        path: PathBuf,
        line: usize,
        message: String,
    },
}

/// Writes a trace as JSON lines, one entry per line.
pub struct TraceWriter {
    path: PathBuf,
    out: BufWriter<File>,
    error: Option<std::io::Error>,
}

impl TraceWriter {
    pub fn create(path: &Path) -> Result<TraceWriter, TraceError> {
        let file = File::create(path).map_err(|source| TraceError::Io {
            path: path.into(),
            source,
        })?;
        Ok(TraceWriter {
            path: path.into(),
            out: BufWriter::new(file),
            error: None,
        })
    }

    /// Records one executed node; weights and arguments are not intermediates and are skipped.
    /// The first write error is kept and returned by `finish`.
    pub fn record(&mut self, call: Call, node: &Node, outputs: &[&Tensor]) {
        if self.error.is_some() || matches!(node.op, Op::Weight { .. } | Op::Input { .. }) {
            return;
        }
        for entry in entries(call, node, outputs) {
            let line = serde_json::to_string(&entry).expect("trace entries serialize");
            if let Err(e) = writeln!(self.out, "{line}") {
                self.error = Some(e);
                return;
            }
        }
    }

    pub fn finish(mut self) -> Result<(), TraceError> {
        let path = self.path.clone();
        match self.error.take() {
            Some(source) => Err(TraceError::Io { path, source }),
            None => self
                .out
                .flush()
                .map_err(|source| TraceError::Io { path, source }),
        }
    }
}

fn entries(call: Call, node: &Node, outputs: &[&Tensor]) -> Vec<TraceEntry> {
    let (label, start, rows) = match call {
        Call::Prefill { start, len } => (format!("prefill@{start}"), start, len),
        Call::Decode { position } => (format!("decode@{position}"), position, 1),
    };
    let mut out = Vec::new();
    for (output, t) in outputs.iter().enumerate() {
        let values: Vec<f64> = match t.data() {
            Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
            Data::I64(v) => v.iter().map(|&x| x as f64).collect(),
        };
        let integer = matches!(t.data(), Data::I64(_));
        let entry = |position, chunk: &[f64]| TraceEntry {
            call: label.clone(),
            node: node.name.clone(),
            op: node.op.name().to_string(),
            output,
            position,
            shape: t.shape().to_vec(),
            integer,
            l2: chunk.iter().map(|x| x * x).sum::<f64>().sqrt(),
            first: chunk.iter().take(FIRST_VALUES).copied().collect(),
        };
        let per_row = t.shape().first() == Some(&rows) && !values.is_empty();
        if per_row {
            for (i, chunk) in values.chunks(values.len() / rows).enumerate() {
                out.push(entry(Some(start + i), chunk));
            }
        } else {
            out.push(entry(None, &values));
        }
    }
    out
}

pub fn read_trace(path: &Path) -> Result<Vec<TraceEntry>, TraceError> {
    let file = File::open(path).map_err(|source| TraceError::Io {
        path: path.into(),
        source,
    })?;
    let mut entries = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|source| TraceError::Io {
            path: path.into(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let entry = serde_json::from_str(&line).map_err(|e| TraceError::Format {
            path: path.into(),
            line: i + 1,
            message: e.to_string(),
        })?;
        entries.push(entry);
    }
    Ok(entries)
}

/// The first entry of `a` (in execution order) whose counterpart in `b` differs.
#[derive(Clone, Debug, PartialEq)]
pub struct Divergence {
    pub a: TraceEntry,
    pub b: TraceEntry,
    /// Relative difference of the L2 norms, or of the first values when the norms agree.
    pub relative: f64,
}

/// The result of comparing two traces.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    pub compared: usize,
    /// Entries of `a` with no counterpart in `b` (e.g. nodes a pass removed).
    pub only_in_a: usize,
    pub first_divergence: Option<Divergence>,
}

pub fn compare(a: &[TraceEntry], b: &[TraceEntry], rtol: f64) -> Comparison {
    let key = |e: &TraceEntry| (e.call.clone(), e.node.clone(), e.output, e.position);
    let index: HashMap<_, &TraceEntry> = b.iter().map(|e| (key(e), e)).collect();
    let mut comparison = Comparison {
        compared: 0,
        only_in_a: 0,
        first_divergence: None,
    };
    for ea in a {
        let Some(eb) = index.get(&key(ea)) else {
            comparison.only_in_a += 1;
            continue;
        };
        comparison.compared += 1;
        if comparison.first_divergence.is_some() {
            continue;
        }
        let relative = difference(ea, eb);
        if relative > rtol || ea.shape != eb.shape {
            comparison.first_divergence = Some(Divergence {
                a: ea.clone(),
                b: (*eb).clone(),
                relative,
            });
        }
    }
    comparison
}

fn difference(a: &TraceEntry, b: &TraceEntry) -> f64 {
    if a.integer || b.integer {
        return if a.first == b.first && a.l2 == b.l2 {
            0.0
        } else {
            f64::INFINITY
        };
    }
    let scale = a.l2.max(b.l2).max(f64::MIN_POSITIVE);
    let norms = (a.l2 - b.l2).abs() / scale;
    // First values are judged against the row's size: sqrt(n) values of magnitude l2/sqrt(n).
    let per_value = scale
        / (a.shape
            .iter()
            .skip(usize::from(a.position.is_some()))
            .product::<usize>()
            .max(1) as f64)
            .sqrt();
    let values = a
        .first
        .iter()
        .zip(&b.first)
        .map(|(x, y)| (x - y).abs() / per_value)
        .fold(0.0, f64::max);
    norms.max(values)
}
