"""Shared by the tests of one process per rank: an all_gather that records its calls (the CPU
tests: bad arguments are rejected before the peers are ever called), all_gathers that fail the
exchange, and two processes of a gloo group on one GPU (the GPU tests)."""

import datetime
import os
import tempfile


class Gather:
    """An all_gather of a world of 2 that records its calls (the exchange of one process per
    rank); it answers with this process's bytes twice."""

    def __init__(self):
        self.calls = 0

    def __call__(self, mine):
        self.calls += 1
        return [mine, mine]


def assert_rejected_before_any_exchange(build, bad, name):
    """``build(all_gather, **bad)`` (one process's rank) raises a ValueError matching ``name``
    and never calls its all_gather; ``bad`` may name the all_gather itself."""
    import pytest

    kw = dict(bad)
    gather = kw.pop("all_gather") if "all_gather" in kw else Gather()
    with pytest.raises(ValueError, match=name):
        build(gather, **kw)
    assert getattr(gather, "calls", 0) == 0


def _peers_gone(_mine):
    raise OSError("the peers are gone")


# all_gathers that fail rank 1's handle exchange in a world of 2, with the error each must give.
FAILING_EXCHANGES = [
    (_peers_gone, "rank 1: handle exchange: all_gather: OSError: the peers are gone"),
    (lambda mine: [mine], "rank 1: handle exchange: got 1 ranks' handles, the world has 2"),
]


def run_two_processes(worker):
    """Runs ``worker(rank)`` in two spawned processes, ranks 0 and 1 of a gloo group joined over a
    temporary file, both on cuda:0 (``worker`` a module-level function); raises if either fails."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_join_and_run, args=(worker, os.path.join(d, "init")), nprocs=2, join=True)


def _join_and_run(rank, worker, init_file):
    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=60),
    )
    torch.cuda.set_device(0)
    worker(rank)
    dist.destroy_process_group()
