//! The verifier rejects hand-broken graphs, and says which node and op are at fault.

mod common;

use common::*;
use glmc_ir::{
    verify_module, DType, Dim, Function, Module, NodeIndex, Op, Operand, Recipe, TensorType, Value,
    VerifyError,
};
use petgraph::visit::EdgeRef;
use petgraph::Direction;

/// Breaks the one-layer little module and returns the verifier's error.
fn broken(edit: impl FnOnce(&mut Module)) -> VerifyError {
    let mut m = little_module(1);
    verify_module(&m).expect("the unbroken module verifies");
    edit(&mut m);
    verify_module(&m).expect_err("the broken module must not verify")
}

fn f_mut<'a>(m: &'a mut Module, name: &str) -> &'a mut Function {
    m.function_mut(name).unwrap()
}

/// The error is about node `name` running `op`, in function `func`, and says `what`.
#[track_caller]
fn assert_node_error(e: &VerifyError, func: &str, name: &str, op: &str, what: &[&str]) {
    let text = e.to_string();
    match e {
        VerifyError::Node {
            function,
            node,
            op: o,
            ..
        } => {
            assert_eq!(function, func, "{text}");
            assert_eq!(node, name, "{text}");
            assert_eq!(o, op, "{text}");
        }
        VerifyError::Graph { .. } => panic!("expected an error about node {name:?}: {text}"),
    }
    assert!(text.starts_with(&format!("@{func}: ")), "{text}");
    assert!(text.contains(&format!("node \"{name}\"")), "{text}");
    assert!(text.contains(&format!("({op} of ")), "{text}");
    for w in what {
        assert!(text.contains(w), "{text:?} should contain {w:?}");
    }
}

fn incoming(f: &Function, n: NodeIndex, slot: u32) -> petgraph::stable_graph::EdgeIndex {
    f.graph
        .edges_directed(n, Direction::Incoming)
        .find(|e| e.weight().index == slot)
        .map(|e| e.id())
        .unwrap()
}

const O_PROJ: &str = "model.layers.0.self_attn.o_proj";
const ATTEND: &str = "model.layers.0.self_attn.attend";

#[test]
fn matmul_inner_dims_differ() {
    let e = broken(|m| {
        let f = f_mut(m, "prefill");
        let w = node(f, "model.layers.0.self_attn.o_proj.weight");
        let node = &mut f.graph[w];
        node.op = Op::Weight {
            recipe: Recipe::tensor("model.layers.0.self_attn.o_proj.weight", vec![16, 6]),
        };
        node.outputs = vec![t(DType::BF16, glmc_ir::shape![16, 6])];
    });
    assert_node_error(
        &e,
        "prefill",
        O_PROJ,
        "matmul",
        &[
            "bf16[s,8], bf16[16,6]",
            "inner dims of x and w differ: 8 vs 6",
        ],
    );
}

#[test]
fn matmul_dtypes_differ() {
    let e = broken(|m| {
        let f = f_mut(m, "decode");
        let w = node(f, "model.layers.0.self_attn.q_proj.weight");
        f.graph[w].outputs[0].dtype = DType::F16;
    });
    assert_node_error(
        &e,
        "decode",
        "model.layers.0.self_attn.q_proj",
        "matmul",
        &["bf16[b,16], f16[16,16]", "dtypes differ: bf16 vs f16"],
    );
}

#[test]
fn router_must_be_f32() {
    let e = broken(|m| {
        let f = f_mut(m, "prefill");
        // Drop the cast: the router matmul now sees bf16 x and an f32 weight... so make the
        // weight bf16 too; the route then receives bf16 logits.
        let cast = node(f, "model.layers.0.mlp.gate.cast");
        f.graph[cast].op = Op::Cast { dtype: DType::BF16 };
        f.graph[cast].outputs[0].dtype = DType::BF16;
        let w = node(f, "model.layers.0.mlp.gate.weight");
        f.graph[w].outputs[0].dtype = DType::BF16;
        let g = node(f, "model.layers.0.mlp.gate");
        f.graph[g].outputs[0].dtype = DType::BF16;
    });
    assert_node_error(
        &e,
        "prefill",
        "model.layers.0.mlp.route",
        "moe.route",
        &["bf16[s,4], f32[4]", "must be f32"],
    );
}

