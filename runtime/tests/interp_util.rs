//! Helpers shared by the interpreter tests (included with `#[path]`; no tests of its own).
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};

use glmc_ir::{DType, Dim, Function, Module, Op, TensorType, Value};
use glmc_runtime::{InterpError, Interpreter, SequenceCache, Tensor};

pub fn f32t(shape: &[usize], data: Vec<f32>) -> Tensor {
    Tensor::f32(shape.to_vec(), data).unwrap()
}

pub fn i64t(shape: &[usize], data: Vec<i64>) -> Tensor {
    Tensor::i64(shape.to_vec(), data).unwrap()
}

/// A type from a mix of constants and symbol names: `ty(F32, &["s", "4"])`.
pub fn ty(dtype: DType, dims: &[&str]) -> TensorType {
    TensorType::new(
        dtype,
        dims.iter()
            .map(|d| match d.parse::<u64>() {
                Ok(n) => Dim::Const(n),
                Err(_) => Dim::sym(d),
            })
            .collect(),
    )
}

pub fn f(dims: &[&str]) -> TensorType {
    ty(DType::F32, dims)
}

pub fn i(dims: &[&str]) -> TensorType {
    ty(DType::I64, dims)
}

/// A function of inputs of types `inputs` feeding one node `op`; every output is a result.
pub fn single_op(op: Op, inputs: &[TensorType]) -> (Module, Function) {
    let mut func = Function::new("test");
    let args: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(k, t)| func.push_input(k as u64, format!("in{k}"), t.clone()))
        .collect();
    let n = func
        .push(op, "out", &args)
        .expect("the test graph verifies");
    for o in 0..func.node(n).outputs.len() {
        func.results.push((
            format!("out{o}"),
            Value {
                node: n,
                output: o as u32,
            },
        ));
    }
    (Module::new("m"), func)
}

/// Runs one op on `inputs` (type, value).
pub fn run_op(op: Op, inputs: Vec<(TensorType, Tensor)>) -> Result<Vec<Tensor>, InterpError> {
    let types: Vec<TensorType> = inputs.iter().map(|(t, _)| t.clone()).collect();
    let values: Vec<Tensor> = inputs.into_iter().map(|(_, v)| v).collect();
    let (m, func) = single_op(op, &types);
    let weights: HashMap<String, Tensor> = HashMap::new();
    Interpreter::new().run(&m, &func, &weights, &mut [], &values)
}

pub fn run_op_ok(op: Op, inputs: Vec<(TensorType, Tensor)>) -> Vec<Tensor> {
    run_op(op, inputs).unwrap_or_else(|e| panic!("{e}"))
}

pub fn module_with_states(states: &[(&str, TensorType)]) -> Module {
    let mut m = Module::new("m");
    m.states = states
        .iter()
        .map(|(n, t)| (n.to_string(), t.clone()))
        .collect::<BTreeMap<_, _>>();
    m
}

pub fn fv(t: &Tensor) -> &[f32] {
    t.as_f32().unwrap()
}

pub fn iv(t: &Tensor) -> &[i64] {
    t.as_i64().unwrap()
}

/// Asserts `|a − e| ≤ tol · max(1, |e|)` elementwise.
pub fn assert_close(actual: &[f32], expected: &[f64], tol: f64) {
    assert_eq!(actual.len(), expected.len(), "lengths differ");
    for (k, (&a, &e)) in actual.iter().zip(expected).enumerate() {
        let err = (a as f64 - e).abs();
        assert!(
            err <= tol * e.abs().max(1.0),
            "element {k}: got {a}, expected {e} (error {err})\nactual: {actual:?}\nexpected: {expected:?}"
        );
    }
}

/// Max relative error `‖a − b‖∞ / ‖b‖∞`.
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).abs())
        .fold(0.0, f64::max);
    let den = b.iter().map(|&y| (y as f64).abs()).fold(0.0, f64::max);
    num / den.max(1e-30)
}

/// A small deterministic generator (xorshift64*).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [−1, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0) as f32
    }

    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }

    pub fn tensor(&mut self, shape: &[usize], scale: f32) -> Tensor {
        let n = shape.iter().product();
        f32t(shape, self.vec(n, scale))
    }
}

pub fn caches_mut(caches: &mut [SequenceCache]) -> Vec<&mut SequenceCache> {
    caches.iter_mut().collect()
}

/// Adds a node, panicking with the verifier's message on a type error.
pub fn push(func: &mut Function, op: Op, name: &str, args: &[Value]) -> Value {
    func.push(op, name, args)
        .unwrap_or_else(|e| panic!("{e}"))
        .into()
}

/// `prefill` and `decode` functions that only write `new [s, 2]` at `pos [s]` into cache `kv`
/// (unbatched and batched) and return what `cache.update` gives back.
pub fn cache_module() -> Module {
    let mut m = module_with_states(&[("kv", f(&["2"]))]);
    for batched in [false, true] {
        let mut func = Function::new(if batched { "decode" } else { "prefill" });
        let new = func.push_input(0, "new", f(&["s", "2"]));
        let pos = func.push_input(1, "pos", i(&["s"]));
        let out = push(
            &mut func,
            Op::CacheUpdate {
                batched,
                state: "kv".into(),
            },
            "cache",
            &[new, pos],
        );
        func.results = vec![("cache".into(), out)];
        m.functions.push(func);
    }
    m
}
