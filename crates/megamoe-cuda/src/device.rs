//! GPUs, device buffers, module loading, launches and event timing.
//!
//! A [`Gpu`] is one device's primary context plus one stream of its own; every operation of a
//! `Gpu` (copies, memsets, launches, events) is ordered on that stream. Several `Gpu` handles may
//! share a device (see [`Gpu::with_new_stream`]): that is how virtual ranks share a GPU.
//! Memory comes from `cuMemAlloc`, never from a stream-ordered pool, so peers can access it once
//! [`Gpu::enable_peer_access`] has run.

use crate::error::{check, Error, Result};
use crate::jit::CompiledKernel;
use crate::probe;
use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Plain data that may be copied byte for byte to and from the device and passed as kernel
/// parameters.
///
/// # Safety
/// The type must be `#[repr(C)]` (or a primitive), contain no pointers the device cannot use,
/// no padding that matters, and be valid for every bit pattern the device writes.
pub unsafe trait Pod: Copy + Send + Sync + 'static {}

macro_rules! pod {
    ($($t:ty),*) => { $(unsafe impl Pod for $t {})* };
}
pod!(
    u8,
    i8,
    u16,
    i16,
    u32,
    i32,
    u64,
    i64,
    f32,
    f64,
    half::bf16,
    half::f16
);
unsafe impl<T: Pod, const N: usize> Pod for [T; N] {}

/// Static properties of a device, read once.
#[derive(Debug, Clone)]
pub struct GpuProps {
    pub name: String,
    pub compute_capability: (i32, i32),
    pub sm_count: u32,
    /// Largest dynamic shared memory a block may opt into, in bytes.
    pub max_shared_per_block: u32,
    pub l2_bytes: u32,
    pub total_memory: usize,
    /// PCI bus id, for matching with `nvidia-smi`.
    pub pci_bus: i32,
}

/// One device's primary context and a stream of its own (a clone shares both).
#[derive(Clone)]
pub struct Gpu {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    props: GpuProps,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gpu({}: {})", self.ordinal, self.props.name)
    }
}

/// The number of visible CUDA devices. Errors if libcuda is missing; 0 is a valid answer.
pub fn device_count() -> Result<usize> {
    probe::libcuda()?;
    // SAFETY: libcuda is loaded; cuInit has no preconditions.
    check("cuInit", unsafe { sys::cuInit(0) })?;
    Ok(CudaContext::device_count()? as usize)
}

