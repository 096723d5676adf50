"""megamoe: the expert-parallel Mixture-of-Experts layer for NVIDIA Hopper GPUs.

Without a GPU: the size query (``get_symm_buffer_size``), the presets, the GPU probe
(``gpu_available``, ``info``), the CPU reference of the layer on a generated batch
(``reference_forward``). On a GPU, with PyTorch tensors: the layer (``MoELayer``, built by
``get_symm_buffer_for_mega_moe``) and the FP8 grouped GEMM (``grouped_gemm_fp8_contiguous``,
``grouped_gemm_fp8_masked``); ``megamoe.torch_reference`` is SPEC §3 in plain PyTorch.

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
from .gemm import grouped_gemm_fp8_contiguous, grouped_gemm_fp8_masked
from .layer import MoELayer, get_symm_buffer_for_mega_moe

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
