//! Errors of the layer: bad input (naming the rank and the argument, found before anything is
//! written), or what the crates below reported.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum LayerError {
    /// A bad argument of one rank, found on the host before anything was written.
    #[error("rank {rank}: {source}")]
    Input {
        rank: usize,
        #[source]
        source: megamoe_core::Error,
    },
    /// A bad argument of the whole call or of the layer's construction.
    #[error(transparent)]
    Spec(#[from] megamoe_core::Error),
    /// Dispatch or combine (a device wait past its deadline names the rank and the wait).
    #[error(transparent)]
    Ep(#[from] megamoe_ep::EpError),
    /// One of the expert GEMMs.
    #[error(transparent)]
    Gemm(#[from] megamoe_gemm::GemmError),
    /// A bad argument found on the device in a call the host queued without reading its values
    /// (a routing value: the token's row is zero; bounds that differ between ranks: no rank
    /// ran the call), reported by a later call or check; the layer stays usable.
    #[error("rank {rank}: {source} (found on the device)")]
    OnDevice {
        rank: usize,
        #[source]
        source: megamoe_core::Error,
    },
    /// A call every rank's kernel rejected on the device (for the fused kind, a plan that does
    /// not fit its ring); nothing was computed and the layer stays usable.
    #[error("rank {rank}: the call was rejected on the device: {reason}")]
    Rejected { rank: usize, reason: String },
    /// The GPU runtime: no GPU or library, a failed driver call.
    #[error(transparent)]
    Runtime(#[from] megamoe_cuda::Error),
}

impl LayerError {
    pub fn input(rank: usize, source: megamoe_core::Error) -> Self {
        LayerError::Input { rank, source }
    }
}

pub type Result<T> = std::result::Result<T, LayerError>;
