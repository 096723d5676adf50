//! The CUDA this crate needs, kept minimal: one context and stream per rank, peer access between
//! GPUs, raw `cuMemAlloc` buffers (peers can read them under unified addressing once peer access
//! is on; pool allocations would not be), the NVRTC build of `kernels/` to an sm_90a CUBIN, and
//! launches with one parameter struct.

use std::ffi::{c_void, CString};
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext};
use cudarc::nvrtc::sys as nvrtc;

use crate::error::EpError;

fn cuda<T>(what: &str, r: Result<T, result::DriverError>) -> Result<T, EpError> {
    r.map_err(|e| EpError::Cuda(format!("{what}: {e:?}")))
}

/// GPUs visible here; an error (not a panic) when the driver library is absent. The runtime
/// crate's probe finds and keeps the library loaded; cudarc then gets the same object by soname.
pub fn gpu_count() -> Result<usize, EpError> {
    megamoe_cuda::probe::libcuda().map_err(|e| EpError::NoGpu(e.to_string()))?;
    cuda("cuInit", result::init())?;
    Ok(cuda("cuDeviceGetCount", result::device::get_count())? as usize)
}

const HEADERS: [(&str, &str); 6] = [
    ("params.cuh", include_str!("../kernels/params.cuh")),
    ("ptx/ld_st.cuh", include_str!("../kernels/ptx/ld_st.cuh")),
    ("comm/sync.cuh", include_str!("../kernels/comm/sync.cuh")),
    (
        "impls/dispatch.cuh",
        include_str!("../kernels/impls/dispatch.cuh"),
    ),
    (
        "impls/combine.cuh",
        include_str!("../kernels/impls/combine.cuh"),
    ),
    (
        "impls/gather.cuh",
        include_str!("../kernels/impls/gather.cuh"),
    ),
];
const TRANSLATION_UNIT: &str = include_str!("../kernels/ep.cu");

/// The kernels' CUBIN and the compiler's log (registers and spills from ptxas).
pub struct Cubin {
    pub image: Vec<u8>,
    pub log: String,
}

/// Compiles kernels/ep.cu for sm_90a with NVRTC, once per process.
pub fn compile() -> Result<&'static Cubin, EpError> {
    static CUBIN: std::sync::OnceLock<Cubin> = std::sync::OnceLock::new();
    if let Some(c) = CUBIN.get() {
        return Ok(c);
    }
    let c = compile_uncached()?;
    Ok(CUBIN.get_or_init(|| c))
}

