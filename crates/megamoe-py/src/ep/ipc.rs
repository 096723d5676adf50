//! Symmetric memory of one process per GPU over CUDA IPC.

use megamoe_cuda::interop::{IpcHandle, IpcMapping, IPC_HANDLE_BYTES};
use megamoe_cuda::{DeviceBuffer, Gpu};

use crate::api::count;
use crate::error::{Error, Result};

/// Symmetric memory of one process per GPU: this process's `cuMemAlloc` buffer, and its peers'
/// buffers opened from their IPC handles (exchanged by the caller, e.g. over
/// torch.distributed).
pub struct IpcBuffer {
    gpu: Gpu,
    local: DeviceBuffer,
    /// Indexed by rank; None for this process's own rank.
    peers: Vec<Option<IpcMapping>>,
    rank: usize,
}

/// What one process publishes: its allocation's IPC handle and the GPU it lives on.
pub struct IpcPeer {
    pub handle: Vec<u8>,
    pub pci_bus_id: String,
}

impl IpcBuffer {
    /// `bytes` of zeroed device memory on CUDA device `device`.
    pub fn new(device: i64, bytes: i64) -> Result<IpcBuffer> {
        let device = count("device", device)?;
        let bytes = count("bytes", bytes)?;
        if bytes == 0 {
            return Err(Error::Value("bytes: must be at least 1".into()));
        }
        let gpu = Gpu::new(device)?;
        let local = gpu.alloc_zeroed(bytes)?;
        Ok(IpcBuffer {
            gpu,
            local,
            peers: vec![],
            rank: 0,
        })
    }

    /// What this process gives its peers.
    pub fn export(&self) -> Result<IpcPeer> {
        Ok(IpcPeer {
            handle: self.local.ipc_handle()?.to_vec(),
            pci_bus_id: self.gpu.pci_bus_id()?,
        })
    }

    /// Opens every peer's buffer; `peers[rank]` is this process's own entry (skipped). Fails,
    /// naming the rank, when this GPU cannot reach a peer's.
    pub fn open(&mut self, rank: i64, peers: &[IpcPeer]) -> Result<()> {
        let rank = count("rank", rank)?;
        if rank >= peers.len() {
            return Err(Error::Value(format!(
                "rank: {rank} is outside the {} peers",
                peers.len()
            )));
        }
        let me = self.gpu.pci_bus_id()?;
        let mut opened = Vec::with_capacity(peers.len());
        for (r, p) in peers.iter().enumerate() {
            if r == rank {
                opened.push(None);
                continue;
            }
            let handle: IpcHandle = p.handle.as_slice().try_into().map_err(|_| {
                Error::Value(format!(
                    "peers[{r}]: a handle of {} bytes, expected {IPC_HANDLE_BYTES}",
                    p.handle.len()
                ))
            })?;
            if !self.gpu.can_access_bus(&p.pci_bus_id)? {
                return Err(Error::Runtime(format!(
                    "rank {rank}: GPU {me} has no peer access to GPU {} of rank {r} \
                     (no NVLink or PCIe peer path): symmetric memory needs one",
                    p.pci_bus_id
                )));
            }
            let mapping = IpcMapping::open(&self.gpu, &handle).map_err(|e| {
                Error::Runtime(format!("rank {rank}: opening rank {r}'s buffer: {e}"))
            })?;
            opened.push(Some(mapping));
        }
        self.peers = opened;
        self.rank = rank;
        Ok(())
    }

    /// The device address of rank `rank`'s buffer in this process.
    pub fn ptr(&self, rank: i64) -> Result<u64> {
        let r = count("rank", rank)?;
        if r == self.rank {
            return Ok(self.local.ptr());
        }
        match self.peers.get(r) {
            Some(Some(m)) => Ok(m.ptr()),
            _ => Err(Error::Value(format!(
                "rank: {rank} is not an opened peer ({} ranks opened)",
                self.peers.len()
            ))),
        }
    }

    pub fn bytes(&self) -> usize {
        self.local.bytes()
    }

    /// Copies `bytes` between two device addresses on this GPU's stream, ordered after the
    /// caller's `stream` and back (for tests and small transfers).
    ///
    /// # Safety
    /// Both ranges must be live device memory mapped in this process.
    pub unsafe fn copy(&self, dst: u64, src: u64, bytes: usize, stream: u64) -> Result<()> {
        self.gpu.wait_for(stream)?;
        // SAFETY: the caller's contract.
        unsafe { self.gpu.copy_raw(dst, src, bytes)? };
        self.gpu.release_to(stream)?;
        Ok(())
    }
}
