"""megamoe.compat.hybrid_ep.HybridEPBuffer on a GPU, called as Megatron-Core calls it: dispatch
with permute from a routing map (rows bit for bit against a PyTorch permute, probs, padded
tokens per expert), combine, the probs' gradient ``[T, E]``, the combine's backward, padding,
the non-blocking mode and its overflow flag, the top-k bound, and bad input (ValueError naming
the argument, nothing written, the buffer usable after), on one rank and on two virtual ranks.
Megatron's own dispatcher on this buffer runs in scripts/megatron_checks.py. Skipped without
torch or without a CUDA GPU."""

import pytest

torch = pytest.importorskip("torch", reason="the HybridEP-compatible buffer needs torch")

import megamoe  # noqa: E402
from megamoe.compat.hybrid_ep import Handle, HybridEPBuffer  # noqa: E402

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and megamoe.gpu_available()), reason="no CUDA GPU")

HIDDEN, TOKENS, LOCAL = 256, 48, 4

_buffers = {}


def buffer(ranks, num_topk=None):
    key = (ranks, num_topk)
    if key not in _buffers:
        _buffers[key] = HybridEPBuffer.for_virtual_world(
            ranks, HIDDEN, TOKENS, LOCAL, num_sms=16, num_topk=num_topk, max_pad_multiple=16
        )
    return _buffers[key]


