//! Tensor parallelism on GPUs: the ranks of one group, one thread per GPU, each running its
//! rank's artifact with a [`CudaExecutor`] whose collectives go through NCCL, driven in
//! lockstep by the thread that owns the [`TpExecutor`].
//!
//! Each rank's thread creates everything of its GPU itself (context, stream, weights,
//! communicator: NCCL's is tied to the thread's GPU), loads its weights, then joins the group
//! with the unique id rank 0 made. The driver sends every call to every rank of this process
//! and takes the results of its first (every rank computes the same logits and tokens: the
//! logits are gathered before sampling). A call fails as a whole: the first rank to report an
//! error, or every rank still busy when `timeout` runs out, is named, every communicator of
//! the process is aborted (which ends a collective stuck waiting for a rank that will never
//! join it), and the group refuses further calls. The driver never waits on a rank without a
//! deadline once the ranks compute together, so a lost rank cannot hang the run.
//!
//! A group given each rank's IR ([`RankArtifact::ir`]: `--trace`, `--check-finite`) shows
//! every node of every rank to the run's hook, as the CPU's tensor-parallel interpreter does.
//! Each rank's executor observes its own module (so every rank runs launch by launch, never a
//! CUDA graph, and their collectives stay in step) and collects its nodes' outputs in its
//! execution order; the driver calls the hook with them once every rank has finished the call
//! (see [`replay_order`]). The hook runs on the driver's thread, outside the call's deadline,
//! and its error ends the run after a complete call, leaving the group sound.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use glmc_codegen::artifact::Manifest;
use glmc_ir::{Module, Node, Op};

use super::executor::{CudaExecutor, Progress};
use super::nccl::{Abort, Comm, UniqueId};
use super::Gpu;
use crate::generate::{Call, Executor, GenerateError, NodeHook, PhaseKind};
use crate::interp::WeightSource;
use crate::random_weights::RandomWeights;
use crate::tensor::Tensor;
use crate::trace::{call_label, Fault};

/// How long the driver waits for the communicators' aborts before it reports the failure
/// anyway: an abort that itself hangs must not hang the run. The last abort of a process's
/// ranks waits until every CUDA graph that captured their collectives is destroyed, which a
/// failed group never does (see `Drop`), while the kernels are released at its start.
const ABORT_GRACE: Duration = Duration::from_secs(3);

#[derive(Debug, thiserror::Error)]
pub enum TpError {
    #[error("--tp {tp} needs {tp} GPUs, this machine has {gpus}: lower --tp, or run the ranks over several hosts (README: \"Tensor parallelism on GPUs\")")]
    TooFewGpus { tp: usize, gpus: usize },
    #[error("rank {rank} failed {at}: {source}")]
    Rank {
        rank: usize,
        at: String,
        #[source]
        source: Box<GenerateError>,
    },
    #[error("{at}: {} within the collective timeout of {secs} s: {detail}; every communicator of the group was aborted", ranks_did_not_finish(.ranks))]
    Timeout {
        at: String,
        ranks: Vec<usize>,
        secs: f64,
        detail: String,
    },
    #[error("rank {rank}'s thread ended {at} without an answer (it panicked: see above)")]
    Lost { rank: usize, at: String },
    #[error("the tensor-parallel group failed before and was aborted: it runs nothing more")]
    Failed,
}

fn ranks_did_not_finish(ranks: &[usize]) -> String {
    match ranks {
        [r] => format!("rank {r} did not finish"),
        _ => {
            let list: Vec<String> = ranks.iter().map(usize::to_string).collect();
            format!("ranks {} did not finish", list.join(", "))
        }
    }
}

/// Refuses a group of `local` ranks on a host with `gpus` GPUs (each rank needs its own).
pub fn check_gpus(tp: usize, local: usize, gpus: usize) -> Result<(), TpError> {
    if local > gpus {
        return Err(TpError::TooFewGpus { tp, gpus });
    }
    Ok(())
}

