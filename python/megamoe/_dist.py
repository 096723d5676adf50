"""This process's place in a torch.distributed process group, for the worlds and layers of one
process per rank (``ep.Buffer.for_process_group``, ``MoELayer.for_process_group``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ._tensors import torch

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


def process_rank(group: ProcessGroup | None, arg: str) -> tuple[int, int, Callable[[bytes], list], int]:
    """(rank, size, all_gather, device) of this process in ``group`` (None: the default group):
    its rank and the group's size, an ``all_gather(bytes) -> list`` over the group's
    ``all_gather_object`` (the symmetric buffers' handle exchange), and the current CUDA device
    (0 without CUDA). A process outside the group is a ValueError naming ``arg``."""
    th = torch()
    import torch.distributed as dist

    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise ValueError(f"{arg}: this process is not a member of it")

    def all_gather(mine: bytes) -> list:
        out = [None] * size
        dist.all_gather_object(out, mine, group=group)
        return out

    device = th.cuda.current_device() if th.cuda.is_available() else 0
    return rank, size, all_gather, device
