//! Ranks: one process drives every visible GPU, one host thread per rank (SPEC §7), or one
//! process per rank (torchrun), each mapping its peers' memory over CUDA IPC.
//!
//! A [`World`] of R ranks places rank r on GPU `r % G` with a stream of its own, so R may exceed
//! the number of GPUs G (*virtual ranks*, for correctness runs: ranks on one GPU run
//! concurrently on their own streams). Peer access is enabled between every pair of GPUs.
//! [`World::one_rank`] builds instead the part of a world that one process of R holds: its one
//! rank, on the GPU it names (several processes may share a GPU). A world's *local ranks* are
//! the ranks of this process: all of them, or that one.
//!
//! [`SymmetricBuffer`]s hold one equal-sized `cuMemAlloc` buffer per rank plus, per local rank,
//! a device-resident peer pointer table that kernels index by rank. In a one-rank world, the
//! peers' buffers are IPC mappings whose handles the processes swap through a caller-given
//! [`AllGather`] (torch.distributed, a rendezvous directory).
//!
//! [`World::run`] runs a closure on every local rank in its own thread and returns one result
//! per rank; when any rank fails, every rank's result is an error (SPEC §6). [`Rank::barrier`]
//! is a device-side barrier across all ranks of the world (every process) with a deadline: a
//! rank that never arrives makes the others fail within the deadline with
//! [`Error::WaitTimeout`] naming it.

use crate::device::{DeviceBuffer, Gpu, Kernel, LaunchConfig};
use crate::error::{Error, Result};
use crate::interop::{IpcHandle, IpcMapping, IPC_HANDLE_BYTES};
use crate::kernels::{self, RankBarrierParams};
use crate::wait::{deadline_ns, WaitNames, WaitRecord, DEFAULT_DEADLINE};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How the processes of a world swap bytes: every rank gives its bytes and gets every rank's,
/// in rank order. Every process makes the same calls in the same order.
pub trait AllGather: Send {
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>>;
}

/// One equal-sized buffer per rank, each readable and writable by every rank, and per local
/// rank a table of every rank's buffer address on that rank's GPU.
pub struct SymmetricBuffer {
    /// The first local rank: `buffers[i]` and `tables[i]` are rank `first + i`'s.
    first: usize,
    buffers: Vec<DeviceBuffer>,
    /// Every rank's buffer address in this process.
    ptrs: Vec<u64>,
    tables: Vec<DeviceBuffer>,
    // The peers' buffers of a one-rank world, unmapped on drop.
    _mappings: Vec<IpcMapping>,
}

impl SymmetricBuffer {
    /// Local rank `rank`'s buffer.
    pub fn local(&self, rank: usize) -> &DeviceBuffer {
        &self.buffers[rank - self.first]
    }

    /// Device address of rank `rank`'s buffer in this process (valid on every local rank's
    /// GPU).
    pub fn ptr(&self, rank: usize) -> u64 {
        self.ptrs[rank]
    }

    /// Device address, on local rank `rank`'s GPU, of the table of all ranks' buffer addresses
    /// (`world` u64s): what kernels take as their peer pointer table.
    pub fn peer_table(&self, rank: usize) -> u64 {
        self.tables[rank - self.first].ptr()
    }

    /// Bytes per rank.
    pub fn bytes(&self) -> usize {
        self.buffers[0].bytes()
    }
}

/// One rank of a [`World`].
pub struct Rank {
    pub rank: usize,
    pub world: usize,
    /// This rank's GPU handle (shared device, own stream).
    pub gpu: Gpu,
    barrier: Arc<Kernel>,
    signals_table: u64,
    record: DeviceBuffer,
    epoch: AtomicU64,
    deadline: Duration,
    broken: Arc<AtomicBool>,
}

impl Rank {
    fn new(
        rank: usize,
        world: usize,
        gpu: Gpu,
        barrier: Arc<Kernel>,
        signals: &SymmetricBuffer,
        deadline: Duration,
        broken: &Arc<AtomicBool>,
    ) -> Result<Rank> {
        Ok(Rank {
            rank,
            world,
            record: gpu.alloc_zeroed(std::mem::size_of::<WaitRecord>())?,
            gpu,
            barrier,
            signals_table: signals.peer_table(rank),
            epoch: AtomicU64::new(0),
            deadline,
            broken: broken.clone(),
        })
    }

