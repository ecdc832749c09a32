//! The configs shipped in the models crate directory.

use std::path::PathBuf;

/// Shipped `model.ron` files, relative to the models crate directory: the real GLM-5; two slices of
/// it at its real dimensions and vocabulary, layer 0 dense and the rest MoE, without the MTP layer
/// (glmc builds none): `glm5-slice.ron` (4 layers, bf16, 63,882,007,552 bytes of weights by
/// `glmc compile --report`: the standard large model, it fits one H200) and `glm5-2layer.ron` (2
/// layers, f32, 48,725,900,288 bytes: the largest model the interpreter checks in f32 within a
/// 128 GB host); and two tiny configs (sparse attention with shared indexer layers and group
/// routing; dense, no indexer) small enough for the reference interpreter.
pub const SHIPPED_CONFIGS: [&str; 5] = [
    "glm5.ron",
    "glm5-slice.ron",
    "glm5-2layer.ron",
    "tiny-sparse.ron",
    "tiny-dense.ron",
];

/// Absolute path of a shipped config, e.g. `shipped_config_path("glm5.ron")`.
pub fn shipped_config_path(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(file)
}
