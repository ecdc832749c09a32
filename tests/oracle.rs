//! Agreement with transformers 5.17's GLM-5 (`GlmMoeDsaForCausalLM`): the committed oracle
//! fixtures of `tests/oracle/fixtures/<case>/` (see `tests/oracle/README.md`) are run through
//! `glmc run` and the library, and every token and logits row is compared with HF's.
//!
//! The reference is always the fixture (HF's float64 forward), never glmc itself; only the
//! prefill/decode consistency test compares glmc with glmc, on the fixture's tokens.

mod common_oracle;

use common_oracle::{
    default_module, glmc_run, ids_arg, row_errors, Logits, Oracle, RowErrors, TOL,
};
use std::collections::HashMap;

use glmc_ir::Module;
use glmc_runtime::trace::{read_trace, TraceEntry};
use glmc_runtime::{generate, generate_batch, Checkpoint, Generation, Generator, Sampling};

/// How closely two glmc paths over the same tokens (one prefill, prefill + decode steps, two
/// chunks) must agree: they differ only in f32 rounding order.
const SELF_TOL: f64 = 1e-5;

/// Runs `glmc run CASE --prompt-ids P --max-new-tokens N --dump-logits F` (plus `extra`) on every
/// fixture and checks the tokens and every logits row against the fixture.
///
/// The assertion is against `logits_pure64`, not the stock `logits`. Stock HF casts to float32
/// inside RMSNorm, builds the RoPE tables in float32 and runs the router and the indexer in
/// float32; that rounding depends on the CPU's float32 kernels (the same script on another x86
/// machine moved `logits` by about 1e-6 but `logits_pure64` by only 1e-14). `logits_pure64` is
/// the model's exact math, so the error against it is glmc's own error and nothing else. The
/// error against the stock logits is printed too: it can exceed the pure64 one by at most the
/// fixture's own `stock_vs_pure64` (about 2e-6 absolute, 2e-7 relative), so it stays far below
/// 1e-4 whenever the pure64 check passes.
fn check_cli_against_every_fixture(level: &str, extra: &[&str]) {
    let mut failures = Vec::new();
    let mut table = Vec::new();
    for o in Oracle::all() {
        let prompt = ids_arg(&o.prompt);
        let mut args = vec!["--prompt-ids", prompt.as_str()];
        args.extend_from_slice(extra);
        let run = glmc_run(&o.dir, o.generated.len(), &args);
        let d = &run.dump;

        let printed: Vec<u64> = run
            .stdout
            .split_whitespace()
            .map(|s| s.parse().expect("generated ids on stdout"))
            .collect();
        if d.generated != o.generated || d.tokens != o.tokens || printed != o.generated {
            failures.push(format!(
                "{}: generated {:?} (stdout {:?}), HF generated {:?}",
                o.case, d.generated, printed, o.generated
            ));
            continue;
        }
        if d.logits.rows != o.t() {
            failures.push(format!(
                "{}: dumped {} logits rows, expected T = {}",
                o.case,
                d.logits.rows,
                o.t()
            ));
            continue;
        }
        let pure = row_errors(&d.logits, &o.logits_pure64, o.t());
        let stock = row_errors(&d.logits, &o.logits, o.t());
        table.push(format!(
            "  {:<17} T={:<3} vs logits_pure64 {}   vs stock logits {}",
            o.case,
            o.t(),
            pure.summary(),
            stock.summary()
        ));
        let over = pure.rows_over(TOL);
        if !over.is_empty() {
            failures.push(format!(
                "{}: rows {over:?} differ from logits_pure64 by more than {TOL:e} ({})",
                o.case,
                pure.summary()
            ));
        }
    }
    println!(
        "glmc run {level} vs the transformers oracle (relative error per row, max|glmc-HF|/max|HF|):\n{}",
        table.join("\n")
    );
    assert!(failures.is_empty(), "{level}:\n{}", failures.join("\n"));
}

/// The same on the GPU: every fixture compiled for it and run from its artifact (`glmc run
/// --device cuda`); the fixtures are f32 models, so every kernel runs in f32 and is held to the
/// interpreter's tolerance.
#[test]
#[ignore = "gpu"]
fn cuda_matches_every_fixture() {
    check_cli_against_every_fixture("--device cuda", &["--device", "cuda"]);
}

