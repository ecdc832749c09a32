//! `--dtype f32|bf16`: the f32 validation mode and the bf16 default. `compile` records the dtype
//! in the manifest and picks kernels by it (no tensor cores in f32), `dump` shows the graph it
//! gives, and `run` on the CPU rounds the checkpoint's weights to it.

mod common;

use std::path::Path;

use common::{glmc, glmc_ok, repo_path, stderr_of, success};
use glmc_codegen::artifact::Manifest;
use glmc_codegen::schedule::Phase;
use glmc_ir::DType;
use glmc_models::ModelConfig;

/// `glmc compile models/glm5.ron --target sm90a -o OUT EXTRA…`: the manifest and stderr.
fn compile_glm5(out: &Path, extra: &[&str]) -> (Manifest<ModelConfig>, String) {
    assert!(
        std::env::var_os("GLMC_NVCC").is_some(),
        "run the suite through scripts/test.sh (it installs nvcc), so the kernels are compiled"
    );
    let mut args = vec![
        "compile",
        "models/glm5.ron",
        "--target",
        "sm90a",
        "-o",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let o = glmc(&args);
    success(&o, &format!("glmc {}", args.join(" ")));
    let text = std::fs::read_to_string(out.join("manifest.ron")).unwrap();
    let manifest = ron::from_str(&text).unwrap_or_else(|e| panic!("manifest.ron: {e}"));
    (manifest, stderr_of(&o))
}

/// The kernel names the launches of `phase` use.
fn launched(phase: &Phase) -> impl Iterator<Item = &str> {
    phase.launches().map(|l| l.kernel.as_str())
}

fn phase<'a>(manifest: &'a Manifest<ModelConfig>, name: &str) -> &'a Phase {
    manifest
        .phases
        .iter()
        .find(|p| p.function == name)
        .unwrap_or_else(|| panic!("no {name} phase"))
}

/// The f32 validation artifact of GLM-5 is complete and compiled, and every kernel in it is an
/// FP32 one: no tensor-core GEMM, no bf16 element type anywhere, every weight and cache f32.
#[test]
fn compile_dtype_f32_uses_only_f32_kernels_and_no_tensor_cores() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("f32.glmc");
    let (manifest, stderr) = compile_glm5(&out, &["--dtype", "f32"]);
    assert!(stderr.contains("compiled glm5 (f32) for sm90a"), "{stderr}");
    assert_eq!(manifest.dtype, DType::F32);
    assert_eq!(manifest.config.dtype, DType::F32);
    assert!(
        manifest.complete,
        "every op has an f32 kernel: {:?}",
        manifest.missing_ops
    );
    assert_eq!(manifest.cubin.as_deref(), Some("kernels.sm90a.cubin"));
    assert!(out.join("kernels.sm90a.cubin").is_file());
    assert!(manifest.kernels.len() > 10, "{}", manifest.kernels.len());
    for k in &manifest.kernels {
        assert_ne!(k.template, "gemm_mma", "{} is a tensor-core GEMM", k.name);
        for (key, value) in &k.params {
            assert_ne!(value, "bf16", "{}: {key} = {value}", k.name);
            if key.ends_with("_t") {
                assert!(
                    value == "float" || value == "i64",
                    "{}: {key} = {value}",
                    k.name
                );
            }
        }
    }
    let kernels: Vec<&str> = manifest.kernels.iter().map(|k| k.name.as_str()).collect();
    for p in &manifest.phases {
        for name in launched(p) {
            assert!(kernels.contains(&name), "{name} is launched but not listed");
        }
    }
    for w in &manifest.weights {
        assert_eq!(w.dtype, DType::F32, "weight {}", w.name);
    }
    for s in &manifest.states {
        assert_eq!(s.dtype, DType::F32, "cache {}", s.name);
    }
    // The shared header defines the MMA helpers; no kernel after it may call one.
    let cu = std::fs::read_to_string(out.join("kernels.cu")).unwrap();
    let kernels_only = cu
        .strip_prefix(glmc_codegen::render::COMMON)
        .expect("kernels.cu starts with the shared header");
    assert!(
        !kernels_only.contains("mma") && !kernels_only.contains("ldmatrix"),
        "tensor-core code in kernels.cu"
    );
}

