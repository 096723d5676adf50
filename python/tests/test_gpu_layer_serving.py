"""Serving on the GPU: DeepGEMM's mega-MoE call sequence through ``megamoe.deep_gemm`` (world size
1, and one process per rank: two processes of a gloo group sharing cuda:0), the forward given
``y`` captured in CUDA graphs and replayed with new inputs bit-equal to eager calls, and the
values the device checks (each bad one: reported naming its argument, the other tokens' rows
bit-equal to a clean call's, the bad token's row zero, the layer usable after). Skipped without
torch or a CUDA GPU.

Shapes: tiny (H 256, I 128, 16 experts, top-4), where correctness is the point. The reference is
megamoe.torch_reference within SPEC's 1e-4, and megamoe's own layer bit for bit."""

import pytest

torch = pytest.importorskip("torch", reason="the GPU layer takes torch tensors")

import megamoe  # noqa: E402
import megamoe.deep_gemm as deep_gemm  # noqa: E402
from megamoe import torch_reference as ref  # noqa: E402

from _procs import run_two_processes  # noqa: E402

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and megamoe.gpu_available()), reason="no CUDA GPU")

E, K, H, I = 16, 4, 256, 128
MAX_DIFF = 1e-4


def bits(t):
    return t.view(torch.int16)


def same_bits(a, b):
    return torch.equal(bits(a), bits(b))


def seeded_weights(seed):
    """Every expert's (w1, s1, w2, s2) on the GPU, the same in every process for one seed."""
    g = torch.Generator().manual_seed(seed)
    return [t.cuda() for t in ref.random_weights(E, H, I, generator=g, device="cpu")]


def seeded_batch(seed, tokens, masked=0.1):
    """(x, topk_idx, topk_weights) on the GPU, the same in every process for one seed."""
    g = torch.Generator().manual_seed(seed)
    return [t.cuda() for t in ref.random_batch(tokens, H, E, K, masked=masked, generator=g, device="cpu")]


def deep_gemm_round(buffer, weights, x, idx, w, stats):
    """DeepGEMM's documented sequence after allocation: transform, fill the staging tensors,
    call into y. Returns y."""
    l1, l2 = deep_gemm.transform_weights_for_mega_moe_sm90(weights[:2], weights[2:])
    t = x.shape[0]
    qx, sx = ref.quantize(x, 128, ref.INPUT_FLOOR)
    buffer.x[:t].copy_(qx)
    buffer.x_sf[:t].copy_(sx)
    buffer.topk_idx[:t].copy_(idx)
    buffer.topk_weights[:t].copy_(w)
    y = torch.empty((t, H), dtype=torch.bfloat16, device="cuda")
    deep_gemm.fp8_mega_moe(y, l1, l2, buffer, cumulative_local_expert_recv_stats=stats)
    return y


def received(idx, first, count):
    """Rows each of experts first..first+count-1 receives from `idx` (any rank's)."""
    ids = idx[idx >= 0].flatten().cpu()
    return torch.bincount(ids, minlength=E)[first : first + count].int()


@pytest.mark.parametrize("fused", [True, False])
def test_deep_gemm_call_sequence_at_world_size_1(fused):
    weights, (x, idx, w) = seeded_weights(0), seeded_batch(0, 40)
    buffer = deep_gemm.get_symm_buffer_for_mega_moe(None, E, 40, K, H, I, fused=fused)
    assert buffer.num_max_tokens_per_rank == 128  # rounded up to the token alignment
    assert buffer.x.shape == (128, H) and buffer.topk_idx.dtype == torch.int64
    stats = torch.zeros(E, dtype=torch.int32, device="cuda")
    y = deep_gemm_round(buffer, weights, x, idx, w, stats)
    torch.cuda.synchronize()
    want = ref.moe_forward(x, idx, w, *weights, group=buffer.layer.scale_granularity)
    d = ref.diff(y, want)
    print(f"deep_gemm fused={fused} R=1: diff {d:.2e} against the torch reference")
    assert d <= MAX_DIFF
    # The same bits as megamoe's own layer on the same batch.
    own = megamoe.MoELayer(1, E, 128, K, H, I, kind="fused")
    own.load_weights(*weights)
    assert same_bits(y, own.forward(x, idx, w))
    assert torch.equal(stats.cpu(), received(idx, 0, E))
    # A second call adds to the statistics and writes the same bits.
    y2 = deep_gemm_round(buffer, weights, x, idx, w, stats)
    torch.cuda.synchronize()
    assert same_bits(y2, y)
    assert torch.equal(stats.cpu(), 2 * received(idx, 0, E))


