//! Helpers shared by the transformers-oracle tests (`tests/oracle.rs`, `tests/oracle_controls.rs`):
//! read the committed fixtures under `tests/oracle/fixtures/<case>/` (see
//! `tests/oracle/README.md`), run `glmc run` or the library on them, and measure relative errors.
//!
//! Every expected value comes from a fixture's `oracle.safetensors` / `checks.json`, which
//! transformers 5.17 wrote; glmc is only ever the side being checked.

#![allow(dead_code)] // each test binary uses a different subset

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use glmc_ir::Module;
use glmc_models::builder::{BuildOptions, LogitRows};
use glmc_passes::{AttentionChoice, PipelineOptions};
use glmc_runtime::{Checkpoint, Interpreter, Sampling, SequenceCache};
use safetensors::tensor::Dtype;
use safetensors::SafeTensors;

/// The agreement required with the oracle: max|glmc − HF| / max|HF| per logits row. glmc's
/// interpreter stores f32 and accumulates in f64, so about 1e-7 is expected; 1e-4 leaves room
/// for f32 rounding through the layers while any real mistake (rope pairing, a norm's eps, a
/// routing rule, a wrong top-k) moves the logits by 1e-2 or more.
pub const TOL: f64 = 1e-4;

/// How many fixture cases the README lists; a missing directory must not pass silently.
pub const MIN_CASES: usize = 7;

