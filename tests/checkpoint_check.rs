//! Silent failures made loud: configs that lost keys, and checkpoints that do not fit their
//! config, edited from the committed `sparse` oracle fixture and from GLM-5's config.json. Each
//! case asserts the exit code and the key phrases of the message; a failing compile leaves no
//! artifact.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use common::{glmc_in, stderr_of, stdout_of};
use safetensors::tensor::{Dtype, TensorView};
use serde_json::{json, Map, Value};

fn fixture(name: &str) -> PathBuf {
    common::repo_path(&format!("tests/oracle/fixtures/{name}"))
}

/// A copy of the `sparse` fixture in `dir/ckpt`, with `edit` applied to its config.json.
fn checkpoint(dir: &Path, edit: impl FnOnce(&mut Map<String, Value>)) -> PathBuf {
    let to = dir.join("ckpt");
    fs::create_dir(&to).unwrap();
    for entry in fs::read_dir(fixture("sparse")).unwrap() {
        let entry = entry.unwrap();
        fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
    let path = to.join("config.json");
    let mut config: Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    edit(config.as_object_mut().unwrap());
    fs::write(&path, serde_json::to_string_pretty(&config).unwrap()).unwrap();
    to
}

/// Rewrites `ckpt/model.safetensors`: `edit` gets every tensor as (name, dtype, shape, bytes).
fn edit_tensors(ckpt: &Path, edit: impl FnOnce(&mut Vec<(String, Dtype, Vec<usize>, Vec<u8>)>)) {
    let path = ckpt.join("model.safetensors");
    let bytes = fs::read(&path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = file
        .tensors()
        .into_iter()
        .map(|(name, t)| (name, t.dtype(), t.shape().to_vec(), t.data().to_vec()))
        .collect();
    edit(&mut tensors);
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            (
                name.clone(),
                TensorView::new(*dtype, shape.clone(), data).unwrap(),
            )
        })
        .collect();
    fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn f32_tensor(name: &str, shape: &[usize]) -> (String, Dtype, Vec<usize>, Vec<u8>) {
    let n: usize = shape.iter().product();
    (name.to_string(), Dtype::F32, shape.to_vec(), vec![0; 4 * n])
}

fn glmc(dir: &Path, args: &[&str]) -> Output {
    glmc_in(dir, args)
}

/// Asserts exit 2 without a panic; the stderr.
fn fails(out: &Output, what: &str) -> String {
    let stderr = stderr_of(out);
    assert_eq!(out.status.code(), Some(2), "{what}: {stderr}");
    common::assert_no_panic(&stderr, what);
    stderr
}

/// Asserts success; (stdout, stderr).
fn succeeds(out: &Output, what: &str) -> (String, String) {
    common::success(out, what);
    (stdout_of(out), stderr_of(out))
}

fn assert_has(text: &str, phrases: &[&str]) {
    for p in phrases {
        assert!(text.contains(p), "no {p:?} in:\n{text}");
    }
}

/// `compile ckpt -o out` must fail with exit 2 and leave no `out`; its stderr.
fn compile_fails(dir: &Path) -> String {
    let out = glmc(dir, &["compile", "ckpt", "--target", "sm120", "-o", "out"]);
    let stderr = fails(&out, "compile");
    assert!(
        !dir.join("out").exists(),
        "a failed compile left an artifact"
    );
    let leftovers: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != "ckpt")
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    stderr
}

const PROMPT: &[&str] = &["--prompt-ids", "3,17,42", "--max-new-tokens", "2"];

