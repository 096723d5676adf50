//! Working with memory and streams that another runtime owns (a framework's tensors and its
//! current stream), and with memory of other processes (CUDA IPC).
//!
//! Framework interop: a [`Gpu`]'s stream is ordered after a foreign stream and back with one
//! event each way ([`Gpu::wait_for`], [`Gpu::release_to`]), so the foreign stream sees the
//! calls as if they had been queued on it, while ranks sharing a GPU (virtual ranks) still run
//! concurrently on their own streams; raw device addresses are copied with [`Gpu::copy_raw`]
//! (a [`DeviceBuffer`]'s range by [`DeviceBuffer::ptr_at`]) and read to the host with
//! [`Gpu::read_address`].
//!
//! IPC: a [`DeviceBuffer`] (from `cuMemAlloc`; stream-ordered pool memory cannot be exported)
//! gives its [`IpcHandle`]; another process opens it with [`IpcMapping::open`].

use cudarc::driver::sys;

use crate::device::{DeviceBuffer, Gpu, Pod};
use crate::error::{check, Error, Result};

/// Bytes of a `CUipcMemHandle`.
pub const IPC_HANDLE_BYTES: usize = 64;

/// The exportable name of a `cuMemAlloc` allocation.
pub type IpcHandle = [u8; IPC_HANDLE_BYTES];

/// A one-shot event, destroyed on drop (the driver frees it once its waits are done).
struct Event(sys::CUevent);

impl Event {
    fn recorded_on(gpu: &Gpu, stream: sys::CUstream) -> Result<Event> {
        gpu.bind()?;
        let mut ev = std::ptr::null_mut();
        // SAFETY: the context is current; `stream` belongs to it (the callers' contract).
        unsafe {
            check(
                "cuEventCreate",
                sys::cuEventCreate(&mut ev, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32),
            )?;
            let event = Event(ev);
            check("cuEventRecord", sys::cuEventRecord(event.0, stream))?;
            Ok(event)
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created above, destroyed once; pending waits keep the driver's copy alive.
        let _ = unsafe { sys::cuEventDestroy_v2(self.0) };
    }
}

impl Gpu {
    /// The context's handle: the device's primary context, the one CUDA runtime users
    /// (PyTorch) share.
    pub fn context_handle(&self) -> Result<u64> {
        self.bind()?;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut ctx) })?;
        Ok(ctx as u64)
    }

    /// Work queued on this handle's stream from now on starts after everything queued so far on
    /// `stream` (a raw stream of this device's context, or 0 for its legacy default stream).
    pub fn wait_for(&self, stream: u64) -> Result<()> {
        let event = Event::recorded_on(self, stream as sys::CUstream)?;
        // SAFETY: both stream and event belong to the current context.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(self.cu_stream(), event.0, 0)
        })
    }

    /// Work queued on `stream` from now on starts after everything queued so far on this
    /// handle's stream.
    pub fn release_to(&self, stream: u64) -> Result<()> {
        let event = Event::recorded_on(self, self.cu_stream())?;
        // SAFETY: both stream and event belong to the current context.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(stream as sys::CUstream, event.0, 0)
        })
    }

    /// Copies `bytes` between device addresses, ordered on this handle's stream.
    ///
    /// # Safety
    /// Both ranges must be live device memory of this process (unified addressing), not freed
    /// before the copy has run.
    pub unsafe fn copy_raw(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        check("cuMemcpyDtoDAsync", unsafe {
            sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.cu_stream())
        })
    }

    /// Fills `out` from the device address `src` (memory of any device, unified addressing),
    /// ordered on this handle's stream; waits for the copy.
    ///
    /// # Safety
    /// `src` must address `size_of_val(out)` bytes of live device memory holding valid `T`s.
    pub unsafe fn read_address<T: Pod>(&self, src: u64, out: &mut [T]) -> Result<()> {
        let bytes = std::mem::size_of_val(out);
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the caller's contract on `src`; `out` is written only by this copy, which
        // completes before return.
        check("cuMemcpyDtoHAsync", unsafe {
            sys::cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), src, bytes, self.cu_stream())
        })?;
        self.synchronize()
    }

    /// Sets `bytes` bytes at device address `dst` to `value`, ordered on this handle's stream.
    ///
    /// # Safety
    /// As [`Gpu::copy_raw`].
    pub unsafe fn fill_raw(&self, dst: u64, bytes: usize, value: u8) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        check("cuMemsetD8Async", unsafe {
            sys::cuMemsetD8Async(dst, value, bytes, self.cu_stream())
        })
    }

    /// The PCI bus id of this device ("0000:1b:00.0"), which names it across processes.
    pub fn pci_bus_id(&self) -> Result<String> {
        self.bind()?;
        let mut dev = 0;
        let mut name = [0 as std::ffi::c_char; 32];
        // SAFETY: the context is current; the buffer holds the 13-character id and its NUL.
        unsafe {
            check("cuCtxGetDevice", sys::cuCtxGetDevice(&mut dev))?;
            check(
                "cuDeviceGetPCIBusId",
                sys::cuDeviceGetPCIBusId(name.as_mut_ptr(), name.len() as i32, dev),
            )?;
            Ok(std::ffi::CStr::from_ptr(name.as_ptr())
                .to_string_lossy()
                .into_owned())
        }
    }

    /// Whether this device can map memory of the device with PCI bus id `bus_id`.
    pub fn can_access_bus(&self, bus_id: &str) -> Result<bool> {
        if bus_id == self.pci_bus_id()? {
            return Ok(true);
        }
        let id = std::ffi::CString::new(bus_id).map_err(|_| Error::Invalid {
            arg: "bus_id",
            reason: format!("{bus_id:?} holds a NUL byte"),
        })?;
        let (mut me, mut peer, mut can) = (0, 0, 0);
        // SAFETY: the context is current; every out-parameter is one value.
        unsafe {
            check("cuCtxGetDevice", sys::cuCtxGetDevice(&mut me))?;
            check(
                "cuDeviceGetByPCIBusId",
                sys::cuDeviceGetByPCIBusId(&mut peer, id.as_ptr()),
            )?;
            check(
                "cuDeviceCanAccessPeer",
                sys::cuDeviceCanAccessPeer(&mut can, me, peer),
            )?;
        }
        Ok(can != 0)
    }
}

