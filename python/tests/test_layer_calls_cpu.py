"""MoELayer's calls without a GPU or torch: what ``forward`` and ``forward_ranks`` hand the
native layer, checked by the real tensor checker, with the native layer and torch stood in for
(``_fakes``). One rank's call takes and returns tensors, the per-rank call lists; lists passed
to ``forward`` still run ``forward_ranks``, with a DeprecationWarning; nothing reaches the native
layer when a tensor is bad."""

import pytest

from megamoe import layer as layer_module
from megamoe.layer import MoELayer

from _fakes import BF16, F32, FP8, I32, I64, Tensor, torch_module

H, K, T = 256, 4, 3


class Native:
    """The native layer of ``ranks`` ranks here, all on device 0, recording its calls."""

    def __init__(self, ranks, kind="fused"):
        self.ranks, self.kind, self.calls = ranks, kind, []

    def spec(self):
        return (2, 16, 64, K, H, 128, self.kind, 128, None, "per-block")

    def local_ranks(self):
        return self.ranks

    def rank_device(self, rank):
        return 0

    def launch(self, tensors, bound, streams):
        self.calls.append(("launch", tensors, bound, streams))

    def forward(self, tensors, bound, streams):
        self.calls.append(("forward", tensors, bound, streams))


@pytest.fixture(autouse=True)
def fake_torch(monkeypatch):
    torch = torch_module()
    monkeypatch.setattr(layer_module, "torch", lambda: torch)
    monkeypatch.setattr(layer_module, "stream", lambda device: 0x5000 + device)


def layer(ranks, kind="fused"):
    built = MoELayer.__new__(MoELayer)
    built._attach(Native(ranks, kind))
    return built


def batch(ptr=0x7F00_0000_1000):
    return Tensor(BF16, (T, H), ptr=ptr), Tensor(I64, (T, K), ptr=ptr + 0x1000), Tensor(F32, (T, K), ptr=ptr + 0x2000)


def test_one_ranks_forward_takes_and_returns_tensors():
    one = layer([1])
    x, idx, w = batch()
    y = one.forward(x, idx, w, num_tokens_bound=8)
    assert isinstance(y, Tensor) and y.shape == (T, H) and y.dtype is BF16
    [(call, tensors, bound, streams)] = one._native.calls
    assert (call, bound, streams) == ("forward", 8, [0x5000])
    assert tensors == [(T, x.data_ptr(), None, idx.data_ptr(), True, w.data_ptr(), y.data_ptr(), None)]


def test_given_y_the_fused_kind_queues_the_call():
    one = layer([0])
    x, idx, w = batch()
    y = Tensor(BF16, (T, H), ptr=0x7F00_0001_0000)
    assert one.forward((Tensor(FP8, (T, H)), Tensor(F32, (T, H // 128), ptr=0x7F00_0002_0000)), idx, w, y=y) is y
    [(call, tensors, _, _)] = one._native.calls
    assert call == "launch" and tensors[0][2] == 0x7F00_0002_0000 and tensors[0][6] == y.data_ptr()


def test_forward_ranks_takes_and_returns_one_per_rank():
    two = layer([0, 1])
    batches = [batch(), batch(0x7F00_0100_0000)]
    ys = two.forward_ranks(*(list(col) for col in zip(*batches)))
    assert len(ys) == 2 and all(y.shape == (T, H) for y in ys)
    [(_, tensors, _, streams)] = two._native.calls
    assert [t[1] for t in tensors] == [b[0].data_ptr() for b in batches] and streams == [0x5000, 0x5000]


def test_lists_passed_to_forward_run_forward_ranks_with_a_deprecation_warning():
    two = layer([0, 1])
    x, idx, w = batch()
    with pytest.warns(DeprecationWarning, match="forward_ranks"):
        ys = two.forward([x, x], [idx, idx], [w, w])
    assert isinstance(ys, list) and len(ys) == 2 and len(two._native.calls) == 1


def test_forward_on_a_layer_of_several_ranks_here_names_forward_ranks():
    two = layer([0, 1])
    with pytest.raises(ValueError, match=r"^x: this layer holds ranks \[0, 1\] in this process; forward_ranks"):
        two.forward(*batch())
    assert two._native.calls == []


@pytest.mark.parametrize(
    "args, message",
    [
        (lambda x, idx, w: ([x], [idx, idx], [w, w]), r"^x: expected a list of 2 per-rank values"),
        (lambda x, idx, w: ([x, Tensor(F32, (T, H))], [idx, idx], [w, w]), r"^x\[1\]: dtype torch.float32"),
        (
            lambda x, idx, w: ([x, x], [idx, Tensor(I32, (T, K), ptr=0x7F00_0000_3004)], [w, w]),
            r"^topk_idx\[1\]: its data must start 16-byte aligned",
        ),
        (
            lambda x, idx, w: ([x, x], [idx, idx], [w, Tensor(F32, (T, K), contiguous=False)]),
            r"^topk_weights\[1\]: is not contiguous",
        ),
        (
            lambda x, idx, w: ([x, x], [idx, idx], [w, Tensor(F32, (T, K), device=-1)]),
            r"^topk_weights\[1\]: not on a CUDA device",
        ),
    ],
)
def test_bad_calls_are_value_errors_naming_the_argument_before_anything_runs(args, message):
    two = layer([0, 1])
    with pytest.raises(ValueError, match=message):
        two.forward_ranks(*args(*batch()))
    assert two._native.calls == []
