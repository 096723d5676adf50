//! This crate's kernels: their params structs, declared here (device/megamoe/impls/params.cuh
//! is generated from them: [`generated_header`]), and their configurations.
//!
//! Registry hook: every crate with kernels exposes `pub fn kernel_specs() -> Vec<KernelSpec>`
//! listing every configuration it may compile at run time; its compile test calls
//! [`crate::jit::assert_compiles_clean`] on that list, and `megamoe selftest` compiles all
//! lists. [`kernel_specs`] is this crate's.

use crate::interface::{DeviceStruct, GeneratedHeader, Item};
use crate::jit::KernelSpec;
use crate::tma::TensorMap;

/// A translation unit that includes `header` and defines `extern "C" __global__ entry` calling
/// `megamoe::impls::body(p)` with one `const __grid_constant__` params struct.
fn unit(name: &str, header: &str, params: &str, body: &str, threads: u32) -> KernelSpec {
    KernelSpec {
        name: name.to_string(),
        entry: name.to_string(),
        source: format!(
            "#include <megamoe/impls/{header}>\n\
             extern \"C\" __global__ void __launch_bounds__({threads}) \
             {name}(const __grid_constant__ megamoe::impls::{params} p) {{\n  \
             megamoe::impls::{body}(p);\n}}\n"
        ),
        headers: vec![],
        options: vec![],
    }
}

crate::device_struct! {
    #[device(namespace = "megamoe::impls")]
    /// bf16 -> e4m3 per-128 quantization (impls/quant_e4m3.cuh).
    #[repr(C)]
    #[derive(Debug, Clone, Copy)]
    pub struct QuantParams {
        /// bf16 `[rows, cols]`.
        pub x: u64,
        /// e4m3 `[rows, cols]`.
        pub q: u64,
        /// f32 `[rows, cols / 128]`.
        pub sf: u64,
        pub rows: u32,
        /// A multiple of 128.
        pub cols: u32,
    }
}

/// Threads per block of the quantizer.
pub const QUANT_THREADS: u32 = 256;
/// 128-column blocks per half-warp (loads in flight per thread) of every compiled quantizer.
pub const QUANT_BLOCKS_PER_HALF_WARP: [u32; 3] = [1, 2, 4];

/// One quantizer configuration: the kernel's blocks per half-warp, and the grid: one thread
/// block per piece of work (`ctas_per_sm == 0`) or a persistent grid of `ctas_per_sm` blocks per
/// SM. Written `b2` or `b2p8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantConfig {
    pub blocks_per_half_warp: u32,
    pub ctas_per_sm: u32,
}

impl QuantConfig {
    /// The fastest measured at T = 8192, H = 7168 (docs/PERF.md).
    pub const DEFAULT: QuantConfig = QuantConfig {
        blocks_per_half_warp: 2,
        ctas_per_sm: 0,
    };
}

impl std::fmt::Display for QuantConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "b{}", self.blocks_per_half_warp)?;
        if self.ctas_per_sm > 0 {
            write!(f, "p{}", self.ctas_per_sm)?;
        }
        Ok(())
    }
}

impl std::str::FromStr for QuantConfig {
    type Err = crate::Error;

    fn from_str(s: &str) -> crate::Result<Self> {
        let invalid = || crate::Error::Invalid {
            arg: "quant config",
            reason: format!("`{s}` is not b<1|2|4> or b<1|2|4>p<ctas per SM>"),
        };
        let rest = s.strip_prefix('b').ok_or_else(invalid)?;
        let (b, p) = rest.split_once('p').unwrap_or((rest, "0"));
        let config = QuantConfig {
            blocks_per_half_warp: b.parse().map_err(|_| invalid())?,
            ctas_per_sm: p.parse().map_err(|_| invalid())?,
        };
        if !QUANT_BLOCKS_PER_HALF_WARP.contains(&config.blocks_per_half_warp) {
            return Err(invalid());
        }
        Ok(config)
    }
}

pub fn quant_e4m3(blocks_per_half_warp: u32) -> KernelSpec {
    let b = blocks_per_half_warp;
    unit(
        &format!("quant_e4m3_b{b}"),
        "quant_e4m3.cuh",
        "QuantParams",
        &format!("quant_e4m3<{b}>"),
        QUANT_THREADS,
    )
}

crate::device_struct! {
    #[device(namespace = "megamoe::impls")]
    /// The NVLink copy (impls/nvlink_copy.cuh).
    #[repr(C)]
    #[derive(Debug, Clone, Copy)]
    pub struct CopyParams {
        pub dst: u64,
        pub src: u64,
        /// A multiple of 16.
        pub bytes: u64,
    }
}

