"""megamoe: the expert-parallel Mixture-of-Experts layer for NVIDIA Hopper GPUs.

This build has what needs no GPU: the size query (``get_symm_buffer_size``), the presets, the
GPU probe (``gpu_available``, ``info``), the CPU reference of the layer on a generated batch
(``reference_forward``). The GPU layer, dispatch/combine with autograd, the grouped GEMM and
multi-process use are not in it yet.

Errors: ``ValueError`` for a bad argument (the message names it), ``RuntimeError`` when no CUDA
GPU can be used or the device fails.
"""

from ._megamoe import (
    __version__,
    get_symm_buffer_size,
    gpu_available,
    info,
    presets,
    reference_forward,
)

__all__ = [
    "__version__",
    "get_symm_buffer_size",
    "gpu_available",
    "info",
    "presets",
    "reference_forward",
]