impl Gpu {
    /// Opens device `ordinal` with a new non-blocking stream.
    pub fn new(ordinal: usize) -> Result<Gpu> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(if count == 0 {
                Error::NoGpu
            } else {
                Error::Invalid {
                    arg: "ordinal",
                    reason: format!("device {ordinal} does not exist ({count} visible)"),
                }
            });
        }
        let ctx = CudaContext::new(ordinal)?;
        let attr = |a| ctx.attribute(a).map(|v| v as u32);
        use sys::CUdevice_attribute as A;
        let props = GpuProps {
            name: ctx.name()?,
            compute_capability: ctx.compute_capability()?,
            sm_count: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            max_shared_per_block: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
            l2_bytes: attr(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?,
            total_memory: ctx.total_mem()?,
            pci_bus: attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)? as i32,
        };
        let stream = ctx.new_stream()?;
        Ok(Gpu {
            ordinal,
            ctx,
            stream,
            props,
        })
    }

    /// Every visible device; [`Error::NoGpu`] when there is none.
    pub fn all() -> Result<Vec<Gpu>> {
        match device_count()? {
            0 => Err(Error::NoGpu),
            n => (0..n).map(Gpu::new).collect(),
        }
    }

    /// Another handle on the same device and context with a stream of its own.
    pub fn with_new_stream(&self) -> Result<Gpu> {
        Ok(Gpu {
            ordinal: self.ordinal,
            ctx: self.ctx.clone(),
            stream: self.ctx.new_stream()?,
            props: self.props.clone(),
        })
    }

    /// A handle on the same device and context whose stream is `stream`, one another runtime owns
    /// (a framework's current stream): work queued through it runs in that stream's order with
    /// no event, and a CUDA graph capturing the stream records it. Dropping the handle leaves the
    /// stream alive.
    ///
    /// # Safety
    /// `stream` must be a live stream of this device's primary context (or 0, the legacy default
    /// stream), and stay alive while the handle is used.
    pub unsafe fn on_stream(&self, stream: u64) -> Gpu {
        Gpu {
            ordinal: self.ordinal,
            ctx: self.ctx.clone(),
            // SAFETY: the caller's contract.
            stream: unsafe { self.ctx.wrap_borrowed_stream(stream as sys::CUstream) },
            props: self.props.clone(),
        }
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    pub fn props(&self) -> &GpuProps {
        &self.props
    }

    /// Free device memory in bytes, now (`cuMemGetInfo`): what a soak watches for leaks.
    pub fn free_memory(&self) -> Result<usize> {
        Ok(self.ctx.mem_get_info()?.0)
    }

    /// The raw stream, for interop.
    pub fn cu_stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    /// Makes this device's context current on the calling thread (every method does this).
    pub fn bind(&self) -> Result<()> {
        Ok(self.ctx.bind_to_thread()?)
    }

    /// Waits for everything queued on this handle's stream.
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        Ok(self.stream.synchronize()?)
    }

    /// Waits for everything queued on any stream of this device's context (a framework's too).
    pub fn synchronize_device(&self) -> Result<()> {
        Ok(self.ctx.synchronize()?)
    }

    /// `bytes` of device memory from `cuMemAlloc` (peer-accessible), contents undefined.
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        self.bind()?;
        let mut ptr = 0;
        // SAFETY: the context is current; a zero-byte request is rounded up to one byte.
        check("cuMemAlloc", unsafe {
            sys::cuMemAlloc_v2(&mut ptr, bytes.max(1))
        })?;
        Ok(DeviceBuffer {
            ptr,
            bytes,
            ctx: self.ctx.clone(),
            stream: self.stream.clone(),
        })
    }

    /// A buffer holding a copy of `data`.
    pub fn alloc_from<T: Pod>(&self, data: &[T]) -> Result<DeviceBuffer> {
        let buf = self.alloc(std::mem::size_of_val(data))?;
        buf.upload(data)?;
        Ok(buf)
    }

    /// A buffer of `bytes` zero bytes.
    pub fn alloc_zeroed(&self, bytes: usize) -> Result<DeviceBuffer> {
        let buf = self.alloc(bytes)?;
        buf.memset(0)?;
        Ok(buf)
    }

    /// Whether this device can map `peer`'s memory.
    pub fn can_access_peer(&self, peer: &Gpu) -> Result<bool> {
        if peer.ordinal == self.ordinal {
            return Ok(true);
        }
        let mut can = 0;
        // SAFETY: both handles are valid devices.
        check("cuDeviceCanAccessPeer", unsafe {
            sys::cuDeviceCanAccessPeer(&mut can, self.ctx.cu_device(), peer.ctx.cu_device())
        })?;
        Ok(can != 0)
    }

    /// Lets kernels on this device read and write `peer`'s `cuMemAlloc` memory. Idempotent.
    pub fn enable_peer_access(&self, peer: &Gpu) -> Result<()> {
        if peer.ordinal == self.ordinal {
            return Ok(());
        }
        if !self.can_access_peer(peer)? {
            return Err(Error::Invalid {
                arg: "peer",
                reason: format!("GPU {} cannot access GPU {}", self.ordinal, peer.ordinal),
            });
        }
        self.bind()?;
        // SAFETY: the context is current; the peer context is live.
        let status = unsafe { sys::cuCtxEnablePeerAccess(peer.ctx.cu_ctx(), 0) };
        if status == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        check("cuCtxEnablePeerAccess", status)
    }

    /// Copies `bytes` from `src` to `dst` with the copy engine, ordered on this stream. The
    /// buffers may live on different devices (unified addressing).
    pub fn copy(&self, dst: &DeviceBuffer, src: &DeviceBuffer, bytes: usize) -> Result<()> {
        if bytes > dst.bytes || bytes > src.bytes {
            return Err(Error::Invalid {
                arg: "bytes",
                reason: format!("{bytes} exceeds dst {} or src {}", dst.bytes, src.bytes),
            });
        }
        self.bind()?;
        // SAFETY: both ranges lie inside live allocations.
        check("cuMemcpyDtoDAsync", unsafe {
            sys::cuMemcpyDtoDAsync_v2(dst.ptr, src.ptr, bytes, self.cu_stream())
        })
    }

    /// Loads a compiled kernel into this device's context.
    pub fn load(&self, kernel: &CompiledKernel) -> Result<Kernel> {
        self.bind()?;
        let module = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(kernel.cubin.clone()))?;
        let function = module.load_function(&kernel.entry)?;
        Ok(Kernel {
            name: kernel.name.clone(),
            function,
            ctx: self.ctx.cu_ctx() as usize,
            dynamic_smem_limit: AtomicU32::new(48 * 1024),
        })
    }

    /// Launches `kernel` with one parameter struct passed by value (the kernel's single
    /// `const __grid_constant__ Params p`), through `cuLaunchKernelEx`.
    pub fn launch<P: Pod>(&self, kernel: &Kernel, config: &LaunchConfig, params: &P) -> Result<()> {
        if kernel.ctx != self.ctx.cu_ctx() as usize {
            return Err(Error::Invalid {
                arg: "kernel",
                reason: format!("`{}` was loaded on another device", kernel.name),
            });
        }
        config.validate(&self.props)?;
        self.bind()?;
        let f = kernel.function.cu_function();
        self.raise_smem_limit(kernel, config)?;
        let mut attrs = launch_attributes(config);
        let cfg = self.cu_launch_config(config, &mut attrs);
        let mut arg = params as *const P as *mut std::ffi::c_void;
        // SAFETY: the kernel takes exactly one parameter of type P (the caller's contract with
        // the device code, whose size is asserted on both sides); the driver copies it before
        // returning.
        check("cuLaunchKernelEx", unsafe {
            sys::cuLaunchKernelEx(&cfg, f, &mut arg, std::ptr::null_mut())
        })
    }

    /// How many clusters of `config.cluster` (with its block and shared memory) can be resident
    /// at once: the grid size up to which a persistent clustered kernel runs all CTAs together.
    pub fn max_active_clusters(&self, kernel: &Kernel, config: &LaunchConfig) -> Result<u32> {
        config.validate(&self.props)?;
        self.bind()?;
        self.raise_smem_limit(kernel, config)?;
        let mut attrs = launch_attributes(config);
        let cfg = self.cu_launch_config(config, &mut attrs);
        let mut clusters = 0;
        // SAFETY: a valid function handle and launch configuration; writes one int.
        check("cuOccupancyMaxActiveClusters", unsafe {
            sys::cuOccupancyMaxActiveClusters(&mut clusters, kernel.function.cu_function(), &cfg)
        })?;
        Ok(clusters.max(0) as u32)
    }

    fn raise_smem_limit(&self, kernel: &Kernel, config: &LaunchConfig) -> Result<()> {
        let f = kernel.function.cu_function();
        if config.dynamic_smem > kernel.dynamic_smem_limit.load(Ordering::Relaxed) {
            // SAFETY: a valid function handle and an attribute value within the device limit.
            check("cuFuncSetAttribute", unsafe {
                sys::cuFuncSetAttribute(
                    f,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    config.dynamic_smem as i32,
                )
            })?;
            kernel
                .dynamic_smem_limit
                .fetch_max(config.dynamic_smem, Ordering::Relaxed);
        }
        Ok(())
    }

    fn cu_launch_config(
        &self,
        config: &LaunchConfig,
        attrs: &mut [sys::CUlaunchAttribute],
    ) -> sys::CUlaunchConfig {
        sys::CUlaunchConfig {
            gridDimX: config.grid.0,
            gridDimY: config.grid.1,
            gridDimZ: config.grid.2,
            blockDimX: config.block.0,
            blockDimY: config.block.1,
            blockDimZ: config.block.2,
            sharedMemBytes: config.dynamic_smem,
            hStream: self.cu_stream(),
            attrs: attrs.as_mut_ptr(),
            numAttrs: attrs.len() as u32,
        }
    }

    /// Starts recording this stream's work into a graph instead of running it.
    pub fn begin_capture(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: the stream belongs to the bound context.
        check("cuStreamBeginCapture", unsafe {
            sys::cuStreamBeginCapture_v2(
                self.cu_stream(),
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
        })
    }

    /// Ends the capture begun by [`Gpu::begin_capture`] and instantiates what was recorded.
    pub fn end_capture(&self) -> Result<Graph> {
        self.bind()?;
        let mut graph = std::ptr::null_mut();
        // SAFETY: the stream is capturing on the bound context.
        check("cuStreamEndCapture", unsafe {
            sys::cuStreamEndCapture(self.cu_stream(), &mut graph)
        })?;
        let mut exec = std::ptr::null_mut();
        // SAFETY: a complete graph of this context; it is destroyed once instantiated.
        let instantiated = check("cuGraphInstantiate", unsafe {
            sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0)
        });
        // SAFETY: the graph is not used after this.
        unsafe { sys::cuGraphDestroy(graph) };
        instantiated?;
        Ok(Graph {
            exec,
            ctx: self.ctx.clone(),
        })
    }

    /// Launches a captured graph on this stream.
    pub fn launch_graph(&self, graph: &Graph) -> Result<()> {
        self.bind()?;
        // SAFETY: graph and stream belong to the bound context.
        check("cuGraphLaunch", unsafe {
            sys::cuGraphLaunch(graph.exec, self.cu_stream())
        })
    }

    /// Two timing events (`CU_EVENT_DEFAULT`) on this stream.
    pub fn timer(&self) -> Result<Timer> {
        self.bind()?;
        let event = || {
            self.ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        };
        Ok(Timer {
            start: event()?,
            stop: event()?,
            stream: self.stream.clone(),
        })
    }
}

