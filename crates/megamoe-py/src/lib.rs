//! The native module of the `megamoe` Python package, imported as `megamoe._megamoe` and
//! re-exported by `python/megamoe/__init__.py`.
//!
//! This build has the parts that need no GPU: the size query ([`api::buffer_size`]), the
//! presets, the GPU probe and the CPU reference. The work is done in [`api`]
//! (plain Rust, tested without an interpreter); `src/python.rs` converts to and from Python.
//! Errors: [`error::Error`], a `ValueError` for bad input, a `RuntimeError` for the device.

pub mod api;
pub mod ep;
pub mod error;
// Left out of the unit tests, which then need no libpython to run.
#[cfg(not(test))]
mod python;
