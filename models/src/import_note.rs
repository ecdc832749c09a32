//! What `import-hf` took on transformers' authority rather than from the file: a key that was
//! absent and got transformers 5.17's default, or a value transformers replaces. The importer
//! returns these beside the config so every command can show them; the library prints nothing.

use std::fmt;

/// One departure of the imported config from the literal text of `config.json`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImportNote {
    /// `key` is absent; transformers 5.17's `GlmMoeDsaConfig` default `value` was used.
    Defaulted { key: String, value: String },
    /// `key` is `found`, but transformers 5.17 replaces it with `by` (`value`), and so does glmc.
    Overridden {
        key: String,
        found: String,
        by: String,
        value: String,
    },
}

impl ImportNote {
    pub(crate) fn defaulted(key: &str, value: impl fmt::Display) -> Self {
        ImportNote::Defaulted {
            key: key.to_string(),
            value: value.to_string(),
        }
    }

    /// The `config.json` key the note is about.
    pub fn key(&self) -> &str {
        match self {
            ImportNote::Defaulted { key, .. } | ImportNote::Overridden { key, .. } => key,
        }
    }
}

impl fmt::Display for ImportNote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImportNote::Defaulted { key, value } => {
                write!(f, "{key} absent: transformers' default {value} used")
            }
            ImportNote::Overridden {
                key,
                found,
                by,
                value,
            } => write!(
                f,
                "{key} is {found}: transformers 5.17 overrides it with {by} ({value}), used"
            ),
        }
    }
}
