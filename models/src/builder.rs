//! The GLM-5 graph builder.
//!
//! It writes the model the way the reference (transformers' `GlmMoeDsaForCausalLM`) computes
//! it: separate projections, expanded MLA, the DSA indexer wherever the config has one. Passes
//! make it fast; the builder's job is to be obviously right. Every node carries the HF module
//! path it corresponds to, and every weight the HF tensor it reads, so dumps, traces and
//! checkpoints line up by name.
//!
//! Two entry functions share one set of cache states:
//! - `prefill(input_ids i64[s], positions i64[s], temperature f32[1], top_p f32[1],
//!   uniform f32[1], slot i64[1])` appends `s` tokens of one sequence to the caches of cache
//!   slot `slot` (which may already hold earlier chunks) and returns `logits f32[1, vocab]` for its last position, or `[s, vocab]`
//!   for every position when built with [`LogitRows::All`], and `next_token i64[1]`;
//! - `decode(input_ids i64[b], positions i64[b], temperature f32[b], top_p f32[b],
//!   uniform f32[b])` appends one token to each of `b` sequences, each at its own position, and
//!   returns `logits f32[b, vocab]` and `next_token i64[b]`. Row `i` is cache slot `i`: a batch
//!   of `b` sequences holds slots `0..b`, and a sequence that has finished while a higher slot
//!   still decodes keeps its row (its output unused).
//!
//! `next_token` is `sample.top_p` of the logits of each sequence's last position, so a GPU
//! backend can fuse `lm_head` with the sampler; `temperature` 0 makes it greedy. A build for a
//! greedy run ([`Sampler::Greedy`]) writes `sample.argmax` instead, and returns the logits only
//! when they are asked for ([`LogitRows::All`]).

use glmc_ir::{DType, Dim, Function, Module, Op, Recipe, TensorType, Value, VerifyError};

use crate::config::{IndexerLayerType, ModelConfig};

/// The entry functions the builder writes.
pub const PHASES: [Phase; 2] = [Phase::Prefill, Phase::Decode];

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    Prefill,
    Decode,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Prefill => "prefill",
            Phase::Decode => "decode",
        }
    }

    /// The symbol of the query-row dimension: new tokens of one sequence, or one token for
    /// each sequence of a batch.
    fn rows(self) -> Dim {
        match self {
            Phase::Prefill => Dim::sym("s"),
            Phase::Decode => Dim::sym("b"),
        }
    }
}

/// Which positions of a prefill get logits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogitRows {
    /// The last position only: generation needs no more, and the hidden state is cut to that
    /// row before the final norm and `lm_head` (at GLM-5 scale the logits of an 8192-token
    /// prefill would be 4.7 GiB).
    #[default]
    Last,
    /// Every position (`glmc run --dump-logits`, comparisons with a reference model).
    All,
}

/// How `next_token` is chosen: the compile-time half of the run's sampling settings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Sampler {
    /// `sample.top_p`, driven by the `temperature`, `top_p` and `uniform` inputs (greedy where
    /// `temperature` is 0), with the logits a result.
    #[default]
    TopP,
    /// `sample.argmax`: the run is greedy whatever the sampler inputs say (they stay, unread, so
    /// every build takes the same arguments), and the logits are a result only with
    /// [`LogitRows::All`]. A greedy run that neither writes nor traces the logits asks for
    /// this, and `fuse-lm-head-argmax` then folds `lm_head` into the argmax.
    Greedy,
}

/// What the caller asks of the graph, beyond the model itself (which [`ModelConfig`] describes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BuildOptions {
    pub logits: LogitRows,
    pub sampler: Sampler,
}

/// Builds the module with both phases. An error here means the config and the builder
/// disagree; a validated config never produces one.
pub fn build(config: &ModelConfig, options: &BuildOptions) -> Result<Module, VerifyError> {
    let mut module = Module::new(config.name.clone());
    declare_states(config, &mut module);
    for phase in PHASES {
        let f = build_function(config, options, phase)?;
        module.functions.push(f);
    }
    Ok(module)
}

/// Cache state names of layer `i`.
pub fn c_kv_state(i: usize) -> String {
    format!("model.layers.{i}.self_attn.cache.c_kv")
}

pub fn k_pe_state(i: usize) -> String {
    format!("model.layers.{i}.self_attn.cache.k_pe")
}

pub fn indexer_k_state(i: usize) -> String {
    format!("model.layers.{i}.self_attn.indexer.cache.k")
}

