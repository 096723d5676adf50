"""megamoe: the expert-parallel Mixture-of-Experts layer for NVIDIA Hopper GPUs.

Without a GPU: the size query (``get_symm_buffer_size``), the presets, the GPU probe
(``gpu_available``, ``info``), the CPU reference of the layer on a generated batch
(``reference_forward``). On a GPU, with PyTorch tensors: the layer (``MoELayer``, built by
``get_symm_buffer_for_mega_moe``; one process per rank under torchrun:
``MoELayer.for_process_group``) and the FP8 grouped GEMM (``grouped_gemm_fp8_contiguous``,
``grouped_gemm_fp8_masked``); ``megamoe.torch_reference`` is SPEC §3 in plain PyTorch;
``megamoe.ep`` (needs torch) has dispatch/combine with autograd, every rank in one process or
one process per rank (torchrun: ``ep.Buffer.for_process_group``), and the symmetric memory of
one process per GPU.

Errors: ``ValueError`` for a bad argument (the message starts with its name), ``RuntimeError``
when no CUDA GPU can be used or the device fails, ``ImportError`` naming PyTorch when a call
that takes torch tensors finds no PyTorch.

NVRTC (which compiles the kernels) and NCCL are looked for, first hit wins: ``MEGAMOE_NVRTC_LIB``,
``MEGAMOE_CUDA_HOME``, the system loader (``LD_LIBRARY_PATH``, a copy PyTorch already loaded),
NVIDIA's pip packages in this Python environment (``nvidia/cu13/lib``: PyTorch's CUDA 13
dependencies), then ``/usr/local/cuda``; ``info()`` shows what was found.
"""

import importlib.util

from ._megamoe import (
    __version__,
    _set_nvidia_package_roots,
    get_symm_buffer_size,
    gpu_available,
    info,
    presets,
    reference_forward,
)


def _nvidia_package_roots():
    """The folders of the ``nvidia`` namespace package (NVIDIA's pip packages) on sys.path,
    found without importing anything."""
    spec = importlib.util.find_spec("nvidia")
    return list(spec.submodule_search_locations or []) if spec is not None else []


_set_nvidia_package_roots(_nvidia_package_roots())
from ._tensors import torch as _torch
from .gemm import grouped_gemm_fp8_contiguous, grouped_gemm_fp8_masked
from .layer import MoELayer, get_symm_buffer_for_mega_moe

# Dispatch / combine and symmetric memory take torch tensors: megamoe.ep imports torch, on first
# use of one of these names, so that the package itself imports without torch.
_EP = (
    "Buffer",
    "dispatch_with_permute",
    "combine_with_unpermute",
    "dispatch_with_permute_ranks",
    "combine_with_unpermute_ranks",
    "SymmetricMemory",
)


def __getattr__(name):
    if name in _EP:
        _torch()  # without PyTorch: the ImportError naming it, not ep's bare one
        from . import ep

        return getattr(ep, name)
    raise AttributeError(f"module 'megamoe' has no attribute {name!r}")


__all__ = [
    "MoELayer",
    "get_symm_buffer_for_mega_moe",
    "grouped_gemm_fp8_contiguous",
    "grouped_gemm_fp8_masked",
    "__version__",
    "get_symm_buffer_size",
    "gpu_available",
    "info",
    "presets",
    "reference_forward",
]
