//! `glmc dump`: snapshots of the shipped models' IR, text and RON round trips, the weights a graph
//! names against GLM5-SPEC §2.1 and against transformers-written checkpoints, and `import-hf`
//! giving the same graph as the shipped `glm5.ron`.

mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};

use common::{glmc, glmc_ok, repo_path, shipped_configs, success};
use glmc_ir::{parse_module, print_module, serial, verify_module, Module, Op, Recipe};

// ---------------------------------------------------------------------------------------------
// Snapshots

// `glmc dump` runs the optimisation pipeline (-O1) by default; `-O0` shows the graph as the
// builder writes it (only select-attention applied), which is what the spec review of these
// snapshots is about. Both are kept, so a change in either the builder or a pass shows up here.

#[test]
fn snapshot_tiny_sparse_full() {
    insta::assert_snapshot!(
        "tiny_sparse_full_O0",
        glmc_ok(&["dump", "models/tiny-sparse.ron", "--full", "-O0"])
    );
    insta::assert_snapshot!(
        "tiny_sparse_full",
        glmc_ok(&["dump", "models/tiny-sparse.ron", "--full"])
    );
}

#[test]
fn snapshot_tiny_dense_full() {
    insta::assert_snapshot!(
        "tiny_dense_full_O0",
        glmc_ok(&["dump", "models/tiny-dense.ron", "--full", "-O0"])
    );
    insta::assert_snapshot!(
        "tiny_dense_full",
        glmc_ok(&["dump", "models/tiny-dense.ron", "--full"])
    );
}

#[test]
fn snapshot_glm5_summary() {
    insta::assert_snapshot!(
        "glm5_summary_O0",
        glmc_ok(&["dump", "models/glm5.ron", "-O0"])
    );
    insta::assert_snapshot!("glm5_summary", glmc_ok(&["dump", "models/glm5.ron"]));
}

#[test]
fn snapshot_tiny_dense_prefill_dot() {
    insta::assert_snapshot!(
        "tiny_dense_prefill_dot",
        glmc_ok(&[
            "dump",
            "models/tiny-dense.ron",
            "--phase",
            "prefill",
            "--format",
            "dot"
        ])
    );
}

/// The optimisation levels every structural test below runs at.
const OPT_LEVELS: [&str; 2] = ["-O0", "-O1"];

// ---------------------------------------------------------------------------------------------
// Structure of the dumps (independent of the snapshots)

/// Both phases are dumped by default, and `--phase` keeps exactly one.
#[test]
fn phase_selects_one_function() {
    for config in ["models/tiny-sparse.ron", "models/tiny-dense.ron"] {
        let full = glmc_ok(&["dump", config, "--full"]);
        assert!(full.contains("\nfunc @prefill {\n"), "{config}");
        assert!(full.contains("\nfunc @decode {\n"), "{config}");
        let prefill = glmc_ok(&["dump", config, "--full", "--phase", "prefill"]);
        let decode = glmc_ok(&["dump", config, "--full", "--phase", "decode"]);
        assert!(prefill.contains("func @prefill") && !prefill.contains("func @decode"));
        assert!(decode.contains("func @decode") && !decode.contains("func @prefill"));
        // The module header and states are printed either way; prefill comes first.
        assert!(
            full.starts_with(&prefill),
            "{config}: prefill is not a prefix"
        );
        let header_len = full.find("func @prefill").unwrap();
        assert_eq!(
            format!(
                "{}{}",
                &full[..header_len],
                &full[full.find("func @decode").unwrap()..]
            ),
            decode,
            "{config}: --phase decode is not the header plus the decode function"
        );
    }
}

