//! Loading safetensors checkpoints written into a temporary directory, applying recipes to them,
//! and the errors a broken or mismatched checkpoint must give.

use std::fs;
use std::path::Path;

use glmc_ir::{DType, Recipe};
use glmc_runtime::weights::Dtype;
use glmc_runtime::{Checkpoint, WeightError};
use half::{bf16, f16};
use safetensors::tensor::TensorView;
use tempfile::TempDir;

/// One tensor to write: name, stored dtype, shape, little-endian bytes.
struct Raw {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

fn raw(name: &str, dtype: Dtype, shape: &[usize], bytes: Vec<u8>) -> Raw {
    Raw {
        name: name.to_string(),
        dtype,
        shape: shape.to_vec(),
        bytes,
    }
}

fn f32s(name: &str, shape: &[usize], values: &[f32]) -> Raw {
    let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    raw(name, Dtype::F32, shape, bytes)
}

/// An f32 tensor holding 0, 1, 2, ... in row-major order.
fn arange(name: &str, shape: &[usize]) -> Raw {
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n).map(|i| i as f32).collect();
    f32s(name, shape, &values)
}

fn write_file(path: &Path, tensors: &[Raw]) {
    let views = tensors.iter().map(|t| {
        let view = TensorView::new(t.dtype, t.shape.clone(), &t.bytes).unwrap();
        (t.name.clone(), view)
    });
    // transformers writes this metadata into every file; the loader must accept it.
    let metadata = [("format".to_string(), "pt".to_string())].into();
    fs::write(path, safetensors::serialize(views, Some(metadata)).unwrap()).unwrap();
}

/// A temp dir holding `model.safetensors` with `tensors`.
fn single(tensors: &[Raw]) -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_file(&dir.path().join("model.safetensors"), tensors);
    dir
}

fn open(tensors: &[Raw]) -> (TempDir, Checkpoint) {
    let dir = single(tensors);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    (dir, ckpt)
}

fn load_f32(ckpt: &Checkpoint, name: &str) -> Vec<f32> {
    ckpt.load(name).unwrap().into_f32().unwrap()
}

fn leaf(name: &str, shape: &[u64]) -> Recipe {
    Recipe::tensor(name, shape.to_vec())
}

fn materialize(ckpt: &Checkpoint, recipe: &Recipe) -> (Vec<usize>, Vec<f32>) {
    let t = ckpt.materialize(recipe).unwrap();
    (t.shape().to_vec(), t.into_f32().unwrap())
}

// ---- dtypes ----

#[test]
fn f32_round_trip() {
    let values = [1.0, -2.5, 3.25e-3, 0.0, f32::MAX, -7.0];
    let (_d, ckpt) = open(&[f32s("w", &[2, 3], &values)]);
    let t = ckpt.load("w").unwrap();
    assert_eq!(t.shape(), &[2, 3]);
    assert_eq!(t.as_f32().unwrap(), &values);
}

#[test]
fn bf16_round_trip() {
    // 1.5 is 0x3FC0 in bf16; hand-written little-endian bytes check the byte order too.
    let mut bytes = vec![0xC0, 0x3F];
    for v in [-2.0f32, 0.15625, 256.0] {
        bytes.extend(bf16::from_f32(v).to_le_bytes());
    }
    let (_d, ckpt) = open(&[raw("w", Dtype::BF16, &[4], bytes)]);
    assert_eq!(load_f32(&ckpt, "w"), [1.5, -2.0, 0.15625, 256.0]);
}

#[test]
fn f16_round_trip() {
    // 1.5 is 0x3E00 in f16; 2^-24 is the smallest subnormal, 65504 the largest finite value.
    let mut bytes = vec![0x00, 0x3E];
    for v in [-0.5f32, 65504.0, 2f32.powi(-24)] {
        bytes.extend(f16::from_f32(v).to_le_bytes());
    }
    let (_d, ckpt) = open(&[raw("w", Dtype::F16, &[2, 2], bytes)]);
    assert_eq!(load_f32(&ckpt, "w"), [1.5, -0.5, 65504.0, 2f32.powi(-24)]);
}

#[test]
fn f64_converts_to_nearest_f32() {
    let bytes = [0.1f64, 2.5, -1e-3]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let (_d, ckpt) = open(&[raw("w", Dtype::F64, &[3], bytes)]);
    assert_eq!(load_f32(&ckpt, "w"), [0.1f32, 2.5, -1e-3f32]);
}

