"""PyTorch for the GPU calls, imported on first use (the package imports without it), and the
caller's current CUDA stream. The tensors themselves are checked by the native module
(``megamoe._megamoe.check_tensor``)."""

from __future__ import annotations

from types import ModuleType


def torch() -> ModuleType:
    """The torch module, imported when a GPU call needs it (the package imports without it).
    Without PyTorch: an ImportError that says so, wherever torch is needed."""
    try:
        import torch
    except ImportError as e:
        raise ImportError(
            f"megamoe's GPU calls, MoELayer and megamoe.ep take torch tensors: PyTorch is not installed ({e})",
            name="torch",
        ) from e
    return torch


def stream(device: int) -> int:
    """The caller's current CUDA stream on `device`, as the driver's handle (torch's raw query
    where it has one: it builds no Stream object, a microsecond a call)."""
    th = torch()
    raw = getattr(th._C, "_cuda_getCurrentRawStream", None)
    return raw(device) if raw is not None else th.cuda.current_stream(device).cuda_stream
