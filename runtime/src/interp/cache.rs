//! Per-sequence KV state and `cache.update`.

use std::collections::BTreeMap;

use glmc_ir::TensorType;

use super::kernels::{f32s, make, KResult};
use crate::tensor::Tensor;

/// One sequence's persistent caches: for each state of the module, one row per token position
/// (f32, row width from the module's state declaration). Rows are written by `cache.update` at
/// absolute positions and persist between calls.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SequenceCache {
    states: BTreeMap<String, StateRows>,
}

#[derive(Clone, Debug, PartialEq)]
struct StateRows {
    /// Elements per row.
    width: usize,
    /// Rows held: positions `0..len`.
    len: usize,
    data: Vec<f32>,
}

impl SequenceCache {
    pub fn new() -> SequenceCache {
        SequenceCache::default()
    }

    /// Tokens held: the most rows of any state (0 when nothing was written).
    pub fn len(&self) -> usize {
        self.states.values().map(|s| s.len).max().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The names of the states written so far.
    pub fn states(&self) -> impl Iterator<Item = &str> {
        self.states.keys().map(String::as_str)
    }

    /// Rows of `state` held (0 when never written).
    pub fn state_len(&self, state: &str) -> usize {
        self.states.get(state).map_or(0, |s| s.len)
    }

    /// The rows of `state`, `[len, ..]` flattened.
    pub fn state_rows(&self, state: &str) -> Option<&[f32]> {
        self.states.get(state).map(|s| &s.data[..s.len * s.width])
    }

    /// Forgets every position `>= len` (rewind, e.g. after rejected speculative tokens).
    pub fn truncate(&mut self, len: usize) {
        for s in self.states.values_mut() {
            if s.len > len {
                s.len = len;
                s.data.truncate(len * s.width);
            }
        }
    }

    pub fn clear(&mut self) {
        self.states.clear();
    }

    /// Each state's length, to roll a failed call back with [`SequenceCache::restore`].
    pub(super) fn snapshot(&self) -> Vec<(String, usize)> {
        self.states
            .iter()
            .map(|(k, s)| (k.clone(), s.len))
            .collect()
    }

    /// Drops the rows and states added since `snapshot`.
    pub(super) fn restore(&mut self, snapshot: Vec<(String, usize)>) {
        let lens: BTreeMap<String, usize> = snapshot.into_iter().collect();
        self.states.retain(|k, _| lens.contains_key(k));
        for (k, s) in &mut self.states {
            let len = lens[k];
            if s.len > len {
                s.len = len;
                s.data.truncate(len * s.width);
            }
        }
    }

    /// Writes `row` at `pos`: overwriting, or appending at the end; a gap is an error.
    fn write(&mut self, state: &str, width: usize, pos: usize, row: &[f32]) -> KResult<()> {
        let s = self
            .states
            .entry(state.to_string())
            .or_insert_with(|| StateRows {
                width,
                len: 0,
                data: Vec::new(),
            });
        if s.width != width {
            return Err(format!(
                "cache state \"{state}\" holds rows of {} elements, the update writes {width}",
                s.width
            ));
        }
        if pos > s.len {
            return Err(format!(
                "writing position {pos} of cache state \"{state}\", which holds {} rows, would \
                 leave a gap (positions must continue the cache)",
                s.len
            ));
        }
        if pos == s.len {
            s.data.extend_from_slice(row);
            s.len += 1;
        } else {
            s.data[pos * width..(pos + 1) * width].copy_from_slice(row);
        }
        Ok(())
    }

    /// Rows `0..t` of `state` into `out` (`t * width` elements); rows not held stay as they are.
    fn read_into(&self, state: &str, t: usize, out: &mut [f32]) {
        if let Some(s) = self.states.get(state) {
            let n = t.min(s.len) * s.width;
            out[..n].copy_from_slice(&s.data[..n]);
        }
    }
}

/// The cache slot of a `cache.update`'s `slot` operand (`i64[1]`).
pub(super) fn slot(t: &Tensor) -> KResult<usize> {
    match t.as_i64() {
        Ok(&[s]) => usize::try_from(s).map_err(|_| format!("cache slot {s} is negative")),
        _ => Err(format!(
            "the cache slot must be one integer, got {:?} {}",
            t.shape(),
            t.dtype()
        )),
    }
}

/// `cache.update`: writes `new [n, ..]` at `positions` and returns rows `0..=max position`:
/// `[t, ..]` for one sequence (`caches[slot]`, or the one cache given when there is no slot),
/// or `[b, t, ..]` when `batched` (row `i` of `new` belongs to `caches[i]`; each sequence's rows
/// past its own position are zero).
pub(super) fn update(
    caches: &mut [&mut SequenceCache],
    state: &str,
    row_type: &TensorType,
    batched: bool,
    slot: Option<usize>,
    new: &Tensor,
    positions: &[usize],
) -> KResult<Tensor> {
    let data = f32s(new, "new rows")?;
    if !row_type.dtype.is_float() {
        return Err(format!(
            "cache state \"{state}\" holds {row_type}; only float states are supported"
        ));
    }
    let shape = new.shape();
    let tail = &shape[1.min(shape.len())..];
    let declared: Option<Vec<usize>> = row_type
        .shape
        .iter()
        .map(|d| d.as_const().map(|c| c as usize))
        .collect();
    if declared.as_deref() != Some(tail) {
        return Err(format!(
            "cache state \"{state}\" holds rows of {row_type}, the update writes {shape:?}"
        ));
    }
    let n = positions.len();
    let width: usize = tail.iter().product();
    let t = positions.iter().max().map_or(0, |&p| p + 1);
    let row = |i: usize| &data[i * width..(i + 1) * width];
    if !batched {
        let given = caches.len();
        let cache = match (slot, caches) {
            (Some(slot), caches) => caches.get_mut(slot).ok_or_else(|| {
                format!("cache slot {slot} is out of range: {given} cache slots were given")
            })?,
            (None, [cache]) => cache,
            (None, _) => {
                return Err(format!(
                    "an unbatched cache.update without a slot runs for one sequence, but \
                     {given} caches were given"
                ))
            }
        };
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| positions[i]);
        for i in order {
            cache.write(state, width, positions[i], row(i))?;
        }
        let mut out = vec![0f32; t * width];
        cache.read_into(state, t, &mut out);
        let mut out_shape = vec![t];
        out_shape.extend_from_slice(tail);
        make(out_shape, out)
    } else {
        if caches.len() != n {
            return Err(format!(
                "a batched cache.update writes {n} rows, one per sequence, but {} caches were \
                 given",
                caches.len()
            ));
        }
        let mut out = vec![0f32; n * t * width];
        for (i, cache) in caches.iter_mut().enumerate() {
            cache
                .write(state, width, positions[i], row(i))
                .map_err(|e| format!("sequence {i}: {e}"))?;
            let rows = positions[i] + 1;
            cache.read_into(state, rows, &mut out[i * t * width..(i * t + rows) * width]);
        }
        let mut out_shape = vec![n, t];
        out_shape.extend_from_slice(tail);
        make(out_shape, out)
    }
}
