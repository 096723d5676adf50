//! The path Megatron's alltoall dispatcher takes, as the benchmark's baseline: a local permute
//! that copies each token once per slot grouped by expert (so by destination rank), NCCL
//! all-to-all-v (grouped send/recv), and a second permute that regroups the received
//! (source, expert) chunks by local expert into the same padded layout as ours. The index lists
//! are built on the host from megamoe-core's permute plan (not timed; Megatron derives them on
//! the device).

use cudarc::nccl::{result as nccl, sys as nccl_sys};
use megamoe_core::permute::PermuteHandle;
use megamoe_cuda::{DeviceBuffer, LaunchConfig};

use crate::error::EpError;
use crate::params::{GatherParams, THREADS};
use crate::world::EpWorld;

struct BaselineRank {
    send: DeviceBuffer,
    recv: DeviceBuffer,
    out: DeviceBuffer,
    send_index: DeviceBuffer,
    recv_index: DeviceBuffer,
    n_send: usize,
    n_out: usize,
    send_counts: Vec<usize>,
    recv_counts: Vec<usize>,
}

pub struct NcclBaseline {
    comms: Vec<nccl_sys::ncclComm_t>,
    ranks: Vec<BaselineRank>,
    row_bytes: usize,
    grid: u32,
}

fn nccl_err(call: &'static str, e: nccl::NcclError) -> EpError {
    EpError::Nccl {
        call,
        message: format!("{e:?}"),
    }
}

impl NcclBaseline {
    /// Needs one rank per GPU (NCCL has no virtual ranks). `idx[r]` is rank r's topk_idx and
    /// `handle` the plan of its dispatch.
    pub fn new(
        world: &EpWorld,
        handle: &PermuteHandle,
        idx: &[Vec<i32>],
        row_bytes: usize,
    ) -> Result<Self, EpError> {
        let r = world.ranks();
        if world.physical_gpus() != r {
            return Err(EpError::Nccl {
                call: "setup",
                message: format!(
                    "the NCCL baseline needs {r} GPUs, {} present",
                    world.physical_gpus()
                ),
            });
        }
        megamoe_cuda::probe::nccl()?;
        let (k, el) = (handle.topk, handle.experts / r);
        let mut ranks = Vec::with_capacity(r);
        for (s, s_idx) in idx.iter().enumerate().take(r) {
            let gpu = &world.rank(s).gpu;
            // Source side: (expert, token) order of every valid slot.
            let mut slots: Vec<(i32, usize)> = (0..handle.tokens[s] * k)
                .filter(|&i| s_idx[i] >= 0)
                .map(|i| (s_idx[i], i / k))
                .collect();
            slots.sort_unstable();
            let send_index: Vec<i32> = slots.iter().map(|&(_, t)| t as i32).collect();
            let mut send_counts = vec![0usize; r];
            for &(e, _) in &slots {
                send_counts[e as usize / el] += 1;
            }
            // Receiver side: sources back to back, each in (expert, token) order (the order it
            // sends in); output row -> row of the received buffer, −1 for padding.
            let n_out = handle.plans[s].output_rows();
            let mut recv_index = vec![-1i32; n_out];
            let mut recv_counts = Vec::with_capacity(r);
            let mut chunk = 0usize;
            for dests in &handle.destinations {
                let mut rows: Vec<(usize, usize)> = dests
                    .iter()
                    .flatten()
                    .filter(|d| d.rank == s)
                    .map(|d| (d.expert, d.row))
                    .collect();
                rows.sort_unstable();
                for (i, &(_, row)) in rows.iter().enumerate() {
                    recv_index[row] = (chunk + i) as i32;
                }
                recv_counts.push(rows.len());
                chunk += rows.len();
            }
            let n_send = send_index.len();
            ranks.push(BaselineRank {
                send: gpu.alloc(n_send * row_bytes)?,
                recv: gpu.alloc(chunk * row_bytes)?,
                out: gpu.alloc(n_out * row_bytes)?,
                send_index: gpu.alloc_from(&send_index)?,
                recv_index: gpu.alloc_from(&recv_index)?,
                n_send,
                n_out,
                send_counts,
                recv_counts,
            });
        }
        let mut comms = vec![std::ptr::null_mut(); r];
        let devs: Vec<i32> = (0..r as i32).collect();
        // SAFETY: one communicator per listed device, written into `comms`.
        unsafe { nccl::comm_init_all(comms.as_mut_ptr(), r as i32, devs.as_ptr()) }
            .map_err(|e| nccl_err("init", e))?;
        let grid = world.rank(0).gpu.props().sm_count;
        Ok(NcclBaseline {
            comms,
            ranks,
            row_bytes,
            grid,
        })
    }

