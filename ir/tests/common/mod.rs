//! Shared test helpers: a small but realistic GLM-5-shaped module built through the public
//! `Function::push` / `push_input` / `push_weight` API.
//!
//! Sizes (tiny, so dumps stay readable): hidden 16, vocab 32, 2 heads with nope 4 / rope 4 /
//! value 4, kv latent 8, indexer 2 heads × 4 dims keeping 2 keys, 4 routed experts in 2 groups
//! (top 2), expert intermediate 8.

#![allow(dead_code)]

use glmc_ir::{DType, Dim, Function, Module, NodeIndex, Op, Recipe, TensorType, Value};

pub const HIDDEN: u64 = 16;
pub const VOCAB: u64 = 32;
pub const HEADS: u64 = 2;
pub const NOPE: u64 = 4;
pub const ROPE: u64 = 4;
pub const VDIM: u64 = 4;
pub const LATENT: u64 = 8;
pub const IDX_HEADS: u64 = 2;
pub const IDX_DIM: u64 = 4;
pub const IDX_TOPK: u64 = 2;
pub const EXPERTS: u64 = 4;
pub const INTER: u64 = 8;

pub fn c_kv_state(i: usize) -> String {
    format!("model.layers.{i}.self_attn.cache.c_kv")
}

pub fn k_pe_state(i: usize) -> String {
    format!("model.layers.{i}.self_attn.cache.k_pe")
}

pub fn idx_k_state(i: usize) -> String {
    format!("model.layers.{i}.self_attn.indexer.cache.k")
}

/// Builds one function; the helpers panic with the verifier's message on a type error, so a
/// mistake in the builder shows up as a readable failure.
pub struct Builder {
    pub f: Function,
    /// The query-row symbol: `s` in prefill, `b` in decode.
    pub rows: Dim,
    pub batched: bool,
}

impl Builder {
    pub fn new(name: &str, rows: &str, batched: bool) -> Builder {
        Builder {
            f: Function::new(name),
            rows: Dim::sym(rows),
            batched,
        }
    }

    pub fn op(&mut self, op: Op, name: impl Into<String>, operands: &[Value]) -> Value {
        let name = name.into();
        match self.f.push(op, name.clone(), operands) {
            Ok(n) => n.into(),
            Err(e) => panic!("building {name}: {e}"),
        }
    }

    pub fn weight(&mut self, name: &str, shape: Vec<u64>) -> Value {
        self.weight_dt(name, shape, DType::BF16)
    }

    pub fn weight_dt(&mut self, name: &str, shape: Vec<u64>, dtype: DType) -> Value {
        self.f
            .push_weight(name, Recipe::tensor(name, shape), dtype)
            .unwrap()
    }

    pub fn stack(&mut self, name: &str, pattern: &str, shape: Vec<u64>) -> Value {
        let recipe = Recipe::Stack {
            pattern: pattern.to_string(),
            count: EXPERTS,
            shape,
        };
        self.f.push_weight(name, recipe, DType::BF16).unwrap()
    }

    pub fn matmul(&mut self, x: Value, module: &str, out: u64, inp: u64) -> Value {
        let w = self.weight(&format!("{module}.weight"), vec![out, inp]);
        self.op(Op::Matmul {}, module, &[x, w])
    }

    pub fn rmsnorm(&mut self, x: Value, module: &str, dim: u64) -> Value {
        let w = self.weight(&format!("{module}.weight"), vec![dim]);
        self.op(Op::RmsNorm { eps: 1e-5 }, module, &[x, w])
    }

    pub fn slice(&mut self, x: Value, name: &str, axis: u64, start: u64, end: u64) -> Value {
        self.op(Op::Slice { axis, start, end }, name, &[x])
    }

    pub fn reshape(&mut self, x: Value, name: &str, shape: Vec<Dim>) -> Value {
        self.op(Op::Reshape { shape }, name, &[x])
    }

    pub fn rope(&mut self, x: Value, name: &str, pos: Value, interleaved: bool) -> Value {
        let op = Op::Rope {
            interleaved,
            theta: 10000.0,
        };
        self.op(op, name, &[x, pos])
    }