fn declare_states(c: &ModelConfig, module: &mut Module) {
    let row = |n: u64| TensorType::new(c.dtype, vec![Dim::Const(n)]);
    for i in 0..c.num_hidden_layers {
        module.states.insert(c_kv_state(i), row(c.kv_lora_rank));
        module.states.insert(k_pe_state(i), row(c.qk_rope_head_dim));
        if c.indexer_layer_type(i) == Some(IndexerLayerType::Full) {
            let indexer = c.indexer.as_ref().expect("a layer type implies an indexer");
            module
                .states
                .insert(indexer_k_state(i), row(indexer.index_head_dim));
        }
    }
}

/// The function being built, with what every layer needs.
struct Ctx<'a> {
    c: &'a ModelConfig,
    f: Function,
    phase: Phase,
    positions: Value,
    /// Prefill's cache slot; decode's rows are their slots.
    slot: Option<Value>,
}

impl Ctx<'_> {
    fn op(
        &mut self,
        op: Op,
        name: impl Into<String>,
        operands: &[Value],
    ) -> Result<Value, VerifyError> {
        self.f.push(op, name, operands).map(Value::from)
    }

    /// A weight read straight from one checkpoint tensor, in the model's dtype.
    fn weight(&mut self, tensor: String, shape: Vec<u64>) -> Result<Value, VerifyError> {
        self.weight_as(tensor, shape, self.c.dtype)
    }

    fn weight_as(
        &mut self,
        tensor: String,
        shape: Vec<u64>,
        dtype: DType,
    ) -> Result<Value, VerifyError> {
        self.f
            .push_weight(tensor.clone(), Recipe::tensor(tensor, shape), dtype)
    }

    /// `x · Wᵀ` for the HF linear layer `module` with weight `[out, in]`.
    fn linear(&mut self, module: &str, x: Value, out: u64, inp: u64) -> Result<Value, VerifyError> {
        let w = self.weight(format!("{module}.weight"), vec![out, inp])?;
        self.op(Op::Matmul {}, module, &[x, w])
    }

    fn rmsnorm(
        &mut self,
        module: &str,
        x: Value,
        dim: u64,
        eps: f64,
    ) -> Result<Value, VerifyError> {
        let w = self.weight(format!("{module}.weight"), vec![dim])?;
        self.op(Op::RmsNorm { eps }, module, &[x, w])
    }

    fn slice(
        &mut self,
        name: String,
        x: Value,
        axis: u64,
        start: u64,
        end: u64,
    ) -> Result<Value, VerifyError> {
        self.op(Op::Slice { axis, start, end }, name, &[x])
    }

    fn reshape(&mut self, name: String, x: Value, shape: Vec<Dim>) -> Result<Value, VerifyError> {
        self.op(Op::Reshape { shape }, name, &[x])
    }

    fn rope(&mut self, name: String, x: Value, interleaved: bool) -> Result<Value, VerifyError> {
        let positions = self.positions;
        self.op(
            Op::Rope {
                interleaved,
                theta: self.c.rope_theta,
            },
            name,
            &[x, positions],
        )
    }

    fn cache_update(
        &mut self,
        state: String,
        name: String,
        x: Value,
    ) -> Result<Value, VerifyError> {
        let mut operands = vec![x, self.positions];
        operands.extend(self.slot);
        let batched = self.phase == Phase::Decode;
        self.op(Op::CacheUpdate { batched, state }, name, &operands)
    }

    /// The shape of the cache's leading dims followed by `tail`: `[t, ..]` or `[b, t, ..]`.
    fn cache_shape(&self, tail: &[u64]) -> Vec<Dim> {
        let mut shape = match self.phase {
            Phase::Prefill => vec![Dim::sym("t")],
            Phase::Decode => vec![self.phase.rows(), Dim::sym("t")],
        };
        shape.extend(tail.iter().map(|&d| Dim::Const(d)));
        shape
    }

    fn cast_to(&mut self, name: String, x: Value, dtype: DType) -> Result<Value, VerifyError> {
        if self.f.value_type(x).dtype == dtype {
            return Ok(x);
        }
        self.op(Op::Cast { dtype }, name, &[x])
    }
}

