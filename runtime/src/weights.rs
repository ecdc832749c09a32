//! Loading HF safetensors checkpoints and applying weight recipes to them.
//!
//! A [`Checkpoint`] maps every file once and indexes each tensor by its HF name, so recipes read
//! the bytes they need straight from the page cache and a checkpoint of hundreds of gigabytes
//! opens in the time it takes to parse its headers. Headers are validated against the real file
//! lengths on open: a truncated download must be a clear error naming the file, never a SIGBUS or
//! a panic halfway through a run. [`Checkpoint::check_all`] compares the checkpoint with every
//! recipe of a module before any compute, so one run reports all missing or misshapen tensors.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::fs::{self, File};
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use glmc_ir::{DType, Recipe, RecipeError};
use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::tensor::Metadata;
use serde::Deserialize;

use crate::random_weights::{fill_pieces, pieces};
use crate::tensor::{round_to, Data, Tensor, TensorError};

/// The stored dtype of a checkpoint tensor, as the safetensors header names it.
pub use safetensors::Dtype;

/// The single-file checkpoint, looked for first (as transformers does).
const SINGLE_FILE: &str = "model.safetensors";
/// The index of a sharded checkpoint: `weight_map` maps each tensor name to its shard file.
const INDEX_FILE: &str = "model.safetensors.index.json";
/// Bytes of the little-endian u64 header length that starts every safetensors file.
const HEADER_LEN_BYTES: usize = 8;
/// How many problems [`WeightError::Problems`] lists before summarising the rest.
const MAX_LISTED: usize = 20;
/// The stored dtypes [`Checkpoint`] can read, for error messages.
const SUPPORTED: &str =
    "F32, BF16, F16, F64 (floats become the weight's dtype), I64, I32 (read as i64)";

/// Why a checkpoint cannot be opened, or does not fit a recipe.
#[derive(Debug, thiserror::Error)]
pub enum WeightError {
    #[error("checkpoint directory {} cannot be read: {reason}", .dir.display())]
    Dir { dir: PathBuf, reason: String },
    #[error("no weights in {}: looked for {SINGLE_FILE} and {INDEX_FILE}", .dir.display())]
    NoWeights { dir: PathBuf },
    #[error("cannot read {}: {source}", .file.display())]
    Io { file: PathBuf, source: io::Error },
    #[error("{}:{line}:{column}: malformed safetensors index: {message}", .file.display())]
    Index {
        file: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error(
        "{} maps {count} tensor(s), first {tensor:?}, to shard {}, which does not exist",
        .index.display(), .shard.display()
    )]
    MissingShard {
        index: PathBuf,
        shard: PathBuf,
        tensor: String,
        count: usize,
    },
    #[error(
        "{}: truncated or corrupt safetensors file: {file_len} bytes, too short for the \
         {HEADER_LEN_BYTES}-byte header length",
        .file.display()
    )]
    TooShort { file: PathBuf, file_len: usize },
    #[error(
        "{}: truncated or corrupt safetensors file: the header claims {header_len} bytes after \
         the {HEADER_LEN_BYTES}-byte length, but the file has only {file_len} bytes",
        .file.display()
    )]
    HeaderPastEnd {
        file: PathBuf,
        header_len: u64,
        file_len: usize,
    },
    #[error("{}: corrupt safetensors header: {reason}", .file.display())]
    CorruptHeader { file: PathBuf, reason: String },
    #[error(
        "{}: truncated or corrupt safetensors file: tensor {tensor:?} ends at byte {expected}, \
         but the file has only {actual} bytes",
        .file.display()
    )]
    Truncated {
        file: PathBuf,
        tensor: String,
        expected: usize,
        actual: usize,
    },
    #[error(
        "{} maps tensor {tensor:?} to shard {}, but that shard does not contain it",
        .index.display(), .shard.display()
    )]
    NotInShard {
        index: PathBuf,
        shard: PathBuf,
        tensor: String,
    },
    #[error("tensor {tensor:?} is not in the checkpoint {}{}", .dir.display(), similar_hint(.similar))]
    Missing {
        tensor: String,
        dir: PathBuf,
        similar: Option<String>,
    },
    #[error(
        "tensor {tensor:?} in {} has shape {actual:?}, but the recipe expects {expected:?}",
        .file.display()
    )]
    Shape {
        tensor: String,
        file: PathBuf,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    #[error(
        "tensor {tensor:?} in {} is stored as {dtype}, which cannot be loaded; supported: {SUPPORTED}",
        .file.display()
    )]
    UnsupportedDType {
        tensor: String,
        file: PathBuf,
        dtype: Dtype,
    },
    #[error("invalid recipe: {0}")]
    Recipe(#[from] RecipeError),
    #[error(transparent)]
    Tensor(#[from] TensorError),
    #[error("{}", list_problems(.dir, .problems))]
    Problems {
        dir: PathBuf,
        problems: Vec<WeightError>,
    },
}

fn similar_hint(similar: &Option<String>) -> String {
    similar
        .as_ref()
        .map(|s| format!(" (a similarly named tensor exists: {s:?})"))
        .unwrap_or_default()
}

fn list_problems(dir: &Path, problems: &[WeightError]) -> String {
    let mut s = format!(
        "{} problems with the checkpoint {}:",
        problems.len(),
        dir.display()
    );
    for p in problems.iter().take(MAX_LISTED) {
        let _ = write!(s, "\n  - {p}");
    }
    if problems.len() > MAX_LISTED {
        let _ = write!(s, "\n  and {} more", problems.len() - MAX_LISTED);
    }
    s
}

/// An opened checkpoint: the mapped files and where each tensor lies in them.
#[derive(Debug)]
pub struct Checkpoint {
    dir: PathBuf,
    files: Vec<MappedFile>,
    entries: HashMap<String, Entry>,
    /// Built on the first missing tensor only, since a healthy checkpoint never needs it.
    near_names: OnceLock<HashMap<String, String>>,
    /// Bytes of tensor data read so far (a tensor-parallel rank reads only its slices).
    bytes_read: AtomicU64,
}

#[derive(Debug)]
struct MappedFile {
    path: PathBuf,
    map: Mmap,
}

/// One tensor as its file's header describes it; `bytes` are absolute offsets into the file,
/// already checked to lie inside it.
#[derive(Debug)]
struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Range<usize>,
}

