"""SPEC §3 in plain PyTorch, written from the contract alone (no megamoe code): the FP8
quantization rule, the block-scaled GEMM, SwiGLU with the routing weight, the re-quantized
intermediate and the combine. It is what the GPU tests and the serving example check the layer
against, and a readable statement of the numerics. It favours clarity over speed (f64 block
sums, a loop over experts): seconds for a few hundred tokens of the flash shape on a GPU.

Where it can differ from the kernels in the last bit: SPEC's fused multiply-add per scale group
is an f64 multiply-add rounded to f32 here (a double rounding, rarely different), and silu's
exponential is torch's f64 one rounded to f32; a flipped e4m3 code of the intermediate then
moves one output a little. SPEC's accuracy contract (diff <= 1e-4) covers this with a wide margin.
"""

from __future__ import annotations

import torch
from torch import Tensor

E4M3_MAX = 448.0
INPUT_FLOOR = 1e-4  # inputs and weights
INTERMEDIATE_FLOOR = 1e-10


def diff(x: Tensor, y: Tensor) -> float:
    """SPEC's diff(x, y) = Σ(x−y)² / Σ(x²+y²) in f64 (0 when both are all zero)."""
    x, y = x.double(), y.double()
    den = (x * x + y * y).sum().item()
    return 0.0 if den == 0 else ((x - y) ** 2).sum().item() / den


def _scale_and_inverse(amax: Tensor, floor: float) -> tuple[Tensor, Tensor]:
    """sf = max(amax, floor) / 448 and 1 / sf, each one f32 division of two tensors: torch's
    CUDA division by a Python number multiplies by its reciprocal instead (one rounding more)."""
    sf = amax.clamp_min(floor) / torch.full_like(amax, E4M3_MAX)
    return sf, torch.ones_like(sf) / sf


