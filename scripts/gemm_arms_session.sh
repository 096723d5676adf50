#!/bin/bash
# The grouped GEMM's GPU session, one run of at most 280 s: the GEMM selftest (every
# configuration against the CPU reference, compiled into a fresh JIT cache); flash L1 and L2 at
# 192/512/1024 rows per expert and 32 rows (contiguous and masked), with the arms of one tuning
# knob interleaved on the same operands when one is given, the large sizes also with an L2
# flush before each launch (DeepGEMM's benchmark protocol); the SM clock and board power
# sampled throughout; torch's _scaled_grouped_mm on the same group sizes (when torch is there);
# one Nsight Compute profile of the last arm at L1 512 rows while time is left; the short table
# last. Each step's timeout is cut to the time left, so the table always comes.
# usage: scripts/gemm_arms_session.sh MEGAMOE_BINARY OUT_DIR [ARM_FLAG VALUES [all|large]]
#   e.g. scripts/gemm_arms_session.sh target/release/megamoe out --queued false,true
#   Without an arm the heuristic's kernel runs alone. `large` leaves out the 32-row cases (for
#   arms that exist only on 128-row tiles).
set -u
bin=$(realpath "$1")
out=$2
arm=()
last_arm=()
if [ $# -ge 4 ]; then
  arm=("$3" "$4")
  last_arm=("$3" "${4##*,}")
fi
sizes=${5:-all}
mkdir -p "$out"
export MEGAMOE_JIT_CACHE_DIR
MEGAMOE_JIT_CACHE_DIR=$(mktemp -d)
rm -f "$out/results.jsonl" "$out/bench.txt" "$out/clocks.csv"
start=$SECONDS
# Seconds for the next step: at most $1, and none past 275 s (5 s kept for the table).
budget() {
  local left=$((275 - (SECONDS - start)))
  if [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}
if command -v nvidia-smi >/dev/null; then
  nvidia-smi -i 0 --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active \
    --format=csv,noheader,nounits -lms 100 > "$out/clocks.csv" 2>/dev/null &
  smi=$!
fi

timeout 90 "$bin" selftest --only gemm > "$out/selftest.txt" 2>&1
echo "selftest (gemm, fresh JIT cache, exit $?, $((SECONDS - start)) s): $(grep -c '^PASS' "$out/selftest.txt") passed," \
  "$(grep -c '^FAIL' "$out/selftest.txt") failed"
grep -E '^FAIL|error' "$out/selftest.txt"

# SM clock (MHz) and board power (W) sampled while the last step ran: min / median / max.
clock_summary() {
  [ -s "$out/clocks.csv" ] || return
  tail -n +"$1" "$out/clocks.csv" | python3 -c '
import sys
rows = [l.split(",") for l in sys.stdin if l.count(",") >= 3]
if rows:
    c = sorted(float(r[1]) for r in rows); p = sorted(float(r[2]) for r in rows)
    print(f"  SM clock {c[0]:.0f}/{c[len(c)//2]:.0f}/{c[-1]:.0f} MHz, power {p[0]:.0f}/{p[len(p)//2]:.0f}/{p[-1]:.0f} W (min/median/max, {len(rows)} samples)")'
}

bench() {
  local t from
  t=$(budget "$1")
  shift
  if [ "$t" -le 5 ]; then
    echo "skipped (no time left): bench gemm $*"
    return
  fi
  from=$(($(wc -l < "$out/clocks.csv" 2>/dev/null || echo 0) + 1))
  timeout "$t" "$bin" bench gemm "$@" "${arm[@]}" --json "$out/results.jsonl" 2>&1 \
    | grep -E '^\| L|rror' | tee -a "$out/bench.txt"
  echo "bench gemm $* ${arm[*]} (timeout $t s): exit ${PIPESTATUS[0]}, at $((SECONDS - start)) s"
  clock_summary "$from"
}
bench 50 --shape l1 --rows-per-expert 192,512,1024 --pad 128
bench 40 --shape l2 --rows-per-expert 192,512,1024 --pad 128
bench 40 --shape l1 --rows-per-expert 512,1024 --pad 128 --flush-l2
bench 30 --shape l2 --rows-per-expert 512,1024 --pad 128 --flush-l2
if [ "$sizes" = all ]; then
  bench 20 --shape l1 --rows-per-expert 32 --pad 64
  bench 20 --shape l1 --rows-per-expert 32 --layout masked
  bench 20 --shape l2 --rows-per-expert 32 --layout masked
fi

t=$(budget 60)
torch_py=$(command -v python3)
[ -x /opt/torch/.venv/bin/python3 ] && torch_py=/opt/torch/.venv/bin/python3
if [ "$t" -gt 10 ] && "$torch_py" -c 'import torch' 2>/dev/null; then
  timeout "$t" "$torch_py" "$(dirname "$0")/bench_gemm_torch.py" "$out/results.jsonl" > "$out/torch.txt" 2>&1
  echo "torch (exit $?, at $((SECONDS - start)) s): $out/torch.txt"
fi

t=$(budget 60)
if [ "$t" -gt 20 ] && command -v ncu >/dev/null; then
  timeout "$t" ncu --kernel-name regex:grouped_gemm --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
    "$bin" bench gemm --shape l1 --rows-per-expert 512 --pad 128 "${last_arm[@]}" --iters 1 \
    > "$out/ncu_l1_512.txt" 2>&1
  echo "ncu of ${last_arm[*]:-the default kernel} (exit $?): $(grep -E 'SM Frequency|Elapsed Cycles|Compute \(SM\) Throughput|One or More Eligible|Duration' "$out/ncu_l1_512.txt" | tr -s ' ' | tr '\n' ';')"
fi
[ -n "${smi:-}" ] && kill "$smi" 2>/dev/null

python3 - "$out" <<'PY'
import sys, json, re
out = sys.argv[1]
try:
    rows = [json.loads(l) for l in open(f"{out}/results.jsonl")]
except FileNotFoundError:
    rows = []
def arm(r):
    k = r["kernel"]
    tile = "x".join(re.search(r"_m(\d+)_n(\d+)_", k).groups())
    tags = [t for t in ("masked", "c2", "queued") if f"_{t}" in k]
    return " ".join([tile] + tags)
# Every row against the first arm of the same case (shape, rows, layout, flush) in this run.
print("\n| shape | rows | L2 flush | arm | µs | TFLOP/s | ×floor | vs first arm | DeepGEMM µs |")
print("|---|---|---|---|---|---|---|---|---|")
first = {}
for r in rows:
    case = (r["shape"], r["rows_per_expert"], r["layout"], r.get("flush_l2"))
    base = first.setdefault(case, r)
    rel = "" if base is r else f"{100 * (r['median_us'] / base['median_us'] - 1):+.1f} %"
    print(f"| {r['shape']} | {r['rows_per_expert']} | {'yes' if r.get('flush_l2') else 'no'} | {arm(r)} | {r['median_us']:.1f} | {r['tflops']:.0f} | {r['median_us'] / r['floor_us']:.2f} | {rel} | {r['deepgemm_us']} |")
print(f"\nsession: {len(rows)} timed rows")
PY
echo "total $((SECONDS - start)) s"
