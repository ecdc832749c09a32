//! `plan_memory` on small graphs whose numbers can be worked out by hand, its errors, and
//! properties of random graphs: values live at one step never share bytes, the arena is at
//! least the peak, the plan is deterministic and independent of petgraph indices.

use std::collections::BTreeMap;

use glmc_ir::{
    parse_module, print_module, DType, Dim, Function, Module, Op, Recipe, TensorType, Value,
};
use glmc_passes::plan_memory::{
    kv_cache_bytes, plan_memory, Bindings, Buffer, Live, MemoryPlan, PlanError, Storage, ALIGNMENT,
};
use proptest::prelude::*;

fn bind(pairs: &[(&str, u64)]) -> Bindings {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

fn weight(f: &mut Function, name: &str, shape: Vec<u64>) -> Value {
    f.push_weight(name, Recipe::tensor(name, shape), DType::F32)
        .unwrap()
}

fn op(f: &mut Function, op: Op, name: &str, operands: &[Value]) -> Value {
    f.push(op, name, operands).unwrap().into()
}

/// Every pair of buffers live at a common step has disjoint bytes; offsets are aligned; the
/// arena holds every buffer and is at least the peak, which is the most bytes live at a step.
fn assert_invariants(plan: &MemoryPlan) {
    let bufs: Vec<&Buffer> = plan.buffers.iter().filter(|b| b.bytes > 0).collect();
    for (i, a) in bufs.iter().enumerate() {
        assert_eq!(a.offset % ALIGNMENT, 0, "{a:?} is not aligned");
        assert!(
            a.offset + a.bytes <= plan.arena_bytes,
            "{a:?} is outside the arena"
        );
        for b in &bufs[i + 1..] {
            assert!(
                !(a.live.overlaps(b.live) && a.intersects(b)),
                "@{}: {} {a:?} and {} {b:?} are live together and share bytes",
                plan.function,
                plan.value(a.value).unwrap().name,
                plan.value(b.value).unwrap().name,
            );
        }
    }
    let steps = plan.order.len();
    let naive: Vec<u64> = (0..steps)
        .map(|s| plan.live_at(s).map(|b| b.bytes).sum())
        .collect();
    assert_eq!(plan.live_bytes(), naive);
    assert_eq!(
        plan.peak_live_bytes,
        naive.iter().copied().max().unwrap_or(0)
    );
    assert_eq!(
        naive.get(plan.peak_step).copied().unwrap_or(0),
        plan.peak_live_bytes
    );
    assert!(plan.arena_bytes >= plan.peak_live_bytes);
    assert_eq!(plan.arena_bytes % ALIGNMENT, 0);
    let padded: u64 = bufs
        .iter()
        .map(|b| b.bytes.next_multiple_of(ALIGNMENT))
        .sum();
    assert!(plan.arena_bytes <= padded);
}

/// `x f32[s,16] → a = x·W1ᵀ [s,64] → b = a·W2ᵀ [s,128] → c = b·W3ᵀ [s,32]`, `c` the result.
fn chain() -> Function {
    let mut f = Function::new("chain");
    let x = f.push_input(
        0,
        "x",
        TensorType::new(DType::F32, vec![Dim::sym("s"), 16u64.into()]),
    );
    let w1 = weight(&mut f, "w1", vec![64, 16]);
    let a = op(&mut f, Op::Matmul {}, "a", &[x, w1]);
    let w2 = weight(&mut f, "w2", vec![128, 64]);
    let b = op(&mut f, Op::Matmul {}, "b", &[a, w2]);
    let w3 = weight(&mut f, "w3", vec![32, 128]);
    let c = op(&mut f, Op::Matmul {}, "c", &[b, w3]);
    f.results.push(("c".into(), c));
    f
}

fn named<'p>(
    plan: &'p MemoryPlan,
    f: &Function,
    name: &str,
) -> &'p glmc_passes::plan_memory::PlannedValue {
    plan.value(f.find(name).unwrap().into()).unwrap()
}

