//! Typed access to the keys of a parsed `config.json`, with errors that name the key.
//!
//! The importer reads a `serde_json::Value` rather than a derived struct: serde_json's type errors
//! give a position but not the key, and several keys come in more than one form (an int or a list,
//! a string or a list), which an untagged enum would report as "did not match any variant".

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::ConfigError;

/// The top-level object of a `config.json` and the file it came from.
pub(crate) struct HfJson<'a> {
    pub(crate) path: &'a Path,
    map: Map<String, Value>,
}

impl<'a> HfJson<'a> {
    /// Parses `text`; malformed JSON becomes `FILE:LINE:COL: message`.
    pub(crate) fn parse(text: &str, path: &'a Path) -> Result<Self, ConfigError> {
        let value: Value = serde_json::from_str(text).map_err(|e| {
            let suffix = format!(" at line {} column {}", e.line(), e.column());
            let full = e.to_string();
            ConfigError::Syntax {
                path: path.to_path_buf(),
                line: e.line().max(1),
                col: e.column().max(1),
                message: full.strip_suffix(&suffix).unwrap_or(&full).to_string(),
            }
        })?;
        match value {
            Value::Object(map) => Ok(HfJson { path, map }),
            other => Err(ConfigError::Syntax {
                path: path.to_path_buf(),
                line: 1,
                col: 1,
                message: format!(
                    "expected a JSON object of config keys, found {}",
                    kind_of(&other)
                ),
            }),
        }
    }

    /// The value of `key`; JSON `null` counts as absent, as transformers writes unset options so.
    pub(crate) fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub(crate) fn invalid(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.to_path_buf(),
            field: key.to_string(),
            message: message.into(),
        }
    }

    /// A refused absent key; `why` says why glmc takes no default and what to add.
    pub(crate) fn missing(&self, key: &str, why: &str) -> ConfigError {
        ConfigError::MissingKey {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            why: why.to_string(),
        }
    }

    /// `key` converted by `convert`, `None` when absent; a value of the wrong kind is an error
    /// that quotes it and says what `expected` is.
    pub(crate) fn opt<'s, T>(
        &'s self,
        key: &str,
        expected: &str,
        convert: impl Fn(&'s Value) -> Option<T>,
    ) -> Result<Option<T>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => convert(v)
                .map(Some)
                .ok_or_else(|| self.invalid(key, format!("is {}; expected {expected}", short(v)))),
        }
    }

    pub(crate) fn opt_u64(&self, key: &str) -> Result<Option<u64>, ConfigError> {
        self.opt(key, "a non-negative integer", Value::as_u64)
    }

    pub(crate) fn opt_usize(&self, key: &str) -> Result<Option<usize>, ConfigError> {
        self.opt(key, "a non-negative integer", |v| {
            v.as_u64().and_then(|n| usize::try_from(n).ok())
        })
    }

    pub(crate) fn opt_f64(&self, key: &str) -> Result<Option<f64>, ConfigError> {
        self.opt(key, "a number", Value::as_f64)
    }

    pub(crate) fn opt_bool(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        self.opt(key, "true or false", Value::as_bool)
    }

    pub(crate) fn opt_str(&self, key: &str) -> Result<Option<&str>, ConfigError> {
        self.opt(key, "a string", Value::as_str)
    }

    /// A list of strings, or one string of single-character entries when `chars` is set
    /// (`index_topk_pattern: "FFS..."`).
    pub(crate) fn opt_str_list(
        &self,
        key: &str,
        chars: bool,
    ) -> Result<Option<Vec<String>>, ConfigError> {
        let expected = if chars {
            "a string or a list of strings"
        } else {
            "a list of strings"
        };
        self.opt(key, expected, |v| match v {
            Value::String(s) if chars => Some(s.chars().map(String::from).collect()),
            Value::Array(items) => items
                .iter()
                .map(|item| item.as_str().map(String::from))
                .collect(),
            _ => None,
        })
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The JSON text of `v`, cut short so one bad value cannot flood the message.
pub(crate) fn short(v: &Value) -> String {
    const MAX: usize = 80;
    let text = v.to_string();
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}