/// The weights of a bf16 graph, from each stored float type: rounded once, to nearest-even.
#[test]
fn materialize_as_bf16_rounds_every_stored_float_type_to_nearest_even() {
    let one_ulp = 2f64.powi(-7);
    // 1 + 2^-8 is a bf16 tie (goes to even, 1); 1 + 3·2^-8 a tie that goes up; just past a tie
    // rounds up, however little past. 1 + 2^-8 + 2^-40 is the case a detour through f32 gets
    // wrong: the f32 rounding lands on the tie and then goes to even.
    let cases: [(f64, f64); 6] = [
        (1.0 + 2f64.powi(-8), 1.0),
        (1.0 + 3.0 * 2f64.powi(-8), 1.0 + 2.0 * one_ulp),
        (1.0 + 2f64.powi(-8) + 2f64.powi(-40), 1.0 + one_ulp),
        (-(1.0 + 2f64.powi(-8) + 2f64.powi(-40)), -(1.0 + one_ulp)),
        (0.1, f64::from(bf16::from_f32(0.1).to_f32())),
        (1e39, f64::INFINITY),
    ];
    let f64_bytes = cases.iter().flat_map(|(v, _)| v.to_le_bytes()).collect();
    let f32_values: Vec<f32> = cases.iter().map(|&(v, _)| v as f32).collect();
    let (_d, ckpt) = open(&[
        raw("w64", Dtype::F64, &[6], f64_bytes),
        f32s("w32", &[6], &f32_values),
        raw(
            "w16",
            Dtype::BF16,
            &[2],
            [1.5f32, -3.0]
                .iter()
                .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
                .collect(),
        ),
    ]);
    let as_bf16 = |name: &str, n: u64| {
        ckpt.materialize_as(&leaf(name, &[n]), DType::BF16)
            .unwrap()
            .into_f32()
            .unwrap()
    };
    let expected: Vec<f32> = cases.iter().map(|&(_, r)| r as f32).collect();
    assert_eq!(as_bf16("w64", 6), expected);
    // From f32 the tie-plus-2^-40 case is already the tie, so it goes to even: f32 rounding,
    // not the loader's.
    let from_f32: Vec<f32> = f32_values
        .iter()
        .map(|&v| bf16::from_f32(v).to_f32())
        .collect();
    assert_eq!(as_bf16("w32", 6), from_f32);
    assert_eq!(as_bf16("w16", 2), [1.5, -3.0]);
    // As f32 nothing but the f64 → f32 rounding happens.
    let t = ckpt.materialize_as(&leaf("w32", &[6]), DType::F32).unwrap();
    assert_eq!(t.into_f32().unwrap(), f32_values);
}

/// A bf16 checkpoint loads exactly into an f32 graph, and its values are fixed points of the
/// rounding to bf16.
#[test]
fn bf16_weights_load_exactly_as_f32_and_as_bf16() {
    let values = [1.5f32, -2.0, 0.15625, 3.0e-3, -7.5e4];
    let bytes = values
        .iter()
        .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
        .collect();
    let (_d, ckpt) = open(&[raw("w", Dtype::BF16, &[5], bytes)]);
    let exact: Vec<f32> = values.iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
    for dtype in [DType::F32, DType::BF16] {
        let t = ckpt.materialize_as(&leaf("w", &[5]), dtype).unwrap();
        assert_eq!(t.into_f32().unwrap(), exact, "{dtype}");
    }
}

#[test]
fn integers_load_as_i64() {
    let i64_bytes = [-1i64, 1 << 40]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let i32_bytes = [-7i32, 5].iter().flat_map(|v| v.to_le_bytes()).collect();
    let (_d, ckpt) = open(&[
        raw("a", Dtype::I64, &[2], i64_bytes),
        raw("b", Dtype::I32, &[2], i32_bytes),
    ]);
    assert_eq!(ckpt.load("a").unwrap().as_i64().unwrap(), &[-1, 1 << 40]);
    assert_eq!(ckpt.load("b").unwrap().as_i64().unwrap(), &[-7, 5]);
}

