//! A minimal NVRTC binding over the library that [`crate::probe::nvrtc`] found.
//!
//! Our own binding (ten functions) instead of cudarc's so that the library that was probed, by
//! path, is the one that compiles: cudarc would load whatever `libnvrtc.so` the loader finds.

use crate::error::{Error, Result};
use crate::probe;
use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::OnceLock;

type Program = *mut std::ffi::c_void;
type Status = c_int;

struct Api {
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> Status,
    error_string: unsafe extern "C" fn(Status) -> *const c_char,
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> Status,
    destroy: unsafe extern "C" fn(*mut Program) -> Status,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> Status,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    log: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    cubin_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    cubin: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    ptx_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    ptx: unsafe extern "C" fn(Program, *mut c_char) -> Status,
}

fn api() -> Result<&'static Api> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    let lib = probe::nvrtc()?;
    API.get_or_init(|| {
        // SAFETY: the types below are NVRTC's documented signatures.
        let load = || -> Result<Api> {
            unsafe {
                Ok(Api {
                    version: lib.symbol("libnvrtc", "nvrtcVersion")?,
                    error_string: lib.symbol("libnvrtc", "nvrtcGetErrorString")?,
                    create: lib.symbol("libnvrtc", "nvrtcCreateProgram")?,
                    destroy: lib.symbol("libnvrtc", "nvrtcDestroyProgram")?,
                    compile: lib.symbol("libnvrtc", "nvrtcCompileProgram")?,
                    log_size: lib.symbol("libnvrtc", "nvrtcGetProgramLogSize")?,
                    log: lib.symbol("libnvrtc", "nvrtcGetProgramLog")?,
                    cubin_size: lib.symbol("libnvrtc", "nvrtcGetCUBINSize")?,
                    cubin: lib.symbol("libnvrtc", "nvrtcGetCUBIN")?,
                    ptx_size: lib.symbol("libnvrtc", "nvrtcGetPTXSize")?,
                    ptx: lib.symbol("libnvrtc", "nvrtcGetPTX")?,
                })
            }
        };
        load().map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|message| Error::Nvrtc {
        call: "load",
        message: message.clone(),
    })
}

fn check(api: &Api, call: &'static str, status: Status) -> Result<()> {
    if status == 0 {
        return Ok(());
    }
    // SAFETY: nvrtcGetErrorString returns a static C string for any status.
    let message = unsafe { CStr::from_ptr((api.error_string)(status)) }
        .to_string_lossy()
        .into_owned();
    Err(Error::Nvrtc { call, message })
}

/// NVRTC's (major, minor) version.
pub fn version() -> Result<(i32, i32)> {
    let api = api()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two ints.
    check(api, "nvrtcVersion", unsafe {
        (api.version)(&mut major, &mut minor)
    })?;
    Ok((major, minor))
}

/// What one NVRTC compilation produced.
pub struct Output {
    pub cubin: Vec<u8>,
    /// The PTX, only when asked for (it costs a copy).
    pub ptx: Option<String>,
    /// The compiler log, including the ptxas `-v` report.
    pub log: String,
}

/// Compiles `source` with in-memory `headers` (include name, contents). A compile error is
/// [`Error::Compile`] carrying the log.
pub fn compile(
    kernel: &str,
    source: &str,
    headers: &[(&str, &str)],
    options: &[String],
    want_ptx: bool,
) -> Result<Output> {
    let api = api()?;
    let cstr = |s: &str, what: &'static str| {
        CString::new(s).map_err(|_| Error::Invalid {
            arg: what,
            reason: "contains a NUL byte".into(),
        })
    };
    let src = cstr(source, "source")?;
    let name = cstr(&format!("{kernel}.cu"), "kernel name")?;
    let header_names = headers
        .iter()
        .map(|(n, _)| cstr(n, "header name"))
        .collect::<Result<Vec<_>>>()?;
    let header_texts = headers
        .iter()
        .map(|(_, t)| cstr(t, "header text"))
        .collect::<Result<Vec<_>>>()?;
    let opts = options
        .iter()
        .map(|o| cstr(o, "option"))
        .collect::<Result<Vec<_>>>()?;
    let ptrs = |v: &[CString]| v.iter().map(|c| c.as_ptr()).collect::<Vec<_>>();
    let (name_ptrs, text_ptrs, opt_ptrs) = (ptrs(&header_names), ptrs(&header_texts), ptrs(&opts));

    let mut prog: Program = std::ptr::null_mut();
    // SAFETY: all pointers are valid C strings that outlive the call; counts match.
    check(api, "nvrtcCreateProgram", unsafe {
        (api.create)(
            &mut prog,
            src.as_ptr(),
            name.as_ptr(),
            headers.len() as c_int,
            text_ptrs.as_ptr(),
            name_ptrs.as_ptr(),
        )
    })?;
    struct Guard<'a>(&'a Api, Program);
    impl Drop for Guard<'_> {
        fn drop(&mut self) {
            // SAFETY: the program was created above and is destroyed once.
            unsafe { (self.0.destroy)(&mut self.1) };
        }
    }
    let guard = Guard(api, prog);

    // SAFETY: the program is live; the options outlive the call.
    let status = unsafe { (api.compile)(guard.1, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
    let log = read(api, guard.1, api.log_size, api.log, "nvrtcGetProgramLog")?;
    let log = String::from_utf8_lossy(&log)
        .trim_end_matches('\0')
        .to_string();
    if status != 0 {
        return Err(Error::Compile {
            kernel: kernel.to_string(),
            log,
        });
    }
    let cubin = read(api, guard.1, api.cubin_size, api.cubin, "nvrtcGetCUBIN")?;
    let ptx = if want_ptx {
        let p = read(api, guard.1, api.ptx_size, api.ptx, "nvrtcGetPTX")?;
        Some(
            String::from_utf8_lossy(&p)
                .trim_end_matches('\0')
                .to_string(),
        )
    } else {
        None
    };
    Ok(Output { cubin, ptx, log })
}

type SizeFn = unsafe extern "C" fn(Program, *mut usize) -> Status;
type ReadFn = unsafe extern "C" fn(Program, *mut c_char) -> Status;

fn read(
    api: &Api,
    prog: Program,
    size: SizeFn,
    get: ReadFn,
    call: &'static str,
) -> Result<Vec<u8>> {
    let mut n = 0usize;
    // SAFETY: the program is live; size writes one usize, get fills exactly n bytes.
    check(api, call, unsafe { size(prog, &mut n) })?;
    let mut buf = vec![0u8; n];
    check(api, call, unsafe { get(prog, buf.as_mut_ptr().cast()) })?;
    Ok(buf)
}
