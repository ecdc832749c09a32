//! Text and RON round trips, and canonical ids that do not depend on petgraph indices.

mod common;

use std::collections::HashMap;

use common::*;
use glmc_ir::serial::{from_ron, to_ron};
use glmc_ir::{
    parse_module, print_function, print_module, verify_module, Function, Module, NodeIndex, Op,
    Value,
};

#[test]
fn little_module_verifies() {
    let m = little_module(2);
    verify_module(&m).unwrap();
    // The builder really built what the tests below rely on.
    for f in &m.functions {
        let ops: Vec<&str> = f.graph.node_weights().map(|n| n.op.name()).collect();
        for op in [
            "input",
            "weight",
            "embed",
            "rmsnorm",
            "layernorm",
            "matmul",
            "reshape",
            "slice",
            "concat",
            "rope",
            "cache.update",
            "dsa.score",
            "dsa.topk",
            "mla.attend",
            "moe.route",
            "moe.experts",
            "cast",
            "scale",
            "silu",
            "mul",
            "add",
        ] {
            assert!(ops.contains(&op), "@{} has no {op}", f.name);
        }
    }
    let decode = m.function("decode").unwrap();
    let c = node(decode, "model.layers.1.self_attn.c_kv_cache");
    assert_eq!(decode.node(c).outputs[0].to_string(), "bf16[b,t,8]");
    let prefill = m.function("prefill").unwrap();
    let c = node(prefill, "model.layers.1.self_attn.c_kv_cache");
    assert_eq!(prefill.node(c).outputs[0].to_string(), "bf16[t,8]");
    let logits = prefill.results[0].1;
    assert_eq!(prefill.value_type(logits).to_string(), "bf16[s,32]");
}