fn compile_uncached() -> Result<Cubin, EpError> {
    megamoe_cuda::probe::nvrtc().map_err(|e| EpError::NoGpu(e.to_string()))?;
    let cstr = |s: &str| CString::new(s).expect("no NUL in kernel sources");
    let src = cstr(TRANSLATION_UNIT);
    // The headers are looked up relative to the including file's folder as well as by the names
    // given here, so both spellings (`impls/x.cuh` from ep.cu, `../params.cuh` from impls/) work.
    let mut names = Vec::new();
    let mut bodies = Vec::new();
    for (name, body) in HEADERS {
        for alias in [name.to_string(), format!("../{name}")] {
            names.push(cstr(&alias));
            bodies.push(cstr(body));
        }
    }
    let name_ptrs: Vec<_> = names.iter().map(|c| c.as_ptr()).collect();
    let body_ptrs: Vec<_> = bodies.iter().map(|c| c.as_ptr()).collect();
    let opts: Vec<CString> = [
        "--gpu-architecture=sm_90a",
        "-std=c++17",
        "--ptxas-options=-v",
        "-lineinfo",
    ]
    .iter()
    .map(|o| cstr(o))
    .collect();
    let opt_ptrs: Vec<_> = opts.iter().map(|c| c.as_ptr()).collect();
    let nv = |what: &str, r: nvrtc::nvrtcResult| {
        if r == nvrtc::nvrtcResult::NVRTC_SUCCESS {
            Ok(())
        } else {
            Err(EpError::Cuda(format!("{what}: {r:?}")))
        }
    };
    // SAFETY: every pointer handed to NVRTC outlives the program, which is destroyed below.
    unsafe {
        let mut prog = std::ptr::null_mut();
        nv(
            "nvrtcCreateProgram",
            nvrtc::nvrtcCreateProgram(
                &mut prog,
                src.as_ptr(),
                c"ep.cu".as_ptr(),
                names.len() as i32,
                body_ptrs.as_ptr(),
                name_ptrs.as_ptr(),
            ),
        )?;
        let compiled = nvrtc::nvrtcCompileProgram(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr());
        let mut n = 0usize;
        nvrtc::nvrtcGetProgramLogSize(prog, &mut n);
        let mut log = vec![0u8; n];
        nvrtc::nvrtcGetProgramLog(prog, log.as_mut_ptr().cast());
        let log = String::from_utf8_lossy(&log)
            .trim_end_matches('\0')
            .to_string();
        if compiled != nvrtc::nvrtcResult::NVRTC_SUCCESS {
            nvrtc::nvrtcDestroyProgram(&mut prog);
            return Err(EpError::Cuda(format!(
                "NVRTC failed to compile kernels/ep.cu:\n{log}"
            )));
        }
        let mut size = 0usize;
        nv(
            "nvrtcGetCUBINSize",
            nvrtc::nvrtcGetCUBINSize(prog, &mut size),
        )?;
        let mut image = vec![0u8; size];
        nv(
            "nvrtcGetCUBIN",
            nvrtc::nvrtcGetCUBIN(prog, image.as_mut_ptr().cast()),
        )?;
        nvrtc::nvrtcDestroyProgram(&mut prog);
        Ok(Cubin { image, log })
    }
}

/// One GPU: its context, the loaded kernels.
pub struct Gpu {
    pub ordinal: usize,
    pub ctx: Arc<CudaContext>,
    module: sys::CUmodule,
    pub dispatch: sys::CUfunction,
    pub combine: sys::CUfunction,
    pub gather: sys::CUfunction,
    pub multiprocessors: usize,
}

// SAFETY: the raw handles are only used with the context bound on the calling thread.
unsafe impl Send for Gpu {}
unsafe impl Sync for Gpu {}

impl Gpu {
    pub fn new(ordinal: usize, cubin: &Cubin) -> Result<Self, EpError> {
        let ctx = cuda("cuCtx", CudaContext::new(ordinal))?;
        let multiprocessors = cuda(
            "multiprocessors",
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        )? as usize;
        // SAFETY: the image is a complete CUBIN; the context is current.
        unsafe {
            let module = cuda(
                "cuModuleLoadData",
                result::module::load_data(cubin.image.as_ptr().cast()),
            )?;
            let dispatch = cuda(
                "ep_dispatch",
                result::module::get_function(module, CString::new("ep_dispatch").unwrap()),
            )?;
            let combine = cuda(
                "ep_combine",
                result::module::get_function(module, CString::new("ep_combine").unwrap()),
            )?;
            let gather = cuda(
                "ep_gather",
                result::module::get_function(module, CString::new("ep_gather").unwrap()),
            )?;
            Ok(Gpu {
                ordinal,
                ctx,
                module,
                dispatch,
                combine,
                gather,
                multiprocessors,
            })
        }
    }

    pub fn bind(&self) -> Result<(), EpError> {
        cuda("bind context", self.ctx.bind_to_thread())
    }