def _deep_gemm_rank(rank):
    """One process's rank of a world of 2 through DeepGEMM's calls: its experts, its tokens, its
    y bit-equal to a layer of every rank in this process, its statistics the rows its experts
    receive from both ranks."""
    import torch.distributed as dist

    group = dist.group.WORLD
    el = E // 2
    weights = seeded_weights(1)
    batches = [seeded_batch(10 + r, 48 - 8 * r) for r in range(2)]
    mine = [t[rank * el : (rank + 1) * el].contiguous() for t in weights]
    x, idx, w = batches[rank]
    buffer = deep_gemm.get_symm_buffer_for_mega_moe(group, E, 48, K, H, I, fused=True)
    stats = torch.zeros(el, dtype=torch.int32, device="cuda")
    # The first call loads the weights (every process does, the handles are exchanged then).
    y = deep_gemm_round(buffer, mine, x, idx, w, stats)
    torch.cuda.synchronize()
    dist.barrier()
    every = megamoe.MoELayer(2, E, 48, K, H, I, kind="fused")
    every.load_weights(*weights)
    ys = every.forward_ranks(*([b[j] for b in batches] for j in range(3)))
    assert same_bits(y, ys[rank]), f"rank {rank}: bits differ from the layer of every rank"
    want = sum(received(b[1], rank * el, el) for b in batches)
    assert torch.equal(stats.cpu(), want), f"rank {rank}: stats {stats.tolist()} != {want.tolist()}"
    print(f"deep_gemm R=2 rank {rank}: y bit-equal, received {stats.tolist()}")
    # Bounds that differ between the ranks: every rank's kernel finds it, no rank runs the call
    # or hangs, and check() names the argument; the next good call gives the same bits.
    l1, l2 = deep_gemm.transform_weights_for_mega_moe_sm90(mine[:2], mine[2:])
    y_bad = torch.empty_like(y)
    deep_gemm.fp8_mega_moe(y_bad, l1, l2, buffer, num_tokens_bound=64 * (rank + 1))
    with pytest.raises(ValueError, match="num_tokens_bound"):
        buffer.layer.check()
    y_again = torch.empty_like(y)
    deep_gemm.fp8_mega_moe(y_again, l1, l2, buffer, num_tokens_bound=64)
    buffer.layer.check()
    assert same_bits(y_again, y), f"rank {rank}: the call after the rejected one differs"


def test_deep_gemm_call_sequence_with_one_process_per_rank():
    run_two_processes(_deep_gemm_rank)


@pytest.fixture(scope="module")
def graph_layer():
    """A fused layer of one rank, capacity 256, with seeded weights."""
    layer = megamoe.MoELayer(1, E, 256, K, H, I, kind="fused")
    layer.load_weights(*seeded_weights(2))
    return layer


GRAPH_SIZES = [1, 2, 3, 8, 17, 64, 100, 128, 255, 256]


def test_graph_replays_of_a_decode_step_are_bit_equal_to_eager_calls(graph_layer):
    layer = graph_layer
    for t in GRAPH_SIZES:
        x, idx, w = seeded_batch(100 + t, t)
        y = torch.empty((t, H), dtype=torch.bfloat16, device="cuda")
        layer.forward(x, idx, w, num_tokens_bound=t, y=y)  # eager warm-up
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            layer.forward(x, idx, w, num_tokens_bound=t, y=y)
        for seed in (1, 2):
            nx, nidx, nw = seeded_batch(1000 * seed + t, t)
            x.copy_(nx)
            idx.copy_(nidx)
            w.copy_(nw)
            graph.replay()
            eager = layer.forward(nx, nidx, nw, num_tokens_bound=t)  # host-checked, synchronizes
            assert same_bits(y, eager), f"T {t} replay {seed}: bits differ from the eager call"
        layer.check()
    print(f"graph replays bit-equal to eager calls at T in {GRAPH_SIZES}")


