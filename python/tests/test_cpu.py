"""What the package does without a GPU: import, presets, the size query, argument checks, the
CPU reference, and the GPU probe's answer when no GPU can be used."""

import json
import pathlib
import subprocess

import pytest

import megamoe

ROOT = pathlib.Path(__file__).resolve().parents[2]

# flash: H 4096, I 2048, 256 experts, top-6.
FLASH = dict(num_experts=256, num_topk=6, hidden=4096, intermediate_hidden=2048)
# `megamoe plan --preset flash --ranks 8 --tokens 8192 --json`: fused_bytes (633 MiB).
FLASH_R8_T8192_FUSED = 663918592


def flash(**kw):
    args = dict(FLASH, num_ranks=8, num_max_tokens_per_rank=8192)
    args.update(kw)
    return args


def test_import_needs_no_gpu():
    assert isinstance(megamoe.gpu_available(), bool)
    assert isinstance(megamoe.__version__, str)
    text = megamoe.info()
    assert "gpus" in text and "driver" in text


def test_presets():
    p = megamoe.presets()
    assert list(p) == ["flash", "pro", "dsv3", "glm", "tiny"]
    assert p["flash"] == (4096, 2048, 256, 6)
    assert p["tiny"] == (256, 128, 16, 4)


def test_size_query_matches_the_plan():
    fused = megamoe.get_symm_buffer_size(**flash())
    assert set(fused) == {"symmetric_bytes", "local_bytes", "weight_bytes"}
    assert fused["symmetric_bytes"] == FLASH_R8_T8192_FUSED
    # 32 local experts of 3 * 4096 * 2048 e4m3 bytes, one f32 per 128 x 128 block.
    assert fused["weight_bytes"] == 32 * 3 * 4096 * 2048 + 32 * 3 * 256 * 2 * 4
    split = megamoe.get_symm_buffer_size(**flash(kind="split"))
    assert split["weight_bytes"] == fused["weight_bytes"]
    assert fused["symmetric_bytes"] < split["symmetric_bytes"] / 4


def command_line():
    """The megamoe binary `cargo test` builds, or a skip where there is none."""
    for p in (ROOT / "target/debug/megamoe", ROOT / "target/release/megamoe"):
        if p.exists():
            return p
    pytest.skip("no megamoe binary under target/")


def test_size_query_matches_the_command_line():
    exe = command_line()
    for preset, ranks, tokens in [("flash", 8, 8192), ("pro", 8, 4096), ("tiny", 2, 64)]:
        out = subprocess.run(
            [exe, "plan", "--preset", preset, "--ranks", str(ranks), "--tokens", str(tokens), "--json"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        plan = json.loads(out)
        h, i, e, k = megamoe.presets()[preset]
        got = megamoe.get_symm_buffer_size(ranks, e, tokens, k, h, i)
        assert got["symmetric_bytes"] == plan["fused_bytes"], preset


def test_reference_matches_the_command_line():
    ref = megamoe.reference_forward("tiny", 2, 64, seed=3)
    assert ref["hidden"] == 256
    assert [len(b) for b in ref["outputs"]] == [64 * 256 * 2] * 2  # bf16 [T, H] per rank
    assert any(ref["outputs"][0])
    # The same global batch on one rank gives the same bits.
    one = megamoe.reference_forward("tiny", 1, 128, seed=3)
    assert one["outputs"][0] == b"".join(ref["outputs"])
    assert one["hash"] == ref["hash"]
    out = subprocess.run(
        [
            command_line(),
            "run",
            "--preset",
            "tiny",
            "--ranks",
            "2",
            "--tokens",
            "64",
            "--seed",
            "3",
            "--backend",
            "cpu",
            "--json",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert json.loads(out)["output_hash"] == ref["hash"]


@pytest.mark.parametrize(
    "args, arg",
    [
        (("huge", 2, 64), "preset"),
        (("tiny", 3, 64), "num_ranks"),
        (("tiny", 2, -1), "num_tokens"),
        (("tiny", 2, 65537), "num_tokens"),  # the CPU reference's limit, 0..=65536
        (("tiny", 2, 64, 0, "skewed"), "routing"),
    ],
)
def test_reference_bad_arguments(args, arg):
    with pytest.raises(ValueError, match=f"^{arg}: "):
        megamoe.reference_forward(*args)


def test_group_and_clamp_are_taken():
    base = megamoe.get_symm_buffer_size(**flash(kind="split", scale_granularity=128))
    g64 = megamoe.get_symm_buffer_size(**flash(kind="split", scale_granularity=64))
    # Twice the intermediate's scales at G = 64.
    assert g64["local_bytes"] > base["local_bytes"]
    assert megamoe.get_symm_buffer_size(**flash(clamp=10.0)) == megamoe.get_symm_buffer_size(**flash())


def test_the_accumulation_does_not_change_the_sizes():
    for kind in ["fused", "split"]:
        base = megamoe.get_symm_buffer_size(**flash(kind=kind))
        for accumulation in ["per-block", "rescaled"]:
            assert megamoe.get_symm_buffer_size(**flash(kind=kind), accumulation=accumulation) == base


@pytest.mark.parametrize(
    "kw, arg",
    [
        (dict(hidden=4000), "hidden"),
        (dict(intermediate_hidden=100), "intermediate_hidden"),
        (dict(num_ranks=3), "num_ranks"),  # 256 experts over 3 ranks
        (dict(num_ranks=0), "num_ranks"),
        (dict(num_ranks=-8), "num_ranks"),
        (dict(num_topk=0), "num_topk"),
        (dict(num_experts=0), "num_experts"),
        (dict(num_max_tokens_per_rank=0), "num_max_tokens_per_rank"),
        (dict(num_max_tokens_per_rank=2**33), "num_max_tokens_per_rank"),  # past u32
        (dict(scale_granularity=96), "scale_granularity"),
        (dict(scale_granularity=32), "scale_granularity"),
        (dict(clamp=-1.0), "clamp"),
        (dict(clamp=float("nan")), "clamp"),
        (dict(kind="both"), "kind"),
        (dict(accumulation="fast"), "accumulation"),
        (dict(accumulation="per_block"), "accumulation"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(kw, arg):
    # The message starts with the argument, as Python spells it.
    with pytest.raises(ValueError, match=f"^{arg}: ") as e:
        megamoe.get_symm_buffer_size(**flash(**kw))
    assert "kernel" not in str(e.value)


@pytest.mark.skipif(megamoe.gpu_available(), reason="a GPU is visible")
def test_without_a_gpu_the_probe_says_so():
    assert "gpus     none" in megamoe.info()
    assert megamoe.gpu_available() is False
