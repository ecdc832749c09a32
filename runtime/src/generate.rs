//! Running a compiled module as a language model: prefill a prompt through `prefill`, then
//! decode one token at a time through `decode` and the persistent caches (never by re-running
//! the whole sequence).

use glmc_ir::{Function, Module, Op};

use crate::collective::Communicator;
use crate::interp::{InterpError, Interpreter, SequenceCache, WeightSource};
use crate::sampling::{Sampling, SamplingError};
use crate::tensor::Tensor;
use crate::trace::{Fault, NonFinite};

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error(transparent)]
    Interp(#[from] InterpError),
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error("the module has no `{0}` function; was it built by glmc?")]
    MissingFunction(&'static str),
    #[error("`{function}` has no `{result}` result; was it built by glmc?")]
    MissingResult {
        function: &'static str,
        result: &'static str,
    },
    #[error("the prompt is empty; give at least one token")]
    EmptyPrompt,
    #[error("cache slot {slot} holds no sequence, so it cannot sit out a decode step idle")]
    IdleEmptySlot { slot: usize },
    #[error("token id {id} is outside the vocabulary (0..{vocab})")]
    TokenOutOfRange { id: u64, vocab: usize },
    #[error(transparent)]
    Cuda(#[from] crate::cuda::CudaError),
    #[error(transparent)]
    OutOfMemory(#[from] crate::cuda::OutOfMemory),
    #[error(transparent)]
    Tp(Box<crate::cuda::tp::TpError>),
    #[error(transparent)]
    NonFinite(#[from] NonFinite),
    #[error("`{function}` returned {result} of {got}, expected {expected}")]
    BadResult {
        function: &'static str,
        result: &'static str,
        got: String,
        expected: String,
    },
}

/// Which call of the model a trace record comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// A prefill of the tokens at positions `start..start + len`.
    Prefill { start: usize, len: usize },
    /// A decode step of the token at `position`.
    Decode { position: usize },
}

/// The per-node hook of a run (`--trace`, `--check-finite`): called after each node with the
/// rank that ran it (0 on a single device) and its outputs by executors that observe nodes. The
/// ranks of a tensor-parallel run call it in turn from their threads, each in its own execution
/// order. An error stops the run and is returned by it.
pub type NodeHook<'a> =
    dyn FnMut(Call, usize, &glmc_ir::Node, &[&Tensor]) -> Result<(), GenerateError> + Send + 'a;

/// What one call of `prefill` or `decode` returned.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// The logits rows the graph computes: prefill's last position (or every position, for a
    /// module built with `LogitRows::All`), decode's one row; none from a greedy build that
    /// returns no logits (`Sampler::Greedy`).
    pub logits: Vec<Vec<f32>>,
    /// The graph's `next_token`, drawn from the last row; `None` when that row holds only NaN.
    pub next_token: Option<u64>,
}

/// The inputs of the builder's `decode` (and the first five of `prefill`), in argument order:
/// `input_ids` and `positions` (one per token), then the sampler's `temperature`, `top_p` and
/// `uniform`, one per sampled row (`sampled_rows`: 1 for prefill, one per sequence for decode),
/// the uniform of row `r` drawn by `sampling` for `(step, r)`. Decode row `i` is cache slot `i`.
pub fn phase_inputs(
    ids: &[i64],
    positions: &[i64],
    sampling: &Sampling,
    step: u64,
    sampled_rows: usize,
) -> Vec<Tensor> {
    let per_row = |v: Vec<f32>| Tensor::f32(vec![sampled_rows], v).expect("one per row");
    let uniform = (0..sampled_rows as u64)
        .map(|r| sampling.uniform(step, r))
        .collect();
    vec![
        Tensor::i64(vec![ids.len()], ids.to_vec()).expect("one id per row"),
        Tensor::i64(vec![positions.len()], positions.to_vec()).expect("one position per row"),
        per_row(vec![sampling.temperature; sampled_rows]),
        per_row(vec![sampling.top_p; sampled_rows]),
        per_row(uniform),
    ]
}

/// The inputs of the builder's `prefill`: [`phase_inputs`] of one sampled row, then `slot`,
/// the cache slot the sequence's tokens go to.
pub fn prefill_inputs(
    ids: &[i64],
    positions: &[i64],
    sampling: &Sampling,
    step: u64,
    slot: usize,
) -> Vec<Tensor> {
    let mut inputs = phase_inputs(ids, positions, sampling, step, 1);
    inputs.push(Tensor::i64(vec![1], vec![slot as i64]).expect("one slot"));
    inputs
}

/// The cache slot a `prefill` call's inputs name (their sixth, see [`prefill_inputs`]); 0 for a
/// module without one.
fn slot_of(inputs: &[Tensor]) -> usize {
    match inputs.get(5).map(Tensor::as_i64) {
        Some(Ok(&[s])) => usize::try_from(s).unwrap_or(0),
        _ => 0,
    }
}

/// The two entry functions of a compiled model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PhaseKind {
    Prefill,
    Decode,
}

