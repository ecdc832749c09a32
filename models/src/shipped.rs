//! The configs shipped in the models crate directory.

use std::path::PathBuf;

/// Shipped `model.ron` files, relative to the models crate directory: the real GLM-5, and two tiny
/// configs (sparse attention with shared indexer layers and group routing; dense, no indexer)
/// small enough for the reference interpreter.
pub const SHIPPED_CONFIGS: [&str; 3] = ["glm5.ron", "tiny-sparse.ron", "tiny-dense.ron"];

/// Absolute path of a shipped config, e.g. `shipped_config_path("glm5.ron")`.
pub fn shipped_config_path(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(file)
}
