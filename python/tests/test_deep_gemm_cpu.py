"""megamoe.deep_gemm without a GPU: its entry points have DeepGEMM's signatures (a list recorded
from DeepGEMM's ``deep_gemm/mega/__init__.py`` and ``csrc/apis/mega.hpp`` on its SM90 line, with
the fused kernel's keywords; megamoe adds keyword-only ones after them), bad arguments are
ValueErrors naming them before anything is
allocated, and the native API's renamed scale-granularity keyword (``group`` ->
``scale_granularity``) still takes the old name with a DeprecationWarning."""

import importlib.util
import inspect

import pytest

import megamoe
import megamoe.deep_gemm as deep_gemm

E = inspect.Parameter.empty
HAS_TORCH = importlib.util.find_spec("torch") is not None

# DeepGEMM's mega-MoE Python API: name -> [(parameter, default)], E for none.
DEEPGEMM = {
    "get_symm_buffer_for_mega_moe": [
        ("group", E),
        ("num_experts", E),
        ("num_max_tokens_per_rank", E),
        ("num_topk", E),
        ("hidden", E),
        ("intermediate_hidden", E),
        ("use_fp8_dispatch", True),
        ("activation", "swiglu"),
        ("fused", False),
        ("num_experts_per_wave", None),
        ("l2_act_sf_gran_k", None),
    ],
    "transform_weights_for_mega_moe": [("l1_weights", E), ("l2_weights", E)],
    "transform_weights_for_mega_moe_sm90": [("l1_weights", E), ("l2_weights", E)],
    "fp8_mega_moe": [
        ("y", E),
        ("l1_weights", E),
        ("l2_weights", E),
        ("sym_buffer", E),
        ("cumulative_local_expert_recv_stats", None),
        ("recipe", (128, 128, 128)),
        ("activation", "swiglu"),
        ("activation_clamp", None),
        ("fast_math", True),
        ("num_tokens_bound", None),
    ],
}
# megamoe's keyword-only additions, name -> [(parameter, default)]: DeepGEMM's calls (positional or
# by keyword) never reach them.
MEGAMOE_KEYWORDS = {"get_symm_buffer_for_mega_moe": [("accumulation", "per-block")]}
# Its buffer class's constructor (megamoe's takes the fused buffer's keywords after these).
SYMM_BUFFER = [
    ("group", E),
    ("num_experts", E),
    ("num_max_tokens_per_rank", E),
    ("num_topk", E),
    ("hidden", E),
    ("intermediate_hidden", E),
    ("use_fp8_dispatch", True),
    ("activation", "swiglu"),
]
# Its native size and alignment queries take their arguments by position, in this order.
NATIVE = {
    "get_token_alignment_for_mega_moe": [],
    "get_symm_buffer_size_for_mega_moe": [
        "num_ranks",
        "num_experts",
        "num_max_tokens_per_rank",
        "num_topk",
        "hidden",
        "intermediate_hidden",
        "use_fp8_dispatch",
        "activation",
    ],
}


def params(fn, skip_self=False, keyword_only=False):
    ps = list(inspect.signature(fn).parameters.values())
    return [(p.name, p.default) for p in ps[1 if skip_self else 0 :] if (p.kind == p.KEYWORD_ONLY) == keyword_only]


@pytest.mark.parametrize("name", sorted(DEEPGEMM))
def test_the_entry_points_have_deepgemms_signatures(name):
    fn = getattr(deep_gemm, name)
    assert params(fn) == DEEPGEMM[name]
    assert params(fn, keyword_only=True) == MEGAMOE_KEYWORDS.get(name, [])


def test_the_buffer_takes_deepgemms_arguments_first():
    got = params(deep_gemm.SymmBuffer.__init__, skip_self=True)
    assert got[: len(SYMM_BUFFER)] == SYMM_BUFFER
    assert [n for n, _ in got[len(SYMM_BUFFER) :]] == ["fused", "num_experts_per_wave", "l2_act_sf_gran_k"]
    assert params(deep_gemm.SymmBuffer.__init__, keyword_only=True) == [("accumulation", "per-block")]


@pytest.mark.parametrize("name", sorted(NATIVE))
def test_the_queries_take_deepgemms_arguments_in_order(name):
    assert [n for n, _ in params(getattr(deep_gemm, name))] == NATIVE[name]