#[test]
fn unsupported_dtype_names_tensor_and_dtype() {
    let (dir, ckpt) = open(&[raw("q", Dtype::F8_E4M3, &[4], vec![0x38; 4])]);
    // Opening succeeds: an FP8 checkpoint is still a valid checkpoint; reading q is not.
    assert_eq!(ckpt.stored("q").unwrap().dtype, Dtype::F8_E4M3);
    for err in [
        ckpt.load("q").unwrap_err(),
        ckpt.check(&leaf("q", &[4])).unwrap_err(),
        ckpt.materialize(&leaf("q", &[4])).unwrap_err(),
    ] {
        assert!(
            matches!(&err, WeightError::UnsupportedDType { tensor, dtype: Dtype::F8_E4M3, .. } if tensor == "q")
        );
        let msg = err.to_string();
        assert!(
            msg.contains("\"q\"") && msg.contains("F8_E4M3") && msg.contains("BF16"),
            "{msg}"
        );
        assert!(msg.contains(&dir.path().join("model.safetensors").display().to_string()));
    }
}

// ---- layout of a checkpoint ----

#[test]
fn sharded_checkpoint_via_index() {
    let dir = tempfile::tempdir().unwrap();
    let shard1 = "model-00001-of-00002.safetensors";
    let shard2 = "model-00002-of-00002.safetensors";
    write_file(
        &dir.path().join(shard1),
        &[arange("a", &[2]), arange("b", &[3])],
    );
    write_file(&dir.path().join(shard2), &[f32s("c", &[1], &[9.0])]);
    // Files the index does not name are ignored, even safetensors ones.
    write_file(
        &dir.path().join("stray.safetensors"),
        &[arange("stray", &[1])],
    );
    fs::write(dir.path().join("config.json"), "{not json").unwrap();
    let index = serde_json::json!({
        "metadata": {"total_size": 24},
        "weight_map": {"a": shard1, "b": shard1, "c": shard2}
    });
    fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();

    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ckpt.names(), ["a", "b", "c"]);
    assert_eq!(load_f32(&ckpt, "b"), [0., 1., 2.]);
    assert_eq!(load_f32(&ckpt, "c"), [9.]);
    let c = ckpt.stored("c").unwrap();
    assert_eq!(c.file, dir.path().join(shard2));
    assert_eq!(c.shape, &[1]);
    assert!(ckpt.stored("stray").is_none());
}

#[test]
fn single_file_wins_over_index() {
    let dir = single(&[arange("w", &[2])]);
    fs::write(dir.path().join("model.safetensors.index.json"), "garbage").unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ckpt.names(), ["w"]);
    assert_eq!(ckpt.dir(), dir.path());
}

// ---- recipes ----

#[test]
fn recipe_tensor_and_transpose() {
    let (_d, ckpt) = open(&[arange("w", &[2, 3])]);
    assert_eq!(
        materialize(&ckpt, &leaf("w", &[2, 3])),
        (vec![2, 3], vec![0., 1., 2., 3., 4., 5.])
    );
    assert_eq!(
        materialize(&ckpt, &leaf("w", &[2, 3]).transpose(vec![1, 0])),
        (vec![3, 2], vec![0., 3., 1., 4., 2., 5.])
    );
}

#[test]
fn recipe_slice() {
    let (_d, ckpt) = open(&[arange("w", &[2, 3])]);
    assert_eq!(
        materialize(&ckpt, &leaf("w", &[2, 3]).slice(1, 1, 3)),
        (vec![2, 2], vec![1., 2., 4., 5.])
    );
    assert_eq!(
        materialize(&ckpt, &leaf("w", &[2, 3]).slice(0, 1, 2)),
        (vec![1, 3], vec![3., 4., 5.])
    );
}

#[test]
fn recipe_concat_fuses_projections_and_slices_undo_it() {
    // Like fuse-mla-projections: rows of q_a then rows of kv_a, one GEMM weight.
    let (_d, ckpt) = open(&[arange("q_a", &[2, 2]), f32s("kv_a", &[1, 2], &[7., 8.])]);
    let fused = Recipe::Concat {
        axis: 0,
        parts: vec![leaf("q_a", &[2, 2]), leaf("kv_a", &[1, 2])],
    };
    assert_eq!(
        materialize(&ckpt, &fused),
        (vec![3, 2], vec![0., 1., 2., 3., 7., 8.])
    );
    assert_eq!(
        materialize(&ckpt, &fused.clone().slice(0, 2, 3)),
        (vec![1, 2], vec![7., 8.])
    );
    let cols = Recipe::Concat {
        axis: 1,
        parts: vec![
            leaf("q_a", &[2, 2]),
            leaf("kv_a", &[1, 2]).transpose(vec![1, 0]),
        ],
    };
    assert_eq!(
        materialize(&ckpt, &cols),
        (vec![2, 3], vec![0., 1., 7., 2., 3., 8.])
    );
}

