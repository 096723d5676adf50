//! The staging kernel of a call the host launches without reading its values
//! (`MoeLayer::launch_device`, src/device_io.rs; device/megamoe_layer/impls/stage.cuh), before
//! the fused kernel on the rank's stream: its first block reads the caller's `topk_idx` (i32 or
//! i64) and `topk_weights`, writes the layer's i32 ids and weights, masks every slot of a token
//! whose routing is bad (its output row is zero; no other token is touched) and records the first
//! bad slot in host-mapped memory, which the host reads without waiting for the device; its other
//! blocks copy the caller's e4m3 rows and scales into the rank's symmetric input region.

use std::sync::Arc;

use cudarc::driver::sys;
use megamoe_cuda::interface::{DeviceStruct, GeneratedHeader, Item};
use megamoe_cuda::{jit, Gpu, Kernel, KernelSpec, LaunchConfig};

use crate::error::Result;

megamoe_cuda::device_struct! {
    #[device(namespace = "megamoe::layer")]
    /// The staging kernel's one parameter struct.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct StageParams {
        /// The caller's `[T, K]`, i64 when `idx64` else i32.
        pub topk_idx: u64,
        /// The caller's f32 `[T, K]`.
        pub topk_weights: u64,
        /// The layer's i32 `[T, K]`.
        pub out_idx: u64,
        /// The layer's f32 `[T, K]`.
        pub out_weights: u64,
        /// The RouteFault record, host-mapped (its device address).
        pub fault: u64,
        /// The caller's e4m3 rows `[T, H]` and f32 scales `[T, H/128]`, or 0 (rows already in
        /// place, or bf16 rows the quantizer writes there).
        pub x: u64,
        pub x_scales: u64,
        /// The symmetric input region's rows and scales.
        pub out_x: u64,
        pub out_x_scales: u64,
        /// T · H, the rows' bytes (a multiple of 16; 0: no copy).
        pub x_bytes: u64,
        pub tokens: i32,
        pub topk: i32,
        pub experts: i32,
        pub idx64: i32,
    }
}

megamoe_cuda::device_struct! {
    #[device(namespace = "megamoe::layer")]
    /// The record the kernel leaves in host-mapped memory: `code` last, after the rest is
    /// visible (the host reads it first).
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct RouteFault {
        /// 0: none pending; else a `ROUTE_*` code (device: `RouteFaultCode`).
        pub code: u32,
        pub row: i32,
        pub slot: i32,
        /// For an expert named twice: the slot that named it first.
        pub first: i32,
        /// The expert id, or the weight's f32 bits.
        pub value: i64,
    }
}

/// An expert id outside [-1, E).
pub const ROUTE_EXPERT_OUT_OF_RANGE: u32 = 1;
/// An expert named twice in a token's row.
pub const ROUTE_EXPERT_TWICE: u32 = 2;
/// A routed slot's weight is not finite.
pub const ROUTE_WEIGHT_NOT_FINITE: u32 = 3;

pub const STAGE_THREADS: u32 = 1024;

/// The device header generated from this module's declarations.
pub(crate) fn generated_header() -> GeneratedHeader {
    GeneratedHeader {
        path: "megamoe_layer/impls/stage_params.cuh",
        source: file!(),
        about: &[
            " The staging kernel's parameters and its record of a bad routing (impls/stage.cuh).",
        ],
        includes: &[],
        namespace: "megamoe::layer",
        preamble: &[],
        items: vec![
            Item::constant(" Threads per block.", "kStageThreads", "u32", STAGE_THREADS),
            RouteFault::declaration(),
            Item::enumeration(
                " RouteFault::code.",
                "RouteFaultCode",
                "u32",
                &[
                    ("kExpertOutOfRange", ROUTE_EXPERT_OUT_OF_RANGE.into()),
                    ("kExpertTwice", ROUTE_EXPERT_TWICE.into()),
                    ("kWeightNotFinite", ROUTE_WEIGHT_NOT_FINITE.into()),
                ],
            ),
            StageParams::declaration(),
        ],
    }
}

impl RouteFault {
    /// The fault as the error of the argument it names (the layer's `topk_idx` or
    /// `topk_weights`), with `experts` the layer's E.
    pub fn to_error(self, experts: usize) -> megamoe_core::Error {
        use megamoe_core::Error;
        let (row, slot) = (self.row as usize, self.slot as usize);
        match self.code {
            ROUTE_EXPERT_OUT_OF_RANGE => Error::ExpertOutOfRange {
                arg: "topk_idx",
                row,
                slot,
                value: self.value,
                experts,
            },
            ROUTE_EXPERT_TWICE => Error::DuplicateExpert {
                arg: "topk_idx",
                row,
                expert: self.value as usize,
                first: self.first as usize,
                second: slot,
            },
            _ => Error::Value {
                arg: "topk_weights",
                value: f32::from_bits(self.value as u32).to_string(),
                reason: format!(
                    "row {row} slot {slot} is a routed slot and its weight is not finite"
                ),
            },
        }
    }
}

