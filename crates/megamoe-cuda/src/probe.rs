//! Library discovery: find libcuda, libnvrtc and libnccl before anything uses them.
//!
//! cudarc loads its libraries lazily and panics when one is missing, so every entry point of this
//! crate probes first and returns [`Error::LibraryNotFound`] naming the library and every place
//! it looked. A library found by path is kept loaded for the life of the process; the dynamic
//! loader then hands the same object to cudarc when cudarc asks for it by its soname.
//!
//! Search order, first hit wins (nothing depends on where the binary was built):
//! - NVRTC (CUDA 13, `libnvrtc.so.13`):
//!   1. `$MEGAMOE_NVRTC_LIB` (the library or its folder);
//!   2. `$MEGAMOE_CUDA_HOME/{lib64,lib}`;
//!   3. the system loader by soname: `LD_LIBRARY_PATH`, ld.so.cache, or a copy this process has
//!      already loaded (e.g. by PyTorch);
//!   4. NVIDIA's pip packages of the Python environment (the `nvidia` package folders the
//!      Python package reports through [`set_nvidia_package_roots`]): `nvidia/cu13/lib` (CUDA 13
//!      wheels such as PyTorch's cu130 dependencies), then `nvidia/cuda_nvrtc/lib`;
//!   5. a system toolkit: `/usr/local/cuda/lib64`, `/usr/local/cuda-13.0/lib64`,
//!      `/usr/local/cuda/targets/x86_64-linux/lib`;
//!   6. the project-local toolchain that `scripts/install-cuda-toolchain.sh` installs
//!      (`$MEGAMOE_TOOLCHAIN_DIR`, or a `.toolchain/` folder above the working directory or the
//!      executable).
//! - libcuda (the driver): `$MEGAMOE_LIBCUDA` (a file), the system loader path, the usual driver
//!   folders.
//! - libnccl: `$MEGAMOE_NCCL_LIB` (a file), the system loader path, `nvidia/nccl/lib` of the
//!   Python environment's NVIDIA packages, `/usr/lib/x86_64-linux-gnu`.
//!
//! The kernels include no CUDA header (their headers are compiled in), so none is needed at run
//! time; [`cuda_include_dir`] only adds one to NVRTC's include path when present.

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
        let path = mapped_path(c);
        Some(Loaded {
            _companions: companions(Path::new(&path)),
            path,
            lib,
        })
    })
}

/// The file the loader mapped for `name`, so that a library the system loader found by its
/// soname is reported by its path: the first file in `/proc/self/maps` whose name starts like
/// the soname's up to `.so` (`libcuda.so.1` is the file `libcuda.so.580.95.05`). `name` itself
/// when it is a path or the map does not say.
fn mapped_path(name: &str) -> String {
    let stem = match name.find(".so") {
        Some(i) if !name.contains('/') => &name[..i + 3],
        _ => return name.to_string(),
    };
    std::fs::read_to_string("/proc/self/maps")
        .ok()
        .and_then(|maps| {
            maps.lines()
                .filter_map(|line| line.split_whitespace().nth(5))
                .find(|p| {
                    Path::new(p)
                        .file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(stem))
                })
                .map(str::to_string)
        })
        .unwrap_or_else(|| name.to_string())
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

/// Folders named `.toolchain/nvidia/cu13` above the working directory and the executable, after
/// `$MEGAMOE_TOOLCHAIN_DIR`.
pub fn toolchain_roots() -> Vec<PathBuf> {
    let mut roots = Vec::new();
    if let Some(dir) = env_path("MEGAMOE_TOOLCHAIN_DIR") {
        roots.push(dir.join("nvidia/cu13"));
    }
    let starts = [std::env::current_dir().ok(), std::env::current_exe().ok()];
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

/// The `nvidia` package folders of a Python environment (where NVIDIA's pip packages put their
/// libraries), as the Python package reports them at import.
static NVIDIA_PACKAGE_ROOTS: OnceLock<Vec<PathBuf>> = OnceLock::new();

/// Adds the `nvidia` package folders of the Python environment to the search (step 4 of the
/// NVRTC order above, and NCCL's). Returns false, changing nothing, when they were set already
/// or a library was probed before: the search runs once per process.
pub fn set_nvidia_package_roots(roots: Vec<PathBuf>) -> bool {
    if NVRTC.get().is_some() || NCCL.get().is_some() {
        return false;
    }
    NVIDIA_PACKAGE_ROOTS.set(roots).is_ok()
}

fn nvidia_package_roots() -> &'static [PathBuf] {
    NVIDIA_PACKAGE_ROOTS.get().map_or(&[], Vec::as_slice)
}