#[test]
fn chain_of_three_matmuls() {
    let f = chain();
    let plan = plan_memory(&f, &bind(&[("s", 4)])).unwrap();
    // a = 4·64·4 = 1024 B, b = 4·128·4 = 2048 B, c = 4·32·4 = 512 B: a and b are live together
    // while b is computed, b and c while c is; a and c never.
    let (a, b, c) = (1024, 2048, 512);
    assert_eq!(plan.arena_bytes, std::cmp::max(a + b, b + c));
    assert_eq!(plan.peak_live_bytes, a + b);
    // Canonical order: x, w1, a, w2, b, w3, c.
    let live = |n| named(&plan, &f, n).live;
    assert_eq!(live("x"), Live { first: 0, last: 2 });
    assert_eq!(live("a"), Live { first: 2, last: 4 });
    assert_eq!(live("b"), Live { first: 4, last: 6 });
    assert_eq!(live("c"), Live { first: 6, last: 6 });
    assert_eq!(plan.peak_step, 4);
    // Greedy by size: b (largest) at 0, a above it, c reuses a's bytes (a is dead by then).
    let offset = |n: &str| plan.offset(f.find(n).unwrap().into());
    assert_eq!(offset("b"), Some(0));
    assert_eq!(offset("a"), Some(2048));
    assert_eq!(offset("c"), Some(2048));
    assert_eq!(offset("x"), None);
    assert_eq!(offset("w1"), None);
    assert_eq!(plan.weights_bytes, (64 * 16 + 128 * 64 + 32 * 128) * 4);
    assert_eq!(plan.inputs_bytes, 4 * 16 * 4);
    assert_eq!(plan.largest_intermediate().unwrap().name, "b");
    assert_invariants(&plan);
}

#[test]
fn chain_scales_with_its_binding() {
    let f = chain();
    for s in [1, 2, 3, 7, 64, 1000] {
        let plan = plan_memory(&f, &bind(&[("s", s)])).unwrap();
        let (a, b, c) = (s * 64 * 4, s * 128 * 4, s * 32 * 4);
        let round = |n: u64| n.next_multiple_of(ALIGNMENT);
        // b at 0; a above b; c fits above b too (only b is live with it).
        assert_eq!(plan.arena_bytes, round(b) + round(a.max(c)), "s={s}");
        assert_eq!(plan.peak_live_bytes, (a + b).max(b + c), "s={s}");
        assert_invariants(&plan);
    }
}

#[test]
fn a_value_read_late_stays_live() {
    // x → a → b → c = a + b: a is read at c's step, so all three are live there.
    let mut f = Function::new("skip");
    let x = f.push_input(
        0,
        "x",
        TensorType::new(DType::F32, vec![4u64.into(), 64u64.into()]),
    );
    let a = op(&mut f, Op::Silu {}, "a", &[x]);
    let b = op(&mut f, Op::Relu {}, "b", &[a]);
    let c = op(&mut f, Op::Add {}, "c", &[a, b]);
    f.results.push(("c".into(), c));
    let plan = plan_memory(&f, &Bindings::new()).unwrap();
    assert_eq!(named(&plan, &f, "a").live, Live { first: 1, last: 3 });
    assert_eq!(plan.peak_live_bytes, 3 * 1024);
    assert_eq!(plan.arena_bytes, 3 * 1024);
    assert_invariants(&plan);
}

#[test]
fn an_unread_value_lives_for_its_own_step_and_results_to_the_end() {
    let mut f = Function::new("dead");
    let x = f.push_input(
        0,
        "x",
        TensorType::new(DType::F32, vec![4u64.into(), 64u64.into()]),
    );
    let r1 = op(&mut f, Op::Silu {}, "r1", &[x]);
    let big = op(&mut f, Op::Concat { axis: 1 }, "unread", &[x, x]);
    let r2 = op(&mut f, Op::Relu {}, "r2", &[x]);
    f.results.push(("r1".into(), r1));
    f.results.push(("r2".into(), r2));
    let plan = plan_memory(&f, &Bindings::new()).unwrap();
    // Order: x, r1, r2 (from the results), then `unread` (reached from no result).
    let last = plan.order.len() - 1;
    let unread = plan.value(big).unwrap();
    assert_eq!(unread.live, Live { first: last, last });
    assert_eq!(plan.value(r1).unwrap().live, Live { first: 1, last });
    assert_eq!(plan.value(r2).unwrap().live, Live { first: 2, last });
    // At the last step: r1, r2 and unread.
    assert_eq!(plan.peak_live_bytes, 1024 + 1024 + 2048);
    assert_invariants(&plan);
}

