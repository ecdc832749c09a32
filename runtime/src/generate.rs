//! Running a compiled module as a language model: prefill a prompt through `prefill`, then
//! decode one token at a time through `decode` and the persistent caches (never by re-running
//! the whole sequence).

use glmc_ir::{Function, Module};

use crate::collective::Communicator;
use crate::interp::{InterpError, Interpreter, SequenceCache, TraceFn, WeightSource};
use crate::sampling::{Sampling, SamplingError};
use crate::tensor::Tensor;

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

/// What one call of `prefill` or `decode` returned.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// The logits rows the graph computes: prefill's last position (or every position, for a
    /// module built with `LogitRows::All`), decode's one row.
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

/// Where a function's results sit.
#[derive(Clone, Copy)]
struct Results {
    logits: usize,
    next_token: usize,
}

impl Results {
    fn find(f: &Function, function: &'static str) -> Result<Results, GenerateError> {
        let index = |result: &'static str| {
            f.results
                .iter()
                .position(|(name, _)| name == result)
                .ok_or(GenerateError::MissingResult { function, result })
        };
        Ok(Results {
            logits: index("logits")?,
            next_token: index("next_token")?,
        })
    }
}

/// One sequence being generated, by one module or by the ranks of a tensor-parallel group.
pub struct Generator<'a> {
    ranks: Vec<Rank<'a>>,
    prefill: Results,
    decode: Results,
    weights: &'a (dyn WeightSource + Sync),
    vocab: Option<usize>,
    /// Calls so far: the `step` of the next call's uniform draw.
    calls: u64,
}

/// One rank's module, interpreter and KV cache (every rank holds the whole latent cache).
struct Rank<'a> {
    module: &'a Module,
    prefill: &'a Function,
    decode: &'a Function,
    interp: Interpreter,
    cache: SequenceCache,
}

impl<'a> Generator<'a> {
    pub fn new(
        module: &'a Module,
        weights: &'a (dyn WeightSource + Sync),
    ) -> Result<Generator<'a>, GenerateError> {
        Generator::tensor_parallel(std::slice::from_ref(module), weights)
    }

    /// The ranks of one tensor-parallel group (`tp-partition`'s modules, by rank), run in
    /// lockstep on threads whose collectives meet in one [`Communicator`] group. Every rank
    /// computes the same logits and token; rank 0's are returned.
    pub fn tensor_parallel(
        modules: &'a [Module],
        weights: &'a (dyn WeightSource + Sync),
    ) -> Result<Generator<'a>, GenerateError> {
        let comms = match modules.len() {
            1 => vec![None],
            n => Communicator::group(n).into_iter().map(Some).collect(),
        };
        let mut ranks = Vec::with_capacity(modules.len());
        let mut results = None;
        for (module, comm) in modules.iter().zip(comms) {
            let prefill = module
                .function("prefill")
                .ok_or(GenerateError::MissingFunction("prefill"))?;
            let decode = module
                .function("decode")
                .ok_or(GenerateError::MissingFunction("decode"))?;
            results = Some((
                Results::find(prefill, "prefill")?,
                Results::find(decode, "decode")?,
            ));
            let interp = match comm {
                Some(c) => Interpreter::new().with_communicator(c),
                None => Interpreter::new(),
            };
            ranks.push(Rank {
                module,
                prefill,
                decode,
                interp,
                cache: SequenceCache::new(),
            });
        }
        let (prefill, decode) = results.ok_or(GenerateError::MissingFunction("prefill"))?;
        let f = ranks[0].prefill;
        let vocab = f
            .value_type(f.results[prefill.logits].1)
            .shape
            .last()
            .and_then(|d| d.as_const());
        Ok(Generator {
            ranks,
            prefill,
            decode,
            weights,
            vocab: vocab.map(|v| v as usize),
            calls: 0,
        })
    }

    /// Tokens in the cache so far.
    pub fn len(&self) -> usize {
        self.ranks[0].cache.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranks[0].cache.is_empty()
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
        trace: &mut dyn FnMut(Call, &glmc_ir::Node, &[&Tensor]),
    ) -> Result<Step, GenerateError> {
        if ids.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        self.check_ids(ids)?;
        let start = self.len();
        let call = Call::Prefill {
            start,
            len: ids.len(),
        };
        let results = self.prefill;
        let out = self.run(true, ids, start, sampling, 1, call, trace)?;
        step(out, results, "prefill", ids.len())
    }

    /// Appends one token through `decode`, drawing the next token with `sampling`.
    pub fn decode(
        &mut self,
        id: u64,
        sampling: &Sampling,
        trace: &mut dyn FnMut(Call, &glmc_ir::Node, &[&Tensor]),
    ) -> Result<Step, GenerateError> {
        self.check_ids(&[id])?;
        let position = self.len();
        let results = self.decode;
        let out = self.run(
            false,
            &[id],
            position,
            sampling,
            1,
            Call::Decode { position },
            trace,
        )?;
        step(out, results, "decode", 1)
    }

    /// One call of `prefill` (or `decode`) on every rank; rank 0's results. Rank 0 runs on
    /// this thread with `trace`, the others on threads of their own.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        prefill: bool,
        ids: &[u64],
        start: usize,
        sampling: &Sampling,
        sampled_rows: usize,
        call: Call,
        trace: &mut dyn FnMut(Call, &glmc_ir::Node, &[&Tensor]),
    ) -> Result<Vec<Tensor>, GenerateError> {
        let ids: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
        let positions: Vec<i64> = (start..start + ids.len()).map(|p| p as i64).collect();
        let inputs = phase_inputs(&ids, &positions, sampling, self.calls, sampled_rows);
        self.calls += 1;
        let weights = self.weights;
        let (first, others) = self.ranks.split_first_mut().expect("at least one rank");
        let results: Vec<Result<Vec<Tensor>, InterpError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = others
                .iter_mut()
                .map(|rank| {
                    let inputs = &inputs;
                    scope.spawn(move || {
                        let f = if prefill { rank.prefill } else { rank.decode };
                        let caches = &mut [&mut rank.cache];
                        rank.interp.run(rank.module, f, weights, caches, inputs)
                    })
                })
                .collect();
            let mut hook = |node: &glmc_ir::Node, outputs: &[&Tensor]| trace(call, node, outputs);
            let hook: &mut TraceFn = &mut hook;
            let f = if prefill { first.prefill } else { first.decode };
            let caches = &mut [&mut first.cache];
            let mut results =
                vec![first
                    .interp
                    .run_traced(first.module, f, weights, caches, &inputs, hook)];
            results.extend(
                handles
                    .into_iter()
                    .map(|h| h.join().expect("a rank's interpreter panicked")),
            );
            results
        });
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
    let logits = std::mem::replace(&mut out[results.logits], Tensor::zeros(vec![0]));
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
    let next = match next.as_i64() {
        Ok(&[id]) => id,
        _ => return Err(bad("next_token", format!("{:?}", next.shape()), "one id")),
    };
    Ok(Step {
        logits: data.chunks(vocab.max(1)).map(<[f32]>::to_vec).collect(),
        next_token: u64::try_from(next).ok(),
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
    trace: &mut dyn FnMut(Call, &glmc_ir::Node, &[&Tensor]),
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