/// `--greedy` builds for a greedy run without logits: the dump shows `sample.argmax` and no
/// `logits` result before `fuse-lm-head-argmax`, and `matmul.argmax` after it; the default
/// build keeps `sample.top_p` and its logits, which the pass leaves alone.
#[test]
fn greedy_dumps_show_the_argmax_and_its_fusion() {
    let after = |extra: &[&str]| {
        let mut args = vec![
            "dump",
            "models/tiny-sparse.ron",
            "--phase",
            "decode",
            "--dtype",
            "bf16",
            "--after",
            "fuse-elementwise|fuse-lm-head-argmax",
        ];
        args.extend(extra);
        glmc_ok(&args)
    };
    let greedy = after(&["--greedy"]);
    let (before, fused) = greedy
        .split_once("// ===== after pass fuse-lm-head-argmax (changed) =====")
        .expect("the pass changed the greedy build");
    let returns = |dump: &str| {
        let line = dump.lines().find(|l| l.starts_with("  return ")).unwrap();
        line.split(", ").count() == 1 && line.ends_with(" \"next_token\"")
    };
    assert!(before.contains("sample.argmax") && !before.contains("sample.top_p"));
    assert!(returns(before), "{before}");
    assert!(fused.contains("= matmul.argmax %") && !fused.contains("sample.argmax"));
    assert!(!fused.contains(" \"lm_head\"\n") && !fused.contains("\"logits\""));
    assert!(returns(fused), "{fused}");
    let sampling = after(&[]);
    assert!(sampling.contains("// ===== after pass fuse-lm-head-argmax (unchanged) ====="));
    assert!(sampling.contains("sample.top_p") && !sampling.contains("matmul.argmax"));
}

/// The DOT export has one node per line of the text dump, labelled with its id and op, and one
/// edge per operand (labelled with the operand index and, for a second output, `#k`), plus the
/// result; edges are derived here from the text dump, not from the IR.
#[test]
fn dot_matches_the_text_dump() {
    let args = ["dump", "models/tiny-dense.ron", "--phase", "prefill"];
    let text = glmc_ok(&[&args[..], &["--full"]].concat());
    let dot = glmc_ok(&[&args[..], &["--format", "dot"]].concat());
    assert!(dot.starts_with("digraph \"prefill\" {\n"), "{dot:.200}");
    assert!(dot.ends_with("}\n"));

    let mut nodes = Vec::new();
    let mut edges = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some(results) = line.strip_prefix("return ") {
            for result in results.split(", ") {
                let (value, name) = result.split_once(' ').unwrap();
                let id = value.trim_start_matches('%');
                assert!(!id.contains('#'));
                nodes.push(format!("  {name} [shape=oval];"));
                edges.push(format!("  n{id} -> {name};"));
            }
            continue;
        }
        let Some((lhs, rhs)) = line.split_once(" = ") else {
            continue;
        };
        let id = lhs.strip_prefix('%').unwrap();
        let (op, rest) = rhs.split_once(' ').unwrap();
        nodes.push(format!("  n{id} [label=\"%{id} {op}\\n"));
        let operands = rest.split([':', '{']).next().unwrap();
        for (k, operand) in operands.split(',').map(str::trim).enumerate() {
            if operand.is_empty() {
                continue;
            }
            let operand = operand.strip_prefix('%').unwrap();
            let (src, suffix) = match operand.split_once('#') {
                Some((src, out)) => (src, format!(" #{out}")),
                None => (operand, String::new()),
            };
            edges.push(format!("  n{src} -> n{id} [label=\"{k}{suffix}\"];"));
        }
    }
    assert!(nodes.len() > 100 && edges.len() > 100);
    let dot_nodes: Vec<&str> = dot.lines().filter(|l| !l.contains(" -> ")).collect();
    let dot_edges: Vec<&str> = dot.lines().filter(|l| l.contains(" -> ")).collect();
    // Header, `node [...]` and the closing brace, plus one line per node.
    assert_eq!(dot_nodes.len(), nodes.len() + 3);
    for node in &nodes {
        assert!(
            dot_nodes.iter().any(|l| l.starts_with(node.as_str())),
            "no DOT node `{node}`"
        );
    }
    let mut want = edges.clone();
    want.sort();
    let mut got: Vec<String> = dot_edges.iter().map(|l| l.to_string()).collect();
    got.sort();
    assert_eq!(got, want);
}

/// The default (summary) form of a deep model prints each distinct layer kind once, plus an op
/// histogram whose counts are those of the full graph.
#[test]
fn glm5_summary_histogram_counts_the_full_graph() {
    for opt in OPT_LEVELS {
        glm5_summary_histogram_at(opt);
    }
}