/// The cluster and PDL attributes of `config`, for `cuLaunchKernelEx` and occupancy queries.
fn launch_attributes(config: &LaunchConfig) -> Vec<sys::CUlaunchAttribute> {
    let mut attrs = Vec::new();
    if let Some((x, y, z)) = config.cluster {
        // SAFETY: writing one union field of a zeroed attribute.
        let mut a: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        a.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        a.value.clusterDim.x = x;
        a.value.clusterDim.y = y;
        a.value.clusterDim.z = z;
        attrs.push(a);
    }
    if config.pdl {
        // SAFETY: as above.
        let mut a: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        a.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        a.value.programmaticStreamSerializationAllowed = 1;
        attrs.push(a);
    }
    attrs
}

/// Device memory from `cuMemAlloc`, freed on drop. Copies and memsets are ordered on the stream
/// of the [`Gpu`] that allocated it and wait for completion.
pub struct DeviceBuffer {
    ptr: u64,
    bytes: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({:#x}, {} B)", self.ptr, self.bytes)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // Errors cannot be returned from drop; a failed free leaks, it does not corrupt.
        if self.ctx.bind_to_thread().is_ok() {
            let _ = self.stream.synchronize();
            // SAFETY: the pointer came from cuMemAlloc and is freed once.
            let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
        }
    }
}

impl DeviceBuffer {
    /// The device address, as kernels take it in their params.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    fn fits(&self, arg: &'static str, offset: usize, bytes: usize) -> Result<()> {
        if offset
            .checked_add(bytes)
            .is_some_and(|end| end <= self.bytes)
        {
            Ok(())
        } else {
            Err(Error::Invalid {
                arg,
                reason: format!(
                    "{bytes} bytes at offset {offset} exceed the buffer of {} bytes",
                    self.bytes
                ),
            })
        }
    }

