//! The lowered form of a phase: kernel launches over one arena, as data. It is what the manifest
//! stores, what `glmc dump --lowered` prints and all the runtime needs to run a phase.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::expr::{Bindings, GridDim, Guard, Poly};
use crate::layout::TensorRef;

/// One kernel's source, shared by every launch of the same specialisation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Kernel {
    /// The `extern "C"` function name in `kernels.cu`.
    pub name: String,
    /// The template file it was made from (`norm`, `rope`, …).
    pub template: String,
    /// Its compile-time parameters (dtypes, widths, tiles, threads per block), sorted.
    pub params: BTreeMap<String, String>,
    /// Threads per block.
    pub threads: u32,
    /// Shared memory a block declares, in bytes (checked against the target's limit).
    pub shared_bytes: u32,
}

/// A kernel argument.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ArgValue {
    /// The device address of a tensor's first element.
    Ptr(TensorRef),
    /// A 64-bit integer (`long long`), evaluated under the launch's bindings.
    Int(Poly),
    /// A 32-bit float.
    F32(f64),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Arg {
    pub name: String,
    pub value: ArgValue,
}

/// One kernel launch, in the order the phase runs them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Launch {
    /// The IR node it computes (its stable name), and its op.
    pub node: String,
    pub op: String,
    pub kernel: String,
    pub grid: GridDim,
    pub block: u32,
    /// Dynamic shared memory the launch passes, in bytes (0: the kernel's is all static).
    #[serde(default)]
    pub dynamic_shared_bytes: u32,
    /// For one of several alternative kernels of a node: the sizes it runs at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<Guard>,
    /// Why the node took this kernel over a faster one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub args: Vec<Arg>,
    /// Where the node's outputs land (for a copy: the part of the concat it fills).
    pub outputs: Vec<TensorRef>,
}

/// The reduction or gather a [`Collective`] performs over the tensor-parallel group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CollectiveOp {
    /// Every rank's `input` summed elementwise into every rank's `output`.
    AllReduceSum,
    /// The ranks' `input`s, rank after rank, into every rank's `output` (`ranks` times the
    /// input): a gather along the first axis; a gather along another axis lands in a staging
    /// buffer that the launches after it rearrange.
    AllGather,
}

impl CollectiveOp {
    /// The IR op's name.
    pub fn name(self) -> &'static str {
        match self {
            CollectiveOp::AllReduceSum => "all_reduce",
            CollectiveOp::AllGather => "all_gather",
        }
    }
}

/// A collective over the ranks of a tensor-parallel group: no kernel of glmc's, the runtime's
/// communication library (NCCL) runs it on the step's stream. Both tensors are contiguous.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Collective {
    /// The IR node it computes (its stable name).
    pub node: String,
    pub op: CollectiveOp,
    /// The size of the group it runs over.
    pub ranks: u64,
    pub input: TensorRef,
    pub output: TensorRef,
}

/// What one IR node became.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Step {
    Launch(Launch),
    /// An `all_reduce` or `all_gather` of a tensor-parallel rank's graph.
    Collective(Collective),
    /// A `reshape`/`slice`/`slice.last`, a concat whose parts are already in place (side by
    /// side, written there by their producers, or copied there by the launches before it): no
    /// kernel of its own, only a layout.
    View {
        node: String,
        op: String,
        at: TensorRef,
    },
    /// An op this version of glmc cannot lower yet; its outputs still have their place in the
    /// arena. An artifact with any of these is incomplete and is never run.
    Missing {
        node: String,
        op: String,
        outputs: Vec<TensorRef>,
        why: String,
    },
}

/// A lowered entry function.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    pub function: String,
    /// The largest values of the symbols the arena was planned for; a launch with larger ones
    /// is refused by the runtime.
    pub max_bindings: Bindings,
    pub arena_bytes: u64,
    pub inputs: Vec<(String, TensorRef)>,
    pub results: Vec<(String, TensorRef)>,
    pub steps: Vec<Step>,
}