/// What the checkpoint says about one tensor, without reading its data.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StoredTensor<'a> {
    pub dtype: Dtype,
    pub shape: &'a [usize],
    pub file: &'a Path,
    /// Bytes of its data in the file.
    pub bytes: usize,
}

/// The part of `model.safetensors.index.json` the loader needs.
#[derive(Deserialize)]
struct IndexJson {
    weight_map: BTreeMap<String, String>,
}

impl Checkpoint {
    /// Opens the HF checkpoint in `dir`: `model.safetensors` if present, else the shards that
    /// `model.safetensors.index.json` lists. Other files in the directory are ignored.
    pub fn open(dir: &Path) -> Result<Checkpoint, WeightError> {
        let meta = fs::metadata(dir).map_err(|e| WeightError::Dir {
            dir: dir.to_path_buf(),
            reason: e.to_string(),
        })?;
        if !meta.is_dir() {
            return Err(WeightError::Dir {
                dir: dir.to_path_buf(),
                reason: "not a directory".into(),
            });
        }
        let mut ckpt = Checkpoint {
            dir: dir.to_path_buf(),
            files: Vec::new(),
            entries: HashMap::new(),
            near_names: OnceLock::new(),
            bytes_read: AtomicU64::new(0),
        };
        let (single, index) = (dir.join(SINGLE_FILE), dir.join(INDEX_FILE));
        if single.is_file() {
            ckpt.add_single(&single)?;
        } else if index.is_file() {
            ckpt.add_sharded(&index)?;
        } else {
            return Err(WeightError::NoWeights {
                dir: dir.to_path_buf(),
            });
        }
        Ok(ckpt)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.entries.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    pub fn stored(&self, name: &str) -> Option<StoredTensor<'_>> {
        self.entries.get(name).map(|e| StoredTensor {
            dtype: e.dtype,
            shape: &e.shape,
            file: &self.files[e.file].path,
            bytes: e.bytes.len(),
        })
    }

