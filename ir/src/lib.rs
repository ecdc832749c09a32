//! glmc-ir: the dataflow graph IR glmc compiles GLM-5 through.
//!
//! A `Module` holds cache state declarations and entry functions (`prefill`, `decode`); each
//! function is a `petgraph::StableDiGraph` of `Node`s (an `Op` from the op table, a stable
//! semantic name and output types). `verify` checks it, `print`/`parse` give the canonical text
//! form, `serial` the RON form and `dot` a Graphviz view.

pub mod dot;
pub mod graph;
pub mod lit;
pub mod ops;
pub mod parse;
pub mod print;
pub mod recipe;
pub mod serial;
pub mod types;
pub mod verify;

pub use graph::{Function, Module, Node, Operand, Shard, Tp, Value};
pub use ops::{Arity, Op, Reduce, RopeSpan};
pub use parse::{parse_module, ParseError};
pub use print::{print_function, print_module, print_module_summary};
pub use recipe::{Recipe, RecipeError};
pub use types::{DType, Dim, TensorType};
pub use verify::{verify_function, verify_module, VerifyError};

pub use petgraph::stable_graph::NodeIndex;