/// bf16 is GLM-5's own dtype, so it is the default; its prefill matmuls run on the tensor
/// cores (`gemm_mma`), its decode ones too above 16 rows, and on the skinny GEMMs below.
#[test]
fn compile_dtype_bf16_is_the_glm5_default_and_uses_gemm_mma_in_prefill() {
    let tmp = tempfile::tempdir().unwrap();
    let (bf16, default) = (
        tmp.path().join("bf16.glmc"),
        tmp.path().join("default.glmc"),
    );
    let (manifest, stderr) = compile_glm5(&bf16, &["--dtype", "bf16"]);
    assert!(
        stderr.contains("compiled glm5 (bf16) for sm90a"),
        "{stderr}"
    );
    assert_eq!(manifest.dtype, DType::BF16);
    assert!(manifest.complete, "{:?}", manifest.missing_ops);
    let mma: Vec<&str> = manifest
        .kernels
        .iter()
        .filter(|k| k.template == "gemm_mma")
        .map(|k| k.name.as_str())
        .collect();
    let prefill_mma = launched(phase(&manifest, "prefill"))
        .filter(|k| mma.contains(k))
        .count();
    // Per layer at least the fused q_a/kv_a, q_b and o projections run on the tensor cores.
    assert!(prefill_mma >= 3 * 78, "{prefill_mma} gemm_mma launches");
    let sixteen = glmc_codegen::expr::Bindings::from([("b".to_string(), 16)]);
    let decode_mma: Vec<_> = phase(&manifest, "decode")
        .launches()
        .filter(|l| mma.contains(&l.kernel.as_str()))
        .collect();
    assert!(!decode_mma.is_empty());
    assert!(decode_mma
        .iter()
        .all(|l| l.when.as_ref().and_then(|g| g.holds(&sixteen)) == Some(false)));

    let (_, stderr) = compile_glm5(&default, &[]);
    assert!(
        stderr.contains("compiled glm5 (bf16) for sm90a"),
        "{stderr}"
    );
    let manifest = |dir: &Path| std::fs::read_to_string(dir.join("manifest.ron")).unwrap();
    assert!(
        manifest(&default) == manifest(&bf16),
        "--dtype bf16 is not glm5's default"
    );
}

/// `--explain` states the dtype and where it came from.
#[test]
fn explain_states_the_dtype_and_its_source() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("a");
    let explain = |extra: &[&str]| {
        let mut args = vec![
            "compile",
            "models/tiny-dense.ron",
            "--target",
            "sm120",
            "-o",
            out.to_str().unwrap(),
            "--explain",
        ];
        args.extend_from_slice(extra);
        glmc_ok(&args)
    };
    let own = explain(&[]);
    assert!(
        own.contains("tiny_dense: dtype f32 (the model's dtype): the f32 validation mode"),
        "{own}"
    );
    let bf16 = explain(&["--dtype", "bf16"]);
    assert!(
        bf16.contains(
            "tiny_dense: dtype bf16 (--dtype bf16): activations and dense weights in bf16"
        ),
        "{bf16}"
    );
}

/// `dump --dtype bf16` of an f32 model shows the bf16 graph: weights, activations and caches in
/// bf16, the router and the logits still f32; `dump --dtype f32` of GLM-5 has no bf16 left.
#[test]
fn dump_shows_the_graph_of_the_chosen_dtype() {
    let own = glmc_ok(&["dump", "models/tiny-dense.ron", "--full"]);
    assert!(!own.contains("bf16"), "tiny-dense is an f32 model");
    let bf16 = glmc_ok(&["dump", "models/tiny-dense.ron", "--full", "--dtype", "bf16"]);
    for needle in [
        ": bf16[256,64] \"model.embed_tokens.weight\"",
        ": bf16[s,64] \"model.embed_tokens\"",
        "state \"model.layers.0.self_attn.cache.c_kv\" : bf16[16]",
        ": f32[8,64] \"model.layers.1.mlp.gate.weight\"",
        ": f32[b,256] \"logits\"",
    ] {
        assert!(bf16.contains(needle), "no {needle:?} in\n{bf16}");
    }
    let f32 = glmc_ok(&["dump", "models/glm5.ron", "--dtype", "f32"]);
    assert!(!f32.contains("bf16"), "{f32}");
}