/// A reshape is a view: no arena bytes, and it keeps what it views alive.
#[test]
fn reshapes_are_views_that_extend_the_viewed_buffer() {
    let mut f = Function::new("views");
    let x = f.push_input(
        0,
        "x",
        TensorType::new(DType::F32, vec![Dim::sym("s"), 64u64.into()]),
    );
    let a = op(&mut f, Op::Silu {}, "a", &[x]);
    let v1 = op(
        &mut f,
        Op::Reshape {
            shape: vec![Dim::sym("s"), 8u64.into(), 8u64.into()],
        },
        "v1",
        &[a],
    );
    let v2 = op(
        &mut f,
        Op::Reshape {
            shape: vec![Dim::sym("s"), 64u64.into()],
        },
        "v2",
        &[v1],
    );
    let b = op(&mut f, Op::Relu {}, "b", &[x]);
    let c = op(&mut f, Op::Add {}, "c", &[b, v2]);
    f.results.push(("c".into(), c));
    let plan = plan_memory(&f, &bind(&[("s", 4)])).unwrap();
    assert_eq!(plan.value(v1).unwrap().storage, Storage::View { of: a });
    assert_eq!(
        plan.value(v2).unwrap().storage,
        Storage::View { of: a },
        "a view of a view"
    );
    assert_eq!(plan.value(v2).unwrap().bytes, 1024);
    assert_eq!(plan.offset(v2), plan.offset(a));
    assert_eq!(plan.buffers.len(), 3, "a, b, c own buffers; the views none");
    let a_buf = plan.buffers.iter().find(|b| b.value == a).unwrap();
    let c_step = plan.value(c).unwrap().live.first;
    assert_eq!(a_buf.live.last, c_step, "a lives until its view is read");
    assert_eq!(
        plan.value(a).unwrap().live.last,
        plan.value(v1).unwrap().live.first
    );
    assert_invariants(&plan);
}

/// A module with one cache of `f32[64]` rows, and `prefill(x f32[s,64], positions i64[s])`
/// writing `x` into it and reading the cache back as `f32[t,64]`.
fn cached() -> Module {
    let mut m = Module::new("cached");
    m.states.insert(
        "model.layers.0.self_attn.cache.k".into(),
        TensorType::new(DType::F32, vec![64u64.into()]),
    );
    m.states.insert(
        "model.layers.1.self_attn.cache.k".into(),
        TensorType::new(DType::F32, vec![64u64.into()]),
    );
    m.states.insert(
        "extra".into(),
        TensorType::new(DType::BF16, vec![8u64.into()]),
    );
    let mut f = Function::new("prefill");
    let x = f.push_input(
        0,
        "x",
        TensorType::new(DType::F32, vec![Dim::sym("s"), 64u64.into()]),
    );
    let pos = f.push_input(
        1,
        "positions",
        TensorType::new(DType::I64, vec![Dim::sym("s")]),
    );
    let cache = op(
        &mut f,
        Op::CacheUpdate {
            batched: false,
            state: "model.layers.0.self_attn.cache.k".into(),
        },
        "cache",
        &[x, pos],
    );
    let w = weight(&mut f, "w", vec![32, 64]);
    let y = op(&mut f, Op::Matmul {}, "y", &[cache, w]);
    f.results.push(("y".into(), y));
    m.functions.push(f);
    m
}

#[test]
fn cache_views_take_no_arena_bytes() {
    let m = cached();
    let f = &m.functions[0];
    let plan = plan_memory(f, &bind(&[("s", 8), ("t", 1000)])).unwrap();
    let cache = named(&plan, f, "cache");
    assert_eq!(
        cache.storage,
        Storage::Cache {
            state: "model.layers.0.self_attn.cache.k".into()
        }
    );
    assert_eq!(
        cache.bytes,
        1000 * 64 * 4,
        "the gathered view's logical size"
    );
    // Only y [t,32] f32 is in the arena.
    assert_eq!(plan.buffers.len(), 1);
    assert_eq!(plan.arena_bytes, 1000 * 32 * 4);
    assert_eq!(plan.inputs_bytes, 8 * 64 * 4 + 8 * 8);
    assert_invariants(&plan);
}

#[test]
fn kv_cache_bytes_per_token_sum_the_state_rows() {
    let kv = kv_cache_bytes(&cached()).unwrap();
    assert_eq!(kv.per_token, 64 * 4 + 64 * 4 + 8 * 2);
    assert_eq!(kv.layers, vec![(None, 16), (Some(0), 256), (Some(1), 256)]);
    assert_eq!(kv.for_tokens(10), Some(10 * (256 + 256 + 16)));
    assert_eq!(kv.for_tokens(u64::MAX), None);
    let mut m = cached();
    m.states.insert(
        "odd".into(),
        TensorType::new(DType::F32, vec![Dim::sym("t")]),
    );
    assert_eq!(
        kv_cache_bytes(&m).unwrap_err().to_string(),
        "cache state \"odd\" has rows of f32[t]; a row must have a constant shape"
    );
}

