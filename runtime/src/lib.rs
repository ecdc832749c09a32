pub mod against_config;
pub mod bootstrap;
pub mod collective;
pub use collective::{CollectiveError, Communicator};
pub mod tensor;
mod tensor_roles;
pub mod weights;
pub use against_config::{
    check_against_config, graph_tensors, human_bytes, CheckReport, CheckpointMismatch, Problem,
    TensorGroup,
};
pub use tensor::{Data, Tensor, TensorError};
pub use weights::{Checkpoint, StoredTensor, WeightError};
pub mod interp;
pub use interp::{
    cache_op_rows, run_function, InterpError, Interpreter, SequenceCache, TraceFn, TraceRecord,
    WeightSource,
};
pub mod generate;
pub mod sampling;
pub use generate::{
    generate, generate_batch, phase_inputs, prefill_inputs, Call, DecodeRow, Executor,
    GenerateError, Generation, Generator, InterpExecutor, NodeHook, PhaseKind, Step,
};
pub use sampling::{Sampling, SamplingError};
pub mod cuda;
pub mod random_weights;
pub use random_weights::RandomWeights;
pub mod trace;
