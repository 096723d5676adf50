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
pub mod sass;

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
        "megamoe/comm/wait_record.cuh",
        "megamoe/comm/deadline.cuh",
        "megamoe/comm/barrier.cuh",
        "megamoe/impls/params.cuh",
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
/// - `-I<cuda include>` when a CUDA include folder is found (for `cuda_bf16.h`, `cuda_fp8.h`);
/// - `--no-cache` from NVRTC 12.9 on: NVRTC keeps its own cache of compiled code, shared between
///   processes (with the driver's JIT cache), and on a hit there runs no ptxas and writes no ptxas
///   report into the log. A kernel first compiled by another binary (whose [`KernelSpec`] key
///   differs, e.g. through a changed unrelated header, while the code is the same) then came back
///   with an empty log and failed as "no ptxas report". Our own disk cache keeps the log with the
///   CUBIN, so NVRTC's cache gains nothing.
///
/// No fast-math: `-prec-div`, `-prec-sqrt` and `-ftz=false` stay at their IEEE defaults so that
/// scale arithmetic is bitwise equal to the CPU reference.
pub fn base_options(nvrtc_version: (i32, i32)) -> Vec<String> {
    let mut o: Vec<String> = [
        "--gpu-architecture=sm_90a",
        "-std=c++17",
        "-default-device",
        "--ptxas-options=-v",
        "-lineinfo",
    ]
    .map(String::from)
    .to_vec();
    if nvrtc_version >= (12, 9) {
        o.push("--no-cache".into());
    }
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

    fn options(&self, nvrtc_version: (i32, i32)) -> Vec<String> {
        let mut o = base_options(nvrtc_version);
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
    let options = spec.options(nvrtc_version);
    let key = spec.key(&options, nvrtc_version);
    if let Some(k) = memo().lock().unwrap().get(&key) {
        return Ok(k.clone());
    }
    let dump_dir = std::env::var_os("MEGAMOE_JIT_DUMP_DIR").map(PathBuf::from);
    let use_disk = !env_flag("MEGAMOE_JIT_NO_CACHE") && dump_dir.is_none();
    let disk = use_disk.then(cache::dir);
    let (cubin, log, report, from_disk_cache) =
        through_disk_cache(disk.as_deref(), &key, spec, || {
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
            Ok((out.cubin, out.log))
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

/// The disk-cache step of [`compile`]: the entry under `key` in `disk` when it holds a ptxas
/// report for the entry function, else `nvrtc()`'s output, stored only once its report parsed
/// (so an entry without a report, e.g. written by an older version, is compiled again and
/// replaced, and a log without one is an error that never reaches the cache). Returns the CUBIN,
/// the log, the report and whether it came from the disk.
fn through_disk_cache(
    disk: Option<&Path>,
    key: &str,
    spec: &KernelSpec,
    nvrtc: impl FnOnce() -> Result<(Vec<u8>, String)>,
) -> Result<(Vec<u8>, String, PtxasReport, bool)> {
    let hit = disk
        .and_then(|dir| cache::load(dir, key))
        .and_then(|(cubin, log)| {
            let report = ptxas::parse(&log, &spec.entry)?;
            Some((cubin, log, report, true))
        });
    if let Some(hit) = hit {
        return Ok(hit);
    }
    let (cubin, log) = nvrtc()?;
    let report = ptxas::parse(&log, &spec.entry).ok_or_else(|| Error::Compile {
        kernel: spec.name.clone(),
        log: format!(
            "no ptxas report for entry `{}` in the NVRTC log (is it `extern \"C\" __global__`?); \
             the log:\n{log}",
            spec.entry
        ),
    })?;
    if let Some(dir) = disk {
        cache::store(dir, key, &cubin, &log)?;
    }
    Ok((cubin, log, report, false))
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
    match sass::sass_of(&file("cubin")) {
        Ok(text) => write("sass", text.as_bytes())?,
        Err(reason) => eprintln!("megamoe jit: no SASS for {} ({reason})", spec.name),
    }
    Ok(())
}

/// Compiles every configuration (in parallel) and checks each is clean: no compile error, no
/// spill, no stack frame, no local memory, no wgmma serialized by ptxas. Returns every failure,
/// not just the first.
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
/// each failure, on a compile error, a spill, a stack frame, local memory, wgmmas ptxas
/// serialized, or a wgmma K loop that builds its descriptors per thread (as many `R2UR` moves
/// back to the uniform registers as wgmmas an iteration: [`sass`]). A missing NVRTC or cuobjdump is a failure too (with the command
/// that installs it), never a silent pass.
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
            let loops: Vec<String> = kernels
                .par_iter()
                .filter_map(|k| uniform_k_loops(k).err())
                .collect();
            assert!(
                loops.is_empty(),
                "{} of {} kernel configurations have K loops that build their wgmma descriptors per thread:\n{}",
                loops.len(),
                specs.len(),
                loops.join("\n")
            );
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

/// Err naming the kernel when one of its innermost wgmma loops builds its descriptors per
/// thread, or when its SASS cannot be read.
fn uniform_k_loops(k: &CompiledKernel) -> std::result::Result<(), String> {
    let text = sass::disassemble(&k.name, &k.cubin).map_err(|e| format!("- {e}"))?;
    let bad: Vec<String> = sass::wgmma_loops(&text)
        .iter()
        .filter(|l| l.descriptors_per_thread())
        .map(|l| {
            format!(
                "the loop at +{:#x} ({} instructions, {} wgmmas) moves {} registers back (R2UR) per iteration",
                l.offset, l.instructions, l.wgmmas, l.r2ur
            )
        })
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!("- {}: {}", k.name, bad.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn spec(entry: &str) -> KernelSpec {
        KernelSpec {
            name: entry.into(),
            entry: entry.into(),
            source: String::new(),
            headers: vec![],
            options: vec![],
        }
    }

    const REPORT: &str = "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n\
                          ptxas info    : Used 8 registers, used 0 barriers\n";

    #[test]
    fn nvrtc_own_cache_is_off_so_the_log_keeps_its_ptxas_report() {
        assert!(base_options((13, 0)).contains(&"--no-cache".to_string()));
        assert!(base_options((12, 9)).contains(&"--no-cache".to_string()));
        // Older NVRTC has no such cache and rejects the option.
        assert!(!base_options((12, 8)).contains(&"--no-cache".to_string()));
    }

    #[test]
    fn log_without_ptxas_report_is_an_error_and_never_cached() {
        let dir = tempfile::tempdir().unwrap();
        let err = through_disk_cache(Some(dir.path()), "key", &spec("k"), || {
            Ok((vec![1, 2, 3], String::new()))
        })
        .unwrap_err();
        assert!(
            matches!(&err, Error::Compile { kernel, log } if kernel == "k" && log.contains("no ptxas report")),
            "{err}"
        );
        assert!(cache::load(dir.path(), "key").is_none());
    }

    #[test]
    fn cached_entry_without_ptxas_report_is_compiled_again() {
        let dir = tempfile::tempdir().unwrap();
        cache::store(dir.path(), "key", &[9], "").unwrap();
        let (cubin, log, report, from_disk) =
            through_disk_cache(Some(dir.path()), "key", &spec("k"), || {
                Ok((vec![1, 2, 3], REPORT.to_string()))
            })
            .unwrap();
        assert_eq!(
            (cubin, log.as_str(), report.registers, from_disk),
            (vec![1, 2, 3], REPORT, 8, false)
        );
        // The replaced entry is a hit now: NVRTC is not called again.
        let (cubin, _, report, from_disk) =
            through_disk_cache(Some(dir.path()), "key", &spec("k"), || {
                panic!("compiled although the cache holds a whole entry")
            })
            .unwrap();
        assert_eq!(
            (cubin, report.registers, from_disk),
            (vec![1, 2, 3], 8, true)
        );
    }

    #[test]
    fn without_disk_cache_nothing_is_written() {
        let (_, _, report, from_disk) = through_disk_cache(None, "key", &spec("k"), || {
            Ok((vec![1], REPORT.to_string()))
        })
        .unwrap();
        assert_eq!((report.registers, from_disk), (8, false));
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
