#!/bin/bash
# compute-sanitizer over the layer's selftest checks at small shapes (tiny preset: H 256, I 128,
# 16 experts, top-4; two ranks on one GPU, masked routing): every kernel of the split layer
# (quantizer, dispatch, L1 with the SwiGLU epilogue, L2, combine) and the fused kernel runs under
# memcheck, racecheck, synccheck and initcheck. One log per tool in OUT_DIR, the error
# summaries last.
# usage: scripts/sanitizer_session.sh MEGAMOE_BINARY OUT_DIR [CHECKS]
set -u
bin=$(realpath "$1")
out=$2
checks=${3:-tiny R=2 T=64 masked}
mkdir -p "$out"
export MEGAMOE_JIT_CACHE_DIR=$(mktemp -d)
trap 'rm -rf "$MEGAMOE_JIT_CACHE_DIR"' EXIT
san=${SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
# Compile every kernel once outside the sanitizer (the JIT cache then serves the runs below).
timeout 120 "$bin" selftest --only "$checks" > "$out/plain.txt" 2>&1
echo "without sanitizer: rc=$? $(grep -c '^PASS' "$out/plain.txt") passed"
for tool in memcheck racecheck synccheck initcheck; do
  t0=$(date +%s)
  timeout 150 "$san" --tool "$tool" --error-exitcode 9 "$bin" selftest --only "$checks" > "$out/$tool.txt" 2>&1
  rc=$?
  echo "$tool: rc=$rc ($(( $(date +%s) - t0 )) s), $(grep -c '^PASS' "$out/$tool.txt") passed, $(grep -E '^FAIL' -c "$out/$tool.txt") failed; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool.txt" | tail -n 1)"
done
