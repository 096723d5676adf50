"""The MoE layer (both kinds) with one process per rank (as torchrun launches them) on a GPU: two
processes of a gloo group, both on cuda:0, each build their rank with
``MoELayer.for_process_group``, load their own experts (a slice of seeded full weights every
process generates alike) and run their own seeded tokens; each checks its rank's y bit for bit
against the same batch run by a layer of every rank (``MoELayer(num_ranks=2)``) in the same
process, both ranks' inputs regenerated from the seeds, and within SPEC's 1e-4 of
megamoe.torch_reference (python/examples/layer_torchrun.py's ``check``). Nothing crosses the
processes but the layer's own handle exchange. Skipped without torch or without a CUDA GPU."""

import pathlib
import sys

import pytest

torch = pytest.importorskip("torch", reason="the GPU layer takes torch tensors")

import megamoe  # noqa: E402
from megamoe import _megamoe  # noqa: E402

from _procs import FAILING_EXCHANGES, run_two_processes  # noqa: E402

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and megamoe.gpu_available()), reason="no CUDA GPU")

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
MAX_DIFF = 1e-4


def _rank_worker(rank, kind):
    sys.path.insert(0, str(EXAMPLES))
    import layer_torchrun

    layer = layer_torchrun.make_layer(kind)
    assert layer.ranks == [rank] and layer.num_ranks == 2 and layer.kind == kind
    # The other rank's number is refused: this process holds its own only.
    with pytest.raises(ValueError, match="rank"):
        layer.device(1 - rank)
    for seed in (0, 1):
        same, d, tokens = layer_torchrun.check(layer, seed)
        print(f"{kind} rank {rank} seed {seed}: T {tokens}, diff {d:.2e} against the torch reference")
        assert same, f"rank {rank} seed {seed}: bits differ from the layer of every rank"
        assert d <= MAX_DIFF, f"rank {rank} seed {seed}: diff {d:.2e} > {MAX_DIFF}"


def _fused_worker(rank):
    _rank_worker(rank, "fused")


def _split_worker(rank):
    _rank_worker(rank, "split")


@pytest.mark.parametrize("worker", [_fused_worker, _split_worker], ids=["fused", "split"])
def test_the_layer_with_one_process_per_rank_matches_every_rank_in_one_process(worker):
    run_two_processes(worker)


@pytest.mark.parametrize("all_gather, message", FAILING_EXCHANGES)
def test_a_failing_exchange_at_the_weight_load_is_a_runtime_error_naming_the_rank(all_gather, message):
    ref = pytest.importorskip("megamoe.torch_reference")
    layer = megamoe.MoELayer.__new__(megamoe.MoELayer)
    layer._attach(_megamoe.Layer.for_rank(1, 0, all_gather, 2, 16, 64, 4, 256, 128))
    weights = ref.random_weights(8, 256, 128, generator=torch.Generator().manual_seed(0), device="cpu")
    with pytest.raises(RuntimeError, match=message):
        layer.load_weights(*(t.to(layer.device()) for t in weights))
