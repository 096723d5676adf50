//! JIT: compile a kernel configuration to an sm_90a CUBIN with NVRTC, through a disk cache.
//!
//! Device code is header-only and embedded in the binary ([`Headers`], made with
//! [`header_set!`](crate::header_set)). A [`KernelSpec`] is one configuration: a small generated
//! translation unit that includes those headers and defines one `extern "C" __global__` entry
//! taking a single `const __grid_constant__ Params p`. [`compile`] turns it into a
//! [`CompiledKernel`]: the CUBIN, the compiler log and the parsed ptxas report.
//!
//! Include names are the paths below each crate's `device/` folder, always written with angle
//! brackets from the top: `#include <megamoe/ptx/memory.cuh>` (this crate),
//! `#include <megamoe_gemm/...>` (another crate's set, passed in [`KernelSpec::headers`]).
//!
//! Environment switches:
//! - `MEGAMOE_JIT_CACHE_DIR=<dir>`: where the disk cache lives (default `~/.cache/megamoe/jit`).
//! - `MEGAMOE_JIT_NO_CACHE=1`: always compile, never read or write the disk cache.
//! - `MEGAMOE_JIT_PRINT_OPTIONS=1`: print every compilation's NVRTC options to stderr.
//! - `MEGAMOE_JIT_DUMP_DIR=<dir>`: write `<name>.cu`, `.ptx`, `.cubin`, `.log` of every kernel
//!   compiled there (bypasses the cache), and `<name>.sass` when `cuobjdump` is on `PATH` or in
//!   `$MEGAMOE_CUDA_HOME/bin`.

pub mod cache;
pub mod ptxas;

use crate::error::{Error, Result};
use crate::probe;
pub use ptxas::PtxasReport;
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// A set of embedded device headers: (include name, contents).
pub type Headers = &'static [(&'static str, &'static str)];