#[test]
fn recipe_reshape_splits_heads() {
    let (_d, ckpt) = open(&[arange("w", &[4, 2])]);
    // [heads*rows, in] -> [heads, rows, in] -> rows 1.. of every head.
    let r = leaf("w", &[4, 2]).reshape(vec![2, 2, 2]).slice(1, 1, 2);
    assert_eq!(
        materialize(&ckpt, &r),
        (vec![2, 1, 2], vec![2., 3., 6., 7.])
    );
}

#[test]
fn recipe_stack_of_experts() {
    let experts: Vec<Raw> = (0..3)
        .map(|e| {
            let v = e as f32 * 10.0;
            f32s(&format!("mlp.experts.{e}.w"), &[2], &[v, v + 1.0])
        })
        .collect();
    let (_d, ckpt) = open(&experts);
    let stack = Recipe::Stack {
        pattern: "mlp.experts.{e}.w".into(),
        count: 3,
        shape: vec![2],
    };
    assert_eq!(
        materialize(&ckpt, &stack),
        (vec![3, 2], vec![0., 1., 10., 11., 20., 21.])
    );
    assert_eq!(
        materialize(&ckpt, &stack.transpose(vec![1, 0])),
        (vec![2, 3], vec![0., 10., 20., 1., 11., 21.])
    );
}

#[test]
fn recipe_result_shape_is_recipe_shape() {
    let (_d, ckpt) = open(&[arange("w", &[2, 3, 4])]);
    let r = leaf("w", &[2, 3, 4])
        .transpose(vec![2, 0, 1])
        .slice(2, 1, 3)
        .reshape(vec![8, 2]);
    let expected: Vec<usize> = r.shape().unwrap().iter().map(|&d| d as usize).collect();
    assert_eq!(ckpt.materialize(&r).unwrap().shape(), expected.as_slice());
}

#[test]
fn invalid_recipe_is_rejected_before_loading() {
    let (_d, ckpt) = open(&[arange("experts.0.w", &[2])]);
    let bad = Recipe::Stack {
        pattern: "experts.0.w".into(),
        count: 2,
        shape: vec![2],
    };
    let err = ckpt.materialize(&bad).unwrap_err();
    assert!(matches!(err, WeightError::Recipe(_)), "{err}");
    assert!(err.to_string().contains("no `{e}` placeholder"), "{err}");
    assert!(matches!(ckpt.check(&bad), Err(WeightError::Recipe(_))));
}

// ---- errors: recipes against the checkpoint ----

#[test]
fn check_accepts_matching_checkpoint() {
    let (_d, ckpt) = open(&[arange("a", &[2, 3]), arange("b", &[3])]);
    ckpt.check(&leaf("a", &[2, 3])).unwrap();
    ckpt.check_all([&leaf("a", &[2, 3]), &leaf("b", &[3])])
        .unwrap();
}

#[test]
fn missing_tensor_is_named_with_a_similar_one() {
    let (dir, ckpt) = open(&[
        arange("language_model.model.norm.weight", &[2]),
        arange("model.layers.0.mlp.gate_up_proj.weight", &[2]),
    ]);
    let err = ckpt.check(&leaf("model.norm.weight", &[2])).unwrap_err();
    let msg = err.to_string();
    assert_eq!(
        msg,
        format!(
            "tensor \"model.norm.weight\" is not in the checkpoint {} (a similarly named tensor \
             exists: \"language_model.model.norm.weight\")",
            dir.path().display()
        )
    );
    let err = ckpt
        .materialize(&leaf("model.layers.0.mlp.gate_proj.weight", &[2]))
        .unwrap_err();
    assert!(
        matches!(&err, WeightError::Missing { similar: Some(s), .. }
        if s == "model.layers.0.mlp.gate_up_proj.weight"),
        "{err}"
    );
    let err = ckpt.load("lm_head.weight").unwrap_err();
    assert!(
        matches!(&err, WeightError::Missing { tensor, similar: None, .. } if tensor == "lm_head.weight")
    );
}

#[test]
fn wrong_shape_names_both_shapes_and_the_file() {
    let (dir, ckpt) = open(&[arange("w", &[2, 3])]);
    let err = ckpt.check(&leaf("w", &[3, 2])).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "tensor \"w\" in {} has shape [2, 3], but the recipe expects [3, 2]",
            dir.path().join("model.safetensors").display()
        )
    );
    assert!(matches!(
        ckpt.materialize(&leaf("w", &[3, 2]).transpose(vec![1, 0])),
        Err(WeightError::Shape { .. })
    ));
}

