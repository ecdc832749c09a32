//! glmc-models: GLM-5 model configs (`model.ron`), their validation, the HF `config.json`
//! importer, and the shipped configs.

pub mod builder;
pub mod config;
pub mod error;
mod hf_json;
mod hf_layers;
pub mod import_hf;
mod import_note;
pub mod shipped;
mod validate;

pub use config::{
    AttentionMode, IndexerConfig, IndexerLayerType, ModelConfig, MoeConfig, ScoringFunc, TopkMethod,
};
pub use error::{ConfigError, InvalidConfig};
pub use import_hf::{import_hf, import_hf_str, Imported, HF_MODEL_TYPE};
pub use import_note::ImportNote;
pub use shipped::{shipped_config_path, SHIPPED_CONFIGS};
pub use validate::{MAX_DIM, MAX_LAYERS, MAX_POSITIONS, MAX_VOCAB};
