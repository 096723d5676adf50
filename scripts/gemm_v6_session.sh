#!/bin/bash
# GEMM v6 (promotion overlapping the next scale group's wgmmas) against v3, one run of at most
# 150 s: the GEMM selftest (every configuration, v6's included, against the CPU reference,
# compiled into a fresh JIT cache), flash L1 and L2 at 192/512/1024 rows per expert with the v3
# and v6 arms interleaved on the same operands (v6 runs 128 x 128 tiles where v3 runs 128 x 256),
# then, while time is left, L1 at 512 rows with both on 128 x 128 tiles (the overlap alone), and
# the short table last. Each step's timeout is cut to the time left, so the table always comes.
# usage: scripts/gemm_v6_session.sh MEGAMOE_BINARY OUT_DIR
set -u
bin=$(realpath "$1")
out=$2
mkdir -p "$out"
export MEGAMOE_JIT_CACHE_DIR
MEGAMOE_JIT_CACHE_DIR=$(mktemp -d)
rm -f "$out/results.jsonl" "$out/bench.txt"
start=$SECONDS
# Seconds for the next step: at most $1, and none past 145 s (5 s kept for the table).
budget() {
  local left=$((145 - (SECONDS - start)))
  if [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}

timeout 75 "$bin" selftest --only gemm > "$out/selftest.txt" 2>&1
echo "selftest (gemm, fresh JIT cache, exit $?, $((SECONDS - start)) s): $(grep -c '^PASS' "$out/selftest.txt") passed," \
  "$(grep -c '^FAIL' "$out/selftest.txt") failed"
grep -E '^FAIL|error' "$out/selftest.txt"

bench() {
  local t
  t=$(budget "$1")
  shift
  if [ "$t" -le 5 ]; then
    echo "skipped (no time left): bench gemm $*"
    return
  fi
  timeout "$t" "$bin" bench gemm "$@" --json-out "$out/results.jsonl" 2>&1 \
    | grep -E '^\| L|rror' | tee -a "$out/bench.txt"
  echo "bench gemm $* (timeout $t s): exit ${PIPESTATUS[0]}, at $((SECONDS - start)) s"
}
bench 40 --shape l1 --rows-per-expert 192,512,1024 --pad 128 --pipelined false,true
bench 40 --shape l2 --rows-per-expert 192,512,1024 --pad 128 --pipelined false,true
bench 25 --shape l1 --rows-per-expert 512 --pad 128 --block-n 128 --pipelined false,true

python3 - "$out" <<'PY'
import sys, json
out = sys.argv[1]
try:
    rows = [json.loads(l) for l in open(f"{out}/results.jsonl")]
except FileNotFoundError:
    rows = []
def arm(r):
    tile = "128x128" if "_m128_n128_" in r["kernel"] else "128x256" if "_m128_n256_" in r["kernel"] else "64x256"
    return ("v6 " if r.get("pipelined") else "v3 ") + tile
# Each v6 row against the v3 row of the same case and run (the one just before it).
print("\n| shape | rows | arm | µs | TFLOP/s | vs v3 of the same run | DeepGEMM µs |")
print("|---|---|---|---|---|---|---|")
last_v3 = None
for r in rows:
    rel = ""
    if r.get("pipelined") and last_v3 and last_v3["rows_per_expert"] == r["rows_per_expert"]:
        rel = f"{100 * (r['us'] / last_v3['us'] - 1):+.1f} % vs {arm(last_v3)}"
    if not r.get("pipelined"):
        last_v3 = r
    print(f"| {r['shape']} | {r['rows_per_expert']} | {arm(r)} | {r['us']:.1f} | {r['tflops']:.0f} | {rel} | {r['deepgemm_us']} |")
print(f"\nsession: {len(rows)} timed rows")
PY
echo "total $((SECONDS - start)) s"
