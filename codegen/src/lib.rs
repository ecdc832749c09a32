//! glmc-codegen: GPU targets and their capabilities. Kernel generation builds on these.

pub mod target;

pub use target::{Target, TargetError};