    /// A device-side barrier across all ranks of the world, bounded by the world's deadline.
    /// A rank that does not arrive makes this fail with [`Error::WaitTimeout`] naming it.
    pub fn barrier(&self) -> Result<()> {
        if self.broken.load(Ordering::Acquire) {
            return Err(Error::Invalid {
                arg: "world",
                reason: "an earlier collective failed; build a new World".into(),
            });
        }
        let params = RankBarrierParams {
            peer_signals: self.signals_table,
            record: self.record.ptr(),
            epoch: self.epoch.fetch_add(1, Ordering::Relaxed) + 1,
            timeout_ns: deadline_ns(self.deadline),
            rank: self.rank as u32,
            world: self.world as u32,
        };
        self.gpu
            .launch(&self.barrier, &LaunchConfig::new(1, 32), &params)?;
        self.gpu.synchronize()?;
        self.check_waits(&[])
    }

    /// Reads this rank's wait record: an error if any device wait of this rank timed out, named
    /// by the runtime's own wait names or those of `waits` (the caller's kernels' waits).
    pub fn check_waits(&self, waits: &[&WaitNames]) -> Result<()> {
        let mut rec = [WaitRecord::default()];
        self.record.download_into(0, &mut rec)?;
        match rec[0].to_error(self.deadline, waits) {
            Some(e) => {
                self.broken.store(true, Ordering::Release);
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// Device address of this rank's wait record, for kernels with their own waits.
    pub fn wait_record(&self) -> u64 {
        self.record.ptr()
    }

    /// The deadline of every device-side wait of this rank.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }
}

/// R ranks over the visible GPUs, all in this process or one of them.
pub struct World {
    size: usize,
    /// The local ranks, in rank order.
    ranks: Vec<Rank>,
    gpu_count: usize,
    /// Swaps the symmetric buffers' handles with the other processes; None when every rank is
    /// local.
    exchange: Option<Mutex<Box<dyn AllGather>>>,
    // Kept alive for the ranks' barriers.
    _signals: SymmetricBuffer,
    broken: Arc<AtomicBool>,
}

impl World {
    /// A world of `size` ranks with the default deadline; rank r runs on GPU `r % G`.
    pub fn new(size: usize) -> Result<World> {
        World::with_deadline(size, DEFAULT_DEADLINE)
    }

    /// One rank per visible GPU.
    pub fn physical() -> Result<World> {
        World::new(crate::device::device_count()?.max(1))
    }

    /// A world whose device-side waits give up after `deadline`.
    pub fn with_deadline(size: usize, deadline: Duration) -> Result<World> {
        check_size(size)?;
        let gpus = Gpu::all()?;
        let g = gpus.len();
        for a in &gpus {
            for b in &gpus {
                a.enable_peer_access(b)?;
            }
        }
        let compiled = crate::jit::compile(&kernels::rank_barrier())?;
        let barrier: Vec<Arc<Kernel>> = gpus
            .iter()
            .take(size)
            .map(|gpu| gpu.load(&compiled).map(Arc::new))
            .collect::<Result<_>>()?;
        let rank_gpus: Vec<Gpu> = (0..size)
            .map(|r| gpus[r % g].with_new_stream())
            .collect::<Result<_>>()?;
        let signals = symmetric_on(&rank_gpus.iter().collect::<Vec<_>>(), size * 8)?;
        let broken = Arc::new(AtomicBool::new(false));
        let ranks = rank_gpus
            .into_iter()
            .enumerate()
            .map(|(r, gpu)| {
                Rank::new(
                    r,
                    size,
                    gpu,
                    barrier[r % g].clone(),
                    &signals,
                    deadline,
                    &broken,
                )
            })
            .collect::<Result<_>>()?;
        Ok(World {
            size,
            ranks,
            gpu_count: g.min(size),
            exchange: None,
            _signals: signals,
            broken,
        })
    }

    /// Rank `rank` of a world of `size` ranks, one per process, on GPU `device` (processes may
    /// share one); the symmetric buffers' handles go through `exchange`, which every process of
    /// the world calls in the same order (this constructor calls it once, as does each
    /// [`World::alloc_symmetric`]). Fails, naming both devices, when this GPU cannot map a
    /// peer's memory.
    pub fn one_rank(
        rank: usize,
        size: usize,
        device: usize,
        deadline: Duration,
        exchange: Box<dyn AllGather>,
    ) -> Result<World> {
        check_size(size)?;
        check_rank(rank, size)?;
        let gpu = Gpu::new(device)?;
        let compiled = crate::jit::compile(&kernels::rank_barrier())?;
        let barrier = Arc::new(gpu.load(&compiled)?);
        let mut exchange = exchange;
        let signals = symmetric_across(&gpu, rank, size, size * 8, exchange.as_mut())?;
        let broken = Arc::new(AtomicBool::new(false));
        let me = Rank::new(rank, size, gpu, barrier, &signals, deadline, &broken)?;
        Ok(World {
            size,
            ranks: vec![me],
            gpu_count: 1,
            exchange: Some(Mutex::new(exchange)),
            _signals: signals,
            broken,
        })
    }

    /// Ranks of the whole world (every process).
    pub fn size(&self) -> usize {
        self.size
    }

    /// The ranks of this process.
    pub fn local_ranks(&self) -> Range<usize> {
        let first = self.ranks[0].rank;
        first..first + self.ranks.len()
    }

    /// GPUs the local ranks run on.
    pub fn gpu_count(&self) -> usize {
        self.gpu_count
    }

    /// Whether several local ranks share a GPU.
    pub fn is_virtual(&self) -> bool {
        self.ranks.len() > self.gpu_count
    }

    /// The local ranks, in rank order.
    pub fn ranks(&self) -> &[Rank] {
        &self.ranks
    }

    /// Local rank `rank`.
    pub fn rank(&self, rank: usize) -> &Rank {
        &self.ranks[rank - self.ranks[0].rank]
    }

    /// Loads `kernel` once per GPU; entry i is the kernel for the i-th local rank.
    pub fn load(&self, kernel: &crate::jit::CompiledKernel) -> Result<Vec<Arc<Kernel>>> {
        let per_gpu: Vec<Arc<Kernel>> = self.ranks[..self.gpu_count]
            .iter()
            .map(|r| r.gpu.load(kernel).map(Arc::new))
            .collect::<Result<_>>()?;
        Ok((0..self.ranks.len())
            .map(|i| per_gpu[i % self.gpu_count].clone())
            .collect())
    }

    /// A zeroed symmetric buffer of `bytes` per rank. In a one-rank world every process must
    /// make the same allocations in the same order (they swap handles).
    pub fn alloc_symmetric(&self, bytes: usize) -> Result<SymmetricBuffer> {
        match &self.exchange {
            None => {
                let gpus: Vec<&Gpu> = self.ranks.iter().map(|r| &r.gpu).collect();
                symmetric_on(&gpus, bytes)
            }
            Some(exchange) => {
                let mut exchange = exchange.lock().unwrap_or_else(|e| e.into_inner());
                let me = &self.ranks[0];
                symmetric_across(&me.gpu, me.rank, self.size, bytes, exchange.as_mut())
            }
        }
    }

    /// Runs `f` on every local rank, each in its own host thread with its GPU bound, and returns
    /// one result per local rank. If any fails, every local rank's result is an error: the
    /// failing ranks keep theirs, the others get [`Error::PeerFailed`] naming the first failed
    /// rank (ranks of other processes fail their own `run`).
    ///
    /// Load modules ([`World::load`]) and allocate buffers before `run`, not inside it: module
    /// loads and frees may wait for the whole device, and with virtual ranks a rank blocked
    /// behind another rank's device-side wait never arrives (the deadline then reports it).
    pub fn run<T: Send>(&self, f: impl Fn(&Rank) -> Result<T> + Sync) -> Vec<Result<T>> {
        let results: Vec<Result<T>> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .ranks
                .iter()
                .map(|rank| {
                    let f = &f;
                    s.spawn(move || {
                        rank.gpu.bind()?;
                        f(rank)
                    })
                })
                .collect();
            handles
                .into_iter()
                .enumerate()
                .map(|(i, h)| {
                    h.join().unwrap_or_else(|payload| {
                        let message = payload
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| payload.downcast_ref::<String>().cloned())
                            .unwrap_or_default();
                        Err(Error::RankPanicked {
                            rank: self.ranks[i].rank,
                            message,
                        })
                    })
                })
                .collect()
        });
        let results = fail_together(self.ranks[0].rank, results);
        if results.iter().any(Result::is_err) {
            self.broken.store(true, Ordering::Release);
        }
        results
    }
}

