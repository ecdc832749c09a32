//! Simulated collectives: the ranks of a tensor-parallel group run their graphs on threads of
//! one process, and `all_reduce`/`all_gather` meet here. A collective is matched across ranks
//! by its node name and how often this rank has reached that node, never by arrival order, so
//! a rank that runs ahead into the next step cannot mix its part into the previous one.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};

use crate::tensor::Tensor;

/// Why a collective failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CollectiveError {
    #[error("{op} \"{node}\": rank {rank} gave {got:?}, rank 0 gave {first:?} (every rank must give one shape)")]
    Shape {
        op: &'static str,
        node: String,
        rank: usize,
        got: Vec<usize>,
        first: Vec<usize>,
    },
    #[error("{op} \"{node}\": {message}")]
    Data {
        op: &'static str,
        node: String,
        message: String,
    },
    #[error(
        "{op} \"{node}\": another rank of the group failed, so this collective cannot complete"
    )]
    Aborted { op: &'static str, node: String },
}

/// What a collective that another rank's failure ended says.
pub const ABORTED: &str = "another rank of the group failed, so this collective cannot complete";

/// One collective in flight: each rank's part, and how many ranks have taken the parts.
type Slot = (Vec<Option<Arc<Tensor>>>, usize);

#[derive(Default)]
struct State {
    /// By (node name, round).
    slots: HashMap<(String, u64), Slot>,
    aborted: bool,
}

struct Shared {
    size: usize,
    state: Mutex<State>,
    ready: Condvar,
}

/// One rank's end of a group of `size` ranks.
pub struct Communicator {
    shared: Arc<Shared>,
    rank: usize,
    /// Node name → how many times this rank has reached it.
    rounds: HashMap<String, u64>,
}

impl Communicator {
    /// The `size` ends of one group, by rank.
    pub fn group(size: usize) -> Vec<Communicator> {
        let shared = Arc::new(Shared {
            size,
            state: Mutex::new(State::default()),
            ready: Condvar::new(),
        });
        (0..size)
            .map(|rank| Communicator {
                shared: shared.clone(),
                rank,
                rounds: HashMap::new(),
            })
            .collect()
    }

    pub fn size(&self) -> usize {
        self.shared.size
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Wakes every rank waiting in a collective with an error: a rank that failed will never
    /// contribute its part.
    pub fn abort(&self) {
        let mut state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        state.aborted = true;
        self.shared.ready.notify_all();
    }

    /// Every rank's `part` for `node`, in rank order, once all have given theirs.
    fn exchange(
        &mut self,
        op: &'static str,
        node: &str,
        part: Arc<Tensor>,
    ) -> Result<Vec<Arc<Tensor>>, CollectiveError> {
        let round = self.rounds.entry(node.to_string()).or_default();
        let key = (node.to_string(), *round);
        *round += 1;
        let size = self.shared.size;
        let mut state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        state
            .slots
            .entry(key.clone())
            .or_insert_with(|| (vec![None; size], 0))
            .0[self.rank] = Some(part);
        self.shared.ready.notify_all();
        loop {
            if state.aborted {
                return Err(CollectiveError::Aborted {
                    op,
                    node: node.to_string(),
                });
            }
            let slot = state
                .slots
                .get_mut(&key)
                .expect("removed only after every rank took it");
            if slot.0.iter().all(Option::is_some) {
                let parts: Vec<Arc<Tensor>> = slot.0.iter().flatten().cloned().collect();
                slot.1 += 1;
                if slot.1 == size {
                    state.slots.remove(&key);
                }
                return Ok(parts);
            }
            state = self
                .shared
                .ready
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    fn same_shapes(
        op: &'static str,
        node: &str,
        parts: &[Arc<Tensor>],
    ) -> Result<(), CollectiveError> {
        match parts.iter().position(|p| p.shape() != parts[0].shape()) {
            None => Ok(()),
            Some(rank) => Err(CollectiveError::Shape {
                op,
                node: node.to_string(),
                rank,
                got: parts[rank].shape().to_vec(),
                first: parts[0].shape().to_vec(),
            }),
        }
    }

    /// `all_reduce` with `op=sum`: the elementwise sum over the ranks, accumulated in f64 in
    /// rank order so that every rank gets the same bits.
    pub fn all_reduce_sum(
        &mut self,
        node: &str,
        part: Arc<Tensor>,
    ) -> Result<Tensor, CollectiveError> {
        const OP: &str = "all_reduce";
        let parts = self.exchange(OP, node, part)?;
        Self::same_shapes(OP, node, &parts)?;
        let data = |message: String| CollectiveError::Data {
            op: OP,
            node: node.to_string(),
            message,
        };
        let mut sum = vec![0f64; parts[0].numel()];
        for p in &parts {
            let values = p.as_f32().map_err(|e| data(e.to_string()))?;
            for (s, &x) in sum.iter_mut().zip(values) {
                *s += x as f64;
            }
        }
        Tensor::f32(
            parts[0].shape().to_vec(),
            sum.into_iter().map(|x| x as f32).collect(),
        )
        .map_err(|e| data(e.to_string()))
    }

    /// `all_gather` along `axis`: rank `r`'s part is block `r` of the result.
    pub fn all_gather(
        &mut self,
        node: &str,
        axis: usize,
        part: Arc<Tensor>,
    ) -> Result<Tensor, CollectiveError> {
        const OP: &str = "all_gather";
        let parts = self.exchange(OP, node, part)?;
        Self::same_shapes(OP, node, &parts)?;
        let parts: Vec<Tensor> = parts.iter().map(|p| (**p).clone()).collect();
        Tensor::concat(axis, &parts).map_err(|e| CollectiveError::Data {
            op: OP,
            node: node.to_string(),
            message: e.to_string(),
        })
    }
}
