//! The CUDA side of the runtime, as far as codegen I needs it: a GPU, the kernels of a cubin,
//! device memory, and the launcher that runs a schedule's [`Launch`]es with their arguments
//! evaluated for the sizes at hand. cudarc loads the driver at run time, so the binary builds and
//! runs on machines without CUDA; [`Gpu::open`] says so clearly when there is none.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys::{
    CUlaunchAttribute, CUlaunchAttributeID, CUlaunchAttributeValue, CUlaunchConfig,
};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DriverError,
};
use glmc_codegen::expr::Bindings;
use glmc_codegen::layout::{Buf, TensorRef};
use glmc_codegen::schedule::{ArgValue, Launch};

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("no NVIDIA driver found (libcuda could not be loaded): run on a machine with an NVIDIA GPU and driver, or use --device cpu")]
    NoDriver,
    #[error("CUDA {what}: {source}")]
    Driver {
        what: String,
        #[source]
        source: DriverError,
    },
    #[error("{0}")]
    Artifact(String),
    #[error("launch of {kernel} for \"{node}\": {why}")]
    Launch {
        kernel: String,
        node: String,
        why: String,
    },
    #[error(transparent)]
    Collective(Box<nccl::NcclError>),
}

fn driver(what: impl Into<String>) -> impl FnOnce(DriverError) -> CudaError {
    let what = what.into();
    move |source| CudaError::Driver { what, source }
}

/// cudarc panics at its first call when the driver library is missing: this says so first.
fn require_driver() -> Result<(), CudaError> {
    // SAFETY: only probes whether the driver library can be loaded.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(CudaError::NoDriver)
    }
}

/// One GPU and the stream everything runs on, in order.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
}

impl Gpu {
    pub fn open(ordinal: usize) -> Result<Gpu, CudaError> {
        require_driver()?;
        let ctx = CudaContext::new(ordinal).map_err(driver(format!("opening GPU {ordinal}")))?;
        let stream = ctx.default_stream();
        Ok(Gpu { ctx, stream })
    }

    /// GPU `ordinal` with a stream of its own for a tensor-parallel rank: NCCL's kernels and
    /// the rank's are ordered on it, apart from the legacy default stream's implicit
    /// synchronisation with every other stream of the GPU.
    pub fn open_for_rank(ordinal: usize) -> Result<Gpu, CudaError> {
        let gpu = Gpu::open(ordinal)?;
        let stream = gpu
            .ctx
            .new_stream()
            .map_err(driver(format!("creating GPU {ordinal}'s stream")))?;
        Ok(Gpu {
            ctx: gpu.ctx,
            stream,
        })
    }

    /// How many GPUs the driver sees.
    pub fn count() -> Result<usize, CudaError> {
        require_driver()?;
        let n = CudaContext::device_count().map_err(driver("counting the GPUs"))?;
        Ok(n.max(0) as usize)
    }

    /// `(major, minor)`: (9, 0) on an H200.
    pub fn compute_capability(&self) -> Result<(i32, i32), CudaError> {
        self.ctx
            .compute_capability()
            .map_err(driver("reading the compute capability"))
    }

    /// The GPU's name and its memory in bytes, for a benchmark's record.
    pub fn describe(&self) -> Result<(String, u64), CudaError> {
        let name = self.ctx.name().map_err(driver("reading the GPU's name"))?;
        let total = self
            .ctx
            .total_mem()
            .map_err(driver("reading the GPU's memory size"))?;
        Ok((name, total as u64))
    }

    /// The kernels of `cubin`, which [`launch`] starts as `mode` says.
    pub fn load(&self, cubin: &[u8], mode: LaunchMode) -> Result<Kernels, CudaError> {
        let module = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(cubin.to_vec()))
            .map_err(driver("loading the cubin"))?;
        Ok(Kernels {
            module,
            functions: HashMap::new(),
            mode,
        })
    }

    pub fn alloc(&self, bytes: usize) -> Result<CudaSlice<u8>, CudaError> {
        self.stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(driver(format!("allocating {bytes} bytes")))
    }

    pub fn upload(&self, bytes: &[u8]) -> Result<CudaSlice<u8>, CudaError> {
        if bytes.is_empty() {
            return self.alloc(0);
        }
        self.stream
            .clone_htod(bytes)
            .map_err(driver(format!("uploading {} bytes", bytes.len())))
    }

    /// Copies `bytes` to the start of `buf`, which must hold them.
    pub fn upload_into(&self, bytes: &[u8], buf: &mut CudaSlice<u8>) -> Result<(), CudaError> {
        if bytes.len() > buf.len() {
            return Err(CudaError::Artifact(format!(
                "{} bytes of input for a buffer of {}",
                bytes.len(),
                buf.len()
            )));
        }
        if bytes.is_empty() {
            return Ok(());
        }
        let mut head = buf.slice_mut(..bytes.len());
        self.stream
            .memcpy_htod(bytes, &mut head)
            .map_err(driver(format!("uploading {} bytes", bytes.len())))
    }

    pub fn download(&self, buf: &CudaSlice<u8>) -> Result<Vec<u8>, CudaError> {
        self.stream
            .clone_dtoh(buf)
            .map_err(driver("downloading a buffer"))
    }

    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.stream.synchronize().map_err(driver("synchronizing"))
    }

    /// `len` bytes from device address `address`, after the work queued so far.
    pub fn read_bytes(&self, address: u64, len: usize) -> Result<Vec<u8>, CudaError> {
        self.synchronize()?;
        let mut host = vec![0u8; len];
        self.ctx
            .bind_to_thread()
            .map_err(driver("binding the context"))?;
        // SAFETY: `host` holds `len` bytes; the caller names device memory it owns.
        unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut host, address) }
            .map_err(driver(format!("reading {len} bytes back")))?;
        Ok(host)
    }

    /// Overwrites the bytes at device address `address` with `bytes`, after the work queued so
    /// far.
    pub fn write_bytes(&self, address: u64, bytes: &[u8]) -> Result<(), CudaError> {
        self.synchronize()?;
        self.ctx
            .bind_to_thread()
            .map_err(driver("binding the context"))?;
        // SAFETY: the caller names `bytes.len()` bytes of device memory it owns.
        unsafe { cudarc::driver::result::memcpy_htod_sync(address, bytes) }
            .map_err(driver(format!("writing {} bytes", bytes.len())))
    }

    /// The device address of `buf`'s first byte.
    pub fn address(&self, buf: &CudaSlice<u8>) -> u64 {
        let (ptr, _sync) = buf.device_ptr(&self.stream);
        ptr
    }
}