/// Embeds device headers of the calling crate: `header_set!("device", ["megamoe/ptx/memory.cuh"])`
/// reads `<crate>/device/megamoe/ptx/memory.cuh` at build time and names it
/// `megamoe/ptx/memory.cuh`.
#[macro_export]
macro_rules! header_set {
    ($root:literal, [$($path:literal),* $(,)?]) => {
        &[$(($path, include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/", $root, "/", $path)))),*]
    };
}

/// This crate's device headers, available to every kernel as `<megamoe/...>`.
pub const HEADERS: Headers = header_set!(
    "device",
    [
        "megamoe/common.cuh",
        "megamoe/ptx/memory.cuh",
        "megamoe/ptx/convert.cuh",
        "megamoe/ptx/timer.cuh",
        "megamoe/ptx/mbarrier.cuh",
        "megamoe/ptx/tma.cuh",
        "megamoe/ptx/sync.cuh",
        "megamoe/comm/deadline.cuh",
        "megamoe/comm/barrier.cuh",
        "megamoe/impls/quant_e4m3.cuh",
        "megamoe/impls/nvlink_copy.cuh",
        "megamoe/impls/rank_barrier.cuh",
        "megamoe/impls/launch_check.cuh",
    ]
);

/// One kernel configuration.
#[derive(Debug, Clone)]
pub struct KernelSpec {
    /// Unique, file-name-safe name of this configuration, e.g. `quant_e4m3_t256`.
    pub name: String,
    /// The `extern "C" __global__` function the translation unit defines.
    pub entry: String,
    /// The generated translation unit.
    pub source: String,
    /// Header sets of the calling crate; this crate's [`HEADERS`] are always included.
    pub headers: Vec<Headers>,
    /// Extra NVRTC options (e.g. `-DBLOCK_M=128`), after the [`base_options`].
    pub options: Vec<String>,
}

/// A compiled kernel: CUBIN plus what the compiler said about it.
#[derive(Debug)]
pub struct CompiledKernel {
    pub name: String,
    pub entry: String,
    pub cubin: Vec<u8>,
    /// The full NVRTC log (warnings and the ptxas `-v` report).
    pub log: String,
    pub report: PtxasReport,
    /// The cache key (hex hash of source, headers, options and NVRTC version).
    pub key: String,
    /// Whether the CUBIN came from the disk cache.
    pub from_disk_cache: bool,
}

/// The options every kernel is compiled with, chosen deliberately:
/// - `--gpu-architecture=sm_90a`: a real architecture, so NVRTC emits a CUBIN (no driver JIT at
///   load) and the `a` features (wgmma, setmaxnreg) are available;
/// - `-std=c++17`: `if constexpr` and folds for header-only templates;
/// - `-default-device`: plain functions in headers are device functions, no annotations needed;
/// - `--ptxas-options=-v`: the register/spill/stack/shared report parsed into [`PtxasReport`];
/// - `-lineinfo`: source lines in the SASS for profilers, no effect on the code;
/// - `-I<cuda include>` when a CUDA include folder is found (for `cuda_bf16.h`, `cuda_fp8.h`).
///
/// No fast-math: `-prec-div`, `-prec-sqrt` and `-ftz=false` stay at their IEEE defaults so that
/// scale arithmetic is bitwise equal to the CPU reference.
pub fn base_options() -> Vec<String> {
    let mut o: Vec<String> = [
        "--gpu-architecture=sm_90a",
        "-std=c++17",
        "-default-device",
        "--ptxas-options=-v",
        // NVRTC 12.9+ keeps its own cache through the driver, and a compile served from it
        // carries no ptxas report, so the spill check would have nothing to read. Our disk
        // cache keeps the log with the CUBIN instead.
        "--no-cache",
        "-lineinfo",
    ]
    .map(String::from)
    .to_vec();
    if let Some(dir) = probe::cuda_include_dir() {
        o.push(format!("-I{}", dir.display()));
    }
    o
}

impl KernelSpec {
    /// All headers visible to this kernel: this crate's, then the caller's sets.
    fn all_headers(&self) -> Vec<(&'static str, &'static str)> {
        std::iter::once(HEADERS)
            .chain(self.headers.iter().copied())
            .flat_map(|set| set.iter().copied())
            .collect()
    }

    fn options(&self) -> Vec<String> {
        let mut o = base_options();
        o.extend(self.options.iter().cloned());
        o
    }

    fn key(&self, options: &[String], nvrtc: (i32, i32)) -> String {
        let mut h = cache::KeyHasher::new();
        h.field(b"megamoe-jit-key-1")
            .field(format!("{}.{}", nvrtc.0, nvrtc.1).as_bytes())
            .field(self.entry.as_bytes())
            .field(self.source.as_bytes());
        for o in options {
            h.field(o.as_bytes());
        }
        for (name, text) in self.all_headers() {
            h.field(name.as_bytes()).field(text.as_bytes());
        }
        h.hex()
    }
}

fn env_flag(var: &str) -> bool {
    std::env::var_os(var).is_some_and(|v| !v.is_empty() && v != "0")
}

fn memo() -> &'static Mutex<HashMap<String, Arc<CompiledKernel>>> {
    static MEMO: OnceLock<Mutex<HashMap<String, Arc<CompiledKernel>>>> = OnceLock::new();
    MEMO.get_or_init(Default::default)
}

/// Compiles one configuration (or finds it in this process's memo or the disk cache).
pub fn compile(spec: &KernelSpec) -> Result<Arc<CompiledKernel>> {
    if spec.name.is_empty()
        || !spec
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
    {
        return Err(Error::Invalid {
            arg: "KernelSpec::name",
            reason: format!(
                "`{}` must be non-empty letters, digits, `_`, `-`, `.`",
                spec.name
            ),
        });
    }
    let nvrtc_version = crate::nvrtc::version()?;
    let options = spec.options();
    let key = spec.key(&options, nvrtc_version);
    if let Some(k) = memo().lock().unwrap().get(&key) {
        return Ok(k.clone());
    }
    let dump_dir = std::env::var_os("MEGAMOE_JIT_DUMP_DIR").map(PathBuf::from);
    let use_disk = !env_flag("MEGAMOE_JIT_NO_CACHE") && dump_dir.is_none();
    let dir = cache::dir();

    let cached = if use_disk {
        cache::load(&dir, &key)
    } else {
        None
    };
    let from_disk_cache = cached.is_some();
    let (cubin, log) = match cached {
        Some(hit) => hit,
        None => {
            if env_flag("MEGAMOE_JIT_PRINT_OPTIONS") {
                eprintln!("megamoe jit: {} [{}]", spec.name, options.join(" "));
            }
            let out = crate::nvrtc::compile(
                &spec.name,
                &spec.source,
                &spec.all_headers(),
                &options,
                dump_dir.is_some(),
            )?;
            if let Some(d) = &dump_dir {
                dump(d, spec, &out)?;
            }
            if use_disk {
                cache::store(&dir, &key, &out.cubin, &out.log)?;
            }
            (out.cubin, out.log)
        }
    };
    let report = ptxas::parse(&log, &spec.entry).ok_or_else(|| Error::Compile {
        kernel: spec.name.clone(),
        log: format!(
            "no ptxas report for entry `{}` (is it `extern \"C\" __global__`?)\n{log}",
            spec.entry
        ),
    })?;
    let compiled = Arc::new(CompiledKernel {
        name: spec.name.clone(),
        entry: spec.entry.clone(),
        cubin,
        log,
        report,
        key: key.clone(),
        from_disk_cache,
    });
    memo().lock().unwrap().insert(key, compiled.clone());
    Ok(compiled)
}

fn dump(dir: &Path, spec: &KernelSpec, out: &crate::nvrtc::Output) -> Result<()> {
    let io = |path: PathBuf| move |source| Error::Cache { path, source };
    std::fs::create_dir_all(dir).map_err(io(dir.to_path_buf()))?;
    let file = |ext: &str| dir.join(format!("{}.{ext}", spec.name));
    let write = |ext: &str, bytes: &[u8]| std::fs::write(file(ext), bytes).map_err(io(file(ext)));
    write("cu", spec.source.as_bytes())?;
    write("cubin", &out.cubin)?;
    write("log", out.log.as_bytes())?;
    write("ptx", out.ptx.as_deref().unwrap_or("").as_bytes())?;
    let cuobjdump = std::env::var_os("MEGAMOE_CUDA_HOME")
        .map(|h| PathBuf::from(h).join("bin/cuobjdump"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("cuobjdump"));
    match std::process::Command::new(&cuobjdump).arg("-sass").arg(file("cubin")).output() {
        Ok(o) if o.status.success() => write("sass", &o.stdout)?,
        _ => eprintln!(
            "megamoe jit: no SASS for {} ({} not runnable; install the nvidia-cuda-cuobjdump wheel)",
            spec.name,
            cuobjdump.display()
        ),
    }
    Ok(())
}

/// Compiles every configuration (in parallel) and checks each is clean: no compile error, no
/// spill, no stack frame, no local memory. Returns every failure, not just the first.
pub fn compile_all_clean(
    specs: &[KernelSpec],
) -> std::result::Result<Vec<Arc<CompiledKernel>>, Vec<Error>> {
    let mut seen = std::collections::HashSet::new();
    let duplicates: Vec<Error> = specs
        .iter()
        .filter(|s| !seen.insert(&s.name))
        .map(|s| Error::Invalid {
            arg: "KernelSpec::name",
            reason: format!("`{}` is registered twice", s.name),
        })
        .collect();
    if !duplicates.is_empty() {
        return Err(duplicates);
    }
    let results: Vec<Result<Arc<CompiledKernel>>> = specs
        .par_iter()
        .map(|s| {
            let k = compile(s)?;
            match k.report.unclean_reason() {
                Some(reason) => Err(Error::Unclean {
                    kernel: k.name.clone(),
                    reason,
                }),
                None => Ok(k),
            }
        })
        .collect();
    let (ok, errors): (Vec<_>, Vec<_>) = results.into_iter().partition(Result::is_ok);
    if errors.is_empty() {
        Ok(ok.into_iter().map(Result::unwrap).collect())
    } else {
        Err(errors.into_iter().map(|e| e.unwrap_err()).collect())
    }
}

/// Test helper for every crate with kernels: compiles every configuration and panics, listing
/// each failure, on a compile error, a spill, a stack frame or local memory. A missing NVRTC is
/// a failure too (with the command that installs it), never a silent pass.
pub fn assert_compiles_clean(specs: &[KernelSpec]) {
    assert!(!specs.is_empty(), "no kernel configurations given");
    if let Err(e) = probe::nvrtc() {
        panic!(
            "cannot compile the {} kernel configurations: {e}",
            specs.len()
        );
    }
    match compile_all_clean(specs) {
        Ok(kernels) => {
            for k in kernels {
                eprintln!("{:40} {}", k.name, k.report);
            }
        }
        Err(errors) => {
            let text: Vec<String> = errors.iter().map(|e| format!("- {e}")).collect();
            panic!(
                "{} of {} kernel configurations failed:\n{}",
                errors.len(),
                specs.len(),
                text.join("\n")
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A compile answered from NVRTC's own (driver-backed) cache has an empty log: every kernel
    /// then failed with "no ptxas report" on a machine where an earlier process had compiled it.
    #[test]
    fn nvrtc_own_cache_stays_off_so_every_compile_has_a_ptxas_report() {
        let options = base_options();
        assert!(options.iter().any(|o| o == "--no-cache"), "{options:?}");
        assert!(options.iter().any(|o| o == "--ptxas-options=-v"), "{options:?}");
    }

    #[test]
    fn every_device_file_is_embedded() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("device");
        let mut on_disk = Vec::new();
        let mut stack = vec![root.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(d).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    on_disk.push(
                        p.strip_prefix(&root)
                            .unwrap()
                            .to_string_lossy()
                            .into_owned(),
                    );
                }
            }
        }
        on_disk.sort();
        let mut embedded: Vec<String> = HEADERS.iter().map(|(n, _)| n.to_string()).collect();
        embedded.sort();
        assert_eq!(on_disk, embedded);
    }

    #[test]
    fn key_depends_on_source_options_and_version() {
        let spec = KernelSpec {
            name: "k".into(),
            entry: "k".into(),
            source: "a".into(),
            headers: vec![],
            options: vec![],
        };
        let o = vec!["-DX=1".to_string()];
        let base = spec.key(&o, (13, 0));
        assert_ne!(base, spec.key(&o, (13, 1)));
        assert_ne!(base, spec.key(&[], (13, 0)));
        let other = KernelSpec {
            source: "b".into(),
            ..spec.clone()
        };
        assert_ne!(base, other.key(&o, (13, 0)));
        assert_eq!(base, spec.key(&o, (13, 0)));
    }
}
