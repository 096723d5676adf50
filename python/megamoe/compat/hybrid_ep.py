"""``HybridEPBuffer``: DeepEP's HybridEP buffer interface, as Megatron-Core's flex token
dispatcher calls it (``megatron/core/transformer/moe/fused_a2a.py``), on megamoe's
dispatch/combine with fused permute (:mod:`megamoe.ep`, SPEC §5).

Megatron builds one buffer lazily, ``HybridEPBuffer(group=, hidden_dim=,
max_num_of_tokens_per_rank=, num_local_experts=, use_fp8=, ...)``, and calls two methods with
keywords only:

- ``dispatch_with_permute(hidden=, routing_map=, probs=, ...)`` sends every token's row to the
  ranks of its experts, grouped by local expert (column j of ``routing_map`` is expert j of the
  group, on rank ``j // num_local_experts``), and returns ``(rows, row_probs, scaling_factor,
  tokens_per_expert, handle)``. Called with ``handle=`` instead of a routing it is the combine's
  backward: the gradient ``[T, H]`` dispatched along that handle's routing.
- ``combine_with_unpermute(hidden=, handle=, probs=None, ...)`` sums every token's rows back
  (unweighted: the experts apply the probs) and returns ``(combined, probs_grad)``. Called with
  ``probs=`` (the gradient of the dispatched row probs) it is the dispatch's backward, and the
  second result is the routing probs' gradient ``[T, E]`` f32 (zero where ``routing_map`` is
  False).

The fused (``fuse_permute_dispatch`` / ``fuse_unpermute_combine``) and unfused calls run the same
megamoe kernels, whose permute always happens inside the communication kernel; the flags are
real parameters because Megatron checks for them with ``inspect.signature``.

Blocking and non-blocking: without ``num_permuted_tokens`` a dispatch waits until its output size
is known; ``rows`` then has exactly the dispatched rows and ``tokens_per_expert`` is an int64 CPU
tensor in pinned memory. With ``non_blocking=True`` and ``num_permuted_tokens`` (Megatron's
static budget, or ``capacity · ranks · local experts`` when it pads to capacity) nothing waits on
the host: ``rows`` has ``num_permuted_tokens`` rows (those past the dispatched ones are not
meaningful, as with HybridEP), ``tokens_per_expert`` stays on the GPU (int64), and a dispatch that
needs more rows than the budget moves no rows and sets the overflow flag ``handle[-1]`` (an int32
``[1]`` GPU tensor, nonzero on overflow; Megatron reads it when a capacity factor is set).
``pad_multiple`` pads each expert's segment with zero rows of prob 0. Combines and both backwards
never wait on the host: a failure of theirs (or of a non-blocking dispatch) is raised by the next
blocking dispatch or :meth:`HybridEPBuffer.sync`, except a budget overflow, which its flag
reported. Handles are recycled once nothing holds them (no device allocation per call).

Top-k: megamoe routes in top-k form (``[T, K]`` expert ids, at most 8 per token). The buffer
converts ``routing_map`` and ``probs`` on the GPU (no host sync in the non-blocking mode). Its
bound K is the constructor's ``num_topk``, else the environment variable
``MEGAMOE_HYBRID_EP_NUM_TOPK`` (for buffers Megatron builds: set it to ``moe_router_topk`` in
dropless runs to size the buffer for top-k rows), else min(8, E), which holds any routing of up
to 8 experts per token (padding to capacity can give a token more than its top-k). A token with
more than K experts is a ValueError naming routing_map in a blocking dispatch (read once the
dispatch has waited; nothing of it is returned); in a non-blocking one (where the host does not
read the routing) its experts past K are not routed and the overflow flag is set.

Ranks: one process per GPU through the torch.distributed ``group`` Megatron passes (its
expert-parallel group; a group of one works the same way), on the current CUDA device; or
:meth:`HybridEPBuffer.for_virtual_world`, every rank of a world in this process (ranks sharing a
GPU are virtual ranks, for tests), whose calls take and return lists with one tensor per rank.

Rows are bf16 (``use_fp8=True`` is refused with a ValueError: megamoe's FP8 dispatch quantizes
bf16 input itself, while HybridEP's takes caller-quantized rows and scales). Bad input is a
ValueError naming the argument, raised before anything is written; the buffer stays usable.
"""

from __future__ import annotations

import os
import weakref
from typing import TYPE_CHECKING, NamedTuple, Union

