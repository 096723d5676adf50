#!/bin/bash
# The K loop's and the fused producer's GPU session on one H200: (a) the fused layer's selftest,
# tiny, flash/32 and pro/48 R=1 (its output hashes, to compare with the previous build's); (b) `bench layer --trace`, split and
# fused interleaved, on the EP8-rank proxies (flash with 32 experts, pro with 48), in processes
# that alternate between BASELINE_BINARY and MEGAMOE_BINARY (A B A B ...: machine drift falls on
# both alike) or of MEGAMOE_BINARY alone; (c) optionally `bench gemm` on the L1 and L2 shapes of
# the proxies at the rows per expert of 1024 and 8192 tokens per rank (flash 192 / 1536, pro
# 128 / 1024; 128-row tiles), the default interleaved with 128 x 192 tiles and with 2-CTA
# clusters on the same operands. Every step runs under a timeout cut to the time left (the
# session ends by 350 s); the summary tables come last.
# usage: scripts/kloop_gpu_session.sh MEGAMOE_BINARY OUT_DIR [BASELINE_BINARY] [STEPS] [TOKENS]
#   BASELINE_BINARY: "" for none; STEPS: any of "selftest layer gemm" (default "selftest layer");
#   TOKENS: the layer bench's token counts (default 64,256,1024,8192).
set -u
bin=$(realpath "$1")
out=$2
base=${3:+$(realpath "$3")}
steps=${4:-selftest layer}
tokens=${5:-64,256,1024,8192}
mkdir -p "$out"
rm -f "$out"/*.jsonl "$out/steps.txt"
source "$(dirname "$0")/gpu_session_lib.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv,noheader
start=$SECONDS
# `timed NAME LIMIT_S ARGS...`: step with its limit cut so that the session ends by 350 s.
timed() {
  local name=$1 left=$((350 - (SECONDS - start)))
  local limit=$(($2 < left ? $2 : left))
  shift 2
  if [ "$limit" -le 5 ]; then
    echo "skipped (no time left): $name" | tee -a "$out/steps.txt"
    return
  fi
  step "$name" "$limit" "$@"
}
# `gemm_arms PRESET EXPERTS ROWS`: L1 and L2 of one proxy, one process per set of arms (the
# first arm of each is the default).
gemm_arms() {
  local preset=$1 experts=$2 rows=$3
  for shape in l1 l2; do
    local g=(bench gemm --preset "$preset" --experts "$experts" --shape "$shape" --iters 10
             --rows-per-expert "$rows" --json "$out/gemm.jsonl")
    timed "gemm_${preset}_${shape}_n192" 30 "${g[@]}" --block-n 256,192
    timed "gemm_${preset}_${shape}_c2" 30 "${g[@]}" --cluster-m 1,2
  done
}
# `layer_round ARM BINARY ROUND`: both proxies with one binary.
layer_round() {
  local bin=$2
  timed "layer_flash32_$1_$3" 60 bench layer --preset flash --experts 32 --tokens "$tokens" --trace \
    --rounds 2 --json "$out/layer_$1.jsonl"
  timed "layer_pro48_$1_$3" 80 bench layer --preset pro --experts 48 --tokens "$tokens" --trace \
    --rounds 2 --json "$out/layer_$1.jsonl"
}
for s in $steps; do
  case $s in
    selftest) timed selftest_fused 90 selftest --only "layer fused tiny,layer fused flash,layer fused pro/48 R=1"
              grep -E '^FAIL|checks passed' "$out/selftest_fused.txt" ;;
    layer) for round in 1 2; do
             [ -n "$base" ] && layer_round A "$base" "$round"
             layer_round B "$bin" "$round"
           done ;;
    gemm) gemm_arms flash 32 192,1536
          gemm_arms pro 48 128,1024 ;;
  esac
done
echo "session: $((SECONDS - start)) s; A: ${base:-none}; B: $bin"
grep -h 'hash' "$out"/selftest_fused.txt 2>/dev/null | awk '{print "  " $0}' | cut -c1-150
for f in "$out"/layer_*.txt; do
  [ -f "$f" ] && { echo "== $(basename "$f" .txt)"; sed -n '/^fused timeline/,/^each phase/p' "$f" | grep -v '^each phase'; }
done
python3 - "$out" <<'PY'
import json, os, re, statistics, sys
out = sys.argv[1]
def rows(name):
    path = os.path.join(out, name)
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []
# Layer: per arm the median over its processes of each cell's median.
cells = {}
for arm in "AB":
    for r in rows(f"layer_{arm}.jsonl"):
        cells.setdefault((r["preset"], r["experts"], r["tokens"], arm, r["arm"]), []).append(r)
if cells:
    print("\n| preset | tokens | arm | split µs | fused µs | fused/split | fused ×floor | fused B/A |")
    print("|---|---|---|---|---|---|---|---|")
    med = lambda k: statistics.median(c["median_us"] for c in cells[k]) if k in cells else None
    for preset, experts, tokens in sorted({k[:3] for k in cells}):
        for arm in "AB":
            s, f = med((preset, experts, tokens, arm, "split")), med((preset, experts, tokens, arm, "fused"))
            if s is None or f is None:
                continue
            floor = cells[(preset, experts, tokens, arm, "fused")][0]["floor_us"]
            fa = med((preset, experts, tokens, "A", "fused"))
            rel = f"{f / fa:.3f}" if arm == "B" and fa else ""
            print(f"| {preset}/{experts} | {tokens} | {arm} | {s:.1f} | {f:.1f} | {f / s:.3f} | {f / floor:.3f} | {rel} |")
# GEMM: each arm against the default of its own process.
gemm = rows("gemm.jsonl")
if gemm:
    print("\n| preset | shape | rows/expert | kernel | µs | ×floor | ×weight floor | vs default |")
    print("|---|---|---|---|---|---|---|---|")
    default = {}
    for r in gemm:
        case = (r["preset"], r["shape"], r["rows_per_expert"])
        if case not in default or r["arm"] == default[case][0]:
            default[case] = (r["arm"], r["median_us"])
        tile = "x".join(re.search(r"_m(\d+)_n(\d+)_", r["arm"]).groups()) + (" c2" if "_c2" in r["arm"] else "")
        print(f"| {r['preset']}/{r['experts']} | {r['shape']} | {r['rows_per_expert']} | {tile} "
              f"| {r['median_us']:.1f} | {r['x_floor']:.2f} | {r['median_us'] / r['weight_floor_us']:.2f} "
              f"| {r['median_us'] / default[case][1]:.3f} |")
PY
