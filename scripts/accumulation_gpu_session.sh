#!/bin/bash
# The rescaled accumulation (megamoe_core::Accumulation) on one H200, against the default:
#   1. correctness: `selftest` of the rescaled GEMM configurations and of both accumulations'
#      error on tiny, flash/32, pro/48 and glm/36 (CPU reference once, fused and split in each
#      mode, bit-equal in each; diff, max abs and max rel error), then the fused layer's checks,
#      whose hashes must equal docs/perf/selftest-h200-v9-main.txt's (the default's bits);
#   2. `bench gemm` L1 and L2 of flash/32 and pro/48 at 1024 and 8192 tokens (rows per expert
#      = tokens x 6 / experts), both accumulations interleaved in one process;
#   3. `bench layer` fused and split, flash/32 and pro/48, 64-8192 tokens, one process per
#      accumulation, alternating (per-block, rescaled; per preset);
#   4. scripts/bench_layer_kernel_time.py (kernel time, 8 GB L2 flush) in both accumulations.
# The summary table comes last.
# usage: scripts/accumulation_gpu_session.sh MEGAMOE_BINARY WHEEL_DIR OUT_DIR [STEPS]
#   STEPS: which of "correct gemm layer kernel" to run (default all; about 3 + 1.5 + 3 + 3
#   minutes).
set -u
bin=$(realpath "$1")
wheels=$(realpath "$2")
out=$3
steps=${4:-correct gemm layer kernel}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
source "$root/scripts/gpu_session_lib.sh"
py=${PYTHON:-/opt/torch/.venv/bin/python3}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv,noheader
start=$(date +%s)
tokens=64,256,1024,2048,4096,8192
for s in $steps; do
  case $s in
    correct)
      step selftest 300 selftest --only "layer accuracy,_rescaled,layer fused" ;;
    gemm)
      # flash/32: 192 and 1536 rows per expert; pro/48: 128 and 1024.
      for shape in l1 l2; do
        step "gemm_flash32_$shape" 90 bench gemm --shape "$shape" --preset flash --experts 32 \
          --rows-per-expert 192,1536 --accumulation per-block,rescaled --iters 20 --json "$out/gemm.jsonl"
        step "gemm_pro48_$shape" 90 bench gemm --shape "$shape" --preset pro --experts 48 \
          --rows-per-expert 128,1024 --accumulation per-block,rescaled --iters 20 --json "$out/gemm.jsonl"
      done ;;
    layer)
      for preset in flash:32 pro:48; do
        for acc in per-block rescaled; do
          step "layer_${preset%:*}${preset#*:}_$acc" 150 bench layer --preset "${preset%:*}" \
            --experts "${preset#*:}" --tokens "$tokens" --accumulation "$acc" --rounds 2 --iters 10 \
            --json "$out/layer.jsonl"
        done
      done ;;
    kernel)
      site=$(wheel_site "$wheels" "$py")
      for preset in flash pro; do
        for acc in per-block rescaled; do
          PYTHONPATH=$site run_step "ktime_${preset}_$acc" 120 "$py" "$root/scripts/bench_layer_kernel_time.py" \
            --preset "$preset" --tokens 1024,8192 --calls 10 --accumulation "$acc"
        done
      done ;;
  esac
done
echo "session: $(( $(date +%s) - start )) s"
echo "== steps"; cat "$out/steps.txt"
"$py" - "$out" "$root/docs/perf/selftest-h200-v9-main.txt" <<'PY'
import json, os, re, sys
out, ref = sys.argv[1], sys.argv[2]
def lines(name):
    p = os.path.join(out, name)
    return open(p).read().splitlines() if os.path.exists(p) else []
print("== correctness")
for l in lines("selftest.txt"):
    if re.search(r"^(FAIL|PASS +layer accuracy)|checks passed", l):
        print(l)
passed = sum(l.startswith("PASS  gemm") for l in lines("selftest.txt"))
print(f"rescaled GEMM configurations passed: {passed} (of 50)")
hashes = lambda ls: {m.group(1).strip(): m.group(2) for m in
                     (re.match(r"^PASS +(layer \S+ .*?) {2,}[\d.]+ ms .*hash ([0-9a-f]{16})", l) for l in ls) if m}
want = hashes(open(ref).read().splitlines()) if os.path.exists(ref) else {}
fused = [l for l in lines("selftest.txt") if re.match(r"^(PASS|FAIL) +layer fused", l)]
got = hashes(fused)
same = [n for n in got if want.get(n) == got[n]]
print(f"default fused checks: {sum(l.startswith('PASS') for l in fused)} passed, "
      f"{sum(l.startswith('FAIL') for l in fused)} failed; hashes equal to "
      f"{os.path.basename(ref)}: {len(same)} of {len(got)} "
      f"(differ: {[n for n in got if n in want and want[n] != got[n]]})")
def cells(name):
    return [json.loads(l) for l in lines(name) if l.startswith("{")]
g = cells("gemm.jsonl")
if g:
    print("== bench gemm: median µs, rescaled / per-block")
    print(f"{'preset':>6} {'shape':>5} {'rows/e':>6} {'per-block':>10} {'rescaled':>10} {'ratio':>6}  diff pb / rs")
    key = lambda c: (c["preset"], c["shape"], c["rows_per_expert"])
    for k in sorted({key(c) for c in g}):
        by = {c["accumulation"]: c for c in g if key(c) == k}
        pb, rs = by.get("per-block"), by.get("rescaled")
        if pb and rs:
            print(f"{k[0]:>6} {k[1]:>5} {k[2]:>6} {pb['median_us']:>10.1f} {rs['median_us']:>10.1f} "
                  f"{rs['median_us'] / pb['median_us']:>6.3f}  {pb['diff']:.1e} / {rs['diff']:.1e}")
L = cells("layer.jsonl")
if L:
    print("== bench layer: median µs (CUDA events), rescaled / per-block")
    print(f"{'preset':>6} {'tokens':>6} {'arm':>6} {'per-block':>10} {'rescaled':>10} {'ratio':>6}")
    key = lambda c: (c["preset"], c["tokens"], c["arm"])
    for k in sorted({key(c) for c in L if c["arm"] in ("fused", "split")}):
        by = {c["accumulation"]: c["median_us"] for c in L if key(c) == k}
        if len(by) == 2:
            print(f"{k[0]:>6} {k[1]:>6} {k[2]:>6} {by['per-block']:>10.1f} {by['rescaled']:>10.1f} "
                  f"{by['rescaled'] / by['per-block']:>6.3f}")
kt = {}
for f in sorted(os.listdir(out)):
    m = re.match(r"ktime_(\w+)_(per-block|rescaled)\.txt$", f)
    if m:
        for l in lines(f):
            p = l.split()
            if len(p) == 3 and p[0].isdigit():
                kt.setdefault((m.group(1), int(p[0]), p[1]), {})[m.group(2)] = float(p[2])
if kt:
    print("== kernel time (CUPTI, 8 GB L2 flush): median µs, rescaled / per-block")
    for k in sorted(kt):
        by = kt[k]
        if len(by) == 2:
            print(f"{k[0]:>6} {k[1]:>6} {k[2]:>6} {by['per-block']:>10.1f} {by['rescaled']:>10.1f} "
                  f"{by['rescaled'] / by['per-block']:>6.3f}")
PY
