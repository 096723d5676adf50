#!/usr/bin/env bash
# Installs NVRTC, the CUDA runtime headers, CCCL, the CRT headers and cuobjdump (with the nvdisasm it runs) from pinned PyPI wheels
# into the project-local folder .toolchain/ (or $MEGAMOE_TOOLCHAIN_DIR), so that the kernel compile tests
# (which also read each kernel's SASS) run on a machine without a CUDA toolkit, and the pinned formatters scripts/test.sh checks with and
# scripts/format.sh applies (clang-format for the device code, ruff for Python). Idempotent: a second
# run only checks the stamp file and returns.
# megamoe-cuda finds the result by itself (it looks in .toolchain/ after MEGAMOE_NVRTC_LIB and
# MEGAMOE_CUDA_HOME); printing the paths helps other tools.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${MEGAMOE_TOOLCHAIN_DIR:-$root/.toolchain}"
pins=(
  nvidia-cuda-nvrtc==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-cccl==13.0.85
  nvidia-cuda-crt==13.0.88
  nvidia-cuda-cuobjdump==13.2.86
  nvidia-cuda-nvdisasm==13.2.86
  clang-format==23.1.3
  ruff==0.17.5
)
stamp="$dir/.installed"
want="${pins[*]}"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -d "$dir/nvidia/cu13/include" ]] \
  && compgen -G "$dir/nvidia/cu13/lib/libnvrtc.so*" >/dev/null; then
  echo "CUDA toolchain already in $dir"
  exit 0
fi

python="${PYTHON:-python3}"
if ! "$python" -m pip --version >/dev/null 2>&1; then
  echo "error: '$python -m pip' is not available; install pip or set PYTHON" >&2
  exit 1
fi

# Install into a temporary folder beside the target and move it in place, so that an interrupted
# install never leaves a half-filled toolchain behind.
tmp="$(mktemp -d "${dir%/}.tmp.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
"$python" -m pip install --quiet --disable-pip-version-check --no-deps --no-compile \
  --only-binary=:all: --target "$tmp" "${pins[@]}"
echo "$want" >"$tmp/.installed"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "CUDA toolchain installed in $dir"
echo "  NVRTC:   $dir/nvidia/cu13/lib"
echo "  headers: $dir/nvidia/cu13/include"
echo "  cuobjdump: $dir/nvidia/cu13/bin/cuobjdump"
echo "  formatters: $dir/bin/ruff, $dir/clang_format/data/bin/clang-format"
