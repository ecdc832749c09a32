//! glmc-codegen: from the optimised IR to CUDA.
//!
//! - [`lower`]: each phase becomes a launch schedule ([`schedule::Phase`]) over one arena, with
//!   views in place of `reshape`/`slice` and concats folded into their producers;
//! - [`kernels`]: what each op becomes (template, parameters, launch shape, arguments);
//! - [`render`]: the templates in `templates/*.cu` rendered into one `kernels.cu`;
//! - [`nvcc`]: the CUDA compiler, its `ptxas -v` report and a cubin cache by content hash;
//! - [`cost`]: bytes, FLOPs and predicted times of every op on a target;
//! - [`target`]: the GPU architectures and what each can do.

pub mod artifact;
pub mod cost;
pub mod expr;
pub mod kernels;
pub mod layout;
pub mod lower;
pub mod nvcc;
pub mod render;
pub mod schedule;
pub mod target;

pub use kernels::{MlaKernel, Variant};
pub use lower::{lower_module, lower_module_with, Limits, LowerError, Lowered};
pub use target::{Target, TargetError};
