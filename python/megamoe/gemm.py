"""The FP8 block-scaled grouped GEMM (megamoe-gemm) on torch tensors: out = a · bᵀ per expert,
e4m3 operands, activation scales per G columns of K (G = 128 or 64), weight scales per
128 x 128 block, f32 accumulation promoted per scale group (SPEC §3 steps 1 and 4; the keyword
``accumulation="rescaled"`` keeps the running sum in the tensor cores' accumulator instead, as
the layer's option of the same name: docs/PYTHON.md, "Accumulation").

Layouts (what megamoe-gemm's kernel reads; the activation scales are K-group-major):
- contiguous: ``a`` [M, K] rows grouped by expert, each expert's segment padded with zero rows
  to a multiple of ``pad``; ``a_scales`` [K/G, M] (padding rows' scales 0); ``expert_rows``
  int32 [E] the padded segment sizes; ``out`` [M, N] (every row written, padding rows 0).
- masked: ``a`` [E, max_m, K]; ``a_scales`` [E, K/G, max_m]; ``expert_rows`` int32 [E] each
  expert's valid rows; ``out`` [E, max_m, N] (only valid rows written).
- both: ``b`` float8_e4m3fn [E, N, K], ``b_scales`` float32 [E, N/128, K/128], ``out`` bfloat16
  or float32; N and K multiples of 128.

Each call runs on the caller's current stream of the tensors' device, reads ``expert_rows`` back
to the host to check it (E values), prepares the launch (tensor maps, module load: for timing,
use the Rust API) and returns once ``out`` is written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _megamoe
from ._megamoe import check_tensor
from ._tensors import stream, torch

if TYPE_CHECKING:
    from torch import Tensor


def _call(operands: tuple[Tensor, ...], pad: int | None, masked: bool, accumulation: str) -> None:
    """Checks the operands (a, a_scales, b, b_scales, expert_rows, out) of either layout, then runs
    the GEMM."""
    a, a_scales, b, b_scales, expert_rows, out = operands
    th = torch()
    if not isinstance(b, th.Tensor) or b.dim() != 3 or not b.is_cuda:
        raise ValueError("b: expected a float8_e4m3fn CUDA tensor [E, N, K]")
    (e, n, k), device = b.shape, b.device.index
    dims = 3 if masked else 2
    for name, t in (("a", a), ("a_scales", a_scales)):
        if not isinstance(t, th.Tensor) or t.dim() != dims:
            raise ValueError(f"{name}: expected a tensor of {dims} dimensions")
    if masked:
        rows, kg = a.shape[1], a_scales.shape[1]  # max_m, K/G
        shapes = (e, rows, k), (e, kg, rows), (e, rows, n)
    else:
        rows, kg = a.shape[0], a_scales.shape[0]  # M, K/G
        shapes = (rows, k), (kg, rows), (rows, n)
    if kg == 0 or k % kg or k // kg not in (64, 128):
        raise ValueError(f"a_scales: {kg} scale groups over K = {k} are not groups of 128 or 64 columns")
    ptrs = (
        check_tensor("a", a, th.float8_e4m3fn, shapes[0], device),
        check_tensor("a_scales", a_scales, th.float32, shapes[1], device),
        check_tensor("b", b, th.float8_e4m3fn, (e, n, k), device),
        check_tensor("b_scales", b_scales, th.float32, (e, n // 128, k // 128), device),
        check_tensor("expert_rows", expert_rows, th.int32, (e,), device),
        check_tensor("out", out, (th.bfloat16, th.float32), shapes[2], device),
    )
    layout = (None, rows) if masked else (pad, None)  # (pad, max_m)
    _megamoe.grouped_gemm(
        e,
        n,
        k,
        k // kg,
        0 if masked else rows,
        *layout,
        out.dtype == th.float32,
        *ptrs,
        device,
        stream(device),
        accumulation,
    )


def grouped_gemm_fp8_contiguous(
    a: Tensor,
    a_scales: Tensor,
    b: Tensor,
    b_scales: Tensor,
    expert_rows: Tensor,
    out: Tensor,
    pad: int = 128,
    accumulation: str = "per-block",
) -> None:
    """out = a · bᵀ per expert segment, in the contiguous layout (module docstring); ``pad``
    (64 or 128) the multiple every segment is padded to; ``accumulation`` "per-block" or
    "rescaled"."""
    _call((a, a_scales, b, b_scales, expert_rows, out), pad, masked=False, accumulation=accumulation)


def grouped_gemm_fp8_masked(
    a: Tensor,
    a_scales: Tensor,
    b: Tensor,
    b_scales: Tensor,
    expert_rows: Tensor,
    out: Tensor,
    accumulation: str = "per-block",
) -> None:
    """out = a · bᵀ per expert, the first ``expert_rows[e]`` rows of each, in the masked layout
    (module docstring); ``accumulation`` "per-block" or "rescaled"."""
    _call((a, a_scales, b, b_scales, expert_rows, out), None, masked=True, accumulation=accumulation)
