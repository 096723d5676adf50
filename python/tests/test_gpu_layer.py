"""The layer and the grouped GEMM on the GPU through torch tensors, checked against
megamoe.torch_reference (SPEC §3 in plain PyTorch, written from the contract, not from the Rust
code). The GPU tests are skipped without PyTorch or a CUDA GPU; the argument checks that need
neither run everywhere.

Tolerance: SPEC's accuracy contract, diff(y, reference) <= 1e-4 (SPEC §3's diff). The reference
quantizes exactly as SPEC says, so what remains is last-bit differences (its multiply-add per
scale group rounds twice, its exponential is torch's), which can flip an e4m3 code of the
intermediate now and then; each diff measured is printed (pytest -s shows it). Fused and split,
and R = 1 and R = 2, are compared bit for bit: SPEC promises the same bits.
"""

import pytest

import megamoe

try:
    import torch

    from megamoe import torch_reference as ref
except ImportError:
    torch = None

GPU = torch is not None and torch.cuda.is_available() and megamoe.gpu_available()
needs_gpu = pytest.mark.skipif(
    not GPU, reason="needs PyTorch with CUDA and a GPU megamoe can use (megamoe.info() says why not)"
)

MAX_DIFF = 1e-4

# tokens: per rank at R = 2 (the R = 1 layer takes both ranks' tokens).
SHAPES = {
    "tiny": dict(hidden=256, intermediate_hidden=128, num_experts=16, num_topk=4, tokens=64),
    # flash's H, I and K with 32 of its 256 experts (the GPU selftest's flash/32).
    "flash32": dict(hidden=4096, intermediate_hidden=2048, num_experts=32, num_topk=6, tokens=96),
}
TINY = dict(num_experts=16, num_topk=4, hidden=256, intermediate_hidden=128)


def build(ranks, shape, kind, max_tokens, weights):
    layer = megamoe.get_symm_buffer_for_mega_moe(
        ranks,
        shape["num_experts"],
        max_tokens,
        shape["num_topk"],
        shape["hidden"],
        shape["intermediate_hidden"],
        kind=kind,
    )
    layer.load_weights(*weights)
    return layer


@pytest.fixture(scope="module", params=list(SHAPES))
def case(request):
    """One shape's weights, a batch of 2T tokens (10 % of the slots masked), its reference
    output, and the layer outputs computed so far, by (kind, ranks)."""
    shape = SHAPES[request.param]
    gen = torch.Generator(device="cuda").manual_seed(1)
    h, i, e, k = (shape[n] for n in ("hidden", "intermediate_hidden", "num_experts", "num_topk"))
    weights = ref.random_weights(e, h, i, generator=gen)
    x, idx, w = ref.random_batch(2 * shape["tokens"], h, e, k, masked=0.1, generator=gen)
    group = megamoe.MoELayer(1, e, 1, k, h, i).scale_granularity
    y = ref.moe_forward(x, idx, w, *weights, group=group)
    return dict(name=request.param, shape=shape, weights=weights, batch=(x, idx, w), reference=y, outputs={})


def output(case, kind, ranks):
    """The layer's output on the case's batch (all tokens, concatenated over ranks)."""
    key = (kind, ranks)
    if key not in case["outputs"]:
        x, idx, w = case["batch"]
        t = case["shape"]["tokens"] * 2 // ranks
        layer = build(ranks, case["shape"], kind, t, case["weights"])
        if ranks == 1:
            y = layer.forward(x, idx, w)
        else:
            # int32 ids here, torch.topk's int64 at R = 1: both are taken.
            y = torch.cat(layer.forward_ranks(list(x.split(t)), [s.int() for s in idx.split(t)], list(w.split(t))))
        case["outputs"][key] = y
    return case["outputs"][key]


@needs_gpu
@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("kind", ["fused", "split"])
def test_the_layer_matches_the_torch_reference(case, kind, ranks):
    y = output(case, kind, ranks)
    assert y.dtype == torch.bfloat16 and y.shape == case["reference"].shape
    d = ref.diff(y, case["reference"])
    same = (y == case["reference"]).float().mean().item()
    print(
        f"{case['name']} {kind} R={ranks}: diff {d:.2e} against the torch reference, "
        f"{same:.1%} of the outputs bit-equal"
    )
    assert d <= MAX_DIFF


