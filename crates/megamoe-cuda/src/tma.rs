//! TMA tensor maps: encoded on the host with `cuTensorMapEncodeTiled`, embedded by value in a
//! kernel's params struct (the device side is `megamoe::ptx::TensorMap`).

use crate::device::Pod;
use crate::error::{check, Error, Result};
use crate::probe;
use cudarc::driver::sys;

/// An encoded `CUtensorMap`: 128 bytes, 64-byte aligned, as the hardware requires.
#[repr(C, align(64))]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TensorMap(pub [u64; 16]);
const _: () = assert!(std::mem::size_of::<TensorMap>() == 128);
const _: () = assert!(std::mem::align_of::<TensorMap>() == 64);
unsafe impl Pod for TensorMap {}

impl std::fmt::Debug for TensorMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TensorMap(..)")
    }
}

/// Element types a tensor map can describe (those megamoe uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TmaDtype {
    /// e4m3 bytes.
    U8,
    /// bf16.
    Bf16,
    U32,
    F32,
}

impl TmaDtype {
    pub fn bytes(self) -> u64 {
        match self {
            TmaDtype::U8 => 1,
            TmaDtype::Bf16 => 2,
            TmaDtype::U32 | TmaDtype::F32 => 4,
        }
    }

    fn raw(self) -> sys::CUtensorMapDataType {
        use sys::CUtensorMapDataType as D;
        match self {
            TmaDtype::U8 => D::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            TmaDtype::Bf16 => D::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            TmaDtype::U32 => D::CU_TENSOR_MAP_DATA_TYPE_UINT32,
            TmaDtype::F32 => D::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        }
    }
}

/// Shared-memory swizzle of the box; the inner box row must not exceed the swizzle span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Swizzle {
    None,
    B32,
    B64,
    B128,
}

impl Swizzle {
    fn span(self) -> Option<u64> {
        match self {
            Swizzle::None => None,
            Swizzle::B32 => Some(32),
            Swizzle::B64 => Some(64),
            Swizzle::B128 => Some(128),
        }
    }

    fn raw(self) -> sys::CUtensorMapSwizzle {
        use sys::CUtensorMapSwizzle as S;
        match self {
            Swizzle::None => S::CU_TENSOR_MAP_SWIZZLE_NONE,
            Swizzle::B32 => S::CU_TENSOR_MAP_SWIZZLE_32B,
            Swizzle::B64 => S::CU_TENSOR_MAP_SWIZZLE_64B,
            Swizzle::B128 => S::CU_TENSOR_MAP_SWIZZLE_128B,
        }
    }
}

/// What a tiled tensor map describes. Dimensions run innermost first (as in CUDA):
/// `dims[0]` is the contiguous one, `strides[i]` is the byte stride of dimension `i + 1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TiledMap<'a> {
    pub dtype: TmaDtype,
    pub address: u64,
    pub dims: &'a [u64],
    pub strides: &'a [u64],
    pub box_dims: &'a [u32],
    pub swizzle: Swizzle,
}

impl TiledMap<'_> {
    /// The driver's rules, checked here so that a bad map is an error naming the field.
    pub fn validate(&self) -> Result<()> {
        let invalid = |arg, reason: String| Err(Error::Invalid { arg, reason });
        let rank = self.dims.len();
        if !(1..=5).contains(&rank) {
            return invalid("dims", format!("rank {rank} is not 1..=5"));
        }
        if self.strides.len() != rank - 1 || self.box_dims.len() != rank {
            return invalid(
                "strides",
                format!(
                    "rank {rank} needs {} strides and {rank} box dims, got {} and {}",
                    rank - 1,
                    self.strides.len(),
                    self.box_dims.len()
                ),
            );
        }
        if self.address % 16 != 0 {
            return invalid(
                "address",
                format!("{:#x} is not 16-byte aligned", self.address),
            );
        }
        if let Some(s) = self.strides.iter().find(|&&s| s % 16 != 0 || s >= 1 << 40) {
            return invalid("strides", format!("{s} is not a multiple of 16 below 2^40"));
        }
        if let Some(d) = self.dims.iter().find(|&&d| d == 0 || d > 1 << 32) {
            return invalid("dims", format!("{d} is not in 1..=2^32"));
        }
        if let Some(b) = self.box_dims.iter().find(|&&b| b == 0 || b > 256) {
            return invalid("box_dims", format!("{b} is not in 1..=256"));
        }
        let inner = self.box_dims[0] as u64 * self.dtype.bytes();
        if inner % 16 != 0 {
            return invalid(
                "box_dims",
                format!("inner box row of {inner} bytes is not a multiple of 16"),
            );
        }
        if let Some(span) = self.swizzle.span() {
            if inner > span {
                return invalid(
                    "swizzle",
                    format!("inner box row of {inner} bytes exceeds the {span}-byte swizzle"),
                );
            }
        }
        Ok(())
    }

    /// Encodes the map (`cuTensorMapEncodeTiled`), out-of-bounds elements read as zero.
    pub fn encode(&self) -> Result<TensorMap> {
        self.validate()?;
        probe::libcuda()?;
        let mut map = TensorMap([0; 16]);
        let element_strides = vec![1u32; self.dims.len()];
        // SAFETY: every array has the rank's length (validated); `map` is a 64-byte aligned
        // 128-byte CUtensorMap.
        check("cuTensorMapEncodeTiled", unsafe {
            sys::cuTensorMapEncodeTiled(
                (&mut map as *mut TensorMap).cast(),
                self.dtype.raw(),
                self.dims.len() as u32,
                self.address as *mut std::ffi::c_void,
                self.dims.as_ptr(),
                self.strides.as_ptr(),
                self.box_dims.as_ptr(),
                element_strides.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                self.swizzle.raw(),
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        })?;
        Ok(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map<'a>(
        dims: &'a [u64],
        strides: &'a [u64],
        box_dims: &'a [u32],
        swizzle: Swizzle,
    ) -> TiledMap<'a> {
        TiledMap {
            dtype: TmaDtype::U8,
            address: 0x1000,
            dims,
            strides,
            box_dims,
            swizzle,
        }
    }

    fn arg(m: TiledMap) -> &'static str {
        match m.validate() {
            Err(Error::Invalid { arg, .. }) => arg,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn validation_names_the_field() {
        assert!(map(&[7168, 8192], &[7168], &[128, 64], Swizzle::B128)
            .validate()
            .is_ok());
        assert_eq!(
            arg(map(&[7168, 8192], &[7169], &[128, 64], Swizzle::B128)),
            "strides"
        );
        assert_eq!(
            arg(map(&[7168, 8192], &[7168], &[256, 64], Swizzle::B128)),
            "swizzle"
        );
        assert_eq!(
            arg(map(&[7168, 8192], &[7168], &[8, 64], Swizzle::None)),
            "box_dims"
        );
        assert_eq!(
            arg(map(&[7168, 8192], &[], &[128, 64], Swizzle::None)),
            "strides"
        );
        assert_eq!(arg(map(&[], &[], &[], Swizzle::None)), "dims");
        let unaligned = TiledMap {
            address: 0x1001,
            ..map(&[64], &[], &[64], Swizzle::None)
        };
        assert_eq!(arg(unaligned), "address");
    }
}
