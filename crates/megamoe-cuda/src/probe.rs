//! Library discovery: find libcuda, libnvrtc and libnccl before anything uses them.
//!
//! cudarc loads its libraries lazily and panics when one is missing, so every entry point of this
//! crate probes first and returns [`Error::LibraryNotFound`] naming the library and every place
//! it looked. A library found by path is kept loaded for the life of the process; the dynamic
//! loader then hands the same object to cudarc when cudarc asks for it by its soname.
//!
//! Search order, first hit wins:
//! - NVRTC: `$MEGAMOE_NVRTC_LIB` (the library or its folder), `$MEGAMOE_CUDA_HOME/{lib64,lib}`, the system loader
//!   path (`LD_LIBRARY_PATH`, ld.so.cache), `/usr/local/cuda/lib64`, then the project-local
//!   toolchain that `scripts/install-cuda-toolchain.sh` installs (`$MEGAMOE_TOOLCHAIN_DIR`, or a
//!   `.toolchain/` folder above the working directory, the executable or this crate's source).
//! - libcuda (the driver): `$MEGAMOE_LIBCUDA` (a file), the system loader path, the usual driver
//!   folders.
//! - libnccl: `$MEGAMOE_NCCL_LIB` (a file), the system loader path, `/usr/lib/x86_64-linux-gnu`.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A library that was found and stays loaded.
#[derive(Debug)]
pub struct Loaded {
    /// The path or soname it was loaded from.
    pub path: String,
    pub(crate) lib: libloading::Library,
    /// Libraries it loads by soname at run time, preloaded from its folder (NVRTC's builtins).
    _companions: Vec<libloading::Library>,
}

impl Loaded {
    /// Looks up a symbol; a missing one is an error naming the library.
    ///
    /// # Safety
    /// `T` must be the symbol's true type.
    pub(crate) unsafe fn symbol<T: Copy>(
        &self,
        library: &'static str,
        symbol: &'static str,
    ) -> Result<T> {
        let name = format!("{symbol}\0");
        unsafe { self.lib.get::<T>(name.as_bytes()) }
            .map(|s| *s)
            .map_err(|_| Error::MissingSymbol {
                library,
                path: self.path.clone(),
                symbol,
            })
    }
}

/// Loads the first candidate that loads: a path, or a bare soname for the system loader.
fn try_load(candidates: &[String]) -> Option<Loaded> {
    candidates.iter().find_map(|c| {
        // SAFETY: loading a CUDA library runs its initialisers, which have no preconditions.
        let lib = unsafe { libloading::Library::new(c) }.ok()?;
        Some(Loaded {
            path: c.clone(),
            lib,
            _companions: companions(Path::new(c)),
        })
    })
}

/// NVRTC opens `libnvrtc-builtins.so.<major>.<minor>` by soname when it compiles; outside the
/// loader's path (a toolkit folder, the project toolchain) that fails, so the builtins beside a
/// library found by path are loaded first and the loader then reuses them.
fn companions(lib: &Path) -> Vec<libloading::Library> {
    let Some(dir) = lib.parent().filter(|d| !d.as_os_str().is_empty()) else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvrtc-builtins.so."))
        })
        // SAFETY: as in `try_load`.
        .filter_map(|p| unsafe { libloading::Library::new(&p) }.ok())
        .collect()
}

fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// Folders named `.toolchain/nvidia/cu13` above the working directory, the executable and this
/// crate's source, after `$MEGAMOE_TOOLCHAIN_DIR`.
pub fn toolchain_roots() -> Vec<PathBuf> {
    let mut roots = Vec::new();
    if let Some(dir) = env_path("MEGAMOE_TOOLCHAIN_DIR") {
        roots.push(dir.join("nvidia/cu13"));
    }
    let starts = [
        std::env::current_dir().ok(),
        std::env::current_exe().ok(),
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR"))),
    ];
    for start in starts.into_iter().flatten() {
        for dir in start.ancestors() {
            let root = dir.join(".toolchain/nvidia/cu13");
            if root.is_dir() && !roots.contains(&root) {
                roots.push(root);
            }
        }
    }
    roots
}

