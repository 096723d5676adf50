"""Dispatch / combine with one process per rank, as torchrun launches them.

Every process builds its rank of the world (``ep.Buffer.for_process_group``), dispatches its own
tokens (``dispatch_with_permute``), combines rows back (``combine_with_unpermute``) and runs both
backwards through autograd; then the ranks' inputs are gathered and each rank checks its own
outputs and gradients against megamoe's CPU reference (``ep.reference``), BF16 and FP8, and prints
the largest absolute difference (0 when the bits are equal). Rank 0 prints PASS or FAIL for the
whole world (exit code 1 on FAIL).

    torchrun --nproc-per-node 2 python/examples/ep_torchrun.py                # rank r on GPU r
    torchrun --nproc-per-node 2 python/examples/ep_torchrun.py --same-device  # every rank on GPU 0

Ranks on separate GPUs talk over nccl; with ``--same-device`` over gloo (nccl refuses two ranks on
one GPU; the GPU then time-slices between the processes). Needs a GPU and torch.
"""

import argparse
import os

import torch
import torch.distributed as dist

from megamoe import ep

EXPERTS, TOPK, HIDDEN, TOKENS, PAD = 32, 4, 256, 64, 16


def make_buffer(dtype: str, group=None) -> ep.Buffer:
    """This process's rank of a world of small shapes; 16 SMs a rank, so that the ranks of a
    shared GPU fit on it together; 10 s device-side deadline (only a failure waits for it)."""
    return ep.Buffer.for_process_group(
        EXPERTS, TOPK, HIDDEN, TOKENS, max_pad_multiple=PAD, dtype=dtype, num_sms=16, deadline_ms=10_000, group=group
    )


def _compare(got: torch.Tensor, want: torch.Tensor):
    """(max abs difference, bitwise equal) of a device result against the CPU reference."""
    got = got.detach().contiguous().cpu()
    if got.shape != want.shape:
        return float("inf"), False
    same = torch.equal(got.view(torch.uint8), want.contiguous().view(torch.uint8))
    worst = float((got.float() - want.float()).abs().max()) if got.numel() else 0.0
    return worst, same


def check(buffer: ep.Buffer, order: str = "per_rank", seed: int = 0, group=None) -> dict:
    """One round on this process's rank (the buffer's one rank): dispatch, combine and both
    backwards on seeded inputs (a quarter of the slots masked), then every rank's inputs
    gathered over ``group`` and this rank's results compared with the CPU reference. Returns
    {result name: (max abs difference, bitwise equal)}. Every process of the group calls it."""
    (rank,), (dev,) = buffer.ranks, buffer.devices
    g = torch.Generator().manual_seed(1000 * seed + rank)
    idx = torch.randn(TOKENS, EXPERTS, generator=g).topk(TOPK, dim=1).indices
    idx[torch.rand(TOKENS, TOPK, generator=g) < 0.25] = -1
    idx = idx.to(dev)
    probs = torch.rand(TOKENS, TOPK, generator=g).to(dev).requires_grad_()
    x = torch.randn(TOKENS, HIDDEN, generator=g).to(torch.bfloat16).to(dev).requires_grad_()
    grad_y = torch.randn(TOKENS, HIDDEN, generator=g).to(torch.bfloat16).to(dev)

    d = ep.dispatch_with_permute(buffer, x, idx, probs, PAD, order)
    n = d.handle.num_rows[0]
    # The combine's input, also the row gradient of dispatch's backward.
    rows = torch.randn(n, HIDDEN, generator=g).to(torch.bfloat16).to(dev).requires_grad_()
    y = ep.combine_with_unpermute(buffer, rows, d.handle, order)
    y.backward(grad_y)
    grad_row_probs = torch.rand(n, generator=g).to(dev)
    torch.autograd.backward([d.rows, d.probs], [rows.detach(), grad_row_probs])

    fp8 = buffer.dtype == "fp8"
    codes, scales = ep.quantize_fp8(x.detach()) if fp8 else (x.detach(), None)
    mine = [codes, scales, idx, probs.detach(), rows.detach(), grad_row_probs, grad_y]
    # Tensors cross as (dtype, bytes): torch's own pickling of e4m3 storage does not load back.
    mine = [None if t is None else (t.dtype, t.cpu().contiguous().view(torch.uint8)) for t in mine]
    every = [None] * buffer.num_ranks
    dist.all_gather_object(every, mine, group=group)
    every = [[None if w is None else w[1].view(w[0]) for w in ts] for ts in every]
    xs, xscales, idxs, ps, rowss, gps, gys = (list(col) for col in zip(*every))
    want = ep.reference(buffer, xs, idxs, ps, PAD, rowss, gps, gys, order, xscales if fp8 else None)
    want = {k: v[rank] for k, v in want.items() if v is not None}

    out = {}
    if fp8:
        got_codes, got_scales = d.fp8
        out["dispatched e4m3 rows"] = _compare(got_codes, want["rows"])
        out["dispatched scales"] = _compare(got_scales, want["scales"])
        out["dequantized rows"] = _compare(d.rows, ep.dequantize_fp8(want["rows"], want["scales"]))
    else:
        out["dispatched rows"] = _compare(d.rows, want["rows"])
    out["dispatched probs"] = _compare(d.probs, want["probs"])
    counts = torch.tensor(d.tokens_per_expert), torch.tensor(want["tokens_per_expert"])
    out["tokens_per_expert"] = _compare(*counts)
    out["combined y"] = _compare(y, want["y"])
    out["combine backward (rows.grad)"] = _compare(rows.grad, want["grad_rows"])
    out["dispatch backward (x.grad)"] = _compare(x.grad, want["grad_x"])
    out["dispatch backward (probs.grad)"] = _compare(probs.grad, want["grad_probs"])
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--same-device", action="store_true", help="every process on GPU 0 (gloo)")
    p.add_argument("--order", choices=ep.ORDERS, default="per_rank", help="the combine order")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(0 if args.same_device else local_rank)
    dist.init_process_group("gloo" if args.same_device else "nccl")
    rank = dist.get_rank()
    ok = True
    for dtype in ("bf16", "fp8"):
        results = check(make_buffer(dtype), args.order, args.seed)
        worst = max(diff for diff, _ in results.values())
        differ = [name for name, (_, same) in results.items() if not same]
        verdict = "bitwise equal" if not differ else "bits differ: " + ", ".join(differ)
        print(f"rank {rank} {dtype} {args.order}: max abs diff vs the CPU reference {worst:.3g}, {verdict}", flush=True)
        ok = ok and not differ
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, ok)
    if rank == 0:
        failed = [r for r, good in enumerate(every) if not good]
        print("PASS: every rank bitwise equal to the CPU reference" if not failed else f"FAIL: ranks {failed}")
    dist.destroy_process_group()
    raise SystemExit(0 if all(every) else 1)


if __name__ == "__main__":
    main()
