//! Runs passes in order, verifying after each, timing each, and dumping the module after the
//! passes whose names match a pattern.

use std::time::{Duration, Instant};

use glmc_ir::{verify_module, Module};
use regex::Regex;

use crate::pass::{Pass, PassError};

/// What one pass did.
#[derive(Debug)]
pub struct PassRecord {
    pub name: &'static str,
    pub changed: bool,
    pub elapsed: Duration,
    /// The module after the pass, when its name matched the dump pattern and it changed.
    pub snapshot: Option<Module>,
}

#[derive(Default)]
pub struct PassManager {
    passes: Vec<Box<dyn Pass>>,
    dump_after: Option<Regex>,
}

impl PassManager {
    pub fn new() -> PassManager {
        PassManager::default()
    }

    pub fn add(&mut self, pass: impl Pass + 'static) -> &mut PassManager {
        self.passes.push(Box::new(pass));
        self
    }

    /// Drops the pass named `name`; false when no pass has that name.
    pub fn disable(&mut self, name: &str) -> bool {
        let before = self.passes.len();
        self.passes.retain(|p| p.name() != name);
        self.passes.len() != before
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    /// Dump the module after every pass whose whole name matches `pattern`.
    pub fn dump_after(&mut self, pattern: Regex) -> &mut PassManager {
        self.dump_after = Some(pattern);
        self
    }

    pub fn run(&self, module: &mut Module) -> Result<Vec<PassRecord>, PassError> {
        let mut records = Vec::with_capacity(self.passes.len());
        for pass in &self.passes {
            let start = Instant::now();
            let changed = pass.run(module)?;
            let elapsed = start.elapsed();
            verify_module(module).map_err(|source| PassError::verify(pass.name(), source))?;
            let wanted = self
                .dump_after
                .as_ref()
                .is_some_and(|re| full_match(re, pass.name()));
            let snapshot = (wanted && changed).then(|| module.clone());
            records.push(PassRecord {
                name: pass.name(),
                changed,
                elapsed,
                snapshot,
            });
        }
        Ok(records)
    }

    /// Whether a dump was asked for after `name`.
    pub fn dumps(&self, name: &str) -> bool {
        self.dump_after
            .as_ref()
            .is_some_and(|re| full_match(re, name))
    }
}

/// Whether `re` matches the whole of `s` (pass names are selected by whole-name patterns).
///
/// The pattern is anchored rather than its first match checked: `find` returns the
/// leftmost-first match, which for `absorb|absorb-mla` on "absorb-mla" is "absorb", and
/// would hide the alternative that spans the whole name.
pub fn full_match(re: &Regex, s: &str) -> bool {
    Regex::new(&format!(r"\A(?:{})\z", re.as_str())).is_ok_and(|anchored| anchored.is_match(s))
}