/// How [`launch`] starts a cubin's kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchMode {
    /// A kernel starts once the work before it in the stream is done.
    Plain,
    /// A kernel may start while the kernel before it in the stream still runs (programmatic
    /// dependent launch), for an artifact whose manifest says `programmatic_launch`: its kernels
    /// wait in `griddepcontrol.wait` before touching memory. Under CUDA-graph capture each
    /// such launch becomes a programmatic edge, so replays overlap the same way.
    Programmatic,
}

impl LaunchMode {
    /// The mode an artifact's manifest (`programmatic_launch`) asks for.
    pub fn of(programmatic: bool) -> LaunchMode {
        if programmatic {
            LaunchMode::Programmatic
        } else {
            LaunchMode::Plain
        }
    }

    /// The launch attribute the mode passes to `cuLaunchKernelEx`, if any.
    fn attribute(self) -> Option<CUlaunchAttribute> {
        match self {
            LaunchMode::Plain => None,
            LaunchMode::Programmatic => {
                // SAFETY: the value is a plain C union, for which all zero bytes are valid.
                let mut value: CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
                value.programmaticStreamSerializationAllowed = 1;
                Some(CUlaunchAttribute {
                    id: CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                    pad: [0; 4],
                    value,
                })
            }
        }
    }
}

/// A loaded cubin's functions, looked up by name once.
pub struct Kernels {
    module: Arc<CudaModule>,
    functions: HashMap<String, CudaFunction>,
    mode: LaunchMode,
}

impl Kernels {
    /// Kernel `name`, allowed `dynamic_shared` bytes of dynamic shared memory (past 48 KiB a
    /// kernel has to opt in).
    pub fn function(
        &mut self,
        name: &str,
        dynamic_shared: u32,
    ) -> Result<&CudaFunction, CudaError> {
        if !self.functions.contains_key(name) {
            let f = self
                .module
                .load_function(name)
                .map_err(driver(format!("finding kernel {name} in the cubin")))?;
            if dynamic_shared > 0 {
                f.set_attribute(
                    cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    dynamic_shared as i32,
                )
                .map_err(driver(format!("allowing {name} {dynamic_shared} bytes of shared memory")))?;
            }
            self.functions.insert(name.to_string(), f);
        }
        Ok(&self.functions[name])
    }
}

/// Device addresses of the memory a schedule's tensors live in.
#[derive(Default, Clone, Debug)]
pub struct Memory {
    pub arena: u64,
    /// By function argument index.
    pub inputs: HashMap<u64, u64>,
    /// By weight node name.
    pub weights: HashMap<String, u64>,
    /// By state name: the base of the allocation (decode), or of the one sequence (prefill).
    pub states: HashMap<String, u64>,
}

impl Memory {
    /// The device address of `buf`'s first byte, when it has one.
    pub fn base(&self, buf: &Buf) -> Option<u64> {
        match buf {
            Buf::Arena => Some(self.arena),
            Buf::Input(i) => self.inputs.get(i).copied(),
            Buf::Weight(w) => self.weights.get(w).copied(),
            Buf::State(s) => self.states.get(s).copied(),
        }
    }

    /// The address of `at`'s first element for `bindings`.
    pub fn address(&self, at: &TensorRef, bindings: &Bindings) -> Result<u64, String> {
        let base = self
            .base(&at.buf)
            .ok_or_else(|| format!("no memory for {}", at.buf))?;
        let offset = at
            .offset_bytes
            .eval(bindings)
            .ok_or_else(|| format!("offset {} is not bound by {bindings:?}", at.offset_bytes))?;
        Ok(base.wrapping_add(offset as u64))
    }
}

