//! The path Megatron's alltoall dispatcher takes, as the benchmark's baseline: a local permute
//! that copies each token once per slot grouped by expert (so by destination rank), NCCL
//! all-to-all-v (grouped send/recv), and a second permute that regroups the received
//! (source, expert) chunks by local expert into the same padded layout as ours. The index lists
//! are built on the host from the plan (not timed; Megatron derives them on the device).

use cudarc::nccl::{result as nccl, sys as nccl_sys};

use crate::error::EpError;
use crate::gpu::DevBuf;
use crate::params::GatherParams;
use crate::plan::PermutePlan;
use crate::world::EpWorld;

struct BaselineRank {
    send: DevBuf,
    recv: DevBuf,
    out: DevBuf,
    send_index: DevBuf,
    recv_index: DevBuf,
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

fn nccl_err(what: &str, e: nccl::NcclError) -> EpError {
    EpError::Cuda(format!("NCCL {what}: {e:?}"))
}

impl NcclBaseline {
    /// Needs one rank per GPU (NCCL has no virtual ranks). `idx[r]` is rank r's topk_idx.
    pub fn new(
        world: &EpWorld,
        plan: &PermutePlan,
        idx: &[Vec<i32>],
        row_bytes: usize,
    ) -> Result<Self, EpError> {
        let r = world.ranks();
        if world.physical_gpus() != r {
            return Err(EpError::NoGpu(format!(
                "the NCCL baseline needs {r} GPUs, {} present",
                world.physical_gpus()
            )));
        }
        megamoe_cuda::probe::nccl().map_err(|e| EpError::NoGpu(e.to_string()))?;
        let (k, e_all, el) = (plan.topk, plan.experts, plan.local_experts());
        let mut ranks = Vec::with_capacity(r);
        for s in 0..r {
            let gpu = world.gpu_of(s);
            // Source side: (expert, token) order of every valid slot.
            let mut slots: Vec<(i32, usize)> = (0..plan.tokens[s] * k)
                .filter(|&i| idx[s][i] >= 0)
                .map(|i| (idx[s][i], i / k))
                .collect();
            slots.sort_unstable();
            let send_index: Vec<i32> = slots.iter().map(|&(_, t)| t as i32).collect();
            let mut send_counts = vec![0usize; r];
            for &(e, _) in &slots {
                send_counts[e as usize / el] += 1;
            }
            let recv_counts: Vec<usize> = (0..r)
                .map(|src| {
                    (s * el..(s + 1) * el)
                        .map(|e| plan.counts[src * e_all + e] as usize)
                        .sum()
                })
                .collect();
            // Receiver side: output row -> row of the received buffer (sources back to back, each
            // in (expert, token) order), −1 for padding.
            let n_out = plan.rows_per_rank[s];
            let mut recv_index = vec![-1i32; n_out];
            let mut chunk = 0usize;
            for (src, src_idx) in idx.iter().enumerate() {
                let mut expert_start = vec![0usize; el];
                let mut acc = chunk;
                for (j, start) in expert_start.iter_mut().enumerate() {
                    *start = acc;
                    acc += plan.counts[src * e_all + s * el + j] as usize;
                }
                for t in 0..plan.tokens[src] {
                    for kk in 0..k {
                        if let Some((d, row)) = plan.dest(src, src_idx, t, kk) {
                            if d == s {
                                let e = src_idx[t * k + kk] as usize - s * el;
                                recv_index[row] =
                                    (expert_start[e] + plan.pos[src][t * k + kk] as usize) as i32;
                            }
                        }
                    }
                }
                chunk = acc;
            }
            let n_send = send_index.len();
            let n_recv: usize = recv_counts.iter().sum();
            let sb = DevBuf::new(gpu, send_index.len() * 4)?;
            sb.upload(0, &send_index)?;
            let rb = DevBuf::new(gpu, recv_index.len() * 4)?;
            rb.upload(0, &recv_index)?;
            ranks.push(BaselineRank {
                send: DevBuf::new(gpu, n_send * row_bytes)?,
                recv: DevBuf::new(gpu, n_recv * row_bytes)?,
                out: DevBuf::new(gpu, n_out * row_bytes)?,
                send_index: sb,
                recv_index: rb,
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
        let grid = world.gpu_of(0).multiprocessors as u32;
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
                let p = GatherParams {
                    src: world.ptrs(s).x,
                    dst: b.send.ptr,
                    index: b.send_index.ptr,
                    rows: b.n_send as i32,
                    row_bytes: self.row_bytes as i32,
                };
                // SAFETY: the kernel takes exactly this parameter struct; its addresses are live buffers.
                unsafe {
                    world
                        .stream(s)
                        .launch(world.gpu_of(s).gather, self.grid, 512, &p)
                }?;
            }
        }
        nccl::group_start().map_err(|e| nccl_err("group start", e))?;
        for (s, b) in self.ranks.iter().enumerate() {
            world.gpu_of(s).bind()?;
            let stream = world.stream(s).raw as nccl_sys::cudaStream_t;
            let (mut so, mut ro) = (0usize, 0usize);
            for d in 0..r {
                let (sn, rn) = (
                    b.send_counts[d] * self.row_bytes,
                    b.recv_counts[d] * self.row_bytes,
                );
                // SAFETY: ranges inside this rank's send/recv buffers; counts agree pairwise.
                unsafe {
                    nccl::send(
                        (b.send.ptr + so as u64) as *const _,
                        sn,
                        nccl_sys::ncclDataType_t::ncclUint8,
                        d as i32,
                        self.comms[s],
                        stream,
                    )
                    .map_err(|e| nccl_err("send", e))?;
                    nccl::recv(
                        (b.recv.ptr + ro as u64) as *mut _,
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
                let p = GatherParams {
                    src: b.recv.ptr,
                    dst: b.out.ptr,
                    index: b.recv_index.ptr,
                    rows: b.n_out as i32,
                    row_bytes: self.row_bytes as i32,
                };
                // SAFETY: the kernel takes exactly this parameter struct; its addresses are live buffers.
                unsafe {
                    world
                        .stream(s)
                        .launch(world.gpu_of(s).gather, self.grid, 512, &p)
                }?;
            }
        }
        Ok(())
    }

    /// Rank `s`'s permuted output (for checking the baseline against the reference).
    pub fn output(&self, s: usize) -> Result<Vec<u8>, EpError> {
        self.ranks[s]
            .out
            .download(0, self.ranks[s].n_out * self.row_bytes)
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
