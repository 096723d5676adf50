"""What megamoe's dispatch/combine world does without a GPU (and without torch): bad arguments
are ValueErrors naming them, checked before any GPU is touched; with good arguments and no GPU
the error says what is missing."""

import pytest

import megamoe
from megamoe import _megamoe

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
