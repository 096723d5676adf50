"""Types of megamoe's native module (crates/megamoe-py). The Python modules of the package wrap
it; python/tests/test_stub_cpu.py checks that this file names exactly what the module exports,
with the same parameters."""

from collections.abc import Callable, Sequence
from os import PathLike
from typing import Any

from torch import Tensor, dtype

__version__: str

# (tokens, x, x_scales or None, topk_idx, topk_idx is int64, topk_weights, y, recv_stats or None):
# one rank's tensors of a layer call, addresses as ints (python/megamoe/layer.py).
RankTensors = tuple[int, int, int | None, int, bool, int, int, int | None]
# all_gather(this process's bytes) -> every rank's, in rank order.
AllGather = Callable[[bytes], list[bytes]]

def get_symm_buffer_size(
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
    group: int | None = None,
    accumulation: str | None = None,
) -> dict[str, int]: ...
def presets() -> dict[str, tuple[int, int, int, int]]: ...
def reference_forward(
    preset: str, num_ranks: int, num_tokens: int, seed: int = 0, routing: str = "uniform"
) -> dict[str, Any]: ...
def gpu_available() -> bool: ...
def info() -> str: ...
def _set_nvidia_package_roots(roots: Sequence[str | PathLike[str]]) -> bool: ...
def check_tensor(
    arg: str,
    tensor: Tensor,
    dtypes: dtype | tuple[dtype, ...],
    shape: Sequence[int | None],
    device: int,
    by_address: bool = True,
) -> int: ...
def grouped_gemm(
    experts: int,
    n: int,
    k: int,
    group: int,
    rows: int,
    pad: int | None,
    max_m: int | None,
    out_f32: bool,
    a: int,
    a_scales: int,
    b: int,
    b_scales: int,
    expert_rows: int,
    out: int,
    device: int,
    stream: int,
    accumulation: str,
) -> None: ...
def ep_reference(
    hidden: int,
    num_experts: int,
    num_topk: int,
    pad_multiple: int,
    x: list[bytes],
    x_scales: list[bytes] | None,
    topk_idx: list[bytes],
    probs: list[bytes],
    rows: list[bytes],
    prob_grads: list[bytes],
    grad_y: list[bytes],
    order: str,
) -> dict[str, Any]: ...

class Layer:
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
        accumulation: str = "per-block",
    ) -> None: ...
    @staticmethod
    def for_rank(
        rank: int,
        device: int,
        all_gather: AllGather,
        num_ranks: int,
        num_experts: int,
        num_max_tokens_per_rank: int,
        num_topk: int,
        hidden: int,
        intermediate_hidden: int,
        kind: str = "fused",
        scale_granularity: int | None = None,
        clamp: float | None = None,
        accumulation: str = "per-block",
    ) -> Layer: ...
    def local_ranks(self) -> list[int]: ...
    def spec(self) -> tuple[int, int, int, int, int, int, str, int, float | None, str]: ...
    def rank_device(self, rank: int) -> int: ...
    def load_weights(self, w1: int, w1_scales: int, w2: int, w2_scales: int, device: int, stream: int) -> None: ...
    def forward(self, ranks: list[RankTensors], num_tokens_bound: int | None, streams: list[int]) -> None: ...
    def launch(self, ranks: list[RankTensors], num_tokens_bound: int | None, streams: list[int]) -> None: ...
    def expert_counts(self, rank: int) -> list[int]: ...
    def check(self) -> None: ...

class EpHandle:
    @property
    def num_tokens(self) -> list[int]: ...
    @property
    def num_rows(self) -> list[int]: ...
    @property
    def tokens_per_expert(self) -> list[list[int]] | None: ...

class EpWorld:
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
    ) -> None: ...
    @staticmethod
    def for_rank(
        rank: int,
        device: int,
        all_gather: AllGather,
        num_ranks: int,
        num_experts: int,
        num_topk: int,
        hidden: int,
        num_max_tokens_per_rank: int,
        max_pad_multiple: int = 128,
        dtype: str = "bf16",
        num_sms: int | None = None,
        deadline_ms: int | None = None,
    ) -> EpWorld: ...
    @property
    def num_ranks(self) -> int: ...
    @property
    def local_ranks(self) -> list[int]: ...
    @property
    def num_experts(self) -> int: ...
    @property
    def num_topk(self) -> int: ...
    @property
    def hidden(self) -> int: ...
    @property
    def max_rows(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    def device(self, rank: int) -> int: ...
    def context_handle(self, rank: int) -> int: ...
    def new_handle(self) -> EpHandle: ...
    def sync(self, streams: list[int]) -> None: ...
    def dispatch(
        self,
        handle: EpHandle,
        x: list[Tensor],
        x_scales: list[Tensor] | None,
        topk_idx: list[Tensor],
        probs: list[Tensor],
        pad_multiple: int,
        num_rows_bound: int | None,
        streams: list[int],
        out_rows: list[Tensor] | None = None,
        out_scales: list[Tensor] | None = None,
        out_probs: list[Tensor] | None = None,
        tokens_per_expert: list[Tensor] | None = None,
        codes: list[Tensor] | None = None,
    ) -> None: ...
    def read_dispatch(
        self,
        handle: EpHandle,
        rows: list[Tensor],
        scales: list[Tensor] | None,
        probs: list[Tensor],
        tokens_per_expert: list[Tensor] | None,
        streams: list[int],
        codes: list[Tensor] | None = None,
    ) -> None: ...
    def combine(
        self,
        handle: EpHandle,
        rows: list[Tensor],
        order: str,
        y: list[Tensor],
        streams: list[int],
        prob_grads: list[Tensor] | None = None,
        grad_probs: list[Tensor] | None = None,
        wait: bool = True,
    ) -> None: ...
    def combine_backward(
        self, handle: EpHandle, grad_y: list[Tensor], grad_rows: list[Tensor], streams: list[int], wait: bool = True
    ) -> None: ...

class IpcBuffer:
    def __init__(self, device: int, bytes: int) -> None: ...
    def export(self) -> tuple[bytes, str]: ...
    def open(self, rank: int, peers: list[tuple[bytes, str]]) -> None: ...
    def ptr(self, rank: int) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def copy(self, tensor: Tensor, rank: int, offset: int, to_buffer: bool, stream: int) -> None: ...