fn build_function(
    c: &ModelConfig,
    options: &BuildOptions,
    phase: Phase,
) -> Result<Function, VerifyError> {
    let mut f = Function::new(phase.name());
    let rows = phase.rows();
    let ids = f.push_input(
        0,
        "input_ids",
        TensorType::new(DType::I64, vec![rows.clone()]),
    );
    let positions = f.push_input(
        1,
        "positions",
        TensorType::new(DType::I64, vec![rows.clone()]),
    );
    // One sampled row per sequence: prefill holds one sequence, decode `b`.
    let sampled = match phase {
        Phase::Prefill => Dim::Const(1),
        Phase::Decode => rows,
    };
    let sampler: Vec<Value> = ["temperature", "top_p", "uniform"]
        .into_iter()
        .enumerate()
        .map(|(k, name)| {
            let ty = TensorType::new(DType::F32, vec![sampled.clone()]);
            f.push_input(2 + k as u64, name, ty)
        })
        .collect();
    let slot = (phase == Phase::Prefill)
        .then(|| f.push_input(5, "slot", TensorType::new(DType::I64, vec![Dim::Const(1)])));
    let mut cx = Ctx {
        c,
        f,
        phase,
        positions,
        slot,
    };

    let table = cx.weight(
        "model.embed_tokens.weight".into(),
        vec![c.vocab_size, c.hidden_size],
    )?;
    let mut h = cx.op(Op::Embed {}, "model.embed_tokens", &[table, ids])?;
    let mut topk_by_layer: Vec<Option<Value>> = Vec::with_capacity(c.num_hidden_layers);
    for i in 0..c.num_hidden_layers {
        let p = format!("model.layers.{i}");
        let x = cx.rmsnorm(
            &format!("{p}.input_layernorm"),
            h,
            c.hidden_size,
            c.rms_norm_eps,
        )?;
        let attn = attention(&mut cx, i, x, &mut topk_by_layer)?;
        h = cx.op(Op::Add {}, format!("{p}.attn_residual"), &[h, attn])?;
        let x = cx.rmsnorm(
            &format!("{p}.post_attention_layernorm"),
            h,
            c.hidden_size,
            c.rms_norm_eps,
        )?;
        let mlp = if c.is_moe_layer(i) {
            moe(&mut cx, &p, x)?
        } else {
            swiglu(&mut cx, &format!("{p}.mlp"), x, c.intermediate_size)?
        };
        h = cx.op(Op::Add {}, format!("{p}.mlp_residual"), &[h, mlp])?;
    }
    let all_rows = phase == Phase::Decode || options.logits == LogitRows::All;
    let h = if all_rows {
        h
    } else {
        cx.op(Op::SliceLast {}, "model.last_position", &[h])?
    };
    let h = cx.rmsnorm("model.norm", h, c.hidden_size, c.rms_norm_eps)?;
    let logits = cx.linear("lm_head", h, c.vocab_size, c.hidden_size)?;
    let logits = cx.cast_to("logits".into(), logits, DType::F32)?;
    let last = if phase == Phase::Prefill && all_rows {
        cx.op(Op::SliceLast {}, "logits.last_position", &[logits])?
    } else {
        logits
    };
    let next = match options.sampler {
        Sampler::TopP => {
            let mut operands = vec![last];
            operands.extend(sampler);
            cx.op(Op::SampleTopP {}, "next_token", &operands)?
        }
        Sampler::Greedy => cx.op(Op::SampleArgmax {}, "next_token", &[last])?,
    };
    if options.sampler == Sampler::TopP || options.logits == LogitRows::All {
        cx.f.results.push(("logits".into(), logits));
    }
    cx.f.results.push(("next_token".into(), next));
    Ok(cx.f)
}

