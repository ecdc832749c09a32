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
    #[error("token id {id} is outside the vocabulary (0..{vocab})")]
    TokenOutOfRange { id: u64, vocab: usize },
    #[error(transparent)]
    Cuda(#[from] crate::cuda::CudaError),
    #[error(transparent)]
    OutOfMemory(#[from] crate::cuda::OutOfMemory),
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

/// The inputs of the builder's `prefill` and `decode`, in argument order: `input_ids` and
/// `positions` (one per token), then the sampler's `temperature`, `top_p` and `uniform`, one per
/// sampled row (`sampled_rows`: 1 for prefill, one per sequence for decode), the uniform of
/// row `r` drawn by `sampling` for `(step, r)`.
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

/// What runs a model's phases for one sequence: the reference interpreter, or the CUDA executor.
/// `run`, traces and tests never care which.
pub trait Executor {
    /// The names of `phase`'s results, in the order `run` returns them.
    fn result_names(&self, phase: PhaseKind) -> Vec<String>;
    /// The vocabulary size, when the model states it.
    fn vocab(&self) -> Option<usize>;
    /// Runs `phase` on `inputs` (in argument order, see [`phase_inputs`]) and returns its
    /// results; the sequence's caches persist from call to call. `trace` is called per node by
    /// executors that record nodes.
    fn run(
        &mut self,
        phase: PhaseKind,
        inputs: &[Tensor],
        call: Call,
        trace: &mut NodeHook<'_>,
    ) -> Result<Vec<Tensor>, GenerateError>;
}

/// One rank of the reference interpreter: its module, interpreter and caches.
struct Rank<'a> {
    module: &'a Module,
    interp: Interpreter,
    cache: SequenceCache,
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
                cache: SequenceCache::new(),
            })
            .collect();
        InterpExecutor {
            ranks,
            weights,
            fault: None,
        }
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
                        let caches = &mut [&mut rank.cache];
                        let mut patch = |node: &glmc_ir::Node, _: &[&Tensor], out: &[&Tensor]| {
                            observe(i + 1, node, out)
                        };
                        rank.interp
                            .run_patched(rank.module, f, weights, caches, inputs, &mut patch)
                    })
                })
                .collect();
            let mut patch =
                |node: &glmc_ir::Node, _: &[&Tensor], out: &[&Tensor]| observe(0, node, out);
            let f = first.module.function(phase.name()).expect("checked above");
            let caches = &mut [&mut first.cache];
            let mut results = vec![first.interp.run_patched(
                first.module,
                f,
                weights,
                caches,
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

/// One sequence being generated.
pub struct Generator<'a> {
    exec: Box<dyn Executor + 'a>,
    prefill: Results,
    decode: Results,
    vocab: Option<usize>,
    /// Tokens in the sequence's cache.
    len: usize,
    /// Calls so far: the `step` of the next call's uniform draw.
    calls: u64,
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
            len: 0,
            calls: 0,
        })
    }

    /// Tokens in the cache so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check_ids(&self, ids: &[u64]) -> Result<(), GenerateError> {
        if let Some(vocab) = self.vocab {
            if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(GenerateError::TokenOutOfRange { id, vocab });
            }
        }
        Ok(())
    }

    /// Appends `ids` to the sequence in one prefill call, drawing the next token with
    /// `sampling`.
    pub fn prefill(
        &mut self,
        ids: &[u64],
        sampling: &Sampling,
        trace: &mut NodeHook<'_>,
    ) -> Result<Step, GenerateError> {
        if ids.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        self.check_ids(ids)?;
        let start = self.len;
        let call = Call::Prefill {
            start,
            len: ids.len(),
        };
        let out = self.run(PhaseKind::Prefill, ids, start, sampling, call, trace)?;
        step(out, self.prefill, "prefill", ids.len())
    }

    /// Appends one token through `decode`, drawing the next token with `sampling`.
    pub fn decode(
        &mut self,
        id: u64,
        sampling: &Sampling,
        trace: &mut NodeHook<'_>,
    ) -> Result<Step, GenerateError> {
        self.check_ids(&[id])?;
        let position = self.len;
        let call = Call::Decode { position };
        let out = self.run(PhaseKind::Decode, &[id], position, sampling, call, trace)?;
        step(out, self.decode, "decode", 1)
    }

    fn run(
        &mut self,
        phase: PhaseKind,
        ids: &[u64],
        start: usize,
        sampling: &Sampling,
        call: Call,
        trace: &mut NodeHook<'_>,
    ) -> Result<Vec<Tensor>, GenerateError> {
        let ids: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
        let positions: Vec<i64> = (start..start + ids.len()).map(|p| p as i64).collect();
        let inputs = phase_inputs(&ids, &positions, sampling, self.calls, 1);
        self.calls += 1;
        let out = self.exec.run(phase, &inputs, call, trace)?;
        self.len += ids.len();
        Ok(out)
    }
}

/// The logits rows and the next token of one call of a one-sequence batch of `n` tokens: a
/// prefill returns one logits row or `n`, a decode one.
fn step(
    mut out: Vec<Tensor>,
    results: Results,
    function: &'static str,
    n: usize,
) -> Result<Step, GenerateError> {
    let bad = |result: &'static str, got: String, expected: &str| GenerateError::BadResult {
        function,
        result,
        got,
        expected: expected.to_string(),
    };
    let next = std::mem::replace(&mut out[results.next_token], Tensor::zeros(vec![0]));
    let next = match next.as_i64() {
        Ok(&[id]) => id,
        _ => return Err(bad("next_token", format!("{:?}", next.shape()), "one id")),
    };
    let next_token = u64::try_from(next).ok();
    let Some(at) = results.logits else {
        return Ok(Step {
            logits: Vec::new(),
            next_token,
        });
    };
    let logits = std::mem::replace(&mut out[at], Tensor::zeros(vec![0]));
    let shape = format!("{:?}", logits.shape());
    let &[rows, vocab] = logits.shape() else {
        return Err(bad("logits", shape, "[rows, vocab]"));
    };
    if rows != 1 && rows != n {
        return Err(bad("logits", shape, &format!("1 or {n} rows")));
    }
    let data = logits
        .into_f32()
        .map_err(|_| bad("logits", "integers".into(), "floats"))?;
    Ok(Step {
        logits: data.chunks(vocab.max(1)).map(<[f32]>::to_vec).collect(),
        next_token,
    })
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