#[test]
fn embed_ids_must_be_integers() {
    let e = broken(|m| {
        let f = f_mut(m, "prefill");
        let ids = f.inputs()[0];
        f.graph[ids].outputs[0].dtype = DType::F32;
    });
    assert_node_error(
        &e,
        "prefill",
        "model.embed_tokens",
        "embed",
        &["ids must be an integer tensor, is f32[s]"],
    );
}

#[test]
fn sparse_attention_without_topk() {
    let e = broken(|m| {
        let f = f_mut(m, "decode");
        let a = node(f, ATTEND);
        let edge = incoming(f, a, 6);
        f.graph.remove_edge(edge);
    });
    assert_node_error(
        &e,
        "decode",
        ATTEND,
        "mla.attend",
        &["takes 7 operands, has 6"],
    );
    // Dense attention takes 6: the same graph with `sparse` off verifies the arity.
    let mut m = little_module(1);
    let f = f_mut(&mut m, "decode");
    let a = node(f, ATTEND);
    let edge = incoming(f, a, 6);
    f.graph.remove_edge(edge);
    let Op::MlaAttend {
        dense_until: 0,
        scale,
        ..
    } = f.graph[a].op
    else {
        unreachable!()
    };
    f.graph[a].op = Op::MlaAttend {
        dense_until: 0,
        scale,
        sparse: false,
    };
    verify_module(&m).unwrap();
}

#[test]
fn push_reports_arity_with_node_and_op() {
    let m = little_module(1);
    let mut f = m.function("prefill").unwrap().clone();
    let pos: Value = f.inputs()[1].into();
    let q = node(&f, "model.layers.0.self_attn.q_nope").into();
    let e = f
        .push(
            Op::MlaAttend {
                dense_until: 0,
                scale: 1.0,
                sparse: true,
            },
            "extra.attend",
            &[q, q, q, q, q, pos],
        )
        .unwrap_err();
    assert_node_error(
        &e,
        "prefill",
        "extra.attend",
        "mla.attend",
        &["takes 7 operands, has 6"],
    );
    // Nothing was added on error.
    assert!(f.find("extra.attend").is_none());
}

#[test]
fn declared_output_disagrees_with_inference() {
    let e = broken(|m| {
        let f = f_mut(m, "prefill");
        let n = node(f, "model.layers.0.input_layernorm");
        f.graph[n].outputs = vec![t(DType::BF16, glmc_ir::shape!["s", 17])];
    });
    assert_node_error(
        &e,
        "prefill",
        "model.layers.0.input_layernorm",
        "rmsnorm",
        &["declared output bf16[s,17] but the operands give bf16[s,16]"],
    );
    // A wrong number of declared outputs is caught the same way.
    let e = broken(|m| {
        let f = f_mut(m, "prefill");
        let n = node(f, "model.layers.0.mlp.route");
        f.graph[n].outputs.pop();
    });
    assert_node_error(
        &e,
        "prefill",
        "model.layers.0.mlp.route",
        "moe.route",
        &["declared output f32[s,2] but the operands give f32[s,2], i64[s,2]"],
    );
}

#[test]
fn cycle_names_a_node_on_it() {
    let mut m = little_module(1);
    let f = f_mut(&mut m, "prefill");
    // o_proj -> (input_layernorm -> ... -> attend -> attn_flat) -> o_proj
    let o = node(f, O_PROJ);
    let norm = node(f, "model.layers.0.input_layernorm");
    f.graph.add_edge(
        o,
        norm,
        Operand {
            index: 2,
            output: 0,
        },
    );
    let e = verify_module(&m).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("cycle"), "{text}");
    let VerifyError::Node { node: name, op, .. } = &e else {
        panic!("a cycle error should name a node on the cycle: {text}");
    };
    let f = m.function("prefill").unwrap();
    let n = f.find(name).unwrap();
    assert_eq!(f.node(n).op.name(), op);
    assert!(
        text.contains(&format!("node \"{name}\" ({op} of ")),
        "{text}"
    );
    // The named node really is on the cycle: it reaches itself.
    let mut space = petgraph::algo::DfsSpace::new(&f.graph);
    let on_cycle = f
        .graph
        .neighbors_directed(n, Direction::Outgoing)
        .any(|s| petgraph::algo::has_path_connecting(&f.graph, s, n, Some(&mut space)));
    assert!(on_cycle, "{name} is not on the cycle");
}

