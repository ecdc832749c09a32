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

/// Ops whose integer output is a top-k decision (which keys or experts a row selects): a
/// divergence there changes what later nodes read, not only how much.
const TOPK_OPS: [&str; 2] = ["dsa.topk", "moe.route"];

/// The label of a call in traces and messages: `prefill@0`, `decode@7`.
pub fn call_label(call: Call) -> String {
    match call {
        Call::Prefill { start, .. } => format!("prefill@{start}"),
        Call::Decode { position } => format!("decode@{position}"),
    }
}

/// The decoder layer a node belongs to, from its HF module name (`model.layers.3.…`).
pub fn layer_of(node: &str) -> Option<u64> {
    let mut parts = node.split('.');
    while let Some(p) = parts.next() {
        if p == "layers" {
            return parts.next()?.parse().ok();
        }
    }
    None
}

fn layer_text(node: &str) -> String {
    layer_of(node).map_or("outside the decoder layers".to_string(), |l| {
        format!("in layer {l}")
    })
}

/// The first node of a `--check-finite` run whose output holds NaN or an infinity.
#[derive(Debug, thiserror::Error)]
#[error(
    "--check-finite: node \"{node}\" ({op}, {layer}) produced {count} non-finite value(s) in output {output} (shape {shape:?}) during {call}; the nodes before it were finite: compare a --trace of this run with one on the other device (glmc compare-trace) to see where the values first grow",
    layer = layer_text(node)
)]
pub struct NonFinite {
    pub call: String,
    pub node: String,
    pub op: String,
    pub output: usize,
    pub shape: Vec<usize>,
    pub count: usize,
}

/// Checks `node`'s outputs for NaN and infinities. `dsa.score` masks the keys after a query's
/// position with −inf by design, so −inf is allowed there (NaN and +inf are not).
pub fn check_finite(call: Call, node: &Node, outputs: &[&Tensor]) -> Result<(), NonFinite> {
    let masks = matches!(node.op, Op::DsaScore { .. });
    for (output, t) in outputs.iter().enumerate() {
        let Data::F32(values) = t.data() else {
            continue;
        };
        let count = values
            .iter()
            .filter(|x| !(x.is_finite() || masks && **x == f32::NEG_INFINITY))
            .count();
        if count > 0 {
            return Err(NonFinite {
                call: call_label(call),
                node: node.name.clone(),
                op: node.op.name().to_string(),
                output,
                shape: t.shape().to_vec(),
                count,
            });
        }
    }
    Ok(())
}

/// A deliberately broken node: a test hook for the negative controls of `glmc compare-trace`
/// and `--check-finite`, which must name the node a broken kernel computes. Set
/// `GLMC_TEST_BREAK_NODE=NODE` to have the executor replace every float output value `x` of IR
/// node `NODE` by `2x + 1` right after the node runs (later nodes read the broken values), or
/// `GLMC_TEST_BREAK_NODE=NODE=nan` to make its first value NaN. Never set in normal use.
#[derive(Clone, Debug, PartialEq)]
pub struct Fault {
    pub node: String,
    pub nan: bool,
}

impl Fault {
    pub const ENV: &'static str = "GLMC_TEST_BREAK_NODE";

    /// The fault `GLMC_TEST_BREAK_NODE` asks for, if any.
    pub fn from_env() -> Option<Fault> {
        let value = std::env::var(Fault::ENV).ok()?;
        Some(match value.strip_suffix("=nan") {
            Some(node) => Fault {
                node: node.to_string(),
                nan: true,
            },
            None => Fault {
                node: value,
                nan: false,
            },
        })
    }

