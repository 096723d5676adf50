"""What megamoe's dispatch/combine world does without a GPU (and without torch): bad arguments
are ValueErrors naming them, checked before any GPU is touched (for one rank of a world of one
process per rank, before the peers are called); with good arguments and no GPU the error says
what is missing."""

import pytest

import megamoe
from megamoe import _megamoe

from _procs import Gather, assert_rejected_before_any_exchange

SMALL = dict(num_ranks=2, num_experts=64, num_topk=6, hidden=512, num_max_tokens_per_rank=128)


def world(**kw):
    args = dict(SMALL)
    args.update(kw)
    return _megamoe.EpWorld(**args)


@pytest.mark.parametrize(
    "bad, name",
    [
        (dict(hidden=100), "hidden"),
        (dict(num_ranks=-1), "num_ranks"),
        (dict(num_topk=0), "topk"),
        (dict(dtype="fp16"), "dtype"),
        (dict(num_sms=0), "num_sms"),
    ],
)
def test_bad_arguments_are_value_errors_naming_them(bad, name):
    with pytest.raises(ValueError, match=name):
        world(**bad)


@pytest.mark.skipif(megamoe.gpu_available(), reason="checks the answer without a GPU")
def test_without_a_gpu_the_world_says_what_is_missing():
    with pytest.raises(RuntimeError, match="GPU|libcuda|CUDA"):
        world()


def rank_world(gather, **kw):
    args = dict(SMALL, rank=1, device=0, all_gather=gather)
    args.update(kw)
    return _megamoe.EpWorld.for_rank(**args)


@pytest.mark.parametrize(
    "bad, name",
    [
        (dict(rank=2), "rank: 2 is not below num_ranks = 2"),
        (dict(rank=-1), "rank"),
        (dict(device=-1), "device"),
        (dict(all_gather=b"not callable"), "all_gather: expected a callable"),
        # A group whose size the experts do not split over.
        (dict(num_ranks=3), "num_experts: .*divisible by 3 ranks"),
        (dict(hidden=100), "hidden"),
        (dict(dtype="fp16"), "dtype"),
    ],
)
def test_a_process_ranks_bad_arguments_are_value_errors_before_any_exchange(bad, name):
    assert_rejected_before_any_exchange(rank_world, bad, name)


@pytest.mark.skipif(megamoe.gpu_available(), reason="checks the answer without a GPU")
def test_without_a_gpu_a_process_rank_says_what_is_missing_before_any_exchange():
    gather = Gather()
    with pytest.raises(RuntimeError, match="GPU|libcuda|CUDA"):
        rank_world(gather)
    assert gather.calls == 0