#[test]
fn an_unbound_symbol_is_named_with_its_node() {
    let m = cached();
    let f = &m.functions[0];
    let err = plan_memory(f, &Bindings::new()).unwrap_err();
    assert_eq!(
        err,
        PlanError::Unbound {
            function: "prefill".into(),
            node: "x".into(),
            ty: "f32[s,64]".into(),
            symbol: "s".into(),
            bound: "none".into(),
        }
    );
    assert_eq!(
        err.to_string(),
        "@prefill: node \"x\" has type f32[s,64], but symbol `s` has no binding (bound: none)"
    );
    let err = plan_memory(f, &bind(&[("s", 8), ("b", 2)])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "@prefill: node \"cache\" has type f32[t,64], but symbol `t` has no binding (bound: b=2, s=8)"
    );
}

#[test]
fn sizes_past_64_bits_are_an_error() {
    let err = plan_memory(&chain(), &bind(&[("s", u64::MAX / 8)])).unwrap_err();
    assert!(matches!(err, PlanError::Overflow { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "@chain: node \"x\": f32[s,16] with s={} holds more than 2^64 bytes",
            u64::MAX / 8
        )
    );
}

#[test]
fn every_output_of_a_multi_output_node_is_planned() {
    let mut f = Function::new("route");
    let x = f.push_input(
        0,
        "logits",
        TensorType::new(DType::F32, vec![Dim::sym("b"), 16u64.into()]),
    );
    let bias = weight(&mut f, "bias", vec![16]);
    let route = f
        .push(
            Op::MoeRoute {
                n_group: 1,
                norm_topk_prob: true,
                routed_scaling_factor: 1.0,
                top_k: 4,
                topk_group: 1,
            },
            "router",
            &[x, bias],
        )
        .unwrap();
    let w = Value {
        node: route,
        output: 0,
    };
    let e = Value {
        node: route,
        output: 1,
    };
    f.results.push(("w".into(), w));
    f.results.push(("e".into(), e));
    let plan = plan_memory(&f, &bind(&[("b", 64)])).unwrap();
    assert_eq!(plan.value(w).unwrap().name, "router");
    assert_eq!(plan.value(e).unwrap().name, "router#1");
    assert_eq!(plan.value(w).unwrap().bytes, 64 * 4 * 4);
    assert_eq!(plan.value(e).unwrap().bytes, 64 * 4 * 8);
    assert_eq!(plan.arena_bytes, 1024 + 2048);
    assert_ne!(plan.offset(w), plan.offset(e));
    assert_invariants(&plan);
}

#[test]
fn zero_sized_values_take_no_bytes() {
    let f = chain();
    let plan = plan_memory(&f, &bind(&[("s", 0)])).unwrap();
    assert_eq!(plan.arena_bytes, 0);
    assert_eq!(plan.peak_live_bytes, 0);
    assert_invariants(&plan);
}

// ---------------------------------------------------------------------------------------------
// Random graphs

/// One step of a random graph, applied to the values made so far (indices wrap around).
#[derive(Clone, Debug)]
enum Step {
    Matmul {
        x: usize,
        width: u64,
    },
    Silu {
        x: usize,
    },
    Add {
        x: usize,
        y: usize,
    },
    Concat {
        x: usize,
        y: usize,
    },
    Slice {
        x: usize,
    },
    /// `[s, w] → [s, w/2, 2] → [s, w]`: a view of a view.
    Reshape {
        x: usize,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (
            any::<usize>(),
            prop::sample::select(vec![8u64, 16, 64, 96, 256])
        )
            .prop_map(|(x, width)| Step::Matmul { x, width }),
        any::<usize>().prop_map(|x| Step::Silu { x }),
        (any::<usize>(), any::<usize>()).prop_map(|(x, y)| Step::Add { x, y }),
        (any::<usize>(), any::<usize>()).prop_map(|(x, y)| Step::Concat { x, y }),
        any::<usize>().prop_map(|x| Step::Slice { x }),
        any::<usize>().prop_map(|x| Step::Reshape { x }),
    ]
}

/// Builds the graph; every value is `f32[s, w]`. Results: the last value and every value
/// whose index is in `results` (wrapped).
fn random_graph(steps: &[Step], results: &[usize]) -> Function {
    let mut f = Function::new("random");
    let x = f.push_input(
        0,
        "x",
        TensorType::new(DType::F32, vec![Dim::sym("s"), 32u64.into()]),
    );
    let mut values: Vec<(Value, u64)> = vec![(x, 32)];
    for (i, st) in steps.iter().enumerate() {
        let pick = |k: usize| values[k % values.len()];
        let name = format!("v{i}");
        let made = match *st {
            Step::Matmul { x, width } => {
                let (x, w) = pick(x);
                let wt = weight(&mut f, &format!("{name}.weight"), vec![width, w]);
                (op(&mut f, Op::Matmul {}, &name, &[x, wt]), width)
            }
            Step::Silu { x } => {
                let (x, w) = pick(x);
                (op(&mut f, Op::Silu {}, &name, &[x]), w)
            }
            Step::Add { x, y } => {
                let (x, w) = pick(x);
                let (y, wy) = pick(y);
                if w == wy {
                    (op(&mut f, Op::Add {}, &name, &[x, y]), w)
                } else {
                    (op(&mut f, Op::Relu {}, &name, &[x]), w)
                }
            }
            Step::Concat { x, y } => {
                let (x, w) = pick(x);
                let (y, wy) = pick(y);
                (op(&mut f, Op::Concat { axis: 1 }, &name, &[x, y]), w + wy)
            }
            // Halving can reach a width of 1, or an odd one: those take the unary op instead,
            // as an `add` of mismatched widths does.
            Step::Slice { x } if pick(x).1 < 2 => {
                (op(&mut f, Op::Relu {}, &name, &[pick(x).0]), pick(x).1)
            }
            Step::Reshape { x } if pick(x).1 % 2 == 1 => {
                (op(&mut f, Op::Relu {}, &name, &[pick(x).0]), pick(x).1)
            }
            Step::Slice { x } => {
                let (x, w) = pick(x);
                (
                    op(
                        &mut f,
                        Op::Slice {
                            axis: 1,
                            start: 0,
                            end: w / 2,
                        },
                        &name,
                        &[x],
                    ),
                    w / 2,
                )
            }
            Step::Reshape { x } => {
                let (x, w) = pick(x);
                let half = op(
                    &mut f,
                    Op::Reshape {
                        shape: vec![Dim::sym("s"), (w / 2).into(), 2u64.into()],
                    },
                    &format!("{name}.split"),
                    &[x],
                );
                (
                    op(
                        &mut f,
                        Op::Reshape {
                            shape: vec![Dim::sym("s"), w.into()],
                        },
                        &name,
                        &[half],
                    ),
                    w,
                )
            }
        };
        values.push(made);
    }
    let last = values.last().unwrap().0;
    f.results.push(("last".into(), last));
    for (i, &r) in results.iter().enumerate() {
        f.results
            .push((format!("r{i}"), values[r % values.len()].0));
    }
    f
}

/// The plan keyed by node names, to compare plans of graphs whose petgraph indices differ.
fn by_name(plan: &MemoryPlan) -> BTreeMap<String, (u64, Live, Option<u64>)> {
    plan.values
        .iter()
        .map(|v| (v.name.clone(), (v.bytes, v.live, plan.offset(v.value))))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn random_graphs_plan_soundly(
        steps in prop::collection::vec(step(), 1..40),
        results in prop::collection::vec(any::<usize>(), 0..3),
        s in 1u64..300,
    ) {
        let f = random_graph(&steps, &results);
        let plan = plan_memory(&f, &bind(&[("s", s)])).unwrap();
        assert_invariants(&plan);
        // Every value that is neither an argument, a weight nor a view owns a buffer.
        for v in &plan.values {
            let owns = plan.buffers.iter().any(|b| b.value == v.value);
            prop_assert_eq!(owns, matches!(v.storage, Storage::Arena { .. }));
        }
        // Deterministic, and the same after a print/parse round trip (new petgraph indices).
        prop_assert_eq!(&plan_memory(&f, &bind(&[("s", s)])).unwrap(), &plan);
        let mut m = Module::new("m");
        m.functions.push(f.clone());
        let parsed = parse_module(&print_module(&m)).unwrap();
        let g = &parsed.functions[0];
        let again = plan_memory(g, &bind(&[("s", s)])).unwrap();
        prop_assert_eq!(by_name(&again), by_name(&plan));
        prop_assert_eq!(again.arena_bytes, plan.arena_bytes);
    }
}