/// A test hook (`GLMC_TEST_KILL_RANK=R@CALL[=hang]`): rank R stops at its call number CALL
/// (0 is the first prefill), failing it, or with `=hang` never answering, as a crashed or
/// wedged GPU process would. The tests use it to show that the group exits naming the rank
/// within the timeout; never set it otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kill {
    pub rank: usize,
    pub call: u64,
    pub hang: bool,
}

impl Kill {
    pub const ENV: &'static str = "GLMC_TEST_KILL_RANK";

    pub fn from_env() -> Option<Kill> {
        Kill::parse(&std::env::var(Kill::ENV).ok()?)
    }

    /// `R@CALL` or `R@CALL=hang`; anything else is no kill.
    pub fn parse(value: &str) -> Option<Kill> {
        let (target, hang) = match value.strip_suffix("=hang") {
            Some(t) => (t, true),
            None => (value, false),
        };
        let (rank, call) = target.split_once('@')?;
        Some(Kill {
            rank: rank.trim().parse().ok()?,
            call: call.trim().parse().ok()?,
            hang,
        })
    }
}

/// Where a group's weights come from, shared by its ranks' threads.
#[derive(Clone)]
pub enum GroupWeights {
    /// Made on the host by each rank from its recipes (a rank reads only its slices).
    Host(Arc<dyn WeightSource + Send + Sync>),
    /// Generated on each GPU by `cubin` ([`super::random_fill::SOURCE`] compiled).
    Random {
        weights: RandomWeights,
        cubin: Arc<Vec<u8>>,
    },
}

/// One rank's artifact: its manifest and cubin, and the IR it was lowered from when the run
/// observes nodes (`--trace`, `--check-finite`): the rank's module of
/// `glmc_passes::partition`, whose node names and `tp=` marks the hook sees.
pub struct RankArtifact<C> {
    pub manifest: Manifest<C>,
    pub cubin: Vec<u8>,
    pub ir: Option<Module>,
}

/// How this process's ranks are placed in the group.
#[derive(Clone, Debug)]
pub struct Placement {
    /// The group's size: every rank of every process.
    pub world: usize,
    /// The global rank of this process's first; its ranks are consecutive.
    pub first_rank: usize,
    /// The GPU of each of this process's ranks.
    pub gpus: Vec<usize>,
}

/// How the group runs.
#[derive(Clone, Debug)]
pub struct GroupOptions {
    /// How long a call may take once the ranks compute together (the collectives, and
    /// joining the group) before the group is aborted.
    pub timeout: Duration,
    /// Whether decode steps replay CUDA graphs.
    pub graphs: bool,
    pub fault: Option<Fault>,
    pub kill: Option<Kill>,
}

enum Command {
    Run {
        phase: PhaseKind,
        inputs: Arc<Vec<Tensor>>,
        call: Call,
    },
    Stop,
}

/// What a rank's executor says of its phases, once loaded.
#[derive(Clone)]
struct Shape {
    prefill: Vec<String>,
    decode: Vec<String>,
    vocab: Option<usize>,
}

/// A node one rank ran, with its outputs as the rank's executor read them back.
struct Observed {
    /// The global rank.
    rank: usize,
    node: Node,
    outputs: Vec<Tensor>,
}

/// What a rank returns of a call: its results, and the nodes it observed in its order (none
/// unless the group observes nodes).
struct Ran {
    results: Vec<Tensor>,
    observed: Vec<Observed>,
}

enum Reply {
    Loaded(Result<Shape, GenerateError>),
    Joined(Result<Abort, GenerateError>),
    Ran(Result<Ran, GenerateError>),
    /// The rank's thread panicked (its message is on stderr).
    Panicked,
}

struct Rank {
    /// Global rank.
    rank: usize,
    commands: Sender<Command>,
    progress: Progress,
    thread: Option<JoinHandle<()>>,
}

