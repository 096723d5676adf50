"""megamoe.compat without a GPU and without torch: the HybridEP-compatible buffer takes every
keyword Megatron-Core 0.19.2 passes it (the fused flags as real parameters, which Megatron checks
with inspect.signature), its constructor's checks, and the switch that makes ``import deep_ep``
find it (and refuses to shadow a real DeepEP)."""

import ast
import importlib.util
import inspect
import os
import pathlib
import subprocess
import sys

import pytest

from megamoe.compat import deep_ep_switch as switch
from megamoe.compat.hybrid_ep import HybridEPBuffer

# The keywords megatron/core/transformer/moe/fused_a2a.py of megatron-core 0.19.2 passes
# (init_hybrid_ep_buffer, HybridEPDispatch, HybridEPCombine); the fused flags only when set.
MEGATRON_0_19_2_CALLS = {
    "HybridEPBuffer": {
        "group",
        "hidden_dim",
        "max_num_of_tokens_per_rank",
        "num_local_experts",
        "use_fp8",
        "num_sms_dispatch_api",
        "num_sms_combine_api",
        "num_blocks_permute",
        "num_blocks_unpermute",
        "num_sms_preprocessing_api",
    },
    "dispatch_with_permute": {
        "hidden",
        "routing_map",
        "probs",
        "scaling_factor",
        "num_of_experts_per_rank",
        "pad_multiple",
        "num_permuted_tokens",
        "non_blocking",
        "fuse_permute_dispatch",
        "handle",
    },
    "combine_with_unpermute": {"hidden", "probs", "handle", "pad_multiple", "fuse_unpermute_combine"},
}


def parameters(name):
    target = HybridEPBuffer if name == "HybridEPBuffer" else getattr(HybridEPBuffer, name)
    return inspect.signature(target).parameters


@pytest.mark.parametrize("name", sorted(MEGATRON_0_19_2_CALLS))
def test_every_keyword_megatron_passes_is_a_parameter(name):
    params = parameters(name)
    missing = MEGATRON_0_19_2_CALLS[name] - set(params)
    assert not missing, f"{name} lacks {sorted(missing)}"
    assert not any(p.kind == p.VAR_KEYWORD for p in params.values()), "no **kwargs that would hide a typo"


def test_the_fused_flags_are_real_keyword_only_parameters():
    # Megatron falls back to unfused calls unless inspect.signature shows the flag.
    for name, flag in (
        ("dispatch_with_permute", "fuse_permute_dispatch"),
        ("combine_with_unpermute", "fuse_unpermute_combine"),
    ):
        params = parameters(name)
        assert params[flag].kind == inspect.Parameter.KEYWORD_ONLY
        assert all(p.kind == p.KEYWORD_ONLY for n, p in params.items() if n != "self"), name


def megatron_call_keywords(source):
    """The keywords of every call of HybridEPBuffer(...), .dispatch_with_permute(...) and
    .combine_with_unpermute(...) in ``source``: plain keywords, the constant keys of ``**{...}``
    expansions, and the constant keys assigned to a dict that is expanded with ``**name``."""
    tree = ast.parse(source)
    assigned = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and isinstance(t.slice, ast.Constant):
                    assigned.setdefault(t.value.id, set()).add(t.slice.value)
    calls = {name: set() for name in MEGATRON_0_19_2_CALLS}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        if name not in calls:
            continue
        for kw in node.keywords:
            if kw.arg is not None:
                calls[name].add(kw.arg)
            elif isinstance(kw.value, ast.Name):
                calls[name] |= assigned.get(kw.value.id, set())
            else:
                for d in ast.walk(kw.value):
                    if isinstance(d, ast.Dict):
                        calls[name] |= {k.value for k in d.keys if isinstance(k, ast.Constant)}
    return calls


def test_the_call_site_parser_reads_the_forms_megatron_uses():
    source = """
kwargs = {}
kwargs['num_sms_dispatch_api'] = 3
b = HybridEPBuffer(group=g, hidden_dim=h, **kwargs)
b.dispatch_with_permute(hidden=x, **({"fuse_permute_dispatch": f} if f else {}))
b.combine_with_unpermute(hidden=x, handle=h)
"""
    assert megatron_call_keywords(source) == {
        "HybridEPBuffer": {"group", "hidden_dim", "num_sms_dispatch_api"},
        "dispatch_with_permute": {"hidden", "fuse_permute_dispatch"},
        "combine_with_unpermute": {"hidden", "handle"},
    }


def installed_fused_a2a():
    spec = importlib.util.find_spec("megatron")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / "core/transformer/moe/fused_a2a.py"
    return path if path.is_file() else None


@pytest.mark.skipif(installed_fused_a2a() is None, reason="megatron-core is not installed here")
def test_the_recorded_keywords_are_those_of_the_installed_megatron():
    import importlib.metadata

    found = megatron_call_keywords(installed_fused_a2a().read_text())
    version = importlib.metadata.version("megatron-core")
    if version == "0.19.2":
        assert found == MEGATRON_0_19_2_CALLS
    for name, keywords in found.items():
        assert keywords <= set(parameters(name)), (
            f"megatron-core {version}: {name} passes {sorted(keywords - set(parameters(name)))}"
        )


class OneRankGroup:
    """What the constructor reads of a torch.distributed group."""

    def size(self):
        return 1