    /// The device address of byte `offset`, checked to have `bytes` bytes of the buffer from
    /// there: a range to copy to or from foreign memory with [`Gpu::copy_raw`] on the `Gpu`
    /// that allocated the buffer, whose stream orders the buffer's own copies too.
    pub fn ptr_at(&self, offset: usize, bytes: usize) -> Result<u64> {
        self.fits("bytes", offset, bytes)?;
        Ok(self.ptr + offset as u64)
    }

    /// Copies `data` to the start of the buffer.
    pub fn upload<T: Pod>(&self, data: &[T]) -> Result<()> {
        self.upload_at(0, data)
    }

    /// Copies `data` to byte `offset` of the buffer.
    pub fn upload_at<T: Pod>(&self, offset: usize, data: &[T]) -> Result<()> {
        let bytes = std::mem::size_of_val(data);
        self.fits("data", offset, bytes)?;
        self.ctx.bind_to_thread()?;
        // SAFETY: the range lies inside the allocation; the host slice outlives the copy, which
        // completes before return (stream synchronize).
        check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                self.ptr + offset as u64,
                data.as_ptr().cast(),
                bytes,
                self.stream.cu_stream(),
            )
        })?;
        Ok(self.stream.synchronize()?)
    }

    /// The whole buffer as `T`s (its size must be a multiple of `size_of::<T>()`).
    pub fn download<T: Pod + Default>(&self) -> Result<Vec<T>> {
        let size = std::mem::size_of::<T>();
        if self.bytes % size != 0 {
            return Err(Error::Invalid {
                arg: "T",
                reason: format!(
                    "{} bytes is not a whole number of {size}-byte items",
                    self.bytes
                ),
            });
        }
        let mut out = vec![T::default(); self.bytes / size];
        self.download_into(0, &mut out)?;
        Ok(out)
    }

    /// Fills `out` from byte `offset` of the buffer.
    pub fn download_into<T: Pod>(&self, offset: usize, out: &mut [T]) -> Result<()> {
        let bytes = std::mem::size_of_val(out);
        self.fits("out", offset, bytes)?;
        self.ctx.bind_to_thread()?;
        // SAFETY: the range lies inside the allocation; `out` is written only by this copy,
        // which completes before return. Every bit pattern is a valid T (Pod).
        check("cuMemcpyDtoHAsync", unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                out.as_mut_ptr().cast(),
                self.ptr + offset as u64,
                bytes,
                self.stream.cu_stream(),
            )
        })?;
        Ok(self.stream.synchronize()?)
    }

    /// Sets every byte to `value` (ordered on the stream, waits for completion).
    pub fn memset(&self, value: u8) -> Result<()> {
        self.fill(0, self.bytes, value)
    }

    /// Sets `bytes` bytes from byte `offset` to `value` (ordered on the stream, waits).
    pub fn fill(&self, offset: usize, bytes: usize, value: u8) -> Result<()> {
        self.fits("bytes", offset, bytes)?;
        self.ctx.bind_to_thread()?;
        // SAFETY: the range lies inside the allocation.
        check("cuMemsetD8Async", unsafe {
            sys::cuMemsetD8Async(
                self.ptr + offset as u64,
                value,
                bytes,
                self.stream.cu_stream(),
            )
        })?;
        Ok(self.stream.synchronize()?)
    }
}

