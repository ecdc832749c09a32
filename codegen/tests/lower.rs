//! The lowering: what becomes a launch, a view or a copy, and where it lives in the arena.

mod common;

use common::{lowered, module, LIMITS, MODELS};
use glmc_codegen::layout::Buf;
use glmc_codegen::schedule::{ArgValue, Phase, Step};
use glmc_codegen::{lower_module, Target};

fn phase<'a>(l: &'a glmc_codegen::Lowered, name: &str) -> &'a Phase {
    l.phases.iter().find(|p| p.function == name).unwrap()
}

#[test]
fn slices_and_reshapes_are_views_never_launches() {
    for model in MODELS {
        let l = lowered(model, Target::Sm120);
        for p in &l.phases {
            for s in &p.steps {
                if let Step::Launch(launch) = s {
                    assert!(
                        !["slice", "reshape"].contains(&launch.op.as_str()),
                        "{model} @{}: {} was lowered to a launch",
                        p.function,
                        launch.node
                    );
                }
            }
        }
    }
}

#[test]
fn the_fused_projection_is_split_by_views_into_its_output() {
    let l = lowered("tiny-sparse.ron", Target::Sm120);
    let decode = phase(&l, "decode");
    let fused = decode
        .steps
        .iter()
        .find_map(|s| match s {
            Step::Launch(l) if l.node.contains("[q_a_proj;kv_a_proj_with_mqa") => {
                l.args.iter().find_map(|a| match &a.value {
                    ArgValue::Ptr(at) if a.name == "y" => Some(at.clone()),
                    _ => None,
                })
            }
            _ => None,
        })
        .expect("layer 0's fused projection");
    let q_a = decode
        .steps
        .iter()
        .find_map(|s| match s {
            Step::View { node, at, .. } if node == "model.layers.0.self_attn.q_a_proj" => {
                Some(at.clone())
            }
            _ => None,
        })
        .expect("q_a_proj is a view");
    assert_eq!(q_a.buf, fused.buf);
    assert_eq!(q_a.offset_bytes, fused.offset_bytes);
    assert_eq!(
        q_a.strides, fused.strides,
        "rows keep the fused width as stride"
    );
    // and the norm that reads it takes that stride, not a copy
    let norm = decode
        .launches()
        .find(|l| l.node == "model.layers.0.self_attn.q_a_layernorm")
        .unwrap();
    let x = norm.args.iter().find(|a| a.name == "x").unwrap();
    assert_eq!(x.value, ArgValue::Ptr(q_a));
}

#[test]
fn adjacent_halves_concatenate_without_a_copy() {
    let l = lowered("tiny-sparse.ron", Target::Sm120);
    let decode = phase(&l, "decode");
    let q = decode.steps.iter().find(
        |s| matches!(s, Step::View { node, .. } if node == "model.layers.0.self_attn.indexer.q"),
    );
    assert!(
        q.is_some(),
        "the indexer query's halves lie side by side: the concat is a view"
    );
}

/// Arena ranges `[start, end)` of a tensor at the phase's largest sizes.
fn range(at: &glmc_codegen::layout::TensorRef, p: &Phase) -> Option<(i64, i64)> {
    if at.buf != Buf::Arena {
        return None;
    }
    let start = at.offset_bytes.eval(&p.max_bindings)?;
    let mut last = 0i64;
    for (d, s) in at.shape.iter().zip(&at.strides) {
        last += (d.eval(&p.max_bindings)? - 1).max(0) * s.eval(&p.max_bindings)?;
    }
    Some((start, start + (last + 1) * at.dtype.size_bytes() as i64))
}