fn symmetric_on(gpus: &[&Gpu], bytes: usize) -> Result<SymmetricBuffer> {
    let buffers: Vec<DeviceBuffer> = gpus
        .iter()
        .map(|g| g.alloc_zeroed(bytes))
        .collect::<Result<_>>()?;
    let ptrs: Vec<u64> = buffers.iter().map(DeviceBuffer::ptr).collect();
    let tables = gpus
        .iter()
        .map(|g| g.alloc_from(&ptrs))
        .collect::<Result<_>>()?;
    Ok(SymmetricBuffer {
        first: 0,
        buffers,
        ptrs,
        tables,
        _mappings: Vec::new(),
    })
}

/// Rank `rank`'s part of a symmetric buffer of a one-rank world: its own allocation, zeroed
/// before any peer can see it, and every peer's mapped from the handle it sent.
fn symmetric_across(
    gpu: &Gpu,
    rank: usize,
    size: usize,
    bytes: usize,
    exchange: &mut dyn AllGather,
) -> Result<SymmetricBuffer> {
    let buffer = gpu.alloc_zeroed(bytes)?;
    let bus = gpu.pci_bus_id()?;
    let all = exchange.all_gather(&PeerMemory::encode(&buffer.ipc_handle()?, bytes, &bus))?;
    if all.len() != size {
        return Err(Error::Exchange {
            rank,
            reason: format!("got {} ranks' handles, the world has {size}", all.len()),
        });
    }
    let mut ptrs = Vec::with_capacity(size);
    let mut mappings = Vec::with_capacity(size - 1);
    for (peer, sent) in all.iter().enumerate() {
        if peer == rank {
            ptrs.push(buffer.ptr());
            continue;
        }
        let memory = PeerMemory::decode(rank, peer, sent, bytes)?;
        if !gpu.can_access_bus(&memory.bus)? {
            return Err(Error::Exchange {
                rank,
                reason: format!(
                    "this rank's GPU {bus} cannot access rank {peer}'s GPU {} (no peer access)",
                    memory.bus
                ),
            });
        }
        let mapping = IpcMapping::open(gpu, &memory.handle)?;
        ptrs.push(mapping.ptr());
        mappings.push(mapping);
    }
    let tables = vec![gpu.alloc_from(&ptrs)?];
    Ok(SymmetricBuffer {
        first: rank,
        buffers: vec![buffer],
        ptrs,
        tables,
        _mappings: mappings,
    })
}