    /// One tensor as stored: floats as f32, integers as i64.
    pub fn load(&self, name: &str) -> Result<Tensor, WeightError> {
        let entry = self.entry(name)?;
        self.decode(name, entry, DType::F32)
    }

    /// Checks that every leaf of `recipe` exists with exactly the expected shape and a loadable
    /// dtype; one problem is returned as itself, several as [`WeightError::Problems`].
    pub fn check(&self, recipe: &Recipe) -> Result<(), WeightError> {
        self.check_all([recipe])
    }

    /// [`Checkpoint::check`] over many recipes, collecting every problem into one error so a
    /// wrong checkpoint is diagnosed in one run. A tensor read by several recipes with the same
    /// expected shape is reported once.
    pub fn check_all<'r>(
        &self,
        recipes: impl IntoIterator<Item = &'r Recipe>,
    ) -> Result<(), WeightError> {
        let mut seen = HashSet::new();
        let mut problems = Vec::new();
        for recipe in recipes {
            if let Err(e) = recipe.shape() {
                problems.push(e.into());
            }
            for (name, shape) in recipe.leaves() {
                if !seen.insert((name.clone(), shape.clone())) {
                    continue;
                }
                if let Err(e) = self.checked_entry(&name, &shape) {
                    problems.push(e);
                }
            }
        }
        match problems.len() {
            0 => Ok(()),
            1 => Err(problems.remove(0)),
            _ => Err(WeightError::Problems {
                dir: self.dir.clone(),
                problems,
            }),
        }
    }

    /// Evaluates `recipe` on the checkpoint: a tensor of `recipe.shape()`, f32 when its leaves
    /// are floats (i64 when they are integers).
    pub fn materialize(&self, recipe: &Recipe) -> Result<Tensor, WeightError> {
        self.materialize_as(recipe, DType::F32)
    }

    /// [`Checkpoint::materialize`] for a weight of `dtype`: floats are rounded to nearest-even
    /// to it once, from the stored precision (an f64 checkpoint is not rounded to f32 first).
    /// Recipes only move elements, so rounding the leaves is rounding the result.
    ///
    /// A recipe that only moves elements (slices, concats, stacks, transposes: every recipe glmc
    /// builds) reads just the elements it keeps, straight from the mapped files, so a
    /// tensor-parallel rank reads its slice of each tensor and never the rest.
    pub fn materialize_as(&self, recipe: &Recipe, dtype: DType) -> Result<Tensor, WeightError> {
        let shape = recipe.shape()?;
        if let Some(pieces) = pieces(recipe) {
            let entries = pieces
                .iter()
                .map(|p| self.checked_entry(&p.leaf, &p.leaf_shape))
                .collect::<Result<Vec<_>, _>>()?;
            let sizes: Option<Vec<usize>> = entries.iter().map(|e| float_size(e.dtype)).collect();
            if let Some(sizes) = sizes {
                let read: u64 = pieces
                    .iter()
                    .zip(&sizes)
                    .map(|(p, &size)| p.count() * size as u64)
                    .sum();
                self.bytes_read.fetch_add(read, Ordering::Relaxed);
                let values = fill_pieces(&shape, &pieces, &|k, i| {
                    self.element(entries[k], sizes[k], i, dtype)
                });
                return Ok(Tensor::f32(dims(&shape), values)?);
            }
        }
        evaluate(recipe, &|name, shape| self.leaf(name, shape, dtype))
    }

    /// Bytes of tensor data read so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    /// Element `i` (row-major) of a float tensor of `size`-byte elements, rounded to `to` as
    /// [`decode`] rounds.
    fn element(&self, entry: &Entry, size: usize, i: u64, to: DType) -> f32 {
        let at = entry.bytes.start + i as usize * size;
        let b = &self.files[entry.file].map[at..at + size];
        let x = match entry.dtype {
            Dtype::F32 => f32::from_le_bytes(b.try_into().expect("4 bytes")).into(),
            Dtype::BF16 => bf16::from_le_bytes(b.try_into().expect("2 bytes")).to_f64(),
            Dtype::F16 => f16::from_le_bytes(b.try_into().expect("2 bytes")).to_f64(),
            Dtype::F64 => f64::from_le_bytes(b.try_into().expect("8 bytes")),
            other => unreachable!("{other:?} is not a float dtype (checked by the caller)"),
        };
        round_to(x, to)
    }

    fn leaf(&self, name: &str, shape: &[u64], dtype: DType) -> Result<Tensor, WeightError> {
        let entry = self.checked_entry(name, shape)?;
        self.bytes_read
            .fetch_add(entry.bytes.len() as u64, Ordering::Relaxed);
        self.decode(name, entry, dtype)
    }

    fn entry(&self, name: &str) -> Result<&Entry, WeightError> {
        self.entries.get(name).ok_or_else(|| WeightError::Missing {
            tensor: name.to_string(),
            dir: self.dir.clone(),
            similar: self.similar(name),
        })
    }

    /// Whether the loader can read a tensor stored as `dtype`.
    pub fn can_load(dtype: Dtype) -> bool {
        decode(dtype, &[], DType::F32).is_some()
    }

    /// The entry of `name` if it has exactly `expected` shape and a dtype [`decode`] reads.
    fn checked_entry(&self, name: &str, expected: &[u64]) -> Result<&Entry, WeightError> {
        let entry = self.entry(name)?;
        let expected = dims(expected);
        if entry.shape != expected {
            return Err(WeightError::Shape {
                tensor: name.to_string(),
                file: self.files[entry.file].path.clone(),
                expected,
                actual: entry.shape.clone(),
            });
        }
        if decode(entry.dtype, &[], DType::F32).is_none() {
            return Err(self.unsupported(name, entry));
        }
        Ok(entry)
    }

    fn decode(&self, name: &str, entry: &Entry, to: DType) -> Result<Tensor, WeightError> {
        let bytes = &self.files[entry.file].map[entry.bytes.clone()];
        let data = decode(entry.dtype, bytes, to).ok_or_else(|| self.unsupported(name, entry))?;
        Ok(Tensor::new(entry.shape.clone(), data)?)
    }

    fn unsupported(&self, name: &str, entry: &Entry) -> WeightError {
        WeightError::UnsupportedDType {
            tensor: name.to_string(),
            file: self.files[entry.file].path.clone(),
            dtype: entry.dtype,
        }
    }

    fn add_single(&mut self, path: &Path) -> Result<(), WeightError> {
        let file = File::open(path).map_err(io_error(path))?;
        let (idx, header) = self.map(path, &file)?;
        for (name, stored) in header {
            self.entries.insert(name, stored.at(idx));
        }
        Ok(())
    }

    /// Maps each shard of the index once and takes from it exactly the tensors the index
    /// assigns to it.
    fn add_sharded(&mut self, index: &Path) -> Result<(), WeightError> {
        let text = fs::read_to_string(index).map_err(io_error(index))?;
        let parsed: IndexJson = serde_json::from_str(&text).map_err(|e| index_error(index, &e))?;
        let mut by_shard: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (tensor, shard) in parsed.weight_map {
            by_shard.entry(shard).or_default().push(tensor);
        }
        for (shard, tensors) in by_shard {
            let path = self.dir.join(&shard);
            let file = match File::open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(WeightError::MissingShard {
                        index: index.to_path_buf(),
                        shard: path,
                        count: tensors.len(),
                        tensor: tensors.into_iter().next().unwrap_or_default(),
                    })
                }
                Err(e) => return Err(io_error(&path)(e)),
            };
            let (idx, mut header) = self.map(&path, &file)?;
            for tensor in tensors {
                let stored = header
                    .remove(&tensor)
                    .ok_or_else(|| WeightError::NotInShard {
                        index: index.to_path_buf(),
                        shard: path.clone(),
                        tensor: tensor.clone(),
                    })?;
                self.entries.insert(tensor, stored.at(idx));
            }
        }
        Ok(())
    }

    /// Maps `file`, validates its header, and keeps the mapping; returns its index in
    /// `self.files` and the tensors its header lists.
    fn map(
        &mut self,
        path: &Path,
        file: &File,
    ) -> Result<(usize, HashMap<String, Stored>), WeightError> {
        // SAFETY: the mapping is read-only and checkpoint files are not modified while a run
        // reads them; every range read from it is checked against its length in `read_header`.
        let map = unsafe { Mmap::map(file) }.map_err(io_error(path))?;
        let header = read_header(path, &map)?;
        self.files.push(MappedFile {
            path: path.to_path_buf(),
            map,
        });
        Ok((self.files.len() - 1, header))
    }

    /// A tensor whose name suggests the caller meant it: `missing` with a leading prefix dropped
    /// or added (`language_model.` and the like), or differing in one dotted component.
    pub(crate) fn similar(&self, missing: &str) -> Option<String> {
        let near = self
            .near_names
            .get_or_init(|| near_names(self.entries.keys()));
        let parts: Vec<&str> = missing.split('.').collect();
        (1..parts.len())
            .map(|i| parts[i..].join("."))
            .find(|s| self.entries.contains_key(s))
            .or_else(|| near.get(&suffix_key(missing)).cloned())
            .or_else(|| (0..parts.len()).find_map(|i| near.get(&wildcard_key(&parts, i)).cloned()))
    }
}

