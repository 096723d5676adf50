"""Serving with the megamoe layer: build it, load FP8 expert weights, run a batch of routed
tokens, and check the output against SPEC §3 written in plain PyTorch.

    python python/examples/serve_layer.py [--kind fused|split] [--tokens 256]

Needs PyTorch with CUDA and an H100/H200 (sm_90a). The shape is flash's hidden and intermediate
sizes and top-6 routing, with 32 of its 256 experts so that the PyTorch reference stays quick.
"""

import argparse

import torch

import megamoe
from megamoe import torch_reference as ref


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kind", default="fused", choices=["fused", "split"])
    p.add_argument("--tokens", type=int, default=256)
    args = p.parse_args()
    hidden, inter, experts, topk = 4096, 2048, 32, 6

    # The size query needs no GPU: what the layer will allocate.
    size = megamoe.get_symm_buffer_size(1, experts, args.tokens, topk, hidden, inter, kind=args.kind)
    print(
        f"buffers: {size['symmetric_bytes'] / 2**20:.1f} MiB symmetric, "
        f"{size['weight_bytes'] / 2**20:.1f} MiB of weights"
    )

    layer = megamoe.get_symm_buffer_for_mega_moe(1, experts, args.tokens, topk, hidden, inter, kind=args.kind)
    gen = torch.Generator(device="cuda").manual_seed(0)
    # FP8 weights in SPEC §2's layouts: W1 [E, 2I, H] (gate rows, then up rows), W2 [E, H, I],
    # each with one f32 scale per 128 x 128 block.
    weights = ref.random_weights(experts, hidden, inter, generator=gen)
    layer.load_weights(*weights)

    # A batch as a router leaves it: bf16 activations, top-k expert ids and their weights.
    x, topk_idx, topk_weights = ref.random_batch(args.tokens, hidden, experts, topk, generator=gen)
    y = layer.forward(x, topk_idx, topk_weights)

    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        layer.forward(x, topk_idx, topk_weights)
    stop.record()
    stop.synchronize()
    print(
        f"{args.kind}: {args.tokens} tokens, {start.elapsed_time(stop) / 10:.2f} ms per forward "
        "(host checks and copies included)"
    )

    want = ref.moe_forward(x, topk_idx, topk_weights, *weights, group=layer.scale_granularity)
    d = ref.diff(y, want)
    print(f"diff against the PyTorch reference: {d:.2e} (SPEC's contract: <= 1e-4)")
    assert d <= 1e-4


if __name__ == "__main__":
    main()
