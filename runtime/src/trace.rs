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

use glmc_ir::{Node, Op, Shard};
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
    "--check-finite: node \"{node}\" ({op}, {layer}{on_rank}) produced {count} non-finite value(s) in output {output} (shape {shape:?}) during {call}; the nodes before it were finite: compare a --trace of this run with one on the other device (glmc compare-trace) to see where the values first grow",
    layer = layer_text(node),
    on_rank = rank.map_or(String::new(), |r| format!(", on rank {r}"))
)]
pub struct NonFinite {
    pub call: String,
    /// The rank of a tensor-parallel run it happened on (`None` on one device).
    pub rank: Option<usize>,
    pub node: String,
    pub op: &'static str,
    pub output: usize,
    pub shape: Vec<usize>,
    pub count: usize,
}

/// Checks `node`'s outputs (on `rank` of a tensor-parallel run) for NaN and infinities.
/// `dsa.score` masks the keys after a query's position with −inf by design, so −inf is allowed
/// there (NaN and +inf are not).
pub fn check_finite(
    call: Call,
    rank: Option<usize>,
    node: &Node,
    outputs: &[&Tensor],
) -> Result<(), NonFinite> {
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
                rank,
                node: node.name.clone(),
                op: node.op.name(),
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
/// node `NODE` by `2x + 1` right after the node runs (later nodes read the broken values),
/// `NODE=nan` to make its first value NaN, or `NODE=swap` to exchange the two halves of its
/// first axis of even length (a rank that loaded its heads of a weight in the wrong order).
/// `NODE@R` breaks the node on rank R of a tensor-parallel run (default: rank 0). Never set in
/// normal use.
#[derive(Clone, Debug, PartialEq)]
pub struct Fault {
    pub node: String,
    pub rank: usize,
    pub kind: FaultKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// `x` → `2x + 1`.
    Affine,
    /// The first value becomes NaN.
    Nan,
    /// The halves of the first axis of even length are exchanged.
    Swap,
}

impl Fault {
    pub const ENV: &'static str = "GLMC_TEST_BREAK_NODE";

    /// The fault `GLMC_TEST_BREAK_NODE` asks for, if any.
    pub fn from_env() -> Option<Fault> {
        Some(Fault::parse(&std::env::var(Fault::ENV).ok()?))
    }

    /// `NODE[@RANK][=nan|=swap]`; node names hold no `@`, so a `@` followed by a number is the
    /// rank.
    pub fn parse(value: &str) -> Fault {
        let (target, kind) = if let Some(t) = value.strip_suffix("=nan") {
            (t, FaultKind::Nan)
        } else if let Some(t) = value.strip_suffix("=swap") {
            (t, FaultKind::Swap)
        } else {
            (value, FaultKind::Affine)
        };
        let (node, rank) = match target.rsplit_once('@') {
            Some((node, rank)) if rank.parse::<usize>().is_ok() => {
                (node, rank.parse().expect("checked"))
            }
            _ => (target, 0),
        };
        Fault {
            node: node.to_string(),
            rank,
            kind,
        }
    }

    /// `x`, broken: integer tensors are left as they are.
    pub fn apply(&self, x: &Tensor) -> Tensor {
        let Data::F32(values) = x.data() else {
            return x.clone();
        };
        let broken: Vec<f32> = match self.kind {
            FaultKind::Affine => values.iter().map(|v| 2.0 * v + 1.0).collect(),
            FaultKind::Nan => {
                let mut b = values.clone();
                if let Some(first) = b.first_mut() {
                    *first = f32::NAN;
                }
                b
            }
            FaultKind::Swap => swap_halves(x.shape(), values),
        };
        Tensor::f32(x.shape().to_vec(), broken).expect("the shape is unchanged")
    }
}

/// `values` of `shape` with the two halves of the first axis of even length exchanged.
fn swap_halves(shape: &[usize], values: &[f32]) -> Vec<f32> {
    let Some(axis) = shape.iter().position(|&n| n >= 2 && n % 2 == 0) else {
        return values.to_vec();
    };
    let inner: usize = shape[axis + 1..].iter().product();
    let half = shape[axis] / 2 * inner;
    values
        .chunks(shape[axis] * inner)
        .flat_map(|block| block[half..].iter().chain(&block[..half]))
        .copied()
        .collect()
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
    /// In a trace of a tensor-parallel run: the rank that computed the value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u64>,
    /// What the rank holds of the single-device value: absent for all of it, a block along an
    /// axis, or a partial sum (whole only after its `all_reduce`, recorded under the node's
    /// own name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<Shard>,
    /// Digests of equal blocks along the axis tensor parallelism splits: in a single-device
    /// trace for every value some rank holds a block of, in a rank's trace for its block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parts: Option<Parts>,
}

impl TraceEntry {
    /// Whether the record is a top-k decision (selected key or expert indices).
    pub fn is_topk(&self) -> bool {
        self.integer && TOPK_OPS.contains(&self.op.as_str())
    }
}

/// A value cut into equal blocks along `axis` (of the entry's shape), each digested.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Parts {
    pub axis: usize,
    pub blocks: Vec<Digest>,
}

