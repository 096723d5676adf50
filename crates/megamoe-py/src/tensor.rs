//! The one checker of the torch tensors the native calls take (no libtorch link): each
//! tensor's metadata, read from the torch object, checked against what the call needs before
//! anything is copied or launched. Every failure is a ValueError whose message starts with the
//! argument's name.
//!
//! The rule: one of the call's dtypes, on the call's CUDA device, of its shape, and, for a
//! tensor a kernel reads or writes by address, contiguous with its data 16-byte aligned (the
//! kernels load and store 16-byte units, TMA included). The dispatch/combine calls
//! ([`crate::ep`]) check in Rust; the layer and GEMM calls of python/megamoe call the same
//! checks as `megamoe._megamoe.check_tensor`.

use crate::error::{Error, Result};

/// What a call needs to know of one torch tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorArg {
    pub ptr: u64,
    /// As torch prints it: "torch.bfloat16".
    pub dtype: String,
    pub shape: Vec<i64>,
    pub contiguous: bool,
    /// CUDA device index; None for a tensor elsewhere (the CPU).
    pub cuda_device: Option<usize>,
}

pub const BF16: &str = "torch.bfloat16";
pub const F32: &str = "torch.float32";
pub const I32: &str = "torch.int32";
/// e4m3 codes come as float8_e4m3fn, or as their raw bytes.
pub const FP8: [&str; 2] = ["torch.float8_e4m3fn", "torch.uint8"];

/// The alignment of every tensor a kernel takes by address.
pub const ALIGN: u64 = 16;

impl TensorArg {
    /// Checks a tensor a kernel takes by address: [`Self::check_shape`], then contiguity and
    /// alignment.
    pub fn check(
        &self,
        arg: &str,
        dtypes: &[&str],
        shape: &[Option<usize>],
        device: usize,
    ) -> Result<()> {
        self.check_shape(arg, dtypes, shape, device)?;
        if !self.contiguous {
            return Err(Error::Value(format!(
                "{arg}: is not contiguous (call .contiguous() first)"
            )));
        }
        if self.ptr % ALIGN != 0 {
            return Err(Error::Value(format!(
                "{arg}: its data must start {ALIGN}-byte aligned (address {:#x})",
                self.ptr
            )));
        }
        Ok(())
    }

    /// Checks dtype, device and shape (`None` dims are free); `arg` names the tensor in the
    /// error (`x[1]`). For a tensor torch reads itself; [`Self::check`] for one a kernel reads.
    pub fn check_shape(
        &self,
        arg: &str,
        dtypes: &[&str],
        shape: &[Option<usize>],
        device: usize,
    ) -> Result<()> {
        let bad = |reason: String| Err(Error::Value(format!("{arg}: {reason}")));
        if !dtypes.contains(&self.dtype.as_str()) {
            return bad(format!(
                "dtype {}, expected {}",
                self.dtype,
                dtypes.join(" or ")
            ));
        }
        if self.cuda_device != Some(device) {
            let on = self
                .cuda_device
                .map_or("not on a CUDA device".into(), |d| format!("on cuda:{d}"));
            return bad(format!("{on}, expected cuda:{device}"));
        }
        let fits = self.shape.len() == shape.len()
            && self
                .shape
                .iter()
                .zip(shape)
                .all(|(&got, want)| got >= 0 && want.is_none_or(|w| got as usize == w));
        if !fits {
            let want: Vec<String> = shape
                .iter()
                .map(|d| d.map_or("*".into(), |d| d.to_string()))
                .collect();
            return bad(format!(
                "shape {:?}, expected [{}]",
                self.shape,
                want.join(", ")
            ));
        }
        Ok(())
    }

    /// The first dimension (after [`Self::check`]).
    pub fn rows(&self) -> usize {
        self.shape[0] as usize
    }
}

#[cfg(not(test))]
pub(crate) mod bindings {
    //! Reading a torch tensor's metadata, and `check_tensor`, the checker python/megamoe calls.

    use pyo3::prelude::*;
    use pyo3::types::PyTuple;

    use super::TensorArg;
    use crate::error::Error;

