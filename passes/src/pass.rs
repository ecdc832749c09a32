//! The `Pass` trait.

use glmc_ir::{Module, VerifyError};

/// A rewrite of a module. `run` returns whether it changed anything; the manager verifies the
/// module after every pass and names the pass when verification fails.
pub trait Pass {
    /// The name users select the pass by (`--disable-pass`, `--after`), kebab-case.
    fn name(&self) -> &'static str;

    fn run(&self, module: &mut Module) -> Result<bool, PassError>;
}

#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error(
        "after pass `{pass}` the module no longer verifies (a glmc bug in that pass): {source}"
    )]
    Verify {
        pass: &'static str,
        source: Box<VerifyError>,
    },
    #[error("pass `{pass}`, @{function}, node \"{node}\": {message}")]
    Rewrite {
        pass: &'static str,
        function: String,
        node: String,
        message: String,
    },
    #[error("pass `{pass}`: {message}")]
    Options { pass: &'static str, message: String },
}

impl PassError {
    /// The graph `pass` produced does not verify.
    pub fn verify(pass: &'static str, source: VerifyError) -> PassError {
        PassError::Verify {
            pass,
            source: Box::new(source),
        }
    }
}
