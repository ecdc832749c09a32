//! Translation validation of the lowering: the lowered schedule's memory plan is executed on the
//! CPU and must give what the reference interpreter gives.
//!
//! Every node is computed by the interpreter's own implementation of its op, but its operands are
//! read from the places the schedule says they are (arena offsets and strides, views, folded
//! concat parts, cache states) and its outputs are written to the places the schedule gives them.
//! A value that a later buffer overwrote while still needed, a view with a wrong offset or
//! stride, a concat part written to the wrong place: each shows up as an operand that differs
//! from what its producer wrote, named at the reading node. The final results must then equal
//! the interpreter's own run exactly (same kernels, same f32 values between nodes).

mod common;

use std::collections::HashMap;

use common::module;
use glmc_codegen::expr::Bindings;
use glmc_codegen::layout::{Buf, TensorRef};
use glmc_codegen::schedule::{ArgValue, Phase, Step};
use glmc_codegen::{lower_module, Limits, Target};
use glmc_ir::{DType, Function, Module, Op, TensorType, Value};
use glmc_runtime::generate::{phase_inputs, prefill_inputs};
use glmc_runtime::{run_function, Interpreter, Sampling, SequenceCache, Tensor};
use half::bf16;

const LIMITS: Limits = Limits {
    max_prefill_tokens: 16,
    max_batch: 4,
    max_context: 32,
};

/// Simulated device memory.
struct Memory {
    arena: Vec<u8>,
    inputs: HashMap<u64, Vec<u8>>,
    weights: HashMap<String, Vec<u8>>,
    /// `[max_batch, max_context, row]` each.
    states: HashMap<String, Vec<u8>>,
    /// Elements of one token's row, by state.
    state_rows: HashMap<String, usize>,
    /// The sequence a prefill writes (its slot of every state).
    slot: usize,
}

fn elem_size(d: DType) -> usize {
    d.size_bytes() as usize
}

impl Memory {
    fn buffer(&mut self, at: &TensorRef, seq_base: usize) -> (&mut Vec<u8>, usize) {
        match &at.buf {
            Buf::Arena => (&mut self.arena, 0),
            Buf::Input(i) => (self.inputs.get_mut(i).unwrap(), 0),
            Buf::Weight(w) => (self.weights.get_mut(w).unwrap(), 0),
            Buf::State(s) => (self.states.get_mut(s).unwrap(), seq_base),
        }
    }

    fn seq_base(&self, at: &TensorRef, prefill: bool) -> usize {
        match &at.buf {
            Buf::State(s) if prefill => {
                self.slot * LIMITS.max_context as usize * self.state_rows[s] * elem_size(at.dtype)
            }
            _ => 0,
        }
    }

    fn read(&mut self, at: &TensorRef, b: &Bindings, prefill: bool) -> Tensor {
        let base = self.seq_base(at, prefill);
        let offs = at.element_offsets(b).unwrap();
        let (buf, _) = self.buffer(at, base);
        Tensor::from_device_bytes(at.dims(b).unwrap(), at.dtype, &buf[base..], &offs).unwrap()
    }

    fn write(&mut self, at: &TensorRef, b: &Bindings, t: &Tensor, prefill: bool) {
        let base = self.seq_base(at, prefill);
        let offs = at.element_offsets(b).unwrap();
        let size = elem_size(at.dtype);
        let bytes = t.to_bytes(at.dtype).unwrap();
        let (buf, _) = self.buffer(at, base);
        for (k, &o) in offs.iter().enumerate() {
            let o = base + o as usize;
            buf[o..o + size].copy_from_slice(&bytes[k * size..(k + 1) * size]);
        }
    }
}