fn nvrtc_candidates() -> Vec<String> {
    const NAMES: [&str; 2] = ["libnvrtc.so.13", "libnvrtc.so"];
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut out: Vec<String> = Vec::new();
    // MEGAMOE_NVRTC_LIB may name the library or the folder holding it.
    if let Some(path) = env_path("MEGAMOE_NVRTC_LIB") {
        if path.is_dir() {
            dirs.push(path);
        } else {
            out.push(path.display().to_string());
        }
    }
    if let Some(home) = env_path("MEGAMOE_CUDA_HOME") {
        dirs.extend([home.join("lib64"), home.join("lib")]);
    }
    let in_dirs = |dirs: &[PathBuf], out: &mut Vec<String>| {
        for d in dirs {
            for n in NAMES {
                out.push(d.join(n).display().to_string());
            }
        }
    };
    in_dirs(&dirs, &mut out);
    out.extend(NAMES.iter().map(|n| n.to_string()));
    dirs = vec![
        PathBuf::from("/usr/local/cuda/lib64"),
        PathBuf::from("/usr/local/cuda-13.0/lib64"),
        PathBuf::from("/usr/local/cuda/targets/x86_64-linux/lib"),
    ];
    dirs.extend(toolchain_roots().into_iter().map(|r| r.join("lib")));
    in_dirs(&dirs, &mut out);
    out
}

fn libcuda_candidates() -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    if let Some(file) = env_path("MEGAMOE_LIBCUDA") {
        out.push(file.display().to_string());
    }
    out.push("libcuda.so.1".into());
    for dir in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/local/nvidia/lib64",
        "/usr/lib64",
        "/usr/lib/wsl/lib",
    ] {
        out.push(format!("{dir}/libcuda.so.1"));
    }
    out
}

fn nccl_candidates() -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    if let Some(file) = env_path("MEGAMOE_NCCL_LIB") {
        out.push(file.display().to_string());
    }
    out.extend(["libnccl.so.2".into(), "libnccl.so".into()]);
    out.push("/usr/lib/x86_64-linux-gnu/libnccl.so.2".into());
    out
}

type Probe = Result<Loaded, String>;

fn probe(cell: &'static OnceLock<Probe>, candidates: fn() -> Vec<String>) -> &'static Probe {
    cell.get_or_init(|| {
        let candidates = candidates();
        try_load(&candidates).ok_or_else(|| candidates.join(", "))
    })
}

fn found(
    probe: &'static Probe,
    library: &'static str,
    hint: &'static str,
) -> Result<&'static Loaded> {
    probe.as_ref().map_err(|looked| Error::LibraryNotFound {
        library,
        looked: looked.clone(),
        hint,
    })
}

/// The CUDA driver library. Every driver call in this crate goes through here first.
pub fn libcuda() -> Result<&'static Loaded> {
    static CELL: OnceLock<Probe> = OnceLock::new();
    found(
        probe(&CELL, libcuda_candidates),
        "libcuda (the NVIDIA driver)",
        "Install the NVIDIA driver, or set MEGAMOE_LIBCUDA to the path of libcuda.so.1.",
    )
}

/// The NVRTC library that compiles every kernel.
pub fn nvrtc() -> Result<&'static Loaded> {
    static CELL: OnceLock<Probe> = OnceLock::new();
    found(
        probe(&CELL, nvrtc_candidates),
        "libnvrtc (CUDA 13 NVRTC)",
        "Run scripts/install-cuda-toolchain.sh (installs NVRTC from PyPI into .toolchain/), \
         or set MEGAMOE_CUDA_HOME to a CUDA toolkit folder, or MEGAMOE_NVRTC_LIB to libnvrtc.so.13.",
    )
}