#[test]
fn check_all_lists_every_problem_once() {
    let (_d, ckpt) = open(&[arange("a", &[2]), arange("b", &[2])]);
    let recipes = [
        leaf("a", &[2]),
        leaf("b", &[3]),
        leaf("b", &[3]).transpose(vec![0]),
        leaf("gone", &[1]),
    ];
    let err = ckpt.check_all(&recipes).unwrap_err();
    let WeightError::Problems { problems, .. } = &err else {
        panic!("expected a list, got {err}");
    };
    assert_eq!(problems.len(), 2, "{err}");
    assert!(matches!(problems[0], WeightError::Shape { .. }));
    assert!(matches!(problems[1], WeightError::Missing { .. }));
    let msg = err.to_string();
    assert!(msg.starts_with("2 problems with the checkpoint"), "{msg}");
    assert!(
        msg.contains("\n  - tensor \"b\"") && msg.contains("\n  - tensor \"gone\""),
        "{msg}"
    );
}

#[test]
fn check_all_caps_the_listing() {
    let (_d, ckpt) = open(&[arange("a", &[2])]);
    let stack = Recipe::Stack {
        pattern: "experts.{e}.w".into(),
        count: 25,
        shape: vec![2],
    };
    let err = ckpt.check_all([&stack]).unwrap_err();
    let msg = err.to_string();
    assert!(msg.starts_with("25 problems"), "{msg}");
    assert_eq!(msg.matches("\n  - ").count(), 20, "{msg}");
    assert!(msg.ends_with("\n  and 5 more"), "{msg}");
}

// ---- errors: the directory and its files ----

#[test]
fn missing_directory() {
    let dir = tempfile::tempdir().unwrap();
    let gone = dir.path().join("nope");
    let err = Checkpoint::open(&gone).err().unwrap();
    assert!(matches!(err, WeightError::Dir { .. }));
    assert!(
        err.to_string().contains(&gone.display().to_string()),
        "{err}"
    );
}

#[test]
fn directory_without_weights_says_what_was_looked_for() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("config.json"), "{}").unwrap();
    let err = Checkpoint::open(dir.path()).err().unwrap();
    assert_eq!(
        err.to_string(),
        format!(
            "no weights in {}: looked for model.safetensors and model.safetensors.index.json",
            dir.path().display()
        )
    );
}

/// Writes `model.safetensors` with one [4, 4] f32 tensor, then keeps only its first `keep` bytes.
fn truncated(keep: impl Fn(usize) -> usize) -> (TempDir, WeightError) {
    let dir = single(&[arange("w", &[4, 4])]);
    let path = dir.path().join("model.safetensors");
    let bytes = fs::read(&path).unwrap();
    fs::write(&path, &bytes[..keep(bytes.len())]).unwrap();
    let err = Checkpoint::open(dir.path()).err().unwrap();
    (dir, err)
}

#[test]
fn truncated_data_names_file_tensor_and_bytes() {
    let (dir, err) = truncated(|len| len - 4);
    let WeightError::Truncated {
        file,
        tensor,
        expected,
        actual,
    } = &err
    else {
        panic!("expected Truncated, got {err}");
    };
    assert_eq!(file, &dir.path().join("model.safetensors"));
    assert_eq!(tensor, "w");
    assert_eq!(expected - actual, 4);
    let msg = err.to_string();
    assert!(
        msg.contains("model.safetensors: truncated or corrupt"),
        "{msg}"
    );
    assert!(msg.contains(&format!(
        "ends at byte {expected}, but the file has only {actual} bytes"
    )));
}

