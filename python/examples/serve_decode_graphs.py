"""Decode steps in CUDA graphs, the way a serving engine runs them: one graph per batch-size bucket,
captured once over static input and output tensors; each step copies its tokens into the smallest
bucket that holds them, masks the padding rows (topk_idx -1: no work, zero output), replays that
bucket's graph and reads the first rows of y. The layer is checked against eager calls on a few
steps, and ``check()`` at the end reports any bad routing value the device saw.

    python python/examples/serve_decode_graphs.py [--preset tiny|flash] [--steps 20]

One GPU, one rank (world size 1); under torchrun build the layer with
``MoELayer.for_process_group`` instead and pass the same bucket as ``num_tokens_bound`` on every
rank (the largest batch over the ranks picks it).
"""

import argparse
import time

import torch

import megamoe
from megamoe import torch_reference as ref

SHAPES = {"tiny": (256, 128, 16, 4), "flash": (4096, 2048, 32, 6)}
BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256]


class DecodeGraphs:
    """One captured forward per bucket over its own static tensors."""

    def __init__(self, layer, hidden, topk):
        self.layer = layer
        self.graphs = {}
        for b in BUCKETS:
            s = dict(
                x=torch.zeros(b, hidden, dtype=torch.bfloat16, device="cuda"),
                idx=torch.full((b, topk), -1, dtype=torch.int64, device="cuda"),
                w=torch.zeros(b, topk, device="cuda"),
                y=torch.empty(b, hidden, dtype=torch.bfloat16, device="cuda"),
            )
            self._forward(s, b)  # eager warm-up: the first call of a shape compiles nothing new
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                self._forward(s, b)
            self.graphs[b] = (g, s)

    def _forward(self, s, bucket):
        self.layer.forward(s["x"], s["idx"], s["w"], num_tokens_bound=bucket, y=s["y"])

    def step(self, x, topk_idx, topk_weights):
        """y of one decode step of len(x) <= 256 tokens (a view of the bucket's static y, valid
        until that bucket's next replay)."""
        n = x.shape[0]
        b = next(b for b in BUCKETS if b >= n)
        g, s = self.graphs[b]
        s["x"][:n].copy_(x)
        s["idx"][:n].copy_(topk_idx)
        s["idx"][n:].fill_(-1)
        s["w"][:n].copy_(topk_weights)
        g.replay()
        return s["y"][:n]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny", choices=sorted(SHAPES))
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    h, i, e, k = SHAPES[args.preset]
    gen = torch.Generator(device="cuda").manual_seed(0)
    layer = megamoe.MoELayer(1, e, BUCKETS[-1], k, h, i, kind="fused")
    layer.load_weights(*ref.random_weights(e, h, i, generator=gen))
    t0 = time.perf_counter()
    graphs = DecodeGraphs(layer, h, k)
    print(f"captured {len(BUCKETS)} buckets in {time.perf_counter() - t0:.2f} s")
    for n in torch.randint(1, BUCKETS[-1] + 1, (args.steps,), generator=torch.Generator().manual_seed(1)):
        x, idx, w = ref.random_batch(int(n), h, e, k, masked=0.05, generator=gen)
        y = graphs.step(x, idx, w)
        want = layer.forward(x, idx, w)  # eager, checked on the host
        same = torch.equal(y.view(torch.int16), want.view(torch.int16))
        print(f"step of {int(n):3d} tokens: replay {'bit-equal to' if same else 'DIFFERS from'} eager")
        assert same
    layer.check()
    print("ok")


if __name__ == "__main__":
    main()