    /// The NVLink bytes the slowest rank receives (each slot's row separately).
    pub fn nvlink_bytes(&self) -> f64 {
        (0..self.ranks.len())
            .map(|d| {
                self.ranks
                    .iter()
                    .enumerate()
                    .filter(|(s, _)| *s != d)
                    .map(|(_, b)| b.send_counts[d])
                    .sum::<usize>()
            })
            .max()
            .unwrap_or(0) as f64
            * self.row_bytes as f64
    }

    /// Both permutes and the exchange, or (`permute` false) the exchange alone.
    pub fn dispatch(&self, world: &EpWorld, permute: bool) -> Result<(), EpError> {
        let r = self.ranks.len();
        if permute {
            for (s, b) in self.ranks.iter().enumerate() {
                let x = world.ptrs(s).x;
                self.gather(world, s, x, &b.send, &b.send_index, b.n_send)?;
            }
        }
        nccl::group_start().map_err(|e| nccl_err("group start", e))?;
        for (s, b) in self.ranks.iter().enumerate() {
            let gpu = &world.rank(s).gpu;
            gpu.bind()?;
            let stream = gpu.cu_stream() as nccl_sys::cudaStream_t;
            let (mut so, mut ro) = (0usize, 0usize);
            for d in 0..r {
                let (sn, rn) = (
                    b.send_counts[d] * self.row_bytes,
                    b.recv_counts[d] * self.row_bytes,
                );
                // SAFETY: ranges inside this rank's send/recv buffers; counts agree pairwise.
                unsafe {
                    nccl::send(
                        (b.send.ptr() + so as u64) as *const _,
                        sn,
                        nccl_sys::ncclDataType_t::ncclUint8,
                        d as i32,
                        self.comms[s],
                        stream,
                    )
                    .map_err(|e| nccl_err("send", e))?;
                    nccl::recv(
                        (b.recv.ptr() + ro as u64) as *mut _,
                        rn,
                        nccl_sys::ncclDataType_t::ncclUint8,
                        d as i32,
                        self.comms[s],
                        stream,
                    )
                    .map_err(|e| nccl_err("recv", e))?;
                }
                so += sn;
                ro += rn;
            }
        }
        nccl::group_end().map_err(|e| nccl_err("group end", e))?;
        if permute {
            for (s, b) in self.ranks.iter().enumerate() {
                self.gather(world, s, b.recv.ptr(), &b.out, &b.recv_index, b.n_out)?;
            }
        }
        Ok(())
    }

    /// One permute on rank `s`: row i of `dst` is row `index[i]` of `src` (zero where −1).
    fn gather(
        &self,
        world: &EpWorld,
        s: usize,
        src: u64,
        dst: &DeviceBuffer,
        index: &DeviceBuffer,
        rows: usize,
    ) -> Result<(), EpError> {
        let p = GatherParams {
            src,
            dst: dst.ptr(),
            index: index.ptr(),
            rows: rows as i32,
            row_bytes: self.row_bytes as i32,
        };
        let config = LaunchConfig::new(self.grid, THREADS);
        Ok(world.rank(s).gpu.launch(&world.gather[s], &config, &p)?)
    }

    /// Rank `s`'s permuted output (for checking the baseline against the reference).
    pub fn output(&self, s: usize) -> Result<Vec<u8>, EpError> {
        let mut out = vec![0u8; self.ranks[s].n_out * self.row_bytes];
        self.ranks[s].out.download_into(0, &mut out)?;
        Ok(out)
    }
}

impl Drop for NcclBaseline {
    fn drop(&mut self) {
        for &c in &self.comms {
            // SAFETY: each communicator came from comm_init_all and is destroyed once.
            unsafe {
                let _ = nccl::comm_destroy(c);
            }
        }
    }
}