/// A step that does work on the device.
#[derive(Clone, Copy, Debug)]
pub enum Work<'a> {
    Launch(&'a Launch),
    Collective(&'a Collective),
}

impl Phase {
    pub fn launches(&self) -> impl Iterator<Item = &Launch> {
        self.steps.iter().filter_map(|s| match s {
            Step::Launch(l) => Some(l),
            _ => None,
        })
    }

    pub fn collectives(&self) -> impl Iterator<Item = &Collective> {
        self.steps.iter().filter_map(|s| match s {
            Step::Collective(c) => Some(c),
            _ => None,
        })
    }

    /// The launches and collectives, in the order the phase runs them.
    pub fn work(&self) -> impl Iterator<Item = Work<'_>> {
        self.steps.iter().filter_map(|s| match s {
            Step::Launch(l) => Some(Work::Launch(l)),
            Step::Collective(c) => Some(Work::Collective(c)),
            _ => None,
        })
    }

    /// The distinct ops no kernel exists for yet, sorted.
    pub fn missing_ops(&self) -> Vec<String> {
        let mut ops: Vec<String> = self
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Missing { op, .. } => Some(op.clone()),
                _ => None,
            })
            .collect();
        ops.sort();
        ops.dedup();
        ops
    }

    /// The schedule as text, one block per step, for `glmc dump --lowered`.
    pub fn print(&self, kernels: &[Kernel]) -> String {
        let mut out = String::new();
        let bound: Vec<String> = self
            .max_bindings
            .iter()
            .map(|(k, v)| format!("{k}≤{v}"))
            .collect();
        let _ = writeln!(
            out,
            "schedule @{} arena={} bytes ({})",
            self.function,
            self.arena_bytes,
            bound.join(", ")
        );
        for (name, r) in &self.inputs {
            let _ = writeln!(out, "  in  {name:?} = {r}");
        }
        for step in &self.steps {
            match step {
                Step::Launch(l) => {
                    let k = kernels.iter().find(|k| k.name == l.kernel);
                    let tiles = k
                        .map(|k| {
                            k.params
                                .iter()
                                .filter(|(p, _)| !p.ends_with("_t"))
                                .map(|(p, v)| format!("{p}={v}"))
                                .collect::<Vec<_>>()
                                .join(" ")
                        })
                        .unwrap_or_default();
                    let shared = k.map_or(0, |k| k.shared_bytes);
                    let dynamic = if l.dynamic_shared_bytes > 0 {
                        " (dynamic)"
                    } else {
                        ""
                    };
                    let when = l
                        .when
                        .as_ref()
                        .map(|g| format!(" [{g}]"))
                        .unwrap_or_default();
                    let _ = writeln!(
                        out,
                        "  {} {:?}: {}<<<{}, {}>>>{when} smem={shared}{dynamic} {{{tiles}}}",
                        l.op, l.node, l.kernel, l.grid, l.block
                    );
                    if let Some(note) = &l.note {
                        let _ = writeln!(out, "      # {note}");
                    }
                    for a in &l.args {
                        let v = match &a.value {
                            ArgValue::Ptr(r) => r.to_string(),
                            ArgValue::Int(p) => p.to_string(),
                            ArgValue::F32(x) => format!("{x:e}"),
                        };
                        let _ = writeln!(out, "      {} = {v}", a.name);
                    }
                }
                Step::Collective(c) => {
                    let _ = writeln!(
                        out,
                        "  {} {:?}: collective over {} ranks",
                        c.op.name(),
                        c.node,
                        c.ranks
                    );
                    let _ = writeln!(out, "      input = {}", c.input);
                    let _ = writeln!(out, "      output = {}", c.output);
                }
                Step::View { node, op, at } => {
                    let _ = writeln!(out, "  {op} {node:?}: view {at}");
                }
                Step::Missing {
                    node,
                    op,
                    outputs,
                    why,
                } => {
                    let outs: Vec<String> = outputs.iter().map(|r| r.to_string()).collect();
                    let _ = writeln!(
                        out,
                        "  {op} {node:?}: NOT LOWERED ({why}) -> {}",
                        outs.join(", ")
                    );
                }
            }
        }
        for (name, r) in &self.results {
            let _ = writeln!(out, "  out {name:?} = {r}");
        }
        out
    }
}