/// This process's ranks of one tensor-parallel group, as one [`Executor`].
pub struct TpExecutor {
    ranks: Vec<Rank>,
    replies: Receiver<(usize, Reply)>,
    aborts: Vec<Abort>,
    shape: Shape,
    timeout: Duration,
    failed: bool,
}

impl TpExecutor {
    /// Starts a thread per rank of `placement`, each loading its artifact of `artifacts` (by
    /// local rank) and its weights, then joining the group `id` names. Loading has no deadline
    /// (it is local, and a failure is reported); joining has the call timeout.
    pub fn start<C: Send + 'static>(
        artifacts: Vec<RankArtifact<C>>,
        weights: GroupWeights,
        placement: &Placement,
        id: UniqueId,
        options: &GroupOptions,
    ) -> Result<TpExecutor, GenerateError> {
        let (reply_tx, replies) = mpsc::channel();
        let mut ranks = Vec::with_capacity(artifacts.len());
        for ((local, artifact), &gpu) in artifacts.into_iter().enumerate().zip(&placement.gpus) {
            let (commands, rx) = mpsc::channel();
            let rank = placement.first_rank + local;
            let progress: Progress = Arc::new(Mutex::new("loads its weights".to_string()));
            let thread = RankThread {
                local,
                rank,
                world: placement.world,
                gpu,
                id,
                weights: weights.clone(),
                options: options.clone(),
                progress: progress.clone(),
                replies: reply_tx.clone(),
                commands: rx,
            };
            let panicked = reply_tx.clone();
            let handle = std::thread::Builder::new()
                .name(format!("glmc-rank{rank}"))
                .spawn(move || {
                    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        thread.run(artifact)
                    }));
                    if ran.is_err() {
                        let _ = panicked.send((local, Reply::Panicked));
                    }
                })
                .map_err(|e| {
                    GenerateError::from(super::CudaError::Artifact(format!(
                        "starting rank {rank}'s thread: {e}"
                    )))
                })?;
            ranks.push(Rank {
                rank,
                commands,
                progress,
                thread: Some(handle),
            });
        }
        // Only the ranks hold senders now: if every rank's thread is gone, `gather` hears it.
        drop(reply_tx);
        let mut group = TpExecutor {
            ranks,
            replies,
            aborts: Vec::new(),
            shape: Shape {
                prefill: Vec::new(),
                decode: Vec::new(),
                vocab: None,
            },
            timeout: options.timeout,
            failed: false,
        };
        let loaded = group.gather("loading", None, |r| match r {
            Reply::Loaded(Ok(x)) => Some(x),
            _ => None,
        })?;
        group.shape = loaded.into_iter().next().expect("at least one rank");
        let aborts = group.gather("joining the group", Some(options.timeout), |r| match r {
            Reply::Joined(Ok(x)) => Some(x),
            _ => None,
        })?;
        group.aborts = aborts;
        Ok(group)
    }

    /// Every rank's answer of the kind `pick` takes, by local rank: within `deadline` of now
    /// when given. The first error, or the deadline, fails the group (see the module's doc).
    fn gather<T>(
        &mut self,
        at: &str,
        deadline: Option<Duration>,
        pick: impl Fn(Reply) -> Option<T>,
    ) -> Result<Vec<T>, GenerateError> {
        let start = Instant::now();
        let mut got: Vec<Option<T>> = self.ranks.iter().map(|_| None).collect();
        while got.iter().any(Option::is_none) {
            let reply = match deadline {
                Some(d) => {
                    let left = d.saturating_sub(start.elapsed());
                    self.replies.recv_timeout(left)
                }
                None => self
                    .replies
                    .recv()
                    .map_err(|_| RecvTimeoutError::Disconnected),
            };
            let (local, reply) = match reply {
                Ok(r) => r,
                Err(RecvTimeoutError::Timeout) => {
                    let pending: Vec<usize> =
                        (0..got.len()).filter(|&i| got[i].is_none()).collect();
                    let detail = pending
                        .iter()
                        .map(|&i| {
                            let doing = self.ranks[i]
                                .progress
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .clone();
                            format!("rank {} {doing}", self.ranks[i].rank)
                        })
                        .collect::<Vec<_>>()
                        .join("; ");
                    let ranks = pending.iter().map(|&i| self.ranks[i].rank).collect();
                    return Err(self.fail(TpError::Timeout {
                        at: at.to_string(),
                        ranks,
                        secs: deadline.unwrap_or_default().as_secs_f64(),
                        detail,
                    }));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let local = got.iter().position(Option::is_none).unwrap_or(0);
                    let rank = self.ranks[local].rank;
                    return Err(self.fail(TpError::Lost {
                        rank,
                        at: at.to_string(),
                    }));
                }
            };
            let rank = self.ranks[local].rank;
            let reply = match reply {
                Reply::Panicked => {
                    return Err(self.fail(TpError::Lost {
                        rank,
                        at: at.to_string(),
                    }))
                }
                // A failure of another kind than the one gathered (a rank that loaded fast and
                // failed to join while another still loads) is no less the group's end.
                Reply::Loaded(Err(source))
                | Reply::Joined(Err(source))
                | Reply::Ran(Err(source)) => {
                    return Err(self.fail(TpError::Rank {
                        rank,
                        at: at.to_string(),
                        source: Box::new(source),
                    }))
                }
                ok => ok,
            };
            // A late answer to an earlier step cannot come: a failed group runs no more.
            if let Some(value) = pick(reply) {
                got[local] = Some(value);
            }
        }
        Ok(got.into_iter().map(|v| v.expect("all answered")).collect())
    }

    /// Marks the group failed and aborts every communicator (bounded by [`ABORT_GRACE`]):
    /// the ranks still in a collective get out of it, and none is used again.
    fn fail(&mut self, error: TpError) -> GenerateError {
        self.failed = true;
        let aborts = self.aborts.clone();
        let (done, wait) = mpsc::channel();
        // A thread of its own, so that an abort that hangs delays the error by the grace only.
        let _ = std::thread::Builder::new()
            .name("glmc-abort".into())
            .spawn(move || {
                for a in &aborts {
                    a.abort();
                }
                let _ = done.send(());
            });
        let _ = wait.recv_timeout(ABORT_GRACE);
        GenerateError::Tp(Box::new(error))
    }
}

