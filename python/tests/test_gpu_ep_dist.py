"""megamoe.ep with one process per rank (as torchrun launches them) on a GPU: two processes of a
gloo group, both on cuda:0, each build their rank with ``Buffer.for_process_group`` and run
dispatch / combine and both backwards, BF16 and FP8, both combine orders; each checks its rank's
results bit for bit against megamoe-core's CPU reference (python/examples/ep_torchrun.py's
``check``). And what a failing handle exchange says. Skipped without torch or without a CUDA GPU."""

import pathlib
import sys

import pytest

torch = pytest.importorskip("torch", reason="megamoe.ep needs torch")

import megamoe  # noqa: E402
from megamoe import _megamoe  # noqa: E402

from _procs import FAILING_EXCHANGES, run_two_processes  # noqa: E402

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and megamoe.gpu_available()), reason="no CUDA GPU")

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def _rank_worker(rank):
    sys.path.insert(0, str(EXAMPLES))
    import ep_torchrun

    for dtype in ("bf16", "fp8"):
        buffer = ep_torchrun.make_buffer(dtype)
        assert buffer.ranks == [rank] and buffer.num_ranks == 2
        for seed, order in enumerate(ep_torchrun.ep.ORDERS):
            results = ep_torchrun.check(buffer, order, seed)
            differ = {name: diff for name, (diff, same) in results.items() if not same}
            assert not differ, f"rank {rank} {dtype} {order}: bits differ (max abs diff) {differ}"


def test_dispatch_and_combine_with_one_process_per_rank_bitwise_against_the_cpu_reference():
    run_two_processes(_rank_worker)


@pytest.mark.parametrize(
    "all_gather, message",
    FAILING_EXCHANGES
    + [(lambda mine: 7, "rank 1: handle exchange: all_gather: .*returned a int, expected a list of bytes")],
)
def test_a_failing_exchange_is_a_runtime_error_naming_the_rank(all_gather, message):
    with pytest.raises(RuntimeError, match=message):
        _megamoe.EpWorld.for_rank(1, 0, all_gather, 2, 32, 4, 256, 64)
