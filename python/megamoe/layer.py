"""The MoE layer on the GPU for PyTorch users: ``get_symm_buffer_for_mega_moe`` (DeepGEMM's
name) builds an :class:`MoELayer`, ``load_weights`` takes the experts' FP8 weights,
``forward`` runs the layer (fused or split) on the caller's current CUDA stream.

A layer is this process's one rank of a torch.distributed group, one process per rank as
torchrun launches them (``MoELayer.for_process_group(...)``, or ``get_symm_buffer_for_mega_moe``
with ``process_group``: it loads this rank's experts alone), a world of one rank
(``MoELayer(1, ...)``), or, for tests, every rank of a world in this process
(``MoELayer(num_ranks, ...)``, virtual ranks where they outnumber the GPUs). ``forward`` takes and
returns this process's one rank's tensors; a layer of several ranks here runs through
:meth:`MoELayer.forward_ranks`, which takes and returns a list with one per rank.

Tensors cross by address (no libtorch link); each is checked (dtype, shape, device, contiguity,
alignment: ``megamoe._megamoe.check_tensor``) before anything is written. ``forward`` without
``y`` also checks the values in Rust: it reads ``topk_idx`` and ``topk_weights`` back to the host
(T x K values each) and returns once the layer's kernels are done, with a new ``y`` written.
``forward`` given ``y`` (the fused kind) only queues the call on the caller's stream: no host
synchronization, so a CUDA graph captures it; the device checks the values instead, and a later
call or :meth:`check` reports what it found.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Callable, Union

from . import _megamoe
from ._dist import process_rank
from ._megamoe import check_tensor
from ._tensors import stream, torch

if TYPE_CHECKING:
    from torch import Tensor
    from torch.distributed import ProcessGroup

    # A bf16 input, or one already quantized: (e4m3 codes [T, H], f32 scales [T, H/128]).
    Activations = Union[Tensor, tuple[Tensor, Tensor]]


def scale_granularity_of(scale_granularity: int | None, group: int | None) -> int | None:
    """``scale_granularity``, or the value of the keyword it replaces, ``group`` (kept for one
    release with a DeprecationWarning: a process group is what the name suggests)."""
    if group is None:
        return scale_granularity
    warnings.warn(
        "group= is renamed scale_granularity= (columns per scale of the intermediate); "
        "group= goes away in the next release",
        DeprecationWarning,
        stacklevel=3,
    )
    if scale_granularity is not None and scale_granularity != group:
        raise ValueError(
            f"group: {group} contradicts scale_granularity {scale_granularity} "
            "(group is its deprecated name; pass scale_granularity alone)"
        )
    return group


def refuse_capture(arg: str, remedy: str) -> None:
    """A call that reads values back to the host cannot be captured in a CUDA graph: a
    RuntimeError naming ``arg`` and the ``remedy`` when the current stream is capturing."""
    if torch().cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"{arg}: this call reads the routing back to the host, which a CUDA graph cannot capture; {remedy}"
        )


class MoELayer:
    """The layer of ``num_ranks`` ranks (real or virtual: rank r runs on CUDA device r modulo the
    visible devices) for tokens of ``hidden`` columns routed to ``num_topk`` of ``num_experts``
    experts of ``intermediate_hidden`` columns, at most ``num_max_tokens_per_rank`` tokens per
    rank and call. ``kind``: "fused" (one persistent kernel, the default) or "split";
    ``scale_granularity``: columns per scale of the re-quantized intermediate (64 or 128, None:
    SPEC's default; ``group``, its old name, still works with a DeprecationWarning); ``clamp``:
    the optional SwiGLU clamp; ``accumulation``: how both GEMMs sum over K, "per-block" (the
    default: each 128-wide K block is promoted into an f32 sum, SPEC §3, error flat in H) or
    "rescaled" (opt-in: the running sum stays in the tensor cores' accumulator and is rescaled
    per block, as the seed kernel does: its error growing with H, and no faster here; both
    modes measured in docs/PYTHON.md, "Accumulation"). Both kinds give the same bits in either
    mode.

    Raises ValueError naming the argument for a shape the kernels do not take, RuntimeError when
    no CUDA GPU can be used. The memory is allocated by :meth:`load_weights`
    (``get_symm_buffer_size`` reports it beforehand). ``ranks``: the ranks this process holds,
    every rank here (:meth:`for_process_group` builds one rank per process instead); with more
    than one, the layer runs through :meth:`forward_ranks`.
    """

    num_ranks: int
    num_experts: int
    num_max_tokens_per_rank: int
    num_topk: int
    hidden: int
    intermediate_hidden: int
    kind: str
    scale_granularity: int
    clamp: float | None
    accumulation: str
    ranks: list[int]

    def __init__(
        self,
        num_ranks: int,
        num_experts: int,
        num_max_tokens_per_rank: int,
        num_topk: int,
        hidden: int,
        intermediate_hidden: int,
        kind: str = "fused",
        scale_granularity: int | None = None,
        clamp: float | None = None,
        *,
        accumulation: str = "per-block",
        group: int | None = None,
    ):
        gran = scale_granularity_of(scale_granularity, group)
        self._attach(
            _megamoe.Layer(
                num_ranks,
                num_experts,
                num_max_tokens_per_rank,
                num_topk,
                hidden,
                intermediate_hidden,
                kind,
                gran,
                clamp,
                accumulation,
            )
        )

    @classmethod
    def for_process_group(
        cls,
        num_experts: int,
        num_max_tokens_per_rank: int,
        num_topk: int,
        hidden: int,
        intermediate_hidden: int,
        kind: str = "fused",
        scale_granularity: int | None = None,
        clamp: float | None = None,
        process_group: ProcessGroup | None = None,
        *,
        accumulation: str = "per-block",
        group: int | None = None,
    ) -> MoELayer:
        """This process's rank of a layer of one process per rank (either kind): rank
        ``dist.get_rank(process_group)`` of ``dist.get_world_size(process_group)`` ranks
        (``process_group``: a torch.distributed process group, the default one when None), on
        the current CUDA device (``torch.cuda.set_device`` first; processes may share a GPU).
        Every process of the group calls it with the same arguments, then :meth:`load_weights`
        with its own experts, then :meth:`forward` with its own tokens, each in the same order;
        the symmetric buffers' CUDA IPC handles are exchanged with ``all_gather_object`` when
        the weights are loaded (any backend: gloo, or nccl with one GPU per process). The other
        arguments are :class:`MoELayer`'s; bad ones raise ValueError naming them before any GPU
        memory is allocated or anything exchanged (``num_ranks`` is the group's size)."""
        gran = scale_granularity_of(scale_granularity, group)
        rank, size, all_gather, device = process_rank(process_group, "process_group")
        return cls.of_rank(
            rank,
            device,
            all_gather,
            size,
            num_experts,
            num_max_tokens_per_rank,
            num_topk,
            hidden,
            intermediate_hidden,
            kind,
            gran,
            clamp,
            accumulation=accumulation,
        )

    @classmethod
    def of_rank(
        cls,
        rank: int,
        device: int,
        all_gather: Callable[[bytes], list[bytes]],
        num_ranks: int,
        num_experts: int,
        num_max_tokens_per_rank: int,
        num_topk: int,
        hidden: int,
        intermediate_hidden: int,
        kind: str = "fused",
        scale_granularity: int | None = None,
        clamp: float | None = None,
        *,
        accumulation: str = "per-block",
    ) -> MoELayer:
        """Rank ``rank`` of a world of ``num_ranks`` processes on CUDA device ``device``, its
        symmetric buffers' handles exchanged by ``all_gather(bytes) -> list[bytes]`` (called by
        every process in the same order): :meth:`for_process_group` without torch.distributed
        (a world of one process: ``all_gather=lambda mine: [mine]``)."""
        layer = cls.__new__(cls)
        layer._attach(
            _megamoe.Layer.for_rank(
                rank,
                device,
                all_gather,
                num_ranks,
                num_experts,
                num_max_tokens_per_rank,
                num_topk,
                hidden,
                intermediate_hidden,
                kind,
                scale_granularity,
                clamp,
                accumulation,
            )
        )
        return layer

    def _attach(self, native: _megamoe.Layer) -> None:
        self._native = native
        (
            self.num_ranks,
            self.num_experts,
            self.num_max_tokens_per_rank,
            self.num_topk,
            self.hidden,
            self.intermediate_hidden,
            self.kind,
            self.scale_granularity,
            self.clamp,
            self.accumulation,
        ) = native.spec()
        self.ranks = list(native.local_ranks())

    @property
    def group(self) -> int:
        """Deprecated name of :attr:`scale_granularity`."""
        warnings.warn("MoELayer.group is renamed scale_granularity", DeprecationWarning, stacklevel=2)
        return self.scale_granularity

    def device(self, rank: int | None = None) -> int:
        """The CUDA device index rank ``rank`` runs on (None: this process's first rank)."""
        return self._native.rank_device(self.ranks[0] if rank is None else rank)

    def load_weights(self, w1: Tensor, w1_scales: Tensor, w2: Tensor, w2_scales: Tensor) -> None:
        """Loads the experts of this process's ranks in SPEC §2's layouts, from CUDA tensors on
        one device, E_x of them: with every rank here all ``num_experts`` (E_x = E; rank r takes
        experts r*E_l to (r+1)*E_l - 1, E_l = num_experts / num_ranks), with one rank per process
        (:meth:`for_process_group`) this rank's E_l experts alone (E_x = E_l: experts r*E_l to
        (r+1)*E_l - 1 of the model, first to last). ``w1`` float8_e4m3fn [E_x, 2I, H] (rows
        0..I-1 gate, I..2I-1 up), ``w1_scales`` float32 [E_x, 2I/128, H/128], ``w2``
        float8_e4m3fn [E_x, H, I], ``w2_scales`` float32 [E_x, H/128, I/128]. Allocates the
        layer's buffers and uploads its own copy (W1's gate and up blocks interleaved on the
        way); the tensors may be freed afterwards. A second call replaces the weights. With one
        rank per process every process of the group calls it (the buffers' handles are
        exchanged here)."""
        th = torch()
        h, i = self.hidden, self.intermediate_hidden
        e = self.num_experts // self.num_ranks * len(self.ranks)
        device = w1.device.index if isinstance(w1, th.Tensor) and w1.is_cuda else self.device()
        ptrs = [
            check_tensor("w1", w1, th.float8_e4m3fn, (e, 2 * i, h), device),
            check_tensor("w1_scales", w1_scales, th.float32, (e, 2 * i // 128, h // 128), device),
            check_tensor("w2", w2, th.float8_e4m3fn, (e, h, i), device),
            check_tensor("w2_scales", w2_scales, th.float32, (e, h // 128, i // 128), device),
        ]
        self._native.load_weights(*ptrs, device, stream(device))

    def forward(
        self,
        x: Activations,
        topk_idx: Tensor,
        topk_weights: Tensor,
        num_tokens_bound: int | None = None,
        y: Tensor | None = None,
    ) -> Tensor:
        """y = the MoE layer of x (SPEC §3) for this process's one rank (a layer of several
        ranks here runs through :meth:`forward_ranks`). ``x`` bfloat16 [T, H], or already
        quantized as a tuple (float8_e4m3fn [T, H], float32 scales [T, H/128]); ``topk_idx``
        int32 or int64 [T, K], experts in [0, E) or -1 for a masked slot; ``topk_weights``
        float32 [T, K]; all on the rank's device (:meth:`device`). Returns y, bfloat16 [T, H].
        ``num_tokens_bound``: at least every rank's T, at most num_max_tokens_per_rank (None:
        the capacity's plan); with one rank per process every process passes the same one.

        Without ``y``: the values are checked on the host first (a bad one raises ValueError
        naming it and nothing is written), and the call returns once a new y is written.

        Given ``y`` (bfloat16 [T, H], written; returned), the fused kind queues the call on the
        current stream and returns at once: nothing is read back, nothing allocated, so
        ``torch.cuda.graph`` captures it (the tensors' addresses are then the graph's: replays
        read whatever they hold). Shapes, dtypes and devices are still checked here. The values
        are checked on the device: a token whose ``topk_idx`` row names an expert outside
        [-1, E) or one expert twice, or whose routed slot's ``topk_weights`` entry is NaN or
        infinite, gets a zero row in ``y``; every other token's row is what a clean call
        writes. The first such slot is reported as a ValueError naming ``topk_idx`` or
        ``topk_weights`` (and the rank) by the next ``forward`` (which then runs nothing) or by
        :meth:`check`; the layer stays usable. The split kind reads the routing on the host to
        plan its dispatch: given ``y`` it checks and synchronizes as without, and writes ``y``.

        Lists (one entry per rank of a layer of several ranks here) are :meth:`forward_ranks`'
        arguments: passing them here still works, with a DeprecationWarning."""
        if any(isinstance(v, list) for v in (x, topk_idx, topk_weights, y)):
            warnings.warn(
                "MoELayer.forward with one list per argument is renamed "
                "MoELayer.forward_ranks; forward takes this process's one rank's tensors",
                DeprecationWarning,
                stacklevel=2,
            )
            return self.forward_ranks(x, topk_idx, topk_weights, num_tokens_bound, y)
        if len(self.ranks) != 1:
            raise ValueError(
                f"x: this layer holds ranks {self.ranks} in this process; "
                "forward_ranks takes a list with one tensor per rank"
            )
        return self.forward_ranks([x], [topk_idx], [topk_weights], num_tokens_bound, None if y is None else [y])[0]

    def forward_ranks(
        self,
        x: Sequence[Activations],
        topk_idx: Sequence[Tensor],
        topk_weights: Sequence[Tensor],
        num_tokens_bound: int | None = None,
        y: Sequence[Tensor] | None = None,
    ) -> list[Tensor]:
        """:meth:`forward` for every rank this process holds (``ranks``; several for a layer of
        virtual ranks, a test mode): each argument a list with one value per rank of ``ranks``,
        in that order, each on its rank's device; returns the list of y. ``num_tokens_bound``
        is at least every rank's T; given ``y`` (a list), the fused kind queues the call on each
        rank's current stream."""
        n = len(self.ranks)
        per_rank = {"x": x, "topk_idx": topk_idx, "topk_weights": topk_weights}
        if y is not None:
            per_rank["y"] = y
        for name, v in per_rank.items():
            if not isinstance(v, (list, tuple)) or len(v) != n:
                raise ValueError(f"{name}: expected a list of {n} per-rank values")
        ys = per_rank.get("y", [None] * n)
        calls = [self._rank_tensors(r, x[j], topk_idx[j], topk_weights[j], ys[j]) for j, r in enumerate(self.ranks)]
        tensors = [args for args, _ in calls]
        if y is not None and self.kind == "fused":
            self._native.launch(tensors, num_tokens_bound, self._current_streams())
        else:
            refuse_capture(
                *(("y", "pass y") if self.kind == "fused" else ("kind", "the fused kind given y queues its calls"))
            )
            self._native.forward(tensors, num_tokens_bound, self._current_streams())
        return [out for _, out in calls]

    def check(self) -> None:
        """Waits for the devices of this process's ranks (every stream, graph replays included)
        and raises what the device found since the last check: a ValueError naming the rank and
        ``topk_idx`` or ``topk_weights`` for the first bad value of a call given ``y``, or
        ``num_tokens_bound`` for bounds that differed between ranks (no rank ran that call); a
        RuntimeError for a device wait past its deadline (the layer must then be rebuilt)."""
        self._native.check()

    def _current_streams(self) -> list[int]:
        """Each local rank's device's current stream (the caller's), as driver handles."""
        return [stream(self.device(r)) for r in self.ranks]

    def _rank_tensors(
        self, r: int, x: Activations, topk_idx: Tensor, topk_weights: Tensor, y: Tensor | None = None
    ) -> tuple[tuple, Tensor]:
        """Rank r's checked arguments as the native call takes them, and its y (``y`` checked,
        or a new one)."""
        th = torch()
        h, k, device = self.hidden, self.num_topk, self.device(r)
        at = "" if len(self.ranks) == 1 else f"[{r}]"
        if isinstance(x, tuple):
            if len(x) != 2:
                raise ValueError(f"x{at}: an FP8 input is a tuple (x, x_scales)")
            data, scales = x
            x_ptr = check_tensor(f"x{at}", data, th.float8_e4m3fn, (None, h), device)
            tokens = data.shape[0]
            scales_ptr = check_tensor(f"x_scales{at}", scales, th.float32, (tokens, h // 128), device)
        else:
            x_ptr = check_tensor(f"x{at}", x, th.bfloat16, (None, h), device)
            tokens, scales_ptr = x.shape[0], None
        if tokens > self.num_max_tokens_per_rank:
            raise ValueError(f"x{at}: {tokens} tokens exceed num_max_tokens_per_rank {self.num_max_tokens_per_rank}")
        idx_ptr = check_tensor(f"topk_idx{at}", topk_idx, (th.int32, th.int64), (tokens, k), device)
        w_ptr = check_tensor(f"topk_weights{at}", topk_weights, th.float32, (tokens, k), device)
        if y is None:
            y = th.empty((tokens, h), dtype=th.bfloat16, device=f"cuda:{device}")
        y_ptr = check_tensor(f"y{at}", y, th.bfloat16, (tokens, h), device)
        is_64 = topk_idx.dtype == th.int64
        return (tokens, x_ptr, scales_ptr, idx_ptr, is_64, w_ptr, y_ptr, None), y


def get_symm_buffer_for_mega_moe(
    num_ranks: int | None,
    num_experts: int,
    num_max_tokens_per_rank: int,
    num_topk: int,
    hidden: int,
    intermediate_hidden: int,
    kind: str = "fused",
    scale_granularity: int | None = None,
    clamp: float | None = None,
    process_group: ProcessGroup | None = None,
    *,
    accumulation: str = "per-block",
    group: int | None = None,
) -> MoELayer:
    """An :class:`MoELayer`, with ``num_ranks`` (ranks of this process) where DeepGEMM's function
    of this name takes a process group (``megamoe.deep_gemm`` has DeepGEMM's signature). With
    ``process_group`` (a torch.distributed process group, e.g. ``dist.group.WORLD``), this
    process's one rank of a layer of one process per rank (:meth:`MoELayer.for_process_group`);
    ``num_ranks`` is then the group's size (None takes it). ``accumulation``: "per-block" (the
    default) or "rescaled", as :class:`MoELayer` says. ``group``: the deprecated name of
    ``scale_granularity``."""
    gran = scale_granularity_of(scale_granularity, group)
    if process_group is None:
        return MoELayer(
            num_ranks,
            num_experts,
            num_max_tokens_per_rank,
            num_topk,
            hidden,
            intermediate_hidden,
            kind,
            gran,
            clamp,
            accumulation=accumulation,
        )
    import torch.distributed as dist

    size = dist.get_world_size(process_group)
    if num_ranks is not None and num_ranks != size:
        raise ValueError(f"num_ranks: {num_ranks}, but the process group has {size} ranks")
    return MoELayer.for_process_group(
        num_experts,
        num_max_tokens_per_rank,
        num_topk,
        hidden,
        intermediate_hidden,
        kind,
        gran,
        clamp,
        process_group,
        accumulation=accumulation,
    )
