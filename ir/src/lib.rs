//! glmc-ir: the dataflow graph IR glmc compiles GLM-5 through.

pub mod recipe;
pub mod types;

pub use recipe::{Recipe, RecipeError};
pub use types::{DType, Dim, TensorType};