#[test]
fn the_fixtures_import_compile_and_run_without_any_warning() {
    let tmp = tempfile::tempdir().unwrap();
    for entry in fs::read_dir(common::repo_path("tests/oracle/fixtures")).unwrap() {
        let dir = entry.unwrap().path();
        let d = dir.to_str().unwrap();
        let out = tmp.path().join("out");
        let ron = tmp.path().join("m.ron");
        for args in [
            vec!["import-hf", d, "-o", ron.to_str().unwrap()],
            vec![
                "compile",
                d,
                "--target",
                "sm120",
                "-o",
                out.to_str().unwrap(),
            ],
            vec!["inspect", d],
            [&["run", d][..], PROMPT].concat(),
        ] {
            let what = format!("glmc {}", args.join(" "));
            let (_, stderr) = succeeds(&glmc(tmp.path(), &args), &what);
            assert!(
                !stderr.contains("warning") && !stderr.contains("note:"),
                "{what}:\n{stderr}"
            );
        }
        let manifest = fs::read_to_string(out.join("manifest.ron")).unwrap();
        assert!(manifest.contains("notes: [],"), "{manifest}");
    }
}

#[test]
fn inspect_names_the_attention_path_and_the_key_it_follows() {
    let out = glmc(
        &common::repo(),
        &["inspect", "tests/oracle/fixtures/shared-indexer"],
    );
    let (stdout, _) = succeeds(&out, "inspect");
    assert_has(
        &stdout,
        &[
            "attention: auto takes sparse (DSA top-k), following index_topk = 8 (from config.json)",
            "indexer_types              2 full, 2 shared",
            "F32 ",
            "routed experts",
            "the checkpoint fits its config: it can run",
        ],
    );
}

#[test]
fn absent_index_topk_is_noted_by_every_command_and_recorded_in_the_artifact() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    checkpoint(dir, |m| {
        m.remove("index_topk");
    });
    let note = "note: index_topk absent: transformers' default 2048 used";
    for args in [
        vec!["import-hf", "ckpt", "-o", "m.ron"],
        vec![
            "compile",
            "ckpt",
            "--target",
            "sm120",
            "-o",
            "out",
            "--explain",
        ],
        vec!["dump", "ckpt"],
        [&["run", "ckpt"][..], PROMPT].concat(),
        vec!["inspect", "ckpt"],
    ] {
        let what = format!("glmc {}", args.join(" "));
        let (stdout, stderr) = succeeds(&glmc(dir, &args), &what);
        assert!(stderr.contains(note), "{what}: {stderr}");
        if args[0] == "inspect" {
            assert_has(
                &stdout,
                &[
                    "* index_topk                 2048",
                    "following index_topk = 2048 (absent from config.json: transformers' default)",
                ],
            );
        }
    }
    let artifact_note = "index_topk absent: transformers' default 2048 used";
    let manifest: glmc_codegen::artifact::Manifest<glmc_models::ModelConfig> =
        ron::from_str(&fs::read_to_string(dir.join("out/manifest.ron")).unwrap()).unwrap();
    assert_eq!(manifest.notes, [artifact_note]);
    assert!(fs::read_to_string(dir.join("out/explain.txt"))
        .unwrap()
        .contains(&format!("config.json: {artifact_note}")));
    assert!(fs::read_to_string(dir.join("m.ron"))
        .unwrap()
        .contains("index_topk: 2048"));
}

#[test]
fn glm5_config_without_index_topk_or_indexer_sizes_stays_sparse_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("GLM-5");
    fs::create_dir(&dir).unwrap();
    let mut config: Value =
        serde_json::from_str(&fs::read_to_string(common::glm5_config_json()).unwrap()).unwrap();
    for key in ["index_topk", "index_n_heads", "index_head_dim"] {
        config.as_object_mut().unwrap().remove(key);
    }
    fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let out = glmc(
        tmp.path(),
        &[
            "compile",
            "GLM-5",
            "--target",
            "sm120",
            "-o",
            "out",
            "--explain",
        ],
    );
    let (stdout, stderr) = succeeds(&out, "compile GLM-5");
    assert_has(
        &stderr,
        &[
            "note: index_topk absent: transformers' default 2048 used",
            "note: index_n_heads absent: transformers' default 32 used",
            "note: index_head_dim absent: transformers' default 128 used",
        ],
    );
    assert_has(&stdout, &["has a DSA indexer (index_topk=2048): sparse"]);
    let model_ron = fs::read_to_string(common::repo_path("models/glm5.ron")).unwrap();
    let imported_out = glmc(tmp.path(), &["import-hf", "GLM-5", "-o", "m.ron"]);
    succeeds(&imported_out, "import-hf GLM-5");
    let imported = fs::read_to_string(tmp.path().join("m.ron")).unwrap();
    assert_eq!(
        imported.replace("name: \"GLM-5\"", "name: \"glm5\""),
        model_ron,
        "transformers' defaults give back models/glm5.ron"
    );
}