#[test]
fn print_parse_print_is_identical() {
    for layers in [0, 1, 3] {
        let m = little_module(layers);
        let text = print_module(&m);
        let parsed = parse_module(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        verify_module(&parsed).unwrap();
        assert_eq!(print_module(&parsed), text);
        assert_eq!(parsed.states, m.states);
        assert_eq!(parsed.functions.len(), 2);
        for (a, b) in m.functions.iter().zip(&parsed.functions) {
            assert_eq!(a.graph.node_count(), b.graph.node_count());
            assert_eq!(a.graph.edge_count(), b.graph.edge_count());
        }
    }
}

#[test]
fn parse_keeps_the_multi_output_operand() {
    let m = little_module(1);
    let text = print_module(&m);
    assert!(text.contains("moe.experts"));
    // `experts` reads the router's second output.
    let line = text
        .lines()
        .find(|l| l.contains("\"model.layers.0.mlp.experts\""))
        .unwrap();
    assert!(line.contains('#'), "{line}");
    let parsed = parse_module(&text).unwrap();
    let f = parsed.function("prefill").unwrap();
    let ops = f.operands(node(f, "model.layers.0.mlp.experts"));
    let route = node(f, "model.layers.0.mlp.route");
    assert_eq!(
        ops[1],
        Value {
            node: route,
            output: 0
        }
    );
    assert_eq!(
        ops[2],
        Value {
            node: route,
            output: 1
        }
    );
}

#[test]
fn parse_canonicalizes_ids() {
    // The same function written with other ids parses and prints canonically.
    let text = "glmc.module \"m\"\n\
        func @f {\n\
          %7 = input {index=0} : f32[s,4] \"x\"\n\
          %3 = weight {recipe=hf(\"w\", [2,4])} : f32[2,4] \"w\"\n\
          %12 = matmul %7, %3 : f32[s,2] \"y\"\n\
          return %12 \"y\"\n\
        }\n";
    let m = parse_module(text).unwrap();
    verify_module(&m).unwrap();
    let expected = "glmc.module \"m\"\n\
        \n\
        func @f {\n  \
          %0 = input {index=0} : f32[s,4] \"x\"\n  \
          %1 = weight {recipe=hf(\"w\", [2, 4])} : f32[2,4] \"w\"\n  \
          %2 = matmul %0, %1 : f32[s,2] \"y\"\n  \
          return %2 \"y\"\n\
        }\n";
    assert_eq!(print_module(&m), expected);
}

#[test]
fn ron_round_trip_prints_identically() {
    let m = little_module(2);
    let ron = to_ron(&m).unwrap();
    let back = from_ron(&ron).unwrap();
    verify_module(&back).unwrap();
    assert_eq!(print_module(&back), print_module(&m));
    // And RON is itself stable.
    assert_eq!(to_ron(&back).unwrap(), ron);
}

#[test]
fn ron_rejects_forward_references() {
    let m = little_module(0);
    let ron = to_ron(&m).unwrap();
    // The embedding (node 3) reads the table (node 2); make it read node 5, defined later.
    let broken = ron.replacen("(2, 0),", "(5, 0),", 1);
    assert!(broken != ron, "the RON layout changed; update the test");
    let err = from_ron(&broken).unwrap_err().to_string();
    assert!(
        err.contains("model.embed_tokens") && err.contains("node 5"),
        "{err}"
    );
    let broken = ron.replacen("(\"logits\", 7, 0)", "(\"logits\", 4000, 0)", 1);
    assert!(broken != ron, "the RON layout changed; update the test");
    let err = from_ron(&broken).unwrap_err().to_string();
    assert!(err.contains("logits") && err.contains("4000"), "{err}");
    assert!(from_ron("(name: \"m\", states: {}, functions: [(").is_err());
}

/// Rebuilds `f` with nodes inserted in another order, edges added in another order, and
/// petgraph indices scrambled by removed and re-added nodes.
fn scramble(f: &Function, seed: u64) -> Function {
    let mut g = Function::new(f.name.clone());
    let mut rng = seed;
    let mut next = move |n: usize| {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((rng >> 33) as usize) % n.max(1)
    };
    let mut old: Vec<NodeIndex> = f.graph.node_indices().collect();
    // Fisher-Yates.
    for i in (1..old.len()).rev() {
        old.swap(i, next(i + 1));
    }
    let junk = |g: &mut Function, k: usize| {
        g.add_node(
            Op::Silu {},
            format!("junk{k}"),
            &[],
            vec![common::t(glmc_ir::DType::F32, vec![])],
        )
    };
    let mut junks: Vec<NodeIndex> = (0..7).map(|k| junk(&mut g, k)).collect();
    let mut map: HashMap<NodeIndex, NodeIndex> = HashMap::new();
    for (k, &n) in old.iter().enumerate() {
        let node = f.graph[n].clone();
        let new = g.graph.add_node(node.clone());
        map.insert(n, new);
        if k % 3 == 0 {
            if let Some(j) = junks.pop() {
                g.graph.remove_node(j);
            }
        }
        if k % 5 == 1 {
            // Remove and re-add a node we already placed: it lands in another slot.
            let victim = old[next(k + 1)];
            let placed = map[&victim];
            let w = g.graph.remove_node(placed).unwrap();
            let junk_slot = junk(&mut g, 100 + k);
            junks.push(junk_slot);
            map.insert(victim, g.graph.add_node(w));
        }
    }
    for j in junks {
        g.graph.remove_node(j);
    }
    let mut edges: Vec<_> = f
        .graph
        .edge_indices()
        .map(|e| {
            let (a, b) = f.graph.edge_endpoints(e).unwrap();
            (a, b, f.graph[e])
        })
        .collect();
    for i in (1..edges.len()).rev() {
        edges.swap(i, next(i + 1));
    }
    for (a, b, w) in edges {
        g.graph.add_edge(map[&a], map[&b], w);
    }
    g.results = f
        .results
        .iter()
        .map(|(name, v)| {
            (
                name.clone(),
                Value {
                    node: map[&v.node],
                    output: v.output,
                },
            )
        })
        .collect();
    g
}

#[test]
fn canonical_ids_do_not_depend_on_insertion_order() {
    let m = little_module(2);
    let text = print_module(&m);
    for seed in 1..=8 {
        let mut s = Module::new(m.name.clone());
        s.states = m.states.clone();
        s.functions = m.functions.iter().map(|f| scramble(f, seed)).collect();
        // The scramble really moved nodes to other petgraph indices.
        let f = &m.functions[0];
        let g = &s.functions[0];
        let moved = f
            .graph
            .node_indices()
            .filter(|&n| g.find(&f.graph[n].name) != Some(n))
            .count();
        assert!(
            moved > f.graph.node_count() / 2,
            "seed {seed}: only {moved} moved"
        );
        verify_module(&s).unwrap();
        assert_eq!(print_module(&s), text, "seed {seed}");
        assert_eq!(to_ron(&s).unwrap(), to_ron(&m).unwrap(), "seed {seed}");
    }
}

#[test]
fn canonical_order_is_topological_and_covers_dead_nodes() {
    let mut m = little_module(1);
    let f = m.function_mut("prefill").unwrap();
    // Dead nodes the results do not reach are still printed, after the live ones, and in
    // name order whatever their insertion order.
    let emb = node(f, "model.embed_tokens");
    f.push(Op::Silu {}, "zz.dead", &[emb.into()]).unwrap();
    f.push(Op::Relu {}, "aa.dead", &[emb.into()]).unwrap();
    let order = f.canonical_order();
    assert_eq!(order.len(), f.graph.node_count());
    let pos: HashMap<NodeIndex, usize> = order.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    assert_eq!(order[..2], f.inputs()[..]);
    for &n in &order {
        for v in f.operands(n) {
            assert!(
                pos[&v.node] < pos[&n],
                "{} before its operand",
                f.node(n).name
            );
        }
    }
    let names: Vec<&str> = order[order.len() - 2..]
        .iter()
        .map(|&n| f.node(n).name.as_str())
        .collect();
    assert_eq!(names, ["aa.dead", "zz.dead"]);
    let text = print_function(f);
    assert!(text.contains("relu"), "{text}");
    let printed = print_module(&m);
    assert_eq!(print_module(&parse_module(&printed).unwrap()), printed);
}

#[test]
fn results_of_a_second_output_round_trip() {
    let mut m = Module::new("tiny");
    m.functions.push(tiny_function());
    let text = print_module(&m);
    assert!(
        text.contains("return %9 \"weights\", %9#1 \"experts\""),
        "{text}"
    );
    for back in [
        parse_module(&text).unwrap(),
        from_ron(&to_ron(&m).unwrap()).unwrap(),
    ] {
        verify_module(&back).unwrap();
        let f = &back.functions[0];
        let outs: Vec<(&str, u32)> = f
            .results
            .iter()
            .map(|(n, v)| (n.as_str(), v.output))
            .collect();
        assert_eq!(outs, [("weights", 0), ("experts", 1)]);
        assert_eq!(f.value_type(f.results[1].1).to_string(), "i64[s,2]");
        assert_eq!(print_module(&back), text);
    }
}

#[test]
fn odd_names_round_trip() {
    let odd = [
        "quote\"d",
        "back\\slash",
        "new\nline",
        "tab\there",
        "bell\u{7}",
        "ünïcödé ✓",
        "",
        "%0 = input",
        "// not a comment",
    ];
    let mut m = Module::new("mod \"x\"\n");
    let mut f = Function::new("f");
    let x = f.push_input(
        0,
        odd[0],
        common::t(glmc_ir::DType::F32, glmc_ir::shape!["s", 4]),
    );
    let mut v = x;
    for (i, name) in odd[1..].iter().enumerate() {
        let op = if i % 2 == 0 { Op::Silu {} } else { Op::Relu {} };
        v = f.push(op, *name, &[v]).unwrap().into();
    }
    f.results.push(("result \"name\"\n".into(), v));
    m.states.insert(
        "state\\with\"odd\nname".into(),
        common::t(glmc_ir::DType::BF16, glmc_ir::shape![2]),
    );
    m.functions.push(f);
    verify_module(&m).unwrap();
    let text = print_module(&m);
    let back = parse_module(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(back.name, m.name);
    assert_eq!(back.states, m.states);
    let f = &back.functions[0];
    let mut names: Vec<&str> = f
        .canonical_order()
        .into_iter()
        .map(|n| f.node(n).name.as_str())
        .collect();
    let mut expected = odd.to_vec();
    names.sort();
    expected.sort();
    assert_eq!(names, expected);
    assert_eq!(f.results[0].0, "result \"name\"\n");
    assert_eq!(print_module(&back), text);
    // Every node stays on its own line: escapes keep newlines out of the text's lines.
    assert_eq!(text.lines().count(), 1 + 1 + 1 + 1 + odd.len() + 1 + 1);
}

/// The ops that end a phase: the last position's row, then the samplers. Parsed from text,
/// printed back identically, and RON agrees.
#[test]
fn sampling_ops_round_trip() {
    let text = "glmc.module \"m\"\n\
        \n\
        func @prefill {\n  \
          %0 = input {index=0} : f32[s,4] \"hidden\"\n  \
          %1 = input {index=1} : f32[1] \"temperature\"\n  \
          %2 = input {index=2} : f32[1] \"top_p\"\n  \
          %3 = input {index=3} : f32[1] \"uniform\"\n  \
          %4 = slice.last %0 : f32[1,4] \"model.last_position\"\n  \
          %5 = weight {recipe=hf(\"lm_head.weight\", [8, 4])} : f32[8,4] \"lm_head.weight\"\n  \
          %6 = matmul %4, %5 : f32[1,8] \"logits\"\n  \
          %7 = sample.argmax %6 : i64[1] \"greedy\"\n  \
          %8 = sample.top_p %6, %1, %2, %3 : i64[1] \"next_token\"\n  \
          return %6 \"logits\", %7 \"greedy\", %8 \"next_token\"\n\
        }\n";
    let m = parse_module(text).unwrap_or_else(|e| panic!("{e}"));
    verify_module(&m).unwrap();
    assert_eq!(print_module(&m), text);
    let f = m.function("prefill").unwrap();
    let op = |name| f.node(node(f, name)).op.clone();
    assert_eq!(op("model.last_position"), Op::SliceLast {});
    assert_eq!(op("greedy"), Op::SampleArgmax {});
    assert_eq!(op("next_token"), Op::SampleTopP {});
    let back = from_ron(&to_ron(&m).unwrap()).unwrap();
    assert_eq!(print_module(&back), text);
}

/// One rank of a partitioned module: the header's `tp`/`rank`, the collectives and the
/// vocab-parallel lookup parse, print back identically, and survive RON.
#[test]
fn tensor_parallel_rank_round_trips() {
    let text = "glmc.module \"m\" tp=2 rank=1\n\
        \n\
        func @prefill {\n  \
          %0 = input {index=0} : i64[s] \"input_ids\"\n  \
          %1 = weight {recipe=slice(hf(\"model.embed_tokens.weight\", [8, 4]), 0, 4, 8)} : f32[4,4] \"model.embed_tokens.weight\"\n  \
          %2 = embed.shard %1, %0 {start=4} : f32[s,4] \"model.embed_tokens#shard\"\n  \
          %3 = all_reduce %2 {op=sum, ranks=2} : f32[s,4] \"model.embed_tokens\"\n  \
          %4 = weight {recipe=slice(hf(\"lm_head.weight\", [8, 4]), 0, 4, 8)} : f32[4,4] \"lm_head.weight\"\n  \
          %5 = matmul %3, %4 : f32[s,4] \"lm_head#shard\"\n  \
          %6 = all_gather %5 {axis=1, ranks=2} : f32[s,8] \"lm_head\"\n  \
          return %6 \"logits\"\n\
        }\n";
    let m = parse_module(text).unwrap_or_else(|e| panic!("{e}"));
    verify_module(&m).unwrap();
    assert_eq!((m.tp.degree, m.tp.rank), (2, 1));
    assert_eq!(print_module(&m), text);
    let f = m.function("prefill").unwrap();
    let op = |name| f.node(node(f, name)).op.clone();
    assert_eq!(
        op("model.embed_tokens"),
        Op::AllReduce {
            op: glmc_ir::Reduce::Sum,
            ranks: 2
        }
    );
    assert_eq!(op("lm_head"), Op::AllGather { axis: 1, ranks: 2 });
    assert_eq!(op("model.embed_tokens#shard"), Op::EmbedShard { start: 4 });
    let back = from_ron(&to_ron(&m).unwrap()).unwrap();
    assert_eq!(print_module(&back), text);
    assert_eq!(back.tp, m.tp);
}

#[test]
fn a_whole_module_has_no_tp_in_its_header_and_a_bad_one_is_rejected() {
    let m = parse_module("glmc.module \"m\"\n").unwrap();
    assert!(m.tp.is_single());
    assert!(!to_ron(&m).unwrap().contains("tp"));
    for (bad, what) in [
        ("glmc.module \"m\" tp=2 rank=2\n", "a rank below it"),
        ("glmc.module \"m\" tp=1 rank=0\n", "tp ≥ 2"),
        ("glmc.module \"m\" tp=2\n", "expected `rank`"),
        (
            "glmc.module \"m\" tp=x rank=0\n",
            "expected a count after `tp=`",
        ),
    ] {
        let e = parse_module(bad).unwrap_err().to_string();
        assert!(e.contains(what), "{bad:?}: {e}");
    }
}
