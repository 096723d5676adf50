#!/bin/bash
# compute-sanitizer over selftest checks at small shapes: by default the layer's tiny R=2 masked
# checks (split: quantizer, dispatch, L1 with the SwiGLU epilogue, L2, combine; fused: the one
# persistent kernel), dispatch/combine alone (two ranks, bad input and captured replays) and the
# grouped GEMM alone (contiguous with plain and TMA stores, masked). The four tools (memcheck,
# racecheck, synccheck, initcheck) run at once, one process each (the instrumentation is CPU
# bound): one log per tool in OUT_DIR, then a line per tool with its summary.
# usage: scripts/sanitizer_session.sh MEGAMOE_BINARY OUT_DIR [CHECKS (comma-separated)]
set -u
bin=$(realpath "$1")
out=$2
checks=${3:-tiny R=2 T=64 masked,ep.rejects_bad_input,ep.graph_capture,gemm grouped_gemm_fp8_m128_n256_s4_g128_contiguous_bf16,gemm grouped_gemm_fp8_m128_n256_s4_g128_masked_bf16}
mkdir -p "$out"
export MEGAMOE_JIT_CACHE_DIR=${MEGAMOE_JIT_CACHE_DIR:-$(mktemp -d)}
san=${SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
limit=${SANITIZER_TIMEOUT:-170}
# Compile every kernel once outside the sanitizer (the JIT cache then serves the runs below).
timeout 120 "$bin" selftest --only "$checks" > "$out/plain.txt" 2>&1
echo "without sanitizer: rc=$? $(grep -c '^PASS' "$out/plain.txt") passed"
t0=$(date +%s)
for tool in memcheck racecheck synccheck initcheck; do
  (
    timeout "$limit" "$san" --tool "$tool" --error-exitcode 9 "$bin" selftest --only "$checks" > "$out/$tool.txt" 2>&1
    echo "rc=$?" >> "$out/$tool.txt"
  ) &
done
wait
for tool in memcheck racecheck synccheck initcheck; do
  echo "$tool: $(tail -n 1 "$out/$tool.txt") ($(( $(date +%s) - t0 )) s for all four), $(grep -c '^PASS' "$out/$tool.txt") passed, $(grep -c '^FAIL' "$out/$tool.txt") failed; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool.txt" | tail -n 1)"
done
