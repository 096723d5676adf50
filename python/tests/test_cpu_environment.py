"""What the package says about its environment without a GPU: PyTorch missing is an ImportError
naming it wherever torch is needed, and NVRTC is found in the Python environment's NVIDIA pip
packages (where PyTorch's CUDA 13 builds put it) by a wheel installed anywhere."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def python(code, cwd, env=None):
    """`code` in a fresh interpreter (this one's, so the installed megamoe) run from `cwd`."""
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


# torch made unimportable (as when it is not installed), then each way in that needs it.
WITHOUT_TORCH = """
import sys
sys.modules["torch"] = None
import megamoe
for name, call in [
    ("Buffer", lambda: megamoe.Buffer),
    ("SymmetricMemory", lambda: megamoe.SymmetricMemory),
    ("grouped_gemm_fp8_contiguous",
     lambda: megamoe.grouped_gemm_fp8_contiguous(None, None, None, None, None, None)),
    ("grouped_gemm_fp8_masked",
     lambda: megamoe.grouped_gemm_fp8_masked(None, None, None, None, None, None)),
]:
    try:
        call()
    except ImportError as e:
        print(name, type(e).__name__, e)
    else:
        print(name, "no error")
"""


def test_without_pytorch_every_torch_call_is_an_import_error_naming_it(tmp_path):
    out = python(WITHOUT_TORCH, tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 4, out.stdout
    for line in lines:
        assert " ImportError " in line and "PyTorch is not installed" in line, line


def toolchain_lib():
    """The folder holding NVRTC of the project-local toolchain (scripts/install-cuda-toolchain.sh)."""
    root = pathlib.Path(os.environ.get("MEGAMOE_TOOLCHAIN_DIR") or ROOT / ".toolchain")
    lib = root / "nvidia" / "cu13" / "lib"
    return lib if (lib / "libnvrtc.so.13").is_file() else None


def test_nvrtc_is_found_in_the_python_environments_nvidia_packages(tmp_path):
    lib = toolchain_lib()
    if lib is None:
        pytest.skip("no NVRTC to lay out as a pip package: run scripts/install-cuda-toolchain.sh")
    # A site folder laid out as pip installs nvidia-cuda-nvrtc 13: nvidia/cu13/lib.
    site = tmp_path / "site"
    (site / "nvidia" / "cu13").mkdir(parents=True)
    (site / "nvidia" / "cu13" / "lib").symlink_to(lib)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEGAMOE_") and k != "LD_LIBRARY_PATH"}
    env["PYTHONPATH"] = str(site)
    # From a folder with no .toolchain above it.
    work = tmp_path / "work"
    work.mkdir()
    probe = python(
        "import ctypes\ntry:\n    ctypes.CDLL('libnvrtc.so.13')\n    print('loader')\n"
        "except OSError:\n    print('none')",
        work,
        env,
    )
    out = python("import megamoe; print(megamoe.info())", work, env)
    assert out.returncode == 0, out.stderr
    nvrtc = next(line for line in out.stdout.splitlines() if line.startswith("nvrtc"))
    if probe.stdout.strip() == "loader":
        # The system loader comes first in the order and has one: reported by its file.
        assert "(/" in nvrtc and "/libnvrtc.so" in nvrtc, nvrtc
    else:
        assert f"({site}/nvidia/cu13/lib/libnvrtc.so.13)" in nvrtc, nvrtc

    # Without the package folder, nothing else in reach: the error says where to get NVRTC.
    if probe.stdout.strip() == "none" and not pathlib.Path("/usr/local/cuda/lib64").exists():
        del env["PYTHONPATH"]
        out = python("import megamoe; print(megamoe.info())", work, env)
        nvrtc = next(line for line in out.stdout.splitlines() if line.startswith("nvrtc"))
        assert "missing" in nvrtc and "nvidia-cuda-nvrtc" in nvrtc, nvrtc