/// A kernel loaded into one device's context.
pub struct Kernel {
    name: String,
    function: CudaFunction,
    ctx: usize,
    /// The dynamic shared memory the function is currently allowed (raised on demand).
    dynamic_smem_limit: AtomicU32,
}

impl Kernel {
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Grid, block, dynamic shared memory and the launch attributes of one launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    /// Bytes; above 48 KB the function's limit is raised automatically.
    pub dynamic_smem: u32,
    /// Thread-block cluster dimensions; the grid must be a multiple of them.
    pub cluster: Option<(u32, u32, u32)>,
    /// Programmatic dependent launch: may start before the previous kernel on the stream ends
    /// (the kernel must `griddepcontrol.wait` before reading its output).
    pub pdl: bool,
}

impl LaunchConfig {
    /// A one-dimensional grid of `grid` blocks of `block` threads.
    pub fn new(grid: u32, block: u32) -> Self {
        Self {
            grid: (grid, 1, 1),
            block: (block, 1, 1),
            dynamic_smem: 0,
            cluster: None,
            pdl: false,
        }
    }

    pub fn with_dynamic_smem(self, bytes: u32) -> Self {
        Self {
            dynamic_smem: bytes,
            ..self
        }
    }

    pub fn with_cluster(self, x: u32, y: u32, z: u32) -> Self {
        Self {
            cluster: Some((x, y, z)),
            ..self
        }
    }

