//! The Python classes and functions (left out of the unit tests, which run without libpython).

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use megamoe_cuda::AllGather;
use megamoe_ep::RowDtype;

use super::ipc::{IpcBuffer, IpcPeer};
use super::reference::{reference, ReferenceInputs};
use super::{Dispatch, DispatchOut, World, WorldArgs};
use crate::api::count;
use crate::error::Error;
use crate::tensor::bindings::{tensor, type_name};
use crate::tensor::TensorArg;

fn tensors(arg: &str, list: &Bound<'_, PyAny>) -> PyResult<Vec<TensorArg>> {
    let list = list
        .cast::<PyList>()
        .map_err(|_| Error::Value(format!("{arg}: expected a list of tensors, one per rank")))?;
    list.iter()
        .enumerate()
        .map(|(r, t)| tensor(&format!("{arg}[{r}]"), &t))
        .collect()
}

fn optional(arg: &str, list: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<TensorArg>> {
    list.map_or(Ok(vec![]), |l| tensors(arg, l))
}

/// The exchange of a one-rank-per-process world: a Python callable taking this process's bytes
/// and returning every rank's, in rank order (torch.distributed's all_gather_object in
/// python/megamoe/ep.py and layer.py). What it raises, or a result of another kind, fails the
/// exchange naming this rank.
pub(crate) struct PyAllGather {
    call: Py<PyAny>,
    rank: usize,
}

impl PyAllGather {
    /// The exchange of rank `rank` through `all_gather`, or a ValueError naming `all_gather`
    /// when it is not callable (nothing is called here).
    pub(crate) fn new(all_gather: &Bound<'_, PyAny>, rank: usize) -> PyResult<Box<PyAllGather>> {
        if !all_gather.is_callable() {
            let ty = type_name(all_gather);
            return Err(Error::Value(format!("all_gather: expected a callable, got {ty}")).into());
        }
        Ok(Box::new(PyAllGather {
            call: all_gather.clone().unbind(),
            rank,
        }))
    }
}

impl AllGather for PyAllGather {
    fn all_gather(&mut self, mine: &[u8]) -> megamoe_cuda::Result<Vec<Vec<u8>>> {
        Python::attach(|py| {
            let out = self.call.call1(py, (PyBytes::new(py, mine),))?;
            out.extract::<Vec<Vec<u8>>>(py).map_err(|_| {
                let ty = type_name(out.bind(py));
                Error::Value(format!(
                    "returned a {ty}, expected a list of bytes (one per rank)"
                ))
                .into()
            })
        })
        .map_err(|e: PyErr| megamoe_cuda::Error::Exchange {
            rank: self.rank,
            reason: format!("all_gather: {e}"),
        })
    }
}

/// One process's expert-parallel world (see python/megamoe/ep.py, which wraps it).
#[pyclass(name = "EpWorld", module = "megamoe._megamoe")]
pub struct PyWorld {
    world: World,
}

/// A dispatch's routing state (see python/megamoe/ep.py).
#[pyclass(name = "EpHandle", module = "megamoe._megamoe")]
pub struct PyDispatch {
    d: Dispatch,
}

#[pymethods]
impl PyDispatch {
    #[getter]
    fn num_tokens(&self) -> Vec<usize> {
        self.d.tokens.clone()
    }
    #[getter]
    fn num_rows(&self) -> Vec<usize> {
        self.d.rows.clone()
    }
    /// None after a non-blocking dispatch (the counts stay on the device).
    #[getter]
    fn tokens_per_expert(&self) -> Option<Vec<Vec<u32>>> {
        self.d.tokens_per_expert.clone()
    }
}

#[pymethods]
impl PyWorld {
    #[new]
    #[pyo3(signature = (
        num_ranks, num_experts, num_topk, hidden, num_max_tokens_per_rank,
        max_pad_multiple = 128, dtype = "bf16", num_sms = None, deadline_ms = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        num_ranks: i64,
        num_experts: i64,
        num_topk: i64,
        hidden: i64,
        num_max_tokens_per_rank: i64,
        max_pad_multiple: i64,
        dtype: &str,
        num_sms: Option<i64>,
        deadline_ms: Option<i64>,
    ) -> PyResult<Self> {
        let world = World::new(&WorldArgs {
            num_ranks,
            num_experts,
            num_topk,
            hidden,
            num_max_tokens_per_rank,
            max_pad_multiple,
            dtype,
            num_sms,
            deadline_ms,
        })?;
        Ok(PyWorld { world })
    }

    /// Rank `rank` of a world of `num_ranks` processes (one rank each), on CUDA device
    /// `device`; `all_gather(bytes) -> list[bytes]` swaps the symmetric buffers' handles and is
    /// called by every process in the same order. Arguments are checked before any GPU is
    /// touched or `all_gather` called.
    #[staticmethod]
    #[pyo3(signature = (
        rank, device, all_gather, num_ranks, num_experts, num_topk, hidden,
        num_max_tokens_per_rank, max_pad_multiple = 128, dtype = "bf16", num_sms = None,
        deadline_ms = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn for_rank(
        py: Python<'_>,
        rank: i64,
        device: i64,
        all_gather: &Bound<'_, PyAny>,
        num_ranks: i64,
        num_experts: i64,
        num_topk: i64,
        hidden: i64,
        num_max_tokens_per_rank: i64,
        max_pad_multiple: i64,
        dtype: &str,
        num_sms: Option<i64>,
        deadline_ms: Option<i64>,
    ) -> PyResult<Self> {
        let args = WorldArgs {
            num_ranks,
            num_experts,
            num_topk,
            hidden,
            num_max_tokens_per_rank,
            max_pad_multiple,
            dtype,
            num_sms,
            deadline_ms,
        };
        let (config, rank, device) = World::rank_config(&args, rank, device)?;
        let exchange = PyAllGather::new(all_gather, rank)?;
        let world = py.detach(|| World::for_rank(config, rank, device, exchange))?;
        Ok(PyWorld { world })
    }

    #[getter]
    fn num_ranks(&self) -> usize {
        self.world.spec().ranks
    }
    /// The ranks this process holds, in the order of the calls' per-rank lists.
    #[getter]
    fn local_ranks(&self) -> Vec<usize> {
        self.world.local_ranks().collect()
    }
    #[getter]
    fn num_experts(&self) -> usize {
        self.world.spec().experts
    }
    #[getter]
    fn num_topk(&self) -> usize {
        self.world.spec().topk
    }
    #[getter]
    fn hidden(&self) -> usize {
        self.world.spec().hidden
    }
    /// The most rows one rank's dispatch can produce (the largest `num_rows_bound`).
    #[getter]
    fn max_rows(&self) -> usize {
        self.world.spec().max_rows()
    }
    #[getter]
    fn dtype(&self) -> &'static str {
        match self.world.dtype() {
            RowDtype::Bf16 => "bf16",
            RowDtype::Fp8 => "fp8",
        }
    }
    fn device(&self, rank: usize) -> PyResult<usize> {
        Ok(self.world.device(rank)?)
    }
    fn context_handle(&self, rank: usize) -> PyResult<u64> {
        Ok(self.world.context_handle(rank)?)
    }

    /// A routing state to dispatch into (allocates: do it before capturing a graph).
    fn new_handle(&self) -> PyResult<PyDispatch> {
        Ok(PyDispatch {
            d: self.world.new_dispatch()?,
        })
    }

    /// Waits for the calls (and the caller's `streams`), then raises the first failure of
    /// the non-blocking ones.
    fn sync(&self, py: Python<'_>, streams: Vec<u64>) -> PyResult<()> {
        Ok(py.detach(|| self.world.sync(&streams))?)
    }

    #[pyo3(signature = (
        handle, x, x_scales, topk_idx, probs, pad_multiple, num_rows_bound, streams,
        out_rows = None, out_scales = None, out_probs = None, tokens_per_expert = None, codes = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        &self,
        py: Python<'_>,
        mut handle: PyRefMut<'_, PyDispatch>,
        x: &Bound<'_, PyAny>,
        x_scales: Option<&Bound<'_, PyAny>>,
        topk_idx: &Bound<'_, PyAny>,
        probs: &Bound<'_, PyAny>,
        pad_multiple: i64,
        num_rows_bound: Option<i64>,
        streams: Vec<u64>,
        out_rows: Option<&Bound<'_, PyAny>>,
        out_scales: Option<&Bound<'_, PyAny>>,
        out_probs: Option<&Bound<'_, PyAny>>,
        tokens_per_expert: Option<&Bound<'_, PyAny>>,
        codes: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (x, xs) = (tensors("x", x)?, optional("x_scales", x_scales)?);
        let (idx, p) = (tensors("topk_idx", topk_idx)?, tensors("probs", probs)?);
        let outs = match (out_rows, out_probs) {
            (Some(rows), Some(probs)) => Some((
                tensors("out_rows", rows)?,
                optional("out_scales", out_scales)?,
                tensors("out_probs", probs)?,
                optional("tokens_per_expert", tokens_per_expert)?,
                optional("codes", codes)?,
            )),
            (None, None) => None,
            _ => {
                return Err(Error::Value(
                    "out_rows: given without out_probs, or the other way round".into(),
                )
                .into())
            }
        };
        let out = outs
            .as_ref()
            .map(|(rows, scales, probs, counts, codes)| DispatchOut {
                rows,
                scales,
                probs,
                tokens_per_expert: counts,
                codes,
            });
        let d = &mut handle.d;
        Ok(py.detach(|| {
            self.world.dispatch(
                d,
                &x,
                &xs,
                &idx,
                &p,
                pad_multiple,
                num_rows_bound,
                &streams,
                out,
            )
        })?)
    }

    #[pyo3(signature = (handle, rows, scales, probs, tokens_per_expert, streams, codes = None))]
    #[allow(clippy::too_many_arguments)]
    fn read_dispatch(
        &self,
        py: Python<'_>,
        handle: &PyDispatch,
        rows: &Bound<'_, PyAny>,
        scales: Option<&Bound<'_, PyAny>>,
        probs: &Bound<'_, PyAny>,
        tokens_per_expert: Option<&Bound<'_, PyAny>>,
        streams: Vec<u64>,
        codes: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (rows, scales) = (tensors("rows", rows)?, optional("scales", scales)?);
        let probs = tensors("probs", probs)?;
        let counts = optional("tokens_per_expert", tokens_per_expert)?;
        let codes = optional("codes", codes)?;
        let out = DispatchOut {
            rows: &rows,
            scales: &scales,
            probs: &probs,
            tokens_per_expert: &counts,
            codes: &codes,
        };
        let d = &handle.d;
        Ok(py.detach(|| self.world.read_dispatch(d, out, &streams))?)
    }

    #[pyo3(signature = (handle, rows, order, y, streams, prob_grads = None, grad_probs = None, wait = true))]
    #[allow(clippy::too_many_arguments)]
    fn combine(
        &self,
        py: Python<'_>,
        handle: &PyDispatch,
        rows: &Bound<'_, PyAny>,
        order: &str,
        y: &Bound<'_, PyAny>,
        streams: Vec<u64>,
        prob_grads: Option<&Bound<'_, PyAny>>,
        grad_probs: Option<&Bound<'_, PyAny>>,
        wait: bool,
    ) -> PyResult<()> {
        let (rows, y) = (tensors("rows", rows)?, tensors("y", y)?);
        let grads = match (prob_grads, grad_probs) {
            (Some(g), Some(out)) => Some((tensors("prob_grads", g)?, tensors("grad_probs", out)?)),
            (None, None) => None,
            _ => {
                return Err(Error::Value(
                    "prob_grads: given without grad_probs, or the other way round".into(),
                )
                .into())
            }
        };
        let d = &handle.d;
        let grads = grads.as_ref().map(|(g, o)| (g.as_slice(), o.as_slice()));
        Ok(py.detach(|| {
            self.world
                .combine(d, &rows, grads, order, &y, &streams, wait)
        })?)
    }

    #[pyo3(signature = (handle, grad_y, grad_rows, streams, wait = true))]
    fn combine_backward(
        &self,
        py: Python<'_>,
        handle: &PyDispatch,
        grad_y: &Bound<'_, PyAny>,
        grad_rows: &Bound<'_, PyAny>,
        streams: Vec<u64>,
        wait: bool,
    ) -> PyResult<()> {
        let (gy, gr) = (tensors("grad_y", grad_y)?, tensors("grad_rows", grad_rows)?);
        let d = &handle.d;
        Ok(py.detach(|| self.world.combine_backward(d, &gy, &gr, &streams, wait))?)
    }
}