    /// Lets this GPU's kernels read and write `other`'s memory.
    pub fn enable_peer_access(&self, other: &Gpu) -> Result<(), EpError> {
        self.bind()?;
        let mut can = 0;
        // SAFETY: plain queries and a context-level switch on the current context.
        unsafe {
            sys::cuDeviceCanAccessPeer(&mut can, self.ctx.cu_device(), other.ctx.cu_device());
            if can == 0 {
                return Err(EpError::Cuda(format!(
                    "GPU {} cannot access GPU {} (no peer path)",
                    self.ordinal, other.ordinal
                )));
            }
            let r = sys::cuCtxEnablePeerAccess(other.ctx.cu_ctx(), 0);
            if r != sys::CUresult::CUDA_SUCCESS
                && r != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
            {
                return Err(EpError::Cuda(format!(
                    "cuCtxEnablePeerAccess {}→{}: {r:?}",
                    self.ordinal, other.ordinal
                )));
            }
        }
        Ok(())
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        if self.bind().is_ok() {
            // SAFETY: nothing launched from the module outlives the GPU object.
            unsafe {
                let _ = result::module::unload(self.module);
            }
        }
    }
}

/// A `cuMemAlloc` allocation, freed on drop.
pub struct DevBuf {
    pub ptr: u64,
    pub bytes: usize,
    ctx: Arc<CudaContext>,
}

unsafe impl Send for DevBuf {}
unsafe impl Sync for DevBuf {}

impl DevBuf {
    pub fn new(gpu: &Gpu, bytes: usize) -> Result<Self, EpError> {
        gpu.bind()?;
        // SAFETY: a plain allocation on the current context.
        let ptr = cuda("cuMemAlloc", unsafe { result::malloc_sync(bytes.max(1)) })?;
        Ok(DevBuf {
            ptr,
            bytes,
            ctx: gpu.ctx.clone(),
        })
    }

    pub fn upload<T: Copy>(&self, offset: usize, data: &[T]) -> Result<(), EpError> {
        assert!(
            offset + std::mem::size_of_val(data) <= self.bytes,
            "upload past the end"
        );
        cuda("bind", self.ctx.bind_to_thread())?;
        // SAFETY: the range is inside the allocation (asserted).
        cuda("cuMemcpyHtoD", unsafe {
            result::memcpy_htod_sync(self.ptr + offset as u64, data)
        })
    }

    pub fn download<T: Copy + Default>(&self, offset: usize, n: usize) -> Result<Vec<T>, EpError> {
        assert!(
            offset + n * std::mem::size_of::<T>() <= self.bytes,
            "download past the end"
        );
        cuda("bind", self.ctx.bind_to_thread())?;
        let mut out = vec![T::default(); n];
        // SAFETY: the range is inside the allocation (asserted).
        cuda("cuMemcpyDtoH", unsafe {
            result::memcpy_dtoh_sync(&mut out, self.ptr + offset as u64)
        })?;
        Ok(out)
    }

    pub fn fill(&self, offset: usize, bytes: usize, value: u8) -> Result<(), EpError> {
        assert!(offset + bytes <= self.bytes, "fill past the end");
        cuda("bind", self.ctx.bind_to_thread())?;
        // SAFETY: the range is inside the allocation (asserted).
        cuda("cuMemsetD8", unsafe {
            result::memset_d8_sync(self.ptr + offset as u64, value, bytes)
        })
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: the allocation came from cuMemAlloc on this context.
            unsafe {
                let _ = result::free_sync(self.ptr);
            }
        }
    }
}

/// A non-blocking stream on one GPU.
pub struct Stream {
    pub raw: sys::CUstream,
    ctx: Arc<CudaContext>,
}

unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

impl Stream {
    pub fn new(gpu: &Gpu) -> Result<Self, EpError> {
        gpu.bind()?;
        let raw = cuda(
            "cuStreamCreate",
            result::stream::create(result::stream::StreamKind::NonBlocking),
        )?;
        Ok(Stream {
            raw,
            ctx: gpu.ctx.clone(),
        })
    }

    pub fn synchronize(&self) -> Result<(), EpError> {
        cuda("bind", self.ctx.bind_to_thread())?;
        // SAFETY: the stream belongs to the bound context.
        cuda("cuStreamSynchronize", unsafe {
            result::stream::synchronize(self.raw)
        })
    }

