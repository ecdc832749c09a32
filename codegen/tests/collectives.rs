//! A tensor-parallel rank's schedule: `tp-partition`'s `all_reduce`s and `all_gather` become
//! collective steps between contiguous arena tensors (NCCL's calls), the vocab-parallel lookup
//! a kernel, and nothing is left unlowered; the manifest carries the steps and the rank.

mod common;

use common::{module, LIMITS, MODELS};
use glmc_codegen::artifact::Manifest;
use glmc_codegen::layout::Buf;
use glmc_codegen::schedule::{CollectiveOp, Phase, Step};
use glmc_codegen::{lower_module, Lowered, Target};
use glmc_ir::Tp;

fn rank(model: &str, degree: u64, r: usize) -> (glmc_ir::Module, Lowered) {
    let (_, whole) = module(model);
    let m = glmc_passes::partition(&whole, degree)
        .expect("the tiny models divide by 2")
        .swap_remove(r);
    let l = lower_module(&m, Target::Sm90a, LIMITS).expect("a rank lowers");
    (m, l)
}

fn phase<'a>(l: &'a Lowered, name: &str) -> &'a Phase {
    l.phases.iter().find(|p| p.function == name).unwrap()
}

#[test]
fn every_rank_of_every_model_lowers_completely() {
    for model in MODELS {
        for r in 0..2 {
            let (_, l) = rank(model, 2, r);
            assert_eq!(
                l.missing_ops(),
                Vec::<String>::new(),
                "{model} rank {r} of 2"
            );
        }
    }
}

#[test]
fn the_collectives_are_steps_between_contiguous_arena_tensors() {
    let (m, l) = rank("tiny-sparse.ron", 2, 1);
    for p in &l.phases {
        let f = m.function(&p.function).unwrap();
        let ir: Vec<&str> = f
            .canonical_order()
            .into_iter()
            .map(|n| f.node(n))
            .filter(|n| {
                matches!(
                    n.op,
                    glmc_ir::Op::AllReduce { .. } | glmc_ir::Op::AllGather { .. }
                )
            })
            .map(|n| n.name.as_str())
            .collect();
        let steps: Vec<&str> = p.collectives().map(|c| c.node.as_str()).collect();
        assert_eq!(
            steps, ir,
            "@{}: one step per IR collective, in order",
            p.function
        );
        assert!(
            steps.contains(&"model.embed_tokens"),
            "@{}: {steps:?}",
            p.function
        );
        assert!(steps.contains(&"lm_head"), "@{}: {steps:?}", p.function);
        for c in p.collectives() {
            assert_eq!(c.ranks, 2);
            for at in [&c.input, &c.output] {
                assert!(
                    at.is_contiguous(),
                    "@{} {}: {at} is strided",
                    p.function,
                    c.node
                );
                assert_eq!(at.buf, Buf::Arena, "@{} {}: {at}", p.function, c.node);
            }
            let (i, o) = (c.input.numel(), c.output.numel());
            match c.op {
                CollectiveOp::AllReduceSum => assert_eq!(i, o, "{}", c.node),
                CollectiveOp::AllGather => assert_eq!(i.scale(2), o, "{}", c.node),
            }
        }
    }
}

#[test]
fn the_logits_gather_lands_in_scratch_and_one_copy_puts_each_rank_block_in_place() {
    let (_, l) = rank("tiny-sparse.ron", 2, 0);
    let decode = phase(&l, "decode");
    let at = decode
        .steps
        .iter()
        .position(|s| matches!(s, Step::Collective(c) if c.node == "lm_head"))
        .expect("the logits' all_gather");
    let Step::Collective(gather) = &decode.steps[at] else {
        unreachable!()
    };
    assert_eq!(gather.op, CollectiveOp::AllGather);
    let Step::Launch(copy) = &decode.steps[at + 1] else {
        panic!(
            "the gather is followed by its copy: {:?}",
            decode.steps[at + 1]
        );
    };
    assert_eq!((copy.op.as_str(), copy.node.as_str()), ("copy", "lm_head"));
    let logits = &decode
        .results
        .iter()
        .find(|(n, _)| n == "logits")
        .expect("a logits result")
        .1;
    assert_eq!(
        copy.outputs,
        vec![logits.clone()],
        "the copy writes the logits"
    );
    // The gather's rank-major buffer is [ranks, rows, vocab / ranks].
    assert_eq!(gather.output.shape.len(), 3);
    assert_eq!(gather.output.shape[0].as_const(), Some(2));
    assert_eq!(
        gather.output.shape[2].scale(2),
        logits.shape[1],
        "each rank holds half the vocabulary"
    );
}

#[test]
fn the_vocab_parallel_lookup_is_a_kernel_given_its_first_row() {
    let (m, l) = rank("tiny-sparse.ron", 2, 1);
    let prefill = phase(&l, "prefill");
    let lookup = prefill
        .launches()
        .find(|l| l.op == "embed.shard")
        .expect("embed.shard launches a kernel");
    let start = lookup
        .args
        .iter()
        .find(|a| a.name == "start")
        .expect("a start argument");
    let vocab = m.functions[0]
        .graph
        .node_indices()
        .find_map(|n| match m.functions[0].node(n).op {
            glmc_ir::Op::EmbedShard { start } => Some(start),
            _ => None,
        })
        .expect("rank 1 has embed.shard");
    assert!(vocab > 0, "rank 1's block starts past row 0");
    assert_eq!(
        start.value,
        glmc_codegen::schedule::ArgValue::Int(glmc_codegen::expr::Poly::constant(vocab as i64))
    );
    // Both ranks run one kernel: the start is an argument, not a parameter.
    let (_, l0) = rank("tiny-sparse.ron", 2, 0);
    let kernel = |l: &Lowered| {
        phase(l, "prefill")
            .launches()
            .find(|x| x.op == "embed.shard")
            .unwrap()
            .kernel
            .clone()
    };
    assert_eq!(kernel(&l0), kernel(&l));
}

#[test]
fn a_rank_manifest_names_its_rank_and_round_trips_its_collectives() {
    let (m, l) = rank("tiny-dense.ron", 2, 1);
    let manifest = Manifest::new(&m, glmc_ir::DType::F32, &l, Vec::new(), ());
    assert_eq!(manifest.tp, Tp { degree: 2, rank: 1 });
    assert!(manifest.complete);
    let text = ron::to_string(&manifest).expect("serialises");
    assert!(
        text.contains("Collective("),
        "the manifest lists its collectives"
    );
    let back: Manifest<()> = ron::from_str(&text).expect("reads back");
    assert_eq!(back.phases, manifest.phases);
    let printed = phase(&l, "decode").print(&l.kernels);
    assert!(
        printed.contains("all_reduce \"model.embed_tokens\": collective over 2 ranks"),
        "{printed}"
    );
}
