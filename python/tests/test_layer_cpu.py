"""What the native layer of one process per rank (``_megamoe.Layer.for_rank``, behind
``MoELayer.for_process_group``) does without a GPU and without torch: bad arguments are
ValueErrors naming them, checked before any GPU is touched or the peers called (the all_gather is
never called); with good arguments and no GPU the error says what is missing, for either kind. ``MoELayer.for_process_group`` is checked the same way over a
stand-in for torch.distributed where torch is absent."""

import importlib.util
import sys
import types

import pytest

import megamoe
from megamoe import _megamoe

from _procs import Gather, assert_rejected_before_any_exchange

# The tiny preset on 2 ranks.
TINY = dict(num_ranks=2, num_experts=16, num_max_tokens_per_rank=64, num_topk=4, hidden=256, intermediate_hidden=128)


def rank_layer(gather, **kw):
    args = dict(TINY, rank=1, device=0, all_gather=gather)
    args.update(kw)
    return _megamoe.Layer.for_rank(**args)


@pytest.mark.parametrize(
    "bad, name",
    [
        (dict(rank=2), "rank: 2 is not below num_ranks = 2"),
        (dict(rank=-1), "rank"),
        (dict(device=-1), "device"),
        (dict(all_gather=b"not callable"), "all_gather: expected a callable, got bytes"),
        (dict(all_gather=None), "all_gather: expected a callable"),
        (dict(kind="both"), "kind"),
        # A group size the experts do not split over.
        (dict(num_ranks=3), "num_ranks"),
        (dict(hidden=100), "hidden"),
        (dict(scale_granularity=96), "scale_granularity"),
    ],
)
def test_a_process_ranks_bad_arguments_are_value_errors_before_any_exchange(bad, name):
    assert_rejected_before_any_exchange(rank_layer, bad, name)


def test_a_bad_kind_is_refused_before_the_all_gather_is_looked_at():
    # kind is checked with the other arguments, before the callable and the GPU.
    with pytest.raises(ValueError, match="kind"):
        rank_layer(b"not callable", kind="both")


@pytest.mark.skipif(megamoe.gpu_available(), reason="checks the answer without a GPU")
@pytest.mark.parametrize("kind", ["fused", "split"])
def test_without_a_gpu_a_process_rank_says_what_is_missing_before_any_exchange(kind):
    gather = Gather()
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        rank_layer(gather, kind=kind)
    assert gather.calls == 0


@pytest.mark.skipif(megamoe.gpu_available(), reason="checks the answer without a GPU")
def test_without_a_gpu_the_all_ranks_layer_is_unchanged():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        megamoe.MoELayer(**TINY)


@pytest.fixture
def fake_dist(monkeypatch):
    """Where torch is absent (as in CI), a stand-in for what ``MoELayer.for_process_group`` asks
    of it: torch.distributed of a group of 2 in which this process is rank 1, and no CUDA.
    Returns the recorder of its all_gather_object calls and the stand-in module."""
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed: the GPU tests build the layer over torch.distributed")
    gather = Gather()
    dist = types.ModuleType("torch.distributed")
    dist.rank = 1
    dist.get_rank = lambda group=None: dist.rank
    dist.get_world_size = lambda group=None: 2

    def all_gather_object(out, mine, group=None):
        out[:] = gather(mine)

    dist.all_gather_object = all_gather_object
    torch = types.ModuleType("torch")
    torch.distributed = dist
    torch.cuda = types.SimpleNamespace(is_available=lambda: False, current_device=lambda: 0)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    return gather, dist


PER_PROCESS = dict(num_experts=16, num_max_tokens_per_rank=64, num_topk=4, hidden=256, intermediate_hidden=128)


@pytest.mark.parametrize(
    "bad, name",
    [
        (dict(kind="both"), "kind"),
        (dict(hidden=100), "hidden"),
        (dict(num_experts=15), "num_experts|num_ranks"),  # 15 experts over 2 ranks
        (dict(scale_granularity=96), "scale_granularity"),
    ],
)
def test_for_process_group_checks_its_arguments_before_any_exchange(fake_dist, bad, name):
    gather, _ = fake_dist
    with pytest.raises(ValueError, match=name):
        megamoe.MoELayer.for_process_group(**dict(PER_PROCESS, **bad), process_group="pg")
    assert gather.calls == 0


def test_for_process_group_needs_a_member_of_the_group(fake_dist):
    gather, dist = fake_dist
    dist.rank = -1
    with pytest.raises(ValueError, match="process_group: this process is not a member"):
        megamoe.MoELayer.for_process_group(**PER_PROCESS)
    assert gather.calls == 0


def test_get_symm_buffer_with_a_process_group_takes_its_size(fake_dist):
    gather, _ = fake_dist
    with pytest.raises(ValueError, match="num_ranks: 4, but the process group has 2 ranks"):
        megamoe.get_symm_buffer_for_mega_moe(4, **PER_PROCESS, process_group="pg")
    with pytest.raises(ValueError, match="kind"):
        megamoe.get_symm_buffer_for_mega_moe(2, **PER_PROCESS, kind="both", process_group="pg")
    assert gather.calls == 0


@pytest.mark.skipif(megamoe.gpu_available(), reason="checks the answer without a GPU")
def test_without_a_gpu_for_process_group_says_what_is_missing_before_any_exchange(fake_dist):
    gather, _ = fake_dist
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        megamoe.get_symm_buffer_for_mega_moe(None, **PER_PROCESS, process_group="pg")
    assert gather.calls == 0