impl Executor for TpExecutor {
    fn result_names(&self, phase: PhaseKind) -> Vec<String> {
        match phase {
            PhaseKind::Prefill => self.shape.prefill.clone(),
            PhaseKind::Decode => self.shape.decode.clone(),
        }
    }

    fn vocab(&self) -> Option<usize> {
        self.shape.vocab
    }

    fn run(
        &mut self,
        phase: PhaseKind,
        inputs: &[Tensor],
        call: Call,
        hook: &mut NodeHook<'_>,
    ) -> Result<Vec<Tensor>, GenerateError> {
        if self.failed {
            return Err(GenerateError::Tp(Box::new(TpError::Failed)));
        }
        let inputs = Arc::new(inputs.to_vec());
        let at = call_label(call);
        let unsent = self.ranks.iter().find_map(|r| {
            let command = Command::Run {
                phase,
                inputs: inputs.clone(),
                call,
            };
            r.commands.send(command).is_err().then_some(r.rank)
        });
        if let Some(rank) = unsent {
            return Err(self.fail(TpError::Lost { rank, at }));
        }
        let mut ran = self.gather(&at, Some(self.timeout), |r| match r {
            Reply::Ran(Ok(x)) => Some(x),
            _ => None,
        })?;
        // Every rank finished the call: the group is sound whatever the hook says.
        let observed: Vec<Vec<Observed>> = ran
            .iter_mut()
            .map(|r| std::mem::take(&mut r.observed))
            .collect();
        replay(call, &observed, hook)?;
        Ok(ran.swap_remove(0).results)
    }
}

