//! The edits passes make through `Function`: `take_over` and `replace_op` keep a node's name
//! and move its readers, results included.

use glmc_ir::{shape, DType, Function, Module, Op, TensorType, Value};

fn chain() -> (Module, Value, Value, Value) {
    let mut f = Function::new("prefill");
    let x = f.push_input(0, "x", TensorType::new(DType::F32, shape!["s", 4]));
    let y = f.push(Op::Silu {}, "act", &[x]).unwrap().into();
    let z = f
        .push(Op::Scale { factor: 2.0 }, "scaled", &[y])
        .unwrap()
        .into();
    f.results.push(("out".into(), y));
    let mut m = Module::new("m");
    m.functions.push(f);
    (m, x, y, z)
}

#[test]
fn replace_op_keeps_the_name_and_the_readers() {
    let (mut m, x, y, z) = chain();
    let f = &mut m.functions[0];
    let new = f.replace_op(y.node, Op::Relu {}, &[x]);
    assert_eq!(f.node(new).name, "act");
    assert_eq!(f.node(new).op, Op::Relu {});
    assert_eq!(f.operands(z.node), vec![Value::from(new)]);
    assert_eq!(f.results[0].1, Value::from(new));
    assert!(!f.graph.contains_node(y.node));
    glmc_ir::verify_module(&m).unwrap();
}

#[test]
fn take_over_moves_every_output() {
    let mut f = Function::new("prefill");
    let logits = f.push_input(0, "logits", TensorType::new(DType::F32, shape!["s", 8]));
    let bias = f.push_input(1, "bias", TensorType::new(DType::F32, shape![8]));
    let route = Op::MoeRoute {
        n_group: 1,
        norm_topk_prob: true,
        routed_scaling_factor: 1.0,
        top_k: 2,
        topk_group: 1,
    };
    let old = f.push(route.clone(), "router", &[logits, bias]).unwrap();
    let w = f
        .push(
            Op::Scale { factor: 1.0 },
            "w",
            &[Value {
                node: old,
                output: 0,
            }],
        )
        .unwrap();
    f.results.push((
        "experts".into(),
        Value {
            node: old,
            output: 1,
        },
    ));
    let new = f.push(route, "router#new", &[logits, bias]).unwrap();
    f.take_over(old, new);
    assert_eq!(f.node(new).name, "router");
    assert_eq!(
        f.operands(w),
        vec![Value {
            node: new,
            output: 0
        }]
    );
    assert_eq!(
        f.results[0].1,
        Value {
            node: new,
            output: 1
        }
    );
}