/// Decode steps replayed from CUDA graphs (the default) compute exactly what the same steps
/// launched kernel by kernel (`--no-cuda-graphs`) do, on every fixture and on a decode that
/// crosses from one context bucket into the next: the graphs run at the context rounded up to
/// a power of two, which must not change a value.
#[test]
#[ignore = "gpu"]
fn cuda_graphs_decode_bit_for_bit_as_kernel_by_kernel() {
    for o in Oracle::all() {
        let prompt = ids_arg(&o.prompt);
        let args = ["--prompt-ids", prompt.as_str(), "--device", "cuda"];
        let graphs = glmc_run(&o.dir, o.generated.len(), &args);
        let launches = glmc_run(
            &o.dir,
            o.generated.len(),
            &[&args[..], &["--no-cuda-graphs"]].concat(),
        );
        assert_eq!(graphs.dump.generated, launches.dump.generated, "{}", o.case);
        let same = graphs.dump.logits.data == launches.dump.logits.data;
        println!(
            "  {:<17} {} logits rows from CUDA graphs vs kernel by kernel: {}",
            o.case,
            graphs.dump.logits.rows,
            if same { "bit-identical" } else { "DIFFERENT" }
        );
        assert!(same, "{}: the logits differ", o.case);
    }
    // A prompt of 2040 tokens and 16 new ones: decode crosses from the 2048 bucket into the
    // 4096 one, so a second graph is captured mid-run (tiny-sparse, random weights; its 8-key
    // top-k is sparse all along).
    let model = common_oracle::repo_root().join("models/tiny-sparse.ron");
    let prompt: Vec<String> = (0..2040)
        .map(|i| ((i * 37 + 11) % 256).to_string())
        .collect();
    let prompt = prompt.join(",");
    let args = [
        "--prompt-ids",
        prompt.as_str(),
        "--random-weights",
        "3",
        "--device",
        "cuda",
    ];
    let graphs = glmc_run(&model, 16, &args);
    let launches = glmc_run(&model, 16, &[&args[..], &["--no-cuda-graphs"]].concat());
    assert_eq!(graphs.dump.generated, launches.dump.generated);
    let same = graphs.dump.logits.data == launches.dump.logits.data;
    println!(
        "  tiny-sparse, 2040 + 16 tokens across two graph buckets: {}",
        if same { "bit-identical" } else { "DIFFERENT" }
    );
    assert!(same, "across buckets: the logits differ");
}

/// Random weights are the same model on the GPU as on the CPU: `glmc run --random-weights 7` of
/// tiny-sparse, with no checkpoint, generates the same tokens on both, and every logits row agrees
/// to the GPU's f32 tolerance.
#[test]
#[ignore = "gpu"]
fn cuda_random_weights_match_the_cpu() {
    let model = common_oracle::repo_root().join("models/tiny-sparse.ron");
    let args = ["--prompt-ids", "5,9,200,17,3,3,41", "--random-weights", "7"];
    let cpu = glmc_run(&model, 8, &args);
    let cuda = glmc_run(&model, 8, &[&args[..], &["--device", "cuda"]].concat());
    assert_eq!(cuda.dump.generated, cpu.dump.generated);
    let rows = cpu.dump.logits.rows;
    assert_eq!(cuda.dump.logits.rows, rows);
    let e = row_errors(&cuda.dump.logits, &cpu.dump.logits, rows);
    println!("random weights, --device cuda vs cpu: {}", e.summary());
    assert!(e.rows_over(TOL).is_empty(), "{}", e.summary());
}

/// How far bf16 logits may stray from the f32 run's, relative to the row's largest logit, while
/// both runs have made the same top-k picks (issue 11: bf16 rounding of a tiny random model's
/// activations; transformers itself lands 2e-2 to 1.5e-1 from its float64 logits once its picks
/// flip).
const BF16_TOL: f64 = 3e-2;

