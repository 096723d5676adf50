"""Dispatch / combine with fused permute (SPEC §5) on torch tensors, with autograd, and the CUDA
IPC exchange of symmetric memory for one process per GPU.

A :class:`Buffer` holds this process's ranks of an expert-parallel world of ``num_ranks`` ranks
(``Buffer.ranks``): every rank (``Buffer(...)``: rank r runs on GPU ``r % G`` of the G visible
GPUs; several ranks on one GPU are virtual ranks, for correctness), or the one rank of this
process in a torch.distributed group, one process per rank as torchrun launches them
(``Buffer.for_process_group(...)``: peers' buffers mapped over CUDA IPC; every process makes the
same calls in the same order). :func:`dispatch_with_permute` and :func:`combine_with_unpermute`
take and return this process's one rank's tensors; a buffer of several ranks here runs through
:func:`dispatch_with_permute_ranks` and :func:`combine_with_unpermute_ranks`, whose every per-rank
argument and result is a list with one tensor per rank of ``Buffer.ranks``, each on that rank's
GPU.

- :func:`dispatch_with_permute` sends every token's row to the ranks owning its experts, grouped
  by local expert, ordered by (source rank, token), each expert's segment zero-padded to
  ``pad_multiple`` rows. Its backward is a combine of the row gradients (in the dispatch's
  ``order``) and a scatter of the prob gradients back to ``[T, K]``.
- :func:`combine_with_unpermute` sums every token's rows back on its rank, unweighted (the
  expert applies the probs), in ``order``: ``"per_rank"`` (the default: each expert rank sums
  its copies in f32 and sends one bf16 row per token, the token's rank sums those in rank
  order and rounds once) or ``"exact"`` (every copy in ascending expert id, one rounding: the
  bits do not depend on the number of ranks). Its backward dispatches the output gradient.

FP8 buffers (``dtype="fp8"``): the forward input x (bf16) is quantized to e4m3 with one f32
scale per 128 columns (scale = max(amax, 1e-4) / 448) and moved as such; ``rows`` are those
values dequantized to bf16 (the e4m3 codes and scales, for FP8 GEMMs, are in
``Dispatched.fp8``). The gradient is straight-through: x's gradient is the combine of the row
gradients, as if the quantization were the identity.

The calls run on the ranks' own streams, ordered after each rank's device's current torch
stream and back, so they compose with the caller's stream. By default they block until the
output sizes are known. With ``num_rows_bound`` the dispatch (and the combine and backwards of
its handle) does not wait: outputs have ``num_rows_bound`` rows per rank (those past the
dispatch's own are left as they were), ``tokens_per_expert`` stays on the device, and the calls
can be captured in a CUDA graph (dispatch into a ``handle`` from ``Buffer.new_handle()``, made
before the capture); an overflow of the bound, or any other failure, is raised by the next
``Buffer.sync()``, and no rows are moved then. Errors: ``ValueError`` naming the argument for bad
input (nothing is written before the checks pass), ``RuntimeError`` when no GPU can be used or
the device fails.
"""

from __future__ import annotations

import ctypes
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from . import _megamoe
from ._dist import process_rank
from ._tensors import torch as _torch

torch = _torch()  # without PyTorch: the ImportError that names it

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

ORDERS = ("per_rank", "exact")