pub const COPY_THREADS: u32 = 512;

pub fn nvlink_copy() -> KernelSpec {
    unit(
        "nvlink_copy_u4",
        "nvlink_copy.cuh",
        "CopyParams",
        "copy_v4<4>",
        COPY_THREADS,
    )
}

crate::device_struct! {
    #[device(namespace = "megamoe::impls")]
    /// The rank barrier kernel (impls/rank_barrier.cuh).
    #[repr(C)]
    #[derive(Debug, Clone, Copy)]
    pub struct RankBarrierParams {
        /// Device address of the peer pointer table (`world` u64 addresses).
        pub peer_signals: u64,
        /// This rank's `WaitRecord`.
        pub record: u64,
        pub epoch: u64,
        pub timeout_ns: u64,
        pub rank: u32,
        pub world: u32,
    }
}

pub fn rank_barrier() -> KernelSpec {
    unit(
        "rank_barrier",
        "rank_barrier.cuh",
        "RankBarrierParams",
        "rank_barrier",
        32,
    )
}

crate::device_struct! {
    #[device(namespace = "megamoe::impls")]
    /// The launch path's check (impls/launch_check.cuh).
    #[repr(C)]
    #[derive(Debug, Clone, Copy)]
    pub struct LaunchCheckParams {
        /// u32 `[gridDim.x, 3]`: last shared word, cluster rank, cluster size.
        pub out: u64,
        /// Dynamic shared memory in u32 words.
        pub smem_words: u32,
        pub pad: u32,
    }
}

pub fn launch_check() -> KernelSpec {
    unit(
        "launch_check",
        "launch_check.cuh",
        "LaunchCheckParams",
        "launch_check",
        256,
    )
}

crate::device_struct! {
    #[device(namespace = "megamoe::impls")]
    /// The TMA tile load's check (impls/launch_check.cuh); the tile is
    /// `TMA_TILE_ROWS x TMA_TILE_COLS` u32.
    #[repr(C)]
    #[derive(Debug, Clone, Copy)]
    pub struct TmaCheckParams {
        pub map: TensorMap,
        /// u32 `[TMA_TILE_ROWS, TMA_TILE_COLS]`.
        pub out: u64,
        /// This rank's `WaitRecord`.
        pub record: u64,
        pub timeout_ns: u64,
        pub x: i32,
        pub y: i32,
    }
}
pub const TMA_TILE_ROWS: u32 = 16;
pub const TMA_TILE_COLS: u32 = 32;

pub fn tma_check() -> KernelSpec {
    unit(
        "tma_check",
        "launch_check.cuh",
        "TmaCheckParams",
        "tma_check",
        128,
    )
}

/// The device header generated from this module's declarations.
pub fn generated_header() -> GeneratedHeader {
    GeneratedHeader {
        path: "megamoe/impls/params.cuh",
        source: file!(),
        about: &[" The parameters of this crate's kernels (impls/)."],
        includes: &["megamoe/ptx/tma.cuh"],
        namespace: "megamoe::impls",
        preamble: &[],
        items: vec![
            QuantParams::declaration(),
            CopyParams::declaration(),
            RankBarrierParams::declaration(),
            LaunchCheckParams::declaration(),
            Item::constant(
                " The TMA check's tile: rows and u32 columns.",
                "kTileRows",
                "u32",
                TMA_TILE_ROWS,
            ),
            Item::constant("", "kTileCols", "u32", TMA_TILE_COLS),
            TmaCheckParams::declaration(),
        ],
    }
}

/// Every configuration this crate compiles.
pub fn kernel_specs() -> Vec<KernelSpec> {
    let mut specs: Vec<KernelSpec> = QUANT_BLOCKS_PER_HALF_WARP.map(quant_e4m3).into();
    specs.extend([nvlink_copy(), rank_barrier(), launch_check(), tma_check()]);
    specs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_headers_are_current() {
        crate::interface::check_headers(env!("CARGO_MANIFEST_DIR"), &[generated_header()]);
    }

    #[test]
    fn quant_config_parses_and_prints() {
        for text in ["b2", "b4p8", "b1p1"] {
            assert_eq!(text.parse::<QuantConfig>().unwrap().to_string(), text);
        }
        assert_eq!("b2p0".parse::<QuantConfig>().unwrap(), QuantConfig::DEFAULT);
        for bad in ["", "b3", "x2", "b2p", "b2px"] {
            assert!(bad.parse::<QuantConfig>().is_err(), "{bad}");
        }
    }
}