def test_a_deep_gemm_step_is_captured_and_replayed():
    """The staging fill and fp8_mega_moe in one graph, as a serving engine captures a step."""
    weights, (x, idx, w) = seeded_weights(3), seeded_batch(3, 32)
    buffer = deep_gemm.get_symm_buffer_for_mega_moe(None, E, 32, K, H, I, fused=True)
    stats = torch.zeros(E, dtype=torch.int32, device="cuda")
    want = deep_gemm_round(buffer, weights, x, idx, w, stats)  # eager: loads the weights
    l1, l2 = deep_gemm.transform_weights_for_mega_moe_sm90(weights[:2], weights[2:])
    qx, sx = ref.quantize(x, 128, ref.INPUT_FLOOR)
    y = torch.empty_like(want)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        buffer.x[:32].copy_(qx)
        buffer.x_sf[:32].copy_(sx)
        buffer.topk_idx[:32].copy_(idx)
        buffer.topk_weights[:32].copy_(w)
        deep_gemm.fp8_mega_moe(y, l1, l2, buffer, cumulative_local_expert_recv_stats=stats, num_tokens_bound=32)
    graph.replay()
    torch.cuda.synchronize()
    assert same_bits(y, want)
    assert torch.equal(stats.cpu(), 2 * received(idx, 0, E))


def corrupt(idx, w, bad):
    """The batch (no masked slot) with token 5 made bad, and the argument the error must name."""
    idx, w = idx.clone(), w.clone()
    if bad == "expert out of range":
        idx[5, 1] = E
    elif bad == "negative expert":
        idx[5, 1] = -2
    elif bad == "expert twice":
        idx[5, 1] = idx[5, 0]
    elif bad == "nan weight":
        w[5, 1] = float("nan")
    elif bad == "inf weight":
        w[5, 1] = float("-inf")
    return idx, w, "topk_weights" if "weight" in bad else "topk_idx"


BAD_VALUES = ["expert out of range", "negative expert", "expert twice", "nan weight", "inf weight"]


@pytest.mark.parametrize("report", ["next call", "check"])
@pytest.mark.parametrize("bad", BAD_VALUES)
def test_a_bad_value_is_reported_by_the_device_and_harms_no_other_token(graph_layer, bad, report):
    layer = graph_layer
    x, idx, w = seeded_batch(7, 64, masked=0.0)
    clean = layer.forward(x, idx, w, y=torch.empty((64, H), dtype=torch.bfloat16, device="cuda"))
    bidx, bw, arg = corrupt(idx, w, bad)
    y = torch.full((64, H), 7.0, dtype=torch.bfloat16, device="cuda")
    layer.forward(x, bidx, bw, y=y)  # queued: nothing is read back
    torch.cuda.synchronize()
    others = torch.arange(64, device="cuda") != 5
    assert same_bits(y[others], clean[others]), f"{bad}: another token's row changed"
    assert torch.count_nonzero(y[5]) == 0, f"{bad}: the bad token's row is not zero"
    with pytest.raises(ValueError, match=rf"^{arg}: rank 0: `{arg}`"):
        if report == "check":
            layer.check()
        else:
            layer.forward(x, idx, w, y=y)
    # Reported once; the layer is usable and a clean call gives the clean bits.
    layer.check()
    again = layer.forward(x, idx, w, y=torch.empty_like(y))
    layer.check()
    assert same_bits(again, clean)


def test_host_checks_stay_before_the_launch(graph_layer):
    layer = graph_layer
    x, idx, w = seeded_batch(8, 16)
    y = torch.empty((16, H), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="num_tokens_bound"):
        layer.forward(x, idx, w, num_tokens_bound=8, y=y)
    with pytest.raises(ValueError, match="y: shape"):
        layer.forward(x, idx, w, y=y[:8])
    with pytest.raises(ValueError, match="y: dtype"):
        layer.forward(x, idx, w, y=y.float())
    with pytest.raises(ValueError, match="topk_idx: dtype"):
        layer.forward(x, idx.short(), w, y=y)
    # A call that reads the routing back cannot be captured: said before it is made.
    with pytest.raises(RuntimeError, match="y: this call reads the routing back"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            layer.forward(x, idx, w)
    layer.check()