#[test]
fn self_loop_is_a_cycle() {
    let mut m = little_module(0);
    let f = f_mut(&mut m, "prefill");
    let n = node(f, "model.norm");
    f.graph.add_edge(
        n,
        n,
        Operand {
            index: 2,
            output: 0,
        },
    );
    let e = verify_module(&m).unwrap_err();
    assert_node_error(
        &e,
        "prefill",
        "model.norm",
        "rmsnorm",
        &["(rmsnorm of bf16[s,16], bf16[16], bf16[s,16]): the node is on a cycle"],
    );
}

#[test]
fn duplicate_node_names() {
    let e = broken(|m| {
        let f = f_mut(m, "prefill");
        let n = node(f, "model.layers.0.self_attn.k_rope");
        f.graph[n].name = "model.layers.0.self_attn.q_rope".into();
    });
    let text = e.to_string();
    assert!(
        text.contains("two nodes are named \"model.layers.0.self_attn.q_rope\""),
        "{text}"
    );
    assert_node_error(
        &e,
        "prefill",
        "model.layers.0.self_attn.q_rope",
        "rope",
        &["names must be unique"],
    );
}

#[test]
fn undeclared_cache_state() {
    let e = broken(|m| {
        m.states.remove(&k_pe_state(0));
    });
    assert_node_error(
        &e,
        "prefill",
        "model.layers.0.self_attn.k_pe_cache",
        "cache.update",
        &["cache state \"model.layers.0.self_attn.cache.k_pe\" is not declared"],
    );
}

#[test]
fn cache_rows_disagree_with_state() {
    let e = broken(|m| {
        m.states
            .insert(c_kv_state(0), t(DType::BF16, glmc_ir::shape![9]));
    });
    assert_node_error(
        &e,
        "prefill",
        "model.layers.0.self_attn.c_kv_cache",
        "cache.update",
        &["holds rows of bf16[9], the update writes rows of bf16[8]"],
    );
    let e = broken(|m| {
        m.states
            .insert(c_kv_state(0), t(DType::F32, glmc_ir::shape![8]));
    });
    assert_node_error(
        &e,
        "prefill",
        "model.layers.0.self_attn.c_kv_cache",
        "cache.update",
        &["holds rows of f32[8]"],
    );
}

#[test]
fn weight_recipe_disagrees_with_declared_type() {
    let name = "model.layers.0.mlp.experts.down_proj";
    let e = broken(|m| {
        let f = f_mut(m, "prefill");
        let n = node(f, name);
        // The stack gives [4, 16, 8]; declare it transposed.
        f.graph[n].outputs = vec![t(DType::BF16, glmc_ir::shape![4, 8, 16])];
    });
    assert_node_error(
        &e,
        "prefill",
        name,
        "weight",
        &["the recipe gives bf16[4,16,8], the node declares bf16[4,8,16]"],
    );
    // A recipe that has no shape at all.
    let e = broken(|m| {
        let f = f_mut(m, "prefill");
        let n = node(f, name);
        f.graph[n].op = Op::Weight {
            recipe: Recipe::Stack {
                pattern: "model.layers.0.mlp.experts.down_proj".into(),
                count: 4,
                shape: vec![16, 8],
            },
        };
    });
    assert_node_error(
        &e,
        "prefill",
        name,
        "weight",
        &["recipe", "no `{e}` placeholder"],
    );
}

#[test]
fn gap_in_input_indices() {
    let e = broken(|m| {
        let f = f_mut(m, "prefill");
        let p = f.inputs()[1];
        f.graph[p].op = Op::Input { index: 2 };
    });
    assert_node_error(
        &e,
        "prefill",
        "positions",
        "input",
        &["argument index 2", "numbered 0..2 without gaps"],
    );
    // Two arguments with one index.
    let e = broken(|m| {
        let f = f_mut(m, "prefill");
        let p = f.inputs()[1];
        f.graph[p].op = Op::Input { index: 0 };
    });
    assert!(e.to_string().contains("without gaps"), "{e}");
}

