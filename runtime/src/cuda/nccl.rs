//! NCCL for one tensor-parallel rank: its communicator, and the collective steps of a schedule
//! queued on the rank's stream. cudarc's safe `Comm` takes typed slices, and a schedule's
//! tensors are addresses in the arena, so this uses cudarc's thin `result` layer with the
//! addresses the schedule evaluates to.
//!
//! A communicator is aborted, never destroyed collectively: `ncclCommAbort` is local and
//! returns even when a peer is gone, which is what a failing group needs, and at the end of a
//! run all work is done anyway. Another thread (the group's driver, on a rank's failure or a
//! timeout) may abort it while the rank waits on a collective's kernel: that is how a stuck
//! collective is ended. It never aborts while the rank's thread is inside an NCCL call: a
//! communicator is not thread-safe, and the last abort of a process's ranks frees all of their
//! communicators, so the handle's lock covers each call and the abort takes the pointer away
//! under it.

use std::ffi::{c_void, CStr};
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::CudaStream;
use cudarc::nccl::{result, sys};
use glmc_codegen::expr::Bindings;
use glmc_codegen::schedule::{Collective, CollectiveOp};
use glmc_ir::DType;

use super::Memory;

#[derive(Debug, thiserror::Error)]
pub enum NcclError {
    #[error("libnccl.so not found: install NCCL 2.x (where only libnccl.so.2 exists, as from the PyPI wheel, put a libnccl.so symlink to it on LD_LIBRARY_PATH)")]
    Missing,
    #[error("NCCL {what}: {why}")]
    Call { what: String, why: String },
    #[error("{op} \"{node}\": {why}")]
    Collective {
        op: &'static str,
        node: String,
        why: String,
    },
    #[error(
        "{op} \"{node}\": the group's communicator was aborted (another rank failed or timed out)"
    )]
    Aborted { op: &'static str, node: String },
}

/// Whether the NCCL library can be loaded; cudarc panics at the first call otherwise.
pub fn present() -> bool {
    // SAFETY: only tries to open the library.
    unsafe { sys::is_culib_present() }
}

fn describe(e: result::NcclError) -> String {
    // SAFETY: ncclGetErrorString returns a static C string for any result code.
    let text = unsafe { CStr::from_ptr(sys::ncclGetErrorString(e.0)) };
    format!("{:?}: {}", e.0, text.to_string_lossy())
}

fn call(what: impl Into<String>) -> impl FnOnce(result::NcclError) -> NcclError {
    let what = what.into();
    move |e| NcclError::Call {
        what,
        why: describe(e),
    }
}

/// The 128 bytes (an `ncclUniqueId`) every rank of one group initialises its communicator
/// with; rank 0 makes them and the others receive them (see [`crate::bootstrap`] across hosts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UniqueId(pub [u8; crate::bootstrap::ID_BYTES]);

impl UniqueId {
    pub fn new() -> Result<UniqueId, NcclError> {
        if !present() {
            return Err(NcclError::Missing);
        }
        let id = result::get_uniqueid().map_err(call("making the group's unique id"))?;
        Ok(UniqueId(id.internal.map(|c| c as u8)))
    }

    fn raw(&self) -> sys::ncclUniqueId {
        sys::ncclUniqueId {
            internal: self.0.map(|b| b as ::core::ffi::c_char),
        }
    }
}

/// A communicator; null once aborted.
#[derive(Debug)]
struct Handle(sys::ncclComm_t);

// SAFETY: the pointer is only used under the handle's lock, by one thread at a time.
unsafe impl Send for Handle {}

/// A communicator handle that any thread may abort.
#[derive(Clone, Debug)]
pub struct Abort(Arc<Mutex<Handle>>);

