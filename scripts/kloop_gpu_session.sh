#!/bin/bash
# The K loop's GPU session on one H200, about 6 minutes: (a) `bench gemm` on the L1 and L2
# shapes of the EP8-rank proxies (flash with 32 experts, pro with 48, top-6) at the rows per
# expert of 64, 1024 and 8192 tokens per rank (flash 12 / 192 / 1536, pro 8 / 128 / 1024), each
# arm (queued waves, 128 x 192 tiles, 2-CTA clusters) interleaved with the default on the same
# operands; (b) the selftests of the GEMM
# (every configuration; queued waves must give the default's bits) and of the fused layer (its
# output hashes are compared with the previous build's by whoever reads the log); (c)
# `bench layer`, split and fused interleaved, on both proxies. Every step runs under a timeout cut
# to the time left; the summary tables come last.
# usage: scripts/kloop_gpu_session.sh MEGAMOE_BINARY OUT_DIR [STEPS] [TOKENS]
#   STEPS: any of "selftest gemm layer" (default all, in that order); TOKENS: the layer bench's token counts
#   (default 64,256,1024,4096,8192).
set -u
bin=$(realpath "$1")
out=$2
steps=${3:-selftest gemm layer}
tokens=${4:-64,256,1024,4096,8192}
mkdir -p "$out"
rm -f "$out/gemm.jsonl" "$out/layer.jsonl" "$out/steps.txt"
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
# `gemm_arms PRESET EXPERTS DECODE_ROWS PREFILL_ROWS`: L1 and L2 of one proxy, one process per
# set of arms (the first arm of each is the default).
gemm_arms() {
  local preset=$1 experts=$2 decode=$3 prefill=$4
  for shape in l1 l2; do
    local g=(bench gemm --preset "$preset" --experts "$experts" --shape "$shape" --iters 10
             --json "$out/gemm.jsonl")
    timed "gemm_${preset}_${shape}_queued" 40 "${g[@]}" --rows-per-expert "$decode,$prefill" --queued false,true
    timed "gemm_${preset}_${shape}_n192" 30 "${g[@]}" --rows-per-expert "$prefill" --block-n 256,192
    timed "gemm_${preset}_${shape}_c2" 30 "${g[@]}" --rows-per-expert "$prefill" --cluster-m 1,2 \
      --queued false,true
  done
}
for s in $steps; do
  case $s in
    gemm) gemm_arms flash 32 12 192,1536
          gemm_arms pro 48 8 128,1024 ;;
    selftest) timed selftest_gemm 60 selftest --only gemm
              grep -E '^FAIL|checks passed' "$out/selftest_gemm.txt"
              grep -c 'bits equal to' "$out/selftest_gemm.txt" | sed 's/^/queued configurations with the default'"'"'s bits: /'
              timed selftest_fused 90 selftest --only "layer fused"
              grep -E '^FAIL|checks passed' "$out/selftest_fused.txt" ;;
    layer) timed layer_flash32 60 bench layer --preset flash --experts 32 --tokens "$tokens" --trace \
             --json "$out/layer.jsonl"
           timed layer_pro48 80 bench layer --preset pro --experts 48 --tokens "$tokens" --trace \
             --json "$out/layer.jsonl" ;;
  esac
done
echo "session: $((SECONDS - start)) s"
grep -h 'hash' "$out"/selftest_fused.txt 2>/dev/null | awk '{print "  " $0}' | cut -c1-150
for f in "$out"/layer_*.txt; do
  [ -f "$f" ] && { echo "== $(basename "$f" .txt)"; sed -n '/^fused timeline/,/^each phase/p' "$f" | grep -v '^each phase'; }
done
python3 - "$out" <<'PY'
import json, os, re, sys
out = sys.argv[1]
def rows(name):
    path = os.path.join(out, name)
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []
def arm(kernel):
    tile = "x".join(re.search(r"_m(\d+)_n(\d+)_", kernel).groups())
    return " ".join([tile] + [t for t in ("c2", "queued") if f"_{t}" in kernel])
# Each arm against the default of its own process (the first arm of the case in that process).
print("\n| preset | shape | rows/expert | arm | µs | ×floor | ×weight floor | vs default |")
print("|---|---|---|---|---|---|---|---|")
default = {}
for r in rows("gemm.jsonl"):
    case = (r["preset"], r["shape"], r["rows_per_expert"])
    if case not in default or r["arm"] == default[case][0]:
        default[case] = (r["arm"], r["median_us"])
    rel = r["median_us"] / default[case][1]
    print(f"| {r['preset']}/{r['experts']} | {r['shape']} | {r['rows_per_expert']} | {arm(r['arm'])} "
          f"| {r['median_us']:.1f} | {r['x_floor']:.2f} | {r['median_us'] / r['weight_floor_us']:.2f} "
          f"| {rel:.3f} |")
print("\n| preset | tokens | split µs | fused µs | fused/split | floor µs | fused ×floor |")
print("|---|---|---|---|---|---|---|")
layer = {}
for r in rows("layer.jsonl"):
    layer.setdefault((r["preset"], r["experts"], r["tokens"]), {})[r["arm"]] = r
for (preset, experts, tokens), arms in layer.items():
    s, f = arms.get("split"), arms.get("fused")
    if s and f:
        print(f"| {preset}/{experts} | {tokens} | {s['median_us']:.1f} | {f['median_us']:.1f} "
              f"| {f['median_us'] / s['median_us']:.3f} | {f['floor_us']:.1f} "
              f"| {f['median_us'] / f['floor_us']:.3f} |")
PY