class Buffer:
    """Every rank of an expert-parallel world of ``num_ranks`` ranks in this process, and their
    symmetric buffer, sized for ``num_max_tokens_per_rank`` tokens per rank and segments padded
    to at most ``max_pad_multiple`` rows. ``num_sms``: SMs (blocks) each rank's kernels use
    (ranks sharing a GPU must fit on it together); ``deadline_ms``: the budget of every
    device-side wait. :meth:`for_process_group` builds one rank per process instead."""

    def __init__(
        self,
        num_ranks: int,
        num_experts: int,
        num_topk: int,
        hidden: int,
        num_max_tokens_per_rank: int,
        max_pad_multiple: int = 128,
        dtype: str = "bf16",
        num_sms: int | None = None,
        deadline_ms: int | None = None,
    ):
        self._attach(
            _megamoe.EpWorld(
                num_ranks,
                num_experts,
                num_topk,
                hidden,
                num_max_tokens_per_rank,
                max_pad_multiple,
                dtype,
                num_sms,
                deadline_ms,
            )
        )

    @classmethod
    def for_process_group(
        cls,
        num_experts: int,
        num_topk: int,
        hidden: int,
        num_max_tokens_per_rank: int,
        max_pad_multiple: int = 128,
        dtype: str = "bf16",
        num_sms: int | None = None,
        deadline_ms: int | None = None,
        group: ProcessGroup | None = None,
    ) -> Buffer:
        """This process's rank of a world of one process per rank: rank
        ``dist.get_rank(group)`` of ``dist.get_world_size(group)`` ranks (``group``: a
        torch.distributed process group, the default one when None), on the current CUDA device
        (``torch.cuda.set_device`` first; processes may share a GPU). Every process of the group
        calls it with the same arguments; the symmetric buffers' CUDA IPC handles are exchanged
        with ``all_gather_object`` (any backend: gloo, or nccl with one GPU per process). The
        other arguments are :class:`Buffer`'s; bad ones raise ValueError naming them before
        anything is allocated or exchanged (``num_ranks`` is the group's size)."""
        rank, size, all_gather, device = process_rank(group, "group")
        if size == 1:
            # A world of one exchanges with itself: no collective (whose first call would set up
            # the group's communicator).
            def all_gather(mine):
                return [mine]

        buffer = cls.__new__(cls)
        buffer._attach(
            _megamoe.EpWorld.for_rank(
                rank,
                device,
                all_gather,
                size,
                num_experts,
                num_topk,
                hidden,
                num_max_tokens_per_rank,
                max_pad_multiple,
                dtype,
                num_sms,
                deadline_ms,
            )
        )
        return buffer

    def _attach(self, world) -> None:
        self.world = world
        self.num_ranks = world.num_ranks
        self.num_experts = world.num_experts
        self.num_topk = world.num_topk
        self.hidden = world.hidden
        self.dtype = world.dtype
        self.ranks: list[int] = world.local_ranks
        """The ranks this process holds, in the order of every per-rank list."""
        self.devices = [self.device(r) for r in self.ranks]
        """Each of ``ranks``' GPU."""

    def device(self, rank: int) -> torch.device:
        """The GPU of rank ``rank`` (one of ``ranks``)."""
        return torch.device("cuda", self.world.device(rank))

    def streams(self) -> list[int]:
        """Each local rank's device's current torch stream, as the native calls take them."""
        return [torch.cuda.current_stream(d).cuda_stream for d in self.devices]

    def new_handle(self) -> Handle:
        """A routing state to dispatch into; allocates device memory, so make it before
        capturing a graph."""
        return Handle(self.world.new_handle())

    def sync(self) -> None:
        """Waits for every rank's calls (and the current streams, where replayed graphs run) and
        raises the first failure of the non-blocking ones."""
        self.world.sync(self.streams())


class Handle:
    """A dispatch's routing state on every rank of the buffer, reused by its combine and both backwards;
    every dispatch into it refills it (so the backward of an earlier dispatch into it is then
    wrong: reuse a handle only where its graph is replayed or no backward is pending)."""

    def __init__(self, native):
        self.native = native
        self.order = "per_rank"

    @property
    def num_tokens(self) -> list[int]:
        """Tokens per rank of ``Buffer.ranks``."""
        return self.native.num_tokens

    @property
    def num_rows(self) -> list[int]:
        """Rows per rank of ``Buffer.ranks``: exact after a blocking dispatch, the bound after a
        non-blocking one."""
        return self.native.num_rows


