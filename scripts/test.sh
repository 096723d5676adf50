#!/usr/bin/env bash
# The test command: installs what the kernel-compile test needs (NVRTC and CUDA headers from
# pinned PyPI wheels into .toolchain/, skipped when already there), then format, lints and tests.
# Needs no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-cuda-toolchain.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