    /// `x`, broken: integer tensors are left as they are.
    pub fn apply(&self, x: &Tensor) -> Tensor {
        let Data::F32(values) = x.data() else {
            return x.clone();
        };
        let mut broken: Vec<f32> = if self.nan {
            values.clone()
        } else {
            values.iter().map(|v| 2.0 * v + 1.0).collect()
        };
        if let (true, Some(first)) = (self.nan, broken.first_mut()) {
            *first = f32::NAN;
        }
        Tensor::f32(x.shape().to_vec(), broken).expect("the shape is unchanged")
    }
}

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
    /// The L2 norm of the finite values.
    #[serde(with = "json_float")]
    pub l2: f64,
    /// How many values are infinite or NaN (masked indexer scores are −inf by design).
    pub non_finite: usize,
    #[serde(with = "json_floats")]
    pub first: Vec<f64>,
}

/// JSON has no infinities, and masked indexer scores are −inf: non-finite values travel as the
/// strings `"inf"`, `"-inf"` and `"nan"`.
mod json_float {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    pub(super) enum Repr {
        Finite(f64),
        Special(String),
    }

    pub(super) fn repr(x: f64) -> Repr {
        match x {
            x if x.is_finite() => Repr::Finite(x),
            x if x.is_nan() => Repr::Special("nan".into()),
            x if x > 0.0 => Repr::Special("inf".into()),
            _ => Repr::Special("-inf".into()),
        }
    }

    pub(super) fn value<E: serde::de::Error>(r: Repr) -> Result<f64, E> {
        match r {
            Repr::Finite(x) => Ok(x),
            Repr::Special(s) => match s.as_str() {
                "inf" => Ok(f64::INFINITY),
                "-inf" => Ok(f64::NEG_INFINITY),
                "nan" => Ok(f64::NAN),
                other => Err(E::custom(format!(
                    "expected a number, \"inf\", \"-inf\" or \"nan\", found {other:?}"
                ))),
            },
        }
    }

    pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
        repr(*x).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        value(Repr::deserialize(d)?)
    }
}

mod json_floats {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::json_float::{repr, value, Repr};