/// Makes checkpoint tensor `name` of the expected shape.
pub(crate) type LeafFn<'a> = dyn Fn(&str, &[u64]) -> Result<Tensor, WeightError> + 'a;

/// Evaluates a shape-checked `recipe` with each checkpoint tensor from `leaf` (given its name and
/// expected shape): the one definition of the recipe operations, whatever the tensors come from.
pub(crate) fn evaluate(recipe: &Recipe, leaf: &LeafFn) -> Result<Tensor, WeightError> {
    match recipe {
        Recipe::Tensor { name, shape } => leaf(name, shape),
        Recipe::Stack {
            pattern,
            count,
            shape,
        } => {
            if *count == 0 {
                return Ok(Tensor::zeros([0].into_iter().chain(dims(shape)).collect()));
            }
            let members = (0..*count)
                .map(|e| leaf(&Recipe::stack_member(pattern, e), shape))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Tensor::stack(&members)?)
        }
        Recipe::Slice {
            src,
            axis,
            start,
            end,
        } => Ok(evaluate(src, leaf)?.slice(*axis as usize, *start as usize, *end as usize)?),
        Recipe::Concat { axis, parts } => {
            let parts = parts
                .iter()
                .map(|p| evaluate(p, leaf))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Tensor::concat(*axis as usize, &parts)?)
        }
        Recipe::Reshape { src, shape } => Ok(evaluate(src, leaf)?.reshape(dims(shape))?),
        Recipe::Transpose { src, perm } => Ok(evaluate(src, leaf)?.transpose(&dims(perm))?),
    }
}

