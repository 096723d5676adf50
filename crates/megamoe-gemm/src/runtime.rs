//! The slice of a GPU runtime this crate needs: library probing, NVRTC to an sm_90a CUBIN with
//! the ptxas report, module loading, tensor-map encoding and cuLaunchKernelEx with one params
//! struct. Kept narrow so it can give way to the shared runtime crate.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys, Ptx};

use crate::error::{GemmError, Result};
use crate::heuristics::GemmConfig;
use crate::kernel::translation_unit;
use crate::params::TmaDesc;

fn library_present(lib: &'static str, load: impl FnOnce() + std::panic::UnwindSafe) -> Result<()> {
    // cudarc panics when it cannot dlopen a library; turn that into an error.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let found = std::panic::catch_unwind(load).is_ok();
    std::panic::set_hook(hook);
    if found {
        Ok(())
    } else {
        Err(GemmError::LibraryMissing { lib })
    }
}

/// Errors unless libnvrtc can be loaded.
pub fn probe_nvrtc() -> Result<()> {
    library_present("nvrtc", || unsafe {
        nvrtc_sys::culib();
    })
}

/// Errors unless libcuda can be loaded.
pub fn probe_driver() -> Result<()> {
    library_present("cuda", || unsafe {
        sys::culib();
    })
}

/// Resource use of one kernel as ptxas reported it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PtxasReport {
    pub registers: u32,
    pub stack_bytes: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
}

impl PtxasReport {
    /// Reads `--ptxas-options=-v` output.
    pub fn parse(log: &str) -> PtxasReport {
        let number_before = |line: &str, unit: &str| -> Option<u32> {
            let idx = line.find(unit)?;
            line[..idx].split_whitespace().last()?.parse().ok()
        };
        let mut r = PtxasReport::default();
        for line in log.lines() {
            if let Some(v) = number_before(line, " registers") {
                r.registers = v;
            }
            if let Some(v) = number_before(line, " bytes stack frame") {
                r.stack_bytes = v;
            }
            if let Some(v) = number_before(line, " bytes spill stores") {
                r.spill_stores = v;
            }
            if let Some(v) = number_before(line, " bytes spill loads") {
                r.spill_loads = v;
            }
        }
        r
    }

    pub fn spills(&self) -> bool {
        self.stack_bytes + self.spill_stores + self.spill_loads > 0
    }
}

/// An sm_90a CUBIN and its ptxas report.
pub struct Cubin {
    pub image: Vec<u8>,
    pub report: PtxasReport,
}

/// Compiles the instantiation of `config` with NVRTC (needs no GPU).
pub fn compile(config: &GemmConfig) -> Result<Cubin> {
    probe_nvrtc()?;
    let name = config.kernel_name();
    let fail = |log: String| GemmError::Compile {
        kernel: name.clone(),
        log,
    };
    let src = CString::new(translation_unit(config)).map_err(|e| fail(e.to_string()))?;
    let prog = nvrtc::create_program(&src, None).map_err(|e| fail(e.to_string()))?;
    let opts = [
        "--gpu-architecture=sm_90a",
        "-std=c++17",
        "--ptxas-options=-v",
        "-default-device",
    ];
    unsafe {
        let compiled = nvrtc::compile_program(prog, &opts);
        let log = nvrtc::get_program_log(prog)
            .map(|chars| {
                let bytes: Vec<u8> = chars.iter().map(|&c| c as u8).collect();
                String::from_utf8_lossy(&bytes).trim_end_matches('\0').to_string()
            })
            .unwrap_or_default();
        if compiled.is_err() {
            let _ = nvrtc::destroy_program(prog);
            return Err(fail(log));
        }
        let mut size = 0usize;
        let mut image = Vec::new();
        let got = nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size)
            .result()
            .and_then(|_| {
                image = vec![0u8; size];
                nvrtc_sys::nvrtcGetCUBIN(prog, image.as_mut_ptr() as *mut _).result()
            });
        let _ = nvrtc::destroy_program(prog);
        got.map_err(|e| fail(format!("{e}\n{log}")))?;
        Ok(Cubin {
            image,
            report: PtxasReport::parse(&log),
        })
    }
}

/// A loaded kernel.
pub struct Kernel {
    _module: Arc<CudaModule>,
    func: CudaFunction,
    pub report: PtxasReport,
}