    pub fn serialize<S: Serializer>(xs: &[f64], s: S) -> Result<S::Ok, S::Error> {
        xs.iter().map(|&x| repr(x)).collect::<Vec<_>>().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
        Vec::<Repr>::deserialize(d)?
            .into_iter()
            .map(value)
            .collect()
    }
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
    let label = call_label(call);
    let (start, rows) = match call {
        Call::Prefill { start, len } => (start, len),
        Call::Decode { position } => (position, 1),
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
            l2: chunk
                .iter()
                .filter(|x| x.is_finite())
                .map(|x| x * x)
                .sum::<f64>()
                .sqrt(),
            non_finite: chunk.iter().filter(|x| !x.is_finite()).count(),
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

impl Divergence {
    /// Whether the entries are a top-k decision (selected key or expert indices).
    pub fn is_topk(&self) -> bool {
        self.a.integer && TOPK_OPS.contains(&self.a.op.as_str())
    }
}

/// The result of comparing two traces.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// Entries found in both traces, and the distinct nodes they belong to.
    pub compared: usize,
    pub nodes: usize,
    /// Entries of `a` with no counterpart in `b` (e.g. nodes a pass removed, or views the GPU
    /// never materialises).
    pub only_in_a: usize,
    pub first_divergence: Option<Divergence>,
    /// The first top-k decision that differs, wherever it is.
    pub first_topk_divergence: Option<Divergence>,
}

pub fn compare(a: &[TraceEntry], b: &[TraceEntry], rtol: f64) -> Comparison {
    let key = |e: &TraceEntry| (e.call.clone(), e.node.clone(), e.output, e.position);
    let index: HashMap<_, &TraceEntry> = b.iter().map(|e| (key(e), e)).collect();
    let mut comparison = Comparison {
        compared: 0,
        nodes: 0,
        only_in_a: 0,
        first_divergence: None,
        first_topk_divergence: None,
    };
    let mut nodes = std::collections::HashSet::new();
    for ea in a {
        let Some(eb) = index.get(&key(ea)) else {
            comparison.only_in_a += 1;
            continue;
        };
        comparison.compared += 1;
        nodes.insert(ea.node.as_str());
        if comparison.first_divergence.is_some() && comparison.first_topk_divergence.is_some() {
            continue;
        }
        let relative = difference(ea, eb);
        if relative > rtol || ea.shape != eb.shape {
            let d = Divergence {
                a: ea.clone(),
                b: (*eb).clone(),
                relative,
            };
            if d.is_topk() && comparison.first_topk_divergence.is_none() {
                comparison.first_topk_divergence = Some(d.clone());
            }
            comparison.first_divergence.get_or_insert(d);
        }
    }
    comparison.nodes = nodes.len();
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
    if a.non_finite != b.non_finite {
        return f64::INFINITY;
    }
    let same = |x: &f64, y: &f64| x == y || (x.is_nan() && y.is_nan());
    if a.l2 == b.l2 && a.first.iter().zip(&b.first).all(|(x, y)| same(x, y)) {
        return 0.0;
    }
    if !(a.l2.is_finite() && b.l2.is_finite()) {
        return f64::INFINITY;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(node: &str, position: usize, l2: f64, first: Vec<f64>) -> TraceEntry {
        TraceEntry {
            call: "prefill@0".into(),
            node: node.into(),
            op: "matmul".into(),
            output: 0,
            position: Some(position),
            shape: vec![3, 4],
            integer: false,
            l2,
            non_finite: 0,
            first,
        }
    }

    /// The classic silent failure: an attention output 100× too small, which every later node
    /// inherits. The comparison must name the attention, not a later node.
    #[test]
    fn names_the_first_node_that_parts() {
        let good = vec![
            entry("model.layers.0.input_layernorm", 0, 2.0, vec![1.0, -1.0]),
            entry("model.layers.0.self_attn.attn", 0, 4.0, vec![2.0, 1.0]),
            entry("model.layers.0.self_attn.o_proj", 0, 8.0, vec![3.0, 4.0]),
        ];
        let mut bad = good.clone();
        bad[1].l2 /= 100.0;
        bad[1].first = vec![0.02, 0.01];
        bad[2].l2 = 5.0;
        let c = compare(&good, &bad, 1e-3);
        assert_eq!(c.compared, 3);
        let d = c.first_divergence.expect("the traces differ");
        assert_eq!(d.a.node, "model.layers.0.self_attn.attn");
        assert!((d.relative - 0.99).abs() < 1e-9, "{}", d.relative);
    }

    #[test]
    fn agrees_within_tolerance_and_counts_unmatched_entries() {
        let a = vec![
            entry("x", 0, 1.0, vec![0.5]),
            entry("only_a", 0, 1.0, vec![0.5]),
        ];
        let b = vec![entry("x", 0, 1.0 + 1e-6, vec![0.5 + 1e-7])];
        let c = compare(&a, &b, 1e-3);
        assert_eq!((c.compared, c.only_in_a, c.first_divergence), (1, 1, None));
    }

    #[test]
    fn infinities_round_trip_through_json() {
        let mut e = entry(
            "scores",
            0,
            f64::INFINITY,
            vec![1.5, f64::NEG_INFINITY, f64::NAN],
        );
        e.non_finite = 2;
        let line = serde_json::to_string(&e).unwrap();
        let back: TraceEntry = serde_json::from_str(&line).unwrap();
        assert_eq!(
            (back.l2, back.first[0], back.first[1]),
            (f64::INFINITY, 1.5, f64::NEG_INFINITY)
        );
        assert!(back.first[2].is_nan());
        assert!(compare(&[e.clone()], &[back], 1e-6)
            .first_divergence
            .is_none());
        let mut fewer_masked = e.clone();
        fewer_masked.non_finite = 1;
        assert!(compare(&[e], &[fewer_masked], 1e-6)
            .first_divergence
            .is_some());
    }

    #[test]
    fn integer_values_must_match_exactly() {
        let mut a = entry("topk", 0, 3.0, vec![0.0, 1.0]);
        a.integer = true;
        let mut b = a.clone();
        b.first = vec![0.0, 2.0];
        assert!(compare(&[a.clone()], &[b], 0.5).first_divergence.is_some());
        assert!(compare(&[a.clone()], &[a], 0.0).first_divergence.is_none());
    }
}
