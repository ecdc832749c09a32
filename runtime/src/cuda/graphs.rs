//! Decode steps replayed from CUDA graphs, so a step costs one launch on the host, not one per
//! kernel.
//!
//! A decode step's launches depend on the call only through its sizes, the batch `b` and the
//! context `t`: every pointer is fixed for the executor's life (the arena, the caches, the
//! weights, the input buffers), and what changes from step to step (ids, positions, sampling
//! parameters) is read on the device from those buffers. So one graph, captured the first time
//! a size is seen, serves every later step of that size. The context is rounded up to a power of
//! two (at least [`MIN_CONTEXT`], at most the artifact's): a step is the same computation for any
//! `t` past its rows' positions, since each row reads keys up to its own position (a ragged
//! batch already runs at the longest row's `t`), and the only launch whose work grows with `t`,
//! the indexer's scores, does at most twice the keys it would. A graph per batch size and
//! bucket: at most `log2(max_context / MIN_CONTEXT) + 1` per batch size.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaStream};
use glmc_codegen::expr::{decode_bindings, Bindings};

use super::{driver, CudaError, Gpu};

/// The smallest context a graph is captured for: below it the indexer's extra keys cost less
/// than capturing more graphs.
pub const MIN_CONTEXT: u64 = 2048;

/// The context a decode step of context `t` runs at from a graph, for an artifact of
/// `max_context`.
pub fn context_bucket(t: u64, max_context: u64) -> u64 {
    t.max(MIN_CONTEXT)
        .next_power_of_two()
        .min(max_context)
        .max(t)
}

/// A decode graph's key: the batch and the context bucket it runs at.
pub type GraphSize = (u64, u64);

/// The captured decode steps of one executor, on a stream of their own (the legacy default
/// stream, which the rest of the executor uses, cannot be captured).
pub struct Graphs {
    stream: Arc<CudaStream>,
    by_size: HashMap<GraphSize, CudaGraph>,
}

impl Graphs {
    pub fn new(gpu: &Gpu) -> Result<Graphs, CudaError> {
        let stream = gpu
            .ctx
            .new_stream()
            .map_err(driver("creating the stream CUDA graphs are captured on"))?;
        Ok(Graphs {
            stream,
            by_size: HashMap::new(),
        })
    }

    /// The bindings a step of batch `b` and context `t` replays under.
    pub fn bindings(b: u64, t: u64, max_context: u64) -> Bindings {
        decode_bindings(b, context_bucket(t, max_context))
    }

    /// Whether the step of `size` (batch, context bucket) has been captured.
    pub fn has(&self, size: GraphSize) -> bool {
        self.by_size.contains_key(&size)
    }

    /// Captures the step of `size` with `record`, which queues the step's launches on the stream
    /// it is given, and keeps its graph.
    pub fn capture(
        &mut self,
        size: GraphSize,
        record: impl FnOnce(&Arc<CudaStream>) -> Result<(), CudaError>,
    ) -> Result<(), CudaError> {
        let graph = self.record(record)?;
        self.by_size.insert(size, graph);
        Ok(())
    }

    /// Queues the captured step of `size` on [`Graphs::stream`]. The caller has finished its
    /// work on the default stream (the inputs' uploads): this stream does not wait for it.
    pub fn launch(&self, size: GraphSize) -> Result<(), CudaError> {
        let graph = self.by_size.get(&size).ok_or_else(|| {
            CudaError::Artifact(format!("no decode graph was captured for {size:?}"))
        })?;
        graph
            .launch()
            .map_err(driver("launching a decode step's CUDA graph"))
    }

    fn record(
        &self,
        record: impl FnOnce(&Arc<CudaStream>) -> Result<(), CudaError>,
    ) -> Result<CudaGraph, CudaError> {
        capture(&self.stream, "a decode step", record)
    }

    /// The stream the graphs run on, for timing them with events.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

/// The graph of the work `record` queues on `stream` (not the legacy default stream, which
/// cannot be captured), `what` naming it in errors.
pub(crate) fn capture(
    stream: &Arc<CudaStream>,
    what: &str,
    record: impl FnOnce(&Arc<CudaStream>) -> Result<(), CudaError>,
) -> Result<CudaGraph, CudaError> {
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(driver(format!("starting to capture {what}")))?;
    // The capture is ended also when recording failed, so the stream is usable again.
    let recorded = record(stream);
    let graph = stream
        .end_capture(CUgraphInstantiate_flags(0))
        .map_err(driver(format!("capturing {what} into a CUDA graph")));
    recorded?;
    graph?
        .ok_or_else(|| CudaError::Artifact(format!("{what} captured no work into its CUDA graph")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts_round_up_to_powers_of_two_within_the_artifact() {
        assert_eq!(context_bucket(1, 32768), MIN_CONTEXT);
        assert_eq!(context_bucket(2048, 32768), 2048);
        assert_eq!(context_bucket(2049, 32768), 4096);
        assert_eq!(context_bucket(20000, 32768), 32768);
        // Never past the artifact's context, never below the step's.
        assert_eq!(context_bucket(20000, 24000), 24000);
        assert_eq!(context_bucket(100, 1024), 1024);
        assert_eq!(context_bucket(5000, 5000), 5000);
    }
}