fn bytes_list<'py>(py: Python<'py>, v: &[Vec<u8>]) -> Vec<Bound<'py, PyBytes>> {
    v.iter().map(|b| PyBytes::new(py, b)).collect()
}

/// megamoe-core's CPU reference of dispatch_with_permute, combine_with_unpermute in `order`,
/// dispatch's backward (of `rows`, `prob_grads`) and combine's backward (of `grad_y`).
/// Every list holds one bytes object per rank, little-endian as torch stores the tensors.
#[pyfunction]
#[pyo3(signature = (
    hidden, num_experts, num_topk, pad_multiple, x, x_scales, topk_idx, probs, rows,
    prob_grads, grad_y, order
))]
#[allow(clippy::too_many_arguments)]
fn ep_reference<'py>(
    py: Python<'py>,
    hidden: usize,
    num_experts: usize,
    num_topk: usize,
    pad_multiple: usize,
    x: Vec<Vec<u8>>,
    x_scales: Option<Vec<Vec<u8>>>,
    topk_idx: Vec<Vec<u8>>,
    probs: Vec<Vec<u8>>,
    rows: Vec<Vec<u8>>,
    prob_grads: Vec<Vec<u8>>,
    grad_y: Vec<Vec<u8>>,
    order: String,
) -> PyResult<Bound<'py, PyDict>> {
    let inp = ReferenceInputs {
        hidden,
        experts: num_experts,
        topk: num_topk,
        pad_multiple,
        x,
        x_scales,
        topk_idx,
        probs,
        rows,
        prob_grads,
        grad_y,
        order,
    };
    let out = py.detach(|| reference(&inp))?;
    let d = PyDict::new(py);
    d.set_item("rows", bytes_list(py, &out.rows))?;
    d.set_item("scales", bytes_list(py, &out.scales))?;
    d.set_item("probs", bytes_list(py, &out.probs))?;
    d.set_item("tokens_per_expert", out.tokens_per_expert)?;
    d.set_item("y", bytes_list(py, &out.y))?;
    d.set_item("grad_x", bytes_list(py, &out.grad_x))?;
    d.set_item("grad_probs", bytes_list(py, &out.grad_probs))?;
    d.set_item("grad_rows", bytes_list(py, &out.grad_rows))?;
    Ok(d)
}