/// The repository: `$GLMC_REPO` where the tests run away from where they were built (the GPU
/// machine), else where they were built.
pub fn repo_root() -> PathBuf {
    std::env::var_os("GLMC_REPO")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// GLM-5's vocabulary size (`models/glm5*.ron`).
pub const GLM5_VOCAB: u64 = 154_880;

/// `n` token ids below `vocab`, comma-separated: a fixed pseudo-random walk, so every run of a
/// test feeds the same prompt.
pub fn walk_prompt(n: usize, vocab: u64) -> String {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab).to_string()
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `models/FILE` of the repository, as a `glmc` argument.
pub fn model_file(file: &str) -> String {
    repo_root()
        .join("models")
        .join(file)
        .to_str()
        .expect("a UTF-8 path")
        .to_string()
}

pub fn fixtures_root() -> PathBuf {
    repo_root().join("tests/oracle/fixtures")
}

/// Every fixture directory, sorted by name; fails when there are fewer than [`MIN_CASES`].
pub fn fixture_dirs() -> Vec<PathBuf> {
    let root = fixtures_root();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    assert!(
        dirs.len() >= MIN_CASES,
        "{}: expected at least {MIN_CASES} fixture directories, found {}: {dirs:?}",
        root.display(),
        dirs.len()
    );
    dirs
}

pub fn fixture_dir(case: &str) -> PathBuf {
    let dir = fixtures_root().join(case);
    assert!(dir.is_dir(), "{}: no such fixture", dir.display());
    dir
}

/// A `[rows, vocab]` logits matrix in f64.
#[derive(Clone, Debug)]
pub struct Logits {
    pub rows: usize,
    pub vocab: usize,
    pub data: Vec<f64>,
}

impl Logits {
    pub fn row(&self, i: usize) -> &[f64] {
        &self.data[i * self.vocab..(i + 1) * self.vocab]
    }

    /// From per-row f32 vectors (what the library returns).
    pub fn from_rows(rows: &[Vec<f32>]) -> Logits {
        let vocab = rows.first().map_or(0, Vec::len);
        assert!(rows.iter().all(|r| r.len() == vocab), "ragged logits rows");
        Logits {
            rows: rows.len(),
            vocab,
            data: rows.iter().flatten().map(|&x| x as f64).collect(),
        }
    }

    /// Rows `range` only.
    pub fn rows(&self, range: Range<usize>) -> Logits {
        Logits {
            rows: range.len(),
            vocab: self.vocab,
            data: self.data[range.start * self.vocab..range.end * self.vocab].to_vec(),
        }
    }

    pub fn argmax(&self, i: usize) -> usize {
        let row = self.row(i);
        (0..row.len())
            .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
            .expect("a non-empty row")
    }
}

/// Per-row relative errors `max_j |got − want| / max_j |want|`.
#[derive(Clone, Debug)]
pub struct RowErrors {
    pub per_row: Vec<f64>,
}

impl RowErrors {
    /// The largest error over `range` (0 for an empty range; NaN if any row is NaN, so that no
    /// `≤ tol` check accepts it).
    pub fn max_in(&self, range: Range<usize>) -> f64 {
        self.per_row[range].iter().copied().fold(0.0, |m: f64, x| {
            if m.is_nan() || x.is_nan() {
                f64::NAN
            } else {
                m.max(x)
            }
        })
    }

    pub fn max(&self) -> f64 {
        self.max_in(0..self.per_row.len())
    }

    /// The row with the largest error.
    pub fn worst_row(&self) -> usize {
        (0..self.per_row.len())
            .max_by(|&a, &b| self.per_row[a].total_cmp(&self.per_row[b]))
            .unwrap_or(0)
    }

    /// Rows over `tol`.
    pub fn rows_over(&self, tol: f64) -> Vec<usize> {
        (0..self.per_row.len())
            .filter(|&i| self.per_row[i].is_nan() || self.per_row[i] > tol)
            .collect()
    }

    /// `max 1.2e-7 (row 5)`.
    pub fn summary(&self) -> String {
        if self.per_row.iter().all(|&e| e == 0.0) {
            return "0 (bit-identical)".to_string();
        }
        format!("max {:.3e} (row {})", self.max(), self.worst_row())
    }
}

/// Relative error of each of the first `rows` rows of `got` against `want`. A NaN anywhere makes
/// that row's error NaN, which no `≤ tol` check accepts.
pub fn row_errors(got: &Logits, want: &Logits, rows: usize) -> RowErrors {
    assert_eq!(got.vocab, want.vocab, "vocab sizes differ");
    assert!(
        rows <= got.rows && rows <= want.rows,
        "asked for {rows} rows, got {} and {}",
        got.rows,
        want.rows
    );
    let per_row = (0..rows)
        .map(|i| {
            let (g, w) = (got.row(i), want.row(i));
            let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
            let diff = g.iter().zip(w).fold(0.0f64, |m, (a, b)| {
                let d = (a - b).abs();
                if d.is_nan() {
                    f64::NAN
                } else {
                    m.max(d)
                }
            });
            diff / scale
        })
        .collect();
    RowErrors { per_row }
}

/// A safetensors file's bytes and its string metadata.
pub struct StFile {
    pub path: PathBuf,
    bytes: Vec<u8>,
}

impl StFile {
    pub fn open(path: &Path) -> StFile {
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        StFile {
            path: path.to_path_buf(),
            bytes,
        }
    }

    fn st(&self) -> SafeTensors<'_> {
        SafeTensors::deserialize(&self.bytes)
            .unwrap_or_else(|e| panic!("{}: not safetensors: {e}", self.path.display()))
    }

    pub fn has(&self, name: &str) -> bool {
        self.st().tensor(name).is_ok()
    }

    pub fn metadata(&self) -> HashMap<String, String> {
        let (_, meta) = SafeTensors::read_metadata(&self.bytes)
            .unwrap_or_else(|e| panic!("{}: {e}", self.path.display()));
        meta.metadata().clone().unwrap_or_default()
    }

    fn raw(&self, name: &str, dtype: Dtype) -> (Vec<usize>, Vec<u8>) {
        let st = self.st();
        let t = st
            .tensor(name)
            .unwrap_or_else(|e| panic!("{}: tensor {name}: {e}", self.path.display()));
        assert_eq!(
            t.dtype(),
            dtype,
            "{}: tensor {name} is {:?}, expected {dtype:?}",
            self.path.display(),
            t.dtype()
        );
        (t.shape().to_vec(), t.data().to_vec())
    }

    /// An I64 tensor of rank 1.
    pub fn ids(&self, name: &str) -> Vec<u64> {
        let (shape, data) = self.raw(name, Dtype::I64);
        assert_eq!(shape.len(), 1, "{name}: expected rank 1, got {shape:?}");
        data.chunks_exact(8)
            .map(|b| {
                let v = i64::from_le_bytes(b.try_into().expect("8 bytes"));
                assert!(v >= 0, "{name}: negative token id {v}");
                v as u64
            })
            .collect()
    }

    /// An F64 or F32 `[rows, vocab]` tensor.
    pub fn logits(&self, name: &str) -> Logits {
        let st = self.st();
        let dtype = st
            .tensor(name)
            .unwrap_or_else(|e| panic!("{}: tensor {name}: {e}", self.path.display()))
            .dtype();
        let (shape, data) = self.raw(name, dtype);
        assert_eq!(shape.len(), 2, "{name}: expected rank 2, got {shape:?}");
        let data: Vec<f64> = match dtype {
            Dtype::F64 => data
                .chunks_exact(8)
                .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
                .collect(),
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")) as f64)
                .collect(),
            other => panic!("{name}: logits of dtype {other:?}"),
        };
        Logits {
            rows: shape[0],
            vocab: shape[1],
            data,
        }
    }
}