impl PhaseKind {
    pub fn name(self) -> &'static str {
        match self {
            PhaseKind::Prefill => "prefill",
            PhaseKind::Decode => "decode",
        }
    }
}

/// What runs a model's phases over its cache slots: the reference interpreter, or the CUDA
/// executor. `run`, traces and tests never care which.
pub trait Executor {
    /// The names of `phase`'s results, in the order `run` returns them.
    fn result_names(&self, phase: PhaseKind) -> Vec<String>;
    /// The vocabulary size, when the model states it.
    fn vocab(&self) -> Option<usize>;
    /// Runs `phase` on `inputs` (in argument order, see [`phase_inputs`]) and returns its
    /// results; each cache slot's caches persist from call to call (a prefill writes the slot its
    /// inputs name, decode row `i` slot `i`). `trace` is called per node by executors that record
    /// nodes.
    fn run(
        &mut self,
        phase: PhaseKind,
        inputs: &[Tensor],
        call: Call,
        trace: &mut NodeHook<'_>,
    ) -> Result<Vec<Tensor>, GenerateError>;
}

/// One rank of the reference interpreter: its module, interpreter and caches (one per cache
/// slot used so far).
struct Rank<'a> {
    module: &'a Module,
    interp: Interpreter,
    caches: Vec<SequenceCache>,
}

/// The caches a call of `phase` on `inputs` is given: every slot up to the prefill's, or one
/// per decode row.
fn slot_caches<'c>(
    caches: &'c mut Vec<SequenceCache>,
    phase: PhaseKind,
    inputs: &[Tensor],
) -> Vec<&'c mut SequenceCache> {
    let n = match phase {
        PhaseKind::Prefill => slot_of(inputs) + 1,
        PhaseKind::Decode => inputs.first().map_or(0, Tensor::numel),
    };
    if caches.len() < n {
        caches.resize_with(n, SequenceCache::new);
    }
    match phase {
        PhaseKind::Prefill => caches.iter_mut().collect(),
        PhaseKind::Decode => caches[..n].iter_mut().collect(),
    }
}

/// The reference interpreter as an [`Executor`]: one module, or the ranks of one
/// tensor-parallel group (`tp-partition`'s modules, by rank) run in lockstep on threads whose
/// collectives meet in one [`Communicator`] group. Every rank computes the same logits and
/// token; rank 0's are returned. Every rank's nodes are shown to the hook.
pub struct InterpExecutor<'a> {
    ranks: Vec<Rank<'a>>,
    weights: &'a (dyn WeightSource + Sync),
    fault: Option<Fault>,
}