#[test]
fn absent_indexer_sizes_that_do_not_fit_the_checkpoint_are_shape_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    checkpoint(dir, |m| {
        m.remove("index_n_heads");
        m.remove("index_head_dim");
    });
    let phrases = [
        "note: index_n_heads absent: transformers' default 32 used",
        "model.layers.0.self_attn.indexer.wq_b.weight\" has shape [128, 32] in the checkpoint, but the config gives [4096, 32]",
        "[index_n_heads × index_head_dim, q_lora_rank] = [32 × 128, 32]",
    ];
    assert_has(&compile_fails(dir), &phrases);
    let inspect = glmc(dir, &["inspect", "ckpt"]);
    let stderr = fails(&inspect, "inspect");
    assert_has(&stderr, &phrases);
    assert_has(
        &stdout_of(&inspect),
        &["* index_head_dim             128", "error: tensor"],
    );
    assert_has(
        &fails(&glmc(dir, &[&["run", "ckpt"][..], PROMPT].concat()), "run"),
        &phrases[1..],
    );
}

#[test]
fn indexer_tensors_under_dense_attention_are_one_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    checkpoint(dir, |_| {});
    let phrases = [
        "warning: the checkpoint ckpt has 15 tensors, 66.4 KiB that the graph will not read:",
        "15 tensors, 66.4 KiB (first \"model.layers.0.self_attn.indexer.k_norm.bias\"): attention = dense",
    ];
    let compile = glmc(
        dir,
        &[
            "compile",
            "ckpt",
            "--target",
            "sm120",
            "-o",
            "out",
            "--attention",
            "dense",
        ],
    );
    assert_has(&succeeds(&compile, "compile --attention dense").1, &phrases);
    assert_eq!(stderr_of(&compile).matches("warning:").count(), 1);
    let run = glmc(
        dir,
        &[&["run", "ckpt", "--attention", "dense"][..], PROMPT].concat(),
    );
    assert_has(&succeeds(&run, "run --attention dense").1, &phrases[1..]);
    let inspect = glmc(dir, &["inspect", "ckpt", "--attention", "dense"]);
    let (stdout, _) = succeeds(&inspect, "inspect --attention dense");
    assert_has(
        &stdout,
        &[
            "dense (forced) takes dense, though the model has an indexer (index_topk = 8)",
            "attention = dense",
        ],
    );

    // A model.ron without an indexer, run on the same weights: the config key explains them.
    let ron = glmc(dir, &["import-hf", "ckpt", "-o", "m.ron"]);
    succeeds(&ron, "import-hf");
    let text = fs::read_to_string(dir.join("m.ron")).unwrap();
    let start = text.find("    indexer: Some(").unwrap();
    let end = start + text[start..].find("    )),\n").unwrap() + "    )),\n".len();
    fs::write(
        dir.join("m.ron"),
        format!("{}    indexer: None,\n{}", &text[..start], &text[end..]),
    )
    .unwrap();
    let run = glmc(
        dir,
        &[&["run", "m.ron", "--weights", "ckpt"][..], PROMPT].concat(),
    );
    assert_has(
        &succeeds(&run, "run m.ron").1,
        &["15 tensors", "the config has no indexer"],
    );
}