/// One fixture case: HF's tokens and logits for a greedy continuation of a prompt.
pub struct Oracle {
    pub case: String,
    pub dir: PathBuf,
    pub file: StFile,
    /// Prompt then generated, `[T]`.
    pub tokens: Vec<u64>,
    pub prompt: Vec<u64>,
    pub generated: Vec<u64>,
    /// Stock HF (float64 model with HF's internal float32 casts), `[T, vocab]`.
    pub logits: Logits,
    /// The same forward in true float64, `[T, vocab]`.
    pub logits_pure64: Logits,
    pub checks: serde_json::Value,
    pub config: serde_json::Value,
}

impl Oracle {
    pub fn load(dir: &Path) -> Oracle {
        let file = StFile::open(&dir.join("oracle.safetensors"));
        let json = |name: &str| -> serde_json::Value {
            let path = dir.join(name);
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        };
        let oracle = Oracle {
            case: dir
                .file_name()
                .expect("a fixture directory name")
                .to_string_lossy()
                .into_owned(),
            dir: dir.to_path_buf(),
            tokens: file.ids("tokens"),
            prompt: file.ids("prompt"),
            generated: file.ids("generated"),
            logits: file.logits("logits"),
            logits_pure64: file.logits("logits_pure64"),
            file,
            checks: json("checks.json"),
            config: json("config.json"),
        };
        let t = oracle.tokens.len();
        assert_eq!(
            oracle.tokens,
            [oracle.prompt.clone(), oracle.generated.clone()].concat(),
            "{}: tokens must be prompt then generated",
            oracle.case
        );
        assert_eq!(oracle.logits.rows, t, "{}: logits rows", oracle.case);
        assert_eq!(oracle.logits_pure64.rows, t, "{}: pure64 rows", oracle.case);
        oracle
    }

    pub fn case(case: &str) -> Oracle {
        Oracle::load(&fixture_dir(case))
    }

    /// Every case, sorted by name (at least [`MIN_CASES`]).
    pub fn all() -> Vec<Oracle> {
        fixture_dirs().iter().map(|d| Oracle::load(d)).collect()
    }

    pub fn t(&self) -> usize {
        self.tokens.len()
    }

    /// config.json's `index_topk` (every fixture has an indexer).
    pub fn index_topk(&self) -> usize {
        self.config["index_topk"]
            .as_u64()
            .unwrap_or_else(|| panic!("{}: config.json has no index_topk", self.case))
            as usize
    }

    /// A number from checks.json → `checks`.
    pub fn check(&self, key: &str) -> f64 {
        self.checks["checks"][key]
            .as_f64()
            .unwrap_or_else(|| panic!("{}: checks.json has no checks.{key}", self.case))
    }
}

