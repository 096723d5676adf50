//! Errors of the grouped GEMM: each names the argument or the step that failed.

#[derive(Debug, thiserror::Error)]
pub enum GemmError {
    #[error("argument `{arg}`: {reason}")]
    Shape { arg: &'static str, reason: String },
    #[error(transparent)]
    Cuda(#[from] megamoe_cuda::Error),
    #[error("device wait expired in `{kernel}`: {what}")]
    DeviceTimeout { kernel: String, what: String },
}

pub type Result<T> = std::result::Result<T, GemmError>;
