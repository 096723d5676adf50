"""An MoE block as a torch nn.Module on megamoe's dispatch and combine:

    router -> dispatch_with_permute -> expert MLP (torch, per local expert) -> combine_with_unpermute

checked, forward and backward, against a pure-PyTorch implementation of the same block
(`reference_block`: each expert's MLP on the tokens routed to it, weighted and summed in f32).

The world is one process's: `--ranks` ranks, each with its own tokens and `num_experts / ranks`
experts, all on one GPU (virtual ranks; the experts' weights live on rank 0's GPU).

Tolerances (diff = Σ(a−b)² / Σ(a²+b²), SPEC §3's measure): both blocks run the same bf16 ops on
the same bf16 inputs and weights; they differ only in how rows are grouped (cuBLAS may pick
another kernel, so another f32 summation order, for another row count: at most one bf16 rounding
apart per matmul output), in the combine (f32 sum rounded once, or twice with per_rank, against
an f32 index_add rounded once) and, for weight gradients, in how the ranks' contributions are
accumulated. That is a few bf16 roundings (unit roundoff u = 2^-9) per element, a relative error
of at most ~4u = 7.8e-3, so diff <= (4u)^2 / 2 = 3e-5 where no sum cancels: we accept 1e-4
forward and 2e-4 for gradients (cancelling sums make a few elements' relative errors larger).

Run: python python/examples/moe_block.py [--ranks 2] [--order per_rank|exact] (needs a GPU).
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

from megamoe import ep

FORWARD_TOLERANCE = 1e-4
GRADIENT_TOLERANCE = 2e-4


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    den = (a * a + b * b).sum()
    return 0.0 if den == 0 else float(((a - b) ** 2).sum() / den)


class MoEBlock(nn.Module):
    """Top-k routed SwiGLU experts; `forward` takes and returns one `[T_r, H]` bf16 batch per
    rank of `buffer`."""

    def __init__(self, buffer: ep.Buffer, inter: int, pad_multiple: int = 16, order: str = "per_rank", seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        e, h = buffer.num_experts, buffer.hidden
        dev = buffer.device(0)

        def weight(*shape, fan_in):
            return nn.Parameter((torch.randn(*shape, generator=g) / fan_in**0.5).to(torch.bfloat16).to(dev))

        self.buffer, self.pad_multiple, self.order = buffer, pad_multiple, order
        self.router = nn.Parameter((torch.randn(e, h, generator=g) / h**0.5).to(dev))
        self.w1 = weight(e, h, inter, fan_in=h)
        self.w3 = weight(e, h, inter, fan_in=h)
        self.w2 = weight(e, inter, h, fan_in=inter)

    def route(self, x: torch.Tensor):
        """(topk_idx int64 [T, K], probs f32 [T, K]): softmax over the router's logits, top-k."""
        scores = torch.softmax(x.float() @ self.router.t(), dim=-1)
        probs, idx = scores.topk(self.buffer.num_topk, dim=-1)
        return idx, probs

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        return (F.silu(x @ self.w1[e]) * (x @ self.w3[e])) @ self.w2[e]

    def forward(self, xs):
        b = self.buffer
        routes = [self.route(x) for x in xs]
        d = ep.dispatch_with_permute_ranks(
            b, xs, [i for i, _ in routes], [p for _, p in routes], self.pad_multiple, self.order
        )
        local = b.num_experts // b.num_ranks
        outs = []
        for r in range(b.num_ranks):
            rows = d.rows[r].split(d.tokens_per_expert[r])
            probs = d.probs[r].split(d.tokens_per_expert[r])
            # The expert applies the router weight (Megatron's convention); padding rows have 0.
            outs.append(
                torch.cat(
                    [
                        self.expert(r * local + j, x) * p.unsqueeze(1).to(torch.bfloat16)
                        for j, (x, p) in enumerate(zip(rows, probs))
                    ]
                )
            )
        return ep.combine_with_unpermute_ranks(b, outs, d.handle, self.order)


def reference_block(block: MoEBlock, xs):
    """The same block in plain PyTorch: every expert on the tokens routed to it."""
    ys = []
    for x in xs:
        idx, probs = block.route(x)
        y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e in range(block.buffer.num_experts):
            t, k = (idx == e).nonzero(as_tuple=True)
            if len(t):
                out = block.expert(e, x[t]) * probs[t, k].unsqueeze(1).to(torch.bfloat16)
                y = y.index_add(0, t, out.float())
        ys.append(y.to(torch.bfloat16))
    return ys


def compare(ranks: int = 2, order: str = "per_rank", tokens: int = 96, seed: int = 0) -> dict:
    """Runs both blocks forward and backward on the same inputs; returns every diff."""
    hidden, inter, experts, topk = 256, 128, 8 * ranks, 4
    buffer = ep.Buffer(ranks, experts, topk, hidden, tokens, max_pad_multiple=16, num_sms=16)
    block = MoEBlock(buffer, inter, pad_multiple=16, order=order, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    xs = [torch.randn(tokens, hidden, generator=g).to(torch.bfloat16).to(buffer.device(r)) for r in range(ranks)]
    grads = [torch.randn(tokens, hidden, generator=g).to(buffer.device(r)) for r in range(ranks)]

    def run(fn):
        block.zero_grad()
        inputs = [x.clone().requires_grad_() for x in xs]
        ys = fn(inputs)
        sum((y.float() * gy).sum() for y, gy in zip(ys, grads)).backward()
        named = {f"x[{r}].grad": x.grad for r, x in enumerate(inputs)}
        named.update({f"{n}.grad": p.grad.clone() for n, p in block.named_parameters()})
        return [y.detach() for y in ys], named

    ys, got = run(block)
    ys_ref, want = run(lambda inputs: reference_block(block, inputs))
    out = {f"y[{r}]": diff(a, b) for r, (a, b) in enumerate(zip(ys, ys_ref))}
    out.update({name: diff(got[name], want[name]) for name in got})
    return out


def check(diffs: dict) -> None:
    for name, d in diffs.items():
        limit = FORWARD_TOLERANCE if name.startswith("y[") else GRADIENT_TOLERANCE
        assert d <= limit, f"{name}: diff {d:.3g} exceeds {limit:g}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--order", default="per_rank", choices=ep.ORDERS)
    args = p.parse_args()
    diffs = compare(args.ranks, args.order)
    for name, d in diffs.items():
        print(f"{name}: diff {d:.3g}")
    check(diffs)
    print(f"MoE block on {args.ranks} ranks ({args.order} combine) matches the PyTorch block, forward and backward")


if __name__ == "__main__":
    main()
