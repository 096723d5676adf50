//! The native module of the `megamoe` Python package, imported as `megamoe._megamoe` and
//! re-exported by `python/megamoe/__init__.py`.
//!
//! The size query ([`api::buffer_size`]), the presets, the GPU probe and the CPU reference
//! ([`api`]), the GPU layer ([`layer`]) and the grouped GEMM ([`gemm`]) on device tensors, each
//! tensor checked by [`tensor`]. The work is plain Rust, tested without an interpreter;
//! `src/python.rs` and each module's `bindings` convert to and from Python.
//! Errors: [`error::Error`], a `ValueError` for bad input, a `RuntimeError` for the device.

pub mod api;
pub mod ep;
pub mod error;
pub mod gemm;
pub mod layer;
pub mod tensor;
// Left out of the unit tests, which then need no libpython to run.
#[cfg(not(test))]
mod python;