enum Value {
    U64(u64),
    I64(i64),
    F32(f32),
}

/// Launches `launch` on `stream` with its arguments evaluated under `bindings` (nothing, when it is
/// an alternative for other sizes).
pub fn launch(
    stream: &Arc<CudaStream>,
    kernels: &mut Kernels,
    launch: &Launch,
    memory: &Memory,
    bindings: &Bindings,
) -> Result<(), CudaError> {
    let fail = |why: String| CudaError::Launch {
        kernel: launch.kernel.clone(),
        node: launch.node.clone(),
        why,
    };
    if let Some(guard) = &launch.when {
        let runs = guard
            .holds(bindings)
            .ok_or_else(|| fail(format!("\"{guard}\" is not bound")))?;
        if !runs {
            return Ok(());
        }
    }
    let mut values = Vec::with_capacity(launch.args.len());
    for a in &launch.args {
        values.push(match &a.value {
            ArgValue::Ptr(at) => Value::U64(memory.address(at, bindings).map_err(&fail)?),
            ArgValue::Int(p) => Value::I64(
                p.eval(bindings)
                    .ok_or_else(|| fail(format!("argument {} = {p} is not bound", a.name)))?,
            ),
            ArgValue::F32(x) => Value::F32(*x as f32),
        });
    }
    let blocks = launch
        .grid
        .eval(bindings)
        .ok_or_else(|| fail(format!("grid {} is not bound", launch.grid)))?;
    if blocks == 0 {
        return Ok(());
    }
    let grid = u32::try_from(blocks).map_err(|_| fail(format!("{blocks} blocks")))?;
    let mode = kernels.mode;
    let f = kernels.function(&launch.kernel, launch.dynamic_shared_bytes)?;
    let mut params: Vec<*mut std::ffi::c_void> = values
        .iter()
        .map(|v| match v {
            Value::U64(x) => x as *const u64 as *mut std::ffi::c_void,
            Value::I64(x) => x as *const i64 as *mut std::ffi::c_void,
            Value::F32(x) => x as *const f32 as *mut std::ffi::c_void,
        })
        .collect();
    let shape = (grid, launch.block, launch.dynamic_shared_bytes);
    // SAFETY: the arguments match the kernel's parameter list by construction (the same
    // lowering wrote both), `params` points at `values`, which outlive the call, and every
    // pointer among them is into memory that `memory` owns for the call.
    unsafe { launch_raw(stream, f, shape, mode, &mut params) }.map_err(|source| CudaError::Driver {
        what: format!("launching {} for \"{}\"", launch.kernel, launch.node),
        source,
    })
}

/// Starts `f` on `stream` with a grid of `grid` blocks of `block` threads and `shared` bytes of
/// dynamic shared memory, as `mode` says; `params` points at its arguments, in order.
///
/// # Safety
///
/// `params` must match `f`'s parameter list, and the memory it names must stay valid until the
/// kernel has run.
unsafe fn launch_raw(
    stream: &CudaStream,
    f: &CudaFunction,
    (grid, block, shared): (u32, u32, u32),
    mode: LaunchMode,
    params: &mut [*mut std::ffi::c_void],
) -> Result<(), DriverError> {
    let mut attribute = mode.attribute();
    let config = CUlaunchConfig {
        gridDimX: grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: shared,
        hStream: stream.cu_stream(),
        attrs: attribute
            .as_mut()
            .map_or(std::ptr::null_mut(), |a| a as *mut CUlaunchAttribute),
        numAttrs: u32::from(attribute.is_some()),
    };
    stream.context().bind_to_thread()?;
    // SAFETY: `config` and its attribute outlive the call; the caller vouches for `params`.
    unsafe {
        cudarc::driver::sys::cuLaunchKernelEx(
            &config,
            f.cu_function(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()
}

pub mod ceiling;
mod compile;
mod executor;
pub mod graphs;
pub mod nccl;
pub mod tp;
pub use compile::{compile, CompileError, Compiled};
pub use executor::{
    CallTiming, CudaExecutor, DeviceBytes, LaunchTime, OutOfMemory, Progress, Timing,
};
pub mod random_fill;

#[cfg(test)]
mod tests {
    use super::*;
    use glmc_codegen::Target;

    #[test]
    fn an_artifacts_manifest_picks_programmatic_launches() {
        assert_eq!(LaunchMode::of(false), LaunchMode::Plain);
        assert!(LaunchMode::Plain.attribute().is_none());
        let a = LaunchMode::of(true)
            .attribute()
            .expect("a programmatic launch passes an attribute");
        assert_eq!(
            a.id,
            CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        );
        // SAFETY: the field the attribute's id names.
        assert_eq!(unsafe { a.value.programmaticStreamSerializationAllowed }, 1);
    }

    #[test]
    fn every_targets_artifact_launches_programmatically() {
        for t in Target::ALL {
            assert_eq!(
                LaunchMode::of(t.has_programmatic_launch()),
                LaunchMode::Programmatic,
                "{t}"
            );
        }
    }
}