def inputs(ranks, topk, seed, tokens=TOKENS):
    """Per rank: bf16 x [T, H], bool routing_map [T, E] with topk experts a token (a few tokens
    with fewer), f32 probs [T, E] (zero off the map)."""
    g = torch.Generator().manual_seed(seed)
    e = LOCAL * ranks
    out = []
    for _ in range(ranks):
        scores = torch.randn(tokens, e, generator=g)
        idx = scores.topk(topk, dim=1).indices
        rmap = torch.zeros(tokens, e, dtype=torch.bool).scatter_(1, idx, True)
        rmap[: tokens // 8, 0] = False  # tokens with fewer experts
        probs = torch.rand(tokens, e, generator=g) * rmap
        x = torch.randn(tokens, HIDDEN, generator=g).to(torch.bfloat16)
        out.append((x.cuda(), rmap.cuda(), probs.cuda()))
    return out


def reference(ins, pad):
    """Per rank d: rows of its experts in order (expert, source rank, token), each segment padded
    with zero rows to a multiple of pad; their probs; padded counts; and where each (source, token,
    expert) landed, for the combine."""
    ranks = len(ins)
    out = []
    for d in range(ranks):
        rows, probs, counts, where = [], [], [], {}
        for j in range(LOCAL):
            e = d * LOCAL + j
            n = 0
            for src, (x, rmap, p) in enumerate(ins):
                for t in rmap[:, e].nonzero().flatten().tolist():
                    where[(src, t, e)] = sum(counts) + n
                    rows.append(x[t].cpu())
                    probs.append(float(p[t, e]))
                    n += 1
            padded = -(-n // pad) * pad
            rows += [torch.zeros(HIDDEN, dtype=torch.bfloat16)] * (padded - n)
            probs += [0.0] * (padded - n)
            counts.append(padded)
        out.append(
            dict(
                rows=torch.stack(rows) if rows else torch.zeros(0, HIDDEN, dtype=torch.bfloat16),
                probs=torch.tensor(probs),
                counts=counts,
                where=where,
            )
        )
    return out


def split(ins):
    return [[t[i] for t in ins] for i in range(3)]


@pytest.mark.parametrize("ranks, num_topk", [(1, None), (2, None), (2, 3)])
@pytest.mark.parametrize("pad", [None, 16])
def test_dispatch_combine_and_their_backwards_match_pytorch(ranks, num_topk, pad):
    """K = E (the default here: every column a slot) and K < E (top-k of the map's columns)."""
    b = buffer(ranks, num_topk)
    ins = inputs(ranks, 2, seed=ranks * 10 + (pad or 0))
    x, rmap, probs = split(ins)
    rows, row_probs, scale, tpe, handle = b.dispatch_with_permute(
        hidden=x,
        routing_map=rmap,
        probs=probs,
        num_of_experts_per_rank=LOCAL,
        pad_multiple=pad,
        fuse_permute_dispatch=True,
    )
    want = reference(ins, pad or 1)
    assert scale is None and isinstance(handle, Handle)
    for d in range(ranks):
        assert torch.equal(rows[d].cpu().view(torch.int16), want[d]["rows"].view(torch.int16))
        assert torch.equal(row_probs[d].cpu(), want[d]["probs"])
        assert tpe[d].dtype == torch.int64 and tpe[d].device.type == "cpu" and tpe[d].is_pinned()
        assert tpe[d].tolist() == want[d]["counts"]
        assert int(handle.overflow_flag[d]) == 0
    # Combine: every token's rows summed back (weights applied by the caller, as Megatron does).
    weighted = [(r.float() * q.unsqueeze(1)).to(torch.bfloat16) for r, q in zip(rows, row_probs)]
    y, none = b.combine_with_unpermute(hidden=weighted, handle=handle, pad_multiple=pad, fuse_unpermute_combine=True)
    assert none is None
    for src in range(ranks):
        expect = (x[src].float() * probs[src].sum(1, keepdim=True)).to(torch.bfloat16)
        torch.testing.assert_close(y[src], expect, atol=2e-2, rtol=2e-2)
    # Dispatch's backward: the row-prob gradients land in [T, E] where the map is set.
    grad_rows = [torch.randn_like(r) for r in rows]
    grad_p = [torch.randn(r.shape[0], device=r.device) for r in rows]
    gx, gp = b.combine_with_unpermute(hidden=grad_rows, probs=grad_p, handle=handle, pad_multiple=pad)
    for src in range(ranks):
        expect = torch.zeros_like(probs[src])
        for (s, t, e), at in ((k, v) for d in range(ranks) for k, v in want[d]["where"].items()):
            if s == src:
                expect[t, e] = grad_p[e // LOCAL][at]
        assert gp[src].dtype == torch.float32 and torch.equal(gp[src], expect)
        assert gx[src].shape == x[src].shape
    # Combine's backward: the output gradient dispatched along the handle (padding rows zero).
    gy = [torch.randn_like(t) for t in x]
    back, _, _, _, same = b.dispatch_with_permute(
        hidden=gy, handle=handle, pad_multiple=pad, fuse_permute_dispatch=True
    )
    assert same is handle
    ref = reference([(g, m, p) for g, m, p in zip(gy, rmap, probs)], pad or 1)
    for d in range(ranks):
        assert torch.equal(back[d].cpu().view(torch.int16), ref[d]["rows"].view(torch.int16))


def test_non_blocking_keeps_counts_on_the_gpu_and_flags_an_overflow():
    b = buffer(1)
    x, rmap, probs = split(inputs(1, 2, seed=5))
    exact = reference([(x[0], rmap[0], probs[0])], 1)[0]
    n = exact["rows"].shape[0]
    rows, _, _, tpe, h = b.dispatch_with_permute(
        hidden=x, routing_map=rmap, probs=probs, num_permuted_tokens=n + 8, non_blocking=True
    )
    assert rows[0].shape[0] == n + 8
    assert tpe[0].device.type == "cuda" and tpe[0].dtype == torch.int64
    assert tpe[0].tolist() == exact["counts"] and int(h.overflow_flag[0]) == 0
    assert torch.equal(rows[0][:n].cpu().view(torch.int16), exact["rows"].view(torch.int16))
    y, _ = b.combine_with_unpermute(hidden=rows, handle=h)
    torch.testing.assert_close(y[0], (x[0].float() * rmap[0].sum(1, keepdim=True)).to(torch.bfloat16))
    # A budget below the rows: no rows move and the flag says so; the next blocking call clears it.
    _, _, _, _, over = b.dispatch_with_permute(
        hidden=x, routing_map=rmap, probs=probs, num_permuted_tokens=n // 2, non_blocking=True
    )
    assert int(over.overflow_flag[0]) != 0
    b.dispatch_with_permute(hidden=x, routing_map=rmap, probs=probs)
    _, _, _, _, fine = b.dispatch_with_permute(
        hidden=x, routing_map=rmap, probs=probs, num_permuted_tokens=n, non_blocking=True
    )
    assert int(fine.overflow_flag[0]) == 0
    b.sync()


def test_a_token_past_the_topk_bound_is_refused_or_flagged():
    b = buffer(1, num_topk=2)
    x, rmap, probs = split(inputs(1, 3, seed=6))
    with pytest.raises(ValueError, match="^routing_map: a token routes to 3 experts"):
        b.dispatch_with_permute(hidden=x, routing_map=rmap, probs=probs)
    _, _, _, _, h = b.dispatch_with_permute(
        hidden=x, routing_map=rmap, probs=probs, num_permuted_tokens=3 * TOKENS, non_blocking=True
    )
    assert int(h.overflow_flag[0]) != 0
    b.sync()


def bad_cases(x, rmap, probs):
    t = x[0].shape[0]
    return [
        (dict(routing_map=[rmap[0].int()]), "routing_map"),
        (dict(routing_map=[rmap[0][:, :2]]), "routing_map"),
        (dict(probs=[probs[0].double()]), "probs"),
        (dict(probs=[probs[0][: t - 1]]), "probs"),
        (dict(hidden=[x[0].float()]), "hidden"),
        (
            dict(
                hidden=[torch.zeros(TOKENS + 1, HIDDEN, dtype=torch.bfloat16, device="cuda")],
                routing_map=[torch.zeros(TOKENS + 1, LOCAL, dtype=torch.bool, device="cuda")],
            ),
            "hidden",
        ),
        (dict(num_of_experts_per_rank=LOCAL + 1), "num_of_experts_per_rank"),
        (dict(pad_multiple=17), "pad_multiple"),
        (dict(non_blocking=True), "num_permuted_tokens"),
        (dict(num_permuted_tokens=10, pad_multiple=16), "num_permuted_tokens"),
        (dict(scaling_factor=x[0]), "scaling_factor"),
    ]


def test_bad_input_is_a_value_error_naming_it_and_nothing_is_written():
    b = buffer(1)
    x, rmap, probs = split(inputs(1, 2, seed=7))
    rows, _, _, _, h = b.dispatch_with_permute(hidden=x, routing_map=rmap, probs=probs)
    y0, _ = b.combine_with_unpermute(hidden=rows, handle=h)
    good = dict(hidden=x, routing_map=rmap, probs=probs)
    for bad, name in bad_cases(x, rmap, probs):
        with pytest.raises(ValueError, match=f"^{name}"):
            b.dispatch_with_permute(**dict(good, **bad))
    other = buffer(2)
    x2, rmap2, probs2 = split(inputs(2, 2, seed=8))
    _, _, _, _, foreign = other.dispatch_with_permute(hidden=x2, routing_map=rmap2, probs=probs2)
    for call in (
        lambda: b.combine_with_unpermute(hidden=rows, handle=foreign),
        lambda: b.combine_with_unpermute(hidden=rows, handle=tuple(h)),
        lambda: b.dispatch_with_permute(hidden=x, handle=foreign),
        lambda: b.combine_with_unpermute(hidden=rows, handle=h, pad_multiple=16),
        lambda: b.combine_with_unpermute(hidden=[rows[0][1:]], handle=h),
    ):
        with pytest.raises(ValueError, match="^(handle|pad_multiple|hidden)"):
            call()
    # The earlier handle still combines to the same bits, and the buffer dispatches again.
    y1, _ = b.combine_with_unpermute(hidden=rows, handle=h)
    assert torch.equal(y0[0], y1[0])
    again, _, _, _, _ = b.dispatch_with_permute(hidden=x, routing_map=rmap, probs=probs)
    assert torch.equal(again[0], rows[0])
