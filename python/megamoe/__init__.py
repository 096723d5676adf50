"""megamoe: the expert-parallel Mixture-of-Experts layer for NVIDIA Hopper GPUs.

This build has what needs no GPU: the size query (``get_symm_buffer_size``), the presets, the
GPU probe (``gpu_available``, ``info``), the CPU reference of the layer on a generated batch
(``reference_forward``). ``megamoe.ep`` (needs torch) has dispatch/combine with autograd and the
symmetric memory of one process per GPU. The GPU layer and the grouped GEMM are not in it yet.

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

# Dispatch / combine and symmetric memory take torch tensors: megamoe.ep imports torch, on first
# use of one of these names, so that the package itself imports without torch.
_EP = ("Buffer", "dispatch_with_permute", "combine_with_unpermute", "SymmetricMemory")


def __getattr__(name):
    if name in _EP:
        from . import ep

        return getattr(ep, name)
    raise AttributeError(f"module 'megamoe' has no attribute {name!r}")


__all__ = [
    "__version__",
    "get_symm_buffer_size",
    "gpu_available",
    "info",
    "presets",
    "reference_forward",
]