GOOD = dict(group=OneRankGroup(), hidden_dim=1024, max_num_of_tokens_per_rank=256, num_local_experts=8)


def test_a_good_constructor_touches_no_gpu_and_sizes_k_from_the_experts(monkeypatch):
    monkeypatch.delenv("MEGAMOE_HYBRID_EP_NUM_TOPK", raising=False)
    b = HybridEPBuffer(**GOOD, num_sms_dispatch_api=20, num_sms_combine_api=24, num_blocks_permute=4)
    assert (b.num_experts, b.num_topk, b.num_sms) == (8, 8, 24)
    assert HybridEPBuffer(**dict(GOOD, num_local_experts=4)).num_topk == 4
    monkeypatch.setenv("MEGAMOE_HYBRID_EP_NUM_TOPK", "2")
    assert HybridEPBuffer(**GOOD).num_topk == 2


@pytest.mark.parametrize(
    "bad, name",
    [
        (dict(use_fp8=True), "use_fp8"),
        (dict(group=None), "group"),
        (dict(hidden_dim=100), "hidden_dim"),
        (dict(hidden_dim=0), "hidden_dim"),
        (dict(max_num_of_tokens_per_rank=-1), "max_num_of_tokens_per_rank"),
        (dict(num_local_experts=0), "num_local_experts"),
        (dict(num_topk=9), "num_topk"),
        (dict(num_topk=16, num_local_experts=32), "num_topk"),
        (dict(num_sms_dispatch_api=0), "num_sms_dispatch_api"),
    ],
)
def test_bad_constructor_arguments_are_value_errors_naming_them(bad, name):
    with pytest.raises(ValueError, match=f"^{name}: "):
        HybridEPBuffer(**dict(GOOD, **bad))


def test_a_bad_topk_environment_variable_is_a_value_error(monkeypatch):
    monkeypatch.setenv("MEGAMOE_HYBRID_EP_NUM_TOPK", "two")
    with pytest.raises(ValueError, match="^num_topk: MEGAMOE_HYBRID_EP_NUM_TOPK"):
        HybridEPBuffer(**GOOD)


# -- the switch ----------------------------------------------------------------------------


def fake_deep_ep(root):
    pkg = root / "deep_ep"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("REAL = True\n")
    return pkg


def test_install_writes_a_deep_ep_that_megatron_imports_as_megamoe(tmp_path):
    target = tmp_path / "site"
    path = switch.install(str(target), search_path=[str(tmp_path / "empty")])
    assert path == target / "deep_ep" and switch.is_megamoe(path)
    assert switch.status([str(target)]).startswith("deep_ep: megamoe's")
    # Megatron's two imports, in a fresh interpreter that finds the package first.
    probe = (
        "from deep_ep import HybridEPBuffer\n"
        "print(HybridEPBuffer.__module__)\n"
        "try:\n    from deep_ep import Buffer\nexcept ImportError:\n    print('no Buffer')\n"
    )
    search = os.pathsep.join([str(target)] + [p for p in sys.path if p])  # megamoe as found here
    out = subprocess.run(
        [sys.executable, "-c", probe], env=dict(os.environ, PYTHONPATH=search), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["megamoe.compat.hybrid_ep", "no", "Buffer"]
    # Installing again rewrites megamoe's own package.
    assert switch.install(str(target), search_path=[str(target)]) == path
    assert switch.uninstall(str(target)) == path and not path.exists()
    assert switch.uninstall(str(target)) is None


def test_install_refuses_to_shadow_a_deep_ep_found_on_the_path(tmp_path):
    real = fake_deep_ep(tmp_path / "elsewhere")
    with pytest.raises(switch.SwitchError, match=str(real)):
        switch.install(str(tmp_path / "site"), search_path=[str(tmp_path / "elsewhere")])
    assert not (tmp_path / "site").exists(), "nothing written"
    assert switch.status([str(tmp_path / "elsewhere")]).startswith("deep_ep: another package")


def test_install_refuses_a_deep_ep_in_the_target_and_uninstall_leaves_it_alone(tmp_path):
    real = fake_deep_ep(tmp_path / "site")
    with pytest.raises(switch.SwitchError, match="does not shadow"):
        switch.install(str(tmp_path / "site"), search_path=[])
    with pytest.raises(switch.SwitchError, match="not megamoe's"):
        switch.uninstall(str(tmp_path / "site"))
    assert (real / "__init__.py").read_text() == "REAL = True\n"


def test_install_refuses_when_pip_knows_a_deep_ep(tmp_path, monkeypatch):
    real_version = switch.importlib.metadata.version

    def version(name):
        return "1.2.0" if name == "deep_ep" else real_version(name)

    monkeypatch.setattr(switch.importlib.metadata, "version", version)
    with pytest.raises(switch.SwitchError, match="deep_ep 1.2.0"):
        switch.install(str(tmp_path / "site"), search_path=[])
    assert not (tmp_path / "site").exists()


def test_the_command_line_reports_a_refusal_with_status_2(tmp_path, capsys):
    fake_deep_ep(tmp_path / "site")
    assert switch.main(["install-deep-ep", "--target", str(tmp_path / "site")]) == 2
    assert "does not shadow" in capsys.readouterr().err
    assert switch.main(["bogus"]) == 2
    assert switch.main(["uninstall-deep-ep", "--target", str(tmp_path / "none")]) == 0
    assert "no deep_ep package" in capsys.readouterr().out