@needs_gpu
def test_bf16_input_is_quantized_by_the_spec_rule(case):
    """The layer's quantizer and the reference's (SPEC's rule) agree: x and its quantization
    passed as e4m3 give the same bits."""
    x, idx, w = case["batch"]
    layer = build(1, case["shape"], "fused", 2 * case["shape"]["tokens"], case["weights"])
    y = layer.forward(ref.quantize(x, 128, ref.INPUT_FLOOR), idx, w)
    d = ref.diff(y, case["reference"])
    print(f"{case['name']} fused R=1, e4m3 input: diff {d:.2e} against the torch reference")
    assert torch.equal(y, output(case, "fused", 1))


@needs_gpu
@pytest.mark.parametrize("ranks", [1, 2])
def test_fused_and_split_give_the_same_bits(case, ranks):
    assert torch.equal(output(case, "fused", ranks), output(case, "split", ranks))


@needs_gpu
@pytest.mark.parametrize("kind", ["fused", "split"])
def test_the_bits_do_not_depend_on_the_ranks(case, kind):
    assert torch.equal(output(case, kind, 1), output(case, kind, 2))


@pytest.fixture(scope="module")
def tiny():
    """A fused tiny layer of 2 ranks (T_max 64), its weights and a batch of 64 tokens."""
    if not GPU:
        pytest.skip("needs PyTorch with CUDA and a GPU megamoe can use")
    gen = torch.Generator(device="cuda").manual_seed(2)
    weights = ref.random_weights(16, 256, 128, generator=gen)
    layer = build(2, SHAPES["tiny"], "fused", 64, weights)
    batch = ref.random_batch(64, 256, 16, 4, generator=gen)
    return layer, weights, batch


@needs_gpu
def test_fp8_input_an_empty_rank_and_a_bound(tiny):
    layer, weights, (x, idx, w) = tiny
    qx, sx = ref.quantize(x, 128, ref.INPUT_FLOOR)
    empty = x[:0]
    y = layer.forward_ranks([(qx, sx), empty], [idx, idx[:0]], [w, w[:0]], num_tokens_bound=64)
    assert y[1].shape == (0, 256)
    d = ref.diff(y[0], ref.moe_forward(x, idx, w, *weights, group=layer.scale_granularity))
    print(f"tiny fused R=2, e4m3 input, rank 1 empty: diff {d:.2e}")
    assert d <= MAX_DIFF


@needs_gpu
def test_forward_waits_for_the_callers_stream(tiny):
    layer, _, (x, idx, w) = tiny
    want = layer.forward_ranks([x, x[:0]], [idx, idx[:0]], [w, w[:0]])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # the inputs are written long after the call is made
        late = x.clone()
        got = layer.forward_ranks([late, x[:0]], [idx, idx[:0]], [w, w[:0]])
    assert torch.equal(got[0], want[0])


def corrupt(x, idx, w, arg):
    """The tiny batch with one argument made bad, and the argument the error must name."""
    idx, w = idx.clone(), w.clone()
    if arg == "x dtype":
        x = x.float()
    elif arg == "x device":
        x = x.cpu()
    elif arg == "x layout":
        x = x.t().contiguous().t()
    elif arg == "x alignment":
        x = torch.cat([x.new_zeros(1), x.flatten()])[1:].view(x.shape)  # starts 2 bytes in
    elif arg == "x tokens":
        x = torch.cat([x, x[:1]])
    elif arg == "topk_idx shape":
        idx = idx[:, :3]
    elif arg == "topk_idx range":
        idx[5, 1] = 16
    elif arg == "topk_idx twice":
        idx[7, 2] = idx[7, 0]
    elif arg == "topk_idx wide":
        idx = idx.long()
        idx[3, 3] = 1 << 40
    elif arg == "topk_weights value":
        w[9, 0] = float("nan")  # a valid slot: the batch has no masked one
    return x, idx, w, arg.split()[0]