from .._megamoe import check_tensor
from .._tensors import torch as _torch

if TYPE_CHECKING:
    from torch import Tensor
    from torch.distributed import ProcessGroup

    # A tensor of the process-group buffer, or one per rank of a virtual world.
    Tensors = Union[Tensor, list[Tensor]]

#: The most experts one token can be routed to (megamoe's top-k bound).
MAX_TOPK = 8
#: The environment variable that sets K for buffers built without ``num_topk``.
TOPK_ENV = "MEGAMOE_HYBRID_EP_NUM_TOPK"


class Handle(NamedTuple):
    """What a dispatch leaves for its combine and both backwards; opaque to Megatron except its
    last entry, the overflow flag."""

    owner: object
    """The HybridEPBuffer that made it."""
    buffer: object
    """The megamoe.ep.Buffer it ran on."""
    state: object
    """The megamoe.ep.Handle."""
    topk_idx: list
    """Per rank the int32 ``[T_r, K]`` expert ids (-1: no expert), for the probs' gradient."""
    num_experts: int
    pad_multiple: int
    num_rows: list
    """Per rank the rows of the dispatch's output (the budget after a non-blocking one)."""
    overflow_flag: object
    """int32 ``[1]`` GPU tensor (a list of them, one per rank, for a virtual world): nonzero when
    a non-blocking dispatch needed more rows than its budget, or a token more experts than K."""