fn glm5_summary_histogram_at(opt: &str) {
    let summary = glmc_ok(&["dump", "models/glm5.ron", opt]);
    let full = glmc_ok(&["dump", "models/glm5.ron", "--full", opt]);
    assert!(
        summary.len() * 10 < full.len(),
        "{opt}: the summary is not short"
    );
    let module = parse(&full, "glm5 --full");
    for f in &module.functions {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for n in f.graph.node_weights() {
            *counts.entry(n.op.name().to_string()).or_default() += 1;
        }
        let header = format!(
            "// @{} op histogram ({} nodes):\n",
            f.name,
            f.graph.node_count()
        );
        let start = summary
            .find(&header)
            .unwrap_or_else(|| panic!("no `{}` in the summary", header.trim()))
            + header.len();
        let printed: BTreeMap<String, usize> = summary[start..]
            .lines()
            .map_while(|l| l.strip_prefix("//   "))
            .map(|l| {
                let mut it = l.split_whitespace();
                let op = it.next().unwrap().to_string();
                (op, it.next().unwrap().parse().unwrap())
            })
            .collect();
        assert_eq!(printed, counts, "{opt} @{}", f.name);
    }
    // Layer kinds: layer 0 (reads the embedding), the other dense layers, the MoE layers. Once
    // fuse-elementwise folds each residual add into the next layer's input norm, layer 3 (whose
    // norm takes a dense layer's residual) is a kind of its own, and so is prefill's layer 77,
    // whose residual add feeds `slice.last` (the last position's logits) instead of a norm.
    let moe_layers: &[(&str, usize)] =
        if opt == "-O0" {
            &[(
                "  // layers 3..=77: 75 layers identical up to the layer index; layer 3 shown\n",
                2,
            )]
        } else {
            &[
            ("  // layer 3\n", 2),
            ("  // layers 4..=77: 74 layers identical up to the layer index; layer 4 shown\n", 1),
            ("  // layers 4..=76: 73 layers identical up to the layer index; layer 4 shown\n", 1),
            ("  // layer 77\n", 1),
        ]
        };
    for (line, count) in [
        ("  // layer 0\n", 2),
        (
            "  // layers 1..=2: 2 layers identical up to the layer index; layer 1 shown\n",
            2,
        ),
    ]
    .iter()
    .chain(moe_layers)
    {
        assert_eq!(
            summary.matches(line).count(),
            *count,
            "{opt}: {line:?} in {count} phases"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Round trips

fn parse(text: &str, what: &str) -> Module {
    parse_module(text).unwrap_or_else(|e| panic!("{what}: the dump does not parse: {e}"))
}

/// `glmc dump --full` parses back to a module that verifies and prints to the same text.
#[test]
fn full_text_dump_round_trips() {
    for config in shipped_configs() {
        for opt in OPT_LEVELS {
            let config = config.to_str().unwrap();
            let what = format!("{config} {opt}");
            let text = glmc_ok(&["dump", config, "--full", opt]);
            let module = parse(&text, &what);
            verify_module(&module).unwrap_or_else(|e| panic!("{what}: {e}"));
            let again = print_module(&module);
            assert!(again == text, "{what}: {}", first_difference(&text, &again));
        }
    }
}

/// `glmc dump --format ron` reads back with `serial::from_ron`, writes the same RON, and is the
/// same module as the text dump.
#[test]
fn ron_dump_round_trips() {
    for config in shipped_configs() {
        for opt in OPT_LEVELS {
            let config = config.to_str().unwrap();
            let what = format!("{config} {opt}");
            let ron = glmc_ok(&["dump", config, "--format", "ron", opt]);
            let module = serial::from_ron(&ron).unwrap_or_else(|e| panic!("{what}: {e}"));
            let again = serial::to_ron(&module).unwrap();
            assert!(again == ron, "{what}: {}", first_difference(&ron, &again));
            let text = glmc_ok(&["dump", config, "--full", opt]);
            let printed = print_module(&module);
            assert!(
                printed == text,
                "{what}: RON and text dumps differ: {}",
                first_difference(&text, &printed)
            );
        }
    }
}

fn first_difference(a: &str, b: &str) -> String {
    for (i, (la, lb)) in a.lines().zip(b.lines()).enumerate() {
        if la != lb {
            return format!("line {}:\n  dump:    {la}\n  printed: {lb}", i + 1);
        }
    }
    format!(
        "one is a prefix of the other ({} vs {} lines)",
        a.lines().count(),
        b.lines().count()
    )
}

/// A closed stdout (`glmc dump … | head`) ends the dump quietly, without a panic.
#[test]
fn dump_into_a_closed_pipe_does_not_panic() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_glmc"))
        .args(["dump", "models/glm5.ron", "--full"])
        .current_dir(common::repo())
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read a little (so the dump has started), then hang up; the dump is ~1 MB, far more than a
    // pipe buffers.
    let mut stdout = child.stdout.take().unwrap();
    let mut start = [0u8; 64];
    stdout.read_exact(&mut start).unwrap();
    drop(stdout);
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    common::assert_no_panic(&stderr, "glmc dump | head");
    assert!(status.success(), "{status:?}: {stderr}");
    assert_eq!(stderr, "");
}

// ---------------------------------------------------------------------------------------------
// Weight names and shapes

/// Checkpoint tensors (HF name → shape) the graph's weight recipes read, with `{e}` expanded.
/// Asserts both phases read the same tensors with the same shapes.
fn weights_of(module: &Module) -> BTreeMap<String, Vec<u64>> {
    fn leaves(recipe: &Recipe, out: &mut BTreeMap<String, Vec<u64>>) {
        let mut add = |name: String, shape: Vec<u64>| {
            if let Some(old) = out.insert(name.clone(), shape.clone()) {
                assert_eq!(old, shape, "{name} is read with two shapes");
            }
        };
        match recipe {
            Recipe::Tensor { name, shape } => add(name.clone(), shape.clone()),
            Recipe::Stack {
                pattern,
                count,
                shape,
            } => {
                assert!(pattern.contains("{e}"), "{pattern}");
                for e in 0..*count {
                    add(pattern.replace("{e}", &e.to_string()), shape.clone());
                }
            }
            Recipe::Slice { src, .. }
            | Recipe::Reshape { src, .. }
            | Recipe::Transpose { src, .. } => leaves(src, out),
            Recipe::Concat { parts, .. } => parts.iter().for_each(|p| leaves(p, out)),
        }
    }
    let mut per_function = module.functions.iter().map(|f| {
        let mut out = BTreeMap::new();
        for node in f.graph.node_weights() {
            if let Op::Weight { recipe } = &node.op {
                leaves(recipe, &mut out);
            }
        }
        (f.name.clone(), out)
    });
    let (first_name, first) = per_function.next().expect("a function");
    for (name, other) in per_function {
        assert!(
            other == first,
            "@{name} and @{first_name} read different tensors"
        );
    }
    first
}

/// The dimensions the tensor table of GLM5-SPEC §2.1 is written in.
struct Dims {
    vocab: u64,
    hidden: u64,
    layers: usize,
    dense_layers: usize,
    heads: u64,
    q_lora: u64,
    kv_lora: u64,
    nope: u64,
    rope: u64,
    v: u64,
    inter: u64,
    /// `None`: no indexer; else per layer whether it has its own indexer ("full").
    indexer: Option<(u64, u64, Vec<bool>)>,
    experts: u64,
    shared_experts: u64,
    moe_inter: u64,
}

/// The tensors GLM5-SPEC §2.1 lists for a model of these dimensions (without the MTP layer).
fn spec_weights(d: &Dims) -> BTreeMap<String, Vec<u64>> {
    let mut w = BTreeMap::new();
    let mut add = |name: String, shape: &[u64]| {
        assert!(w.insert(name, shape.to_vec()).is_none());
    };
    add("model.embed_tokens.weight".into(), &[d.vocab, d.hidden]);
    add("model.norm.weight".into(), &[d.hidden]);
    add("lm_head.weight".into(), &[d.vocab, d.hidden]);
    for n in 0..d.layers {
        let l = format!("model.layers.{n}");
        add(format!("{l}.input_layernorm.weight"), &[d.hidden]);
        add(format!("{l}.post_attention_layernorm.weight"), &[d.hidden]);
        let a = format!("{l}.self_attn");
        add(format!("{a}.q_a_proj.weight"), &[d.q_lora, d.hidden]);
        add(format!("{a}.q_a_layernorm.weight"), &[d.q_lora]);
        add(
            format!("{a}.q_b_proj.weight"),
            &[d.heads * (d.nope + d.rope), d.q_lora],
        );
        add(
            format!("{a}.kv_a_proj_with_mqa.weight"),
            &[d.kv_lora + d.rope, d.hidden],
        );
        add(format!("{a}.kv_a_layernorm.weight"), &[d.kv_lora]);
        add(
            format!("{a}.kv_b_proj.weight"),
            &[d.heads * (d.nope + d.v), d.kv_lora],
        );
        add(format!("{a}.o_proj.weight"), &[d.hidden, d.heads * d.v]);
        if let Some((ih, id, full)) = &d.indexer {
            if full[n] {
                let i = format!("{a}.indexer");
                add(format!("{i}.wq_b.weight"), &[ih * id, d.q_lora]);
                add(format!("{i}.wk.weight"), &[*id, d.hidden]);
                add(format!("{i}.k_norm.weight"), &[*id]);
                add(format!("{i}.k_norm.bias"), &[*id]);
                add(format!("{i}.weights_proj.weight"), &[*ih, d.hidden]);
            }
        }
        let m = format!("{l}.mlp");
        if n < d.dense_layers {
            add(format!("{m}.gate_proj.weight"), &[d.inter, d.hidden]);
            add(format!("{m}.up_proj.weight"), &[d.inter, d.hidden]);
            add(format!("{m}.down_proj.weight"), &[d.hidden, d.inter]);
        } else {
            add(format!("{m}.gate.weight"), &[d.experts, d.hidden]);
            add(format!("{m}.gate.e_score_correction_bias"), &[d.experts]);
            for e in 0..d.experts {
                let x = format!("{m}.experts.{e}");
                add(format!("{x}.gate_proj.weight"), &[d.moe_inter, d.hidden]);
                add(format!("{x}.up_proj.weight"), &[d.moe_inter, d.hidden]);
                add(format!("{x}.down_proj.weight"), &[d.hidden, d.moe_inter]);
            }
            let s = d.shared_experts * d.moe_inter;
            add(
                format!("{m}.shared_experts.gate_proj.weight"),
                &[s, d.hidden],
            );
            add(format!("{m}.shared_experts.up_proj.weight"), &[s, d.hidden]);
            add(
                format!("{m}.shared_experts.down_proj.weight"),
                &[d.hidden, s],
            );
        }
    }
    w
}

fn assert_same_weights(
    what: &str,
    graph: &BTreeMap<String, Vec<u64>>,
    expected: &BTreeMap<String, Vec<u64>>,
) {
    let missing: Vec<_> = expected
        .keys()
        .filter(|k| !graph.contains_key(*k))
        .collect();
    let extra: Vec<_> = graph
        .keys()
        .filter(|k| !expected.contains_key(*k))
        .collect();
    let wrong: Vec<_> = graph
        .iter()
        .filter(|(k, s)| expected.get(*k).is_some_and(|e| e != *s))
        .map(|(k, s)| format!("{k}: graph {s:?}, expected {:?}", expected[k]))
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty() && wrong.is_empty(),
        "{what}: tensors the graph does not read: {missing:?}\n\
         tensors the graph reads that should not exist: {extra:?}\nwrong shapes: {wrong:#?}"
    );
}

/// GLM-5's graph reads exactly the tensors of GLM5-SPEC §2.1 (layers 0..77), with those shapes.
#[test]
fn glm5_weights_are_the_spec_tensor_table() {
    let expected = spec_weights(&Dims {
        vocab: 154880,
        hidden: 6144,
        layers: 78,
        dense_layers: 3,
        heads: 64,
        q_lora: 2048,
        kv_lora: 512,
        nope: 192,
        rope: 64,
        v: 256,
        inter: 12288,
        indexer: Some((32, 128, vec![true; 78])),
        experts: 256,
        shared_experts: 1,
        moe_inter: 2048,
    });
    // Spot checks of the table itself (GLM5-SPEC §2.1), so a typo above cannot hide a bug.
    for (name, shape) in [
        (
            "model.layers.5.self_attn.q_b_proj.weight",
            vec![16384, 2048],
        ),
        (
            "model.layers.5.self_attn.kv_b_proj.weight",
            vec![28672, 512],
        ),
        ("model.layers.5.self_attn.o_proj.weight", vec![6144, 16384]),
        (
            "model.layers.5.self_attn.indexer.wq_b.weight",
            vec![4096, 2048],
        ),
        (
            "model.layers.77.mlp.experts.255.down_proj.weight",
            vec![6144, 2048],
        ),
    ] {
        assert_eq!(expected[name], shape, "{name}");
    }
    for opt in OPT_LEVELS {
        let module = parse(&glmc_ok(&["dump", "models/glm5.ron", "--full", opt]), opt);
        assert_same_weights(&format!("glm5 {opt}"), &weights_of(&module), &expected);
    }
}

/// tiny-sparse: a "shared" indexer layer (2) ships no indexer weights; layer 0 is dense.
#[test]
fn tiny_sparse_weights_are_the_spec_tensor_table() {
    let expected = spec_weights(&Dims {
        vocab: 256,
        hidden: 64,
        layers: 4,
        dense_layers: 1,
        heads: 2,
        q_lora: 32,
        kv_lora: 16,
        nope: 8,
        rope: 8,
        v: 16,
        inter: 96,
        indexer: Some((2, 16, vec![true, true, false, true])),
        experts: 8,
        shared_experts: 1,
        moe_inter: 16,
    });
    for opt in OPT_LEVELS {
        let module = parse(
            &glmc_ok(&["dump", "models/tiny-sparse.ron", "--full", opt]),
            opt,
        );
        assert_same_weights(
            &format!("tiny-sparse {opt}"),
            &weights_of(&module),
            &expected,
        );
    }
}

/// The names and shapes in a safetensors file's header (8-byte little-endian length, then JSON).
fn safetensors_header(path: &Path) -> BTreeMap<String, Vec<u64>> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
    header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.as_str() != "__metadata__")
        .map(|(k, v)| {
            let shape = v["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .collect();
            (k.clone(), shape)
        })
        .collect()
}