/// Where each node's outputs are, from the schedule.
fn locations(phase: &Phase) -> HashMap<String, Vec<TensorRef>> {
    let mut at: HashMap<String, Vec<TensorRef>> = HashMap::new();
    for step in &phase.steps {
        match step {
            Step::Launch(l) if l.op != "copy" => {
                at.insert(l.node.clone(), l.outputs.clone());
            }
            Step::View { node, at: v, .. } => {
                at.insert(node.clone(), vec![v.clone()]);
            }
            Step::Missing { node, outputs, .. } => {
                at.insert(node.clone(), outputs.clone());
            }
            Step::Collective(c) => {
                at.insert(c.node.clone(), vec![c.output.clone()]);
            }
            Step::Launch(_) => {}
        }
    }
    at
}

fn same(a: &Tensor, b: &Tensor) -> bool {
    a.shape() == b.shape()
        && match (a.as_f32(), b.as_f32()) {
            (Ok(x), Ok(y)) => x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()),
            _ => a.as_i64().unwrap() == b.as_i64().unwrap(),
        }
}

/// One node computed by the interpreter from operand tensors.
fn eval(f: &Function, n: glmc_ir::NodeIndex, operands: &[Tensor]) -> Vec<Tensor> {
    let node = f.node(n);
    let mut mini = Function::new(f.name.clone());
    let ins: Vec<Value> = f
        .operands(n)
        .iter()
        .enumerate()
        .map(|(i, v)| mini.push_input(i as u64, format!("in{i}"), f.value_type(*v).clone()))
        .collect();
    mini.push_alone(node, &ins);
    run_function(
        &Module::new("node"),
        &mini,
        &HashMap::new(),
        &mut [],
        operands,
    )
    .unwrap_or_else(|e| panic!("@{}: {}: {e}", f.name, node.name))
}

