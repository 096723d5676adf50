#!/usr/bin/env bash
# The test command: installs what the kernel-compile test and the format check need (NVRTC, CUDA
# headers and the formatters from pinned PyPI wheels into .toolchain/, skipped when already there),
# then the format of the Rust, device and Python sources and ruff's lints (scripts/format.sh
# applies the formatters), clippy, the docs (no broken links; about 10 s) and tests, then the
# Python package's tests.
# Needs no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-cuda-toolchain.sh
scripts/format.sh --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The GPU crates as a library uses them: without the `harness` feature the command line turns on.
cargo clippy -p megamoe-cuda -p megamoe-gemm -p megamoe-ep -p megamoe-layer --all-targets --locked -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
cargo test --workspace --locked

# The Python package (python/): a venv under target/, the wheel built with the dev profile so
# that it reuses the crates `cargo test` just built (only pyo3 and the module itself compile),
# then pytest. Its size-query test compares against target/debug/megamoe, built above.
venv=target/pyenv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check maturin==1.16.0 pytest==8.4.2
rm -rf target/pywheel
(cd python && "../$venv/bin/maturin" build --locked --profile dev --out ../target/pywheel)
"$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps target/pywheel/megamoe-*.whl
# From the root, so that python/megamoe (without the native module) does not shadow the
# installed package.
"$venv/bin/pytest" -q -p no:cacheprovider python/tests