#[test]
fn a_missing_tensor_names_the_key_that_asked_for_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ckpt = checkpoint(dir, |_| {});
    edit_tensors(&ckpt, |t| {
        t.retain(|(name, ..)| name != "model.layers.1.mlp.experts.7.up_proj.weight")
    });
    let phrases = [
        "does not fit its config (1 problem)",
        "tensor \"model.layers.1.mlp.experts.7.up_proj.weight\" is not in the checkpoint; the config asks for it through n_routed_experts = 8 (expert 7)",
    ];
    assert_has(&compile_fails(dir), &phrases);
    assert_has(
        &fails(&glmc(dir, &["inspect", "ckpt"]), "inspect"),
        &phrases,
    );
    assert_has(
        &fails(&glmc(dir, &[&["run", "ckpt"][..], PROMPT].concat()), "run"),
        &phrases,
    );
}

#[test]
fn a_wrong_kv_b_proj_shape_names_both_numbers_and_the_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ckpt = checkpoint(dir, |_| {});
    let name = "model.layers.2.self_attn.kv_b_proj.weight";
    edit_tensors(&ckpt, |t| {
        t.retain(|(n, ..)| n != name);
        t.push(f32_tensor(name, &[120, 16]));
    });
    let phrases = [
        "tensor \"model.layers.2.self_attn.kv_b_proj.weight\" has shape [120, 16] in the checkpoint, but the config gives [128, 16]",
        "[num_attention_heads × (qk_nope_head_dim + v_head_dim), kv_lora_rank] = [4 × (16 + 16), 16]",
    ];
    assert_has(&compile_fails(dir), &phrases);
    let inspect = glmc(dir, &["inspect", "ckpt"]);
    assert_has(&fails(&inspect, "inspect"), &phrases);
    assert!(!stdout_of(&inspect).contains("it can run"));
    assert_has(
        &fails(&glmc(dir, &[&["run", "ckpt"][..], PROMPT].concat()), "run"),
        &phrases,
    );
}

#[test]
fn an_expert_count_below_the_checkpoint_names_both_numbers() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    checkpoint(dir, |m| {
        m.insert("n_routed_experts".into(), json!(6));
    });
    let stderr = compile_fails(dir);
    assert_has(
        &stderr,
        &[
            "\"model.layers.1.mlp.gate.weight\" has shape [8, 64] in the checkpoint, but the config gives [6, 64]",
            "[n_routed_experts, hidden_size] = [6, 64]",
        ],
    );
}

#[test]
fn extra_unknown_tensors_are_one_warning_and_the_mtp_layer_a_note() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ckpt = checkpoint(dir, |m| {
        m.insert("num_nextn_predict_layers".into(), json!(1));
    });
    edit_tensors(&ckpt, |t| {
        t.push(f32_tensor("vision_tower.proj.weight", &[4, 4]));
        t.push(f32_tensor("model.layers.3.eh_proj.weight", &[64, 128]));
        t.push(f32_tensor("model.layers.3.enorm.weight", &[64]));
    });
    for args in [
        vec!["compile", "ckpt", "--target", "sm120", "-o", "out"],
        [&["run", "ckpt"][..], PROMPT].concat(),
    ] {
        let what = format!("glmc {}", args.join(" "));
        let (_, stderr) = succeeds(&glmc(dir, &args), &what);
        assert_has(
            &stderr,
            &[
                "warning: the checkpoint ckpt has 1 tensor, 64 bytes that the graph will not read:",
                "(first \"vision_tower.proj.weight\"): unknown names that no config key accounts for",
                "note: the checkpoint's multi-token-prediction layer (2 tensors, 32.2 KiB) is recognised and not run",
            ],
        );
        assert!(!stderr.contains("model.layers.3"), "{what}: {stderr}");
    }
    let (stdout, _) = succeeds(&glmc(dir, &["inspect", "ckpt"]), "inspect");
    assert_has(
        &stdout,
        &["MTP layer ", "warning: the checkpoint", "it can run"],
    );
}