/// A tensor of a header, before it is tied to its file's index in the checkpoint.
struct Stored {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Range<usize>,
}

impl Stored {
    fn at(self, file: usize) -> Entry {
        Entry {
            file,
            dtype: self.dtype,
            shape: self.shape,
            bytes: self.bytes,
        }
    }
}

/// Parses the header of the safetensors file `bytes` and checks every tensor's data against the
/// real file length. The crate's own check reports only "incomplete metadata"; this names the
/// file, the first tensor that does not fit, and the bytes it needs.
fn read_header(path: &Path, bytes: &[u8]) -> Result<HashMap<String, Stored>, WeightError> {
    let file_len = bytes.len();
    let mut len = [0u8; HEADER_LEN_BYTES];
    len.copy_from_slice(bytes.get(..HEADER_LEN_BYTES).ok_or(WeightError::TooShort {
        file: path.to_path_buf(),
        file_len,
    })?);
    let header_len = u64::from_le_bytes(len);
    let data_start = usize::try_from(header_len)
        .ok()
        .and_then(|n| n.checked_add(HEADER_LEN_BYTES))
        .filter(|&end| end <= file_len)
        .ok_or(WeightError::HeaderPastEnd {
            file: path.to_path_buf(),
            header_len,
            file_len,
        })?;
    let metadata: Metadata =
        serde_json::from_slice(&bytes[HEADER_LEN_BYTES..data_start]).map_err(|e| {
            WeightError::CorruptHeader {
                file: path.to_path_buf(),
                reason: e.to_string(),
            }
        })?;
    let mut infos: Vec<_> = metadata.tensors().into_iter().collect();
    infos.sort_by_key(|(_, info)| info.data_offsets);
    let mut out = HashMap::with_capacity(infos.len());
    for (name, info) in infos {
        let (start, end) = info.data_offsets;
        let (start, end) = (
            data_start.saturating_add(start),
            data_start.saturating_add(end),
        );
        if end > file_len {
            return Err(WeightError::Truncated {
                file: path.to_path_buf(),
                tensor: name,
                expected: end,
                actual: file_len,
            });
        }
        let stored = Stored {
            dtype: info.dtype,
            shape: info.shape.clone(),
            bytes: start..end,
        };
        out.insert(name, stored);
    }
    Ok(out)
}