/// MLA in the expanded form, with the DSA indexer's top-k when the layer has one.
fn attention(
    cx: &mut Ctx,
    i: usize,
    x: Value,
    topk_by_layer: &mut Vec<Option<Value>>,
) -> Result<Value, VerifyError> {
    let c = cx.c;
    let p = format!("model.layers.{i}.self_attn");
    let (h, nope, rope, v_dim, lat) = (
        c.num_attention_heads,
        c.qk_nope_head_dim,
        c.qk_rope_head_dim,
        c.v_head_dim,
        c.kv_lora_rank,
    );
    let rows = cx.phase.rows();

    let q_a = cx.linear(&format!("{p}.q_a_proj"), x, c.q_lora_rank, c.hidden_size)?;
    let q_lat = cx.rmsnorm(
        &format!("{p}.q_a_layernorm"),
        q_a,
        c.q_lora_rank,
        c.latent_norm_eps,
    )?;
    let q = cx.linear(
        &format!("{p}.q_b_proj"),
        q_lat,
        h * (nope + rope),
        c.q_lora_rank,
    )?;
    let q = cx.reshape(
        format!("{p}.q_heads"),
        q,
        vec![rows.clone(), h.into(), (nope + rope).into()],
    )?;
    let q_nope = cx.slice(format!("{p}.q_nope"), q, 2, 0, nope)?;
    let q_pe = cx.slice(format!("{p}.q_pe_unrotated"), q, 2, nope, nope + rope)?;
    let q_pe = cx.rope(format!("{p}.q_pe"), q_pe, c.rope_interleave)?;

    let kv_a = cx.linear(
        &format!("{p}.kv_a_proj_with_mqa"),
        x,
        lat + rope,
        c.hidden_size,
    )?;
    let c_kv = cx.slice(format!("{p}.compressed_kv"), kv_a, 1, 0, lat)?;
    let c_kv = cx.rmsnorm(&format!("{p}.kv_a_layernorm"), c_kv, lat, c.latent_norm_eps)?;
    let k_pe = cx.slice(format!("{p}.k_pe_unrotated"), kv_a, 1, lat, lat + rope)?;
    let k_pe = cx.rope(format!("{p}.k_pe"), k_pe, c.rope_interleave)?;
    let c_cache = cx.cache_update(c_kv_state(i), format!("{p}.cache.c_kv"), c_kv)?;
    let pe_cache = cx.cache_update(k_pe_state(i), format!("{p}.cache.k_pe"), k_pe)?;

    let kv = cx.linear(&format!("{p}.kv_b_proj"), c_cache, h * (nope + v_dim), lat)?;
    let kv_shape = cx.cache_shape(&[h, nope + v_dim]);
    let head_axis = kv_shape.len() as u64 - 1;
    let kv = cx.reshape(format!("{p}.kv_heads"), kv, kv_shape)?;
    let k_nope = cx.slice(format!("{p}.k_nope"), kv, head_axis, 0, nope)?;
    let v = cx.slice(format!("{p}.value"), kv, head_axis, nope, nope + v_dim)?;

    let topk = match c.indexer_layer_type(i) {
        None => None,
        Some(IndexerLayerType::Full) => Some(indexer(cx, i, x, q_lat)?),
        Some(IndexerLayerType::Shared) => {
            let source = c
                .indexer_source_layer(i)
                .expect("validation rejects a shared first layer");
            topk_by_layer[source]
        }
    };
    topk_by_layer.push(topk);
    let positions = cx.positions;
    let mut operands = vec![q_nope, q_pe, k_nope, pe_cache, v, positions];
    operands.extend(topk);
    let attend = Op::MlaAttend {
        dense_until: 0,
        scale: c.softmax_scale(),
        sparse: topk.is_some(),
    };
    let o = cx.op(attend, format!("{p}.attn"), &operands)?;
    let o = cx.reshape(
        format!("{p}.attn_heads_merged"),
        o,
        vec![rows, (h * v_dim).into()],
    )?;
    cx.linear(&format!("{p}.o_proj"), o, c.hidden_size, h * v_dim)
}

/// The DSA lightning indexer of layer `i`: its top-k context tokens per query row.
fn indexer(cx: &mut Ctx, i: usize, x: Value, q_lat: Value) -> Result<Value, VerifyError> {
    let c = cx.c;
    let ix = c
        .indexer
        .as_ref()
        .expect("a full indexer layer implies an indexer");
    let p = format!("model.layers.{i}.self_attn.indexer");
    let (heads, dim, rope) = (ix.index_n_heads, ix.index_head_dim, c.qk_rope_head_dim);
    let rows = cx.phase.rows();

    // Indexer heads are laid out [rope | nope], the opposite of the main query.
    let q = cx.linear(&format!("{p}.wq_b"), q_lat, heads * dim, c.q_lora_rank)?;
    let q = cx.reshape(
        format!("{p}.q_heads"),
        q,
        vec![rows.clone(), heads.into(), dim.into()],
    )?;
    let q_pe = cx.slice(format!("{p}.q_pe_unrotated"), q, 2, 0, rope)?;
    let q_pe = cx.rope(format!("{p}.q_pe"), q_pe, ix.rope_interleave)?;
    let q_nope = cx.slice(format!("{p}.q_nope"), q, 2, rope, dim)?;
    let q = cx.op(Op::Concat { axis: 2 }, format!("{p}.q"), &[q_pe, q_nope])?;

    let k = cx.linear(&format!("{p}.wk"), x, dim, c.hidden_size)?;
    let norm_w = cx.weight(format!("{p}.k_norm.weight"), vec![dim])?;
    let norm_b = cx.weight(format!("{p}.k_norm.bias"), vec![dim])?;
    let k = cx.op(
        Op::LayerNorm { eps: ix.k_norm_eps },
        format!("{p}.k_norm"),
        &[k, norm_w, norm_b],
    )?;
    let k_pe = cx.slice(format!("{p}.k_pe_unrotated"), k, 1, 0, rope)?;
    let k_pe = cx.rope(format!("{p}.k_pe"), k_pe, ix.rope_interleave)?;
    let k_nope = cx.slice(format!("{p}.k_nope"), k, 1, rope, dim)?;
    let k = cx.op(Op::Concat { axis: 1 }, format!("{p}.k"), &[k_pe, k_nope])?;
    let k_cache = cx.cache_update(indexer_k_state(i), format!("{p}.cache.k"), k)?;

    // HF folds n_heads^-0.5 and the softmax scale head_dim^-0.5 into the head weights.
    let w = cx.linear(&format!("{p}.weights_proj"), x, heads, c.hidden_size)?;
    let factor = ((heads * dim) as f64).powf(-0.5);
    let w = cx.op(Op::Scale { factor }, format!("{p}.head_weights"), &[w])?;
    let positions = cx.positions;
    let scores = cx.op(
        Op::DsaScore { weight_scale: 1.0 },
        format!("{p}.scores"),
        &[q, w, k_cache, positions],
    )?;
    cx.op(
        Op::DsaTopk { k: ix.index_topk },
        format!("{p}.topk"),
        &[scores, positions],
    )
}

