//! The one error type of the GPU runtime. Every variant says what failed and where.

use std::path::PathBuf;
use thiserror::Error;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Error)]
pub enum Error {
    /// A shared library (libcuda, libnvrtc, libnccl) could not be loaded.
    #[error("{library} not found; looked in: {looked}. {hint}")]
    LibraryNotFound {
        library: &'static str,
        looked: String,
        hint: &'static str,
    },

    /// The library loaded but lacks a symbol this crate needs (too old a version).
    #[error("{library} at {path} lacks `{symbol}` (too old?)")]
    MissingSymbol {
        library: &'static str,
        path: String,
        symbol: &'static str,
    },

    #[error("no CUDA GPU is visible (cuDeviceGetCount returned 0)")]
    NoGpu,

    /// A CUDA driver call failed.
    #[error("CUDA driver call {call} failed: {message}")]
    Driver { call: &'static str, message: String },

    /// An NVRTC API call (not the compilation itself) failed.
    #[error("NVRTC call {call} failed: {message}")]
    Nvrtc { call: &'static str, message: String },

    /// NVRTC rejected a kernel's source.
    #[error("kernel `{kernel}` failed to compile:\n{log}")]
    Compile { kernel: String, log: String },

    /// The compiled kernel spills, uses a stack frame or local memory.
    #[error("kernel `{kernel}` is not clean: {reason}")]
    Unclean { kernel: String, reason: String },

    #[error("JIT cache {path}: {source}")]
    Cache {
        path: PathBuf,
        source: std::io::Error,
    },

    /// A bad argument to a host entry point, caught before anything is written.
    #[error("`{arg}`: {reason}")]
    Invalid { arg: &'static str, reason: String },

    /// A device-side wait ran past its deadline (SPEC §6).
    #[error(
        "rank {rank}: wait `{wait}` timed out after {deadline_ms} ms waiting for rank {peer}: \
         observed {observed}, expected {expected}"
    )]
    WaitTimeout {
        rank: usize,
        wait: &'static str,
        peer: usize,
        observed: u64,
        expected: u64,
        deadline_ms: u64,
    },

    /// This rank finished, but another rank failed, so the collective call failed (SPEC §6).
    #[error("rank {rank}: collective failed because rank {failed_rank} failed: {cause}")]
    PeerFailed {
        rank: usize,
        failed_rank: usize,
        cause: String,
    },

    /// The exchange of symmetric-buffer handles between the processes of a world failed: a
    /// peer that never joined, or what a peer sent does not fit (SPEC §6).
    #[error("rank {rank}: handle exchange: {reason}")]
    Exchange { rank: usize, reason: String },

    /// A rank's host thread panicked.
    #[error("rank {rank}: host thread panicked: {message}")]
    RankPanicked { rank: usize, message: String },
}

impl From<cudarc::driver::DriverError> for Error {
    fn from(e: cudarc::driver::DriverError) -> Self {
        Error::Driver {
            call: "cudarc",
            message: format!("{e:?}"),
        }
    }
}

/// Turns a raw driver status into a `Result`, naming the call.
pub(crate) fn check(call: &'static str, status: cudarc::driver::sys::CUresult) -> Result<()> {
    status.result().map_err(|e| Error::Driver {
        call,
        message: format!("{e:?}"),
    })
}