pub fn stage_spec() -> KernelSpec {
    let name = "layer_stage".to_string();
    let source = format!(
        "#include <megamoe_layer/impls/stage.cuh>\n\
         extern \"C\" __global__ void __launch_bounds__({STAGE_THREADS}, 1)\n\
         {name}(const __grid_constant__ megamoe::layer::StageParams p) {{\n\
         \x20   megamoe::layer::stage_call(p);\n\
         }}\n",
    );
    KernelSpec {
        name: name.clone(),
        entry: name,
        source,
        headers: vec![crate::kernel::HEADERS],
        options: vec![],
    }
}

/// The staging of one rank: its kernel and its fault record.
pub(crate) struct Stager {
    kernel: Arc<Kernel>,
    faults: RouteFaults,
}

impl Stager {
    pub(crate) fn new(gpu: &Gpu) -> Result<Stager> {
        let compiled = jit::compile(&stage_spec())?;
        Ok(Stager {
            kernel: Arc::new(gpu.load(&compiled)?),
            faults: RouteFaults::new(gpu)?,
        })
    }

    /// Queues the staging of `p` (its `fault` filled here) on `gpu`'s stream, as a programmatic
    /// dependent launch (it waits for the kernel before it before touching memory): one block
    /// for the routing, and up to one per SM for the rows.
    pub(crate) fn launch(&self, gpu: &Gpu, mut p: StageParams) -> Result<()> {
        p.fault = self.faults.device;
        let per_block = STAGE_THREADS as u64 * 16;
        let copiers = p
            .x_bytes
            .div_ceil(per_block)
            .min(gpu.props().sm_count as u64);
        let config = LaunchConfig::new(1 + copiers as u32, STAGE_THREADS).with_pdl(true);
        Ok(gpu.launch(&self.kernel, &config, &p)?)
    }

    /// The fault recorded since the last take, if any, cleared (the device may record again).
    pub(crate) fn take(&self) -> Option<RouteFault> {
        self.faults.take()
    }
}

/// One [`RouteFault`] in page-locked host memory mapped into the device's address space.
struct RouteFaults {
    host: *mut RouteFault,
    device: u64,
}

// SAFETY: the memory is owned by this value alone and freed once, on drop; the device writes it
// only through the kernel, which the host orders by reading `code` first (take).
unsafe impl Send for RouteFaults {}

impl RouteFaults {
    fn new(gpu: &Gpu) -> Result<RouteFaults> {
        gpu.bind()?;
        let bytes = std::mem::size_of::<RouteFault>();
        let mut host = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: the context is current; writes one pointer.
        unsafe { sys::cuMemHostAlloc(&mut host, bytes, flags).result() }
            .map_err(megamoe_cuda::Error::from)?;
        let host = host.cast::<RouteFault>();
        // SAFETY: `host` is a fresh allocation of one RouteFault.
        unsafe { host.write_volatile(RouteFault::default()) };
        // Owned (freed on drop) before the next call can fail.
        let mut faults = RouteFaults { host, device: 0 };
        // SAFETY: `host` was allocated with DEVICEMAP in this context.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut faults.device, host.cast(), 0).result() }
            .map_err(megamoe_cuda::Error::from)?;
        Ok(faults)
    }

    fn take(&self) -> Option<RouteFault> {
        // SAFETY: a live allocation of one RouteFault; the device writes `code` last, after a
        // system fence, so once it reads non-zero the other fields are complete.
        unsafe {
            let code = std::ptr::addr_of!((*self.host).code).read_volatile();
            if code == 0 {
                return None;
            }
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            let fault = self.host.read_volatile();
            std::ptr::addr_of_mut!((*self.host).code).write_volatile(0);
            Some(fault)
        }
    }
}

impl Drop for RouteFaults {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc, freed once.
        let _ = unsafe { sys::cuMemFreeHost(self.host.cast()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_fault_names_its_argument() {
        let fault = |code, value| RouteFault {
            code,
            row: 3,
            slot: 2,
            first: 1,
            value,
        };
        let out = fault(1, 99).to_error(16).to_string();
        assert!(out.contains("`topk_idx`[3][2] = 99"), "{out}");
        let twice = fault(2, 7).to_error(16).to_string();
        assert!(
            twice.contains("`topk_idx` row 3 names expert 7 twice (slots 1 and 2)"),
            "{twice}"
        );
        let nan = fault(3, f32::NAN.to_bits() as i64).to_error(16).to_string();
        assert!(nan.starts_with("`topk_weights` = NaN"), "{nan}");
    }
}