impl<'a> InterpExecutor<'a> {
    pub fn new(module: &'a Module, weights: &'a (dyn WeightSource + Sync)) -> InterpExecutor<'a> {
        InterpExecutor::tensor_parallel(std::slice::from_ref(module), weights)
    }

    pub fn tensor_parallel(
        modules: &'a [Module],
        weights: &'a (dyn WeightSource + Sync),
    ) -> InterpExecutor<'a> {
        let comms = match modules.len() {
            1 => vec![None],
            n => Communicator::group(n).into_iter().map(Some).collect(),
        };
        let ranks = modules
            .iter()
            .zip(comms)
            .map(|(module, comm)| Rank {
                module,
                interp: match comm {
                    Some(c) => Interpreter::new().with_communicator(c),
                    None => Interpreter::new(),
                },
                caches: Vec::new(),
            })
            .collect();
        InterpExecutor {
            ranks,
            weights,
            fault: None,
        }
    }

    /// Rejects any position `>= max_context` on every rank (see
    /// [`Interpreter::with_max_context`]).
    pub fn with_max_context(mut self, max_context: usize) -> InterpExecutor<'a> {
        for rank in &mut self.ranks {
            rank.interp = std::mem::take(&mut rank.interp).with_max_context(max_context);
        }
        self
    }

    /// Breaks the node of `fault` on its rank (a test hook, see [`Fault`]).
    pub fn with_fault(mut self, fault: Option<Fault>) -> InterpExecutor<'a> {
        self.fault = fault;
        self
    }

    fn function(&self, phase: PhaseKind) -> Result<&'a Function, GenerateError> {
        self.ranks[0]
            .module
            .function(phase.name())
            .ok_or(GenerateError::MissingFunction(phase.name()))
    }
}

impl Executor for InterpExecutor<'_> {
    fn result_names(&self, phase: PhaseKind) -> Vec<String> {
        self.function(phase)
            .map(|f| f.results.iter().map(|(n, _)| n.clone()).collect())
            .unwrap_or_default()
    }

    fn vocab(&self) -> Option<usize> {
        let f = self.function(PhaseKind::Prefill).ok()?;
        // The logits' width, or in a greedy build without logits the embedding table's rows.
        let width = match f.results.iter().find(|(n, _)| n == "logits") {
            Some((_, logits)) => f.value_type(*logits).shape.last().cloned(),
            None => f.graph.node_indices().find_map(|n| match f.node(n).op {
                Op::Embed {} => f.value_type(f.operands(n)[0]).shape.first().cloned(),
                _ => None,
            }),
        };
        width.and_then(|d| d.as_const()).map(|v| v as usize)
    }

    fn run(
        &mut self,
        phase: PhaseKind,
        inputs: &[Tensor],
        call: Call,
        trace: &mut NodeHook<'_>,
    ) -> Result<Vec<Tensor>, GenerateError> {
        for rank in &self.ranks {
            rank.module
                .function(phase.name())
                .ok_or(GenerateError::MissingFunction(phase.name()))?;
        }
        let weights = self.weights;
        let fault = self.fault.as_ref();
        // The hook, and the error that stopped it: the interpreter finishes the call after a
        // hook's error, later nodes of every rank are not shown to the hook, and the error is
        // returned in place of the results.
        let hook = std::sync::Mutex::new((trace, None::<GenerateError>));
        let observe = |rank: usize, node: &glmc_ir::Node, outputs: &[&Tensor]| {
            let broken: Option<Vec<Tensor>> = fault
                .filter(|f| f.node == node.name && f.rank == rank)
                .map(|f| outputs.iter().map(|t| f.apply(t)).collect());
            let mut guard = hook.lock().unwrap_or_else(|e| e.into_inner());
            let (trace, stopped) = &mut *guard;
            if stopped.is_none() {
                let seen: Vec<&Tensor> = match &broken {
                    Some(b) => b.iter().collect(),
                    None => outputs.to_vec(),
                };
                *stopped = trace(call, rank, node, &seen).err();
            }
            broken
        };
        let (first, others) = self.ranks.split_first_mut().expect("at least one rank");
        let results: Vec<Result<Vec<Tensor>, InterpError>> = std::thread::scope(|scope| {
            let observe = &observe;
            let handles: Vec<_> = others
                .iter_mut()
                .enumerate()
                .map(|(i, rank)| {
                    scope.spawn(move || {
                        let f = rank.module.function(phase.name()).expect("checked above");
                        let mut caches = slot_caches(&mut rank.caches, phase, inputs);
                        let mut patch = |node: &glmc_ir::Node, _: &[&Tensor], out: &[&Tensor]| {
                            observe(i + 1, node, out)
                        };
                        rank.interp.run_patched(
                            rank.module,
                            f,
                            weights,
                            &mut caches,
                            inputs,
                            &mut patch,
                        )
                    })
                })
                .collect();
            let mut patch =
                |node: &glmc_ir::Node, _: &[&Tensor], out: &[&Tensor]| observe(0, node, out);
            let f = first.module.function(phase.name()).expect("checked above");
            let mut caches = slot_caches(&mut first.caches, phase, inputs);
            let mut results = vec![first.interp.run_patched(
                first.module,
                f,
                weights,
                &mut caches,
                inputs,
                &mut patch,
            )];
            results.extend(
                handles
                    .into_iter()
                    .map(|h| h.join().expect("a rank's interpreter panicked")),
            );
            results
        });
        let (_, stopped) = hook.into_inner().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = stopped {
            return Err(e);
        }
        // Report the rank that failed on its own, not one that its failure aborted.
        let mut errors = Vec::new();
        let mut outputs = Vec::new();
        for r in results {
            match r {
                Ok(o) => outputs.push(o),
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            return Ok(outputs.swap_remove(0));
        }
        let cause = errors
            .iter()
            .position(|e| !e.to_string().contains(crate::collective::ABORTED))
            .unwrap_or(0);
        Err(errors.swap_remove(cause).into())
    }
}