/// What one process sends for one symmetric buffer: its allocation's IPC handle, the bytes it
/// holds (every rank's must match) and the PCI bus id of its GPU (which names the device to the
/// other processes).
#[derive(Debug, PartialEq)]
struct PeerMemory {
    handle: IpcHandle,
    bus: String,
}

impl PeerMemory {
    /// The handle, the size as a little-endian u64, then the bus id.
    fn encode(handle: &IpcHandle, bytes: usize, bus: &str) -> Vec<u8> {
        let mut out = handle.to_vec();
        out.extend_from_slice(&(bytes as u64).to_le_bytes());
        out.extend_from_slice(bus.as_bytes());
        out
    }

    /// What rank `peer` sent, as seen by rank `rank`, whose buffer holds `bytes`.
    fn decode(rank: usize, peer: usize, sent: &[u8], bytes: usize) -> Result<PeerMemory> {
        let bad = |reason: String| Error::Exchange { rank, reason };
        const HEAD: usize = IPC_HANDLE_BYTES + 8;
        if sent.len() <= HEAD {
            return Err(bad(format!(
                "rank {peer} sent {} bytes, a handle takes more than {HEAD}",
                sent.len()
            )));
        }
        let size = u64::from_le_bytes(sent[IPC_HANDLE_BYTES..HEAD].try_into().expect("8 bytes"));
        if size != bytes as u64 {
            return Err(bad(format!(
                "rank {peer}'s symmetric buffer holds {size} bytes, this rank's {bytes} (the \
                 processes allocate different buffers)"
            )));
        }
        let bus = std::str::from_utf8(&sent[HEAD..])
            .map_err(|_| bad(format!("rank {peer}'s PCI bus id is not UTF-8")))?;
        Ok(PeerMemory {
            handle: sent[..IPC_HANDLE_BYTES].try_into().expect("64 bytes"),
            bus: bus.to_string(),
        })
    }
}

/// A process's rank in a world of `size` ranks ([`World::one_rank`]; callers that ask the GPU
/// something first check it themselves, before).
pub fn check_rank(rank: usize, size: usize) -> Result<()> {
    if rank >= size {
        return Err(Error::Invalid {
            arg: "rank",
            reason: format!("{rank} is not below the world size {size}"),
        });
    }
    Ok(())
}

