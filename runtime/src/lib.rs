pub mod tensor;
pub mod weights;
pub use tensor::{Data, Tensor, TensorError};
pub use weights::{Checkpoint, StoredTensor, WeightError};
pub mod interp;
pub use interp::{
    run_function, InterpError, Interpreter, SequenceCache, TraceFn, TraceRecord, WeightSource,
};