/// `down(silu(gate x) ⊙ up x)`: the dense MLP and the shared expert.
fn swiglu(cx: &mut Ctx, p: &str, x: Value, inter: u64) -> Result<Value, VerifyError> {
    let d = cx.c.hidden_size;
    let gate = cx.linear(&format!("{p}.gate_proj"), x, inter, d)?;
    let up = cx.linear(&format!("{p}.up_proj"), x, inter, d)?;
    let act = cx.op(Op::Silu {}, format!("{p}.act"), &[gate])?;
    let prod = cx.op(Op::Mul {}, format!("{p}.act_mul_up"), &[act, up])?;
    cx.linear(&format!("{p}.down_proj"), prod, d, inter)
}

/// Sigmoid-routed experts plus the shared experts.
fn moe(cx: &mut Ctx, layer: &str, x: Value) -> Result<Value, VerifyError> {
    let c = cx.c;
    let m = &c.moe;
    let p = format!("{layer}.mlp");
    let (d, e, inter) = (c.hidden_size, m.n_routed_experts, m.moe_intermediate_size);

    // The router runs in f32 whatever the model dtype, as in transformers and vLLM.
    let xf = cx.cast_to(format!("{p}.gate.input_f32"), x, DType::F32)?;
    let gate_w = cx.weight_as(format!("{p}.gate.weight"), vec![e, d], DType::F32)?;
    let logits = cx.op(Op::Matmul {}, format!("{p}.gate"), &[xf, gate_w])?;
    let bias = cx.weight_as(
        format!("{p}.gate.e_score_correction_bias"),
        vec![e],
        DType::F32,
    )?;
    let route = Op::MoeRoute {
        n_group: m.n_group,
        norm_topk_prob: m.norm_topk_prob,
        routed_scaling_factor: m.routed_scaling_factor,
        top_k: m.num_experts_per_tok,
        topk_group: m.topk_group,
    };
    let router = cx.f.push(route, format!("{p}.router"), &[logits, bias])?;
    let (weights, experts) = (
        Value {
            node: router,
            output: 0,
        },
        Value {
            node: router,
            output: 1,
        },
    );

    let mut stacked = |proj: &str, shape: Vec<u64>| {
        let pattern = format!("{p}.experts.{{e}}.{proj}.weight");
        let recipe = Recipe::Stack {
            pattern,
            count: e,
            shape,
        };
        cx.f.push_weight(format!("{p}.experts.{proj}.weight"), recipe, c.dtype)
    };
    let gate = stacked("gate_proj", vec![inter, d])?;
    let up = stacked("up_proj", vec![inter, d])?;
    let down = stacked("down_proj", vec![d, inter])?;
    let routed = cx.op(
        Op::MoeExperts {},
        format!("{p}.experts"),
        &[x, weights, experts, gate, up, down],
    )?;
    if m.n_shared_experts == 0 {
        return Ok(routed);
    }
    let shared = swiglu(
        cx,
        &format!("{p}.shared_experts"),
        x,
        inter * m.n_shared_experts,
    )?;
    cx.op(Op::Add {}, p, &[routed, shared])
}
