//! The FP8 grouped GEMM for Python (`megamoe.grouped_gemm_fp8_contiguous` and `_masked`,
//! python/megamoe/gemm.py): one launch of megamoe-gemm on device tensors. Python checks each
//! tensor's dtype, shape, device and layout and passes its address and the sizes; this file
//! checks the per-expert row counts, whose values the kernel trusts (they are read back to
//! the host first: E integers), and maps megamoe-gemm's errors to the Python arguments.

use megamoe_cuda::Gpu;
use megamoe_gemm::heuristics::Accumulation;
use megamoe_gemm::{choose, GemmError, GemmPointers, GemmProblem, GroupedGemm, Layout, OutDtype};

use crate::api::require_gpu;
use crate::error::{Error, Result};

/// The sizes of one call, from the tensors' shapes (lib.rs of megamoe-gemm has the layouts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmShape {
    pub experts: usize,
    pub n: usize,
    pub k: usize,
    /// Columns per activation scale: 128, or 64.
    pub group: usize,
    pub layout: Layout,
    /// Rows of `a` in the contiguous layout (ignored for masked).
    pub rows: usize,
    pub out: OutDtype,
    /// How the K loop sums (the `accumulation` keyword).
    pub accumulation: Accumulation,
}

/// The Python argument behind a megamoe-gemm argument.
fn python_arg(arg: &str) -> &str {
    match arg {
        "experts" | "n" => "b",
        "k" | "max_m" | "contiguous_rows" => "a",
        "group_size" => "a_scales",
        other => other,
    }
}

impl From<GemmError> for Error {
    fn from(e: GemmError) -> Self {
        match e {
            // A kernel limit the arguments ran into, not a Python argument.
            GemmError::Shape { arg: "config", .. } => Error::Runtime(e.to_string()),
            GemmError::Shape { arg, reason } => {
                Error::Value(format!("{}: {reason}", python_arg(arg)))
            }
            GemmError::Cuda(e) => e.into(),
            GemmError::DeviceTimeout { .. } => Error::Runtime(e.to_string()),
        }
    }
}

/// Checks the per-expert rows the kernel will trust: contiguous, padded segment sizes (each a
/// multiple of the pad, together at most `shape.rows`); masked, valid rows (at most max_m).
/// Returns the mean rows per expert (what the heuristics steer by).
pub fn check_expert_rows(shape: &GemmShape, expert_rows: &[i32]) -> Result<usize> {
    let bad = |e: usize, v: i32, reason: String| {
        Err(Error::Value(format!(
            "expert_rows: expert {e} has {v} rows: {reason}"
        )))
    };
    let mut total = 0usize;
    for (e, &v) in expert_rows.iter().enumerate() {
        if v < 0 {
            return bad(e, v, "must not be negative".into());
        }
        match shape.layout {
            Layout::Contiguous { pad } if v as usize % pad != 0 => {
                return bad(
                    e,
                    v,
                    format!("segments are padded to a multiple of pad {pad}"),
                );
            }
            Layout::Masked { max_m } if v as usize > max_m => {
                return bad(
                    e,
                    v,
                    format!("more than the {max_m} rows of a's second dimension"),
                );
            }
            _ => {}
        }
        total += v as usize;
    }
    if matches!(shape.layout, Layout::Contiguous { .. }) && total > shape.rows {
        return Err(Error::Value(format!(
            "expert_rows: the segments hold {total} rows, more than the {} rows of a",
            shape.rows
        )));
    }
    Ok(total / expert_rows.len().max(1))
}

/// One grouped GEMM on device `device` after the work queued on `stream` (that device's
/// stream); returns once `out` is written (an expired device wait is an error).
///
/// # Safety
/// The addresses must hold the operands of `shape` in megamoe-gemm's layouts on device
/// `device`, 16-byte aligned, live until this returns, `out` used by nothing else meanwhile;
/// `stream` a live stream of that device's primary context, or 0.
pub unsafe fn grouped_gemm(
    device: usize,
    shape: &GemmShape,
    tensors: &GemmPointers,
    stream: u64,
) -> Result<()> {
    require_gpu()?;
    let gpu = Gpu::new(device)?;
    gpu.wait_for(stream)?;
    let mut expert_rows = vec![0i32; shape.experts];
    // SAFETY: the caller's contract on the addresses.
    unsafe { gpu.read_address(tensors.expert_rows, &mut expert_rows)? };
    let rows_per_expert = check_expert_rows(shape, &expert_rows)?;
    let problem = GemmProblem {
        experts: shape.experts,
        n: shape.n,
        k: shape.k,
        group_size: shape.group,
        layout: shape.layout,
        out: shape.out,
        rows_per_expert,
        accumulation: shape.accumulation,
    };
    let config = choose(&problem, gpu.props().sm_count as usize)?;
    if matches!(shape.layout, Layout::Contiguous { .. }) && shape.rows == 0 {
        return Ok(()); // no rows, nothing to write
    }
    let gemm = GroupedGemm::new(&gpu, problem, config, shape.rows, *tensors)?;
    gemm.launch(&gpu)?;
    gemm.check(&gpu)?;
    Ok(())
}