/// Where a phase's results sit; a greedy build may return no logits.
#[derive(Clone, Copy)]
struct Results {
    logits: Option<usize>,
    next_token: usize,
}

impl Results {
    fn find(names: &[String], function: &'static str) -> Result<Results, GenerateError> {
        let index = |result: &'static str| {
            names
                .iter()
                .position(|name| name == result)
                .ok_or(GenerateError::MissingResult { function, result })
        };
        Ok(Results {
            logits: names.iter().position(|name| name == "logits"),
            next_token: index("next_token")?,
        })
    }
}

/// Sequences being generated, one per cache slot.
pub struct Generator<'a> {
    exec: Box<dyn Executor + 'a>,
    prefill: Results,
    decode: Results,
    vocab: Option<usize>,
    /// Per cache slot: tokens in its cache, and the last of them.
    slots: Vec<Slot>,
    /// Calls so far: the `step` of the next call's uniform draw.
    calls: u64,
}

#[derive(Clone, Copy, Default)]
struct Slot {
    len: usize,
    last: Option<u64>,
}

/// One row of a batched decode step ([`Generator::decode_rows`]); row `i` is cache slot `i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeRow {
    /// Appends this token to the slot's sequence.
    Next(u64),
    /// A slot whose sequence has finished while a higher slot still decodes: it computes its
    /// last token again at its last position, rewriting that cache row with the same values,
    /// and its result is dropped. The slot's sequence does not grow.
    Idle,
}