    pub fn with_pdl(self, pdl: bool) -> Self {
        Self { pdl, ..self }
    }

    /// Checks the configuration against the device before launching.
    pub fn validate(&self, props: &GpuProps) -> Result<()> {
        let invalid = |arg, reason: String| Err(Error::Invalid { arg, reason });
        let (g, b) = (self.grid, self.block);
        if g.0 == 0 || g.1 == 0 || g.2 == 0 {
            return invalid("grid", format!("{g:?} has a zero dimension"));
        }
        let threads = b.0 as u64 * b.1 as u64 * b.2 as u64;
        if threads == 0 || threads > 1024 {
            return invalid("block", format!("{b:?} is {threads} threads (1..=1024)"));
        }
        if self.dynamic_smem > props.max_shared_per_block {
            return invalid(
                "dynamic_smem",
                format!(
                    "{} bytes exceed the device limit of {}",
                    self.dynamic_smem, props.max_shared_per_block
                ),
            );
        }
        if let Some(c) = self.cluster {
            let size = c.0 as u64 * c.1 as u64 * c.2 as u64;
            if size == 0
                || size > 16
                || g.0 % c.0.max(1) != 0
                || g.1 % c.1.max(1) != 0
                || g.2 % c.2.max(1) != 0
            {
                return invalid(
                    "cluster",
                    format!("{c:?} must be 1..=16 blocks and divide the grid {g:?}"),
                );
            }
        }
        Ok(())
    }
}

/// An instantiated CUDA graph ([`Gpu::end_capture`]), destroyed on drop.
pub struct Graph {
    exec: sys::CUgraphExec,
    ctx: Arc<CudaContext>,
}

// SAFETY: the handle is only used with its context bound on the calling thread.
unsafe impl Send for Graph {}
unsafe impl Sync for Graph {}

impl Drop for Graph {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: instantiated on this context, destroyed once.
            let _ = unsafe { sys::cuGraphExecDestroy(self.exec) };
        }
    }
}

/// A pair of timing events on one stream.
pub struct Timer {
    start: CudaEvent,
    stop: CudaEvent,
    stream: Arc<CudaStream>,
}

impl Timer {
    pub fn start(&self) -> Result<()> {
        Ok(self.start.record(&self.stream)?)
    }

    pub fn stop(&self) -> Result<()> {
        Ok(self.stop.record(&self.stream)?)
    }

    /// Milliseconds between `start` and `stop`; waits for `stop`.
    pub fn elapsed_ms(&self) -> Result<f32> {
        self.stop.synchronize()?;
        Ok(self.start.elapsed_ms(&self.stop)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h200() -> GpuProps {
        GpuProps {
            name: "H200".into(),
            compute_capability: (9, 0),
            sm_count: 132,
            max_shared_per_block: 232448,
            l2_bytes: 60 << 20,
            total_memory: 140 << 30,
            pci_bus: 0,
        }
    }

    #[test]
    fn launch_config_validation_names_the_argument() {
        let p = h200();
        assert!(LaunchConfig::new(132, 256).validate(&p).is_ok());
        let arg = |c: LaunchConfig| match c.validate(&p) {
            Err(Error::Invalid { arg, .. }) => arg,
            other => panic!("{other:?}"),
        };
        assert_eq!(arg(LaunchConfig::new(0, 256)), "grid");
        assert_eq!(arg(LaunchConfig::new(1, 2048)), "block");
        assert_eq!(
            arg(LaunchConfig::new(1, 128).with_dynamic_smem(300_000)),
            "dynamic_smem"
        );
        assert_eq!(
            arg(LaunchConfig::new(3, 128).with_cluster(2, 1, 1)),
            "cluster"
        );
        assert!(LaunchConfig::new(4, 128)
            .with_cluster(2, 1, 1)
            .with_dynamic_smem(200_000)
            .with_pdl(true)
            .validate(&p)
            .is_ok());
    }
}