/// Shows the ranks' observed nodes of one call to `hook` in [`replay_order`]; the hook's first
/// error stops it and is returned.
fn replay(
    call: Call,
    observed: &[Vec<Observed>],
    hook: &mut NodeHook<'_>,
) -> Result<(), GenerateError> {
    let collective: Vec<Vec<bool>> = observed
        .iter()
        .map(|rank| rank.iter().map(|o| is_collective(&o.node)).collect())
        .collect();
    for (local, i) in replay_order(&collective) {
        let o = &observed[local][i];
        let outputs: Vec<&Tensor> = o.outputs.iter().collect();
        hook(call, o.rank, &o.node, &outputs)?;
    }
    Ok(())
}

fn is_collective(node: &Node) -> bool {
    matches!(node.op, Op::AllReduce { .. } | Op::AllGather { .. })
}

/// The order in which the driver shows the ranks' observed nodes to the hook, as (local rank,
/// index in that rank's order) from each rank's nodes in its execution order (`true` for a
/// collective). Each rank's nodes keep their order (the hook's contract), and the ranks are
/// interleaved by the collectives they passed: everything any rank ran before its k-th
/// collective comes before every rank's k-th collective and what follows it, the lower rank
/// first within each such stretch. That is an order the ranks could have run in (a rank's
/// node after a collective may depend on any rank's nodes before it, never on a node after),
/// so the first node `--check-finite` names is one whose inputs were all finite: a NaN that a
/// rank's `all_reduce` spreads is named at the rank that made it, not at the sum.
fn replay_order(collective: &[Vec<bool>]) -> Vec<(usize, usize)> {
    let mut order: Vec<(usize, usize, usize)> = Vec::new();
    for (local, nodes) in collective.iter().enumerate() {
        let mut passed = 0;
        for (i, &is) in nodes.iter().enumerate() {
            // A collective's output exists only once every rank has reached it.
            passed += usize::from(is);
            order.push((passed, local, i));
        }
    }
    // Stable, and (passed, local, i) is unique: each rank's order is kept.
    order.sort();
    order.into_iter().map(|(_, local, i)| (local, i)).collect()
}

impl Drop for TpExecutor {
    fn drop(&mut self) {
        // A failed group's threads may be stuck in their GPU, and tearing one down (its CUDA
        // graphs, memory, communicator) would race the aborts and the process's exit: they are
        // left waiting on a command channel that stays open, to the process's exit.
        if self.failed {
            for r in self.ranks.drain(..) {
                std::mem::forget(r);
            }
            return;
        }
        for r in &self.ranks {
            let _ = r.commands.send(Command::Stop);
        }
        for r in &mut self.ranks {
            if let Some(t) = r.thread.take() {
                let _ = t.join();
            }
        }
    }
}

/// Everything one rank's thread owns.
struct RankThread {
    local: usize,
    rank: usize,
    world: usize,
    gpu: usize,
    id: UniqueId,
    weights: GroupWeights,
    options: GroupOptions,
    progress: Progress,
    replies: Sender<(usize, Reply)>,
    commands: Receiver<Command>,
}

impl RankThread {
    fn say(&self, text: String) {
        *self.progress.lock().unwrap_or_else(|e| e.into_inner()) = text;
    }

    fn reply(&self, reply: Reply) {
        let _ = self.replies.send((self.local, reply));
    }