impl<'a> Generator<'a> {
    /// A generator on the reference interpreter.
    pub fn new(
        module: &'a Module,
        weights: &'a (dyn WeightSource + Sync),
    ) -> Result<Generator<'a>, GenerateError> {
        Generator::tensor_parallel(std::slice::from_ref(module), weights)
    }

    /// A generator on the reference interpreter running the ranks of one tensor-parallel group
    /// (see [`InterpExecutor::tensor_parallel`]).
    pub fn tensor_parallel(
        modules: &'a [Module],
        weights: &'a (dyn WeightSource + Sync),
    ) -> Result<Generator<'a>, GenerateError> {
        for module in modules {
            for phase in [PhaseKind::Prefill, PhaseKind::Decode] {
                module
                    .function(phase.name())
                    .ok_or(GenerateError::MissingFunction(phase.name()))?;
            }
        }
        Generator::with_executor(Box::new(InterpExecutor::tensor_parallel(modules, weights)))
    }

    /// A generator on any executor.
    pub fn with_executor(exec: Box<dyn Executor + 'a>) -> Result<Generator<'a>, GenerateError> {
        let prefill = Results::find(&exec.result_names(PhaseKind::Prefill), "prefill")?;
        let decode = Results::find(&exec.result_names(PhaseKind::Decode), "decode")?;
        let vocab = exec.vocab();
        Ok(Generator {
            exec,
            prefill,
            decode,
            vocab,
            slots: Vec::new(),
            calls: 0,
        })
    }

    /// Tokens in slot 0's cache so far (the one sequence of [`Generator::prefill`]).
    pub fn len(&self) -> usize {
        self.slot_len(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens in cache slot `slot` so far.
    pub fn slot_len(&self, slot: usize) -> usize {
        self.slots.get(slot).map_or(0, |s| s.len)
    }

    /// Forgets slot `slot`'s sequence: its next prefill starts a new one at position 0.
    pub fn reset_slot(&mut self, slot: usize) {
        if let Some(s) = self.slots.get_mut(slot) {
            *s = Slot::default();
        }
    }

    fn slot_mut(&mut self, slot: usize) -> &mut Slot {
        if self.slots.len() <= slot {
            self.slots.resize(slot + 1, Slot::default());
        }
        &mut self.slots[slot]
    }

    fn check_ids(&self, ids: &[u64]) -> Result<(), GenerateError> {
        if let Some(vocab) = self.vocab {
            if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(GenerateError::TokenOutOfRange { id, vocab });
            }
        }
        Ok(())
    }

    /// Appends `ids` to slot 0's sequence in one prefill call, drawing the next token with
    /// `sampling`.
    pub fn prefill(
        &mut self,
        ids: &[u64],
        sampling: &Sampling,
        trace: &mut NodeHook<'_>,
    ) -> Result<Step, GenerateError> {
        self.prefill_slot(0, ids, sampling, trace)
    }

    /// Appends `ids` to the sequence of cache slot `slot` in one prefill call, drawing the next
    /// token with `sampling`.
    pub fn prefill_slot(
        &mut self,
        slot: usize,
        ids: &[u64],
        sampling: &Sampling,
        trace: &mut NodeHook<'_>,
    ) -> Result<Step, GenerateError> {
        if ids.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        self.check_ids(ids)?;
        let start = self.slot_len(slot);
        let call = Call::Prefill {
            start,
            len: ids.len(),
        };
        let ids_i64: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
        let positions: Vec<i64> = (start..start + ids.len()).map(|p| p as i64).collect();
        let inputs = prefill_inputs(&ids_i64, &positions, sampling, self.calls, slot);
        self.calls += 1;
        let mut out = self.exec.run(PhaseKind::Prefill, &inputs, call, trace)?;
        let s = self.slot_mut(slot);
        s.len += ids.len();
        s.last = ids.last().copied();
        let rows = logits_rows(&mut out, self.prefill, "prefill", &[1, ids.len()])?;
        let next = next_tokens(&mut out, self.prefill, "prefill", 1)?;
        Ok(Step {
            logits: rows,
            next_token: next[0],
        })
    }

    /// Appends one token to slot 0's sequence through `decode`, drawing the next token with
    /// `sampling`.
    pub fn decode(
        &mut self,
        id: u64,
        sampling: &Sampling,
        trace: &mut NodeHook<'_>,
    ) -> Result<Step, GenerateError> {
        let mut steps = self.decode_rows(&[DecodeRow::Next(id)], sampling, trace)?;
        Ok(steps.swap_remove(0).expect("a row that decodes has a step"))
    }

    /// One decode call over slots `0..rows.len()` (row `i` is slot `i`, each at its own
    /// position), drawing each row's next token with `sampling`; `None` for an idle row.
    pub fn decode_rows(
        &mut self,
        rows: &[DecodeRow],
        sampling: &Sampling,
        trace: &mut NodeHook<'_>,
    ) -> Result<Vec<Option<Step>>, GenerateError> {
        let mut ids = Vec::with_capacity(rows.len());
        let mut positions = Vec::with_capacity(rows.len());
        for (i, row) in rows.iter().enumerate() {
            let slot = self.slots.get(i).copied().unwrap_or_default();
            let (id, position) = match (*row, slot.last) {
                (DecodeRow::Next(id), _) => (id, slot.len),
                (DecodeRow::Idle, Some(last)) => (last, slot.len - 1),
                (DecodeRow::Idle, None) => return Err(GenerateError::IdleEmptySlot { slot: i }),
            };
            ids.push(id);
            positions.push(position as i64);
        }
        self.check_ids(&ids)?;
        let call = Call::Decode {
            position: positions.iter().max().map_or(0, |&p| p as usize),
        };
        let ids_i64: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
        let inputs = phase_inputs(&ids_i64, &positions, sampling, self.calls, rows.len());
        self.calls += 1;
        let mut out = self.exec.run(PhaseKind::Decode, &inputs, call, trace)?;
        for (i, row) in rows.iter().enumerate() {
            if let DecodeRow::Next(id) = *row {
                let s = self.slot_mut(i);
                s.len += 1;
                s.last = Some(id);
            }
        }
        let mut logits = logits_rows(&mut out, self.decode, "decode", &[rows.len()])?.into_iter();
        let next = next_tokens(&mut out, self.decode, "decode", rows.len())?;
        Ok(rows
            .iter()
            .zip(next)
            .map(|(row, next_token)| {
                let logits: Vec<Vec<f32>> = logits.next().into_iter().collect();
                matches!(row, DecodeRow::Next(_)).then_some(Step { logits, next_token })
            })
            .collect())
    }
}

fn bad_result(
    function: &'static str,
    result: &'static str,
    got: String,
    expected: &str,
) -> GenerateError {
    GenerateError::BadResult {
        function,
        result,
        got,
        expected: expected.to_string(),
    }
}

/// The `logits` result as rows, checked to have one of the row counts `rows`; none where the
/// build returns no logits (a greedy build whose lm_head feeds the argmax directly).
fn logits_rows(
    out: &mut [Tensor],
    results: Results,
    function: &'static str,
    rows: &[usize],
) -> Result<Vec<Vec<f32>>, GenerateError> {
    let Some(at) = results.logits else {
        return Ok(Vec::new());
    };
    let logits = std::mem::replace(&mut out[at], Tensor::zeros(vec![0]));
    let shape = format!("{:?}", logits.shape());
    let &[n, vocab] = logits.shape() else {
        return Err(bad_result(function, "logits", shape, "[rows, vocab]"));
    };
    if !rows.contains(&n) {
        let expected = rows.iter().map(usize::to_string).collect::<Vec<_>>();
        return Err(bad_result(
            function,
            "logits",
            shape,
            &format!("{} rows", expected.join(" or ")),
        ));
    }
    let data = logits
        .into_f32()
        .map_err(|_| bad_result(function, "logits", "integers".into(), "floats"))?;
    Ok(data.chunks(vocab.max(1)).map(<[f32]>::to_vec).collect())
}

/// The `next_token` result, `n` ids; `None` for a row whose logits hold only NaN.
fn next_tokens(
    out: &mut [Tensor],
    results: Results,
    function: &'static str,
    n: usize,
) -> Result<Vec<Option<u64>>, GenerateError> {
    let next = std::mem::replace(&mut out[results.next_token], Tensor::zeros(vec![0]));
    match next.as_i64() {
        Ok(ids) if ids.len() == n => Ok(ids.iter().map(|&id| u64::try_from(id).ok()).collect()),
        _ => Err(bad_result(
            function,
            "next_token",
            format!("{:?}", next.shape()),
            &format!("{n} ids"),
        )),
    }
}

/// What one generation produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// Every token fed to the model: the prompt, then the generated tokens.
    pub tokens: Vec<u64>,
    pub generated: Vec<u64>,
    /// Row `i`: the logits after token `logits_from + i` of `tokens`. A module built with
    /// `LogitRows::All` gives every row (`logits_from` = 0); one built with `LogitRows::Last`
    /// starts at the prompt's last token.
    pub logits: Vec<Vec<f32>>,
    pub logits_from: usize,
}

