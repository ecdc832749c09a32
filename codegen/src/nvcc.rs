//! The CUDA compiler: finding it, compiling `kernels.cu` to a cubin for a target, reading its
//! `ptxas -v` report, and a cache of cubins keyed by the content they were made from.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use crate::target::Target;

/// Flags every compile uses; part of the cache key.
const FLAGS: &[&str] = &["-O3", "-std=c++17", "-Xptxas", "-v", "-cubin"];

#[derive(Debug, thiserror::Error)]
pub enum NvccError {
    #[error("the CUDA compiler {path} (from {origin}) does not exist or is not a file: pass --nvcc PATH or set GLMC_NVCC to an nvcc 13.0")]
    NotFound { path: PathBuf, origin: &'static str },
    #[error("running {path}: {source}")]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("nvcc failed to compile kernels.cu for {target} (exit {status}):\n{stderr}")]
    Failed {
        target: Target,
        status: String,
        stderr: String,
    },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A CUDA compiler found on this machine.
#[derive(Clone, Debug)]
pub struct Compiler {
    pub path: PathBuf,
    /// The last line of `nvcc --version` (`Build cuda_13.0.r13.0/compiler.…`).
    pub version: String,
}

/// The compiler to use: `explicit` (`--nvcc`), else `$GLMC_NVCC`, else `nvcc` on `PATH`;
/// `Ok(None)` when none of them names one.
pub fn find(explicit: Option<&Path>) -> Result<Option<Compiler>, NvccError> {
    let named = explicit
        .map(|p| (p.to_path_buf(), "--nvcc"))
        .or_else(|| std::env::var_os("GLMC_NVCC").map(|p| (PathBuf::from(p), "$GLMC_NVCC")));
    let path = match named {
        Some((path, origin)) => {
            if !path.is_file() {
                return Err(NvccError::NotFound { path, origin });
            }
            path
        }
        None => match on_path("nvcc") {
            Some(p) => p,
            None => return Ok(None),
        },
    };
    let out = Command::new(&path)
        .arg("--version")
        .output()
        .map_err(|source| NvccError::Spawn {
            path: path.clone(),
            source,
        })?;
    let version = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or("unknown")
        .trim()
        .to_string();
    Ok(Some(Compiler { path, version }))
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// A compiled cubin and what ptxas said about it.
#[derive(Clone, Debug)]
pub struct Compiled {
    pub cubin: Vec<u8>,
    /// `ptxas -v`'s output, verbatim.
    pub ptxas: String,
    /// Whether it came from the cache.
    pub cached: bool,
}

/// Where cubins are cached: `$GLMC_CACHE_DIR`, else `$XDG_CACHE_HOME/glmc`, else
/// `~/.cache/glmc`; `None` without a home.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("GLMC_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("glmc"))
}

/// The cache key of `source` compiled for `target` by `compiler`.
pub fn cache_key(compiler: &Compiler, source: &str, target: Target) -> String {
    let mut h = Sha256::new();
    for part in [compiler.version.as_str(), target.nvcc_arch(), source] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    for f in FLAGS {
        h.update(f.as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Compiles `source` for `target`, or takes the cubin from `cache` when it was made before
/// from the same source, target, compiler and flags.
pub fn compile(
    compiler: &Compiler,
    source: &str,
    target: Target,
    cache: Option<&Path>,
) -> Result<Compiled, NvccError> {
    let key = cache_key(compiler, source, target);
    let cached = cache.map(|d| {
        let d = d.join("cubins");
        (
            d.join(format!("{key}.cubin")),
            d.join(format!("{key}.ptxas.txt")),
        )
    });
    if let Some((cubin, ptxas)) = &cached {
        if let (Ok(c), Ok(p)) = (std::fs::read(cubin), std::fs::read_to_string(ptxas)) {
            return Ok(Compiled {
                cubin: c,
                ptxas: p,
                cached: true,
            });
        }
    }
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let work = std::env::temp_dir().join(format!(
        "glmc-nvcc-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let io = |what: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| NvccError::Io { what, path, source }
    };
    std::fs::create_dir_all(&work).map_err(io("creating", &work))?;
    let result = (|| {
        let cu = work.join("kernels.cu");
        let out = work.join("kernels.cubin");
        std::fs::write(&cu, source).map_err(io("writing", &cu))?;
        let arch = target.nvcc_arch();
        let output = Command::new(&compiler.path)
            .arg("-gencode")
            .arg(format!(
                "arch={},code={arch}",
                arch.replace("sm_", "compute_")
            ))
            .args(FLAGS)
            .arg("-o")
            .arg(&out)
            .arg(&cu)
            .output()
            .map_err(|source| NvccError::Spawn {
                path: compiler.path.clone(),
                source,
            })?;
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        if !output.status.success() {
            return Err(NvccError::Failed {
                target,
                status: output.status.to_string(),
                stderr,
            });
        }
        let cubin = std::fs::read(&out).map_err(io("reading", &out))?;
        Ok(Compiled {
            cubin,
            ptxas: stderr,
            cached: false,
        })
    })();
    let _ = std::fs::remove_dir_all(&work);
    let compiled = result?;
    if let Some((cubin, ptxas)) = &cached {
        // A cache that cannot be written only costs the next compile its time.
        let dir = cubin.parent().expect("a file in the cache directory");
        if std::fs::create_dir_all(dir).is_ok() {
            let _ = write_via_temp(ptxas, compiled.ptxas.as_bytes())
                .and_then(|()| write_via_temp(cubin, &compiled.cubin));
        }
    }
    Ok(compiled)
}

fn write_via_temp(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// What ptxas reports for one kernel.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelUsage {
    pub name: String,
    pub registers: u32,
    pub stack_bytes: u32,
    pub spill_store_bytes: u32,
    pub spill_load_bytes: u32,
    pub shared_bytes: u32,
}

impl fmt::Display for KernelUsage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} registers, {} B stack, {} B spill stores, {} B spill loads, {} B smem",
            self.name,
            self.registers,
            self.stack_bytes,
            self.spill_store_bytes,
            self.spill_load_bytes,
            self.shared_bytes
        )
    }
}

/// The per-kernel usage in a `ptxas -v` report.
pub fn parse_ptxas(report: &str) -> Vec<KernelUsage> {
    let mut kernels: Vec<KernelUsage> = Vec::new();
    let number_before = |line: &str, what: &str| -> Option<u32> {
        let at = line.find(what)?;
        line[..at].split_whitespace().last()?.parse().ok()
    };
    for line in report.lines() {
        if let Some(rest) = line.split("Function properties for ").nth(1) {
            kernels.push(KernelUsage {
                name: rest.trim().to_string(),
                ..Default::default()
            });
            continue;
        }
        let Some(k) = kernels.last_mut() else {
            continue;
        };
        if line.contains("stack frame") {
            k.stack_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
            k.spill_store_bytes = number_before(line, "bytes spill stores").unwrap_or(0);
            k.spill_load_bytes = number_before(line, "bytes spill loads").unwrap_or(0);
        } else if line.contains("Used") && line.contains("registers") {
            k.registers = number_before(line, "registers").unwrap_or(0);
            k.shared_bytes = number_before(line, "bytes smem").unwrap_or(0);
        }
    }
    kernels
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_spills_and_registers() {
        let report = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'glmc_norm_1' for 'sm_120a'\n\
ptxas info    : Function properties for glmc_norm_1\n\
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 24 registers, used 1 barriers, 128 bytes smem, 404 bytes cmem[0]\n\
ptxas info    : Compiling entry function 'glmc_big_2' for 'sm_120a'\n\
ptxas info    : Function properties for glmc_big_2\n\
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n\
ptxas info    : Used 255 registers, used 0 barriers, 404 bytes cmem[0]\n";
        let k = parse_ptxas(report);
        assert_eq!(k.len(), 2);
        assert_eq!(
            k[0],
            KernelUsage {
                name: "glmc_norm_1".into(),
                registers: 24,
                shared_bytes: 128,
                ..Default::default()
            }
        );
        assert_eq!((k[1].spill_store_bytes, k[1].spill_load_bytes), (8, 4));
        assert_eq!((k[1].registers, k[1].stack_bytes), (255, 16));
    }

    #[test]
    fn a_named_compiler_that_is_missing_is_an_error() {
        let err = find(Some(Path::new("/nonexistent/nvcc"))).unwrap_err();
        assert!(err.to_string().contains("--nvcc"), "{err}");
    }
}