#[test]
fn truncated_header_and_tiny_file() {
    let (_d, err) = truncated(|_| 20);
    assert!(
        matches!(err, WeightError::HeaderPastEnd { file_len: 20, .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("but the file has only 20 bytes"),
        "{err}"
    );
    let (_d, err) = truncated(|_| 3);
    assert!(
        matches!(err, WeightError::TooShort { file_len: 3, .. }),
        "{err}"
    );
    let (_d, err) = truncated(|_| 0);
    assert!(
        matches!(err, WeightError::TooShort { file_len: 0, .. }),
        "{err}"
    );
}

#[test]
fn corrupt_header_names_the_file() {
    let dir = single(&[arange("w", &[2])]);
    let path = dir.path().join("model.safetensors");
    let mut bytes = fs::read(&path).unwrap();
    bytes[8] = b'#';
    fs::write(&path, &bytes).unwrap();
    let err = Checkpoint::open(dir.path()).err().unwrap();
    assert!(matches!(err, WeightError::CorruptHeader { .. }), "{err}");
    assert!(err
        .to_string()
        .starts_with(&format!("{}: corrupt safetensors header", path.display())));
}

#[test]
fn header_with_inconsistent_offsets_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    // An [2] f32 tensor needs 8 bytes, but its offsets claim 12.
    let header = br#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,12]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header);
    bytes.extend([0u8; 12]);
    fs::write(&path, bytes).unwrap();
    let err = Checkpoint::open(dir.path()).err().unwrap();
    assert!(matches!(err, WeightError::CorruptHeader { .. }), "{err}");
}

#[test]
fn offsets_past_the_end_are_caught_by_the_loader() {
    // A consistent header whose data section was cut: the crate would say only "incomplete
    // metadata"; the loader names the tensor.
    let dir = tempfile::tempdir().unwrap();
    let header = br#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[4],"data_offsets":[4,20]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header);
    bytes.extend([0u8; 6]);
    fs::write(dir.path().join("model.safetensors"), &bytes).unwrap();
    let err = Checkpoint::open(dir.path()).err().unwrap();
    assert!(
        matches!(&err, WeightError::Truncated { tensor, expected, actual, .. }
            if tensor == "b" && *expected == bytes.len() + 14 && *actual == bytes.len()),
        "{err}"
    );
}

fn sharded(index: &str, shards: &[(&str, &[Raw])]) -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, tensors) in shards {
        write_file(&dir.path().join(name), tensors);
    }
    fs::write(dir.path().join("model.safetensors.index.json"), index).unwrap();
    dir
}

#[test]
fn index_pointing_at_missing_shard() {
    let dir = sharded(
        r#"{"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors", "c": "s2.safetensors"}}"#,
        &[("s1.safetensors", &[arange("a", &[1])])],
    );
    let err = Checkpoint::open(dir.path()).err().unwrap();
    let index = dir.path().join("model.safetensors.index.json");
    let shard = dir.path().join("s2.safetensors");
    assert_eq!(
        err.to_string(),
        format!(
            "{} maps 2 tensor(s), first \"b\", to shard {}, which does not exist",
            index.display(),
            shard.display()
        )
    );
}

#[test]
fn malformed_index_gives_line_and_column() {
    let dir = sharded("{\n  \"weight_map\": {\n    \"a\": 1\n  }\n}", &[]);
    let err = Checkpoint::open(dir.path()).err().unwrap();
    let index = dir.path().join("model.safetensors.index.json");
    let msg = err.to_string();
    assert!(matches!(err, WeightError::Index { line: 3, .. }), "{msg}");
    assert!(msg.starts_with(&format!("{}:3:", index.display())), "{msg}");
    assert!(
        msg.contains("malformed safetensors index: invalid type"),
        "{msg}"
    );
    assert!(!msg.contains("at line"), "location given twice: {msg}");

    let dir = sharded("{\"metadata\": {}}", &[]);
    let msg = Checkpoint::open(dir.path()).err().unwrap().to_string();
    assert!(msg.contains("missing field `weight_map`"), "{msg}");
}

#[test]
fn index_tensor_absent_from_its_shard() {
    let dir = sharded(
        r#"{"weight_map": {"a": "s1.safetensors", "z": "s1.safetensors"}}"#,
        &[("s1.safetensors", &[arange("a", &[1])])],
    );
    let err = Checkpoint::open(dir.path()).err().unwrap();
    assert!(
        matches!(&err, WeightError::NotInShard { tensor, .. } if tensor == "z"),
        "{err}"
    );
    assert!(err
        .to_string()
        .contains("s1.safetensors, but that shard does not contain it"));
}

#[test]
fn truncated_shard_is_named() {
    let dir = sharded(
        r#"{"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}"#,
        &[
            ("s1.safetensors", &[arange("a", &[1])]),
            ("s2.safetensors", &[arange("b", &[8])]),
        ],
    );
    let shard = dir.path().join("s2.safetensors");
    let bytes = fs::read(&shard).unwrap();
    fs::write(&shard, &bytes[..bytes.len() - 1]).unwrap();
    let err = Checkpoint::open(dir.path()).err().unwrap();
    assert!(
        matches!(&err, WeightError::Truncated { file, .. } if file == &shard),
        "{err}"
    );
}