/// The L2 norm, non-finite count and first values (row-major) of one block.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Digest {
    #[serde(with = "json_float")]
    pub l2: f64,
    pub non_finite: usize,
    #[serde(with = "json_floats")]
    pub first: Vec<f64>,
    /// How many values the block holds.
    pub len: usize,
}

/// The first line of a trace: what was run, so that `compare-trace` refuses to line up traces
/// of different models or prompts rather than report their difference as a divergence.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceHeader {
    /// The module's name.
    pub model: String,
    /// The prompt's token ids.
    pub prompt: Vec<u64>,
    /// The tensor-parallel degree: 1 for a single device, N for the entries of N ranks.
    pub tp: u64,
}

/// The header line's one key, which no entry has.
#[derive(Serialize, Deserialize)]
struct HeaderLine {
    glmc_trace: TraceHeader,
}

/// A trace as read back.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    /// `None` for a trace written before traces had headers, or assembled by hand.
    pub header: Option<TraceHeader>,
    pub entries: Vec<TraceEntry>,
}

/// What a trace records beyond each value's own digest, so that ranks' traces line up with a
/// single-device one: see [`TraceWriter::create`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TraceLayout {
    /// The number of blocks a whole split value is digested in (`glmc_passes::SplitLayout`'s
    /// `units`: every TP degree the model allows divides it); 1 or 0 records no blocks.
    pub units: u64,
    /// For a single-device run: `(function, node)` → the axis along which ranks would hold
    /// blocks of the node's outputs. A rank's own nodes say it themselves (`Node::shard`).
    pub split: HashMap<(String, String), u32>,
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

/// Why two traces cannot be lined up at all (as opposed to parting at a node).
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum Mismatch {
    #[error("the traces are of different prompts: A is of model \"{a_model}\" with prompt {a_prompt:?}, B of model \"{b_model}\" with prompt {b_prompt:?}; trace the same model and prompt")]
    Run {
        a_model: String,
        a_prompt: Vec<u64>,
        b_model: String,
        b_prompt: Vec<u64>,
    },
    #[error("A is a trace of {0} tensor-parallel ranks; give the single-device (TP=1) trace first and the ranks' trace second")]
    RanksFirst(u64),
    #[error("A is a trace of {a} tensor-parallel ranks, B of {b}; rank traces line up with one of the same degree, or with a single-device trace")]
    Degrees { a: u64, b: u64 },
    #[error("{at}: A holds {a:?}, rank {} of B {b:?}, which is not {what}; were the traces made from the same model?", at.rank)]
    Shape {
        at: Box<At>,
        a: Vec<usize>,
        b: Vec<usize>,
        what: String,
    },
    #[error("{at}: rank {} holds a block along axis {axis}, and A has no block digests along it; record the single-device trace with this glmc's `run --trace` (on the model, not a compiled artifact)", at.rank)]
    NoParts { at: Box<At>, axis: usize },
    #[error("{at}: A digests the value in {a} blocks, rank {} of {degree} digests its block in {b}, which is not 1/{degree} of them; were both traced from the same model?", at.rank)]
    Parts {
        at: Box<At>,
        degree: u64,
        a: usize,
        b: usize,
    },
}

