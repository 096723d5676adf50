"""What the native layer of one process per rank (``_megamoe.Layer.for_rank``, behind
``MoELayer.for_process_group``) does without a GPU and without torch: bad arguments are
ValueErrors naming them, checked before any GPU is touched or the peers called (the all_gather is
never called); the split kind is refused naming ``kind``; with good arguments and no GPU the
error says what is missing."""

import pytest

import megamoe
from megamoe import _megamoe

# The tiny preset on 2 ranks.
TINY = dict(num_ranks=2, num_experts=16, num_max_tokens_per_rank=64, num_topk=4, hidden=256,
            intermediate_hidden=128)


class Gather:
    """An all_gather that records its calls (the exchange of one process per rank)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, mine):
        self.calls += 1
        return [mine, mine]


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
        (dict(kind="split"), "`kind` = split is invalid: .*fused kind only"),
        (dict(kind="both"), "kind"),
        # A group size the experts do not split over.
        (dict(num_ranks=3), "num_ranks"),
        (dict(hidden=100), "hidden"),
        (dict(group=96), "group"),
    ],
)
def test_a_process_ranks_bad_arguments_are_value_errors_before_any_exchange(bad, name):
    gather = Gather()
    kw = dict(bad)
    if "all_gather" in kw:
        gather = kw.pop("all_gather")
    with pytest.raises(ValueError, match=name):
        rank_layer(gather, **kw)
    assert getattr(gather, "calls", 0) == 0


def test_the_split_kind_is_refused_before_the_all_gather_is_looked_at():
    # kind is checked with the other arguments, before the callable and the GPU.
    with pytest.raises(ValueError, match="kind"):
        rank_layer(b"not callable", kind="split")


@pytest.mark.skipif(megamoe.gpu_available(), reason="checks the answer without a GPU")
def test_without_a_gpu_a_process_rank_says_what_is_missing_before_any_exchange():
    gather = Gather()
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        rank_layer(gather)
    assert gather.calls == 0


@pytest.mark.skipif(megamoe.gpu_available(), reason="checks the answer without a GPU")
def test_without_a_gpu_the_all_ranks_layer_is_unchanged():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        megamoe.MoELayer(**TINY)