/// Prefills `prompt`, then takes up to `max_new` tokens from the graph's `next_token` (drawn
/// with `sampling`), stopping after an `eos` token. Every generated token is fed back, so
/// `logits` reaches the last token of `tokens`.
pub fn generate(
    gen: &mut Generator,
    prompt: &[u64],
    max_new: usize,
    sampling: &Sampling,
    eos: &[u64],
    trace: &mut NodeHook<'_>,
) -> Result<Generation, GenerateError> {
    sampling.validate()?;
    let first = gen.prefill(prompt, sampling, trace)?;
    let logits_from = prompt.len() - first.logits.len();
    let mut logits = first.logits;
    let mut next = first.next_token;
    let mut tokens = prompt.to_vec();
    let mut generated = Vec::new();
    while generated.len() < max_new {
        let token = next.ok_or(SamplingError::BadLogits)?;
        generated.push(token);
        tokens.push(token);
        let step = gen.decode(token, sampling, trace)?;
        logits.extend(step.logits);
        next = step.next_token;
        if eos.contains(&token) {
            break;
        }
    }
    Ok(Generation {
        tokens,
        generated,
        logits,
        logits_from,
    })
}

/// [`generate`] for several prompts at once: prompt `i` is prefilled into cache slot `i`, then
/// every step decodes all unfinished sequences in one `decode` call (row `i` is slot `i`, rows
/// at their own positions). Each sequence stops on its own, after an `eos` token or `max_new`
/// tokens; one that stops below a slot still decoding sits out the later steps as an idle row
/// ([`DecodeRow::Idle`]). Generation `i` is prompt `i`'s, as [`generate`] would make it when
/// greedy; when sampling, each row draws its own uniforms (by call and row), so the tokens drawn
/// differ from a batch of one's.
pub fn generate_batch(
    gen: &mut Generator,
    prompts: &[Vec<u64>],
    max_new: usize,
    sampling: &Sampling,
    eos: &[u64],
    trace: &mut NodeHook<'_>,
) -> Result<Vec<Generation>, GenerateError> {
    sampling.validate()?;
    let mut out = Vec::with_capacity(prompts.len());
    let mut next = Vec::with_capacity(prompts.len());
    for (slot, prompt) in prompts.iter().enumerate() {
        gen.reset_slot(slot);
        let first = gen.prefill_slot(slot, prompt, sampling, trace)?;
        out.push(Generation {
            tokens: prompt.clone(),
            generated: Vec::new(),
            logits_from: prompt.len() - first.logits.len(),
            logits: first.logits,
        });
        next.push(first.next_token);
    }
    let mut live: Vec<bool> = vec![max_new > 0; prompts.len()];
    while let Some(top) = live.iter().rposition(|&l| l) {
        let mut rows = Vec::with_capacity(top + 1);
        for i in 0..=top {
            if !live[i] {
                rows.push(DecodeRow::Idle);
                continue;
            }
            let token = next[i].ok_or(SamplingError::BadLogits)?;
            out[i].generated.push(token);
            out[i].tokens.push(token);
            rows.push(DecodeRow::Next(token));
        }
        let steps = gen.decode_rows(&rows, sampling, trace)?;
        for (i, step) in steps.into_iter().enumerate() {
            let (Some(step), DecodeRow::Next(token)) = (step, rows[i]) else {
                continue;
            };
            out[i].logits.extend(step.logits);
            next[i] = step.next_token;
            live[i] = out[i].generated.len() < max_new && !eos.contains(&token);
        }
    }
    Ok(out)
}