class Dispatched(NamedTuple):
    """What :func:`dispatch_with_permute` returns for this process's one rank."""

    rows: torch.Tensor
    """bf16 ``[rows, H]``: the received rows (dequantized on FP8 buffers)."""
    probs: torch.Tensor
    """f32 ``[rows]``: each row's router weight (0 on padding)."""
    tokens_per_expert: list[int] | torch.Tensor
    """The padded rows of each local expert: a list of ints, or after a non-blocking dispatch an
    int32 tensor on the rank's GPU."""
    handle: Handle
    fp8: tuple[torch.Tensor, torch.Tensor] | None
    """FP8 buffers: the e4m3 codes ``[rows, H]`` and f32 scales ``[rows, H/128]``."""


class DispatchedRanks(NamedTuple):
    """What :func:`dispatch_with_permute_ranks` returns: :class:`Dispatched`'s fields, each a list
    with one entry per rank of ``Buffer.ranks`` (the handle is shared)."""

    rows: list[torch.Tensor]
    probs: list[torch.Tensor]
    tokens_per_expert: list[list[int] | torch.Tensor]
    handle: Handle
    fp8: list[tuple[torch.Tensor, torch.Tensor]] | None


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 codes of bf16 ``x`` ``[T, H]`` with one f32 scale per 128 columns
    (scale = max(amax, 1e-4) / 448, codes = x / scale rounded to nearest)."""
    t, h = x.shape
    g = x.float().view(t, h // 128, 128)
    scales = g.abs().amax(dim=2).clamp_min(1e-4) / 448.0
    codes = (g * (1.0 / scales).unsqueeze(2)).to(torch.float8_e4m3fn).view(t, h)
    return codes, scales.contiguous()


def dequantize_fp8(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """bf16 values of e4m3 ``codes`` ``[N, H]`` with f32 ``scales`` ``[N, H/128]``."""
    n, h = codes.shape
    v = codes.float().view(n, h // 128, 128) * scales.unsqueeze(2)
    return v.view(n, h).to(torch.bfloat16)


def _per_rank(buffer: Buffer, name: str, value: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``value``, a list with one tensor per rank of ``buffer.ranks``."""
    if not isinstance(value, (list, tuple)):
        raise ValueError(
            f"{name}: expected a list of tensors, one per rank of buffer.ranks, got {type(value).__name__}"
        )
    if len(value) != len(buffer.ranks):
        raise ValueError(f"{name}: {len(value)} tensors for {len(buffer.ranks)} ranks (one per rank of buffer.ranks)")
    return list(value)


def _one_rank(buffer: Buffer, call: str) -> None:
    """The calls that take one rank's tensors need a buffer of one rank in this process."""
    if len(buffer.ranks) != 1:
        raise ValueError(
            f"buffer: holds ranks {buffer.ranks} in this process; {call}_ranks takes a list with one tensor per rank"
        )


def _lists_deprecated(call: str, *values) -> bool:
    """Whether a one-rank call was passed lists (per-rank values, the ``_ranks`` call's
    arguments); warns that they moved there."""
    if not any(isinstance(v, (list, tuple)) for v in values):
        return False
    warnings.warn(
        f"{call} with one list per argument is renamed {call}_ranks; {call} takes this process's one rank's tensors",
        DeprecationWarning,
        stacklevel=3,
    )
    return True


def _order(order: str) -> str:
    if order not in ORDERS:
        raise ValueError(f'order: {order!r} must be "per_rank" or "exact"')
    return order


def _empty(buffer: Buffer, i: int, shape, dtype) -> torch.Tensor:
    """An empty tensor on the GPU of the buffer's i-th local rank."""
    return torch.empty(shape, dtype=dtype, device=buffer.devices[i])


