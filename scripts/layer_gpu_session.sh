#!/bin/bash
# Layer GPU session on one H200: the whole selftest (runtime, GEMM, dispatch/combine, layer) on a
# fresh JIT cache, `megamoe run` on the GPU, then `bench layer` on the EP8-rank proxies (flash
# with 32 experts, pro with 48; SPEC §9). Logs go to OUT_DIR; each step has its own timeout; the
# short table comes last.
# usage: scripts/layer_gpu_session.sh MEGAMOE_BINARY OUT_DIR [TOKENS] [STEPS]
#   TOKENS: bench token counts (default 64,256,1024,4096,8192); STEPS: which of
#   "selftest run flash pro" to run (default all).
set -u
bin=$(realpath "$1")
out=$2
tokens=${3:-64,256,1024,4096,8192}
steps=${4:-selftest run flash pro}
mkdir -p "$out"
source "$(dirname "$0")/gpu_session_lib.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv,noheader
start=$(date +%s)
for s in $steps; do
  case $s in
    selftest) step selftest 240 selftest
              grep -E '^FAIL|checks passed' "$out/selftest.txt"
              grep -E '^(PASS|FAIL) +layer' "$out/selftest.txt" ;;
    run) step run_tiny 60 run --preset tiny --ranks 2 --tokens 64 --json
         step run_flash 120 run --preset flash --ranks 8 --tokens 64 --check --json
         cat "$out/run_tiny.txt" "$out/run_flash.txt" ;;
    flash) step bench_flash32 200 bench layer --preset flash --experts 32 --tokens "$tokens" ;;
    pro) step bench_pro48 200 bench layer --preset pro --experts 48 --tokens "$tokens" ;;
  esac
done
echo "session: $(( $(date +%s) - start )) s"
for f in "$out"/bench_*.txt; do [ -f "$f" ] && { echo "== $(basename "$f")"; grep -v '^bench layer: [a-z0-9 ]*$' "$f"; }; done
