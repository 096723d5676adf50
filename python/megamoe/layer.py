"""The MoE layer on the GPU for PyTorch users: ``get_symm_buffer_for_mega_moe`` (DeepGEMM's
name) builds an :class:`MoELayer`, ``load_weights`` takes the experts' FP8 weights,
``forward`` runs the layer (fused or split) on the caller's current CUDA stream.

A layer holds every rank of its world in this process (``MoELayer(num_ranks, ...)``), or, of
either kind, this process's one rank of a torch.distributed group, one process per rank as
torchrun launches them (``MoELayer.for_process_group(...)``, or ``get_symm_buffer_for_mega_moe``
with ``process_group``): it then loads this rank's experts alone and ``forward`` takes and returns
this rank's tensors alone.

Tensors cross by address (no libtorch link); each is checked here (dtype, shape, device,
contiguity, alignment) and its values in Rust, before anything is written. ``forward`` reads
``topk_idx`` and ``topk_weights`` back to the host for those checks (T x K values each) and
returns once the layer's kernels are done, with ``y`` written.
"""

from . import _megamoe
from ._dist import process_rank
from ._tensors import address, stream, torch


class MoELayer:
    """The layer of ``num_ranks`` ranks (real or virtual: rank r runs on CUDA device r modulo the
    visible devices) for tokens of ``hidden`` columns routed to ``num_topk`` of ``num_experts``
    experts of ``intermediate_hidden`` columns, at most ``num_max_tokens_per_rank`` tokens per
    rank and call. ``kind``: "fused" (one persistent kernel, the default) or "split"; ``group``:
    columns per scale of the re-quantized intermediate (64 or 128, None: SPEC's default);
    ``clamp``: the optional SwiGLU clamp.

    Raises ValueError naming the argument for a shape the kernels do not take, RuntimeError when
    no CUDA GPU can be used. The memory is allocated by :meth:`load_weights`
    (``get_symm_buffer_size`` reports it beforehand). ``ranks``: the ranks this process holds,
    every rank here (:meth:`for_process_group` builds one rank per process instead).
    """

    def __init__(self, num_ranks, num_experts, num_max_tokens_per_rank, num_topk, hidden,
                 intermediate_hidden, kind="fused", group=None, clamp=None):
        self._attach(_megamoe.Layer(num_ranks, num_experts, num_max_tokens_per_rank, num_topk,
                                    hidden, intermediate_hidden, kind, group, clamp))

    @classmethod
    def for_process_group(cls, num_experts, num_max_tokens_per_rank, num_topk, hidden,
                          intermediate_hidden, kind="fused", group=None, clamp=None,
                          process_group=None):
        """This process's rank of a layer of one process per rank (either kind): rank
        ``dist.get_rank(process_group)`` of ``dist.get_world_size(process_group)`` ranks
        (``process_group``: a torch.distributed process group, the default one when None), on
        the current CUDA device (``torch.cuda.set_device`` first; processes may share a GPU).
        Every process of the group calls it with the same arguments, then :meth:`load_weights`
        with its own experts, then :meth:`forward` with its own tokens, each in the same order;
        the symmetric buffers' CUDA IPC handles are exchanged with ``all_gather_object`` when
        the weights are loaded (any backend: gloo, or nccl with one GPU per process). The other
        arguments are :class:`MoELayer`'s (``group`` is the intermediate's scale granularity);
        bad ones raise ValueError naming them before any GPU memory is allocated or anything
        exchanged (``num_ranks`` is the group's size)."""
        rank, size, all_gather, device = process_rank(process_group, "process_group")
        layer = cls.__new__(cls)
        layer._attach(_megamoe.Layer.for_rank(
            rank, device, all_gather, size, num_experts, num_max_tokens_per_rank, num_topk,
            hidden, intermediate_hidden, kind, group, clamp))
        return layer

    def _attach(self, native):
        self._native = native
        (self.num_ranks, self.num_experts, self.num_max_tokens_per_rank, self.num_topk,
         self.hidden, self.intermediate_hidden, self.kind, self.group,
         self.clamp) = native.spec()
        self.ranks = list(native.local_ranks())

    def device(self, rank=None):
        """The CUDA device index rank ``rank`` runs on (None: this process's first rank)."""
        return self._native.rank_device(self.ranks[0] if rank is None else rank)

    def load_weights(self, w1, w1_scales, w2, w2_scales):
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
            address("w1", w1, th.float8_e4m3fn, (e, 2 * i, h), device),
            address("w1_scales", w1_scales, th.float32, (e, 2 * i // 128, h // 128), device),
            address("w2", w2, th.float8_e4m3fn, (e, h, i), device),
            address("w2_scales", w2_scales, th.float32, (e, h // 128, i // 128), device),
        ]
        self._native.load_weights(*ptrs, device, stream(device))

    def forward(self, x, topk_idx, topk_weights, num_tokens_bound=None):
        """y = the MoE layer of x (SPEC §3). Per rank: ``x`` bfloat16 [T, H], or already
        quantized as a tuple (float8_e4m3fn [T, H], float32 scales [T, H/128]); ``topk_idx``
        int32 or int64 [T, K], experts in [0, E) or -1 for a masked slot; ``topk_weights``
        float32 [T, K]; all on the rank's device (:meth:`device`). With one rank in this process
        (``num_ranks`` 1, or one rank per process) each argument is a tensor and y a bfloat16
        [T, H] tensor; with several, each is a list of one per rank of ``ranks`` and so is y.
        ``num_tokens_bound``: at least every rank's T, at most num_max_tokens_per_rank (None:
        the capacity's plan); with one rank per process every process passes the same one."""
        n = len(self.ranks)
        single = n == 1
        per_rank = {"x": x, "topk_idx": topk_idx, "topk_weights": topk_weights}
        if single:
            per_rank = {name: [v] for name, v in per_rank.items()}
        for name, v in per_rank.items():
            if not isinstance(v, (list, tuple)) or len(v) != n:
                raise ValueError(f"{name}: expected a list of {n} per-rank values")
        calls = [self._rank_tensors(r, per_rank["x"][j], per_rank["topk_idx"][j],
                                    per_rank["topk_weights"][j])
                 for j, r in enumerate(self.ranks)]
        streams = [stream(self.device(r)) for r in self.ranks]
        self._native.forward([args for args, _ in calls], num_tokens_bound, streams)
        ys = [y for _, y in calls]
        return ys[0] if single else ys

    def _rank_tensors(self, r, x, topk_idx, topk_weights):
        """Rank r's checked arguments as the native call takes them, and its fresh y."""
        th = torch()
        h, k, device = self.hidden, self.num_topk, self.device(r)
        at = "" if len(self.ranks) == 1 else f"[{r}]"
        if isinstance(x, tuple):
            if len(x) != 2:
                raise ValueError(f"x{at}: an FP8 input is a tuple (x, x_scales)")
            data, scales = x
            x_ptr = address(f"x{at}", data, th.float8_e4m3fn, (None, h), device)
            tokens = data.shape[0]
            scales_ptr = address(f"x_scales{at}", scales, th.float32, (tokens, h // 128), device)
        else:
            x_ptr = address(f"x{at}", x, th.bfloat16, (None, h), device)
            tokens, scales_ptr = x.shape[0], None
        if tokens > self.num_max_tokens_per_rank:
            raise ValueError(f"x{at}: {tokens} tokens exceed num_max_tokens_per_rank "
                             f"{self.num_max_tokens_per_rank}")
        idx_ptr = address(f"topk_idx{at}", topk_idx, (th.int32, th.int64), (tokens, k), device)
        w_ptr = address(f"topk_weights{at}", topk_weights, th.float32, (tokens, k), device)
        y = th.empty((tokens, h), dtype=th.bfloat16, device=f"cuda:{device}")
        is_64 = topk_idx.dtype == th.int64
        return (tokens, x_ptr, scales_ptr, idx_ptr, is_64, w_ptr, y.data_ptr()), y


def get_symm_buffer_for_mega_moe(num_ranks, num_experts, num_max_tokens_per_rank, num_topk, hidden,
                                 intermediate_hidden, kind="fused", group=None, clamp=None,
                                 process_group=None):
    """DeepGEMM's entry point, here with ``num_ranks`` (ranks of this process) for its group: an
    :class:`MoELayer`. With ``process_group`` (a torch.distributed process group, e.g.
    ``dist.group.WORLD``), this process's one rank of a layer of one process per rank
    (:meth:`MoELayer.for_process_group`); ``num_ranks`` is then the group's size (None takes
    it)."""
    if process_group is None:
        return MoELayer(num_ranks, num_experts, num_max_tokens_per_rank, num_topk, hidden,
                        intermediate_hidden, kind, group, clamp)
    import torch.distributed as dist

    size = dist.get_world_size(process_group)
    if num_ranks is not None and num_ranks != size:
        raise ValueError(f"num_ranks: {num_ranks}, but the process group has {size} ranks")
    return MoELayer.for_process_group(num_experts, num_max_tokens_per_rank, num_topk, hidden,
                                      intermediate_hidden, kind, group, clamp, process_group)