    /// The name of `obj`'s Python type, for messages.
    pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
        obj.get_type().name().map_or("?".into(), |n| n.to_string())
    }

    /// A torch tensor's metadata; anything else is a ValueError naming `arg`.
    pub(crate) fn tensor(arg: &str, obj: &Bound<'_, PyAny>) -> PyResult<TensorArg> {
        let read = || -> PyResult<TensorArg> {
            // get_device(): the CUDA index, -1 off CUDA; cheaper than building `t.device`.
            let device: i64 = obj.call_method0("get_device")?.extract()?;
            Ok(TensorArg {
                ptr: obj.call_method0("data_ptr")?.extract()?,
                dtype: obj.getattr("dtype")?.str()?.to_string(),
                shape: obj.getattr("shape")?.extract()?,
                contiguous: obj.call_method0("is_contiguous")?.extract()?,
                cuda_device: usize::try_from(device).ok(),
            })
        };
        read().map_err(|_| {
            Error::Value(format!(
                "{arg}: expected a torch tensor, got {}",
                type_name(obj)
            ))
            .into()
        })
    }

    /// Checks torch tensor `tensor`, named `arg` in the error: one of `dtypes` (a torch dtype
    /// or a tuple of them), on CUDA device `device`, of `shape` (a tuple; None: any size in
    /// that dimension); with `by_address` (a kernel takes it by address) also contiguous and
    /// 16-byte aligned. Returns its data address. Raises ValueError starting with `arg`.
    #[pyfunction]
    #[pyo3(signature = (arg, tensor, dtypes, shape, device, by_address = true))]
    fn check_tensor(
        arg: &str,
        tensor: &Bound<'_, PyAny>,
        dtypes: &Bound<'_, PyAny>,
        shape: Vec<Option<usize>>,
        device: usize,
        by_address: bool,
    ) -> PyResult<u64> {
        let t = self::tensor(arg, tensor)?;
        let names: Vec<String> = match dtypes.cast::<PyTuple>() {
            Ok(tuple) => tuple
                .iter()
                .map(|d| Ok(d.str()?.to_string()))
                .collect::<PyResult<_>>()?,
            Err(_) => vec![dtypes.str()?.to_string()],
        };
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        if by_address {
            t.check(arg, &names, &shape, device)?;
        } else {
            t.check_shape(arg, &names, &shape, device)?;
        }
        Ok(t.ptr)
    }

    pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add_function(wrap_pyfunction!(check_tensor, m)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(dtype: &str, shape: &[i64]) -> TensorArg {
        TensorArg {
            ptr: 0x1000,
            dtype: dtype.into(),
            shape: shape.to_vec(),
            contiguous: true,
            cuda_device: Some(0),
        }
    }

    #[test]
    fn tensor_checks_name_the_argument_and_what_is_wrong() {
        let ok = t(BF16, &[3, 256]);
        assert!(ok.check("x[0]", &[BF16], &[None, Some(256)], 0).is_ok());
        let err = |a: TensorArg| match a.check("x[1]", &[BF16], &[None, Some(256)], 0) {
            Err(Error::Value(m)) => m,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            err(t(F32, &[3, 256])),
            "x[1]: dtype torch.float32, expected torch.bfloat16"
        );
        assert!(err(t(BF16, &[3, 128])).contains("expected [*, 256]"));
        assert!(err(t(BF16, &[256])).contains("shape"));
        let strided = TensorArg {
            contiguous: false,
            ..ok.clone()
        };
        assert!(err(strided).contains("not contiguous"));
        let cpu = TensorArg {
            cuda_device: None,
            ..ok.clone()
        };
        assert!(err(cpu).contains("not on a CUDA device"));
        let other_gpu = TensorArg {
            cuda_device: Some(1),
            ..ok
        };
        assert!(err(other_gpu).contains("on cuda:1, expected cuda:0"));
    }

    #[test]
    fn tensors_taken_by_address_must_be_16_byte_aligned_and_contiguous() {
        let shape = [None, Some(256)];
        for (ptr, aligned) in [
            (0x1000, true),
            (0x1010, true),
            (0x1008, false),
            (0x1002, false),
        ] {
            let a = TensorArg {
                ptr,
                ..t(BF16, &[3, 256])
            };
            let got = a.check("y", &[BF16], &shape, 0);
            assert_eq!(got.is_ok(), aligned, "{ptr:#x}: {got:?}");
            if !aligned {
                let Err(Error::Value(m)) = got else { panic!() };
                assert_eq!(
                    m,
                    format!("y: its data must start 16-byte aligned (address {ptr:#x})")
                );
            }
            // A tensor torch reads itself (not by address) needs neither.
            let view = TensorArg {
                contiguous: false,
                ..a
            };
            assert!(view.check_shape("y", &[BF16], &shape, 0).is_ok());
        }
    }
}