@needs_gpu
@pytest.mark.parametrize(
    "bad",
    [
        "x dtype",
        "x device",
        "x layout",
        "x alignment",
        "x tokens",
        "topk_idx shape",
        "topk_idx range",
        "topk_idx twice",
        "topk_idx wide",
        "topk_weights value",
    ],
)
def test_bad_arguments_are_value_errors_naming_them(tiny, bad):
    layer, _, (x, idx, w) = tiny
    want = layer.forward_ranks([x, x[:0]], [idx, idx[:0]], [w, w[:0]])
    bx, bidx, bw, arg = corrupt(x, idx, w, bad)
    with pytest.raises(ValueError, match=rf"\b{arg}\b"):
        layer.forward_ranks([x[:0], bx], [idx[:0], bidx], [w[:0], bw])
    # The layer is unharmed: the same call gives the same bits.
    assert torch.equal(layer.forward_ranks([x, x[:0]], [idx, idx[:0]], [w, w[:0]])[0], want[0])


@needs_gpu
def test_lists_passed_to_forward_run_forward_ranks_with_a_deprecation_warning(tiny):
    layer, _, (x, idx, w) = tiny
    want = layer.forward_ranks([x, x[:0]], [idx, idx[:0]], [w, w[:0]])
    with pytest.warns(DeprecationWarning, match="forward_ranks"):
        got = layer.forward([x, x[:0]], [idx, idx[:0]], [w, w[:0]])
    assert len(got) == 2 and got[1].shape == (0, 256)
    assert torch.equal(got[0], want[0])


@needs_gpu
def test_bad_calls_name_what_is_wrong(tiny):
    layer, weights, (x, idx, w) = tiny
    with pytest.raises(ValueError, match="num_tokens_bound"):
        layer.forward_ranks([x, x[:0]], [idx, idx[:0]], [w, w[:0]], num_tokens_bound=10)
    with pytest.raises(ValueError, match="x: expected a list of 2"):
        layer.forward_ranks(x, idx, w)
    with pytest.raises(ValueError, match=r"^x: this layer holds ranks \[0, 1\] .*forward_ranks"):
        layer.forward(x, idx, w)
    with pytest.raises(ValueError, match="w1"):
        layer.load_weights(weights[0][:8], *weights[1:])
    fresh = megamoe.MoELayer(1, **TINY, num_max_tokens_per_rank=8)
    with pytest.raises(RuntimeError, match="load_weights"):
        fresh.forward(x[:8], idx[:8], w[:8])


def gemm_operands(e, n, k, group, rows, gen):
    """Quantized activations of `rows` [E] valid rows each and weights: (a rows per expert as
    (codes, scales [rows, K/G]), b, b_scales)."""
    acts = [ref.quantize(torch.randn(m, k, device="cuda", generator=gen), group, ref.INPUT_FLOOR) for m in rows]
    b, sb = ref.quantize_weights(torch.randn(e, n, k, device="cuda", generator=gen))
    return acts, b, sb