    pub fn cache(&mut self, x: Value, name: &str, pos: Value, state: String) -> Value {
        let op = Op::CacheUpdate {
            batched: self.batched,
            state,
        };
        self.op(op, name, &[x, pos])
    }

    /// `[.., rows]` prefix of a cache read: `[t]` or `[b, t]`.
    pub fn ctx(&self) -> Vec<Dim> {
        if self.batched {
            vec![self.rows.clone(), Dim::sym("t")]
        } else {
            vec![Dim::sym("t")]
        }
    }

    pub fn r(&self) -> Dim {
        self.rows.clone()
    }

    /// One decoder layer: sparse MLA attention with the DSA indexer, then a MoE block with a
    /// shared expert. Returns the layer's output hidden state.
    pub fn layer(&mut self, i: usize, h: Value, pos: Value) -> Value {
        let p = format!("model.layers.{i}");
        let a = format!("{p}.self_attn");
        let r = self.r();

        let x = self.rmsnorm(h, &format!("{p}.input_layernorm"), HIDDEN);

        // Queries: [r, H, nope + rope], split, rope on the rope part.
        let q = self.matmul(x, &format!("{a}.q_proj"), HEADS * (NOPE + ROPE), HIDDEN);
        let q = self.reshape(
            q,
            &format!("{a}.q_heads"),
            vec![r.clone(), Dim::Const(HEADS), Dim::Const(NOPE + ROPE)],
        );
        let q_nope = self.slice(q, &format!("{a}.q_nope"), 2, 0, NOPE);
        let q_pe = self.slice(q, &format!("{a}.q_pe"), 2, NOPE, NOPE + ROPE);
        let q_pe = self.rope(q_pe, &format!("{a}.q_rope"), pos, true);

        // Latent kv and the shared rope key, written to the caches.
        let kv = self.matmul(x, &format!("{a}.kv_a_proj_with_mqa"), LATENT + ROPE, HIDDEN);
        let c_kv = self.slice(kv, &format!("{a}.c_kv"), 1, 0, LATENT);
        let k_pe = self.slice(kv, &format!("{a}.k_pe"), 1, LATENT, LATENT + ROPE);
        let k_pe = self.rope(k_pe, &format!("{a}.k_rope"), pos, true);
        let c_kv_cache = self.cache(c_kv, &format!("{a}.c_kv_cache"), pos, c_kv_state(i));
        let k_pe_cache = self.cache(k_pe, &format!("{a}.k_pe_cache"), pos, k_pe_state(i));

        // Expanded keys and values from the cached latent.
        let kvb = self.matmul(
            c_kv_cache,
            &format!("{a}.kv_b_proj"),
            HEADS * (NOPE + VDIM),
            LATENT,
        );
        let mut kv_shape = self.ctx();
        kv_shape.extend([Dim::Const(HEADS), Dim::Const(NOPE + VDIM)]);
        let kvb = self.reshape(kvb, &format!("{a}.kv_heads"), kv_shape);
        let axis = self.ctx().len() as u64 + 1;
        let k_nope = self.slice(kvb, &format!("{a}.k_nope"), axis, 0, NOPE);
        let v = self.slice(kvb, &format!("{a}.v"), axis, NOPE, NOPE + VDIM);

        // DSA indexer: scores over the cached indexer keys, top-k selection.
        let ix = format!("{a}.indexer");
        let iq = self.matmul(x, &format!("{ix}.wq_b"), IDX_HEADS * IDX_DIM, HIDDEN);
        let iq = self.reshape(
            iq,
            &format!("{ix}.q_heads"),
            vec![r.clone(), Dim::Const(IDX_HEADS), Dim::Const(IDX_DIM)],
        );
        let iq_pe = self.slice(iq, &format!("{ix}.q_pe"), 2, 0, IDX_DIM / 2);
        let iq_nope = self.slice(iq, &format!("{ix}.q_nope"), 2, IDX_DIM / 2, IDX_DIM);
        let iq_pe = self.rope(iq_pe, &format!("{ix}.q_rope"), pos, false);
        let iq = self.op(Op::Concat { axis: 2 }, format!("{ix}.q"), &[iq_pe, iq_nope]);
        let ik = self.matmul(x, &format!("{ix}.wk"), IDX_DIM, HIDDEN);
        let kn_w = self.weight(&format!("{ix}.k_norm.weight"), vec![IDX_DIM]);
        let kn_b = self.weight(&format!("{ix}.k_norm.bias"), vec![IDX_DIM]);
        let ik = self.op(
            Op::LayerNorm { eps: 1e-6 },
            format!("{ix}.k_norm"),
            &[ik, kn_w, kn_b],
        );
        let ik_cache = self.cache(ik, &format!("{ix}.k_cache"), pos, idx_k_state(i));
        let hw = self.matmul(x, &format!("{ix}.weights_proj"), IDX_HEADS, HIDDEN);
        let hw = self.op(
            Op::Scale { factor: 0.5 },
            format!("{ix}.head_weights"),
            &[hw],
        );
        let scores = self.op(
            Op::DsaScore { weight_scale: 1.0 },
            format!("{ix}.scores"),
            &[iq, hw, ik_cache, pos],
        );
        let topk = self.op(
            Op::DsaTopk { k: IDX_TOPK },
            format!("{ix}.topk"),
            &[scores, pos],
        );

        let attn = self.op(
            Op::MlaAttend {
                dense_until: 0,
                scale: 1.0 / ((NOPE + ROPE) as f64).sqrt(),
                sparse: true,
            },
            format!("{a}.attend"),
            &[q_nope, q_pe, k_nope, k_pe_cache, v, pos, topk],
        );
        let attn = self.reshape(
            attn,
            &format!("{a}.attn_flat"),
            vec![r.clone(), Dim::Const(HEADS * VDIM)],
        );
        let attn = self.matmul(attn, &format!("{a}.o_proj"), HIDDEN, HEADS * VDIM);
        let h = self.op(Op::Add {}, format!("{p}.attn_residual"), &[h, attn]);

        // MoE: f32 sigmoid router, routed experts, one shared expert.
        let m = format!("{p}.mlp");
        let x = self.rmsnorm(h, &format!("{p}.post_attention_layernorm"), HIDDEN);
        let xf = self.op(
            Op::Cast { dtype: DType::F32 },
            format!("{m}.gate.cast"),
            &[x],
        );
        let gw = self.weight_dt(
            &format!("{m}.gate.weight"),
            vec![EXPERTS, HIDDEN],
            DType::F32,
        );
        let logits = self.op(Op::Matmul {}, format!("{m}.gate"), &[xf, gw]);
        let bias = self.weight_dt(
            &format!("{m}.gate.e_score_correction_bias"),
            vec![EXPERTS],
            DType::F32,
        );
        let route = self.op(
            Op::MoeRoute {
                n_group: 2,
                norm_topk_prob: true,
                routed_scaling_factor: 2.5,
                top_k: 2,
                topk_group: 1,
            },
            format!("{m}.route"),
            &[logits, bias],
        );
        let weights = route;
        let experts = Value {
            node: route.node,
            output: 1,
        };
        let gate = self.stack(
            &format!("{m}.experts.gate_proj"),
            &format!("{m}.experts.{{e}}.gate_proj.weight"),
            vec![INTER, HIDDEN],
        );
        let up = self.stack(
            &format!("{m}.experts.up_proj"),
            &format!("{m}.experts.{{e}}.up_proj.weight"),
            vec![INTER, HIDDEN],
        );
        let down = self.stack(
            &format!("{m}.experts.down_proj"),
            &format!("{m}.experts.{{e}}.down_proj.weight"),
            vec![HIDDEN, INTER],
        );
        let routed = self.op(
            Op::MoeExperts {},
            format!("{m}.experts"),
            &[x, weights, experts, gate, up, down],
        );
        let s = format!("{m}.shared_experts");
        let sg = self.matmul(x, &format!("{s}.gate_proj"), INTER, HIDDEN);
        let su = self.matmul(x, &format!("{s}.up_proj"), INTER, HIDDEN);
        let act = self.op(Op::Silu {}, format!("{s}.act"), &[sg]);
        let prod = self.op(Op::Mul {}, format!("{s}.act_mul_up"), &[act, su]);
        let shared = self.matmul(prod, &format!("{s}.down_proj"), HIDDEN, INTER);
        let mlp = self.op(Op::Add {}, m, &[routed, shared]);
        self.op(Op::Add {}, format!("{p}.mlp_residual"), &[h, mlp])
    }
}