/// The entry of a single-device trace, and the rank, that a [`Mismatch`] is about.
#[derive(Debug, PartialEq)]
pub struct At {
    pub call: String,
    pub node: String,
    pub output: usize,
    pub rank: u64,
}

impl At {
    fn new(a: &TraceEntry, rank: u64) -> Box<At> {
        Box::new(At {
            call: a.call.clone(),
            node: a.node.clone(),
            output: a.output,
            rank,
        })
    }
}

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} node \"{}\" output {}",
            self.call, self.node, self.output
        )
    }
}

/// Writes a trace as JSON lines: the header, then one entry per line.
pub struct TraceWriter {
    path: PathBuf,
    out: BufWriter<File>,
    layout: TraceLayout,
    /// The degree of the run: ranks' entries are tagged with their rank when it is above 1.
    tp: u64,
    error: Option<std::io::Error>,
}

impl TraceWriter {
    /// A trace of the run `header` describes. `layout` adds block digests: a single-device run
    /// given the model's split layout digests each value some rank would hold a block of in
    /// `layout.units` blocks; a tensor-parallel run digests each rank's block in its share of
    /// them, so `compare-trace` can compare a rank's block with the single-device value's.
    pub fn create(
        path: &Path,
        header: TraceHeader,
        layout: TraceLayout,
    ) -> Result<TraceWriter, TraceError> {
        let io = |source| TraceError::Io {
            path: path.into(),
            source,
        };
        let file = File::create(path).map_err(io)?;
        let mut out = BufWriter::new(file);
        let tp = header.tp;
        let line = serde_json::to_string(&HeaderLine { glmc_trace: header })
            .expect("trace headers serialize");
        writeln!(out, "{line}").map_err(io)?;
        Ok(TraceWriter {
            path: path.into(),
            out,
            layout,
            tp,
            error: None,
        })
    }

