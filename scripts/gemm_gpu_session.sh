#!/bin/bash
# The grouped GEMM's GPU session: selftest (every configuration against the CPU reference), the
# benchmark table (flash L1/L2, 32/192/512/1024 rows per expert; single CTAs and 2-CTA clusters
# interleaved per size; masked at 32), 1000-iteration runs of single CTAs and clusters, and
# torch._scaled_grouped_mm on the same group sizes, short table last. SM clock and power are
# logged every 200 ms meanwhile and summarised per phase.
# usage: [NO_TORCH=1] scripts/gemm_gpu_session.sh MEGAMOE_BINARY OUT_DIR
set -u
bin=$(realpath "$1")
out=$2
here=$(dirname "$(realpath "$0")")
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv,noheader
nvidia-smi -i 0 --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu \
  --format=csv,noheader -lms 200 > "$out/clocks.csv" 2>&1 &
clocks=$!
nvidia-smi -i 0 --query-gpu=timestamp,power.draw,clocks_event_reasons.active \
  --format=csv,noheader -lms 200 > "$out/reasons.csv" 2>&1 &
reasons=$!
stamp() { echo "$(date +%H:%M:%S.%N | cut -c1-12) $*" >> "$out/phases.txt"; }
rm -f "$out/results.jsonl"
stamp selftest
timeout 150 "$bin" selftest > "$out/selftest.txt" 2>&1
echo "selftest: $(grep -c '^PASS' "$out/selftest.txt") passed, $(grep -c '^FAIL' "$out/selftest.txt") failed"
grep -E '^FAIL|error' "$out/selftest.txt"
for shape in l1 l2; do
  stamp "bench $shape"
  timeout 40 "$bin" bench gemm --shape "$shape" --rows-per-expert 32 --pad 64 \
    --json-out "$out/results.jsonl" 2>&1 | tee -a "$out/bench.txt"
  timeout 100 "$bin" bench gemm --shape "$shape" --rows-per-expert 192,512,1024 --pad 128 \
    --cluster-m 1,2 --json-out "$out/results.jsonl" 2>&1 | grep -E '^\| L|error' | tee -a "$out/bench.txt"
  stamp "masked $shape"
  timeout 40 "$bin" bench gemm --shape "$shape" --layout masked --rows-per-expert 32 \
    --json-out "$out/results.jsonl" 2>&1 | grep -E '^\| L|error' | tee -a "$out/bench.txt"
done
for c in 1 2; do
  stamp "sustained c$c"
  timeout 40 "$bin" bench gemm --shape l1 --rows-per-expert 1024 --pad 128 --cluster-m $c --iters 1000 2>&1 \
    | grep -E '^\| L|error' | sed "s/^/1000 iterations /" | tee -a "$out/bench_sustained.txt"
done
stamp done
kill "$clocks" "$reasons"
python3 - "$out" <<'PY'
import sys, collections
out = sys.argv[1]
phases = [l.split(" ", 1) for l in open(f"{out}/phases.txt")]
clk = []
for l in open(f"{out}/clocks.csv"):
    f = [x.strip() for x in l.split(",")]
    try:
        clk.append((f[0].split()[1][:12], int(f[1].split()[0]), float(f[2].split()[0]), f[3]))
    except (IndexError, ValueError):
        pass
for i, (t0, name) in enumerate(phases[:-1]):
    t1 = phases[i + 1][0]
    s = [c for c in clk if t0 <= c[0] < t1]
    s = [c for c in s if c[2] > 250]  # samples while a kernel runs
    if s:
        mhz = sorted(c[1] for c in s)
        w = sorted(c[2] for c in s)
        temp = max(c[3] for c in s)
        print(f"clocks {name.strip():12} {len(s):4} busy samples, SM MHz min/median/max {mhz[0]}/{mhz[len(mhz)//2]}/{mhz[-1]}"
              f"  W median/max {w[len(w)//2]:.0f}/{w[-1]:.0f}  max temp {temp}")
busy_reasons = collections.Counter()
for l in open(f"{out}/reasons.csv"):
    f = [x.strip() for x in l.split(",")]
    try:
        if float(f[1].split()[0]) > 250:
            busy_reasons[f[2]] += 1
    except (IndexError, ValueError):
        pass
print("clock event reasons while busy:", dict(busy_reasons) or open(f"{out}/reasons.csv").read()[:200])
PY
# torch's times do not depend on this crate: NO_TORCH=1 skips them (same seeds, same draws).
if [ -z "${NO_TORCH:-}" ]; then
  timeout 100 python3 "$here/bench_gemm_torch.py" "$out/results.jsonl" 2>&1 | tee "$out/torch.txt"
fi