/// `prefill(input_ids i64[s], positions i64[s]) -> logits [s, vocab]` or
/// `decode(input_ids i64[b], positions i64[b]) -> logits [b, vocab]` with batched caches.
pub fn build_function(name: &str, layers: usize) -> Function {
    let (rows, batched) = match name {
        "decode" => ("b", true),
        _ => ("s", false),
    };
    let mut b = Builder::new(name, rows, batched);
    let r = b.r();
    let ids =
        b.f.push_input(0, "input_ids", TensorType::new(DType::I64, vec![r.clone()]));
    let pos =
        b.f.push_input(1, "positions", TensorType::new(DType::I64, vec![r]));
    let table = b.weight("model.embed_tokens.weight", vec![VOCAB, HIDDEN]);
    let mut h = b.op(Op::Embed {}, "model.embed_tokens", &[table, ids]);
    for i in 0..layers {
        h = b.layer(i, h, pos);
    }
    let h = b.rmsnorm(h, "model.norm", HIDDEN);
    let logits = b.matmul(h, "lm_head", VOCAB, HIDDEN);
    b.f.results.push(("logits".into(), logits));
    b.f
}

pub fn declare_states(module: &mut Module, layers: usize) {
    let row = |n: u64| TensorType::new(DType::BF16, vec![Dim::Const(n)]);
    for i in 0..layers {
        module.states.insert(c_kv_state(i), row(LATENT));
        module.states.insert(k_pe_state(i), row(ROPE));
        module.states.insert(idx_k_state(i), row(IDX_DIM));
    }
}