    /// Records one executed node of `rank`; weights and arguments are not intermediates and are
    /// skipped. The first write error is kept and returned by `finish`.
    pub fn record(&mut self, call: Call, rank: usize, node: &Node, outputs: &[&Tensor]) {
        if self.error.is_some() || matches!(node.op, Op::Weight { .. } | Op::Input { .. }) {
            return;
        }
        let function = match call {
            Call::Prefill { .. } => "prefill",
            Call::Decode { .. } => "decode",
        };
        let (split, rank) = if self.tp > 1 {
            let split = match node.shard {
                Some(Shard::Split { axis }) => Some((axis as usize, self.tp)),
                _ => None,
            };
            (split, Some(rank as u64))
        } else {
            let key = (function.to_string(), node.name.clone());
            (self.layout.split.get(&key).map(|&a| (a as usize, 1)), None)
        };
        let blocks = split.map(|(axis, degree)| (axis, self.layout.units, degree));
        for mut entry in entries(call, node, outputs, blocks) {
            entry.rank = rank;
            entry.shard = rank.and(node.shard);
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

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The entries of one node. `blocks`: the split axis, the model's units and the degree of the
/// run, when the node's outputs get block digests: a value of `n` along the axis whole is cut
/// in gcd(units, n) blocks, a rank's block of it in that over the degree.
fn entries(
    call: Call,
    node: &Node,
    outputs: &[&Tensor],
    blocks: Option<(usize, u64, u64)>,
) -> Vec<TraceEntry> {
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
        let per_row = t.shape().first() == Some(&rows) && !values.is_empty();
        // The blocks' axis within one entry's values, and how many blocks.
        let cut = blocks.and_then(|(axis, units, degree)| {
            let n = *t.shape().get(axis)?;
            let whole = n as u64 * degree;
            let count = gcd(units.max(1) as usize, whole as usize) as u64 / degree;
            let inner = if per_row { axis.checked_sub(1)? } else { axis };
            (count > 0 && (units > 1 || degree > 1)).then_some((axis, inner, count as usize))
        });
        let entry = |position, shape: &[usize], chunk: &[f64]| {
            let d = digest(chunk);
            TraceEntry {
                call: label.clone(),
                node: node.name.clone(),
                op: node.op.name().to_string(),
                output,
                position,
                shape: t.shape().to_vec(),
                integer,
                l2: d.l2,
                non_finite: d.non_finite,
                first: d.first,
                rank: None,
                shard: None,
                parts: cut.map(|(axis, inner, count)| Parts {
                    axis,
                    blocks: block_digests(shape, inner, count, chunk),
                }),
            }
        };
        if per_row {
            let row_shape = &t.shape()[1..];
            for (i, chunk) in values.chunks(values.len() / rows).enumerate() {
                out.push(entry(Some(start + i), row_shape, chunk));
            }
        } else {
            out.push(entry(None, t.shape(), &values));
        }
    }
    out
}

fn digest(values: &[f64]) -> Digest {
    Digest {
        l2: values
            .iter()
            .filter(|x| x.is_finite())
            .map(|x| x * x)
            .sum::<f64>()
            .sqrt(),
        non_finite: values.iter().filter(|x| !x.is_finite()).count(),
        first: values.iter().take(FIRST_VALUES).copied().collect(),
        len: values.len(),
    }
}

/// `values` of `shape` cut in `count` equal blocks along `axis`, each digested in row-major
/// order.
fn block_digests(shape: &[usize], axis: usize, count: usize, values: &[f64]) -> Vec<Digest> {
    let n = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let width = n / count;
    let mut blocks: Vec<Vec<f64>> = vec![Vec::with_capacity(values.len() / count); count];
    for (i, &x) in values.iter().enumerate() {
        blocks[(i / inner) % n / width].push(x);
    }
    blocks.iter().map(|b| digest(b)).collect()
}

/// A trace's entries, without its header.
pub fn read_trace(path: &Path) -> Result<Vec<TraceEntry>, TraceError> {
    read_trace_file(path).map(|t| t.entries)
}

/// A trace with its header, when it has one.
pub fn read_trace_file(path: &Path) -> Result<Trace, TraceError> {
    let file = File::open(path).map_err(|source| TraceError::Io {
        path: path.into(),
        source,
    })?;
    let mut trace = Trace {
        header: None,
        entries: Vec::new(),
    };
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|source| TraceError::Io {
            path: path.into(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let format = |e: serde_json::Error| TraceError::Format {
            path: path.into(),
            line: i + 1,
            message: e.to_string(),
        };
        if trace.header.is_none() && trace.entries.is_empty() && line.contains("\"glmc_trace\"") {
            let h: HeaderLine = serde_json::from_str(&line).map_err(format)?;
            trace.header = Some(h.glmc_trace);
            continue;
        }
        trace
            .entries
            .push(serde_json::from_str(&line).map_err(format)?);
    }
    Ok(trace)
}

/// The first entry of `a` (in execution order) whose counterpart in `b` differs.
#[derive(Clone, Debug, PartialEq)]
pub struct Divergence {
    pub a: TraceEntry,
    pub b: TraceEntry,
    /// Relative difference of the L2 norms, or of the first values when the norms agree.
    pub relative: f64,
    /// Where `b` is a rank's block of `a`'s value: the first block that differs.
    pub block: Option<BlockDivergence>,
}

/// A block of a single-device value that differs from a rank's.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockDivergence {
    pub axis: usize,
    /// Which of `count` blocks of the single-device value.
    pub index: usize,
    pub count: usize,
    pub a: Digest,
    pub b: Digest,
}

impl Divergence {
    /// Whether the entries are a top-k decision (selected key or expert indices).
    pub fn is_topk(&self) -> bool {
        self.a.is_topk()
    }
}

/// The result of comparing two traces.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// Entries found in both traces (an entry of `a` counts once per rank of `b` holding it),
    /// and the distinct nodes they belong to.
    pub compared: usize,
    pub nodes: usize,
    /// Entries of `a` with no counterpart in `b` (e.g. nodes a pass removed, or views the GPU
    /// never materialises).
    pub only_in_a: usize,
    /// Entries of `a` that `b`'s ranks hold only as partial sums (a rank's addend, named
    /// `NODE.partial`): nothing of a single-device value to compare them with, so they are
    /// skipped, and the `all_reduce` that makes the sum whole is compared under its own name.
    pub partial_skipped: usize,
    /// Entries of `a` that `b`'s ranks hold as their block of each part of a stacked value
    /// (`Shard::Stacked`, a GEMM over `[gate; up]`), no block of the single-device value: they
    /// are skipped, and the slices that take each part are compared block by block.
    pub stacked_skipped: usize,
    /// The tensor-parallel degree of `b` when it is a ranks' trace lined up with a
    /// single-device `a`; 1 otherwise.
    pub ranks: u64,
    pub first_divergence: Option<Divergence>,
    /// The first top-k decision that differs, wherever it is.
    pub first_topk_divergence: Option<Divergence>,
}

impl Comparison {
    fn new(ranks: u64) -> Comparison {
        Comparison {
            compared: 0,
            nodes: 0,
            only_in_a: 0,
            partial_skipped: 0,
            stacked_skipped: 0,
            ranks,
            first_divergence: None,
            first_topk_divergence: None,
        }
    }