@needs_gpu
@pytest.mark.parametrize("accumulation", ["per-block", "rescaled"])
@pytest.mark.parametrize("group", [128, 64])
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
def test_grouped_gemm_contiguous_matches_torch(group, out_dtype, accumulation):
    out_dtype = getattr(torch, out_dtype)
    gen = torch.Generator(device="cuda").manual_seed(3)
    e, n, k, pad = 4, 256, 512, 128
    rows = [100, 0, 256, 7]
    acts, b, sb = gemm_operands(e, n, k, group, rows, gen)
    padded = [-(-m // pad) * pad for m in rows]
    m_total = sum(padded)
    a = torch.zeros(m_total, k, device="cuda").to(torch.float8_e4m3fn)
    sa = torch.zeros(k // group, m_total, device="cuda")
    start = 0
    for (q, s), m, p in zip(acts, rows, padded):
        a[start : start + m] = q
        sa[:, start : start + m] = s.t()
        start += p
    expert_rows = torch.tensor(padded, dtype=torch.int32, device="cuda")
    out = torch.full((m_total, n), float("nan"), dtype=out_dtype, device="cuda")
    megamoe.grouped_gemm_fp8_contiguous(a, sa, b, sb, expert_rows, out, pad=pad, accumulation=accumulation)
    start = 0
    for ex, ((q, s), m, p) in enumerate(zip(acts, rows, padded)):
        want = ref.block_gemm(q, s, b[ex], sb[ex], group)
        d = ref.diff(out[start : start + m].float(), want)
        assert d <= MAX_DIFF, (ex, d)
        assert torch.all(out[start + m : start + p] == 0), "padding rows are written as 0"
        start += p
    print(f"contiguous G={group} {out_dtype} {accumulation}: diff {d:.2e} (last expert)")


@needs_gpu
@pytest.mark.parametrize("accumulation", ["per-block", "rescaled"])
@pytest.mark.parametrize("group", [128, 64])
def test_grouped_gemm_masked_matches_torch(group, accumulation):
    gen = torch.Generator(device="cuda").manual_seed(4)
    e, n, k, max_m = 3, 384, 256, 64
    rows = [64, 5, 0]
    acts, b, sb = gemm_operands(e, n, k, group, rows, gen)
    a = torch.zeros(e, max_m, k, device="cuda").to(torch.float8_e4m3fn)
    sa = torch.zeros(e, k // group, max_m, device="cuda")
    for ex, ((q, s), m) in enumerate(zip(acts, rows)):
        a[ex, :m] = q
        sa[ex, :, :m] = s.t()
    expert_rows = torch.tensor(rows, dtype=torch.int32, device="cuda")
    out = torch.full((e, max_m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    megamoe.grouped_gemm_fp8_masked(a, sa, b, sb, expert_rows, out, accumulation=accumulation)
    for ex, ((q, s), m) in enumerate(zip(acts, rows)):
        d = ref.diff(out[ex, :m].float(), ref.block_gemm(q, s, b[ex], sb[ex], group))
        assert d <= MAX_DIFF, (ex, d)
        assert torch.all(out[ex, m:].isnan()), "rows past the count are not written"
    print(f"masked G={group} {accumulation}: diff {d:.2e} (last expert with rows)")


@needs_gpu
def test_grouped_gemm_bad_arguments_name_them():
    e, n, k = 2, 256, 256
    a = torch.zeros(256, k, device="cuda").to(torch.float8_e4m3fn)
    sa = torch.zeros(k // 128, 256, device="cuda")
    b = torch.zeros(e, n, k, device="cuda").to(torch.float8_e4m3fn)
    sb = torch.ones(e, n // 128, k // 128, device="cuda")
    rows = torch.tensor([128, 128], dtype=torch.int32, device="cuda")
    out = torch.empty(256, n, dtype=torch.bfloat16, device="cuda")
    gemm = megamoe.grouped_gemm_fp8_contiguous
    gemm(a, sa, b, sb, rows, out)
    for args, arg in [
        ((a, sa, b, sb, torch.tensor([128, 64], dtype=torch.int32, device="cuda"), out), "expert_rows"),
        ((a, sa, b, sb, torch.tensor([256, 128], dtype=torch.int32, device="cuda"), out), "expert_rows"),
        ((a, sa, b, sb, rows.long(), out), "expert_rows"),
        ((a, sa[:1, :100], b, sb, rows, out), "a_scales"),
        ((a, sa, b, sb, rows, out.half()), "out"),
        ((a, sa, b.cpu(), sb, rows, out), "b"),
        ((a, sa, b[:, :200].contiguous(), sb[:, :1].contiguous(), rows, out[:, :200].contiguous()), "b"),  # N = 200
    ]:
        with pytest.raises(ValueError, match=rf"^{arg}\b"):
            gemm(*args)
    with pytest.raises(ValueError, match=r'^accumulation: "fast" must be'):
        gemm(a, sa, b, sb, rows, out, accumulation="fast")


def test_bad_layer_arguments_are_named_without_a_gpu():
    with pytest.raises(ValueError, match="hidden"):
        megamoe.MoELayer(1, **dict(TINY, hidden=100), num_max_tokens_per_rank=8)
    with pytest.raises(ValueError, match="kind"):
        megamoe.get_symm_buffer_for_mega_moe(2, 16, 8, 4, 256, 128, kind="both")


@pytest.mark.skipif(megamoe.gpu_available(), reason="a GPU is visible")
def test_without_a_gpu_the_layer_says_what_is_missing():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        megamoe.MoELayer(1, **TINY, num_max_tokens_per_rank=8)