class HybridEPBuffer:
    """A HybridEP-compatible buffer on megamoe (see the module's docstring).

    ``group``: the torch.distributed process group of the expert-parallel ranks (one process per
    GPU). ``hidden_dim``: H (a multiple of 128). ``max_num_of_tokens_per_rank``: the most tokens
    one rank dispatches. ``num_local_experts``: experts per rank. ``use_fp8``: must be False.
    ``num_sms_dispatch_api`` / ``num_sms_combine_api``: SMs of the calls (megamoe runs dispatch
    and combine on one count: the larger of the two; megamoe's default when neither is given).
    ``num_sms_preprocessing_api``, ``num_blocks_permute``, ``num_blocks_unpermute``: accepted
    and unused (megamoe has no separate preprocessing or permute kernels). megamoe's own
    keywords: ``num_topk`` (the top-k bound K; see the module), ``max_pad_multiple`` (the
    largest ``pad_multiple`` the calls may use), ``deadline_ms`` (budget of every device-side
    wait)."""

    def __init__(
        self,
        group: ProcessGroup,
        hidden_dim: int,
        max_num_of_tokens_per_rank: int,
        num_local_experts: int,
        use_fp8: bool = False,
        num_sms_dispatch_api: int | None = None,
        num_sms_combine_api: int | None = None,
        num_sms_preprocessing_api: int | None = None,
        num_blocks_permute: int | None = None,
        num_blocks_unpermute: int | None = None,
        *,
        num_topk: int | None = None,
        max_pad_multiple: int = 128,
        deadline_ms: int | None = None,
    ):
        if group is None:
            raise ValueError(
                "group: a torch.distributed process group is required (for every rank "
                "in one process use HybridEPBuffer.for_virtual_world)"
            )
        sms = [
            _positive(name, n)
            for name, n in (
                ("num_sms_dispatch_api", num_sms_dispatch_api),
                ("num_sms_combine_api", num_sms_combine_api),
            )
            if n is not None
        ]
        self._setup(
            group,
            None,
            hidden_dim,
            max_num_of_tokens_per_rank,
            num_local_experts,
            use_fp8,
            max(sms) if sms else None,
            num_topk,
            max_pad_multiple,
            deadline_ms,
        )

    @classmethod
    def for_virtual_world(
        cls,
        num_ranks: int,
        hidden_dim: int,
        max_num_of_tokens_per_rank: int,
        num_local_experts: int,
        *,
        num_sms: int | None = None,
        num_topk: int | None = None,
        max_pad_multiple: int = 128,
        deadline_ms: int | None = None,
    ) -> HybridEPBuffer:
        """Every rank of a world of ``num_ranks`` ranks in this process (rank r on GPU
        ``r % G`` of the G visible GPUs), for tests: the calls take and return lists with one
        tensor per rank where the process-group buffer takes and returns one tensor."""
        buffer = cls.__new__(cls)
        buffer._setup(
            None,
            _positive("num_ranks", num_ranks),
            hidden_dim,
            max_num_of_tokens_per_rank,
            num_local_experts,
            False,
            None if num_sms is None else _positive("num_sms", num_sms),
            num_topk,
            max_pad_multiple,
            deadline_ms,
        )
        return buffer

    def _setup(
        self,
        group,
        num_ranks,
        hidden_dim,
        max_tokens,
        num_local_experts,
        use_fp8,
        num_sms,
        num_topk,
        max_pad_multiple,
        deadline_ms,
    ):
        if use_fp8:
            raise ValueError("use_fp8: megamoe's HybridEP-compatible buffer moves bf16 rows only")
        self.group = group
        self.hidden_dim = _positive("hidden_dim", hidden_dim)
        if self.hidden_dim % 128:
            raise ValueError(f"hidden_dim: {hidden_dim} is not a multiple of 128")
        self.max_num_of_tokens_per_rank = _positive("max_num_of_tokens_per_rank", max_tokens)
        self.num_local_experts = _positive("num_local_experts", num_local_experts)
        self.num_ranks = group.size() if group is not None else num_ranks
        if num_topk is None and os.environ.get(TOPK_ENV):
            try:
                num_topk = int(os.environ[TOPK_ENV])
            except ValueError:
                raise ValueError(f"num_topk: {TOPK_ENV}={os.environ[TOPK_ENV]!r} is not an integer") from None
        if num_topk is None:
            num_topk = min(MAX_TOPK, self.num_local_experts * self.num_ranks)
        if not 1 <= _positive("num_topk", num_topk) <= min(MAX_TOPK, self.num_local_experts * self.num_ranks):
            raise ValueError(f"num_topk: {num_topk} is outside 1..={MAX_TOPK} (and at most the experts)")
        self.num_topk = num_topk
        """The top-k bound K (see the module's docstring)."""
        self.max_pad_multiple = _positive("max_pad_multiple", max_pad_multiple)
        self.num_sms = num_sms
        self.deadline_ms = deadline_ms
        self._ep = None
        """The megamoe.ep.Buffer, built at the first dispatch (the constructor touches no GPU)."""
        self._unsynced = False
        """Whether non-blocking calls ran since the last sync (their failures are pending)."""
        self._free_states = []
        """Native handles of dispatches no one holds any more, for the next dispatches."""
        self._column_ids = {}
        self._zero_flags = None
        """The overflow flags of blocking dispatches (zero, never written), per rank."""

    @property
    def num_experts(self) -> int:
        return self.num_local_experts * self.num_ranks

    # -- checks ---------------------------------------------------------------------------

    def _per_rank(self, name, value, required=True):
        """``value`` as a list with one entry per rank this process holds."""
        th = _torch()
        if value is None:
            if required:
                raise ValueError(f"{name}: required")
            return None
        if self.group is not None:
            if not isinstance(value, th.Tensor):
                raise ValueError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
            return [value]
        values = list(value) if isinstance(value, (list, tuple)) else None
        if values is None or len(values) != self.num_ranks:
            raise ValueError(f"{name}: expected a list of {self.num_ranks} tensors, one per rank")
        for i, v in enumerate(values):
            if not isinstance(v, th.Tensor):
                raise ValueError(f"{name}[{i}]: expected a torch.Tensor, got {type(v).__name__}")
        return values

    def _devices(self):
        """Each local rank's CUDA device (the megamoe buffer's once built)."""
        th = _torch()
        if self._ep is not None:
            return self._ep.devices
        if self.group is not None:
            return [th.device("cuda", th.cuda.current_device())]
        g = th.cuda.device_count()
        return [th.device("cuda", r % g) for r in range(self.num_ranks)]

    def _check_tensor(self, name, t, dtype, shape, device):
        """Dtype, shape and device of a tensor torch reads (converted before megamoe.ep takes
        it, so any layout does)."""
        check_tensor(name, t, dtype, shape, device.index, by_address=False)

    def _check_pad_multiple(self, pad_multiple):
        if pad_multiple is None or pad_multiple == 0:
            return 1
        if not isinstance(pad_multiple, int) or not 1 <= pad_multiple <= self.max_pad_multiple:
            raise ValueError(f"pad_multiple: {pad_multiple!r} must be None or in 1..={self.max_pad_multiple}")
        return pad_multiple

    def _check_handle(self, handle):
        if not isinstance(handle, Handle):
            raise ValueError(f"handle: expected a handle from dispatch_with_permute, got {type(handle).__name__}")
        if handle.owner is not self:
            raise ValueError("handle: comes from a dispatch of another buffer")
        return handle

    # -- dispatch -------------------------------------------------------------------------

    def dispatch_with_permute(
        self,
        *,
        hidden: Tensors,
        routing_map: Tensors | None = None,
        probs: Tensors | None = None,
        scaling_factor: None = None,
        num_of_experts_per_rank: int | None = None,
        pad_multiple: int | None = None,
        num_permuted_tokens: int | None = None,
        handle: Handle | None = None,
        non_blocking: bool = False,
        fuse_permute_dispatch: bool = False,
    ) -> tuple[Tensors, Tensors | None, None, Tensors | None, Handle]:
        """Dispatch with permute (see the module's docstring). ``hidden`` bf16 ``[T, H]``,
        ``routing_map`` bool ``[T, E]`` (E = num_local_experts · ranks), ``probs`` f32
        ``[T, E]`` or None, ``num_of_experts_per_rank`` the constructor's
        ``num_local_experts`` or None, ``pad_multiple`` None or the rows each expert's segment is
        padded to a multiple of, ``num_permuted_tokens`` the output's rows (required with
        ``non_blocking``), ``handle`` an earlier dispatch's handle instead of a routing (the
        combine's backward), ``scaling_factor`` must be None (bf16 rows).
        ``fuse_permute_dispatch``: accepted, both ways run the fused kernel. Returns
        ``(rows [N, H] bf16, row_probs [N] f32 or None, None, tokens_per_expert int64 [E_l],
        handle)``."""
        del fuse_permute_dispatch  # one fused kernel serves both
        if scaling_factor is not None:
            raise ValueError("scaling_factor: must be None (the buffer moves bf16 rows)")
        if handle is not None:
            return self._dispatch_backward(hidden, handle, pad_multiple)
        if routing_map is None:
            raise ValueError("routing_map: required when no handle is given")
        th = _torch()
        if num_of_experts_per_rank is not None and num_of_experts_per_rank != self.num_local_experts:
            raise ValueError(
                f"num_of_experts_per_rank: {num_of_experts_per_rank}, the buffer was built for {self.num_local_experts}"
            )
        pad = self._check_pad_multiple(pad_multiple)
        bound = None
        if num_permuted_tokens is not None:
            bound = int(num_permuted_tokens)
            if bound < 0:
                raise ValueError(f"num_permuted_tokens: {bound} is negative")
            if bound % pad:
                raise ValueError(f"num_permuted_tokens: {bound} is not a multiple of pad_multiple = {pad}")
        elif non_blocking:
            raise ValueError("num_permuted_tokens: required with non_blocking=True")
        x = self._per_rank("hidden", hidden)
        rmap = self._per_rank("routing_map", routing_map)
        p = self._per_rank("probs", probs, required=False)
        e, h = self.num_experts, self.hidden_dim
        devices = self._devices()
        for i, (xi, ri) in enumerate(zip(x, rmap)):
            sfx = self._suffix(i)
            self._check_tensor("hidden" + sfx, xi, th.bfloat16, (None, h), devices[i])
            t = xi.shape[0]
            if t > self.max_num_of_tokens_per_rank:
                raise ValueError(
                    f"hidden{sfx}: {t} tokens exceed max_num_of_tokens_per_rank = {self.max_num_of_tokens_per_rank}"
                )
            self._check_tensor("routing_map" + sfx, ri, th.bool, (t, e), devices[i])
            if p is not None:
                self._check_tensor("probs" + sfx, p[i], th.float32, (t, e), devices[i])
        if self._ep is None:
            self._build()
        ep = self._ep
        k = ep.num_topk
        # Each rank's largest number of experts of one token, on the GPU (None where no token can
        # pass K: K = E, or no tokens).
        most = [r.sum(dim=1).amax() if r.shape[0] and k < e else None for r in rmap]
        if bound is None and self._unsynced:
            self.sync()
        idx, pk = [], []
        for i, ri in enumerate(rmap):
            ii, pi = self._topk(ri, None if p is None else p[i], k)
            idx.append(ii)
            pk.append(pi)
        # The megamoe buffer's rows bound its output; a larger budget is met with zero rows.
        rows_bound = None if bound is None else min(bound, ep.world.max_rows)
        from .. import ep as mep

        state = self._new_state(mep)
        # Non-blocking: each rank's error code lands in its overflow flag (no host wait).
        flags = None if bound is None else [th.empty(1, dtype=th.int32, device=d) for d in ep.devices]
        rows, _, row_probs, tpe = mep.run_dispatch(
            ep, state, [xi.contiguous() for xi in x], None, idx, pk, pad, rows_bound, flags
        )
        if bound is None:
            # Blocking: the dispatch has waited, so reading the routing's largest row is cheap.
            need = max((int(m) for m in most if m is not None), default=0)
            if need > k:
                raise ValueError(
                    f"routing_map: a token routes to {need} experts, the buffer's top-k "
                    f"bound is {k} (num_topk, or {TOPK_ENV}; at most {MAX_TOPK})"
                )
            tpe = [th.tensor(t, dtype=th.int64).pin_memory() for t in tpe]
            public_rows = list(state.num_rows)
            flags = self._zero_flags
        else:
            self._unsynced = True
            for f, m in zip(flags, most):
                if m is not None:
                    f.bitwise_or_(m.gt(k).to(th.int32))
            tpe = [t.to(th.int64) for t in tpe]
            if not non_blocking:
                tpe = [t.cpu().pin_memory() for t in tpe]
            if bound > rows_bound:
                rows = [th.cat([r, r.new_zeros(bound - rows_bound, h)]) for r in rows]
                row_probs = [th.cat([q, q.new_zeros(bound - rows_bound)]) for q in row_probs]
            public_rows = [bound] * len(rows)
        handle = Handle(self, ep, state, idx, e, pad, public_rows, self._one(flags))
        return (self._one(rows), None if p is None else self._one(row_probs), None, self._one(tpe), handle)

    def sync(self) -> None:
        """Waits for this buffer's calls and raises the first failure of the non-blocking ones,
        except overflows of a budget, which the dispatch reported through its overflow flag
        (cleared here: later flags report later calls only)."""
        self._unsynced = False
        if self._ep is None:
            return
        try:
            self._ep.sync()
        except ValueError as e:
            if not str(e).startswith("num_rows_bound"):
                raise

    def _suffix(self, i):
        """The per-rank index of an argument's name in messages (virtual worlds only)."""
        return "" if self.group is not None else f"[{i}]"

    def _one(self, values):
        """The one rank's value of a process-group buffer, the list of a virtual world."""
        return values[0] if self.group is not None else values

    def _topk(self, routing_map, probs, k):
        """One rank's routing in megamoe's top-k form on the GPU: int32 expert ids ``[T, k]``
        (-1: none) and f32 probs ``[T, k]`` (ones without ``probs``). With k = E the ids are the
        columns where the map is set and the probs are ``probs`` itself (a masked slot's weight is
        never read)."""
        th = _torch()
        e = routing_map.shape[1]
        if k == e:
            idx = th.where(routing_map, self._columns(routing_map.device, e), -1)
            return idx, (routing_map.to(th.float32) if probs is None else probs.contiguous())
        present, idx = routing_map.view(th.uint8).topk(k, dim=1)
        idx = idx.masked_fill_(present == 0, -1)
        if probs is None:
            return idx.to(th.int32), present.to(th.float32)
        return idx.to(th.int32), probs.gather(1, idx.clamp_min(0)).mul_(present)

    def _columns(self, device, e):
        """int32 ``[E]``: 0 .. E-1 on ``device`` (kept)."""
        th = _torch()
        key = (device, e)
        if key not in self._column_ids:
            self._column_ids[key] = th.arange(e, dtype=th.int32, device=device)
        return self._column_ids[key]

    def _new_state(self, mep):
        """A megamoe handle for a dispatch: one whose last user has gone (its calls were queued
        before this one on the same streams), else a new one (device memory)."""
        native = self._free_states.pop() if self._free_states else self._ep.world.new_handle()
        state = mep.Handle(native)
        weakref.finalize(state, self._free_states.append, native)
        return state

    def _build(self):
        """The megamoe buffer (and the blocking dispatches' flags), built at the first dispatch."""
        from .. import ep as mep

        args = dict(
            num_experts=self.num_experts,
            num_topk=self.num_topk,
            hidden=self.hidden_dim,
            num_max_tokens_per_rank=self.max_num_of_tokens_per_rank,
            max_pad_multiple=self.max_pad_multiple,
            num_sms=self.num_sms,
            deadline_ms=self.deadline_ms,
        )
        if self.group is not None:
            self._ep = mep.Buffer.for_process_group(group=self.group, **args)
        else:
            self._ep = mep.Buffer(self.num_ranks, **args)
        th = _torch()
        self._zero_flags = [th.zeros(1, dtype=th.int32, device=d) for d in self._ep.devices]

    def _dispatch_backward(self, grad, handle, pad_multiple):
        """The combine's backward: ``grad`` ``[T, H]`` dispatched along ``handle``."""
        th = _torch()
        handle = self._check_handle(handle)
        self._check_same_pad(handle, pad_multiple)
        ep, state = handle.buffer, handle.state
        g = self._per_rank("hidden", grad)
        for i, gi in enumerate(g):
            sfx = self._suffix(i)
            self._check_tensor("hidden" + sfx, gi, th.bfloat16, (state.num_tokens[i], self.hidden_dim), ep.devices[i])
        from .. import ep as mep

        rows = mep.run_combine_backward(ep, state, [gi.contiguous() for gi in g], wait=False)
        rows = [
            r if r.shape[0] == n else th.cat([r, r.new_zeros(n - r.shape[0], self.hidden_dim)])
            for r, n in zip(rows, handle.num_rows)
        ]
        return self._one(rows), None, None, None, handle

    def _check_same_pad(self, handle, pad_multiple):
        pad = self._check_pad_multiple(pad_multiple)
        if pad != handle.pad_multiple:
            raise ValueError(f"pad_multiple: {pad_multiple}, the handle's dispatch used {handle.pad_multiple}")

    # -- combine --------------------------------------------------------------------------

    def combine_with_unpermute(
        self,
        *,
        hidden: Tensors,
        probs: Tensors | None = None,
        handle: Handle | None = None,
        pad_multiple: int | None = None,
        fuse_unpermute_combine: bool = False,
    ) -> tuple[Tensors, Tensors | None]:
        """Combine with unpermute (see the module's docstring): ``hidden`` bf16 ``[N, H]`` in the
        layout of ``handle``'s dispatch (its padding rows are not read), ``probs`` None or the
        f32 ``[N]`` gradient of the dispatched row probs (then this is the dispatch's backward),
        ``pad_multiple`` the dispatch's. ``fuse_unpermute_combine``: accepted, both ways run the
        fused kernel. Returns ``(combined [T, H] bf16, probs_grad [T, E] f32 or None)``."""
        del fuse_unpermute_combine  # one fused kernel serves both
        th = _torch()
        if handle is None:
            raise ValueError("handle: required (the handle of the dispatch whose rows these are)")
        handle = self._check_handle(handle)
        self._check_same_pad(handle, pad_multiple)
        ep, state = handle.buffer, handle.state
        rows = self._per_rank("hidden", hidden)
        grads = self._per_rank("probs", probs, required=False)
        n = state.num_rows
        h = self.hidden_dim
        for i, r in enumerate(rows):
            sfx = self._suffix(i)
            self._check_tensor("hidden" + sfx, r, th.bfloat16, (None, h), ep.devices[i])
            if r.shape[0] != handle.num_rows[i]:
                raise ValueError(f"hidden{sfx}: {r.shape[0]} rows, the dispatch made {handle.num_rows[i]}")
            if grads is not None:
                self._check_tensor("probs" + sfx, grads[i], th.float32, (r.shape[0],), ep.devices[i])
        # A budget past the megamoe buffer's rows was met with zero rows: those are not read.
        rows = [r[: n[i]].contiguous() for i, r in enumerate(rows)]
        if grads is not None:
            grads = [g[: n[i]].contiguous() for i, g in enumerate(grads)]
        from .. import ep as mep

        y, grad_k = mep.run_combine(ep, state, rows, "per_rank", grads, wait=False)
        if grad_k is None:
            return self._one(y), None
        grad_e = []
        for idx, gk in zip(handle.topk_idx, grad_k):
            gk = gk.masked_fill_(idx < 0, 0.0)
            if idx.shape[1] == handle.num_experts:
                grad_e.append(gk)  # slot j is expert j
                continue
            out = th.zeros((idx.shape[0], handle.num_experts), dtype=th.float32, device=gk.device)
            grad_e.append(out.scatter_add_(1, idx.long().clamp_min_(0), gk))
        return self._one(y), self._one(grad_e)


def _positive(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: {value!r} must be a positive integer")
    return value