/// Runs `f`'s schedule on the simulated memory, checking every operand it reads against what its
/// producer wrote; returns the results.
fn execute(
    f: &Function,
    phase: &Phase,
    mem: &mut Memory,
    inputs: &[Tensor],
    b: &Bindings,
) -> Vec<Tensor> {
    let prefill = f.name == "prefill";
    let at = locations(phase);
    for (i, (_, r)) in phase.inputs.iter().enumerate() {
        let Buf::Input(index) = r.buf else {
            unreachable!()
        };
        mem.inputs
            .insert(index, inputs[i].to_bytes(r.dtype).unwrap());
    }
    let mut values: HashMap<Value, Tensor> = HashMap::new();
    for n in f.canonical_order() {
        let node = f.node(n);
        let operands: Vec<Tensor> = f
            .operands(n)
            .iter()
            .map(|v| {
                let producer = f.node(v.node);
                let loc = match &producer.op {
                    Op::Input { index } => TensorRef::contiguous(
                        Buf::Input(*index),
                        Default::default(),
                        &producer.outputs[0],
                    ),
                    Op::Weight { .. } => TensorRef::contiguous(
                        Buf::Weight(producer.name.clone()),
                        Default::default(),
                        &producer.outputs[0],
                    ),
                    _ => at[&producer.name][v.output as usize].clone(),
                };
                let read = mem.read(&loc, b, prefill);
                if let (Buf::Arena, Some(wrote)) = (&loc.buf, values.get(v)) {
                    assert!(
                        same(&read, wrote),
                        "@{}: \"{}\" reads \"{}\" at {loc}, but the bytes there changed after it was written",
                        f.name,
                        node.name,
                        producer.name
                    );
                }
                read
            })
            .collect();
        match &node.op {
            Op::Input { .. } | Op::Weight { .. } => continue,
            Op::CacheUpdate { .. } | Op::CacheUpdateNorm { .. } => {
                // Rows land at their positions of their sequence's slot.
                let refs: Vec<&Tensor> = operands.iter().collect();
                let rows = glmc_runtime::cache_op_rows(&node.op, &refs).unwrap();
                let p = node.op.positions_operand().unwrap();
                let positions = operands[p].as_i64().unwrap();
                let batched = node.op.batched_cache();
                for (out, new) in at[&node.name].iter().zip(&rows) {
                    let width = new.numel() / positions.len();
                    let data = new.as_f32().unwrap();
                    let row_at = |seq: usize, p: i64| {
                        let mut r = out.clone();
                        let (seq_axis, pos_axis) = if batched { (Some(0), 1) } else { (None, 0) };
                        let elem = out.dtype.size_bytes() as i64;
                        let mut off = out.offset_bytes.eval(b).unwrap();
                        if let Some(a) = seq_axis {
                            off += seq as i64 * out.strides[a].eval(b).unwrap() * elem;
                        }
                        off += p * out.strides[pos_axis].eval(b).unwrap() * elem;
                        r.offset_bytes = glmc_codegen::expr::Poly::constant(off);
                        r.shape = vec![glmc_codegen::expr::Poly::constant(width as i64)];
                        r.strides = vec![glmc_codegen::expr::Poly::constant(1)];
                        r
                    };
                    for (i, &p) in positions.iter().enumerate() {
                        let row =
                            Tensor::f32(vec![width], data[i * width..(i + 1) * width].to_vec())
                                .unwrap();
                        mem.write(&row_at(i, p), b, &row, prefill);
                    }
                }
                continue;
            }
            _ => {}
        }
        // The parts of a concat that no kernel writes in place are copied there first.
        for step in &phase.steps {
            if let Step::Launch(l) = step {
                if l.op == "copy" && l.node == node.name {
                    let src = l
                        .args
                        .iter()
                        .find_map(|a| match &a.value {
                            ArgValue::Ptr(r) if a.name == "x" => Some(r.clone()),
                            _ => None,
                        })
                        .expect("a copy reads x");
                    let part = mem.read(&src, b, prefill);
                    mem.write(&l.outputs[0], b, &part, prefill);
                }
            }
        }
        let outs = eval(f, n, &operands);
        let is_view = phase
            .steps
            .iter()
            .any(|s| matches!(s, Step::View { node: v, .. } if *v == node.name));
        for (k, t) in outs.iter().enumerate() {
            let loc = &at[&node.name][k];
            let value = Value {
                node: n,
                output: k as u32,
            };
            if is_view {
                // No kernel wrote it: the layout must already hold the op's result.
                let read = mem.read(loc, b, prefill);
                let want = round_like(t, loc.dtype);
                assert!(
                    same(&read, &want),
                    "@{}: the view \"{}\" at {loc} does not hold the {}'s result",
                    f.name,
                    node.name,
                    node.op.name()
                );
                values.insert(value, read);
            } else {
                mem.write(loc, b, t, prefill);
                values.insert(value, mem.read(loc, b, prefill));
            }
        }
    }
    phase
        .results
        .iter()
        .map(|(_, r)| mem.read(r, b, prefill))
        .collect()
}

fn round_like(t: &Tensor, d: DType) -> Tensor {
    match (d, t.as_f32()) {
        (DType::BF16, Ok(v)) => Tensor::f32(
            t.shape().to_vec(),
            v.iter().map(|x| bf16::from_f32(*x).to_f32()).collect(),
        )
        .unwrap(),
        _ => t.clone(),
    }
}

/// Random weights for every weight node, as the interpreter and the memory both see them.
fn weights(module: &Module, seed: u64) -> HashMap<String, Tensor> {
    let mut state = seed;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let mut out = HashMap::new();
    for f in &module.functions {
        for n in f.canonical_order() {
            let node = f.node(n);
            if let Op::Weight { .. } = node.op {
                out.entry(node.name.clone()).or_insert_with(|| {
                    let ty: &TensorType = &node.outputs[0];
                    let shape: Vec<usize> = ty
                        .shape
                        .iter()
                        .map(|d| d.as_const().unwrap() as usize)
                        .collect();
                    let count: usize = shape.iter().product();
                    Tensor::f32(shape, (0..count).map(|_| next() * 0.5).collect()).unwrap()
                });
            }
        }
    }
    out
}