impl Generation {
    /// Writes `tokens` (i64 [T]), `logits` (f32 [rows, vocab], rows = T − `logits_from`) and
    /// `generated` (i64 [N]) as a safetensors file (`glmc run --dump-logits`, which builds
    /// with every row, so rows = T).
    pub fn write_safetensors(
        &self,
        path: &std::path::Path,
    ) -> Result<(), safetensors::SafeTensorError> {
        use safetensors::tensor::{Dtype, TensorView};
        let tokens: Vec<u8> = self
            .tokens
            .iter()
            .flat_map(|&t| (t as i64).to_le_bytes())
            .collect();
        let generated: Vec<u8> = self
            .generated
            .iter()
            .flat_map(|&t| (t as i64).to_le_bytes())
            .collect();
        let vocab = self.logits.first().map_or(0, Vec::len);
        let logits: Vec<u8> = self
            .logits
            .iter()
            .flatten()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let views = [
            (
                "tokens",
                TensorView::new(Dtype::I64, vec![self.tokens.len()], &tokens)?,
            ),
            (
                "logits",
                TensorView::new(Dtype::F32, vec![self.logits.len(), vocab], &logits)?,
            ),
            (
                "generated",
                TensorView::new(Dtype::I64, vec![self.generated.len()], &generated)?,
            ),
        ];
        safetensors::serialize_to_file(views, None, path)
    }
}
