#!/usr/bin/env bash
# Formats the sources: Rust (cargo fmt), the device code (clang-format with .clang-format) and
# Python (ruff with ruff.toml: import order, then format). With --check it changes nothing and
# fails where a file is not formatted or ruff's lints find something: what scripts/test.sh runs.
# The formatters are the pinned ones scripts/install-cuda-toolchain.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-cuda-toolchain.sh
tools="${MEGAMOE_TOOLCHAIN_DIR:-$PWD/.toolchain}"
ruff="$tools/bin/ruff"
clang_format="$tools/clang_format/data/bin/clang-format"
# Generated headers (megamoe-cuda's `interface`) are written by their generator, which a test
# keeps current; they are not formatted by hand.
mapfile -t device < <(git ls-files -z -- '*.cuh' | xargs -0 grep -L '^// Generated from')

if [[ "${1:-}" == "--check" ]]; then
  cargo fmt --all --check
  "$clang_format" --dry-run -Werror "${device[@]}"
  "$ruff" format --check
  "$ruff" check
else
  cargo fmt --all
  "$clang_format" -i "${device[@]}"
  "$ruff" check --select I --fix  # the import order is formatting; other findings are fixed by hand
  "$ruff" format
fi
