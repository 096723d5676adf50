"""The MoE layer (fused or split kind) with one process per rank, as torchrun launches them.

Every process builds its rank of the layer (``MoELayer.for_process_group``), loads its own experts
(a slice of seeded full weights that every process generates alike), and runs the forward pass on
its own seeded tokens. Then each process checks its rank's y against the same batch run by a layer
of every rank in this process (``MoELayer(num_ranks=R)``, both ranks' inputs regenerated from the
seeds, nothing gathered), bit for bit, and against ``megamoe.torch_reference`` (SPEC §3's diff,
at most 1e-4). Each rank prints its verdict and diff; rank 0 prints PASS or FAIL for the whole
world (exit code 1 on FAIL).

    torchrun --nproc-per-node 2 python/examples/layer_torchrun.py                # rank r on GPU r
    torchrun --nproc-per-node 2 python/examples/layer_torchrun.py --same-device  # every rank on GPU 0
    torchrun --nproc-per-node 2 python/examples/layer_torchrun.py --kind split   # the split kind

Ranks on separate GPUs talk over nccl; with ``--same-device`` over gloo (nccl refuses two ranks on
one GPU; the GPU then time-slices between the processes). Needs a GPU and torch.
"""

import argparse
import os

import torch
import torch.distributed as dist

import megamoe
from megamoe import torch_reference as ref

# The tiny preset: H 256, I 128, 16 experts, top-4; at most 64 tokens per rank and call.
EXPERTS, TOPK, HIDDEN, INTER, MAX_TOKENS = 16, 4, 256, 128, 64
MAX_DIFF = 1e-4


def make_layer(kind: str = "fused", process_group=None) -> megamoe.MoELayer:
    """This process's rank of the layer of ``kind`` of the small shape."""
    return megamoe.MoELayer.for_process_group(
        EXPERTS, MAX_TOKENS, TOPK, HIDDEN, INTER, kind=kind, process_group=process_group
    )


def full_weights(seed: int):
    """(w1, s1, w2, s2) of all experts, on the CPU: the same in every process for one seed."""
    g = torch.Generator().manual_seed(seed)
    return ref.random_weights(EXPERTS, HIDDEN, INTER, generator=g, device="cpu")


def rank_batch(rank: int, seed: int):
    """Rank ``rank``'s (x, topk_idx, topk_weights) on the CPU: a different T per rank, a tenth
    of the slots masked; any process regenerates any rank's."""
    g = torch.Generator().manual_seed(1000 * seed + 1 + rank)
    return ref.random_batch(48 - 8 * rank, HIDDEN, EXPERTS, TOPK, masked=0.1, generator=g, device="cpu")


def check(layer: megamoe.MoELayer, seed: int = 0, process_group=None):
    """One round on this process's rank (the layer's one rank): loads its experts, runs its
    tokens, then compares its y with a layer of every rank in this process on the whole batch
    and with the torch reference. Returns (bitwise equal, diff against the reference, T). Every
    process of the group calls it."""
    (rank,), world, dev = layer.ranks, layer.num_ranks, layer.device()
    full = full_weights(seed)
    el = EXPERTS // world
    layer.load_weights(*(t[rank * el : (rank + 1) * el].contiguous().to(dev) for t in full))
    x, idx, w = (t.to(dev) for t in rank_batch(rank, seed))
    # Every process is past its exchange; the call waits for its peers' on the device.
    dist.barrier(process_group)
    y = layer.forward(x, idx, w)
    torch.cuda.synchronize(dev)
    dist.barrier(process_group)

    # The same batch through a layer of every rank in this process (rank r on GPU r % visible).
    every = megamoe.MoELayer(world, EXPERTS, MAX_TOKENS, TOPK, HIDDEN, INTER, kind=layer.kind)
    every.load_weights(*(t.to(every.device(0)) for t in full))
    batches = [[t.to(every.device(r)) for t in rank_batch(r, seed)] for r in range(world)]
    ys = every.forward_ranks(*(list(col) for col in zip(*batches)))
    same = torch.equal(y.cpu().view(torch.int16), ys[rank].cpu().view(torch.int16))
    del every

    want = ref.moe_forward(x, idx, w, *(t.to(dev) for t in full), group=layer.scale_granularity, clamp=layer.clamp)
    return same, ref.diff(y, want), x.shape[0]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--same-device", action="store_true", help="every process on GPU 0 (gloo)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kind", choices=["fused", "split"], default="fused")
    args = p.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(0 if args.same_device else local_rank)
    dist.init_process_group("gloo" if args.same_device else "nccl")
    rank = dist.get_rank()
    same, d, tokens = check(make_layer(args.kind), args.seed)
    ok = same and d <= MAX_DIFF
    verdict = "bitwise equal to" if same else "bits differ from"
    print(
        f"rank {rank}: T {tokens}, y {verdict} the layer of every rank in one process; "
        f"diff {d:.2e} against the torch reference (bound {MAX_DIFF:.0e})",
        flush=True,
    )
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, ok)
    if rank == 0:
        failed = [r for r, good in enumerate(every) if not good]
        print("PASS: every rank bitwise equal, within the bound" if not failed else f"FAIL: ranks {failed}")
    dist.destroy_process_group()
    raise SystemExit(0 if all(every) else 1)


if __name__ == "__main__":
    main()
