"""Checks of the torch tensors the GPU calls take by address (no libtorch link): dtype, shape,
CUDA device, contiguity and alignment, each failure a ValueError naming the argument."""


def torch():
    """The torch module, imported when a GPU call needs it (the package imports without it).
    Without PyTorch: an ImportError that says so, wherever torch is needed."""
    try:
        import torch
    except ImportError as e:
        raise ImportError(
            "megamoe's GPU calls, MoELayer and megamoe.ep take torch tensors: PyTorch is not "
            f"installed ({e})", name="torch") from e
    return torch


def address(name, t, dtypes, shape, device):
    """The address of tensor `t` after checking it: one of `dtypes` (a dtype or a tuple), on CUDA
    device `device` (an index), of `shape` (None: any size in that dimension), contiguous and
    16-byte aligned (the kernels' tensor maps load 16-byte units)."""
    th = torch()
    dtypes = dtypes if isinstance(dtypes, tuple) else (dtypes,)
    if not isinstance(t, th.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name}: dtype {t.dtype}, expected {' or '.join(map(str, dtypes))}")
    if t.get_device() != device:  # -1 off CUDA; cheaper than building t.device
        raise ValueError(f"{name}: on {t.device}, expected cuda:{device}")
    if t.dim() != len(shape) or any(w is not None and g != w for g, w in zip(t.shape, shape)):
        want = ", ".join("*" if w is None else str(w) for w in shape)
        raise ValueError(f"{name}: shape {tuple(t.shape)}, expected ({want})")
    if not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (strides {t.stride()}); call .contiguous()")
    ptr = t.data_ptr()
    if ptr % 16:
        raise ValueError(f"{name}: its data must start 16-byte aligned (address {ptr:#x})")
    return ptr


def stream(device):
    """The caller's current CUDA stream on `device`, as the driver's handle (torch's raw query
    where it has one: it builds no Stream object, a microsecond a call)."""
    th = torch()
    raw = getattr(th._C, "_cuda_getCurrentRawStream", None)
    return raw(device) if raw is not None else th.cuda.current_stream(device).cuda_stream
