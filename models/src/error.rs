//! Errors of the config front ends (`model.ron` and HF `config.json`).
//!
//! Every message is one paragraph that starts with the file, so a user can jump to it; syntax
//! errors use the `FILE:LINE:COL: message` form editors and terminals recognise.

use std::fmt;
use std::path::{Path, PathBuf};

/// Why a model config could not be loaded or imported.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file (or the checkpoint directory's `config.json`) could not be read.
    #[error("{}: cannot read the file: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The text is not well-formed RON/JSON, or does not have the shape of a config (unknown or
    /// missing field, wrong type). `line`/`col` are 1-based.
    #[error("{}:{line}:{col}: {message}", path.display())]
    Syntax {
        path: PathBuf,
        line: usize,
        col: usize,
        message: String,
    },
    /// The config parsed, but a value is impossible or unsupported. `field` is a path such as
    /// `indexer.index_head_dim` (for `config.json`: the JSON key).
    #[error("{}: invalid `{field}`: {message}", path.display())]
    Invalid {
        path: PathBuf,
        field: String,
        message: String,
    },
    /// A `config.json` lacks a key glmc takes no default for; `why` says why and what to add.
    #[error("{}: required key `{key}` is missing: {why}", path.display())]
    MissingKey {
        path: PathBuf,
        key: String,
        why: String,
    },
    /// A `config.json` of another architecture.
    #[error(
        "{}: model_type {found:?} is not supported; glmc compiles only `glm_moe_dsa` (GLM-5, GLM-5.1, \
         GLM-5.2) checkpoints",
        path.display()
    )]
    UnsupportedModelType { path: PathBuf, found: String },
}

/// A validation failure before it is tied to a file: `ModelConfig::validate` does not know where
/// the config came from, so callers attach the path with [`InvalidConfig::in_file`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidConfig {
    /// Path of the offending field, e.g. `moe.topk_group`.
    pub field: String,
    /// The bad value, why it is impossible, and what would be valid.
    pub message: String,
}

impl InvalidConfig {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        InvalidConfig {
            field: field.into(),
            message: message.into(),
        }
    }

    /// The same failure as a [`ConfigError`] that names `path`.
    pub fn in_file(self, path: &Path) -> ConfigError {
        ConfigError::Invalid {
            path: path.to_path_buf(),
            field: self.field,
            message: self.message,
        }
    }
}

impl fmt::Display for InvalidConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid `{}`: {}", self.field, self.message)
    }
}

impl std::error::Error for InvalidConfig {}
