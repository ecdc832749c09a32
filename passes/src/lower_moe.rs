//! `lower-moe`: each `moe.experts` becomes the ops its kernels run, so the schedule, the memory
//! plan and the dumps see every step and every intermediate:
//!
//! ```text
//! offsets, order, position = moe.sort experts            // counting sort of the n·k pairs
//! h    = moe.gate_up x, order, offsets, gate, up         // grouped GEMM, SiLU·mul fused: [n,k,I]
//! rows = moe.down h, offsets, down                       // grouped GEMM: [n,k,D]
//! y    = moe.combine rows, position, weights (, shared)  // weighted sum per token (+ shared)
//! ```
//!
//! The routed rows are the n·k (token, slot) pairs grouped by expert, so every intermediate has
//! a static shape (`[n,k,..]`) and the arena planner places it; only the split of the rows among
//! the experts depends on the data, and it travels as `offsets`.
//!
//! The shared experts stay the dense SwiGLU the builder wrote (their GEMMs, fused and tuned
//! like every dense projection, and split by tensor parallelism along their own intermediate
//! size); `moe.combine` adds their output when the only reader of the experts' sum is that
//! `add`, which saves the add's pass over `[n,D]`. Running them as one more expert in the
//! grouped GEMMs would need a stacked `[E+1,..]` copy of every routed weight at load time
//! (the shared intermediate size is `n_shared_experts` × the routed one, so the shapes differ
//! unless it is 1), and would put every token's row into one expert, which at prefill is the
//! largest group and gains nothing over a dense GEMM.

use glmc_ir::{Function, Module, NodeIndex, Op, Value};

use crate::pass::{Pass, PassError};

const NAME: &str = "lower-moe";

pub struct LowerMoe;

impl Pass for LowerMoe {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, module: &mut Module) -> Result<bool, PassError> {
        let mut changed = false;
        for f in &mut module.functions {
            let experts: Vec<NodeIndex> = f
                .graph
                .node_indices()
                .filter(|&n| f.node(n).op == Op::MoeExperts {})
                .collect();
            for n in experts {
                lower(f, n)?;
                changed = true;
            }
        }
        Ok(changed)
    }
}

/// The `add` that is the one reader of `v`, with `v`'s type on both sides, and its other
/// operand: the shared experts' output, for `moe.combine` to add.
fn sole_add(f: &Function, v: Value) -> Option<(NodeIndex, Value)> {
    if f.results.iter().any(|(_, r)| *r == v) {
        return None;
    }
    let [(add, _)] = f.users(v)[..] else {
        return None;
    };
    if f.node(add).op != (Op::Add {}) {
        return None;
    }
    let operands = f.operands(add);
    let other = if operands[0] == v {
        operands[1]
    } else {
        operands[0]
    };
    (other != v && f.value_type(other) == f.value_type(v)).then_some((add, other))
}

fn lower(f: &mut Function, n: NodeIndex) -> Result<(), PassError> {
    let node = f.node(n).clone();
    let function = f.name.clone();
    let fail = |message: String| PassError::Rewrite {
        pass: NAME,
        function: function.clone(),
        node: node.name.clone(),
        message,
    };
    let [x, weights, ids, gate, up, down] = f.operands(n)[..] else {
        return Err(fail("moe.experts needs six operands".into()));
    };
    let experts = f.value_type(gate).shape[0].as_const().ok_or_else(|| {
        fail(format!(
            "the expert count of {} is symbolic",
            f.value_type(gate)
        ))
    })?;
    let p = &node.name;
    let push = |f: &mut Function, op: Op, name: String, operands: &[Value]| {
        f.push(op, name, operands).map_err(|e| fail(e.to_string()))
    };
    let sort = push(f, Op::MoeSort { experts }, format!("{p}.sort"), &[ids])?;
    let out = |output| Value { node: sort, output };
    let (offsets, order, position) = (out(0), out(1), out(2));
    let h = push(
        f,
        Op::MoeGateUp {},
        format!("{p}.gate_up"),
        &[x, order, offsets, gate, up],
    )?;
    let rows = push(
        f,
        Op::MoeDown {},
        format!("{p}.down"),
        &[h.into(), offsets, down],
    )?;
    let routed = Value::from(n);
    let (replaced, operands, shared) = match sole_add(f, routed) {
        Some((add, other)) => (add, vec![rows.into(), position, weights, other], true),
        None => (n, vec![rows.into(), position, weights], false),
    };
    let combine = push(
        f,
        Op::MoeCombine { shared },
        format!("{}#combine", f.node(replaced).name),
        &operands,
    )?;
    if f.node(combine).outputs != f.node(replaced).outputs {
        return Err(fail(format!(
            "moe.combine gives {:?}, the node it replaces {:?}",
            f.node(combine).outputs,
            f.node(replaced).outputs
        )));
    }
    f.take_over(replaced, combine);
    if replaced != n {
        f.graph.remove_node(n);
    }
    Ok(())
}
