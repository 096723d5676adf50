//! The Python-facing functions and class: conversions only, the work is in [`crate::api`].

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::api::{self, LayerArgs};
use crate::error::Error;

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        match e {
            Error::Value(m) => PyValueError::new_err(m),
            Error::Runtime(m) => PyRuntimeError::new_err(m),
            // A subclass of RuntimeError in Python, so `except RuntimeError` still catches it.
        }
    }
}

/// Bytes one rank allocates for an MoE layer: a dict with `symmetric_bytes` (memory peers read
/// and write), `local_bytes` (activations only this rank sees) and `weight_bytes` (its
/// experts' FP8 weights and scales). Pure arithmetic: no GPU needed.
///
/// `kind` is "fused" (one persistent kernel, the default) or "split"; `scale_granularity` the
/// columns per scale of the re-quantized intermediate (64 or 128; None: 128 when hidden and
/// 2 * intermediate_hidden are multiples of 512, else 64; `group`, its old name, still works
/// with a DeprecationWarning); `clamp` the optional SwiGLU clamp.
/// Raises ValueError naming the argument for a shape the kernels do not take.
#[pyfunction]
#[pyo3(signature = (
    num_ranks, num_experts, num_max_tokens_per_rank, num_topk, hidden, intermediate_hidden,
    kind = "fused", scale_granularity = None, clamp = None, *, group = None,
    accumulation = None
))]
#[allow(clippy::too_many_arguments)] // DeepGEMM's signature, one argument per size.
fn get_symm_buffer_size<'py>(
    py: Python<'py>,
    num_ranks: i64,
    num_experts: i64,
    num_max_tokens_per_rank: i64,
    num_topk: i64,
    hidden: i64,
    intermediate_hidden: i64,
    kind: &str,
    scale_granularity: Option<i64>,
    clamp: Option<f64>,
    group: Option<i64>,
    accumulation: Option<&str>,
) -> PyResult<Bound<'py, PyDict>> {
    if group.is_some() {
        let warning = py.get_type::<pyo3::exceptions::PyDeprecationWarning>();
        let message = c"group= is renamed scale_granularity= (columns per scale of the \
                        intermediate); group= goes away in the next release";
        PyErr::warn(py, &warning, message, 1)?;
    }
    let group = match (scale_granularity, group) {
        (Some(g), Some(old)) if g != old => {
            return Err(Error::Value(format!(
                "group: {old} contradicts scale_granularity {g} (group is its deprecated name; \
                 pass scale_granularity alone)"
            ))
            .into())
        }
        (g, old) => g.or(old),
    };
    let bytes = api::buffer_size(&LayerArgs {
        num_ranks,
        num_experts,
        num_max_tokens_per_rank,
        num_topk,
        hidden,
        intermediate_hidden,
        kind,
        group,
        clamp,
        accumulation,
    })?;
    let d = PyDict::new(py);
    d.set_item("symmetric_bytes", bytes.symmetric)?;
    d.set_item("local_bytes", bytes.local)?;
    d.set_item("weight_bytes", bytes.weights)?;
    Ok(d)
}

/// The named shapes: name -> (hidden, intermediate_hidden, num_experts, num_topk).
#[pyfunction]
fn presets(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    for (name, shape) in api::presets() {
        d.set_item(name, shape)?;
    }
    Ok(d)
}

/// The CPU reference of the layer (the numbers the GPU layer is checked against) on a
/// generated batch: `num_ranks` ranks of `num_tokens` tokens each, seeded routing ("uniform"
/// or "zipf") and seeded FP8 weights, as `megamoe run --backend cpu` computes it.
///
/// Returns a dict: `outputs`, one bytes object per rank holding bf16 `[num_tokens, hidden]`
/// little-endian (`torch.frombuffer(b, dtype=torch.bfloat16).view(-1, hidden)`), `hidden`,
/// and `hash`, the output hash `megamoe run` prints. Takes seconds for `tiny`, tens of
/// seconds of CPU time for a few dozen `flash` tokens.
#[pyfunction]
#[pyo3(signature = (preset, num_ranks, num_tokens, seed = 0, routing = "uniform"))]
fn reference_forward<'py>(
    py: Python<'py>,
    preset: &str,
    num_ranks: i64,
    num_tokens: i64,
    seed: u64,
    routing: &str,
) -> PyResult<Bound<'py, PyDict>> {
    // The reference runs on every core; other Python threads go on meanwhile.
    let r = py.detach(|| api::reference_forward(preset, num_ranks, num_tokens, seed, routing))?;
    let d = PyDict::new(py);
    let outputs: Vec<Bound<'py, PyBytes>> = r
        .outputs
        .iter()
        .map(|rank| {
            let bytes: Vec<u8> = rank
                .iter()
                .flat_map(|v| v.to_bits().to_le_bytes())
                .collect();
            PyBytes::new(py, &bytes)
        })
        .collect();
    d.set_item("outputs", outputs)?;
    d.set_item("hidden", r.hidden)?;
    d.set_item("hash", r.hash)?;
    Ok(d)
}

/// Whether a CUDA GPU can be used (libcuda loads and reports a device). Never raises.
#[pyfunction]
fn gpu_available() -> bool {
    api::gpu_available()
}

/// The CUDA driver, NVRTC and GPUs this process sees, and what is missing.
#[pyfunction]
fn info() -> String {
    api::info()
}

/// Adds the Python environment's `nvidia` package folders (NVIDIA's pip packages, e.g.
/// PyTorch's CUDA 13 dependencies) to the search for NVRTC and NCCL; `megamoe/__init__.py`
/// calls it at import. Returns False, changing nothing, once a library has been searched for.
#[pyfunction]
fn _set_nvidia_package_roots(roots: Vec<std::path::PathBuf>) -> bool {
    megamoe_cuda::probe::set_nvidia_package_roots(roots)
}

#[pymodule]
fn _megamoe(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(get_symm_buffer_size, m)?)?;
    m.add_function(wrap_pyfunction!(presets, m)?)?;
    m.add_function(wrap_pyfunction!(reference_forward, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_available, m)?)?;
    m.add_function(wrap_pyfunction!(info, m)?)?;
    m.add_function(wrap_pyfunction!(_set_nvidia_package_roots, m)?)?;
    crate::layer::bindings::register(m)?;
    crate::gemm::bindings::register(m)?;
    crate::ep::py::register(m)?;
    crate::tensor::bindings::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
