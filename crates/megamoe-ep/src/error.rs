//! Errors of dispatch and combine.

use megamoe_cuda::WaitNames;
use thiserror::Error;

/// The names of the kernels' waits, one per signal kind (`Signal` in
/// device/megamoe_ep/params.cuh, in its order), numbered from `comm::kFirstWait`
/// (device/megamoe_ep/comm/sync.cuh).
pub const WAITS: WaitNames = WaitNames {
    first: 0x200,
    names: &[
        "dispatch ready",
        "dispatch done",
        "combine ready",
        "combine done",
    ],
};

#[derive(Debug, Error)]
pub enum EpError {
    /// Bad arguments, found before anything was sent (on the host, or by the device's
    /// validation pass that every rank checks before moving rows).
    #[error("rank {rank}: {source}")]
    Input {
        rank: usize,
        #[source]
        source: megamoe_core::Error,
    },
    /// The GPU runtime: no GPU or library, a failed driver call, or a device wait past its
    /// deadline ([`megamoe_cuda::Error::WaitTimeout`] names the rank, the wait and the peer;
    /// the world must then be rebuilt).
    #[error(transparent)]
    Runtime(#[from] megamoe_cuda::Error),
    #[error("rank {rank}: the dispatch needs {needed} rows but the caller's bound `row_bound` is {bound}; no rows were moved")]
    Overflow {
        rank: usize,
        needed: u64,
        bound: u64,
    },
    /// A rank published a count no routing gives (a corrupt count matrix): every rank that
    /// read it rejected the call before moving rows.
    #[error("rank {rank}: rank {peer} published {what} = {seen}, above {bound} (a corrupt count); {rejected} of {ranks} ranks rejected the call, no rows were moved")]
    BadCount {
        rank: usize,
        peer: usize,
        what: String,
        seen: u64,
        bound: u64,
        rejected: usize,
        ranks: usize,
    },
    /// The NCCL baseline of the benchmark.
    #[error("NCCL {call}: {message}")]
    Nccl { call: &'static str, message: String },
}

impl EpError {
    pub fn input(rank: usize, source: megamoe_core::Error) -> Self {
        EpError::Input { rank, source }
    }
}