/// The little module: states for every layer's caches, `prefill` and `decode`.
pub fn little_module(layers: usize) -> Module {
    let mut module = Module::new("glm5-tiny");
    declare_states(&mut module, layers);
    module.functions.push(build_function("prefill", layers));
    module.functions.push(build_function("decode", layers));
    module
}

/// A tiny function for the DOT view: embedding, norm, head and a router with two outputs.
pub fn tiny_function() -> Function {
    let mut b = Builder::new("tiny", "s", false);
    let ids = b.f.push_input(
        0,
        "input_ids",
        TensorType::new(DType::I64, vec![Dim::sym("s")]),
    );
    let table = b.weight("model.embed_tokens.weight", vec![VOCAB, HIDDEN]);
    let h = b.op(Op::Embed {}, "model.embed_tokens", &[table, ids]);
    let h = b.rmsnorm(h, "model.norm", HIDDEN);
    let hf = b.op(Op::Cast { dtype: DType::F32 }, "router.cast", &[h]);
    let gw = b.weight_dt("router.weight", vec![EXPERTS, HIDDEN], DType::F32);
    let logits = b.op(Op::Matmul {}, "router", &[hf, gw]);
    let bias = b.weight_dt("router.bias", vec![EXPERTS], DType::F32);
    let route = b.op(
        Op::MoeRoute {
            n_group: 1,
            norm_topk_prob: false,
            routed_scaling_factor: 1.0,
            top_k: 2,
            topk_group: 1,
        },
        "router.route",
        &[logits, bias],
    );
    b.f.results.push(("weights".into(), route));
    b.f.results.push((
        "experts".into(),
        Value {
            node: route.node,
            output: 1,
        },
    ));
    b.f
}

/// The node called `name`; panics if there is none.
pub fn node(f: &Function, name: &str) -> NodeIndex {
    f.find(name)
        .unwrap_or_else(|| panic!("no node named {name:?} in @{}", f.name))
}

pub fn t(dtype: DType, shape: Vec<Dim>) -> TensorType {
    TensorType::new(dtype, shape)
}