/// For every transformers-written fixture (tests/oracle/fixtures/<case>/), `glmc dump <dir>`
/// works and its graph reads exactly the tensors in `model.safetensors`, with their shapes.
#[test]
fn oracle_fixtures_name_exactly_their_checkpoint_tensors() {
    let root = repo_path("tests/oracle/fixtures");
    let mut cases: Vec<_> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .collect();
    cases.sort();
    assert!(
        cases.len() >= 6,
        "{} holds {} fixtures",
        root.display(),
        cases.len()
    );
    for case in cases {
        let dir = case.to_str().unwrap();
        let file = safetensors_header(&case.join("model.safetensors"));
        assert!(file.len() > 50, "{dir}: only {} tensors", file.len());
        for opt in OPT_LEVELS {
            let what = format!("{dir} {opt}");
            let module = parse(&glmc_ok(&["dump", dir, "--full", opt]), &what);
            assert_same_weights(&what, &weights_of(&module), &file);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// import-hf

/// `glmc dump` output without its first line (`glmc.module "<name>"`), which names the module
/// after the file or directory it came from.
fn without_module_line(dump: &str) -> &str {
    let (first, rest) = dump.split_once('\n').unwrap();
    assert!(first.starts_with("glmc.module \""), "{first}");
    rest
}

/// Importing GLM-5's config.json gives the graph of the shipped glm5.ron.
#[test]
fn import_hf_of_glm5_config_json_dumps_like_glm5_ron() {
    let shipped = glmc_ok(&["dump", "models/glm5.ron"]);
    let shipped_full = glmc_ok(&["dump", "models/glm5.ron", "--full"]);
    let mut jsons = vec![repo_path("tests/data/glm5-config.json")];
    if common::glm5_config_json() != jsons[0] {
        jsons.push(common::glm5_config_json());
    }
    for json in jsons {
        let tmp = tempfile::tempdir().unwrap();
        let ron = tmp.path().join("X.ron");
        let out = glmc(&[
            "import-hf",
            json.to_str().unwrap(),
            "-o",
            ron.to_str().unwrap(),
        ]);
        let what = format!("import-hf {}", json.display());
        assert_eq!(
            success(&out, &what),
            "",
            "{what}: import-hf writes nothing to stdout"
        );
        let dump = glmc_ok(&["dump", ron.to_str().unwrap()]);
        assert_eq!(
            without_module_line(&dump),
            without_module_line(&shipped),
            "{what}"
        );
        let full = glmc_ok(&["dump", ron.to_str().unwrap(), "--full"]);
        assert!(
            without_module_line(&full) == without_module_line(&shipped_full),
            "{what}: --full dumps differ"
        );

        // The same config.json as an HF checkpoint directory, compiled on the fly.
        let ckpt = tmp.path().join("GLM-5");
        std::fs::create_dir(&ckpt).unwrap();
        std::fs::copy(&json, ckpt.join("config.json")).unwrap();
        let dump = glmc_ok(&["dump", ckpt.to_str().unwrap()]);
        assert!(dump.starts_with("glmc.module \"GLM-5\"\n"), "{dump:.80}");
        assert_eq!(
            without_module_line(&dump),
            without_module_line(&shipped),
            "{what} as a checkpoint directory"
        );
    }
}