/// NCCL, used only as an out-of-band channel; its absence is reported, never fatal here.
pub fn nccl() -> Result<&'static Loaded> {
    static CELL: OnceLock<Probe> = OnceLock::new();
    found(
        probe(&CELL, nccl_candidates),
        "libnccl (NCCL 2)",
        "Install NCCL 2, or set MEGAMOE_NCCL_LIB to the path of libnccl.so.2.",
    )
}

/// The CUDA include folder beside the NVRTC that was found (for `cuda_fp8.h`, `cuda_bf16.h`),
/// or from `$MEGAMOE_CUDA_HOME`, `/usr/local/cuda` or the project-local toolchain. Kernels of
/// this crate need none: it is passed to NVRTC with `-I` when present.
pub fn cuda_include_dir() -> Option<PathBuf> {
    let has_headers = |d: &Path| d.join("cuda_fp8.h").is_file();
    let beside_nvrtc = nvrtc().ok().and_then(|l| {
        let p = Path::new(&l.path);
        // A bare soname has no folder: nothing beside it to find.
        p.parent()
            .and_then(Path::parent)
            .map(|root| root.join("include"))
    });
    let mut dirs: Vec<PathBuf> = beside_nvrtc.into_iter().collect();
    if let Some(home) = env_path("MEGAMOE_CUDA_HOME") {
        dirs.push(home.join("include"));
    }
    dirs.push(PathBuf::from("/usr/local/cuda/include"));
    dirs.extend(toolchain_roots().into_iter().map(|r| r.join("include")));
    dirs.into_iter().find(|d| has_headers(d))
}

/// Versions of the libraries found, for `megamoe info`.
#[derive(Debug, Clone)]
pub struct Versions {
    /// `Ok((driver API version, path))` e.g. 13000.
    pub driver: std::result::Result<(i32, String), String>,
    /// `Ok(((major, minor), path))`.
    pub nvrtc: std::result::Result<((i32, i32), String), String>,
    /// `Ok((version code, path))`, e.g. 22803 for 2.28.3.
    pub nccl: std::result::Result<(i32, String), String>,
}

/// Probes all three libraries and asks each for its version. Never fails: a missing library is
/// reported in its field.
pub fn versions() -> Versions {
    // Both version calls write one int and need no initialisation.
    type VersionFn = unsafe extern "C" fn(*mut i32) -> i32;
    let ask = |lib: Result<&'static Loaded>, name: &'static str, symbol: &'static str| {
        let lib = lib.map_err(|e| e.to_string())?;
        let f: VersionFn = unsafe { lib.symbol(name, symbol) }.map_err(|e| e.to_string())?;
        let mut v = 0;
        // SAFETY: see `VersionFn`.
        match unsafe { f(&mut v) } {
            0 => Ok((v, lib.path.clone())),
            status => Err(format!("{symbol} returned status {status}")),
        }
    };
    Versions {
        driver: ask(libcuda(), "libcuda", "cuDriverGetVersion"),
        nvrtc: crate::nvrtc::version()
            .and_then(|v| Ok((v, nvrtc()?.path.clone())))
            .map_err(|e| e.to_string()),
        nccl: ask(nccl(), "libnccl", "ncclGetVersion"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_error_names_library_and_places() {
        let e = found(
            Box::leak(Box::new(Err("/a/libx.so, libx.so".to_string()))),
            "libx",
            "Install x.",
        )
        .unwrap_err();
        let text = e.to_string();
        assert!(text.contains("libx not found"), "{text}");
        assert!(text.contains("/a/libx.so, libx.so"), "{text}");
        assert!(text.contains("Install x."), "{text}");
    }

    #[test]
    fn nvrtc_search_honours_env_before_system() {
        let c = nvrtc_candidates();
        let sys = c.iter().position(|s| s == "libnvrtc.so.13").unwrap();
        let local = c
            .iter()
            .position(|s| s.contains("/usr/local/cuda/lib64"))
            .unwrap();
        assert!(sys < local);
    }
}
