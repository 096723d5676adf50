//! The tensor arguments of the world's calls: each torch tensor's metadata, checked against
//! what the call needs before anything is copied or launched.

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

impl TensorArg {
    /// Checks dtype, device, contiguity and shape (`None` dims are free); `arg` names the
    /// tensor in the error (`x[1]`).
    pub fn check(
        &self,
        arg: &str,
        dtypes: &[&str],
        shape: &[Option<usize>],
        device: usize,
    ) -> Result<()> {
        let bad = |reason: String| Err(Error::Value(format!("{arg}: {reason}")));
        if !dtypes.contains(&self.dtype.as_str()) {
            return bad(format!(
                "dtype {} where {} is needed",
                self.dtype,
                dtypes.join(" or ")
            ));
        }
        if self.cuda_device != Some(device) {
            let on = self
                .cuda_device
                .map_or("not on a CUDA device".into(), |d| format!("on cuda:{d}"));
            return bad(format!("{on}, expected cuda:{device} (the rank's GPU)"));
        }
        let want: Vec<String> = shape
            .iter()
            .map(|d| d.map_or("*".into(), |d| d.to_string()))
            .collect();
        let fits = self.shape.len() == shape.len()
            && self
                .shape
                .iter()
                .zip(shape)
                .all(|(&got, want)| got >= 0 && want.is_none_or(|w| got as usize == w));
        if !fits {
            return bad(format!(
                "shape {:?}, expected [{}]",
                self.shape,
                want.join(", ")
            ));
        }
        if !self.contiguous {
            return bad("is not contiguous (call .contiguous() first)".into());
        }
        Ok(())
    }

    /// The first dimension (after [`Self::check`]).
    pub fn rows(&self) -> usize {
        self.shape[0] as usize
    }
}

/// One tensor per rank, or an error naming the list.
pub(super) fn per_rank<'a>(
    arg: &str,
    tensors: &'a [TensorArg],
    ranks: usize,
) -> Result<&'a [TensorArg]> {
    if tensors.len() != ranks {
        return Err(Error::Value(format!(
            "{arg}: {} tensors for {ranks} ranks (one per rank)",
            tensors.len()
        )));
    }
    Ok(tensors)
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
        assert!(err(t(F32, &[3, 256])).starts_with("x[1]: dtype torch.float32"));
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
}