    fn run<C>(self, artifact: RankArtifact<C>) {
        let observing = artifact.ir.is_some();
        let exec = match self.load(&artifact) {
            Ok(exec) => exec,
            Err(e) => return self.reply(Reply::Loaded(Err(e))),
        };
        self.reply(Reply::Loaded(Ok(Shape {
            prefill: exec.result_names(PhaseKind::Prefill),
            decode: exec.result_names(PhaseKind::Decode),
            vocab: exec.vocab(),
        })));
        drop(artifact);
        self.say(format!(
            "waits for the other ranks to join the group of {}",
            self.world
        ));
        let comm = match Comm::init(&exec.gpu().stream, &self.id, self.rank, self.world) {
            Ok(c) => c,
            Err(e) => {
                let e = GenerateError::from(super::CudaError::Collective(Box::new(e)));
                return self.reply(Reply::Joined(Err(e)));
            }
        };
        self.reply(Reply::Joined(Ok(comm.aborter())));
        let mut exec = exec.join(comm, self.progress.clone());
        let mut calls = 0u64;
        while let Ok(Command::Run {
            phase,
            inputs,
            call,
        }) = self.commands.recv()
        {
            let at = call_label(call);
            if let Some(kill) = self
                .options
                .kill
                .filter(|k| k.rank == self.rank && k.call == calls)
            {
                if kill.hang {
                    self.say(format!(
                        "stopped answering at {at} ({} hang, a test hook)",
                        Kill::ENV
                    ));
                    // Wedged: never answers, holds its GPU until the process exits.
                    loop {
                        std::thread::park();
                    }
                }
                let e = super::CudaError::Artifact(format!(
                    "stopped at call {calls} by {} (a test hook)",
                    Kill::ENV
                ));
                return self.reply(Reply::Ran(Err(e.into())));
            }
            self.say(format!("runs {at}"));
            // An observing executor shows each node to this hook, which keeps it for the
            // driver; one that does not never calls it.
            let mut observed = Vec::new();
            let mut collect = |_: Call, rank: usize, node: &Node, outputs: &[&Tensor]| {
                observed.push(Observed {
                    rank,
                    node: node.clone(),
                    outputs: outputs.iter().map(|&t| t.clone()).collect(),
                });
                Ok(())
            };
            let result = exec.run(phase, &inputs, call, &mut collect);
            debug_assert!(observing || observed.is_empty());
            let result = result.map(|results| Ran { results, observed });
            let failed = result.is_err();
            self.reply(Reply::Ran(result));
            if failed {
                return;
            }
            calls += 1;
        }
    }