fn check_model(file: &str) {
    let (_, module) = module(file);
    let lowered = lower_module(&module, Target::Sm120, LIMITS).unwrap();
    let w = weights(&module, 0x5eed);
    let mut mem = Memory {
        arena: Vec::new(),
        inputs: HashMap::new(),
        weights: w
            .iter()
            .map(|(k, t)| {
                let dtype = module
                    .functions
                    .iter()
                    .find_map(|f| f.find(k).map(|n| f.node(n).outputs[0].dtype))
                    .unwrap();
                (k.clone(), t.to_bytes(dtype).unwrap())
            })
            .collect(),
        states: module
            .states
            .iter()
            .map(|(name, ty)| {
                let row: u64 = ty.shape.iter().map(|d| d.as_const().unwrap()).product();
                let bytes = LIMITS.max_batch * LIMITS.max_context * row * ty.dtype.size_bytes();
                (name.clone(), vec![0u8; bytes as usize])
            })
            .collect(),
        state_rows: module
            .states
            .iter()
            .map(|(name, ty)| {
                let row: u64 = ty.shape.iter().map(|d| d.as_const().unwrap()).product();
                (name.clone(), row as usize)
            })
            .collect(),
        slot: 0,
    };
    let sampling = Sampling {
        temperature: 0.0,
        top_p: 1.0,
        seed: 0,
    };
    let mut interp = Interpreter::new();
    let prefill = module.function("prefill").unwrap();
    let decode = module.function("decode").unwrap();
    let prefill_phase = lowered
        .phases
        .iter()
        .find(|p| p.function == "prefill")
        .unwrap();
    let decode_phase = lowered
        .phases
        .iter()
        .find(|p| p.function == "decode")
        .unwrap();
    // Three sequences of different lengths, prefilled one by one, then one decode step for all.
    let lengths = [5usize, 11, 3];
    let mut caches: Vec<SequenceCache> = Vec::new();
    for (seq, &len) in lengths.iter().enumerate() {
        let ids: Vec<i64> = (0..len as i64)
            .map(|i| (i * 7 + seq as i64 * 3) % 50)
            .collect();
        let positions: Vec<i64> = (0..len as i64).collect();
        let ins = prefill_inputs(&ids, &positions, &sampling, 0, 0);
        let mut cache = SequenceCache::new();
        let want = interp
            .run(&module, prefill, &w, &mut [&mut cache], &ins)
            .unwrap();
        mem.arena = vec![0xa5; prefill_phase.arena_bytes as usize];
        mem.slot = seq;
        let b = Bindings::from([("s".into(), len as u64), ("t".into(), len as u64)]);
        let got = execute(prefill, prefill_phase, &mut mem, &ins, &b);
        for ((name, _), (g, w)) in prefill_phase.results.iter().zip(got.iter().zip(&want)) {
            assert!(
                same(g, w),
                "{file} prefill of sequence {seq}: result {name} differs:\n{g:?}\n{w:?}"
            );
        }
        caches.push(cache);
    }
    let ids: Vec<i64> = vec![4, 9, 2];
    let positions: Vec<i64> = lengths.iter().map(|&l| l as i64).collect();
    let ins = phase_inputs(&ids, &positions, &sampling, 1, 3);
    let mut refs: Vec<&mut SequenceCache> = caches.iter_mut().collect();
    let want = interp.run(&module, decode, &w, &mut refs, &ins).unwrap();
    mem.arena = vec![0x5a; decode_phase.arena_bytes as usize];
    let t = *lengths.iter().max().unwrap() as u64 + 1;
    let b = Bindings::from([("b".into(), 3), ("t".into(), t)]);
    let got = execute(decode, decode_phase, &mut mem, &ins, &b);
    for ((name, _), (g, w)) in decode_phase.results.iter().zip(got.iter().zip(&want)) {
        assert!(same(g, w), "{file} decode: result {name} differs");
    }
}

#[test]
fn tiny_sparse_schedule_computes_what_the_interpreter_does() {
    check_model("tiny-sparse.ron");
}

#[test]
fn tiny_dense_schedule_computes_what_the_interpreter_does() {
    check_model("tiny-dense.ron");
}
