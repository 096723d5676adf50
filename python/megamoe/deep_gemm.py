"""DeepGEMM's mega-MoE Python API (``deep_gemm``'s SM90 entry points, with the fused kernel's
keywords) on megamoe's layer. Code written for it runs by changing its import::

    import megamoe.deep_gemm as deep_gemm

    buffer = deep_gemm.get_symm_buffer_for_mega_moe(group, num_experts, num_max_tokens_per_rank,
                                                    num_topk, hidden, intermediate_hidden,
                                                    fused=True)
    l1, l2 = deep_gemm.transform_weights_for_mega_moe_sm90((w1, w1_sf), (w2, w2_sf))
    buffer.x[:t].copy_(x_fp8); buffer.x_sf[:t].copy_(x_sf)
    buffer.topk_idx[:t].copy_(topk_idx); buffer.topk_weights[:t].copy_(topk_weights)
    deep_gemm.fp8_mega_moe(y, l1, l2, buffer, cumulative_local_expert_recv_stats=stats)

Names, argument order, defaults and return types are DeepGEMM's, and each argument means what it
means there. One process per rank of ``group`` (a torch.distributed process group; a group of one
process, or None, is world size 1), on the CUDA device current when the buffer is made.
What differs:

- Numerics (SPEC §3): every scale is the raw ``max(amax, floor) / 448`` (the seed's fused kernel's
  rule; DeepGEMM's split SM90 kernel rounds the intermediate's scale up to a power of two and
  always uses 64 columns per scale), the intermediate takes ``l2_act_sf_gran_k`` columns per scale
  (None: 128 when hidden and 2 * intermediate_hidden are multiples of 512, else 64), every
  128-wide K block is promoted into an f32 sum, and each token's rows are summed in f32 in
  ascending slot order with one rounding: the output is bitwise the same on every run and world
  size. ``fast_math`` has no effect (there is no approximate path).
- Weights: :func:`fp8_mega_moe` copies them into the layer (W1's gate and up halves interleaved by
  128-row blocks on the way) on the first call that passes them, and again whenever other tensors
  (or the same tensors written since) are passed; the transforms therefore leave them in the
  layout they take, SPEC §2's: W1 float8_e4m3fn [E_l, 2I, H] (gate rows, then up rows), its scales
  float32 [E_l, 2I/128, H/128], W2 float8_e4m3fn [E_l, H, I], its scales float32
  [E_l, H/128, I/128]. Weights already interleaved by DeepGEMM's transform are not that layout.
  A buffer holds one set of weights: a model whose layers share one buffer reloads at every
  layer; give each layer its own buffer. Loading synchronizes: do it (the first call) before
  capturing a CUDA graph.
- ``fused=False`` (DeepGEMM's default, its split kernel) runs megamoe's split layer, which reads
  the routing on the host: each call then synchronizes and cannot be captured in a CUDA graph.
  ``fused=True`` queues the call with no host synchronization; the routing's values are checked
  on the device (see :func:`fp8_mega_moe`).
- The staging tensors are this buffer's own memory; a call copies ``x`` and ``x_sf`` into the
  layer's symmetric buffer (peers read them from there) and checks ``topk_idx`` and
  ``topk_weights`` into it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from . import _megamoe
from ._megamoe import check_tensor
from ._tensors import stream, torch
from .layer import MoELayer, refuse_capture

if TYPE_CHECKING:
    from torch import Tensor
    from torch.distributed import ProcessGroup

    # (weights, scale factors) of this rank's experts.
    Weights = tuple[Tensor, Tensor]

# Rows of the layer's ring slots: capacities are rounded up to it, as DeepGEMM rounds them to its
# block sizes (the staging tensors then have DeepGEMM's shapes).
_TOKEN_ALIGNMENT = 128


def get_token_alignment_for_mega_moe() -> int:
    """Tokens per rank a buffer's capacity is rounded up to (DeepGEMM's query)."""
    return _TOKEN_ALIGNMENT


def _staging_layout(num_max_tokens_per_rank: int, num_topk: int, hidden: int) -> tuple[list[int], int]:
    """Byte offsets of x, x_sf, topk_idx, topk_weights in the staging allocation, and its size
    (each 16-byte aligned: hidden is a multiple of 128)."""
    t = num_max_tokens_per_rank
    sizes = [t * hidden, t * hidden // 128 * 4, t * num_topk * 8, t * num_topk * 4]
    offsets, at = [], 0
    for size in sizes:
        offsets.append(at)
        at += (size + 15) // 16 * 16
    return offsets, at


def get_symm_buffer_size_for_mega_moe(
    num_ranks: int,
    num_experts: int,
    num_max_tokens_per_rank: int,
    num_topk: int,
    hidden: int,
    intermediate_hidden: int,
    use_fp8_dispatch: bool = True,
    activation: str = "swiglu",
) -> tuple[int, Callable[[Tensor], tuple[Tensor, ...]]]:
    """(num_bytes, slice_input_buffers), DeepGEMM's size query: ``num_bytes`` is what one rank of
    such a fused buffer allocates on its GPU (the staging tensors, the layer's symmetric and
    private buffers and its copy of the experts' weights); ``slice_input_buffers(buffer)`` views an
    int8 CUDA tensor of at least that many bytes as the staging tensors (x, x_sf, topk_idx,
    topk_weights) at its start. DeepGEMM's slicer also returns views of its L1 and L2 pools;
    megamoe's layer keeps those to itself."""
    _dispatch_and_activation(use_fp8_dispatch, activation)
    sizes = _megamoe.get_symm_buffer_size(
        num_ranks, num_experts, num_max_tokens_per_rank, num_topk, hidden, intermediate_hidden, "fused"
    )
    offsets, staging = _staging_layout(num_max_tokens_per_rank, num_topk, hidden)
    total = staging + sizes["symmetric_bytes"] + sizes["local_bytes"] + sizes["weight_bytes"]

    def slice_input_buffers(buffer: Tensor) -> tuple[Tensor, ...]:
        return _staging_views(buffer, offsets, num_max_tokens_per_rank, num_topk, hidden)

    return total, slice_input_buffers


def _staging_views(buffer: Tensor, offsets: list[int], t: int, k: int, h: int) -> tuple[Tensor, ...]:
    th = torch()
    views = [(th.float8_e4m3fn, (t, h)), (th.float32, (t, h // 128)), (th.int64, (t, k)), (th.float32, (t, k))]
    out = []
    for at, (dtype, shape) in zip(offsets, views):
        n = shape[0] * shape[1] * th.empty((), dtype=dtype).element_size()
        out.append(buffer[at : at + n].view(dtype).view(shape))
    return tuple(out)


def _dispatch_and_activation(use_fp8_dispatch: bool, activation: str) -> None:
    if use_fp8_dispatch is not True:
        raise ValueError(f"use_fp8_dispatch: {use_fp8_dispatch!r}; the SM90 layer dispatches FP8 rows only (True)")
    if activation != "swiglu":
        raise ValueError(f"activation: {activation!r}; only 'swiglu' is supported")


class SymmBuffer:
    """A mega-MoE buffer of this process's rank of ``group``: the staging tensors ``x``
    (float8_e4m3fn [T_max, H]), ``x_sf`` (float32 [T_max, H/128]), ``topk_idx`` (int64
    [T_max, K]) and ``topk_weights`` (float32 [T_max, K]) that callers fill before each call, and
    the megamoe layer behind them (``layer``, a :class:`megamoe.MoELayer`; its memory is allocated
    when the first call loads the weights). ``num_max_tokens_per_rank`` is the capacity rounded up
    to :func:`get_token_alignment_for_mega_moe`."""

    def __init__(
        self,
        group: ProcessGroup | None,
        num_experts: int,
        num_max_tokens_per_rank: int,
        num_topk: int,
        hidden: int,
        intermediate_hidden: int,
        use_fp8_dispatch: bool = True,
        activation: str = "swiglu",
        fused: bool = False,
        num_experts_per_wave: int | None = None,
        l2_act_sf_gran_k: int | None = None,
        *,
        accumulation: str = "per-block",
    ):
        _dispatch_and_activation(use_fp8_dispatch, activation)
        if num_experts_per_wave is not None and (
            not isinstance(num_experts_per_wave, int) or num_experts_per_wave == 0 or num_experts_per_wave < -1
        ):
            raise ValueError(f"num_experts_per_wave: {num_experts_per_wave!r}; None, -1 or a positive count")
        if l2_act_sf_gran_k not in (None, 64, 128):
            raise ValueError(f"l2_act_sf_gran_k: {l2_act_sf_gran_k!r}; 64, 128 or None")
        self.group = group
        self.num_experts = num_experts
        self.num_max_tokens_per_rank = num_max_tokens_per_rank
        self.num_topk = num_topk
        self.hidden = hidden
        self.intermediate_hidden = intermediate_hidden
        # DeepGEMM's ring sizing knob: megamoe sizes its ring by its own rule (the output does
        # not depend on it), so it is checked and kept only.
        self.num_experts_per_wave = num_experts_per_wave
        self._kind = "fused" if fused else "split"
        self._gran = l2_act_sf_gran_k
        self._accumulation = accumulation
        # Every shape rule, as a ValueError naming the argument, before anything is allocated.
        size = 1 if group is None else _world_size(group)
        _megamoe.get_symm_buffer_size(
            size,
            num_experts,
            num_max_tokens_per_rank,
            num_topk,
            hidden,
            intermediate_hidden,
            self._kind,
            l2_act_sf_gran_k,
            accumulation=accumulation,
        )
        self.num_ranks = size
        th = torch()
        offsets, staging = _staging_layout(num_max_tokens_per_rank, num_topk, hidden)
        self._staging_device = th.cuda.current_device()
        self.buffer = th.zeros(staging, dtype=th.int8, device=f"cuda:{self._staging_device}")
        self.x, self.x_sf, self.topk_idx, self.topk_weights = _staging_views(
            self.buffer, offsets, num_max_tokens_per_rank, num_topk, hidden
        )
        self._staging = tuple(t.data_ptr() for t in (self.x, self.x_sf, self.topk_idx, self.topk_weights))
        self.layer = None
        self._clamp = None
        # The addresses and versions of the weight tensors the layer holds, and the tuples and
        # tensors they were passed as (the next call's fast check).
        self._weights = None
        self._passed = (None, None, ())

    def destroy(self) -> None:
        """Frees the staging tensors and the layer."""
        self.layer = self._weights = self._staging = None
        self._passed = (None, None, ())
        self.buffer = self.x = self.x_sf = self.topk_idx = self.topk_weights = None
        self.group = None

    def _versions(self) -> tuple[int, ...]:
        return tuple(t._version for t in self._passed[2])

    def _layer_for(self, clamp: float | None, l1_weights: Weights, l2_weights: Weights) -> MoELayer:
        """The layer with SwiGLU clamp ``clamp`` holding these weights (built and loaded when
        either differs from the last call's)."""
        if (
            self.layer is not None
            and l1_weights is self._passed[0]
            and l2_weights is self._passed[1]
            and clamp == self._clamp
            and self._versions() == self._weights[1]
        ):
            return self.layer  # the tuples of the last call, their tensors unwritten since
        w1, s1 = _pair("l1_weights", l1_weights)
        w2, s2 = _pair("l2_weights", l2_weights)
        tensors = (w1, s1, w2, s2)
        key = (tuple(t.data_ptr() for t in tensors), tuple(t._version for t in tensors))
        if self.layer is not None and key == self._weights and clamp == self._clamp:
            self._passed = (l1_weights, l2_weights, tensors)
            return self.layer
        if self.buffer is None:
            raise ValueError("sym_buffer: destroyed")
        th = torch()
        if th.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "l1_weights: new weights (or a new activation_clamp) are loaded "
                "with host synchronization, which a CUDA graph cannot capture: "
                "make one call before capturing"
            )
        if self.layer is None or clamp != self._clamp:
            args = (
                self.num_experts,
                self.num_max_tokens_per_rank,
                self.num_topk,
                self.hidden,
                self.intermediate_hidden,
                self._kind,
                self._gran,
                clamp,
            )
            self.layer = None  # its memory first
            self.layer = (
                MoELayer.of_rank(
                    0, self._staging_device, lambda mine: [mine], 1, *args, accumulation=self._accumulation
                )
                if self.num_ranks == 1
                else MoELayer.for_process_group(*args, process_group=self.group, accumulation=self._accumulation)
            )
            self._clamp = clamp
        self._weights = None
        self.layer.load_weights(w1, s1, w2, s2)
        self._weights = key
        self._passed = (l1_weights, l2_weights, tensors)
        self._device = self.layer.device()
        return self.layer


def _world_size(group: ProcessGroup) -> int:
    import torch.distributed as dist

    return dist.get_world_size(group)


def _pair(name: str, weights: Weights) -> Weights:
    if not isinstance(weights, (tuple, list)) or len(weights) != 2:
        raise ValueError(f"{name}: expected a tuple (weights, scale factors)")
    return weights


def get_symm_buffer_for_mega_moe(
    group: ProcessGroup | None,
    num_experts: int,
    num_max_tokens_per_rank: int,
    num_topk: int,
    hidden: int,
    intermediate_hidden: int,
    use_fp8_dispatch: bool = True,
    activation: str = "swiglu",
    fused: bool = False,
    num_experts_per_wave: int | None = None,
    l2_act_sf_gran_k: int | None = None,
    *,
    accumulation: str = "per-block",
) -> SymmBuffer:
    """The :class:`SymmBuffer` of this process's rank of ``group``, its capacity rounded up to
    :func:`get_token_alignment_for_mega_moe`. ``fused``: megamoe's fused layer (True) or its
    split layer (False, DeepGEMM's default; see the module's notes); ``l2_act_sf_gran_k``: columns
    per scale of the intermediate (64 or 128; None: the shape rule); ``num_experts_per_wave``:
    DeepGEMM's ring sizing (None, -1 or N), accepted and checked; megamoe's ring follows its own
    rule, and results do not depend on it. ``accumulation`` (megamoe's keyword-only addition to
    DeepGEMM's signature):
    "per-block" (the default, SPEC §3: error flat in the hidden size) or "rescaled" (the running
    sum kept in the tensor cores' accumulator, as DeepGEMM's fused kernel does: its error
    growing with the hidden size; see :class:`megamoe.MoELayer`). Bad arguments raise
    ValueError naming them."""
    if not isinstance(num_max_tokens_per_rank, int) or num_max_tokens_per_rank < 0:
        raise ValueError(f"num_max_tokens_per_rank: {num_max_tokens_per_rank!r} must be a count")
    align = get_token_alignment_for_mega_moe()
    capacity = (num_max_tokens_per_rank + align - 1) // align * align
    return SymmBuffer(
        group,
        num_experts,
        capacity,
        num_topk,
        hidden,
        intermediate_hidden,
        use_fp8_dispatch,
        activation,
        fused,
        num_experts_per_wave,
        l2_act_sf_gran_k,
        accumulation=accumulation,
    )


def transform_weights_for_mega_moe(l1_weights: Weights, l2_weights: Weights) -> tuple[Weights, Weights]:
    """The weights in the layout :func:`fp8_mega_moe` takes: SPEC §2's, the layout they come in
    (W1's gate rows then up rows; block (128, 128) float scales), returned as they are after
    their dtypes and shapes are checked. DeepGEMM's transforms interleave W1's gate and up rows
    for its kernels; megamoe's layer interleaves them (by 128-row blocks) when it loads them."""
    th = torch()
    w1, s1 = _pair("l1_weights", l1_weights)
    w2, s2 = _pair("l2_weights", l2_weights)
    for name, t, dtype in (
        ("l1_weights", w1, th.float8_e4m3fn),
        ("l1_weights", s1, th.float32),
        ("l2_weights", w2, th.float8_e4m3fn),
        ("l2_weights", s2, th.float32),
    ):
        if not isinstance(t, th.Tensor) or t.dtype != dtype or t.dim() != 3:
            raise ValueError(f"{name}: expected ({dtype} [E_l, N, K], float32 [E_l, N/128, K/128])")
    e, two_i, h = w1.shape
    if tuple(w2.shape) != (e, h, two_i // 2) or two_i % 2:
        raise ValueError(
            f"l2_weights: shape {tuple(w2.shape)}, expected ({e}, {h}, {two_i // 2}) "
            f"for l1_weights of shape {tuple(w1.shape)}"
        )
    for name, s, w in (("l1_weights", s1, w1), ("l2_weights", s2, w2)):
        want = (w.shape[0], w.shape[1] // 128, w.shape[2] // 128)
        if tuple(s.shape) != want:
            raise ValueError(f"{name}: scale factors of shape {tuple(s.shape)}, expected {want}")
    return (w1, s1), (w2, s2)


def transform_weights_for_mega_moe_sm90(l1_weights: Weights, l2_weights: Weights) -> tuple[Weights, Weights]:
    """DeepGEMM's SM90 name of :func:`transform_weights_for_mega_moe` (the same layout)."""
    return transform_weights_for_mega_moe(l1_weights, l2_weights)


def fp8_mega_moe(
    y: Tensor,
    l1_weights: Weights,
    l2_weights: Weights,
    sym_buffer: SymmBuffer,
    cumulative_local_expert_recv_stats: Tensor | None = None,
    recipe: tuple[int, int, int] = (128, 128, 128),
    activation: str = "swiglu",
    activation_clamp: float | None = None,
    fast_math: bool = True,
    num_tokens_bound: int | None = None,
) -> None:
    """y = the MoE layer of the first T = ``y.shape[0]`` rows staged in ``sym_buffer`` (``x``,
    ``x_sf``, ``topk_idx``, ``topk_weights``), on the current CUDA stream. ``y``: bfloat16
    [T, H] on this rank's device, written. ``l1_weights``, ``l2_weights``: (weights, scale
    factors) of this rank's experts (:func:`transform_weights_for_mega_moe`). ``recipe``: (128,
    128, 128), the block scaling of SM90 (the only one). ``cumulative_local_expert_recv_stats``:
    int32 [E_l], the rows each of this rank's experts receives from every rank are added to it.
    ``activation_clamp``: the SwiGLU clamp (None: none). ``num_tokens_bound``: the same on every
    rank, at least every rank's T, at most the capacity (None: the capacity); it picks the call's
    order (a bound under the capacity lets decode calls run as one wave).

    Shapes, dtypes and devices are checked before anything is queued (ValueError naming the
    argument). With ``fused=True`` the call only queues work (a CUDA graph captures it) and the
    routing's values are checked on the device: a token whose ``topk_idx`` row names an expert
    outside [-1, E) or one expert twice, or whose routed slot has a NaN or infinite weight, gets
    a zero row in ``y``, every other row is what a clean call writes, and the first such slot is
    raised as a ValueError naming ``topk_idx`` or ``topk_weights`` by the next call (which then
    queues nothing) or by ``sym_buffer.layer.check()``; the buffer stays usable. With
    ``fused=False`` the values are checked on the host first and the call synchronizes."""
    if recipe != (128, 128, 128) and tuple(recipe) != (128, 128, 128):
        raise ValueError(f"recipe: {tuple(recipe)}; SM90 takes block scaling (128, 128, 128)")
    if activation != "swiglu":
        raise ValueError(f"activation: {activation!r}; only 'swiglu' is supported")
    if activation_clamp is not None and not activation_clamp >= 0:
        raise ValueError(f"activation_clamp: {activation_clamp} must be at least 0")
    if not isinstance(sym_buffer, SymmBuffer):
        raise ValueError(f"sym_buffer: expected a SymmBuffer, got {type(sym_buffer).__name__}")
    th = torch()
    layer = sym_buffer._layer_for(activation_clamp, l1_weights, l2_weights)
    device = sym_buffer._device
    h = sym_buffer.hidden
    y_ptr = check_tensor("y", y, th.bfloat16, (None, h), device)
    tokens = y.shape[0]
    if tokens > sym_buffer.num_max_tokens_per_rank:
        raise ValueError(f"y: {tokens} tokens exceed num_max_tokens_per_rank {sym_buffer.num_max_tokens_per_rank}")
    stats = cumulative_local_expert_recv_stats
    local_experts = sym_buffer.num_experts // layer.num_ranks
    stats_ptr = (
        None
        if stats is None
        else check_tensor("cumulative_local_expert_recv_stats", stats, th.int32, (local_experts,), device)
    )
    x, x_sf, topk_idx, topk_weights = sym_buffer._staging
    staged = (tokens, x, x_sf, topk_idx, True, topk_weights, y_ptr)
    streams = [stream(device)]
    if layer.kind == "fused":
        layer._native.launch([staged + (stats_ptr,)], num_tokens_bound, streams)
        return
    refuse_capture("sym_buffer", "a buffer of fused=True queues its calls")
    rank = layer.ranks[0]
    before = layer._native.expert_counts(rank) if stats is not None else None
    layer._native.forward([staged + (None,)], num_tokens_bound, streams)
    if stats is not None:
        after = layer._native.expert_counts(rank)
        added = [a - b for a, b in zip(after, before)]
        stats += th.tensor(added, dtype=th.int32, device=stats.device)