    fn load<C>(&self, artifact: &RankArtifact<C>) -> Result<CudaExecutor, GenerateError> {
        let gpu = Gpu::open_for_rank(self.gpu)?;
        let (host, random): (&dyn WeightSource, _) = match &self.weights {
            GroupWeights::Host(source) => (source.as_ref(), None),
            GroupWeights::Random { weights, cubin } => (weights, Some((weights, &cubin[..]))),
        };
        let mut exec =
            CudaExecutor::load_rank(gpu, &artifact.manifest, &artifact.cubin, host, random)?;
        if let Some(ir) = &artifact.ir {
            exec.observe(ir)?;
        }
        // Every rank computes the same logits and tokens (they are gathered before sampling):
        // the driver takes local rank 0's, and the others skip the read-back.
        Ok(exec
            .with_fault(self.options.fault.clone())
            .with_graphs(self.options.graphs)
            .with_results(self.local == 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_needs_a_gpu_per_local_rank() {
        assert!(check_gpus(2, 2, 2).is_ok());
        assert!(check_gpus(8, 4, 4).is_ok());
        let err = check_gpus(2, 2, 1).unwrap_err().to_string();
        assert!(
            err.starts_with("--tp 2 needs 2 GPUs, this machine has 1"),
            "{err}"
        );
    }

    #[test]
    fn the_kill_switch_names_a_rank_and_a_call() {
        assert_eq!(
            Kill::parse("1@3"),
            Some(Kill {
                rank: 1,
                call: 3,
                hang: false
            })
        );
        assert_eq!(
            Kill::parse("0@0=hang"),
            Some(Kill {
                rank: 0,
                call: 0,
                hang: true
            })
        );
        assert_eq!(Kill::parse("1"), None);
        assert_eq!(Kill::parse("x@2"), None);
    }

    #[test]
    fn observed_nodes_replay_rank_by_rank_between_collectives() {
        // Two ranks: a, b, all_reduce, c, all_gather, d; rank 1 has one node more before
        // its first collective.
        let r0 = vec![false, false, true, false, true, false];
        let r1 = vec![false, false, false, true, false, true, false];
        let order = replay_order(&[r0.clone(), r1.clone()]);
        assert_eq!(
            order,
            vec![
                (0, 0),
                (0, 1),
                (1, 0),
                (1, 1),
                (1, 2),
                (0, 2),
                (0, 3),
                (1, 3),
                (1, 4),
                (0, 4),
                (0, 5),
                (1, 5),
                (1, 6),
            ]
        );
        // Every node once, each rank in its own order.
        for (local, nodes) in [r0, r1].iter().enumerate() {
            let mine: Vec<usize> = order
                .iter()
                .filter(|(l, _)| *l == local)
                .map(|&(_, i)| i)
                .collect();
            assert_eq!(mine, (0..nodes.len()).collect::<Vec<_>>());
        }
        // One rank: its own order; no nodes: nothing.
        assert_eq!(
            replay_order(&[vec![true, false, true]]),
            vec![(0, 0), (0, 1), (0, 2)]
        );
        assert!(replay_order(&[vec![], vec![]]).is_empty());
    }

    /// The driver shows every rank's nodes to the hook with their ranks, in replay order, and
    /// the hook's first error stops the replay and is what the call returns.
    #[test]
    fn the_hook_sees_each_rank_and_its_error_stops_the_replay() {
        let observed = |rank: usize, name: &str, op: Op| Observed {
            rank,
            node: Node {
                op,
                name: name.to_string(),
                outputs: Vec::new(),
                shard: None,
            },
            outputs: vec![Tensor::f32(vec![1], vec![rank as f32]).unwrap()],
        };
        let sum = || Op::AllReduce {
            op: glmc_ir::Reduce::Sum,
            ranks: 2,
        };
        let ranks = |second: usize| {
            vec![
                vec![observed(0, "up", Op::Silu {}), observed(0, "mlp", sum())],
                vec![
                    observed(second, "up", Op::Silu {}),
                    observed(second, "mlp", sum()),
                ],
            ]
        };
        let call = Call::Decode { position: 3 };
        let mut seen = Vec::new();
        let mut hook = |c: Call, rank: usize, node: &Node, outputs: &[&Tensor]| {
            assert_eq!(c, call);
            assert_eq!(outputs[0].as_f32().unwrap(), &[rank as f32]);
            seen.push(format!("{}@{rank}", node.name));
            Ok(())
        };
        replay(call, &ranks(1), &mut hook).unwrap();
        assert_eq!(seen, ["up@0", "up@1", "mlp@0", "mlp@1"]);

        let mut seen = Vec::new();
        let mut failing = |_: Call, rank: usize, node: &Node, _: &[&Tensor]| {
            seen.push(format!("{}@{rank}", node.name));
            if rank == 1 {
                return Err(GenerateError::Tp(Box::new(TpError::Failed)));
            }
            Ok(())
        };
        let err = replay(call, &ranks(1), &mut failing).unwrap_err();
        assert!(matches!(err, GenerateError::Tp(_)), "{err}");
        assert_eq!(seen, ["up@0", "up@1"]);
    }

    #[test]
    fn a_timeout_names_every_rank_still_busy() {
        let e = TpError::Timeout {
            at: "decode@5".into(),
            ranks: vec![0, 1],
            secs: 5.0,
            detail: "rank 0 waits for all_reduce \"x\"".into(),
        };
        let text = e.to_string();
        assert!(
            text.starts_with("decode@5: ranks 0, 1 did not finish within the collective timeout of 5 s: rank 0 waits"),
            "{text}"
        );
    }
}
