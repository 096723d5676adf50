#!/usr/bin/env bash
# The test command: installs what the kernel-compile test needs (NVRTC and CUDA headers from
# pinned PyPI wheels into .toolchain/, skipped when already there), then format, lints, the docs
# (no broken links; about 10 s) and tests.
# Needs no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-cuda-toolchain.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
cargo test --workspace --locked
