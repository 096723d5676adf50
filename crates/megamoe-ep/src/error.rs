//! Errors of dispatch and combine.

use thiserror::Error;

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
    #[error("no usable GPU: {0}")]
    NoGpu(String),
    #[error("CUDA: {0}")]
    Cuda(String),
    #[error("rank {rank}: wait `{wait}` on rank {peer} passed its deadline (saw {seen}, expected {expected}); the buffer must be rebuilt")]
    Timeout {
        rank: usize,
        wait: &'static str,
        peer: usize,
        seen: u64,
        expected: u64,
    },
    #[error("rank {rank}: the dispatch needs {needed} rows but the caller's bound `row_bound` is {bound}; no rows were moved")]
    Overflow {
        rank: usize,
        needed: u64,
        bound: u64,
    },
}

impl EpError {
    pub fn input(rank: usize, source: megamoe_core::Error) -> Self {
        EpError::Input { rank, source }
    }
}