/// This process's part of symmetric memory over CUDA IPC (see python/megamoe/ep.py).
#[pyclass(name = "IpcBuffer", module = "megamoe._megamoe")]
pub struct PyIpcBuffer {
    buf: IpcBuffer,
}

#[pymethods]
impl PyIpcBuffer {
    #[new]
    fn new(device: i64, bytes: i64) -> PyResult<Self> {
        Ok(PyIpcBuffer {
            buf: IpcBuffer::new(device, bytes)?,
        })
    }

    /// (IPC handle bytes, PCI bus id) to send to the peers.
    fn export<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyBytes>, String)> {
        let p = self.buf.export()?;
        Ok((PyBytes::new(py, &p.handle), p.pci_bus_id))
    }

    /// Opens every peer's buffer from the gathered `export()` pairs (index = rank).
    fn open(&mut self, rank: i64, peers: Vec<(Vec<u8>, String)>) -> PyResult<()> {
        let peers: Vec<IpcPeer> = peers
            .into_iter()
            .map(|(handle, pci_bus_id)| IpcPeer { handle, pci_bus_id })
            .collect();
        Ok(self.buf.open(rank, &peers)?)
    }

    fn ptr(&self, rank: i64) -> PyResult<u64> {
        Ok(self.buf.ptr(rank)?)
    }

    #[getter]
    fn nbytes(&self) -> usize {
        self.buf.bytes()
    }

    /// Copies `bytes` from rank `src_rank`'s buffer (byte `src_offset`) into `dst`, or from
    /// `src` into rank `dst_rank`'s buffer, ordered on the caller's `stream`.
    #[pyo3(signature = (tensor, rank, offset, to_buffer, stream))]
    fn copy(
        &self,
        tensor: &Bound<'_, PyAny>,
        rank: i64,
        offset: i64,
        to_buffer: bool,
        stream: u64,
    ) -> PyResult<()> {
        let t = tensor_any_device("tensor", tensor)?;
        let offset = count("offset", offset)?;
        let bytes = t.1;
        if offset
            .checked_add(bytes)
            .is_none_or(|end| end > self.buf.bytes())
        {
            return Err(Error::Value(format!(
                "tensor: {bytes} bytes at offset {offset} exceed the buffer's {}",
                self.buf.bytes()
            ))
            .into());
        }
        let at = self.buf.ptr(rank)? + offset as u64;
        let (dst, src) = if to_buffer { (at, t.0) } else { (t.0, at) };
        // SAFETY: the tensor is a contiguous CUDA tensor of `bytes` bytes; the range lies in
        // the buffer of an opened rank.
        unsafe { self.buf.copy(dst, src, bytes, stream)? };
        Ok(())
    }
}

/// (data pointer, bytes) of a contiguous CUDA tensor of any dtype.
fn tensor_any_device(arg: &str, obj: &Bound<'_, PyAny>) -> PyResult<(u64, usize)> {
    let t = tensor(arg, obj)?;
    if t.cuda_device.is_none() || !t.contiguous {
        return Err(Error::Value(format!("{arg}: expected a contiguous CUDA tensor")).into());
    }
    let numel: usize = obj.call_method0("numel")?.extract()?;
    let size: usize = obj.call_method0("element_size")?.extract()?;
    Ok((t.ptr, numel * size))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyWorld>()?;
    m.add_class::<PyDispatch>()?;
    m.add_class::<PyIpcBuffer>()?;
    m.add_function(wrap_pyfunction!(ep_reference, m)?)?;
    Ok(())
}
