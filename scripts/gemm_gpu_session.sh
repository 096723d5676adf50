#!/bin/bash
# The grouped GEMM's GPU session, one run of at most ~240 s: the GEMM selftest (every
# configuration against the CPU reference, compiled into a fresh JIT cache so compile time
# counts), the benchmark table (flash L1/L2 at 192/512/1024 rows per expert with four arms
# interleaved on the same operands: single CTAs (v3), 2-CTA clusters, A from registers (v5) and
# both; 32 rows contiguous and masked with the heuristic's kernel), then one Nsight Compute
# profile of the v3 kernel at L1 512 rows, and the short table last. SM clock and power are
# logged every 200 ms meanwhile and summarised per phase. Every step has its own timeout, so
# the tables come back even if a later step fails.
# usage: scripts/gemm_gpu_session.sh MEGAMOE_BINARY OUT_DIR
set -u
bin=$(realpath "$1")
out=$2
mkdir -p "$out"
export MEGAMOE_JIT_CACHE_DIR
MEGAMOE_JIT_CACHE_DIR=$(mktemp -d)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv,noheader
nvidia-smi -i 0 --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu \
  --format=csv,noheader -lms 200 > "$out/clocks.csv" 2>&1 &
clocks=$!
nvidia-smi -i 0 --query-gpu=timestamp,power.draw,clocks_event_reasons.active \
  --format=csv,noheader -lms 200 > "$out/reasons.csv" 2>&1 &
reasons=$!
stamp() { echo "$(date +%H:%M:%S.%N | cut -c1-12) $*" >> "$out/phases.txt"; }
rm -f "$out/results.jsonl" "$out/phases.txt"
start=$SECONDS

stamp selftest
timeout 75 "$bin" selftest --only gemm > "$out/selftest.txt" 2>&1
echo "selftest (gemm, fresh JIT cache, $((SECONDS - start)) s): $(grep -c '^PASS' "$out/selftest.txt") passed," \
  "$(grep -c '^FAIL' "$out/selftest.txt") failed"
grep -E '^FAIL|error' "$out/selftest.txt"

for shape in l1 l2; do
  stamp "bench $shape"
  timeout 45 "$bin" bench gemm --shape "$shape" --rows-per-expert 192,512,1024 --pad 128 \
    --cluster-m 1,2 --a-regs false,true --json-out "$out/results.jsonl" 2>&1 \
    | grep -E '^\| L|rror' | tee -a "$out/bench.txt"
  stamp "small $shape"
  timeout 15 "$bin" bench gemm --shape "$shape" --rows-per-expert 32 --pad 64 \
    --json-out "$out/results.jsonl" 2>&1 | grep -E '^\| L|rror' | tee -a "$out/bench.txt"
  timeout 15 "$bin" bench gemm --shape "$shape" --layout masked --rows-per-expert 32 \
    --json-out "$out/results.jsonl" 2>&1 | grep -E '^\| L|rror' | tee -a "$out/bench.txt"
done
stamp done
kill "$clocks" "$reasons"
echo "tables done at $((SECONDS - start)) s"

# Nsight Compute: the first launch of the v3 kernel at L1 512 rows (its correctness launch),
# without clock locking (the clocks the benchmark runs at).
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$ncu" ]; then
  timeout 60 "$ncu" --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats -k regex:grouped_gemm -c 1 \
    "$bin" bench gemm --shape l1 --rows-per-expert 512 --pad 128 --iters 1 \
    > "$out/ncu_l1_512_v3.txt" 2>&1
  echo "ncu: exit $?, $(wc -l < "$out/ncu_l1_512_v3.txt") lines in ncu_l1_512_v3.txt ($((SECONDS - start)) s)"
else
  echo "ncu: not found"
fi

python3 - "$out" <<'PY'
import sys, json, collections
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
    s = [c for c in clk if t0 <= c[0] < t1 and c[2] > 250]  # samples while a kernel runs
    if s:
        mhz = sorted(c[1] for c in s)
        w = sorted(c[2] for c in s)
        print(f"clocks {name.strip():10} {len(s):4} busy samples, SM MHz min/median/max "
              f"{mhz[0]}/{mhz[len(mhz)//2]}/{mhz[-1]}  W median/max {w[len(w)//2]:.0f}/{w[-1]:.0f}")
busy = collections.Counter()
for l in open(f"{out}/reasons.csv"):
    f = [x.strip() for x in l.split(",")]
    try:
        if float(f[1].split()[0]) > 250:
            busy[f[2]] += 1
    except (IndexError, ValueError):
        pass
print("clock event reasons while busy:", dict(busy))
try:
    rows = [json.loads(l) for l in open(f"{out}/results.jsonl")]
except FileNotFoundError:
    rows = []
arm = lambda r: ("c2" if r["cluster_m"] == 2 else "v3") + ("+areg" if r.get("a_regs") else "")
base = {(r["shape"], r["layout"], r["rows_per_expert"]): r["us"] for r in rows if arm(r) == "v3"}
print("\n| shape | layout | rows | arm | µs | TFLOP/s | vs v3 | DeepGEMM µs |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    b = base.get((r["shape"], r["layout"], r["rows_per_expert"]))
    rel = f"{100 * (r['us'] / b - 1):+.1f} %" if b and arm(r) != "v3" else ""
    print(f"| {r['shape']} | {r['layout']} | {r['rows_per_expert']} | {arm(r)} | {r['us']:.1f} | "
          f"{r['tflops']:.0f} | {rel} | {r['deepgemm_us']} |")
PY
