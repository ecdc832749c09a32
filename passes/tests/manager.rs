//! The `PassManager`: verification after every pass (a broken pass is named), the pipeline's
//! options (`--disable-pass`, `-O0`), `dump_after` by whole pass name, and the records.

mod support;

use glmc_ir::{print_module, Dim, Module, Op};
use glmc_passes::manager::full_match;
use glmc_passes::{pipeline, Pass, PassError, PassManager, PipelineOptions, PIPELINE};
use regex::Regex;
use support::*;

fn tiny_sparse() -> Module {
    build(&shipped("tiny-sparse.ron"))
}

/// A deliberately broken pass: declares the logits one column wider than the GEMM makes them.
struct WidenLogits;

impl Pass for WidenLogits {
    fn name(&self) -> &'static str {
        "test-widen-logits"
    }

    fn run(&self, module: &mut Module) -> Result<bool, PassError> {
        let f = module.function_mut("decode").expect("a decode function");
        let n = f.find("lm_head").expect("the lm_head GEMM");
        let shape = &mut f.graph[n].outputs[0].shape;
        let last = shape.last_mut().expect("a rank-2 output");
        *last = Dim::Const(last.as_const().expect("constant vocab") + 1);
        Ok(true)
    }
}

/// Another: drops an operand of an op (the positions of the first rope it finds).
struct DropOperand;

impl Pass for DropOperand {
    fn name(&self) -> &'static str {
        "test-drop-operand"
    }

    fn run(&self, module: &mut Module) -> Result<bool, PassError> {
        let f = module.function_mut("prefill").expect("a prefill function");
        let rope = f
            .graph
            .node_indices()
            .find(|&n| matches!(f.node(n).op, Op::Rope { .. }))
            .expect("a rope");
        let edge = f
            .graph
            .edges_directed(rope, petgraph::Direction::Incoming)
            .find(|e| e.weight().index == 1)
            .map(|e| petgraph::visit::EdgeRef::id(&e))
            .expect("a positions operand");
        f.graph.remove_edge(edge);
        Ok(true)
    }
}

/// Changes nothing, and says so.
struct Nothing;

impl Pass for Nothing {
    fn name(&self) -> &'static str {
        "test-nothing"
    }

    fn run(&self, _: &mut Module) -> Result<bool, PassError> {
        Ok(false)
    }
}

/// Renames the module: a change that keeps the module valid.
struct Rename;

impl Pass for Rename {
    fn name(&self) -> &'static str {
        "test-rename"
    }

    fn run(&self, module: &mut Module) -> Result<bool, PassError> {
        module.name.push_str("_renamed");
        Ok(true)
    }
}

#[test]
fn a_pass_that_breaks_the_graph_is_named_by_the_verifier() {
    for (pass, node) in [
        (Box::new(WidenLogits) as Box<dyn Pass>, "lm_head"),
        (Box::new(DropOperand), "rope"),
    ] {
        let name = pass.name();
        let mut pm = PassManager::new();
        pm.add(glmc_passes::fuse_mla_projections::FuseMlaProjections);
        // The manager takes passes by value; box the test pass behind a forwarding pass.
        pm.add(Forward(pass));
        pm.add(Nothing);
        let mut m = tiny_sparse();
        let err = pm
            .run(&mut m)
            .expect_err("the broken graph must not verify");
        match &err {
            PassError::Verify { pass, .. } => assert_eq!(*pass, name),
            other => panic!("expected a verification error, got {other:?}"),
        }
        let text = err.to_string();
        assert!(
            text.contains(&format!("after pass `{name}`")) && text.contains("no longer verifies"),
            "{text}"
        );
        assert!(text.contains(node), "the error names the node: {text}");
    }
}

/// Adapts a boxed pass to `PassManager::add`, which takes `impl Pass`.
struct Forward(Box<dyn Pass>);

impl Pass for Forward {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn run(&self, module: &mut Module) -> Result<bool, PassError> {
        self.0.run(module)
    }
}

#[test]
fn records_say_changed_or_unchanged_in_order() {
    let mut pm = PassManager::new();
    pm.add(Nothing);
    pm.add(Rename);
    pm.add(Nothing);
    let mut m = tiny_sparse();
    let records = pm.run(&mut m).unwrap();
    let got: Vec<(&str, bool)> = records.iter().map(|r| (r.name, r.changed)).collect();
    assert_eq!(
        got,
        [
            ("test-nothing", false),
            ("test-rename", true),
            ("test-nothing", false)
        ]
    );
    assert_eq!(m.name, "tiny_sparse_renamed");

    // The real pipeline on tiny-sparse: the three MLA passes all rewrite it.
    let mut m = tiny_sparse();
    let records = pipeline(&PipelineOptions::default())
        .unwrap()
        .run(&mut m)
        .unwrap();
    let names: Vec<&str> = records.iter().map(|r| r.name).collect();
    assert_eq!(names, PIPELINE);
    for name in ["fuse-mla-projections", "select-attention", "absorb-mla"] {
        let r = records.iter().find(|r| r.name == name).unwrap();
        assert!(r.changed, "{name} changes tiny-sparse");
    }
    // Nothing asked for a dump, so none was kept.
    assert!(records.iter().all(|r| r.snapshot.is_none()));
}