/// The text-prompt part of the `sparse` fixture.
pub struct TextOracle {
    pub prompt_text: String,
    pub prompt: Vec<u64>,
    pub generated: Vec<u64>,
    pub tokens: Vec<u64>,
    pub generated_text: String,
    pub logits_pure64: Logits,
}

impl Oracle {
    pub fn text(&self) -> TextOracle {
        let text = &self.checks["text"];
        let s = |k: &str| {
            text[k]
                .as_str()
                .unwrap_or_else(|| panic!("{}: checks.json text.{k}", self.case))
                .to_string()
        };
        let ids = |k: &str| -> Vec<u64> {
            text[k]
                .as_array()
                .unwrap_or_else(|| panic!("{}: checks.json text.{k}", self.case))
                .iter()
                .map(|v| v.as_u64().expect("an id"))
                .collect()
        };
        let t = TextOracle {
            prompt_text: s("prompt"),
            prompt: self.file.ids("text_prompt"),
            generated: self.file.ids("text_generated"),
            tokens: self.file.ids("text_tokens"),
            generated_text: s("generated_text"),
            logits_pure64: self.file.logits("text_logits_pure64"),
        };
        // checks.json and oracle.safetensors are two copies of the same HF output.
        assert_eq!(t.prompt, ids("prompt_ids"), "text prompt ids");
        assert_eq!(t.generated, ids("generated_ids"), "text generated ids");
        t
    }
}

/// What `glmc run --dump-logits` wrote.
pub struct Dump {
    pub tokens: Vec<u64>,
    pub generated: Vec<u64>,
    pub logits: Logits,
}

impl Dump {
    pub fn read(path: &Path) -> Dump {
        let f = StFile::open(path);
        Dump {
            tokens: f.ids("tokens"),
            generated: f.ids("generated"),
            logits: f.logits("logits"),
        }
    }
}

/// `glmc ARGS` with a stable environment: the binary cargo built, or `$GLMC_BIN`.
pub fn glmc(args: &[&str]) -> Output {
    let bin = std::env::var_os("GLMC_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_glmc")));
    Command::new(bin)
        .args(args)
        .current_dir(repo_root())
        .env("RUST_BACKTRACE", "0")
        .env("NO_COLOR", "1")
        .output()
        .unwrap_or_else(|e| panic!("cannot run glmc: {e}"))
}

/// A finished `glmc run`: its stdout, stderr and dump.
pub struct CliRun {
    pub stdout: String,
    pub stderr: String,
    pub dump: Dump,
}

/// `glmc run DIR --max-new-tokens N --dump-logits TMP EXTRA…`, which must succeed.
pub fn glmc_run(dir: &Path, max_new: usize, extra: &[&str]) -> CliRun {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let dump = tmp.path().join("logits.safetensors");
    let n = max_new.to_string();
    let mut args: Vec<&str> = vec![
        "run",
        dir.to_str().expect("a UTF-8 path"),
        "--max-new-tokens",
        &n,
        "--dump-logits",
        dump.to_str().expect("a UTF-8 path"),
    ];
    args.extend_from_slice(extra);
    let out = glmc(&args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "glmc {}: {:?}\nstderr:\n{stderr}",
        args.join(" "),
        out.status
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("internal error"),
        "glmc {}: panicked:\n{stderr}",
        args.join(" ")
    );
    CliRun {
        stdout,
        stderr,
        dump: Dump::read(&dump),
    }
}

