//! Running a compiled module as a language model: prefill a prompt through `prefill`, then
//! decode one token at a time through `decode` and the persistent caches (never by re-running
//! the whole sequence).

use glmc_ir::{Function, Module};

use crate::interp::{InterpError, Interpreter, SequenceCache, TraceFn, WeightSource};
use crate::sampling::{Sampler, SamplingError};
use crate::tensor::Tensor;

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error(transparent)]
    Interp(#[from] InterpError),
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error("the module has no `{0}` function; was it built by glmc?")]
    MissingFunction(&'static str),
    #[error("the prompt is empty; give at least one token")]
    EmptyPrompt,
    #[error("token id {id} is outside the vocabulary (0..{vocab})")]
    TokenOutOfRange { id: u64, vocab: usize },
    #[error("`{function}` returned {got}, expected logits [rows, vocab]")]
    BadLogits { function: &'static str, got: String },
}

/// Which call of the model a trace record comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// A prefill of the tokens at positions `start..start + len`.
    Prefill { start: usize, len: usize },
    /// A decode step of the token at `position`.
    Decode { position: usize },
}

/// One sequence being generated.
pub struct Generator<'a> {
    module: &'a Module,
    prefill: &'a Function,
    decode: &'a Function,
    weights: &'a dyn WeightSource,
    interp: Interpreter,
    cache: SequenceCache,
    vocab: Option<usize>,
}

impl<'a> Generator<'a> {
    pub fn new(
        module: &'a Module,
        weights: &'a dyn WeightSource,
    ) -> Result<Generator<'a>, GenerateError> {
        let prefill = module
            .function("prefill")
            .ok_or(GenerateError::MissingFunction("prefill"))?;
        let decode = module
            .function("decode")
            .ok_or(GenerateError::MissingFunction("decode"))?;
        let vocab = prefill
            .results
            .first()
            .and_then(|(_, v)| prefill.value_type(*v).shape.last()?.as_const());
        Ok(Generator {
            module,
            prefill,
            decode,
            weights,
            interp: Interpreter::new(),
            cache: SequenceCache::new(),
            vocab: vocab.map(|v| v as usize),
        })
    }

    /// Tokens in the cache so far.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }

    fn check_ids(&self, ids: &[u64]) -> Result<(), GenerateError> {
        if let Some(vocab) = self.vocab {
            if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(GenerateError::TokenOutOfRange { id, vocab });
            }
        }
        Ok(())
    }

    /// Appends `ids` to the sequence in one prefill call; returns one logits row per token.
    pub fn prefill(
        &mut self,
        ids: &[u64],
        trace: &mut dyn FnMut(Call, &glmc_ir::Node, &[&Tensor]),
    ) -> Result<Vec<Vec<f32>>, GenerateError> {
        if ids.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        self.check_ids(ids)?;
        let start = self.cache.len();
        let call = Call::Prefill {
            start,
            len: ids.len(),
        };
        let inputs = token_inputs(ids, start..start + ids.len());
        let f = self.prefill;
        let out = self.run(f, &inputs, call, trace)?;
        rows(out, "prefill", ids.len())
    }

    /// Appends one token through `decode`; returns its logits row.
    pub fn decode(
        &mut self,
        id: u64,
        trace: &mut dyn FnMut(Call, &glmc_ir::Node, &[&Tensor]),
    ) -> Result<Vec<f32>, GenerateError> {
        self.check_ids(&[id])?;
        let position = self.cache.len();
        let inputs = token_inputs(&[id], position..position + 1);
        let f = self.decode;
        let out = self.run(f, &inputs, Call::Decode { position }, trace)?;
        Ok(rows(out, "decode", 1)?.remove(0))
    }

    fn run(
        &mut self,
        f: &Function,
        inputs: &[Tensor],
        call: Call,
        trace: &mut dyn FnMut(Call, &glmc_ir::Node, &[&Tensor]),
    ) -> Result<Vec<Tensor>, GenerateError> {
        let mut hook = |node: &glmc_ir::Node, outputs: &[&Tensor]| trace(call, node, outputs);
        let hook: &mut TraceFn = &mut hook;
        Ok(self.interp.run_traced(
            self.module,
            f,
            self.weights,
            &mut [&mut self.cache],
            inputs,
            hook,
        )?)
    }
}

fn token_inputs(ids: &[u64], positions: std::ops::Range<usize>) -> [Tensor; 2] {
    let ids: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
    let positions: Vec<i64> = positions.map(|p| p as i64).collect();
    let n = ids.len();
    [
        Tensor::i64(vec![n], ids).expect("one id per row"),
        Tensor::i64(vec![n], positions).expect("one position per row"),
    ]
}

fn rows(
    mut out: Vec<Tensor>,
    function: &'static str,
    n: usize,
) -> Result<Vec<Vec<f32>>, GenerateError> {
    let bad = |t: &Tensor| GenerateError::BadLogits {
        function,
        got: format!("{:?}", t.shape()),
    };
    let logits = out.remove(0);
    let [rows, vocab] = logits.shape() else {
        return Err(bad(&logits));
    };
    let (rows, vocab) = (*rows, *vocab);
    if rows != n {
        return Err(bad(&logits));
    }
    let data = logits.into_f32().map_err(|_| GenerateError::BadLogits {
        function,
        got: "integer logits".into(),
    })?;
    Ok(data.chunks(vocab).map(<[f32]>::to_vec).collect())
}

/// What one generation produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// Every token fed to the model: the prompt, then the generated tokens.
    pub tokens: Vec<u64>,
    pub generated: Vec<u64>,
    /// Row `i`: the logits after token `i` of `tokens`.
    pub logits: Vec<Vec<f32>>,
}

/// Prefills `prompt`, then samples up to `max_new` tokens, stopping after an `eos` token. Every
/// generated token is fed back, so `logits` has one row per token of `tokens`.
pub fn generate(
    gen: &mut Generator,
    prompt: &[u64],
    max_new: usize,
    sampler: &mut Sampler,
    eos: &[u64],
    trace: &mut dyn FnMut(Call, &glmc_ir::Node, &[&Tensor]),
) -> Result<Generation, GenerateError> {
    let mut logits = gen.prefill(prompt, trace)?;
    let mut tokens = prompt.to_vec();
    let mut generated = Vec::new();
    while generated.len() < max_new {
        let next = sampler.sample(logits.last().expect("prefill returns a row per token"))?;
        generated.push(next);
        tokens.push(next);
        logits.push(gen.decode(next, trace)?);
        if eos.contains(&next) {
            break;
        }
    }
    Ok(Generation {
        tokens,
        generated,
        logits,
    })
}

impl Generation {
    /// Writes `tokens` (i64 [T]), `logits` (f32 [T, vocab]) and `generated` (i64 [N]) as a
    /// safetensors file (`glmc run --dump-logits`).
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
