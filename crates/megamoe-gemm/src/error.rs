//! Errors of the grouped GEMM: each names the argument or the step that failed.

#[derive(Debug, thiserror::Error)]
pub enum GemmError {
    #[error("argument `{arg}`: {reason}")]
    Shape { arg: &'static str, reason: String },
    #[error("CUDA library `{lib}` could not be loaded")]
    LibraryMissing { lib: &'static str },
    #[error("CUDA driver call failed in {step}: {source}")]
    Driver {
        step: &'static str,
        source: cudarc::driver::DriverError,
    },
    #[error("NVRTC could not compile `{kernel}`:\n{log}")]
    Compile { kernel: String, log: String },
    #[error("device wait expired in `{kernel}`: {what}")]
    DeviceTimeout { kernel: String, what: String },
}

pub type Result<T> = std::result::Result<T, GemmError>;