/// `3,17,42`.
pub fn ids_arg(ids: &[u64]) -> String {
    ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

/// The builder's module for a fixture (its config.json imported as `glmc run DIR` does).
pub fn build_module(dir: &Path) -> Module {
    let config = glmc_models::import_hf(dir)
        .unwrap_or_else(|e| panic!("{}: importing config.json: {e}", dir.display()))
        .config;
    // The oracle compares every position.
    let options = BuildOptions {
        logits: LogitRows::All,
        ..Default::default()
    };
    glmc_models::builder::build(&config, &options)
        .unwrap_or_else(|e| panic!("{}: building the graph: {e}", dir.display()))
}

/// Runs the pass pipeline (`-O1` unless `o0`) with `attention` on `module`.
pub fn optimize(module: &mut Module, o0: bool, attention: AttentionChoice) {
    let options = PipelineOptions {
        no_optimization: o0,
        attention,
        disabled: Vec::new(),
    };
    glmc_passes::pipeline(&options)
        .expect("the default pipeline")
        .run(module)
        .unwrap_or_else(|e| panic!("running the pipeline: {e}"));
}

/// The fixture's module after the default pipeline (`glmc run DIR`).
pub fn default_module(dir: &Path) -> Module {
    let mut m = build_module(dir);
    optimize(&mut m, false, AttentionChoice::Auto);
    m
}

/// A generator for `module` compiled for the GPU present and run from its artifact, as `glmc run
/// --device cuda` does: one sequence, at most `max_prefill` tokens a prefill, `context` in all.
pub fn cuda_generator<'a>(
    dir: &Path,
    module: &Module,
    weights: &'a Checkpoint,
    max_prefill: u64,
    context: u64,
) -> glmc_runtime::Generator<'a> {
    cuda_batch_generator(dir, module, weights, max_prefill, context, 1)
}

/// [`cuda_generator`] with caches for `max_batch` sequences.
pub fn cuda_batch_generator<'a>(
    dir: &Path,
    module: &Module,
    weights: &'a Checkpoint,
    max_prefill: u64,
    context: u64,
    max_batch: u64,
) -> glmc_runtime::Generator<'a> {
    use glmc_codegen::{Limits, Target};
    let gpu = glmc_runtime::cuda::Gpu::open(0).expect("a GPU");
    let (major, minor) = gpu.compute_capability().expect("its compute capability");
    let target = Target::for_gpu(major, minor).expect("a GPU glmc compiles for");
    let limits = Limits {
        max_prefill_tokens: max_prefill,
        max_batch,
        max_context: context,
    };
    let config = glmc_models::import_hf(dir)
        .expect("the fixture's config")
        .config;
    let compiled = glmc_runtime::cuda::compile(module, &config, config.dtype, target, limits, None)
        .expect("the model compiles for this GPU");
    let exec = glmc_runtime::cuda::CudaExecutor::load(&compiled.manifest, &compiled.cubin, weights)
        .expect("the artifact loads");
    glmc_runtime::Generator::with_executor(Box::new(exec)).expect("a generator")
}

pub fn checkpoint(dir: &Path) -> Checkpoint {
    Checkpoint::open(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// One `prefill` call over all of `tokens` (a full forward, as HF computed the fixture's
/// logits), through [`Interpreter::run_patched`] with `patch`.
pub fn prefill_patched(
    module: &Module,
    weights: &Checkpoint,
    tokens: &[u64],
    patch: &mut glmc_runtime::interp::PatchFn<'_>,
) -> Logits {
    let f = module.function("prefill").expect("a prefill function");
    let n = tokens.len();
    let ids: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
    let positions: Vec<i64> = (0..n as i64).collect();
    let inputs = glmc_runtime::prefill_inputs(&ids, &positions, &Sampling::default(), 0, 0);
    let mut cache = SequenceCache::new();
    let out = Interpreter::new()
        .run_patched(module, f, weights, &mut [&mut cache], &inputs, patch)
        .unwrap_or_else(|e| panic!("prefill: {e}"));
    let logits = &out[0];
    let [rows, vocab] = logits.shape() else {
        panic!("prefill returned logits of shape {:?}", logits.shape())
    };
    assert_eq!(*rows, n, "one logits row per token");
    Logits {
        rows: n,
        vocab: *vocab,
        data: logits
            .as_f32()
            .expect("float logits")
            .iter()
            .map(|&x| x as f64)
            .collect(),
    }
}

/// [`prefill_patched`] with no patch.
pub fn prefill(module: &Module, weights: &Checkpoint, tokens: &[u64]) -> Logits {
    prefill_patched(module, weights, tokens, &mut |_, _, _| None)
}