#[test]
fn the_arena_holds_every_arena_tensor_at_the_largest_sizes() {
    for model in MODELS {
        let l = lowered(model, Target::Sm120);
        for p in &l.phases {
            for s in &p.steps {
                let tensors: Vec<_> = match s {
                    Step::Launch(l) => l
                        .args
                        .iter()
                        .filter_map(|a| match &a.value {
                            ArgValue::Ptr(at) => Some(at.clone()),
                            _ => None,
                        })
                        .collect(),
                    Step::Collective(c) => vec![c.input.clone(), c.output.clone()],
                    Step::View { at, .. } => vec![at.clone()],
                    Step::Missing { outputs, .. } => outputs.clone(),
                };
                for at in tensors {
                    if let Some((_, end)) = range(&at, p) {
                        assert!(
                            end as u64 <= p.arena_bytes,
                            "{model} @{}: {at} ends at {end}, past the arena's {}",
                            p.function,
                            p.arena_bytes
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn every_op_of_the_shipped_models_has_a_kernel() {
    for model in MODELS {
        for target in [Target::Sm120, Target::Sm90a] {
            let l = lowered(model, target);
            assert_eq!(l.missing_ops(), Vec::<String>::new(), "{model} on {target}");
        }
    }
}

#[test]
fn a_context_past_the_attention_bitmap_is_missing_with_its_reason() {
    let limits = glmc_codegen::Limits {
        max_context: 1 << 20,
        ..LIMITS
    };
    let l = lower_module(&module("tiny-sparse.ron").1, Target::Sm120, limits).unwrap();
    // Past the rope GEMMs' positions too (the test below).
    assert_eq!(l.missing_ops(), ["matmul.rope", "mla.attend.absorbed"]);
    let why = missing_reason(&l, "mla.attend.absorbed");
    assert!(why.contains("a context of 1048576 is too long"), "{why}");
}

/// Why the first node of `op` has no kernel.
fn missing_reason(l: &glmc_codegen::Lowered, op: &str) -> String {
    l.phases
        .iter()
        .flat_map(|p| &p.steps)
        .find_map(|s| match s {
            Step::Missing { op: o, why, .. } if o == op => Some(why.clone()),
            _ => None,
        })
        .unwrap()
}

#[test]
fn a_context_past_the_rope_gemms_positions_is_missing_with_its_reason() {
    use glmc_codegen::kernels::ROPE_POSITIONS;
    let m = module("tiny-sparse.ron").1;
    let at = |max_context| {
        let limits = glmc_codegen::Limits {
            max_context,
            ..LIMITS
        };
        lower_module(&m, Target::Sm120, limits).unwrap()
    };
    assert!(at(ROPE_POSITIONS).missing_ops().is_empty());
    let l = at(ROPE_POSITIONS + 1);
    assert_eq!(l.missing_ops(), ["matmul.rope"]);
    let why = missing_reason(&l, "matmul.rope");
    assert!(
        why.contains("a context of 262145 is past the 262144 positions"),
        "{why}"
    );
    assert!(why.contains("lower --max-context"), "{why}");
}

#[test]
fn sparse_attention_reads_the_decode_cache_at_its_capacity_stride() {
    let l = lowered("tiny-sparse.ron", Target::Sm120);
    let decode = phase(&l, "decode");
    let attend = decode
        .launches()
        .find(|l| l.op == "mla.attend.absorbed")
        .expect("the absorbed attention is launched");
    let arg = |name: &str| &attend.args.iter().find(|a| a.name == name).unwrap().value;
    let ArgValue::Ptr(c_kv) = arg("k1") else {
        panic!()
    };
    let width = c_kv.shape.last().unwrap().as_const().unwrap();
    assert_eq!(
        arg("k1_seq"),
        &ArgValue::Int(glmc_codegen::expr::Poly::constant(
            width * LIMITS.max_context as i64
        ))
    );
    assert_eq!(arg("v"), arg("k1"), "the latent is the value too");
    assert!(attend.args.iter().any(|a| a.name == "topk"));
}

#[test]
fn decode_caches_are_strided_by_the_capacity() {
    let l = lowered("tiny-sparse.ron", Target::Sm120);
    let decode = phase(&l, "decode");
    // The latent cache's update: c_kv (the norm's width) and k_pe (the rest of x) in one launch.
    let launch = decode
        .steps
        .iter()
        .find_map(|s| match s {
            Step::Launch(l) if l.op == "cache.update.norm" && l.node.ends_with("cache.c_kv") => {
                Some(l)
            }
            _ => None,
        })
        .unwrap();
    let int = |name: &str| match &launch.args.iter().find(|a| a.name == name).unwrap().value {
        ArgValue::Int(p) => p.as_const().unwrap(),
        _ => panic!("{name} is no integer"),
    };
    let width = |name: &str| match &launch.args.iter().find(|a| a.name == name).unwrap().value {
        ArgValue::Ptr(r) => r.shape.last().unwrap().as_const().unwrap(),
        _ => panic!("{name} is no pointer"),
    };
    let (normed, row) = (width("w"), width("x"));
    assert!(row > normed);
    let capacity = LIMITS.max_context as i64;
    assert_eq!(int("seq_stride"), normed * capacity);
    assert_eq!(int("tail_seq_stride"), (row - normed) * capacity);
}

#[test]
fn every_kernel_fits_sm120s_shared_memory() {
    for model in MODELS {
        for target in Target::ALL {
            let l = lowered(model, target);
            assert!(
                l.kernels.iter().all(|k| k.shared_bytes <= 99 * 1024),
                "{model} {target}"
            );
        }
    }
}

/// `dsa.topk`'s one-block kernel holds a row of up to 32k keys on chip, 1024 threads × slots: the
/// first 9 slots in registers and the rest in dynamic shared memory, which with the histogram
/// (1024 words), the ranked candidates (256) and the 160 static bytes stays within SM120's 99 KiB;
/// a longer context holds 8 + 23 slots (its passes' loads of the rest take a register) and reads
/// the rest.
#[test]
fn dsa_topk_holds_the_row_on_chip_within_sm120s_shared_memory() {
    for (context, slots, held, tail) in [
        (1u64, 1u64, 1u64, false),
        (4096, 4, 4, false),
        (8192, 8, 8, false),
        (8193, 9, 9, false),
        (16384, 16, 9, false),
        (32768, 32, 9, false),
        (32769, 31, 8, true),
        (131072, 31, 8, true),
    ] {
        let limits = glmc_codegen::Limits {
            max_context: context,
            max_batch: 64,
            ..LIMITS
        };
        let l = lower_module(&module("tiny-sparse.ron").1, Target::Sm120, limits).unwrap();
        let k = kernels_of(&l, "decode", "dsa.topk")
            .into_iter()
            .find(|k| k.template == "dsa_topk")
            .unwrap();
        assert_eq!(k.params["slots"], slots.to_string(), "{context}");
        assert_eq!(k.params["held"], held.to_string(), "{context}");
        assert_eq!(k.params["tail"], tail.to_string(), "{context}");
        assert_eq!(
            k.shared_bytes as u64,
            (1024 + 256 + (slots - held) * 1024) * 4
        );
        assert!(k.shared_bytes + 160 <= Target::Sm120.max_shared_memory_per_block());
    }
}

/// `dsa.topk` of a few rows (at most 8) takes the split path: two launches of 16 blocks a row
/// (`16*b`), 512 threads, through one scratch buffer of the row layout the template checks,
/// sized for the rows the limits allow (at most 8), with keys a thread for the context (at most
/// 16: 131072 keys); more rows take the one-block kernel, guarded apart; a context of at most k
/// keys (tiny-sparse's k is 8) or over 131072 keys only the one-block kernel; a batch of at
/// most 8 only the split path.
#[test]
fn dsa_topk_takes_sixteen_blocks_a_row_for_few_rows() {
    use glmc_codegen::expr::Bindings;
    let row_words = |slots: u64| 32 + 5 * 1024 + 2 * 32 + 16 * (1024 + slots * 512);
    for (context, batch, split) in [
        (8u64, 64u64, None),
        (9, 64, Some(1u64)),
        (8192, 64, Some(1)),
        (8193, 64, Some(2)),
        (32768, 64, Some(4)),
        (32768, 3, Some(4)),
        (131072, 64, Some(16)),
        (131073, 64, None),
    ] {
        let limits = glmc_codegen::Limits {
            max_context: context,
            max_batch: batch,
            ..LIMITS
        };
        let l = lower_module(&module("tiny-sparse.ron").1, Target::Sm120, limits).unwrap();
        let launches: Vec<_> = phase(&l, "decode")
            .launches()
            .filter(|x| x.node == "model.layers.0.self_attn.indexer.topk")
            .collect();
        let template = |name: &str| {
            l.kernels
                .iter()
                .find(|k| k.name == name)
                .unwrap()
                .template
                .clone()
        };
        let Some(slots) = split else {
            assert_eq!(launches.len(), 1, "{context}");
            assert_eq!(template(&launches[0].kernel), "dsa_topk");
            assert!(launches[0].when.is_none());
            continue;
        };
        let whole = batch > 8;
        assert_eq!(launches.len(), 2 + usize::from(whole), "{context} {batch}");
        for (i, stage) in ["bounds", "select"].into_iter().enumerate() {
            let x = launches[i];
            let k = l.kernels.iter().find(|k| k.name == x.kernel).unwrap();
            assert_eq!(k.template, "dsa_topk_split");
            assert_eq!(k.params["stage"], stage);
            assert_eq!(k.params["slots"], slots.to_string(), "{context}");
            assert_eq!(k.params["row_words"], row_words(slots).to_string());
            assert_eq!(x.block, 512);
            assert_eq!(x.grid.to_string(), "16*b");
            let scratch = x.args.iter().find(|a| a.name == "scratch").unwrap();
            let ArgValue::Ptr(at) = &scratch.value else {
                panic!()
            };
            assert_eq!(at.buf, Buf::Arena);
            let rows = batch.min(8);
            assert_eq!(
                at.shape[0].as_const(),
                Some((rows * row_words(slots)) as i64),
                "{context} {batch}"
            );
        }
        for b in [1u64, 8, 9, 64] {
            let bindings = Bindings::from([("b".to_string(), b)]);
            let runs: Vec<String> = launches
                .iter()
                .filter(|x| {
                    x.when
                        .as_ref()
                        .is_none_or(|g| g.holds(&bindings) == Some(true))
                })
                .map(|x| template(&x.kernel))
                .collect();
            let want = if b <= 8 || !whole {
                vec!["dsa_topk_split", "dsa_topk_split"]
            } else {
                vec!["dsa_topk"]
            };
            assert_eq!(runs, want, "{context} {batch} b={b}");
        }
    }
}

/// A bf16 GEMM has two kernels with complementary guards on the row count: the 16-row skinny
/// one for up to 16 rows, and for more the tiled one (128-row tiles in a prefill, 64-row ones in
/// a decode; a K of 64 is not split).
#[test]
fn prefill_gemms_pick_their_kernel_by_row_count() {
    use glmc_codegen::expr::Bindings;
    let (_, m) = common::module_with("tiny-sparse.ron", |c| c.dtype = glmc_ir::DType::BF16);
    let l = lower_module(&m, Target::Sm120, LIMITS).unwrap();
    let node = "model.layers.0.mlp.down_proj";
    let prefill: Vec<_> = phase(&l, "prefill")
        .launches()
        .filter(|x| x.node == node)
        .collect();
    let kernels: Vec<&str> = prefill.iter().map(|x| x.kernel.as_str()).collect();
    assert_eq!(prefill.len(), 2, "{kernels:?}");
    for s in [1u64, 16, 17, 256] {
        let b = Bindings::from([("s".to_string(), s)]);
        let runs: Vec<&str> = prefill
            .iter()
            .filter(|x| x.when.as_ref().unwrap().holds(&b) == Some(true))
            .map(|x| x.kernel.as_str())
            .collect();
        let want = if s <= 16 {
            "glmc_gemm_skinny_"
        } else {
            "glmc_gemm_mma_"
        };
        assert!(
            runs.len() == 1 && runs[0].starts_with(want),
            "s={s}: {runs:?}"
        );
    }
    let decode: Vec<_> = phase(&l, "decode")
        .launches()
        .filter(|x| x.node == node)
        .collect();
    assert_eq!(decode.len(), 2);
    assert!(decode[0].kernel.starts_with("glmc_gemm_skinny_"));
    assert!(decode[1].kernel.starts_with("glmc_gemm_mma_"));
    for b in [1u64, 16, 17, 64] {
        let bindings = Bindings::from([("b".to_string(), b)]);
        let runs: Vec<usize> = (0..2)
            .filter(|&i| decode[i].when.as_ref().unwrap().holds(&bindings) == Some(true))
            .collect();
        assert_eq!(runs, [usize::from(b > 16)], "b={b}");
    }
}

/// Above 16 rows GLM-5's decode o_proj (6144 × 16384: 48 tiles of 128 columns) takes the tiled
/// GEMM split 5 ways over K on an H200's 264 slots (7 on SM120's 376): the partial and the
/// reduce launches, both guarded by the rows; the lm_head (1210 tiles) is not split, and the
/// skinny variant runs the 64-row skinny GEMM.
#[test]
fn glm5_decode_gemms_split_k_where_their_tiles_are_few() {
    use glmc_codegen::expr::Bindings;
    use glmc_codegen::kernels::{DecodeGemm, Variant};
    let (_, m) = module("glm5.ron");
    let limits = glmc_codegen::Limits {
        max_prefill_tokens: 64,
        max_batch: 64,
        max_context: 4096,
    };
    let wide = |l: &glmc_codegen::Lowered, node: &str| -> Vec<(String, Option<String>)> {
        let b = Bindings::from([("b".to_string(), 64)]);
        phase(l, "decode")
            .launches()
            .filter(|x| x.node == node && x.when.as_ref().unwrap().holds(&b) == Some(true))
            .map(|x| {
                let k = l.kernels.iter().find(|k| k.name == x.kernel).unwrap();
                (k.template.clone(), k.params.get("splits").cloned())
            })
            .collect()
    };
    let o_proj = "model.layers.0.self_attn.o_proj";
    for (target, splits) in [(Target::Sm90a, "5"), (Target::Sm120a, "7")] {
        let l = lower_module(&m, target, limits).unwrap();
        let mma = || ("gemm_mma".to_string(), Some(splits.to_string()));
        assert_eq!(wide(&l, o_proj), [mma(), mma()], "{target}");
        let parts: Vec<_> = phase(&l, "decode")
            .launches()
            .filter(|x| x.node == o_proj && x.kernel.starts_with("glmc_gemm_mma_"))
            .map(|x| {
                &l.kernels
                    .iter()
                    .find(|k| k.name == x.kernel)
                    .unwrap()
                    .params["part"]
            })
            .collect();
        assert_eq!(parts, ["partial", "reduce"]);
        assert_eq!(
            wide(&l, "lm_head"),
            [("gemm_mma".to_string(), Some("1".to_string()))]
        );
    }
    let l = glmc_codegen::lower_module_with(
        &m,
        Target::Sm90a,
        limits,
        Variant::DecodeGemm(DecodeGemm::Skinny),
    )
    .unwrap();
    assert_eq!(wide(&l, o_proj), [("gemm_skinny".to_string(), None)]);
}

/// GLM-5's absorbed attention (bf16, 64 heads of 512 + 64) takes the wide tensor-core kernel
/// (two blocks of 32 heads a row): per range of row counts one split count, the split ranges
/// followed by the merge, every launch guarded by the rows, the grid by the rows alone; the
/// partial results in one scratch buffer of the largest split range, live at the node's step
/// alone. Its top-k of 2048 keys (64 tiles) caps the splits at 32 of two tiles each; otherwise
/// a row count takes the most splits whose blocks fit one wave of SM120's 188 SMs (one wide
/// block each), and one split past 47 rows.
#[test]
fn glm5_absorbed_attention_splits_by_batch_on_the_tensor_cores() {
    use glmc_codegen::expr::Bindings;
    let limits = glmc_codegen::Limits {
        max_prefill_tokens: 4096,
        max_batch: 64,
        max_context: 4096,
    };
    let l = lower_module(&module("glm5.ron").1, Target::Sm120, limits).unwrap();
    let resident = 188;
    for (phase_name, sym, max) in [("decode", "b", 64u64), ("prefill", "s", 4096)] {
        let p = phase(&l, phase_name);
        let node = "model.layers.3.self_attn.mla_attn";
        let launches: Vec<_> = p
            .launches()
            .filter(|x| x.op == "mla.attend.absorbed" && x.node.starts_with("model.layers.3."))
            .collect();
        assert!(!launches.is_empty(), "{phase_name}: no launch of {node}");
        for rows in [1u64, 2, 3, 8, 23, 24, 33, 47, 48, 64, max] {
            let b = Bindings::from([(sym.to_string(), rows), ("t".to_string(), 4096)]);
            let runs: Vec<_> = launches
                .iter()
                .filter(|x| x.when.as_ref().unwrap().holds(&b) == Some(true))
                .collect();
            let names: Vec<&str> = runs.iter().map(|x| x.kernel.as_str()).collect();
            let attend = runs[0];
            assert!(attend.kernel.starts_with("glmc_mla_absorbed_"), "{names:?}");
            let split = attend
                .args
                .iter()
                .find(|a| a.name == "splits")
                .map(|a| match &a.value {
                    ArgValue::Int(p) => p.as_const().unwrap() as u64,
                    _ => panic!(),
                })
                .unwrap();
            let blocks = attend.grid.eval(&b).unwrap();
            assert_eq!(blocks, rows * 2 * split, "{phase_name} rows={rows}");
            // The most splits that fit one wave: twice as many would not.
            assert!(
                split == 32 || 2 * blocks > resident,
                "{phase_name} rows={rows}: {blocks} blocks"
            );
            if split == 1 {
                assert_eq!(runs.len(), 1, "{phase_name} rows={rows}: {names:?}");
                assert!(rows > 47);
            } else {
                assert_eq!(runs.len(), 2, "{phase_name} rows={rows}: {names:?}");
                assert!(runs[1].kernel.starts_with("glmc_mla_merge_"));
                assert!(
                    blocks <= resident,
                    "{phase_name} rows={rows}: {blocks} blocks"
                );
                let part = |x: &glmc_codegen::schedule::Launch| {
                    x.args
                        .iter()
                        .find_map(|a| match &a.value {
                            ArgValue::Ptr(at) if a.name == "part" => Some(at.clone()),
                            _ => None,
                        })
                        .unwrap()
                };
                assert_eq!(part(attend), part(runs[1]), "one scratch for both kernels");
                assert_eq!(part(attend).buf, Buf::Arena);
                // The largest split range: up to 47 rows × 2 splits × 64 heads × 513.
                assert_eq!(
                    part(attend).shape[0].as_const(),
                    Some(94 * 64 * 513),
                    "{phase_name}"
                );
            }
        }
        let kernel = l
            .kernels
            .iter()
            .find(|k| k.name == launches[0].kernel)
            .unwrap();
        assert!(kernel.shared_bytes <= 99 * 1024);
        assert_eq!(kernel.template, "mla_absorbed_wide");
    }
}

/// A sparse attention's splits are capped by its top-k list (GLM-5: 2048 keys, 64 tiles of 32):
/// shipped (two tiles a split), batch 1 takes 32 splits of 32 heads; the sweep's variant of at
/// least 4 tiles a split takes 16, of one tile 64.
#[test]
fn sparse_absorbed_attention_splits_hold_the_tiles_asked_for() {
    use glmc_codegen::expr::Bindings;
    use glmc_codegen::{lower_module_with, MlaKernel, Variant};
    let limits = glmc_codegen::Limits {
        max_prefill_tokens: 4096,
        max_batch: 64,
        max_context: 32768,
    };
    let glm5 = module("glm5.ron").1;
    let b1 = Bindings::from([("b".to_string(), 1), ("t".to_string(), 32768)]);
    let splits_at_b1 = |l: &glmc_codegen::Lowered, node: &str| -> u64 {
        let attend = phase(l, "decode")
            .launches()
            .find(|x| {
                x.node == node
                    && x.kernel.starts_with("glmc_mla_absorbed_")
                    && x.when.as_ref().is_none_or(|w| w.holds(&b1) == Some(true))
            })
            .unwrap_or_else(|| panic!("no attention launch for {node}"));
        attend
            .args
            .iter()
            .find_map(|a| match &a.value {
                ArgValue::Int(p) if a.name == "splits" => p.as_const(),
                _ => None,
            })
            .unwrap() as u64
    };
    let sparse = "model.layers.3.self_attn.attn_latent";
    let shipped = lower_module(&glm5, Target::Sm90a, limits).unwrap();
    assert_eq!(splits_at_b1(&shipped, sparse), 32);
    let one =
        lower_module_with(&glm5, Target::Sm90a, limits, Variant::MlaTilesPerSplit(1)).unwrap();
    assert_eq!(splits_at_b1(&one, sparse), 64);
    let four =
        lower_module_with(&glm5, Target::Sm90a, limits, Variant::MlaTilesPerSplit(4)).unwrap();
    assert_eq!(splits_at_b1(&four, sparse), 16);
}

/// GLM-5's 64 heads take the wide kernel (32 heads a block) at both phases; the sweep's
/// `MlaKernel::Narrow` keeps them to 16 a block, twice the blocks a row, and `MlaKernel::Wide64`
/// takes them all in one block a row.
#[test]
fn the_absorbed_attention_takes_32_heads_a_block_unless_asked_for_16_or_64() {
    use glmc_codegen::expr::Bindings;
    use glmc_codegen::{lower_module_with, MlaKernel, Variant};
    let glm5 = module("glm5.ron").1;
    let b = Bindings::from([
        ("b".to_string(), 8),
        ("s".to_string(), 256),
        ("t".to_string(), 1024),
    ]);
    let attention = |l: &glmc_codegen::Lowered, phase_name: &str| {
        let attend = phase(l, phase_name)
            .launches()
            .find(|x| {
                x.op == "mla.attend.absorbed"
                    && x.kernel.starts_with("glmc_mla_absorbed")
                    && x.when.as_ref().is_none_or(|w| w.holds(&b) == Some(true))
            })
            .unwrap();
        let kernel = l.kernels.iter().find(|k| k.name == attend.kernel).unwrap();
        let splits = attend
            .args
            .iter()
            .find_map(|a| match &a.value {
                ArgValue::Int(p) if a.name == "splits" => p.as_const(),
                _ => None,
            })
            .unwrap() as u64;
        let rows = if phase_name == "decode" { 8 } else { 256 };
        (
            kernel.template.clone(),
            kernel.threads,
            attend.grid.eval(&b).unwrap() / rows / splits,
        )
    };
    let wide = lower_module(&glm5, Target::Sm90a, LIMITS).unwrap();
    let asked = |k| lower_module_with(&glm5, Target::Sm90a, LIMITS, Variant::Mla(k)).unwrap();
    let (narrow, wide64) = (asked(MlaKernel::Narrow), asked(MlaKernel::Wide64));
    for p in ["decode", "prefill"] {
        assert_eq!(
            attention(&wide, p),
            ("mla_absorbed_wide".into(), 256, 2),
            "{p}"
        );
        assert_eq!(
            attention(&narrow, p),
            ("mla_absorbed".into(), 256, 4),
            "{p}"
        );
        assert_eq!(
            attention(&wide64, p),
            ("mla_absorbed_wide64".into(), 256, 1),
            "{p}"
        );
    }
}

/// The split ranges: each split count takes the row counts whose blocks fit one wave of the
/// resident blocks (264: 8 heads, one group, two blocks an SM of an H200), the ranges tile the
/// row counts, one split takes every count past one wave, and limits below a range drop it.
#[test]
fn absorbed_attention_split_ranges() {
    use glmc_codegen::kernels::{mla_split_tiers, SplitTier};
    let t = mla_split_tiers(1, 1 << 20, 128, 264);
    let ranges: Vec<_> = t.iter().map(|t| (t.above, t.at_most, t.splits)).collect();
    assert_eq!(
        ranges,
        [
            (None, Some(2), 128),
            (Some(2), Some(4), 64),
            (Some(4), Some(8), 32),
            (Some(8), Some(16), 16),
            (Some(16), Some(33), 8),
            (Some(33), Some(66), 4),
            (Some(66), Some(132), 2),
            (Some(132), None, 1),
        ]
    );
    for w in t.windows(2) {
        assert_eq!(w[0].at_most, w[1].above);
    }
    for tier in &t[..t.len() - 1] {
        let hi = tier.at_most.unwrap();
        assert!(
            hi * tier.splits <= 264 && (hi + 1) * tier.splits > 264,
            "{tier:?}"
        );
    }
    // GLM-5's 64 heads on the wide kernel (two groups, one block an SM of 132): batch 64 is
    // one wave unsplit.
    let wide = mla_split_tiers(2, 64, 32, 132);
    assert_eq!(
        wide.iter().map(|t| t.splits).collect::<Vec<_>>(),
        [32, 16, 8, 4, 2, 1]
    );
    assert_eq!(wide.last().unwrap().above, Some(33));
    // A split count no row count fits (264 / (128 · 4) = 0) is skipped.
    assert_eq!(
        mla_split_tiers(4, 1, 128, 264),
        [SplitTier {
            above: None,
            at_most: Some(1),
            splits: 64
        }]
    );
}

/// Other shapes keep the baseline, and the schedule says why.
#[test]
fn absorbed_attention_outside_the_tiling_keeps_the_baseline_with_its_reason() {
    let l = lowered("tiny-sparse.ron", Target::Sm120);
    let attend = phase(&l, "decode")
        .launches()
        .find(|x| x.op == "mla.attend.absorbed")
        .unwrap();
    assert!(attend.kernel.starts_with("glmc_attention_"));
    let note = attend.note.as_deref().unwrap();
    assert!(
        note.starts_with("baseline: q_abs is f32 (the tensor cores take bf16)"),
        "{note}"
    );
    let (_, m) = common::module_with("glm5.ron", |c| c.dtype = glmc_ir::DType::F32);
    let l = lower_module(&m, Target::Sm120, LIMITS).unwrap();
    let attend = phase(&l, "decode")
        .launches()
        .find(|x| x.op == "mla.attend.absorbed")
        .unwrap();
    assert!(attend.kernel.starts_with("glmc_attention_"));
    assert!(attend.note.as_deref().unwrap().contains("is f32"));
}

/// The kernel of each launch of `op` in `phase`, with its parameters.
fn kernels_of<'a>(
    l: &'a glmc_codegen::Lowered,
    phase_name: &str,
    op: &str,
) -> Vec<&'a glmc_codegen::schedule::Kernel> {
    phase(l, phase_name)
        .launches()
        .filter(|x| x.op == op)
        .map(|x| l.kernels.iter().find(|k| k.name == x.kernel).unwrap())
        .collect()
}

/// GLM-5's dense prefill attention takes the flash kernel (96 KiB of dynamic shared memory:
/// Q, K and V tiles of 64 rows), and so does tiny-dense in bf16 (8 + 8 query dims make one
/// 16-wide MMA step); f32 keeps the baseline, which says why.
#[test]
fn dense_prefill_attention_takes_the_flash_kernel_where_it_fits() {
    let l = lower_module(&common::dense_module("glm5.ron"), Target::Sm120, LIMITS).unwrap();
    let flash = kernels_of(&l, "prefill", "mla.attend");
    assert!(!flash.is_empty());
    for k in flash {
        assert_eq!(k.template, "attention_flash");
        assert_eq!(k.shared_bytes, 96 * 1024);
        assert_eq!(
            (
                k.params["d1"].as_str(),
                k.params["d2"].as_str(),
                k.params["dv"].as_str()
            ),
            ("192", "64", "256")
        );
    }
    let (_, bf16) = common::module_with("tiny-dense.ron", |c| c.dtype = glmc_ir::DType::BF16);
    let tiny = lower_module(&bf16, Target::Sm120, LIMITS).unwrap();
    let flash = kernels_of(&tiny, "prefill", "mla.attend");
    assert!(!flash.is_empty() && flash.iter().all(|k| k.template == "attention_flash"));
    let tiny = lower_module(&module("tiny-dense.ron").1, Target::Sm120, LIMITS).unwrap();
    for k in kernels_of(&tiny, "prefill", "mla.attend") {
        assert_eq!(k.template, "attention");
    }
    for launch in phase(&tiny, "prefill")
        .launches()
        .filter(|x| x.op == "mla.attend")
    {
        let note = launch.note.as_deref().unwrap_or_default();
        assert!(
            note.starts_with("baseline: ") && note.contains("bf16"),
            "{note}"
        );
    }
}

/// GLM-5's indexer scores run on the tensor cores: a prefill block takes 4 query rows (their
/// 128 row-heads share each key tile), a decode the persistent streaming kernel; f32 keeps the
/// SIMT kernel.
#[test]
fn indexer_scores_take_the_tensor_cores_in_bf16() {
    use glmc_codegen::expr::Bindings;
    let l = lowered("glm5.ron", Target::Sm120);
    for phase_name in ["prefill", "decode"] {
        let ks = kernels_of(&l, phase_name, "dsa.score");
        assert!(!ks.is_empty(), "{phase_name}");
        for k in ks {
            assert!(k.template.starts_with("dsa_score_"), "{phase_name}");
            assert!(k.shared_bytes <= 99 * 1024);
        }
    }
    for k in kernels_of(&l, "prefill", "dsa.score") {
        assert_eq!(k.template, "dsa_score_mma");
        assert_eq!(k.params["rows"], "4");
    }
    // A decode of one sequence keeps the row-per-block kernel; from two, the persistent one.
    for (rows, template) in [
        (1, "dsa_score_mma"),
        (2, "dsa_score_decode"),
        (64, "dsa_score_decode"),
    ] {
        let b = Bindings::from([("b".to_string(), rows), ("t".to_string(), 4096)]);
        let chosen: Vec<&str> = phase(&l, "decode")
            .launches()
            .filter(|x| {
                x.op == "dsa.score" && x.when.as_ref().is_none_or(|g| g.holds(&b) == Some(true))
            })
            .map(|x| {
                l.kernels
                    .iter()
                    .find(|k| k.name == x.kernel)
                    .unwrap()
                    .template
                    .as_str()
            })
            .collect();
        assert!(
            !chosen.is_empty() && chosen.iter().all(|t| *t == template),
            "{rows} rows: {chosen:?}"
        );
    }
    let tiny = lowered("tiny-sparse.ron", Target::Sm120);
    for k in kernels_of(&tiny, "prefill", "dsa.score") {
        assert_eq!(k.template, "dsa_score");
    }
    for launch in phase(&tiny, "prefill")
        .launches()
        .filter(|x| x.op == "dsa.score")
    {
        let note = launch.note.as_deref().unwrap_or_default();
        assert!(note.starts_with("baseline: 2 heads of 16"), "{note}");
    }
}

/// In bf16 the f32 router reads the norm's bf16 output (its widening cast folded in): the SIMT
/// GEMMs load x and w in dtypes of their own, the GEMV at decode and the tiled SIMT kernel at
/// prefill, with no cast launched before them; and every indexer's head-weight scale is an
/// argument of its score kernel instead of a launch.
#[test]
fn the_bf16_router_reads_bf16_rows_and_the_scores_scale_their_weights() {
    let (_, m) = common::module_with("tiny-sparse.ron", |c| c.dtype = glmc_ir::DType::BF16);
    for (l, file) in [
        (lowered("glm5.ron", Target::Sm120), "glm5"),
        (
            lower_module(&m, Target::Sm120, LIMITS).unwrap(),
            "tiny bf16",
        ),
    ] {
        for (phase_name, template) in [("decode", "gemv"), ("prefill", "matmul")] {
            let launches: Vec<_> = phase(&l, phase_name)
                .launches()
                .filter(|x| x.node.ends_with(".mlp.gate"))
                .collect();
            assert!(!launches.is_empty(), "{file} {phase_name}");
            for x in launches {
                let k = l.kernels.iter().find(|k| k.name == x.kernel).unwrap();
                assert_eq!(k.template, template, "{file} {phase_name}");
                assert_eq!(
                    (&*k.params["x_t"], &*k.params["w_t"], &*k.params["y_t"]),
                    ("bf16", "float", "float"),
                    "{file} {phase_name}"
                );
            }
            for x in phase(&l, phase_name).launches() {
                assert!(
                    !x.node.ends_with(".mlp.gate.input_f32")
                        && !x.node.ends_with(".indexer.head_weights"),
                    "{file} {phase_name}: {} {}",
                    x.op,
                    x.node
                );
            }
            let scores: Vec<_> = phase(&l, phase_name)
                .launches()
                .filter(|x| x.op == "dsa.score")
                .collect();
            assert!(!scores.is_empty(), "{file} {phase_name}");
            for x in scores {
                assert!(
                    x.args.iter().any(|a| a.name == "w_scale"),
                    "{file} {phase_name}"
                );
            }
        }
    }
}

/// A greedy build's `matmul.argmax` runs as three launches sharing one scratch slot per row:
/// clearing the slots, the few-row GEMM of the dtype with the argmax epilogue (the skinny
/// tensor-core kernel in bf16, the GEMV in f32; at decode and for prefill's last row alike),
/// and the finish writing the tokens; the logits are never stored.
#[test]
fn a_greedy_lm_head_is_one_gemm_with_an_argmax_epilogue() {
    use glmc_codegen::expr::Poly;
    use glmc_ir::DType;
    let cases = [
        ("tiny-sparse.ron", DType::F32, "glmc_gemv_"),
        ("tiny-sparse.ron", DType::BF16, "glmc_gemm_skinny_"),
        ("glm5.ron", DType::BF16, "glmc_gemm_skinny_"),
        ("glm5.ron", DType::F32, "glmc_gemv_"),
    ];
    for (file, dtype, gemm) in cases {
        let m = common::greedy_module(file, |c| c.dtype = dtype);
        let l = lower_module(&m, Target::Sm90a, LIMITS).unwrap();
        for (name, rows) in [("decode", Poly::sym("b")), ("prefill", Poly::constant(1))] {
            let p = phase(&l, name);
            assert!(
                p.launches()
                    .all(|x| x.op != "sample.argmax" && x.node != "lm_head"),
                "{file} {dtype} @{name}: the unfused lm_head or argmax is left"
            );
            let launches: Vec<_> = p.launches().filter(|x| x.op == "matmul.argmax").collect();
            let kernels: Vec<&str> = launches.iter().map(|x| x.kernel.as_str()).collect();
            assert_eq!(launches.len(), 3, "{file} {dtype} @{name}: {kernels:?}");
            assert!(launches
                .iter()
                .all(|x| x.node == "next_token" && x.when.is_none()));
            assert!(kernels[0].starts_with("glmc_gemm_argmax_"), "{kernels:?}");
            assert!(kernels[1].starts_with(gemm), "{file} {dtype}: {kernels:?}");
            assert!(kernels[2].starts_with("glmc_gemm_argmax_"), "{kernels:?}");
            let kernel = |i: usize| l.kernels.iter().find(|k| k.name == kernels[i]).unwrap();
            assert_eq!(kernel(0).params["stage"], "init");
            assert_eq!(kernel(2).params["stage"], "finish");
            assert_eq!(kernel(1).params["argmax"], "true");
            let ctype = if dtype == DType::BF16 {
                "bf16"
            } else {
                "float"
            };
            assert_eq!(kernel(1).params["y_t"], ctype, "the logits' rounding");
            let ptr = |i: usize, arg: &str| {
                launches[i]
                    .args
                    .iter()
                    .find_map(|a| match &a.value {
                        ArgValue::Ptr(at) if a.name == arg => Some(at.clone()),
                        _ => None,
                    })
                    .unwrap_or_else(|| panic!("{} has no {arg}", kernels[i]))
            };
            let best = ptr(0, "best");
            assert_eq!(best, ptr(1, "best"), "one scratch for the three launches");
            assert_eq!(best, ptr(2, "best"));
            assert_eq!(best.buf, Buf::Arena);
            assert_eq!(
                (best.dtype, &best.shape[..]),
                (DType::I64, &[rows.clone()][..])
            );
            assert!(launches[1].args.iter().all(|a| a.name != "y"));
            let (out, _) = &p.results.iter().find(|(n, _)| n == "next_token").unwrap();
            assert_eq!(out, "next_token");
            assert!(p.results.iter().all(|(n, _)| n != "logits"));
        }
    }
}

/// Every kernel the shipped models generate, in every dtype, with dense attention, a greedy
/// head, a tensor-parallel rank, both attention kernels' bulk-copy ring or the `moe.experts`
/// baseline too, waits for the kernel before it first: the runtime launches them as programmatic
/// dependents. Together the models reach every template, so a template added without the wait
/// fails here even before it is first used.
#[test]
fn every_generated_kernel_waits_for_the_kernel_before_it_first() {
    use glmc_codegen::render::{self, GRID_DEPENDENCY_CONTROL, TEMPLATES};
    use glmc_ir::DType;
    let mut modules: Vec<(String, glmc_ir::Module)> = Vec::new();
    for file in MODELS {
        for dtype in [DType::F32, DType::BF16] {
            modules.push((
                format!("{file} {dtype}"),
                common::module_with(file, |c| c.dtype = dtype).1,
            ));
            modules.push((
                format!("{file} {dtype} greedy"),
                common::greedy_module(file, |c| c.dtype = dtype),
            ));
        }
    }
    modules.push(("glm5.ron dense".into(), common::dense_module("glm5.ron")));
    // A rank's 8 heads at TP=8, which take the narrow absorbed attention.
    modules.push((
        "glm5.ron rank 0 of 8".into(),
        glmc_passes::partition(&common::module("glm5.ron").1, 8)
            .unwrap()
            .remove(0),
    ));
    modules.push((
        "tiny-sparse.ron without lower-moe".into(),
        common::module_without("tiny-sparse.ron", &["lower-moe"]),
    ));
    // The plain cache update and rope, which fuse-cache-update leaves no shipped model.
    modules.push((
        "tiny-sparse.ron without fuse-cache-update".into(),
        common::module_without("tiny-sparse.ron", &["fuse-cache-update"]),
    ));
    let rank = &modules
        .iter()
        .find(|(n, _)| n == "glm5.ron rank 0 of 8")
        .unwrap()
        .1;
    let glm5 = &modules
        .iter()
        .find(|(n, _)| n == "glm5.ron bf16")
        .unwrap()
        .1;
    let mut reached = std::collections::BTreeSet::new();
    let variant = |m, v| glmc_codegen::lower_module_with(m, Target::Sm120, LIMITS, v).unwrap();
    let bulk = glmc_codegen::Variant::Mla(glmc_codegen::MlaKernel::BulkCopy);
    let wide64 = glmc_codegen::Variant::Mla(glmc_codegen::MlaKernel::Wide64);
    let lowered = modules
        .iter()
        .map(|(name, m)| {
            (
                name.clone(),
                lower_module(m, Target::Sm120, LIMITS).unwrap(),
            )
        })
        .chain([
            (
                "glm5.ron bf16, bulk copies".to_string(),
                variant(glm5, bulk),
            ),
            (
                "glm5.ron rank 0 of 8, bulk copies".to_string(),
                variant(rank, bulk),
            ),
            (
                "glm5.ron bf16, 64 heads a block".to_string(),
                variant(glm5, wide64),
            ),
        ]);
    for (name, mut l) in lowered {
        assert!(l.programmatic_launch, "{name}");
        // The 16-row skinny GEMMs as the persistent template too: the lowering picks it for a
        // short K over many tiles only (kernels.rs: SKINNY_GEMM_16_STREAMED), the skinny sweep
        // times it on every one.
        let persistent: Vec<_> = l
            .kernels
            .iter()
            .filter(|k| k.template == "gemm_skinny" && k.params["mt"] == "1")
            .map(|k| glmc_codegen::schedule::Kernel {
                name: format!("{}_persistent", k.name),
                template: "gemm_skinny_persistent".into(),
                ..k.clone()
            })
            .collect();
        l.kernels.extend(persistent);
        // render refuses a kernel whose body does not open with the wait (or weights, then it).
        let source = render::render(&l.kernels).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            source.matches("__global__").count(),
            source.matches(GRID_DEPENDENCY_CONTROL).count(),
            "{name}"
        );
        reached.extend(l.kernels.iter().map(|k| k.template.clone()));
    }
    let unreached: Vec<&str> = TEMPLATES
        .iter()
        .map(|(t, _)| *t)
        .filter(|t| !t.ends_with(".cuh") && !reached.contains(*t))
        .collect();
    assert_eq!(unreached, Vec::<&str>::new());
}

/// GLM-5's routed down projection at decode takes the stream form up to
/// `MOE_DOWN_STREAM_TOKENS` tokens and the skinny one above (guarded, where the limits allow
/// more; only the stream form where they do not), while gate/up keeps the skinny kernel; a
/// variant takes one form at every token count.
#[test]
fn glm5_moe_down_streams_up_to_a_few_tokens() {
    use glmc_codegen::expr::Guard;
    use glmc_codegen::kernels::{MoeDown, MOE_DOWN_STREAM_TOKENS};
    use glmc_codegen::{lower_module_with, Limits, Variant};
    let (_, glm5) = module("glm5.ron");
    let node = "model.layers.3.mlp.experts";
    // (op, template, guard) of every decode launch of the node's grouped GEMMs.
    let launches = |l: &glmc_codegen::Lowered| -> Vec<(String, String, Option<Guard>)> {
        phase(l, "decode")
            .launches()
            .filter(|x| {
                x.node.starts_with(node) && ["moe.gate_up", "moe.down"].contains(&x.op.as_str())
            })
            .map(|x| {
                let k = l.kernels.iter().find(|k| k.name == x.kernel).unwrap();
                (x.op.clone(), k.template.clone(), x.when.clone())
            })
            .collect()
    };
    let b = glmc_codegen::expr::Poly::sym("b");
    let most = MOE_DOWN_STREAM_TOKENS as i64;
    let wide = Limits {
        max_batch: 2 * MOE_DOWN_STREAM_TOKENS,
        ..LIMITS
    };
    let shipped = lower_module(&glm5, Target::Sm90a, wide).unwrap();
    let gate_up = (
        "moe.gate_up".to_string(),
        "moe_gemm_skinny".to_string(),
        None,
    );
    assert_eq!(
        launches(&shipped),
        [
            gate_up.clone(),
            (
                "moe.down".into(),
                "moe_down_stream".into(),
                Some(Guard::at_most(b.clone(), most))
            ),
            (
                "moe.down".into(),
                "moe_gemm_skinny".into(),
                Some(Guard::above(b, most))
            ),
        ]
    );
    let narrow = Limits {
        max_batch: MOE_DOWN_STREAM_TOKENS,
        ..LIMITS
    };
    let few = lower_module(&glm5, Target::Sm90a, narrow).unwrap();
    assert_eq!(
        launches(&few),
        [
            gate_up.clone(),
            ("moe.down".into(), "moe_down_stream".into(), None)
        ]
    );
    let skinny = lower_module_with(
        &glm5,
        Target::Sm90a,
        wide,
        Variant::MoeDown(MoeDown::Skinny),
    )
    .unwrap();
    assert_eq!(
        launches(&skinny),
        [gate_up, ("moe.down".into(), "moe_gemm_skinny".into(), None)]
    );
    // gate/up's kernel is the one the shipped lowering had before the stream form.
    let name = |l: &glmc_codegen::Lowered, op: &str| {
        phase(l, "decode")
            .launches()
            .find(|x| x.node.starts_with(node) && x.op == op)
            .unwrap()
            .kernel
            .clone()
    };
    assert_eq!(name(&shipped, "moe.gate_up"), name(&skinny, "moe.gate_up"));
}