#[cfg(not(test))]
pub(crate) mod bindings {
    //! `megamoe._megamoe.grouped_gemm`: conversions only.

    use megamoe_gemm::{Layout, OutDtype};
    use pyo3::prelude::*;

    use megamoe_gemm::GemmPointers;

    use super::GemmShape;

    /// One grouped GEMM (python/megamoe/gemm.py checks the tensors and calls this): the sizes,
    /// the layout (`pad` for contiguous, `max_m` for masked: exactly one of them), whether the
    /// output is f32, the six addresses, the CUDA device and its current stream, and the
    /// accumulation's name.
    #[pyfunction]
    #[pyo3(signature = (
        experts, n, k, group, rows, pad, max_m, out_f32,
        a, a_scales, b, b_scales, expert_rows, out, device, stream, accumulation
    ))]
    #[allow(clippy::too_many_arguments)]
    fn grouped_gemm(
        py: Python<'_>,
        experts: usize,
        n: usize,
        k: usize,
        group: usize,
        rows: usize,
        pad: Option<usize>,
        max_m: Option<usize>,
        out_f32: bool,
        a: u64,
        a_scales: u64,
        b: u64,
        b_scales: u64,
        expert_rows: u64,
        out: u64,
        device: usize,
        stream: u64,
        accumulation: &str,
    ) -> PyResult<()> {
        let layout = match (pad, max_m) {
            (Some(pad), None) => Layout::Contiguous { pad },
            (None, Some(max_m)) => Layout::Masked { max_m },
            _ => {
                return Err(crate::error::Error::Value(
                    "pad, max_m: exactly one of them must be given".into(),
                )
                .into())
            }
        };
        let shape = GemmShape {
            experts,
            n,
            k,
            group,
            layout,
            rows,
            out: if out_f32 {
                OutDtype::F32
            } else {
                OutDtype::Bf16
            },
            accumulation: crate::api::accumulation(accumulation)?,
        };
        let tensors = GemmPointers {
            a,
            scale_a: a_scales,
            b,
            scale_b: b_scales,
            expert_rows,
            out,
        };
        // SAFETY: gemm.py passes live, contiguous, 16-byte aligned tensors of the checked
        // dtypes and shapes on `device`, kept alive by the caller for the call, and that
        // device's current stream.
        py.detach(|| unsafe { super::grouped_gemm(device, &shape, &tensors, stream) })?;
        Ok(())
    }

    pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add_function(wrap_pyfunction!(grouped_gemm, m)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(layout: Layout, rows: usize) -> GemmShape {
        GemmShape {
            experts: 3,
            n: 256,
            k: 256,
            group: 128,
            layout,
            rows,
            out: OutDtype::Bf16,
            accumulation: Accumulation::PerBlock,
        }
    }

    #[test]
    fn expert_rows_are_checked_against_the_layout() {
        let contiguous = shape(Layout::Contiguous { pad: 128 }, 512);
        assert_eq!(check_expert_rows(&contiguous, &[128, 0, 384]), Ok(170));
        for (rows, what) in [
            (&[128, 64, 0][..], "multiple of pad 128"),
            (&[128, -128, 0][..], "negative"),
            (&[256, 256, 128][..], "more than the 512 rows"),
        ] {
            match check_expert_rows(&contiguous, rows) {
                Err(Error::Value(m)) => {
                    assert!(m.starts_with("expert_rows: ") && m.contains(what), "{m}")
                }
                other => panic!("{rows:?}: {other:?}"),
            }
        }
        let masked = shape(Layout::Masked { max_m: 64 }, 0);
        assert_eq!(check_expert_rows(&masked, &[64, 3, 0]), Ok(22));
        assert!(
            matches!(check_expert_rows(&masked, &[65, 0, 0]), Err(Error::Value(m)) if m.contains("64 rows of a"))
        );
    }

    #[test]
    fn gemm_errors_name_the_python_argument() {
        let e = GemmError::Shape {
            arg: "k",
            reason: "100 is not a positive multiple of 128".into(),
        };
        assert_eq!(
            Error::from(e),
            Error::Value("a: 100 is not a positive multiple of 128".into())
        );
        let e = GemmError::Shape {
            arg: "config",
            reason: "no cluster fits".into(),
        };
        assert!(matches!(Error::from(e), Error::Runtime(_)));
    }
}
