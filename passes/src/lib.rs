//! glmc-passes: rewrites of the IR, one file per pass, and the pass manager that runs them,
//! verifies after each and dumps the module by pass name.

pub mod absorb_mla;
pub mod cse;
pub mod dce;
pub mod fuse_cache_update;
pub mod fuse_elementwise;
pub mod fuse_lm_head_argmax;
pub mod fuse_mla_projections;
pub mod fuse_mlp_projections;
pub mod lower_moe;
pub mod manager;
pub mod pass;
pub mod pipeline;
pub mod plan_memory;
pub mod select_attention;
mod stack_projections;
pub mod tp_partition;

pub use manager::{PassManager, PassRecord};
pub use pass::{Pass, PassError};
pub use pipeline::{pipeline, PipelineOptions, PIPELINE};
pub use plan_memory::{kv_cache_bytes, plan_memory, MemoryPlan, PlanError};
pub use select_attention::AttentionChoice;
pub use tp_partition::{partition, split_layout, SplitLayout, TpPartition};