    fn diverged(&mut self, d: Divergence) {
        if d.is_topk() && self.first_topk_divergence.is_none() {
            self.first_topk_divergence = Some(d.clone());
        }
        self.first_divergence.get_or_insert(d);
    }

    fn done(&self) -> bool {
        self.first_divergence.is_some() && self.first_topk_divergence.is_some()
    }
}

type Key = (String, String, usize, Option<usize>);

fn key(e: &TraceEntry) -> Key {
    (e.call.clone(), e.node.clone(), e.output, e.position)
}

/// Compares traces of the same degree entry by entry (a rank's entries with the same rank's).
pub fn compare(a: &[TraceEntry], b: &[TraceEntry], rtol: f64) -> Comparison {
    let index: HashMap<_, &TraceEntry> = b.iter().map(|e| ((e.rank, key(e)), e)).collect();
    let mut comparison = Comparison::new(1);
    let mut nodes = std::collections::HashSet::new();
    for ea in a {
        let Some(eb) = index.get(&(ea.rank, key(ea))) else {
            comparison.only_in_a += 1;
            continue;
        };
        comparison.compared += 1;
        nodes.insert(ea.node.as_str());
        if comparison.done() {
            continue;
        }
        let relative = difference(ea, eb);
        if relative > rtol || ea.shape != eb.shape {
            comparison.diverged(Divergence {
                a: ea.clone(),
                b: (*eb).clone(),
                relative,
                block: None,
            });
        }
    }
    comparison.nodes = nodes.len();
    comparison
}

/// The degree a trace was recorded at: its header's, else 1 plus its highest rank.
fn degree(t: &Trace) -> u64 {
    t.header.as_ref().map_or_else(
        || {
            t.entries
                .iter()
                .filter_map(|e| e.rank)
                .max()
                .map_or(1, |r| r + 1)
        },
        |h| h.tp,
    )
}

/// Compares two traces: of the same degree entry by entry ([`compare`]), or a single-device
/// `a` with the ranks of `b`, each rank's entry with the matching part of `a`'s (see
/// [`compare_ranks`]). Traces whose headers name different prompts, or of degrees that do not
/// line up, are refused.
pub fn compare_traces(a: &Trace, b: &Trace, rtol: f64) -> Result<Comparison, Mismatch> {
    if let (Some(ha), Some(hb)) = (&a.header, &b.header) {
        // Models are told apart by their shapes (see `compare_ranks`), not by name: the name
        // of a checkpoint directory is where it was copied to.
        if ha.prompt != hb.prompt {
            return Err(Mismatch::Run {
                a_model: ha.model.clone(),
                a_prompt: ha.prompt.clone(),
                b_model: hb.model.clone(),
                b_prompt: hb.prompt.clone(),
            });
        }
    }
    match (degree(a), degree(b)) {
        (da, db) if da == db => Ok(compare(&a.entries, &b.entries, rtol)),
        (1, db) => compare_ranks(&a.entries, &b.entries, db, rtol),
        (da, 1) => Err(Mismatch::RanksFirst(da)),
        (da, db) => Err(Mismatch::Degrees { a: da, b: db }),
    }
}

/// Lines the entries of `degree` ranks up with a single-device trace: a replicated value, and
/// the whole value after an `all_reduce` or `all_gather` (which carries the node's own name),
/// in full; a rank's block (`Shard::Split`, the node's name with `.shard` for the vocabulary
/// blocks of the logits) block by block against the same blocks of the single-device value.
/// Partial sums are skipped: the `all_reduce` after them is compared instead; so are stacked
/// values (`Shard::Stacked`), whose slices are compared instead. The first
/// divergence is the first entry of `a`, in execution order, that some rank parts from (the
/// lowest such rank).
pub fn compare_ranks(
    a: &[TraceEntry],
    b: &[TraceEntry],
    degree: u64,
    rtol: f64,
) -> Result<Comparison, Mismatch> {
    let mut comparison = Comparison::new(degree);
    // By rank, key, and whether the entry is a block: the logits' `lm_head.shard` block and
    // the `lm_head` all_gather both line up with the single-device `lm_head`.
    let mut index: HashMap<(u64, Key, bool), &TraceEntry> = HashMap::new();
    let mut partial: std::collections::HashSet<Key> = std::collections::HashSet::new();
    let mut stacked: std::collections::HashSet<Key> = std::collections::HashSet::new();
    for e in b {
        let mut k = key(e);
        if matches!(e.shard, Some(Shard::Stacked { .. })) {
            stacked.insert(k);
            continue;
        }
        if e.shard == Some(Shard::Partial) {
            if let Some(whole) = k.1.strip_suffix(".partial") {
                k.1 = whole.to_string();
            }
            partial.insert(k);
            continue;
        }
        let block = matches!(e.shard, Some(Shard::Split { .. }));
        if block {
            if let Some(whole) = k.1.strip_suffix(".shard") {
                k.1 = whole.to_string();
            }
        }
        index.insert((e.rank.unwrap_or(0), k, block), e);
    }
    let mut nodes = std::collections::HashSet::new();
    for ea in a {
        let mut found = false;
        let counterparts = (0..degree).flat_map(|rank| [(rank, true), (rank, false)]);
        for (rank, block) in counterparts {
            let Some(eb) = index.get(&(rank, key(ea), block)) else {
                continue;
            };
            found = true;
            comparison.compared += 1;
            nodes.insert(ea.node.as_str());
            // Every pair is checked, also past the first divergence: a shape that does not
            // line up means the traces are of different models, whatever came before.
            let (relative, block) = match eb.shard {
                Some(Shard::Split { axis }) => {
                    rank_block(ea, eb, axis as usize, rank, degree, rtol)?
                }
                _ => {
                    if ea.shape != eb.shape {
                        return Err(shape_mismatch(ea, eb, rank, "the same shape".into()));
                    }
                    (difference(ea, eb), None)
                }
            };
            let topk_pending = comparison.first_topk_divergence.is_none() && ea.integer;
            if relative > rtol && (comparison.first_divergence.is_none() || topk_pending) {
                comparison.diverged(Divergence {
                    a: ea.clone(),
                    b: (*eb).clone(),
                    relative,
                    block,
                });
            }
        }
        match (
            found,
            partial.contains(&key(ea)),
            stacked.contains(&key(ea)),
        ) {
            (true, _, _) => {}
            (false, true, _) => comparison.partial_skipped += 1,
            (false, false, true) => comparison.stacked_skipped += 1,
            (false, false, false) => comparison.only_in_a += 1,
        }
    }
    comparison.nodes = nodes.len();
    Ok(comparison)
}

fn shape_mismatch(a: &TraceEntry, b: &TraceEntry, rank: u64, what: String) -> Mismatch {
    Mismatch::Shape {
        at: At::new(a, rank),
        a: a.shape.clone(),
        b: b.shape.clone(),
        what,
    }
}

/// Rank `rank`'s block `b` against the same blocks of `a`: the largest relative difference of
/// a block, and the first block beyond `rtol`.
fn rank_block(
    a: &TraceEntry,
    b: &TraceEntry,
    axis: usize,
    rank: u64,
    degree: u64,
    rtol: f64,
) -> Result<(f64, Option<BlockDivergence>), Mismatch> {
    let mut whole = b.shape.clone();
    if let Some(n) = whole.get_mut(axis) {
        *n *= degree as usize;
    }
    if a.shape != whole {
        let what = format!("1/{degree} of it along axis {axis}");
        return Err(shape_mismatch(a, b, rank, what));
    }
    let (Some(pa), Some(pb)) = (&a.parts, &b.parts) else {
        return Err(Mismatch::NoParts {
            at: At::new(a, rank),
            axis,
        });
    };
    let per_rank = pb.blocks.len();
    if pa.axis != axis || pb.axis != axis || pa.blocks.len() != per_rank * degree as usize {
        return Err(Mismatch::Parts {
            at: At::new(a, rank),
            degree,
            a: pa.blocks.len(),
            b: per_rank,
        });
    }
    let first = rank as usize * per_rank;
    let mut worst = 0.0f64;
    let mut block = None;
    for (j, db) in pb.blocks.iter().enumerate() {
        let da = &pa.blocks[first + j];
        let relative = digest_difference(a.integer || b.integer, da, db);
        worst = worst.max(relative);
        if relative > rtol && block.is_none() {
            block = Some(BlockDivergence {
                axis,
                index: first + j,
                count: pa.blocks.len(),
                a: da.clone(),
                b: db.clone(),
            });
        }
    }
    Ok((worst, block))
}

/// How far `b` is from `a` (two records of one value): the relative difference of their L2
/// norms, or of their first values judged against the size of a typical finite element,
/// whichever is larger; 0 for equal records, infinite for integers that differ.
pub fn difference(a: &TraceEntry, b: &TraceEntry) -> f64 {
    // First values are judged against the row's size.
    let len = a
        .shape
        .iter()
        .skip(usize::from(a.position.is_some()))
        .product::<usize>();
    let digest = |e: &TraceEntry| Digest {
        l2: e.l2,
        non_finite: e.non_finite,
        first: e.first.clone(),
        len,
    };
    digest_difference(a.integer || b.integer, &digest(a), &digest(b))
}

fn digest_difference(integer: bool, a: &Digest, b: &Digest) -> f64 {
    if integer {
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
    // First values are judged against the block's size: n finite values of magnitude
    // l2/sqrt(n). A masked -inf adds nothing to l2, so counting it would shrink that magnitude
    // (the first query row of a causal score holds one finite value among the whole context).
    let finite = a.len.saturating_sub(a.non_finite).max(1);
    let per_value = scale / (finite as f64).sqrt();
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
            rank: None,
            shard: None,
            parts: None,
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
    fn masked_values_do_not_scale_down_a_rows_first_values() {
        // A causal score's first row: one finite score among 64 keys, 0.5% apart.
        let row = |x: f64| {
            let mut e = entry("scores", 0, x.abs(), vec![x, f64::NEG_INFINITY]);
            e.shape = vec![64, 64];
            e.non_finite = 63;
            e
        };
        let c = compare(&[row(-0.3743)], &[row(-0.3724)], 1e-3);
        let d = c.first_divergence.expect("the rows differ");
        assert!(
            (d.relative - 0.0019 / 0.3743).abs() < 1e-9,
            "{}",
            d.relative
        );
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

    #[test]
    fn blocks_of_an_inner_axis_gather_their_strided_values() {
        // [2, 4] cut in 2 blocks along axis 1: columns 0-1 and 2-3 of both rows.
        let values: Vec<f64> = (0..8).map(f64::from).collect();
        let blocks = block_digests(&[2, 4], 1, 2, &values);
        assert_eq!(blocks[0].first, vec![0.0, 1.0, 4.0, 5.0]);
        assert_eq!(blocks[1].first, vec![2.0, 3.0, 6.0, 7.0]);
        assert_eq!(blocks[1].len, 4);
        assert!((blocks[0].l2 - (0.0f64 + 1.0 + 16.0 + 25.0).sqrt()).abs() < 1e-12);
    }

    #[test]
    fn faults_name_a_rank_and_swap_halves() {
        let f = Fault::parse("model.layers.0.self_attn.kv_b_proj.weight:uv@1=swap");
        assert_eq!(
            (f.node.as_str(), f.rank, f.kind),
            (
                "model.layers.0.self_attn.kv_b_proj.weight:uv",
                1,
                FaultKind::Swap
            )
        );
        assert_eq!(Fault::parse("x=nan").kind, FaultKind::Nan);
        assert_eq!(
            (Fault::parse("x").rank, Fault::parse("x").kind),
            (0, FaultKind::Affine)
        );
        // The first even axis is axis 1 here: each row's halves trade places.
        let t = Tensor::f32(vec![1, 4, 1], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        let swapped = f.apply(&t);
        assert_eq!(swapped.data(), &Data::F32(vec![3.0, 4.0, 1.0, 2.0]));
    }

    /// A single-device value in 4 blocks, and rank `rank` of 2 holding blocks 2r and 2r+1.
    fn split_pair(rank: u64, blocks: [f64; 4]) -> (TraceEntry, TraceEntry) {
        let digest = |l2: f64| Digest {
            l2,
            non_finite: 0,
            first: vec![l2],
            len: 2,
        };
        let mut a = entry("q", 0, 1.0, vec![1.0]);
        a.shape = vec![3, 8];
        a.parts = Some(Parts {
            axis: 1,
            blocks: blocks.iter().map(|&x| digest(x)).collect(),
        });
        let mut b = a.clone();
        b.shape = vec![3, 4];
        b.rank = Some(rank);
        b.shard = Some(Shard::Split { axis: 1 });
        let mine = &blocks[2 * rank as usize..2 * rank as usize + 2];
        b.parts = Some(Parts {
            axis: 1,
            blocks: mine.iter().map(|&x| digest(x)).collect(),
        });
        (a, b)
    }

    #[test]
    fn a_ranks_block_is_compared_with_its_blocks_of_the_whole_value() {
        let (a, b0) = split_pair(0, [1.0, 2.0, 3.0, 4.0]);
        let (_, mut b1) = split_pair(1, [1.0, 2.0, 3.0, 4.0]);
        let mut partial = entry("o_proj.partial", 0, 5.0, vec![1.0]);
        partial.rank = Some(1);
        partial.shard = Some(Shard::Partial);
        let o_proj = entry("o_proj", 0, 9.0, vec![1.0]);
        let b = vec![b0.clone(), b1.clone(), partial];
        let c = compare_ranks(&[a.clone(), o_proj], &b, 2, 1e-6).unwrap();
        assert_eq!((c.compared, c.partial_skipped, c.only_in_a), (2, 1, 0));
        assert!(c.first_divergence.is_none());

        // Rank 1 holds its two blocks in the wrong order.
        b1.parts.as_mut().unwrap().blocks.swap(0, 1);
        let c = compare_ranks(std::slice::from_ref(&a), &[b0.clone(), b1], 2, 1e-6).unwrap();
        let d = c.first_divergence.expect("rank 1's blocks are swapped");
        let block = d.block.expect("a block differs");
        assert_eq!((d.b.rank, block.index, block.count), (Some(1), 2, 4));

        let mut bare = a.clone();
        bare.parts = None;
        assert!(matches!(
            compare_ranks(&[bare], std::slice::from_ref(&b0), 2, 1e-6),
            Err(Mismatch::NoParts { at, .. }) if at.rank == 0
        ));
        let mut other = a;
        other.shape = vec![3, 6];
        assert!(matches!(
            compare_ranks(&[other], &[b0], 2, 1e-6),
            Err(Mismatch::Shape { .. })
        ));
    }

    #[test]
    fn traces_of_other_prompts_or_degrees_are_refused() {
        let header = |tp, prompt: Vec<u64>| {
            Some(TraceHeader {
                model: "m".into(),
                prompt,
                tp,
            })
        };
        let trace = |tp, prompt| Trace {
            header: header(tp, prompt),
            entries: vec![entry("x", 0, 1.0, vec![1.0])],
        };
        let e = compare_traces(&trace(1, vec![1, 2]), &trace(2, vec![1, 3]), 1e-3).unwrap_err();
        assert!(e.to_string().contains("different prompts"), "{e}");
        let e = compare_traces(&trace(2, vec![1]), &trace(1, vec![1]), 1e-3).unwrap_err();
        assert_eq!(e, Mismatch::RanksFirst(2));
        let e = compare_traces(&trace(2, vec![1]), &trace(4, vec![1]), 1e-3).unwrap_err();
        assert_eq!(e, Mismatch::Degrees { a: 2, b: 4 });
    }
}
