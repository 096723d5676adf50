#!/bin/bash
# The grouped GEMM's GPU session: selftest (every configuration against the CPU reference), the
# benchmark table (flash L1/L2, 32/192/512/1024 rows per expert, masked at 32), the
# direct-store A/B, and torch._scaled_grouped_mm on the same group sizes, short table last.
# usage: scripts/gemm_gpu_session.sh MEGAMOE_BINARY OUT_DIR
set -u
bin=$(realpath "$1")
out=$2
here=$(dirname "$(realpath "$0")")
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader
rm -f "$out/results.jsonl"
timeout 150 "$bin" selftest > "$out/selftest.txt" 2>&1
echo "selftest: $(grep -c '^PASS' "$out/selftest.txt") passed, $(grep -c '^FAIL' "$out/selftest.txt") failed"
grep -E '^FAIL|error' "$out/selftest.txt"
for shape in l1 l2; do
  timeout 120 "$bin" bench gemm --shape "$shape" --rows-per-expert 32,192,512,1024 \
    --json-out "$out/results.jsonl" 2>&1 | tee -a "$out/bench.txt"
  timeout 60 "$bin" bench gemm --shape "$shape" --layout masked --rows-per-expert 32 \
    --json-out "$out/results.jsonl" 2>&1 | grep -E '^\| L|error' | tee -a "$out/bench.txt"
  timeout 120 "$bin" bench gemm --shape "$shape" --rows-per-expert 32,192,512,1024 \
    --direct-store 2>&1 | grep -E '^\| L|error' | tee -a "$out/bench_direct.txt"
done
timeout 150 python3 "$here/bench_gemm_torch.py" "$out/results.jsonl" 2>&1 | tee "$out/torch.txt"