/// The first position at which a top-k decision (indexer keys, router experts) of trace `b`
/// differs from trace `a`'s, comparing every integer record the two share.
fn first_topk_difference(a: &[TraceEntry], b: &[TraceEntry]) -> Option<(usize, String)> {
    let key = |e: &TraceEntry| (e.call.clone(), e.node.clone(), e.output, e.position);
    let theirs: HashMap<_, &TraceEntry> = b.iter().map(|e| (key(e), e)).collect();
    a.iter()
        .filter(|e| e.is_topk())
        .filter_map(|e| {
            let other = theirs.get(&key(e))?;
            let same = other.first == e.first && other.l2 == e.l2 && other.shape == e.shape;
            (!same).then(|| (e.position.unwrap_or(0), e.node.clone()))
        })
        .min_by_key(|(p, _)| *p)
}

/// The `k` largest logits' tokens of a row.
fn top(row: &[f64], k: usize) -> Vec<usize> {
    let mut ids: Vec<usize> = (0..row.len()).collect();
    ids.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    ids.truncate(k);
    ids
}

/// bf16 on `device` against f32 on the same device, on every fixture. With the fixture's tokens
/// forced (one prefill over all of them), every row before the first position at which a top-k
/// pick differs between the two runs (found in their `--trace`s) stays within [`BF16_TOL`] of
/// the f32 run's. Generating greedily in bf16, a token predicted before that position may differ
/// from transformers' only the way vLLM allows logprobs to (each side's token among the other's
/// five most likely); later tokens follow from a different prefix and are not compared.
///
/// After a flip the tokens are only reported: on these tiny models one indexer flip swaps a key
/// out of a handful, and on `sparse` (first flip at position 9) the CPU interpreter's own bf16 run
/// ranks transformers' token at position 19 outside its top 8, so the top-5 rule there
/// would judge the model's size, not a kernel.
fn check_bf16_against_f32(device: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    let mut table = Vec::new();
    for o in Oracle::all() {
        let all = ids_arg(&o.tokens);
        let forced = |dtype: &str| {
            let trace = tmp.path().join(format!("{}-{dtype}.trace", o.case));
            let path = trace.to_str().unwrap().to_string();
            let run = glmc_run(
                &o.dir,
                1,
                &[
                    "--prompt-ids",
                    &all,
                    "--dtype",
                    dtype,
                    "--device",
                    device,
                    "--trace",
                    &path,
                ],
            );
            (run, read_trace(&trace).expect("the run's trace"))
        };
        let (f32_run, f32_trace) = forced("f32");
        let (bf16_run, bf16_trace) = forced("bf16");
        let flip = first_topk_difference(&f32_trace, &bf16_trace);
        let agree = flip.as_ref().map_or(o.t(), |(p, _)| *p).min(o.t());
        let e = row_errors(&bf16_run.dump.logits, &f32_run.dump.logits, o.t());
        let before = e.max_in(0..agree);
        if before.is_nan() || before > BF16_TOL {
            failures.push(format!(
                "{}: rows before the first top-k difference (position {agree}) are {before:.3e} from f32 (bound {BF16_TOL:e})",
                o.case
            ));
        }

        let prompt = ids_arg(&o.prompt);
        let generated = glmc_run(
            &o.dir,
            o.generated.len(),
            &[
                "--prompt-ids",
                &prompt,
                "--dtype",
                "bf16",
                "--device",
                device,
            ],
        );
        let tokens = &generated.dump.generated;
        let mismatch = (0..o.generated.len()).find(|&j| tokens.get(j) != o.generated.get(j));
        let tokens_text = match mismatch {
            None => "greedy tokens identical".to_string(),
            Some(j) => {
                let row = o.prompt.len() - 1 + j;
                let (ours, theirs) = (tokens[j] as usize, o.generated[j] as usize);
                let ours_in_hf = top(o.logits_pure64.row(row), 5).contains(&ours);
                let hf_in_ours = top(generated.dump.logits.row(row), 5).contains(&theirs);
                let judged = row < agree;
                if judged && !(ours_in_hf && hf_in_ours) {
                    failures.push(format!(
                        "{}: token {j} (row {row}, before any top-k difference) is {ours} (in HF's top 5: {ours_in_hf}), HF's is {theirs} (in bf16's top 5: {hf_in_ours})",
                        o.case
                    ));
                }
                format!(
                    "first token difference at {j} (row {row}, {} the first top-k difference): bf16's in HF's top 5: {ours_in_hf}, HF's in bf16's top 5: {hf_in_ours}",
                    if judged { "before" } else { "after" }
                )
            }
        };
        table.push(format!(
            "  {:<17} first top-k difference: {:<40} rows before it: max {before:.3e}; {tokens_text}",
            o.case,
            flip.map_or("none".to_string(), |(p, node)| format!("position {p} ({node})")),
        ));
    }
    println!(
        "bf16 vs f32 on {device} (relative error per row before the first top-k difference):\n{}",
        table.join("\n")
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn bf16_on_the_cpu_follows_f32_until_a_top_k_pick_differs() {
    check_bf16_against_f32("cpu");
}

#[test]
#[ignore = "gpu"]
fn cuda_bf16_follows_f32_until_a_top_k_pick_differs() {
    check_bf16_against_f32("cuda");
}

#[test]
fn cli_o1_matches_every_fixture() {
    check_cli_against_every_fixture("-O1", &[]);
}

#[test]
fn cli_o0_matches_every_fixture() {
    check_cli_against_every_fixture("-O0", &["-O0"]);
}

/// `--attention dense` on `dense-equivalent` (index_topk 64 > T = 26): every row keeps all its
/// causal keys, so dense attention is exactly the model; no warning that the outputs differ
/// either (the unread indexer tensors are still listed, see tests/checkpoint_check.rs).
#[test]
fn dense_attention_on_dense_equivalent_matches() {
    let o = Oracle::case("dense-equivalent");
    assert!(o.t() <= o.index_topk(), "the case must fit in index_topk");
    let run = glmc_run(
        &o.dir,
        o.generated.len(),
        &["--prompt-ids", &ids_arg(&o.prompt), "--attention", "dense"],
    );
    assert!(
        !run.stderr.contains("outputs differ"),
        "no outputs-differ warning expected while the context fits index_topk:\n{}",
        run.stderr
    );
    assert_eq!(run.dump.generated, o.generated, "generated tokens");
    let e = row_errors(&run.dump.logits, &o.logits_pure64, o.t());
    println!(
        "dense-equivalent --attention dense vs logits_pure64: {}",
        e.summary()
    );
    assert!(
        e.rows_over(TOL).is_empty(),
        "--attention dense on dense-equivalent: {}",
        e.summary()
    );
}

/// The text path: `--prompt TEXT` through the fixture's tokenizer.json, the decoded continuation
/// on stdout, and the ids HF produced for the same text.
#[test]
fn text_prompt_matches_sparse_fixture() {
    let o = Oracle::case("sparse");
    let text = o.text();
    let run = glmc_run(
        &o.dir,
        text.generated.len(),
        &["--prompt", &text.prompt_text],
    );
    let d = &run.dump;
    assert_eq!(
        d.tokens[..d.tokens.len() - d.generated.len()],
        text.prompt[..],
        "the prompt's ids (tokenizer.json)"
    );
    assert_eq!(d.generated, text.generated, "the continuation's ids");
    assert_eq!(d.tokens, text.tokens, "prompt then continuation");
    assert_eq!(
        run.stdout.trim_end_matches('\n'),
        text.generated_text,
        "the decoded continuation on stdout"
    );
    let e = row_errors(&d.logits, &text.logits_pure64, text.tokens.len());
    println!(
        "sparse text prompt (T={}) vs text_logits_pure64: {}",
        text.tokens.len(),
        e.summary()
    );
    assert!(e.rows_over(TOL).is_empty(), "text logits: {}", e.summary());
}

fn greedy() -> Sampling {
    Sampling {
        temperature: 0.0,
        top_p: 1.0,
        seed: 0,
    }
}

fn no_trace() -> impl FnMut(
    glmc_runtime::Call,
    usize,
    &glmc_ir::Node,
    &[&glmc_runtime::Tensor],
) -> Result<(), glmc_runtime::GenerateError>
       + Send {
    |_, _, _, _| Ok(())
}

fn assert_close(what: &str, e: &RowErrors, tol: f64) {
    assert!(
        e.rows_over(tol).is_empty(),
        "{what}: rows {:?} over {tol:e} ({})",
        e.rows_over(tol),
        e.summary()
    );
}

/// Through the library, on every fixture's tokens: one prefill of all T tokens, `generate` (a
/// prefill of the prompt, then one decode step per token through the caches) and a prefill in
/// two chunks give the same logits rows; `generate` also reproduces HF's tokens.
#[test]
fn prefill_decode_and_chunked_prefill_agree() {
    check_consistency("library (interpreter)", |_, module, weights| {
        Generator::new(module, weights).expect("a generator")
    });
}

/// The same on the GPU: the compiled prefill and decode schedules, the caches they share, and a
/// prefill that starts after an earlier chunk, against one prefill of everything.
#[test]
#[ignore = "gpu"]
fn cuda_prefill_decode_and_chunked_prefill_agree() {
    check_consistency("library (cuda)", |o, module, weights| {
        common_oracle::cuda_generator(&o.dir, module, weights, o.t() as u64, o.t() as u64 + 1)
    });
}

/// A batch of sequences of different lengths, prefilled into cache slots of their own and
/// decoded together (one decode call per step, each row at its own position, one sequence
/// stopping early on an EOS id while a higher slot decodes on), gives each sequence what it gets
/// alone.
#[test]
fn a_batch_decodes_each_sequence_as_alone() {
    check_batch_consistency("library (interpreter)", |_, module, weights, _| {
        Generator::new(module, weights).expect("a generator")
    });
}

/// The same on the GPU: prefills into slots other than 0 and decode rows over several slots.
#[test]
#[ignore = "gpu"]
fn cuda_a_batch_decodes_each_sequence_as_alone() {
    check_batch_consistency("library (cuda)", |o, module, weights, batch| {
        common_oracle::cuda_batch_generator(
            &o.dir,
            module,
            weights,
            o.t() as u64,
            o.t() as u64 + BATCH_NEW as u64 + 1,
            batch,
        )
    });
}

/// Tokens each sequence of the batch test generates at most.
const BATCH_NEW: usize = 4;

/// On every fixture: prompts of three lengths, generated as a batch through a generator `make`
/// gives (with caches for the batch) and each alone through a fresh one. The middle sequence
/// stops early: the EOS list is one of its generated tokens (after the first) that the last
/// sequence never makes, so it sits idle below the last slot. Each sequence's logits rows must match its batch of one to [`SELF_TOL`] (the measure
/// of [`check_consistency`]) up to the first generated token that differs, and on the
/// interpreter no token may differ.
fn check_batch_consistency(
    what: &str,
    make: impl for<'m> Fn(&Oracle, &'m Module, &'m Checkpoint, u64) -> Generator<'m>,
) {
    let mut table = Vec::new();
    for o in Oracle::all() {
        let module = default_module(&o.dir);
        let weights = common_oracle::checkpoint(&o.dir);
        let t = o.t();
        let prompts = vec![
            o.tokens.clone(),
            o.tokens[t / 2..].to_vec(),
            o.prompt.clone(),
        ];
        let alone = |eos: &[u64]| -> Vec<Generation> {
            prompts
                .iter()
                .map(|p| {
                    let mut g = make(&o, &module, &weights, 1);
                    generate(&mut g, p, BATCH_NEW, &greedy(), eos, &mut no_trace())
                        .expect("generate")
                })
                .collect()
        };
        // The middle sequence's first token after its first that the last never makes.
        let free = alone(&[]);
        let eos = free[1].generated[1..]
            .iter()
            .find(|id| !free[2].generated.contains(id))
            .map(|&id| vec![id])
            .unwrap_or_else(|| panic!("{}: no token stops the middle sequence alone", o.case));
        let singles = alone(&eos);
        let mut g = make(&o, &module, &weights, prompts.len() as u64);
        let batch = generate_batch(
            &mut g,
            &prompts,
            BATCH_NEW,
            &greedy(),
            &eos,
            &mut no_trace(),
        )
        .expect("generate_batch");
        assert!(
            singles[1].generated.len() < singles[2].generated.len(),
            "{}: the middle sequence stops before the last ({:?}, {:?})",
            o.case,
            singles[1].generated,
            singles[2].generated
        );
        let mut line = format!("  {:<17}", o.case);
        for (i, (b, s)) in batch.iter().zip(&singles).enumerate() {
            // Rows after a differing token are of different sequences.
            let same = b
                .tokens
                .iter()
                .zip(&s.tokens)
                .take_while(|(x, y)| x == y)
                .count();
            if what.contains("interpreter") {
                assert_eq!(b.tokens, s.tokens, "{} sequence {i}: tokens", o.case);
            }
            let rows = same.saturating_sub(b.logits_from).min(b.logits.len());
            let e = row_errors(
                &Logits::from_rows(&b.logits),
                &Logits::from_rows(&s.logits),
                rows,
            );
            line += &format!(
                "  seq {i} ({}+{} tokens) {}",
                prompts[i].len(),
                b.generated.len(),
                e.summary()
            );
            assert_close(&format!("{} sequence {i} of t={t}", o.case), &e, SELF_TOL);
        }
        table.push(line);
    }
    println!(
        "{what} batch vs alone (relative error per row):\n{}",
        table.join("\n")
    );
}

/// One prefill of the fixture's tokens, prefill + greedy decode steps, and two prefill chunks
/// give the same logits (to [`SELF_TOL`]) through generators made by `make`, and the one prefill
/// is the fixture's.
fn check_consistency(
    what: &str,
    make: impl for<'m> Fn(&Oracle, &'m Module, &'m Checkpoint) -> Generator<'m>,
) {
    let mut table = Vec::new();
    for o in Oracle::all() {
        let module = default_module(&o.dir);
        let weights = common_oracle::checkpoint(&o.dir);
        let t = o.t();

        let mut g = make(&o, &module, &weights);
        let full = g
            .prefill(&o.tokens, &greedy(), &mut no_trace())
            .expect("prefill");
        let full = Logits::from_rows(&full.logits);

        let mut g = make(&o, &module, &weights);
        let gen = generate(
            &mut g,
            &o.prompt,
            o.generated.len(),
            &greedy(),
            &[],
            &mut no_trace(),
        )
        .expect("generate");
        assert_eq!(gen.generated, o.generated, "{}: generated tokens", o.case);
        assert_eq!(gen.tokens, o.tokens, "{}: tokens", o.case);
        let stepped = Logits::from_rows(&gen.logits);

        // Split so that the second chunk starts inside the prompt and runs past index_topk
        // (sparse rows whose keys partly come from the first chunk's cache).
        let split = (t / 2).max(1);
        let mut g = make(&o, &module, &weights);
        let mut rows = g
            .prefill(&o.tokens[..split], &greedy(), &mut no_trace())
            .expect("first chunk")
            .logits;
        rows.extend(
            g.prefill(&o.tokens[split..], &greedy(), &mut no_trace())
                .expect("second chunk")
                .logits,
        );
        assert_eq!(g.len(), t);
        let chunked = Logits::from_rows(&rows);

        let decode = row_errors(&stepped, &full, t);
        let chunks = row_errors(&chunked, &full, t);
        table.push(format!(
            "  {:<17} prefill+decode vs one prefill {}   two chunks ({split}+{}) vs one prefill {}",
            o.case,
            decode.summary(),
            t - split,
            chunks.summary()
        ));
        assert_close(&format!("{}: prefill+decode", o.case), &decode, SELF_TOL);
        assert_close(&format!("{}: chunked prefill", o.case), &chunks, SELF_TOL);
        // And the one-prefill rows are the model's (the fixture's full forward).
        let e = row_errors(&full, &o.logits_pure64, t);
        assert_close(&format!("{}: prefill vs logits_pure64", o.case), &e, TOL);
    }
    println!(
        "{what} consistency (relative error per row):\n{}",
        table.join("\n")
    );
}
