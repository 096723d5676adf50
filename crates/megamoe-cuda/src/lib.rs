//! megamoe-cuda: the GPU runtime of megamoe.
//!
//! Library discovery, NVRTC compilation of header-only kernels to sm_90a CUBINs through a disk
//! cache, devices, buffers, launches, event timing and TMA tensor maps. Nothing here needs CUDA
//! at build time: libcuda and libnvrtc are found and loaded at run time ([`probe`]), and a
//! missing library is an [`Error::LibraryNotFound`], never a panic.
//!
//! # The API in one screen
//!
//! ```no_run
//! use megamoe_cuda::{jit, kernels, Gpu, LaunchConfig};
//! # fn main() -> megamoe_cuda::Result<()> {
//! let gpus = Gpu::all()?;                                   // Error::NoGpu if none
//! let gpu = &gpus[0];
//! let x = gpu.alloc_from(&vec![half::bf16::ONE; 4 * 256])?; // cuMemAlloc, peer-accessible
//! let q = gpu.alloc_zeroed(4 * 256)?;
//! let sf = gpu.alloc_zeroed(4 * 2 * 4)?;
//! let compiled = jit::compile(&kernels::quant_e4m3(2))?;    // NVRTC -> CUBIN, disk-cached
//! println!("{}", compiled.report);                          // registers, spills, smem...
//! let kernel = gpu.load(&compiled)?;
//! let params = kernels::QuantParams { x: x.ptr(), q: q.ptr(), sf: sf.ptr(), rows: 4, cols: 256 };
//! let timer = gpu.timer()?;
//! timer.start()?;
//! gpu.launch(&kernel, &LaunchConfig::new(1, 256), &params)?;
//! timer.stop()?;
//! println!("{} ms", timer.elapsed_ms()?);
//! let bytes: Vec<u8> = q.download()?;
//! # Ok(()) }
//! ```
//!
//! - [`Gpu`]: a device's primary context plus a stream of its own ([`Gpu::all`], [`Gpu::new`],
//!   [`Gpu::with_new_stream`] for a second stream on the same device; graph capture and replay).
//!   Buffers
//!   ([`DeviceBuffer`]: `upload`, `download`, `memset`, `ptr() -> u64`), peer access, copy-engine
//!   copies, module loading ([`Gpu::load`]) and [`Gpu::launch`].
//! - [`LaunchConfig`]: grid, block, dynamic shared memory (the function's limit is raised above
//!   48 KB automatically), cluster dimensions, programmatic dependent launch. Every launch goes
//!   through `cuLaunchKernelEx` with ONE `#[repr(C)]` params struct ([`Pod`]) passed by value:
//!   the kernel signature is `extern "C" __global__ void k(const __grid_constant__ Params p)`.
//! - [`jit`]: [`jit::KernelSpec`] (generated translation unit + entry + extra header sets +
//!   options) → [`jit::compile`] → [`jit::CompiledKernel`] (CUBIN, log, [`jit::PtxasReport`]).
//!   Other crates embed their device headers with [`header_set!`] and include this crate's as
//!   `#include <megamoe/ptx/memory.cuh>`. Registry hook: each crate exposes
//!   `kernel_specs() -> Vec<KernelSpec>`; its tests call [`jit::assert_compiles_clean`].
//! - [`TiledMap::encode`] → [`TensorMap`], 128 bytes aligned to 64, embedded in params.
//! - [`interface`]: the host/device interface declared once, in Rust: [`device_struct!`] params
//!   structs, constants and codes, from which every crate generates the headers its kernels
//!   include (a test per crate fails when one is stale).
//! - [`WaitRecord`]: what a device-side wait that ran past its deadline records, the one
//!   channel of expired waits of every crate, decoded into [`Error::WaitTimeout`]; each crate
//!   names its own waits ([`WaitNames`]; the runtime's are [`Wait`]).
//! - [`World`] of R ranks (R may exceed the GPU count: virtual ranks), one host thread per rank
//!   ([`World::run`], errors on every rank when one fails), [`SymmetricBuffer`]s with per-rank
//!   peer pointer tables, and [`Rank::barrier`], a device-side barrier with a deadline.
//! - [`Quantizer`]: bf16 → e4m3 per-128 quantization, bitwise equal to megamoe-core's
//!   `quant::quantize_rows`.
//! - With the `harness` feature (the command line turns it on): `bench`, the NVLink and
//!   quantization benchmarks, and `selftest`, the GPU checks `megamoe selftest` runs.
//!
//! The API is at the crate root; the modules that stay public are namespaces other crates use
//! by name: [`jit`], [`kernels`] (this crate's kernels and their params), [`wait`] (deadlines),
//! [`probe`] (finding the libraries) and [`interop`] (CUDA IPC handles).
//!
//! # Finding CUDA
//! See [`probe`]: `MEGAMOE_NVRTC_LIB`, `MEGAMOE_CUDA_HOME`, the system loader, the Python
//! environment's NVIDIA pip packages, a system toolkit, then the project-local `.toolchain/`
//! that `scripts/install-cuda-toolchain.sh` fills from PyPI.

#[cfg(feature = "harness")]
pub mod bench;
mod device;
mod error;
pub mod interface;
pub mod interop;
pub mod jit;
pub mod kernels;
mod nvrtc;
pub mod probe;
mod quant;
mod ranks;
mod rendezvous;
#[cfg(feature = "harness")]
pub mod selftest;
mod tma;
pub mod wait;

pub use device::{
    device_count, DeviceBuffer, Gpu, GpuProps, Graph, Kernel, LaunchConfig, Pod, Timer,
};
pub use error::{Error, Result};
pub use jit::{CompiledKernel, KernelSpec};
pub use quant::Quantizer;
pub use ranks::{check_rank, AllGather, Rank, SymmetricBuffer, World};
pub use rendezvous::FileRendezvous;
pub use tma::{Swizzle, TensorMap, TiledMap, TmaDtype};
pub use wait::{Wait, WaitNames, WaitRecord};