/// `sub` (e.g. `cu13/lib`) under each `nvidia` package folder, in the order they were given.
fn package_dirs(roots: &[PathBuf], subs: &[&str]) -> Vec<PathBuf> {
    roots
        .iter()
        .flat_map(|root| subs.iter().map(move |sub| root.join(sub)))
        .collect()
}

fn nvrtc_candidates() -> Vec<String> {
    nvrtc_candidates_with(nvidia_package_roots())
}

fn nvrtc_candidates_with(package_roots: &[PathBuf]) -> Vec<String> {
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
    dirs = package_dirs(package_roots, &["cu13/lib", "cuda_nvrtc/lib"]);
    dirs.extend([
        PathBuf::from("/usr/local/cuda/lib64"),
        PathBuf::from("/usr/local/cuda-13.0/lib64"),
        PathBuf::from("/usr/local/cuda/targets/x86_64-linux/lib"),
    ]);
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
    for dir in package_dirs(nvidia_package_roots(), &["nccl/lib"]) {
        out.push(dir.join("libnccl.so.2").display().to_string());
    }
    out.push("/usr/lib/x86_64-linux-gnu/libnccl.so.2".into());
    out
}

type Probe = Result<Loaded, String>;

/// The outcome of the NVRTC and NCCL searches, once per process.
static NVRTC: OnceLock<Probe> = OnceLock::new();
static NCCL: OnceLock<Probe> = OnceLock::new();

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
    found(
        probe(&NVRTC, nvrtc_candidates),
        "libnvrtc (CUDA 13 NVRTC)",
        "Install a CUDA 13 toolkit, or the nvidia-cuda-nvrtc 13 pip package (PyPI; PyTorch's \
         CUDA 13 builds bring it) in the Python environment that imports megamoe, or set \
         MEGAMOE_CUDA_HOME to a CUDA toolkit folder or MEGAMOE_NVRTC_LIB to libnvrtc.so.13; \
         in the source tree, scripts/install-cuda-toolchain.sh installs it into .toolchain/.",
    )
}

/// NCCL, used only as an out-of-band channel; its absence is reported, never fatal here.
pub fn nccl() -> Result<&'static Loaded> {
    found(
        probe(&NCCL, nccl_candidates),
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
    fn python_packages_come_after_the_loader_and_before_the_system_toolkit() {
        let c = nvrtc_candidates_with(&[PathBuf::from("/venv/site-packages/nvidia")]);
        let at = |needle: &str| c.iter().position(|s| s == needle).unwrap();
        let loader = at("libnvrtc.so.13");
        let cu13 = at("/venv/site-packages/nvidia/cu13/lib/libnvrtc.so.13");
        let cu12_layout = at("/venv/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.13");
        let system = at("/usr/local/cuda/lib64/libnvrtc.so.13");
        assert!(
            loader < cu13 && cu13 < cu12_layout && cu12_layout < system,
            "{c:?}"
        );
    }

    #[test]
    fn a_library_the_loader_found_by_soname_is_reported_by_its_file() {
        // libc is mapped in every process.
        let libc = mapped_path("libc.so.6");
        assert!(libc.starts_with('/') && libc.contains("/libc.so"), "{libc}");
        assert_eq!(mapped_path("/a/libx.so.1"), "/a/libx.so.1");
        assert_eq!(mapped_path("libnot-loaded.so.9"), "libnot-loaded.so.9");
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