#[test]
fn dangling_operand_slot() {
    let e = broken(|m| {
        let f = f_mut(m, "prefill");
        let a = node(f, ATTEND);
        let edge = incoming(f, a, 2);
        f.graph.remove_edge(edge);
    });
    assert_node_error(
        &e,
        "prefill",
        ATTEND,
        "mla.attend",
        &["operand slots [0, 1, 3, 4, 5, 6] are not 0..6"],
    );
    // A doubled slot.
    let e = broken(|m| {
        let f = f_mut(m, "prefill");
        let a = node(f, "model.layers.0.attn_residual");
        let src = f.inputs()[0];
        f.graph.add_edge(
            src,
            a,
            Operand {
                index: 1,
                output: 0,
            },
        );
    });
    assert_node_error(
        &e,
        "prefill",
        "model.layers.0.attn_residual",
        "add",
        &["operand slots [0, 1, 1] are not 0..3"],
    );
}

#[test]
fn operand_reads_missing_output() {
    let e = broken(|m| {
        let f = f_mut(m, "prefill");
        let n = node(f, "model.layers.0.mlp.experts");
        let edge = incoming(f, n, 2);
        f.graph[edge].output = 2;
    });
    assert_node_error(
        &e,
        "prefill",
        "model.layers.0.mlp.experts",
        "moe.experts",
        &["reads an output its producer does not have"],
    );
}

#[test]
fn result_reads_missing_value() {
    let e = broken(|m| {
        let f = f_mut(m, "prefill");
        let v = f.results[0].1;
        f.results.push((
            "bogus".into(),
            Value {
                node: v.node,
                output: 1,
            },
        ));
    });
    assert!(
        e.to_string()
            .contains("result \"bogus\" reads a value that does not exist"),
        "{e}"
    );
}

#[test]
fn two_functions_with_one_name() {
    let e = broken(|m| {
        m.functions[1].name = "prefill".into();
    });
    assert!(e.to_string().contains("a second function"), "{e}");
}

#[test]
fn input_with_two_outputs() {
    let e = broken(|m| {
        let f = f_mut(m, "prefill");
        let p = f.inputs()[1];
        let ty = f.graph[p].outputs[0].clone();
        f.graph[p].outputs.push(ty);
    });
    assert_node_error(
        &e,
        "prefill",
        "positions",
        "input",
        &["has 2 outputs, must have one"],
    );
}

#[test]
fn rebuilding_after_break_and_fix_verifies() {
    // The breakages above are not sticky: undoing one verifies again (guards against a
    // verifier that rejects everything).
    let mut m = little_module(1);
    let f = f_mut(&mut m, "prefill");
    let n = node(f, "model.layers.0.input_layernorm");
    let good = f.graph[n].outputs.clone();
    f.graph[n].outputs = vec![TensorType::new(DType::BF16, vec![Dim::sym("s"), 17.into()])];
    assert!(verify_module(&m).is_err());
    let f = f_mut(&mut m, "prefill");
    f.graph[n].outputs = good;
    verify_module(&m).unwrap();
}

/// A sampler with a mis-shaped operand: the error names the function, the node, the op and
/// every operand's type.
#[test]
fn sampler_errors_name_the_node_and_shapes() {
    use glmc_ir::{DType, Dim, Function, Op, TensorType};
    let mut f = Function::new("decode");
    let ty = |dtype, dims: Vec<Dim>| TensorType::new(dtype, dims);
    let logits = f.push_input(
        0,
        "logits",
        ty(DType::F32, vec![Dim::sym("b"), Dim::Const(8)]),
    );
    let t = f.push_input(1, "temperature", ty(DType::F32, vec![Dim::sym("b")]));
    let p = f.push_input(2, "top_p", ty(DType::F32, vec![Dim::Const(1)]));
    let u = f.push_input(3, "uniform", ty(DType::F32, vec![Dim::sym("b")]));
    let e = f
        .push(Op::SampleTopP {}, "next_token", &[logits, t, p, u])
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "@decode: node \"next_token\" (sample.top_p of f32[b,8], f32[b], f32[1], f32[b]): \
         top_p and logits rows differ: 1 vs b"
    );
}