#[test]
fn disabling_an_unknown_pass_is_an_error_that_lists_the_passes() {
    let err = match pipeline(&PipelineOptions {
        disabled: vec!["absorb".into()],
        ..Default::default()
    }) {
        Err(e) => e,
        Ok(pm) => panic!("accepted --disable-pass absorb: {:?}", pm.names()),
    };
    assert!(matches!(err, PassError::Options { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("--disable-pass absorb"), "{text}");
    assert!(text.contains("no such pass"), "{text}");
    for name in PIPELINE {
        assert!(text.contains(name), "{name} missing from: {text}");
    }
    // Case and partial names are not guessed.
    for bad in ["CSE", "dce ", "mla", ""] {
        assert!(
            pipeline(&PipelineOptions {
                disabled: vec![bad.into()],
                ..Default::default()
            })
            .is_err(),
            "{bad:?} accepted"
        );
    }
}

#[test]
fn disabling_passes_and_no_optimization() {
    for name in PIPELINE {
        let pm = pipeline(&PipelineOptions {
            disabled: vec![name.into()],
            ..Default::default()
        })
        .unwrap();
        let expected: Vec<&str> = PIPELINE.iter().copied().filter(|p| *p != name).collect();
        assert_eq!(pm.names(), expected);
    }
    // Without absorb-mla, decode keeps the expanded attention.
    let pm = pipeline(&PipelineOptions {
        disabled: vec!["absorb-mla".into()],
        ..Default::default()
    })
    .unwrap();
    let mut m = tiny_sparse();
    pm.run(&mut m).unwrap();
    let decode = m.function("decode").unwrap();
    assert!(decode
        .graph
        .node_weights()
        .all(|n| !matches!(n.op, Op::MlaAttendAbsorbed { .. })));
    // -O0 keeps only select-attention: it decides what is computed, not how fast.
    let pm = pipeline(&PipelineOptions {
        no_optimization: true,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(pm.names(), ["select-attention"]);
}

#[test]
fn dump_after_matches_whole_pass_names() {
    let pm = |pattern: &str| {
        let mut pm = pipeline(&PipelineOptions::default()).unwrap();
        pm.dump_after(Regex::new(pattern).unwrap());
        pm
    };
    let selected = |pattern: &str| -> Vec<&'static str> {
        let pm = pm(pattern);
        PIPELINE.iter().copied().filter(|p| pm.dumps(p)).collect()
    };
    // A part of a name selects nothing.
    assert_eq!(selected("mla"), Vec::<&str>::new());
    assert_eq!(selected("absorb"), Vec::<&str>::new());
    assert_eq!(selected("ce"), Vec::<&str>::new());
    assert_eq!(selected("absorb-ml"), Vec::<&str>::new());
    // Whole names, alternations, wildcards.
    assert_eq!(selected("cse"), ["cse"]);
    assert_eq!(selected("absorb-mla|dce"), ["absorb-mla", "dce"]);
    assert_eq!(selected(".*mla.*"), ["fuse-mla-projections", "absorb-mla"]);
    assert_eq!(selected(".*"), PIPELINE);
    // An alternative that is a prefix of the name must not hide one that is the whole name.
    assert_eq!(selected("absorb|absorb-mla"), ["absorb-mla"]);
    assert_eq!(selected("c|cs|cse"), ["cse"]);
    assert!(full_match(&Regex::new("a|ab").unwrap(), "ab"));
    assert!(!full_match(&Regex::new("a|ab").unwrap(), "abc"));

    // Records keep the module after each selected pass that changed it, and only those.
    let module = tiny_sparse();
    let mut m = module.clone();
    let records = pm("select-attention|absorb-mla|test-none")
        .run(&mut m)
        .unwrap();
    let stages = stages(&module, glmc_passes::AttentionChoice::Auto);
    for r in &records {
        let wanted = r.name == "select-attention" || r.name == "absorb-mla";
        assert_eq!(r.snapshot.is_some(), wanted && r.changed, "{}", r.name);
        if let Some(snapshot) = &r.snapshot {
            let stage = &stages.iter().find(|(p, _, _)| *p == r.name).unwrap().1;
            assert_eq!(print_module(snapshot), print_module(stage), "{}", r.name);
        }
    }
    // A selected pass that changed nothing keeps no dump.
    let mut pm = PassManager::new();
    pm.add(Nothing).add(Rename);
    pm.dump_after(Regex::new("test-.*").unwrap());
    let records = pm.run(&mut tiny_sparse()).unwrap();
    assert!(records[0].snapshot.is_none());
    assert_eq!(
        records[1].snapshot.as_ref().map(|m| m.name.as_str()),
        Some("tiny_sparse_renamed")
    );
}