fn check_size(size: usize) -> Result<()> {
    if size == 0 {
        return Err(Error::Invalid {
            arg: "size",
            reason: "a world needs at least one rank".into(),
        });
    }
    Ok(())
}

/// SPEC §6: when any rank fails, every rank fails. `results[i]` is rank `first + i`'s. The
/// first rank whose own error is not a [`Error::PeerFailed`] is named as the cause in the
/// others' errors.
pub fn fail_together<T>(first: usize, results: Vec<Result<T>>) -> Vec<Result<T>> {
    let cause = results
        .iter()
        .enumerate()
        .find_map(|(i, res)| match res {
            Err(Error::PeerFailed { .. }) | Ok(_) => None,
            Err(e) => Some((first + i, e.to_string())),
        })
        .or_else(|| {
            results
                .iter()
                .enumerate()
                .find_map(|(i, res)| res.as_ref().err().map(|e| (first + i, e.to_string())))
        });
    let Some((failed_rank, cause)) = cause else {
        return results;
    };
    results
        .into_iter()
        .enumerate()
        .map(|(i, res)| match res {
            Ok(_) => Err(Error::PeerFailed {
                rank: first + i,
                failed_rank,
                cause: cause.clone(),
            }),
            err => err,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout(rank: usize, peer: usize) -> Error {
        Error::WaitTimeout {
            rank,
            wait: "rank barrier",
            peer,
            observed: 0,
            expected: 1,
            deadline_ms: 200,
        }
    }

    #[test]
    fn peer_memory_round_trips_and_a_mismatch_names_the_peer() {
        let handle: IpcHandle = std::array::from_fn(|i| i as u8);
        let sent = PeerMemory::encode(&handle, 4096, "0000:1b:00.0");
        assert_eq!(
            PeerMemory::decode(0, 3, &sent, 4096).unwrap(),
            PeerMemory {
                handle,
                bus: "0000:1b:00.0".into()
            }
        );
        let e = PeerMemory::decode(0, 3, &sent, 8192)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("rank 0: handle exchange: rank 3's symmetric buffer holds 4096 bytes"),
            "{e}"
        );
        let e = PeerMemory::decode(1, 2, &sent[..40], 4096)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("rank 1: handle exchange: rank 2 sent 40 bytes"),
            "{e}"
        );
    }

    #[test]
    fn all_ok_stays_ok() {
        let r = fail_together(0, vec![Ok(1), Ok(2)]);
        assert_eq!(
            r.into_iter().map(Result::unwrap).collect::<Vec<_>>(),
            vec![1, 2]
        );
    }

    #[test]
    fn one_skipping_rank_fails_every_rank_naming_it() {
        // Rank 1 skipped the barrier (returned Ok); ranks 0, 2, 3 timed out waiting for it.
        let r = fail_together(
            0,
            vec![
                Err(timeout(0, 1)),
                Ok(()),
                Err(timeout(2, 1)),
                Err(timeout(3, 1)),
            ],
        );
        assert!(r.iter().all(Result::is_err));
        for (rank, res) in r.iter().enumerate() {
            let text = res.as_ref().unwrap_err().to_string();
            assert!(text.contains(&format!("rank {rank}")), "{text}");
            assert!(text.contains("rank 1"), "{text}");
        }
        match &r[1] {
            Err(Error::PeerFailed {
                rank: 1,
                failed_rank: 0,
                cause,
            }) => {
                assert!(cause.contains("waiting for rank 1"), "{cause}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_ranks_of_another_process_are_named_by_their_world_rank() {
        // This process holds ranks 2 and 3; rank 3 failed.
        let r = fail_together(2, vec![Ok(()), Err(timeout(3, 0))]);
        match &r[0] {
            Err(Error::PeerFailed {
                rank: 2,
                failed_rank: 3,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_host_error_is_the_cause_others_see() {
        let r: Vec<Result<()>> = fail_together(
            0,
            vec![
                Ok(()),
                Err(Error::Invalid {
                    arg: "x",
                    reason: "bad".into(),
                }),
            ],
        );
        match &r[0] {
            Err(Error::PeerFailed {
                failed_rank: 1,
                cause,
                ..
            }) => assert!(cause.contains("bad")),
            other => panic!("{other:?}"),
        }
    }
}