impl DeviceBuffer {
    /// The handle another process opens this allocation with ([`IpcMapping::open`]).
    pub fn ipc_handle(&self) -> Result<IpcHandle> {
        let mut handle = sys::CUipcMemHandle {
            reserved: [0; IPC_HANDLE_BYTES],
        };
        // SAFETY: the pointer is the base of a live cuMemAlloc allocation; writes one handle.
        check("cuIpcGetMemHandle", unsafe {
            sys::cuIpcGetMemHandle(&mut handle, self.ptr())
        })?;
        Ok(handle.reserved.map(|b| b as u8))
    }
}

/// Another process's allocation, mapped into this one; unmapped on drop.
#[derive(Debug)]
pub struct IpcMapping {
    ptr: u64,
    gpu: Gpu,
}

impl IpcMapping {
    /// Maps the allocation named by `handle` into `gpu`'s context, with peer access enabled
    /// when it lives on another device. Fails on a handle of this very process (CUDA's rule:
    /// use the pointer itself).
    pub fn open(gpu: &Gpu, handle: &IpcHandle) -> Result<IpcMapping> {
        gpu.bind()?;
        let handle = sys::CUipcMemHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        let mut ptr = 0;
        // SAFETY: the context is current; the handle is plain bytes the driver validates.
        check("cuIpcOpenMemHandle", unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut ptr,
                handle,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        })?;
        Ok(IpcMapping {
            ptr,
            gpu: gpu.clone(),
        })
    }

    /// The mapped allocation's address in this process.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        if self.gpu.synchronize().is_ok() {
            // SAFETY: opened above, closed once, after this process's queued work.
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
        }
    }
}
