//! Ranks: one process drives every visible GPU, one host thread per rank (SPEC §7).
//!
//! A [`World`] of R ranks places rank r on GPU `r % G` with a stream of its own, so R may exceed
//! the number of GPUs G (*virtual ranks*, for correctness runs: ranks on one GPU run
//! concurrently on their own streams). Peer access is enabled between every pair of GPUs.
//! [`SymmetricBuffer`]s hold one equal-sized `cuMemAlloc` buffer per rank plus, per rank, a
//! device-resident peer pointer table that kernels index by rank.
//!
//! [`World::run`] runs a closure on every rank in its own thread and returns one result per
//! rank; when any rank fails, every rank's result is an error (SPEC §6). [`Rank::barrier`] is a
//! device-side barrier across ranks with a deadline: a rank that never arrives makes the others
//! fail within the deadline with [`Error::WaitTimeout`] naming it.

use crate::device::{DeviceBuffer, Gpu, Kernel, LaunchConfig};
use crate::error::{Error, Result};
use crate::kernels::{self, RankBarrierParams};
use crate::wait::{deadline_ns, WaitNames, WaitRecord, DEFAULT_DEADLINE};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// One equal-sized buffer per rank, each readable and writable by every rank, and per rank a
/// table of every rank's buffer address on that rank's GPU.
pub struct SymmetricBuffer {
    buffers: Vec<DeviceBuffer>,
    tables: Vec<DeviceBuffer>,
}

impl SymmetricBuffer {
    /// Rank `rank`'s buffer.
    pub fn local(&self, rank: usize) -> &DeviceBuffer {
        &self.buffers[rank]
    }

    /// Device address of rank `rank`'s buffer (valid on every rank's GPU).
    pub fn ptr(&self, rank: usize) -> u64 {
        self.buffers[rank].ptr()
    }

    /// Device address, on rank `rank`'s GPU, of the table of all ranks' buffer addresses
    /// (`world` u64s): what kernels take as their peer pointer table.
    pub fn peer_table(&self, rank: usize) -> u64 {
        self.tables[rank].ptr()
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

/// R ranks over the visible GPUs.
pub struct World {
    ranks: Vec<Rank>,
    gpu_count: usize,
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
        if size == 0 {
            return Err(Error::Invalid {
                arg: "size",
                reason: "a world needs at least one rank".into(),
            });
        }
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
                Ok(Rank {
                    rank: r,
                    world: size,
                    record: gpu.alloc_zeroed(std::mem::size_of::<WaitRecord>())?,
                    gpu,
                    barrier: barrier[r % g].clone(),
                    signals_table: signals.peer_table(r),
                    epoch: AtomicU64::new(0),
                    deadline,
                    broken: broken.clone(),
                })
            })
            .collect::<Result<_>>()?;
        Ok(World {
            ranks,
            gpu_count: g.min(size),
            _signals: signals,
            broken,
        })
    }

    pub fn size(&self) -> usize {
        self.ranks.len()
    }

    /// GPUs the ranks run on.
    pub fn gpu_count(&self) -> usize {
        self.gpu_count
    }

    /// Whether several ranks share a GPU.
    pub fn is_virtual(&self) -> bool {
        self.ranks.len() > self.gpu_count
    }

    pub fn ranks(&self) -> &[Rank] {
        &self.ranks
    }

    /// Loads `kernel` once per GPU; entry r is the kernel for rank r.
    pub fn load(&self, kernel: &crate::jit::CompiledKernel) -> Result<Vec<Arc<Kernel>>> {
        let per_gpu: Vec<Arc<Kernel>> = self.ranks[..self.gpu_count]
            .iter()
            .map(|r| r.gpu.load(kernel).map(Arc::new))
            .collect::<Result<_>>()?;
        Ok((0..self.size())
            .map(|r| per_gpu[r % self.gpu_count].clone())
            .collect())
    }

    /// A zeroed symmetric buffer of `bytes` per rank.
    pub fn alloc_symmetric(&self, bytes: usize) -> Result<SymmetricBuffer> {
        let gpus: Vec<&Gpu> = self.ranks.iter().map(|r| &r.gpu).collect();
        symmetric_on(&gpus, bytes)
    }

    /// Runs `f` on every rank, each in its own host thread with its GPU bound, and returns one
    /// result per rank. If any rank fails, every rank's result is an error: the failing ranks
    /// keep theirs, the others get [`Error::PeerFailed`] naming the first failed rank.
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
                .map(|(rank, h)| {
                    h.join().unwrap_or_else(|payload| {
                        let message = payload
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| payload.downcast_ref::<String>().cloned())
                            .unwrap_or_default();
                        Err(Error::RankPanicked { rank, message })
                    })
                })
                .collect()
        });
        let results = fail_together(results);
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
    Ok(SymmetricBuffer { buffers, tables })
}

/// SPEC §6: when any rank fails, every rank fails. The first rank whose own error is not a
/// [`Error::PeerFailed`] is named as the cause in the others' errors.
pub fn fail_together<T>(results: Vec<Result<T>>) -> Vec<Result<T>> {
    let cause = results
        .iter()
        .enumerate()
        .find_map(|(r, res)| match res {
            Err(Error::PeerFailed { .. }) | Ok(_) => None,
            Err(e) => Some((r, e.to_string())),
        })
        .or_else(|| {
            results
                .iter()
                .enumerate()
                .find_map(|(r, res)| res.as_ref().err().map(|e| (r, e.to_string())))
        });
    let Some((failed_rank, cause)) = cause else {
        return results;
    };
    results
        .into_iter()
        .enumerate()
        .map(|(rank, res)| match res {
            Ok(_) => Err(Error::PeerFailed {
                rank,
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
    fn all_ok_stays_ok() {
        let r = fail_together(vec![Ok(1), Ok(2)]);
        assert_eq!(
            r.into_iter().map(Result::unwrap).collect::<Vec<_>>(),
            vec![1, 2]
        );
    }

    #[test]
    fn one_skipping_rank_fails_every_rank_naming_it() {
        // Rank 1 skipped the barrier (returned Ok); ranks 0, 2, 3 timed out waiting for it.
        let r = fail_together(vec![
            Err(timeout(0, 1)),
            Ok(()),
            Err(timeout(2, 1)),
            Err(timeout(3, 1)),
        ]);
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
    fn a_host_error_is_the_cause_others_see() {
        let r: Vec<Result<()>> = fail_together(vec![
            Ok(()),
            Err(Error::Invalid {
                arg: "x",
                reason: "bad".into(),
            }),
        ]);
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