def test_the_queries_answer_without_a_gpu():
    assert deep_gemm.get_token_alignment_for_mega_moe() == 128
    total, slicer = deep_gemm.get_symm_buffer_size_for_mega_moe(8, 256, 8192, 6, 4096, 2048)
    sizes = megamoe.get_symm_buffer_size(8, 256, 8192, 6, 4096, 2048)
    staging = 8192 * (4096 + 4096 // 128 * 4 + 6 * 12)
    assert total == staging + sizes["symmetric_bytes"] + sizes["local_bytes"] + sizes["weight_bytes"]
    assert callable(slicer)


# (keyword arguments of get_symm_buffer_for_mega_moe over a valid tiny world of one, the argument
# the error must name)
BAD_BUFFERS = [
    (dict(use_fp8_dispatch=False), "use_fp8_dispatch"),
    (dict(activation="gelu"), "activation"),
    (dict(num_experts_per_wave=0), "num_experts_per_wave"),
    (dict(num_experts_per_wave=-2), "num_experts_per_wave"),
    (dict(l2_act_sf_gran_k=96), "l2_act_sf_gran_k"),
    (dict(hidden=100), "hidden"),
    (dict(num_topk=17), "num_topk"),
    (dict(num_max_tokens_per_rank=-1), "num_max_tokens_per_rank"),
    (dict(accumulation="Rescaled"), '^accumulation: "Rescaled" must be'),
]


@pytest.mark.parametrize("bad, name", BAD_BUFFERS)
def test_bad_buffer_arguments_are_value_errors_naming_them(bad, name):
    args = dict(
        group=None,
        num_experts=16,
        num_max_tokens_per_rank=64,
        num_topk=4,
        hidden=256,
        intermediate_hidden=128,
        fused=True,
    )
    args.update(bad)
    with pytest.raises(ValueError, match=name):
        deep_gemm.get_symm_buffer_for_mega_moe(**args)


@pytest.mark.parametrize(
    "bad, name",
    [
        (dict(recipe=(1, 1, 32)), "recipe"),
        (dict(activation="relu"), "activation"),
        (dict(activation_clamp=-1.0), "activation_clamp"),
        (dict(activation_clamp=float("nan")), "activation_clamp"),
        (dict(), "sym_buffer"),
    ],
)
def test_bad_call_arguments_are_value_errors_naming_them(bad, name):
    # Checked before the buffer is touched: a wrong buffer comes last.
    with pytest.raises(ValueError, match=name):
        deep_gemm.fp8_mega_moe(None, None, None, "not a buffer", **bad)


def test_the_old_scale_granularity_keyword_warns_and_still_works():
    flash = dict(
        num_ranks=8,
        num_experts=256,
        num_max_tokens_per_rank=8192,
        num_topk=6,
        hidden=4096,
        intermediate_hidden=2048,
        kind="split",
    )
    new = megamoe.get_symm_buffer_size(**flash, scale_granularity=64)
    with pytest.warns(DeprecationWarning, match="scale_granularity"):
        old = megamoe.get_symm_buffer_size(**flash, group=64)
    assert old == new != megamoe.get_symm_buffer_size(**flash, scale_granularity=128)
    with pytest.raises(ValueError, match="group: 64 contradicts scale_granularity 128"):
        with pytest.warns(DeprecationWarning):
            megamoe.get_symm_buffer_size(**flash, scale_granularity=128, group=64)


@pytest.mark.parametrize("build", ["MoELayer", "get_symm_buffer_for_mega_moe"])
def test_the_layer_takes_the_old_keyword_with_a_warning(build):
    # hidden 100 fails the shape rules before any GPU is needed: the keyword was taken.
    args = (1, 16, 64, 4, 100, 128)
    with pytest.warns(DeprecationWarning, match="scale_granularity"):
        with pytest.raises(ValueError, match="hidden"):
            getattr(megamoe, build)(*args, group=128)
    with pytest.raises(ValueError, match="group: 64 contradicts scale_granularity 128"):
        with pytest.warns(DeprecationWarning):
            getattr(megamoe, build)(*args, scale_granularity=128, group=64)
    # A bad granularity is named by its new name.
    with pytest.raises(ValueError, match="scale_granularity"):
        getattr(megamoe, build)(1, 16, 64, 4, 256, 128, scale_granularity=96)


@pytest.mark.parametrize("build", ["MoELayer", "get_symm_buffer_for_mega_moe"])
def test_a_bad_accumulation_is_a_value_error_naming_it(build):
    with pytest.raises(ValueError, match='^accumulation: "fast" must be "per-block" or "rescaled"'):
        getattr(megamoe, build)(1, 16, 64, 4, 256, 128, accumulation="fast")


@pytest.mark.skipif(not HAS_TORCH, reason="the transforms take torch tensors")
def test_the_transform_keeps_the_layout_and_checks_the_shapes():
    import torch

    e, h, i = 2, 256, 128
    w1 = torch.zeros(e, 2 * i, h, dtype=torch.float8_e4m3fn)
    s1 = torch.ones(e, 2 * i // 128, h // 128)
    w2 = torch.zeros(e, h, i, dtype=torch.float8_e4m3fn)
    s2 = torch.ones(e, h // 128, i // 128)
    (a, b), (c, d) = deep_gemm.transform_weights_for_mega_moe_sm90((w1, s1), (w2, s2))
    assert a is w1 and b is s1 and c is w2 and d is s2
    with pytest.raises(ValueError, match="l2_weights"):
        deep_gemm.transform_weights_for_mega_moe((w1, s1), (w2[:, :, :64], s2))
    with pytest.raises(ValueError, match="l1_weights"):
        deep_gemm.transform_weights_for_mega_moe((w1, s1[:, :1]), (w2, s2))
    with pytest.raises(ValueError, match="l1_weights"):
        deep_gemm.transform_weights_for_mega_moe((w1.float(), s1), (w2, s2))