def quantize(v: Tensor, group: int, floor: float) -> tuple[Tensor, Tensor]:
    """e4m3 codes and f32 scales of v [rows, cols] per `group` contiguous columns:
    sf = max(amax, floor) / 448, q = e4m3(v · (1/sf)), round-to-nearest-even, saturating."""
    rows, cols = v.shape
    g = v.float().reshape(rows, cols // group, group)
    sf, inv = _scale_and_inverse(g.abs().amax(dim=2), floor)
    scaled = g * inv[:, :, None]
    q = scaled.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.reshape(rows, cols), sf


def quantize_weights(w: Tensor) -> tuple[Tensor, Tensor]:
    """e4m3 codes and f32 scales of w [E, N, K] per 128 x 128 block (floor 1e-4)."""
    e, n, k = w.shape
    b = w.float().reshape(e, n // 128, 128, k // 128, 128)
    sf, inv = _scale_and_inverse(b.abs().amax(dim=(2, 4)), INPUT_FLOOR)
    scaled = b * inv[:, :, None, :, None]
    q = scaled.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.reshape(e, n, k), sf


def block_gemm(qa: Tensor, sa: Tensor, qb: Tensor, sb: Tensor, group: int) -> Tensor:
    """f32 [M, N] of e4m3 values qa [M, K] (scales sa [M, K/group]) times e4m3 values qbᵀ, qb
    [N, K] (scales sb [N/128, K/128]), each held in an e4m3 or wider float tensor: each group's
    products summed exactly (f64: every product is a multiple of 2^-18 below 2^18, a group's sum
    below 2^25), rounded to f32, then added into the running f32 sum as
    sum + blocksum · (sa · sb)."""
    m, k = qa.shape
    n = qb.shape[0]
    kg = k // group
    a = qa.double().reshape(m, kg, group)
    b = qb.double().reshape(n, kg, group)
    blocks = torch.einsum("mgc,ngc->gmn", a, b).float()
    # [N, kg]: the weight scale of every output row and activation scale group.
    sb_cols = sb.repeat_interleave(128, dim=0)[:, torch.arange(kg, device=sb.device) * group // 128]
    acc = torch.zeros(m, n, dtype=torch.float32, device=qa.device)
    for g in range(kg):
        scale = sa[:, g][:, None] * sb_cols[:, g][None, :]  # f32
        acc = (blocks[g].double() * scale.double() + acc.double()).float()
    return acc


def swiglu(h: Tensor, weight: Tensor, clamp: float | None) -> Tensor:
    """a = silu(g) · u · weight with g, u the two halves of h [M, 2I] (f32 throughout), g
    clamped from above and u on both sides by `clamp` when given."""
    i = h.shape[1] // 2
    g, u = h[:, :i], h[:, i:]
    if clamp is not None:
        g = g.clamp(max=clamp)
        u = u.clamp(-clamp, clamp)
    silu = g / (1.0 + torch.exp(-g.double()).float())
    return silu * u * weight[:, None]


def moe_forward(
    x: Tensor | tuple[Tensor, Tensor],
    topk_idx: Tensor,
    topk_weights: Tensor,
    w1: Tensor,
    s1: Tensor,
    w2: Tensor,
    s2: Tensor,
    group: int,
    clamp: float | None = None,
) -> Tensor:
    """y bf16 [T, H] of the layer (SPEC §3) on every token of x: bf16 [T, H], or an e4m3 tuple
    (codes [T, H], f32 scales [T, H/128]); topk_idx [T, K] (-1 masked); topk_weights f32 [T, K];
    the weights of all E experts in SPEC §2's layouts; `group` the intermediate's scale group."""
    if isinstance(x, tuple):
        qx, sx = x
    else:
        qx, sx = quantize(x, 128, INPUT_FLOOR)
    qx = qx.float()  # e4m3 values are exact in f32, which every indexing kernel takes
    t, k = topk_idx.shape
    h = qx.shape[1]
    out = torch.zeros(t, k, h, dtype=torch.float32, device=qx.device)
    idx = topk_idx.long()
    for e in range(w1.shape[0]):
        tokens, slots = (idx == e).nonzero(as_tuple=True)
        if tokens.numel() == 0:
            continue
        l1 = block_gemm(qx[tokens], sx[tokens], w1[e], s1[e], 128)
        a = swiglu(l1, topk_weights[tokens, slots].float(), clamp)
        qa, sa = quantize(a, group, INTERMEDIATE_FLOOR)
        o = block_gemm(qa, sa, w2[e], s2[e], group).bfloat16()
        out[tokens, slots] = o.float()
    y = torch.zeros(t, h, dtype=torch.float32, device=qx.device)
    for slot in range(k):  # ascending slot order, one rounding at the end
        y = y + out[:, slot]
    return y.bfloat16()


def random_batch(
    tokens: int,
    hidden: int,
    experts: int,
    topk: int,
    masked: float = 0.0,
    generator: torch.Generator | None = None,
    device: str = "cuda",
) -> tuple[Tensor, Tensor, Tensor]:
    """x bf16 [T, H], topk_idx int64 [T, K] (distinct experts per token, a share `masked` of
    the slots -1), topk_weights f32 [T, K]."""
    gen = dict(generator=generator, device=device)
    x = torch.randn(tokens, hidden, **gen).bfloat16()
    idx = torch.rand(tokens, experts, **gen).topk(topk, dim=1).indices
    idx[torch.rand(tokens, topk, **gen) < masked] = -1
    weights = torch.rand(tokens, topk, **gen)
    return x, idx, weights


def random_weights(
    experts: int, hidden: int, inter: int, generator: torch.Generator | None = None, device: str = "cuda"
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(w1, s1, w2, s2): seeded FP8 experts in SPEC §2's layouts."""
    gen = dict(generator=generator, device=device)
    w1 = torch.randn(experts, 2 * inter, hidden, **gen) / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, **gen) / inter**0.5
    return (*quantize_weights(w1), *quantize_weights(w2))