/// The elements of `bytes` (little-endian, as safetensors stores them) in the interpreter's
/// representation, floats rounded to nearest-even to `to` (a float dtype), or `None` for a
/// dtype it cannot read. Called with empty bytes it is the one source of truth for which dtypes
/// are supported.
/// The element size of a float dtype [`Checkpoint::element`] reads.
fn float_size(dtype: Dtype) -> Option<usize> {
    matches!(dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16 | Dtype::F64).then(|| dtype.bitsize() / 8)
}

fn decode(dtype: Dtype, bytes: &[u8], to: DType) -> Option<Data> {
    // Every stored float type is exact in f64, so this rounds once whatever is stored.
    let float = |x: f64| round_to(x, to);
    Some(match dtype {
        Dtype::F32 => Data::F32(convert(bytes, |b| float(f32::from_le_bytes(b).into()))),
        Dtype::BF16 => Data::F32(convert(bytes, |b| float(bf16::from_le_bytes(b).to_f64()))),
        Dtype::F16 => Data::F32(convert(bytes, |b| float(f16::from_le_bytes(b).to_f64()))),
        Dtype::F64 => Data::F32(convert(bytes, |b| float(f64::from_le_bytes(b)))),
        Dtype::I64 => Data::I64(convert(bytes, i64::from_le_bytes)),
        Dtype::I32 => Data::I64(convert(bytes, |b| i32::from_le_bytes(b).into())),
        _ => return None,
    })
}

fn convert<const N: usize, T>(bytes: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
    bytes
        .chunks_exact(N)
        .map(|c| {
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            f(a)
        })
        .collect()
}

/// Recipe dimensions as host sizes (lossless on the 64-bit hosts glmc runs on).
fn dims(d: &[u64]) -> Vec<usize> {
    d.iter().map(|&x| x as usize).collect()
}

fn io_error(path: &Path) -> impl Fn(io::Error) -> WeightError + '_ {
    move |source| WeightError::Io {
        file: path.to_path_buf(),
        source,
    }
}

fn index_error(path: &Path, e: &serde_json::Error) -> WeightError {
    let full = e.to_string();
    let location = format!(" at line {} column {}", e.line(), e.column());
    WeightError::Index {
        file: path.to_path_buf(),
        line: e.line(),
        column: e.column(),
        message: full.strip_suffix(&location).unwrap_or(&full).to_string(),
    }
}

/// Keys under which each name can be found from a similar one: each proper dotted suffix, and
/// the name with each component replaced by a wildcard. The first name in sorted order wins a
/// key, so suggestions are deterministic.
fn near_names<'a>(names: impl Iterator<Item = &'a String>) -> HashMap<String, String> {
    let mut names: Vec<&String> = names.collect();
    names.sort_unstable();
    let mut near = HashMap::new();
    for name in names {
        let parts: Vec<&str> = name.split('.').collect();
        for i in 0..parts.len() {
            near.entry(wildcard_key(&parts, i))
                .or_insert_with(|| name.clone());
            if i > 0 {
                near.entry(suffix_key(&parts[i..].join(".")))
                    .or_insert_with(|| name.clone());
            }
        }
    }
    near
}

fn suffix_key(suffix: &str) -> String {
    format!("suffix:{suffix}")
}

fn wildcard_key(parts: &[&str], i: usize) -> String {
    let mut key = String::from("one:");
    for (j, p) in parts.iter().enumerate() {
        if j > 0 {
            key.push('.');
        }
        key.push_str(if j == i { "*" } else { p });
    }
    key
}