/// One GPU: context, the stream every launch goes to, and the kernels loaded so far.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub sms: usize,
    kernels: Mutex<HashMap<GemmConfig, Arc<Kernel>>>,
}

fn driver(step: &'static str) -> impl Fn(cudarc::driver::DriverError) -> GemmError {
    move |source| GemmError::Driver { step, source }
}

impl Gpu {
    pub fn open(ordinal: usize) -> Result<Gpu> {
        probe_driver()?;
        let ctx = CudaContext::new(ordinal).map_err(driver("context creation"))?;
        // One stream, raw pointers: cudarc's cross-stream event tracking is not needed.
        unsafe { ctx.disable_event_tracking() };
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver("device query"))? as usize;
        let stream = ctx.default_stream();
        Ok(Gpu {
            ctx,
            stream,
            sms,
            kernels: Mutex::new(HashMap::new()),
        })
    }

    /// The kernel of `config`, compiled and loaded on first use.
    pub fn kernel(&self, config: &GemmConfig) -> Result<Arc<Kernel>> {
        if let Some(k) = self.kernels.lock().unwrap().get(config) {
            return Ok(k.clone());
        }
        let cubin = compile(config)?;
        let module = self
            .ctx
            .load_module(Ptx::from_binary(cubin.image))
            .map_err(driver("module load"))?;
        let func = module
            .load_function(&config.kernel_name())
            .map_err(driver("function lookup"))?;
        func.set_attribute(
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            config.smem_bytes() as i32,
        )
        .map_err(driver("shared memory attribute"))?;
        let kernel = Arc::new(Kernel {
            _module: module,
            func,
            report: cubin.report,
        });
        self.kernels
            .lock()
            .unwrap()
            .insert(*config, kernel.clone());
        Ok(kernel)
    }

    /// Launches `kernel(params)` on the stream (`__grid_constant__` params by value).
    pub fn launch<P: Copy>(
        &self,
        kernel: &Kernel,
        grid: u32,
        block: u32,
        smem: usize,
        params: &P,
    ) -> Result<()> {
        let mut params = *params;
        let mut args = [&mut params as *mut P as *mut c_void];
        let config = sys::CUlaunchConfig {
            gridDimX: grid,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: smem as u32,
            hStream: self.stream.cu_stream(),
            attrs: std::ptr::null_mut(),
            numAttrs: 0,
        };
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                kernel.func.cu_function(),
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
            .result()
            .map_err(driver("kernel launch"))
        }
    }
}

/// Element type of a tensor map.
#[derive(Clone, Copy, Debug)]
pub enum TmaElem {
    U8,
    Bf16,
    F32,
}

/// Encodes a 2-D tiled tensor map: `dims = [inner, outer]` elements, `row_bytes` between outer
/// rows, `tile = [inner, outer]` box, 128-byte swizzle or none. Out-of-bounds boxes read zeros.
pub fn encode_tma_2d(
    ptr: u64,
    elem: TmaElem,
    dims: [u64; 2],
    row_bytes: u64,
    tile: [u32; 2],
    swizzle_128b: bool,
) -> Result<TmaDesc> {
    use sys::*;
    let mut map = std::mem::MaybeUninit::<CUtensorMap>::zeroed();
    let dtype = match elem {
        TmaElem::U8 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        TmaElem::Bf16 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        TmaElem::F32 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
    };
    let strides = [row_bytes];
    let elem_strides = [1u32, 1];
    let swizzle = if swizzle_128b {
        CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B
    } else {
        CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE
    };
    unsafe {
        cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            dtype,
            2,
            ptr as *mut c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            tile.as_ptr(),
            elem_strides.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
        .result()
        .map_err(driver("tensor map encode"))?;
        Ok(TmaDesc(map.assume_init().opaque))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptxas_report_is_parsed() {
        let log = "ptxas info    : Function properties for k\n\
                   ptxas         .     8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
                   ptxas info    : Used 168 registers, used 1 barriers";
        let r = PtxasReport::parse(log);
        assert_eq!(
            r,
            PtxasReport {
                registers: 168,
                stack_bytes: 8,
                spill_stores: 4,
                spill_loads: 12
            }
        );
        assert!(r.spills());
    }
}