/// `glmc run FIXTURE --device cpu [--dtype DTYPE]` on a 12-token prompt for 8 tokens: the greedy
/// tokens as printed, and the logits (f32 [20, vocab]) and vocab `--dump-logits` writes.
fn run_cpu(fixture: &str, dtype: Option<&str>, dump: &Path) -> (String, Vec<f32>, usize) {
    let fixture = repo_path(fixture);
    let mut args = vec![
        "run",
        fixture.to_str().unwrap(),
        "--prompt-ids",
        "1,2,3,4,5,6,7,8,9,10,11,12",
        "--max-new-tokens",
        "8",
        "--device",
        "cpu",
        "--dump-logits",
        dump.to_str().unwrap(),
    ];
    if let Some(dtype) = dtype {
        args.extend(["--dtype", dtype]);
    }
    let o = glmc(&args);
    let tokens = success(&o, &format!("glmc {}", args.join(" ")));
    let bytes = std::fs::read(dump).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor("logits").unwrap();
    let logits = t
        .data()
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    (tokens.trim().to_string(), logits, t.shape()[1])
}

/// `run --device cpu --dtype bf16` on an f32 oracle checkpoint rounds its weights to bf16: the
/// logits move, by about what bf16 weights move them, and the greedy tokens stay.
///
/// The bound: a weight rounded to bf16 moves by at most 2^-9 of itself, a dot product of
/// independently rounded weights by about 2^-9/√3 ≈ 1.1e-3 of its size, and the ~60 weight
/// tensors on a token's path through this 3-layer model (norms, projections, indexer, the
/// shared and two routed experts) add that up in quadrature to about 0.9% of a logit's scale;
/// measured, the largest deviation of the 20 × 256 logits is 1.1% of the largest logit. 3%
/// holds that with room, and is still far below what a discrete decision does: on other
/// fixtures and prompts the rounding flips an expert or an indexer top-k choice near a tie,
/// which moves a row by 1 to 7 (up to the whole logit scale). `dense-equivalent` with this
/// prompt flips none, so a failure here is a real error, not a tie.
///
/// The tokens: on this fixture and prompt every generated token's f32 top-2 margin is more than
/// twice the largest bf16 deviation on its row (the smallest margin is 0.115, against 0.048), so
/// greedy decoding must pick the same tokens in both dtypes.
#[test]
fn run_cpu_dtype_bf16_rounds_the_weights_and_keeps_the_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    let fixture = "tests/oracle/fixtures/dense-equivalent";
    let (tokens32, logits32, vocab) = run_cpu(fixture, Some("f32"), &tmp.path().join("f32"));
    let (tokens16, logits16, _) = run_cpu(fixture, Some("bf16"), &tmp.path().join("bf16"));
    assert_eq!(tokens16, tokens32);
    assert_eq!(tokens32.split_whitespace().count(), 8);
    assert_eq!(logits32.len(), 20 * vocab);
    assert_eq!(logits16.len(), logits32.len());
    assert!(logits16.iter().all(|x| x.is_finite()));
    let scale = logits32.iter().fold(0f32, |m, x| m.max(x.abs()));
    let diff = logits32
        .iter()
        .zip(&logits16)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        diff <= 0.03 * scale,
        "bf16 moved the logits by {diff} (largest logit {scale})"
    );
    // Unchanged logits would mean the weights were not rounded: bf16 on the CPU would be f32.
    assert!(
        diff >= 1e-3 * scale,
        "bf16 moved the logits by only {diff} (largest logit {scale})"
    );
}

/// An oracle fixture's config.json says float32, so `--dtype f32` is its default and changes
/// nothing.
#[test]
fn run_cpu_dtype_f32_is_the_default_of_an_f32_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let fixture = "tests/oracle/fixtures/sparse";
    let f32 = run_cpu(fixture, Some("f32"), &tmp.path().join("f32"));
    let default = run_cpu(fixture, None, &tmp.path().join("default"));
    assert!(
        f32 == default,
        "--dtype f32 is not the f32 fixture's default"
    );
}