    /// Launches `f` with `grid` blocks of `threads` and one parameter struct.
    ///
    /// # Safety
    /// `f` is a kernel of this stream's context whose single parameter is a `P`, and every
    /// address inside `params` is valid for what the kernel does with it.
    pub unsafe fn launch<P: Copy>(
        &self,
        f: sys::CUfunction,
        grid: u32,
        threads: u32,
        params: &P,
    ) -> Result<(), EpError> {
        cuda("bind", self.ctx.bind_to_thread())?;
        let mut args = [params as *const P as *mut c_void];
        // SAFETY: see the function's contract; the driver copies the struct at launch.
        cuda("cuLaunchKernel", unsafe {
            result::launch_kernel(f, (grid, 1, 1), (threads, 1, 1), 0, self.raw, &mut args)
        })
    }

    pub fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<(), EpError> {
        cuda("bind", self.ctx.bind_to_thread())?;
        // SAFETY: the caller passes ranges inside live allocations.
        cuda("cuMemcpyDtoDAsync", unsafe {
            result::memcpy_dtod_async(dst, src, bytes, self.raw)
        })
    }

    pub fn begin_capture(&self) -> Result<(), EpError> {
        cuda("bind", self.ctx.bind_to_thread())?;
        // SAFETY: the stream belongs to the bound context.
        cuda("cuStreamBeginCapture", unsafe {
            result::stream::begin_capture(
                self.raw,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
        })
    }

    /// Ends the capture and instantiates what was recorded.
    pub fn end_capture(&self) -> Result<Graph, EpError> {
        cuda("bind", self.ctx.bind_to_thread())?;
        // SAFETY: the stream is capturing on the bound context; the graph is destroyed once
        // instantiated.
        unsafe {
            let graph = cuda("cuStreamEndCapture", result::stream::end_capture(self.raw))?;
            let exec = result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0));
            let _ = result::graph::destroy(graph);
            Ok(Graph {
                exec: cuda("cuGraphInstantiate", exec)?,
                ctx: self.ctx.clone(),
            })
        }
    }

    pub fn launch_graph(&self, graph: &Graph) -> Result<(), EpError> {
        cuda("bind", self.ctx.bind_to_thread())?;
        // SAFETY: graph and stream belong to the bound context.
        cuda("cuGraphLaunch", unsafe {
            result::graph::launch(graph.exec, self.raw)
        })
    }

    pub fn record(&self, event: &Event) -> Result<(), EpError> {
        cuda("bind", self.ctx.bind_to_thread())?;
        // SAFETY: event and stream belong to the bound context.
        cuda("cuEventRecord", unsafe {
            result::event::record(event.raw, self.raw)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: the stream was created on this context.
            unsafe {
                let _ = result::stream::destroy(self.raw);
            }
        }
    }
}

/// A timing event (CU_EVENT_DEFAULT: timing enabled).
pub struct Event {
    raw: sys::CUevent,
    ctx: Arc<CudaContext>,
}

unsafe impl Send for Event {}
unsafe impl Sync for Event {}

impl Event {
    pub fn new(gpu: &Gpu) -> Result<Self, EpError> {
        gpu.bind()?;
        let raw = cuda(
            "cuEventCreate",
            result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT),
        )?;
        Ok(Event {
            raw,
            ctx: gpu.ctx.clone(),
        })
    }

    /// Milliseconds from `self` to `end` (both recorded and complete).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32, EpError> {
        cuda("bind", self.ctx.bind_to_thread())?;
        // SAFETY: both events belong to the bound context.
        unsafe {
            cuda("cuEventSynchronize", result::event::synchronize(end.raw))?;
            cuda(
                "cuEventElapsedTime",
                result::event::elapsed(self.raw, end.raw),
            )
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: the event was created on this context.
            unsafe {
                let _ = result::event::destroy(self.raw);
            }
        }
    }
}

/// An instantiated CUDA graph.
pub struct Graph {
    exec: sys::CUgraphExec,
    ctx: Arc<CudaContext>,
}

unsafe impl Send for Graph {}
unsafe impl Sync for Graph {}

impl Drop for Graph {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: the executable graph was instantiated on this context.
            unsafe {
                let _ = result::graph::exec_destroy(self.exec);
            }
        }
    }
}