impl Abort {
    fn lock(&self) -> MutexGuard<'_, Handle> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Aborts the communicator (once; later calls do nothing): its collectives in flight end,
    /// and the rank's later collectives fail with [`NcclError::Aborted`]. Waits for an NCCL
    /// call the rank's thread is in to return.
    pub fn abort(&self) {
        let comm = std::mem::replace(&mut self.lock().0, std::ptr::null_mut());
        if !comm.is_null() {
            // SAFETY: `comm` came from ncclCommInitRank and is aborted once, here; no thread
            // can use it any more (the handle now holds null).
            let _ = unsafe { result::comm_abort(comm) };
        }
    }
}

/// One rank's communicator.
pub struct Comm {
    handle: Abort,
    rank: usize,
}

impl Comm {
    /// Joins rank `rank` of a group of `size` made with `id`, on the GPU whose context
    /// `stream` belongs to. Blocks until every rank has joined.
    pub fn init(
        stream: &CudaStream,
        id: &UniqueId,
        rank: usize,
        size: usize,
    ) -> Result<Comm, NcclError> {
        if !present() {
            return Err(NcclError::Missing);
        }
        // NCCL takes the GPU from the thread's current context.
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| NcclError::Call {
                what: format!("binding rank {rank}'s GPU before joining the group"),
                why: e.to_string(),
            })?;
        let mut comm = std::mem::MaybeUninit::uninit();
        // SAFETY: `comm` is written by ncclCommInitRank on success, read only then.
        let comm = unsafe {
            result::comm_init_rank(comm.as_mut_ptr(), size as i32, id.raw(), rank as i32)
                .map_err(call(format!("joining rank {rank} of {size} to the group")))?;
            comm.assume_init()
        };
        Ok(Comm {
            handle: Abort(Arc::new(Mutex::new(Handle(comm)))),
            rank,
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    /// A handle that aborts this communicator from any thread.
    pub fn aborter(&self) -> Abort {
        self.handle.clone()
    }

    /// Queues collective `c` on `stream`, its tensors at their addresses under `bindings`.
    pub fn enqueue(
        &self,
        stream: &CudaStream,
        c: &Collective,
        memory: &Memory,
        bindings: &Bindings,
    ) -> Result<(), NcclError> {
        let op = c.op.name();
        let fail = |why: String| NcclError::Collective {
            op,
            node: c.node.clone(),
            why,
        };
        let handle = self.handle.lock();
        let comm = handle.0;
        if comm.is_null() {
            return Err(NcclError::Aborted {
                op,
                node: c.node.clone(),
            });
        }
        let datatype = match c.input.dtype {
            DType::F32 => sys::ncclDataType_t::ncclFloat32,
            DType::BF16 => sys::ncclDataType_t::ncclBfloat16,
            DType::F16 => sys::ncclDataType_t::ncclFloat16,
            other => return Err(fail(format!("NCCL has no {other} reduction glmc uses"))),
        };
        let count = c
            .input
            .numel()
            .eval(bindings)
            .ok_or_else(|| fail(format!("its size is not bound by {bindings:?}")))?
            as usize;
        let send = memory.address(&c.input, bindings).map_err(&fail)?;
        let recv = memory.address(&c.output, bindings).map_err(&fail)?;
        let stream = stream.cu_stream() as sys::cudaStream_t;
        // SAFETY: both tensors are contiguous (the lowering copies strided operands first) and
        // lie in memory the executor owns: `count` elements at `send`, `count` (all_reduce) or
        // `count × ranks` (all_gather) at `recv`.
        let queued = unsafe {
            match c.op {
                CollectiveOp::AllReduceSum => result::all_reduce(
                    send as *const c_void,
                    recv as *mut c_void,
                    count,
                    datatype,
                    sys::ncclRedOp_t::ncclSum,
                    comm,
                    stream,
                ),
                CollectiveOp::AllGather => result::all_gather(
                    send as *const c_void,
                    recv as *mut c_void,
                    count,
                    datatype,
                    comm,
                    stream,
                ),
            }
        };
        queued.map(|_| ()).map_err(|e| fail(describe(e)))
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        self.handle.abort();
    }
}