def run_dispatch(
    buffer: Buffer,
    handle: Handle,
    x: list[torch.Tensor],
    x_scales: list[torch.Tensor] | None,
    topk_idx: list[torch.Tensor],
    probs: list[torch.Tensor],
    pad_multiple: int,
    num_rows_bound: int | None,
    codes: list[torch.Tensor] | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor] | None, list[torch.Tensor], list]:
    """The dispatch into ``handle`` and the copy of its results out, without autograd (the
    calls :func:`dispatch_with_permute` and the compatibility layers make). Per local rank:
    ``x`` (bf16, or e4m3 with f32 ``x_scales`` on FP8 buffers), int32 ``topk_idx`` and f32
    ``probs``; ``codes``, when given, int32 ``[1]`` tensors that receive each rank's error code
    after the call (0: no failure since the last sync; set by an overflow of
    ``num_rows_bound``, which moves no rows), for the device to test. Returns lists per local
    rank: rows (the buffer's dtype), their scales (FP8, else None), row probs, and
    tokens_per_expert (lists of ints, or int32 device tensors after a non-blocking dispatch)."""
    r, h = len(buffer.ranks), buffer.hidden
    fp8 = buffer.dtype == "fp8"
    streams = buffer.streams()

    def outputs(n):
        rows = [_empty(buffer, i, (n[i], h), torch.float8_e4m3fn if fp8 else torch.bfloat16) for i in range(r)]
        row_scales = [_empty(buffer, i, (n[i], h // 128), torch.float32) for i in range(r)] if fp8 else None
        return rows, row_scales, [_empty(buffer, i, (n[i],), torch.float32) for i in range(r)]

    if num_rows_bound is not None:
        # Non-blocking: the sizes are the bound's, so the rows are copied out in the same call.
        # (A negative bound is the native call's ValueError, not torch's.)
        rows, row_scales, row_probs = outputs([max(num_rows_bound, 0)] * r)
        local = buffer.num_experts // buffer.num_ranks
        counts = [_empty(buffer, i, (local,), torch.int32) for i in range(r)]
        buffer.world.dispatch(
            handle.native,
            x,
            x_scales,
            topk_idx,
            probs,
            pad_multiple,
            num_rows_bound,
            streams,
            rows,
            row_scales,
            row_probs,
            counts,
            codes,
        )
        return rows, row_scales, row_probs, counts
    buffer.world.dispatch(handle.native, x, x_scales, topk_idx, probs, pad_multiple, None, streams)
    rows, row_scales, row_probs = outputs(handle.num_rows)
    buffer.world.read_dispatch(handle.native, rows, row_scales, row_probs, None, streams, codes)
    return rows, row_scales, row_probs, handle.native.tokens_per_expert


def run_combine(
    buffer: Buffer,
    handle: Handle,
    rows: list[torch.Tensor],
    order: str,
    prob_grads: list[torch.Tensor] | None = None,
    wait: bool = True,
) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """The combine of bf16 ``rows`` (per local rank, in ``handle``'s layout) in ``order``,
    without autograd. With ``prob_grads`` (f32 ``[rows_r]``) it is the dispatch's backward and
    the prob gradients are scattered back too. After a blocking dispatch it waits for the call
    unless ``wait`` is False (a failure is then reported by the next ``Buffer.sync()`` or
    blocking dispatch). Returns (y, grad_probs): lists per local rank of bf16 ``[T_r, H]`` and
    f32 ``[T_r, K]`` (None without ``prob_grads``)."""
    r, h, k = len(buffer.ranks), buffer.hidden, buffer.num_topk
    y = [_empty(buffer, i, (handle.num_tokens[i], h), torch.bfloat16) for i in range(r)]
    grad_probs = None
    if prob_grads is not None:
        grad_probs = [_empty(buffer, i, (handle.num_tokens[i], k), torch.float32) for i in range(r)]
    buffer.world.combine(handle.native, rows, order, y, buffer.streams(), prob_grads, grad_probs, wait)
    return y, grad_probs


def run_combine_backward(
    buffer: Buffer, handle: Handle, grad_y: list[torch.Tensor], wait: bool = True
) -> list[torch.Tensor]:
    """The combine's backward without autograd: bf16 ``grad_y`` ``[T_r, H]`` per local rank
    dispatched along ``handle``'s routing (waited for as in :func:`run_combine`); returns the
    bf16 row gradients ``[rows_r, H]``."""
    h = buffer.hidden
    grad_rows = [_empty(buffer, i, (handle.num_rows[i], h), torch.bfloat16) for i in range(len(buffer.ranks))]
    buffer.world.combine_backward(handle.native, grad_y, grad_rows, buffer.streams(), wait)
    return grad_rows


class _Dispatch(torch.autograd.Function):
    """Inputs after the settings: x (R tensors), probs (R tensors), R the buffer's local ranks.
    Outputs: rows (R), row probs (R)."""

    @staticmethod
    def forward(ctx, buffer, box, topk_idx, pad_multiple, order, num_rows_bound, *tensors):
        r = len(buffer.ranks)
        x, probs = list(tensors[:r]), list(tensors[r:])
        fp8 = buffer.dtype == "fp8"
        scales = None
        if fp8:
            quantized = [quantize_fp8(t) for t in x]
            x = [c for c, _ in quantized]
            scales = [s for _, s in quantized]
        handle = box.handle
        rows, row_scales, row_probs, box.tokens_per_expert = run_dispatch(
            buffer, handle, x, scales, topk_idx, probs, pad_multiple, num_rows_bound
        )
        handle.order = order
        if fp8:
            box.fp8 = list(zip(rows, row_scales))
            rows = [dequantize_fp8(c, s) for c, s in box.fp8]
        ctx.buffer, ctx.handle = buffer, handle
        return (*rows, *row_probs)

    @staticmethod
    def backward(ctx, *grads):
        buffer, handle = ctx.buffer, ctx.handle
        r, h = len(buffer.ranks), buffer.hidden
        grad_rows = [
            torch.zeros((handle.num_rows[i], h), dtype=torch.bfloat16, device=buffer.devices[i])
            if g is None
            else g.to(torch.bfloat16).contiguous()
            for i, g in enumerate(grads[:r])
        ]
        prob_grads = [
            torch.zeros((handle.num_rows[i],), dtype=torch.float32, device=buffer.devices[i])
            if g is None
            else g.float().contiguous()
            for i, g in enumerate(grads[r:])
        ]
        grad_x, grad_probs = run_combine(buffer, handle, grad_rows, handle.order, prob_grads)
        return (None, None, None, None, None, None, *grad_x, *grad_probs)


class _Combine(torch.autograd.Function):
    """Inputs after the settings: rows (R tensors), R the buffer's local ranks. Outputs: y (R)."""

    @staticmethod
    def forward(ctx, buffer, handle, order, *rows):
        y, _ = run_combine(buffer, handle, list(rows), order)
        ctx.buffer, ctx.handle = buffer, handle
        return tuple(y)

    @staticmethod
    def backward(ctx, *grads):
        buffer, handle = ctx.buffer, ctx.handle
        h = buffer.hidden
        grad_y = [
            torch.zeros((handle.num_tokens[i], h), dtype=torch.bfloat16, device=buffer.devices[i])
            if g is None
            else g.to(torch.bfloat16).contiguous()
            for i, g in enumerate(grads)
        ]
        return (None, None, None, *run_combine_backward(buffer, handle, grad_y))


class _Box:
    """What the dispatch's forward takes and hands back besides tensors."""

    def __init__(self, handle: Handle):
        self.handle = handle
        self.tokens_per_expert = None
        self.fp8: list[tuple[torch.Tensor, torch.Tensor]] | None = None


def dispatch_with_permute(
    buffer: Buffer,
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    probs: torch.Tensor,
    pad_multiple: int = 1,
    order: str = "per_rank",
    num_rows_bound: int | None = None,
    handle: Handle | None = None,
) -> Dispatched:
    """Dispatches this process's rank's tokens to their experts' ranks (see the module's
    docstring), for a buffer of one rank here (one process per rank, or a world of one).

    ``x`` bf16 ``[T, H]``, ``topk_idx`` ``[T, K]`` integer expert ids (-1 masks a slot; int64 is
    converted), ``probs`` f32 ``[T, K]``, on the rank's GPU. ``order``: how the backward combines
    the row gradients. ``num_rows_bound``: the non-blocking mode (see the module's docstring);
    ``handle``: the routing state to refill (a new one by default). Differentiable in ``x`` and
    ``probs``. Lists (one tensor per rank) are :func:`dispatch_with_permute_ranks`' arguments:
    passing them here still works, with a DeprecationWarning."""
    if _lists_deprecated("dispatch_with_permute", x, topk_idx, probs):
        return dispatch_with_permute_ranks(buffer, x, topk_idx, probs, pad_multiple, order, num_rows_bound, handle)
    _one_rank(buffer, "dispatch_with_permute")
    d = dispatch_with_permute_ranks(buffer, [x], [topk_idx], [probs], pad_multiple, order, num_rows_bound, handle)
    return Dispatched(d.rows[0], d.probs[0], d.tokens_per_expert[0], d.handle, None if d.fp8 is None else d.fp8[0])


def dispatch_with_permute_ranks(
    buffer: Buffer,
    x: Sequence[torch.Tensor],
    topk_idx: Sequence[torch.Tensor],
    probs: Sequence[torch.Tensor],
    pad_multiple: int = 1,
    order: str = "per_rank",
    num_rows_bound: int | None = None,
    handle: Handle | None = None,
) -> DispatchedRanks:
    """:func:`dispatch_with_permute` for every rank this process holds (``buffer.ranks``; several
    for a world of virtual ranks, a test mode): each argument a list with one tensor per rank of
    ``buffer.ranks``, in that order; the result's fields are lists in the same order."""
    order = _order(order)
    x = _per_rank(buffer, "x", x)
    probs = _per_rank(buffer, "probs", probs)
    idx = [
        t.to(torch.int32).contiguous() if t.dtype == torch.int64 else t for t in _per_rank(buffer, "topk_idx", topk_idx)
    ]
    box = _Box(buffer.new_handle() if handle is None else handle)
    out = _Dispatch.apply(buffer, box, idx, pad_multiple, order, num_rows_bound, *x, *probs)
    r = len(buffer.ranks)
    return DispatchedRanks(list(out[:r]), list(out[r:]), box.tokens_per_expert, box.handle, box.fp8)


def combine_with_unpermute(buffer: Buffer, rows: torch.Tensor, handle: Handle, order: str = "per_rank") -> torch.Tensor:
    """Sums every token's rows back on this process's rank, unweighted, in ``order`` (see the
    module's docstring), for a buffer of one rank here. ``rows``: bf16 ``[rows, H]`` in the
    dispatch's layout (padding rows are not read). Returns bf16 ``[T, H]``. Differentiable in
    ``rows``. A list (one tensor per rank) is :func:`combine_with_unpermute_ranks`' argument:
    passing it here still works, with a DeprecationWarning."""
    if _lists_deprecated("combine_with_unpermute", rows):
        return combine_with_unpermute_ranks(buffer, rows, handle, order)
    _one_rank(buffer, "combine_with_unpermute")
    return combine_with_unpermute_ranks(buffer, [rows], handle, order)[0]


def combine_with_unpermute_ranks(
    buffer: Buffer, rows: Sequence[torch.Tensor], handle: Handle, order: str = "per_rank"
) -> list[torch.Tensor]:
    """:func:`combine_with_unpermute` for every rank this process holds: ``rows`` a list with one
    bf16 ``[rows_r, H]`` per rank of ``buffer.ranks``; returns the list of bf16 ``[T_r, H]`` in
    the same order."""
    order = _order(order)
    return list(_Combine.apply(buffer, handle, order, *_per_rank(buffer, "rows", rows)))


def reference(
    buffer: Buffer,
    x: Sequence[torch.Tensor],
    topk_idx: Sequence[torch.Tensor],
    probs: Sequence[torch.Tensor],
    pad_multiple: int,
    rows: Sequence[torch.Tensor],
    prob_grads: Sequence[torch.Tensor],
    grad_y: Sequence[torch.Tensor],
    order: str,
    x_scales: Sequence[torch.Tensor] | None = None,
) -> dict:
    """megamoe-core's CPU reference of dispatch (of ``x``, or of e4m3 ``x`` with ``x_scales``),
    combine of ``rows`` in ``order``, dispatch's backward of (``rows``, ``prob_grads``) and
    combine's backward of ``grad_y``. Every list holds one tensor per rank of the whole world
    (with one process per rank, gather the peers' first). Returns CPU tensors, one per rank: ``rows``, ``scales`` (FP8),
    ``probs``, ``tokens_per_expert``, ``y``, ``grad_x``, ``grad_probs``, ``grad_rows``."""

    def raw(ts):
        host = [t.detach().cpu().contiguous() for t in ts]
        return [ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()) for t in host]

    idx = [t.to(torch.int32) for t in topk_idx]
    out = _megamoe.ep_reference(
        buffer.hidden,
        buffer.num_experts,
        buffer.num_topk,
        pad_multiple,
        raw(x),
        None if x_scales is None else raw(x_scales),
        raw(idx),
        raw(probs),
        raw(rows),
        raw(prob_grads),
        raw(grad_y),
        order,
    )
    h, k = buffer.hidden, buffer.num_topk

    def tensors(key, dtype, width):
        shaped = []
        for b in out[key]:
            t = torch.frombuffer(bytearray(b), dtype=torch.uint8) if b else torch.empty(0, dtype=torch.uint8)
            t = t.view(dtype)
            shaped.append(t.view(-1, width) if width else t)
        return shaped

    fp8 = x_scales is not None
    return {
        "rows": tensors("rows", torch.float8_e4m3fn if fp8 else torch.bfloat16, h),
        "scales": tensors("scales", torch.float32, h // 128) if fp8 else None,
        "probs": tensors("probs", torch.float32, None),
        "tokens_per_expert": out["tokens_per_expert"],
        "y": tensors("y", torch.bfloat16, h),
        "grad_x": tensors("grad_x", torch.bfloat16, h),
        "grad_probs": tensors("grad_probs", torch.float32, k),
        "grad_rows": tensors("grad_rows", torch.bfloat16, h),
    }


class SymmetricMemory:
    """``nbytes`` of device memory on this process's GPU, opened in every process of the
    torch.distributed ``group`` (one process per GPU, as torchrun launches them): CUDA IPC
    handles of ``cuMemAlloc`` memory, exchanged with ``all_gather_object``. Raises
    RuntimeError, naming both ranks, when this GPU has no peer access to a peer's GPU."""

    def __init__(self, nbytes: int, group: ProcessGroup | None = None, device: int | None = None):
        import torch.distributed as dist

        device = torch.cuda.current_device() if device is None else device
        self._buf = _megamoe.IpcBuffer(device, nbytes)
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, self._buf.export(), group=group)
        self._buf.open(self.rank, gathered)
        self.nbytes = nbytes

    def ptr(self, rank: int) -> int:
        """Rank ``rank``'s buffer as a device address in this process."""
        return self._buf.ptr(rank)

    def copy_in(self, tensor: torch.Tensor, rank: int, offset: int = 0) -> None:
        """Copies the contiguous CUDA ``tensor`` into rank ``rank``'s buffer at byte ``offset``,
        on the current stream."""
        self._buf.copy(tensor, rank, offset, True, torch.cuda.current_stream().cuda_stream)

    def copy_out(self, tensor: torch.Tensor, rank: int, offset: int = 0) -> None:
        """Fills the contiguous CUDA ``tensor`` from rank ``rank``'s buffer at byte ``offset``,
        on the current stream."""
        self._buf.copy(tensor, rank, offset, False, torch.cuda.current_stream().cuda_stream)
