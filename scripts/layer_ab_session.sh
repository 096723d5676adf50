#!/bin/bash
# Builds of the layer against each other on one GPU: `bench layer --trace` of each binary in
# rotating processes (A B C A B C ...), flash with 32 experts and pro with 48 (the EP8-rank
# proxies, SPEC §9), so that machine drift falls on every arm alike. Each process interleaves
# split, the GEMMs alone and fused itself; its fused timeline (per task: K loop and epilogue) is
# the steadier measure of a kernel change. One log per process in OUT_DIR; the short table comes
# last: per process and token count, fused and split µs, fused/split, and the L1 and L2 tasks'
# K loop + epilogue µs.
# usage: scripts/layer_ab_session.sh OUT_DIR ROUNDS TOKENS BINARY...
#   ROUNDS: processes per arm and preset (e.g. 2); TOKENS: e.g. 1024,4096,8192; the arms are
#   named A, B, C, ... in the order of the binaries.
set -u
out=$1
rounds=$2
tokens=$3
shift 3
bins=()
for b in "$@"; do bins+=("$(realpath "$b")"); done
arms=(A B C D E F G H)
mkdir -p "$out"
bin=
source "$(dirname "$0")/gpu_session_lib.sh"
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit --format=csv,noheader
start=$(date +%s)
for round in $(seq 1 "$rounds"); do
  for i in "${!bins[@]}"; do
    bin=${bins[$i]}
    arm=${arms[$i]}
    step "flash32_${arm}_$round" 150 bench layer --preset flash --experts 32 --tokens "$tokens" --trace --rounds 2
    step "pro48_${arm}_$round" 200 bench layer --preset pro --experts 48 --tokens "$tokens" --trace --rounds 2
  done
done
echo "session: $(( $(date +%s) - start )) s"
for i in "${!bins[@]}"; do echo "${arms[$i]}: ${bins[$i]}"; done
# The bench prints its table (tokens first, fused µs in column 7) and then the timeline (tokens
# first, the wait and combine phases in columns 5-6, L1 K loop + epilogue in columns 12-13 and
# the median K loop in 14, L2 in 19-21, the tokens combined early in 23).
for f in "$out"/flash32_*.txt "$out"/pro48_*.txt; do
  echo "== $(basename "$f" .txt)"
  awk '/^ tokens +slots/ {t = 1; next} /^fused timeline/ {t = 0; l = 1; next} /^each phase/ {l = 0}
       t && NF > 8 {printf "  T %5s  split %8s  fused %8s  f/split %s\n", $1, $3, $7, $8}
       l && $1 ~ /^[0-9]+$/ {printf "  T %5s  L1 %s + %s (med %s)  L2 %s + %s (med %s)  wait %s combine %s early %s\n", $1, $12, $13, $14, $19, $20, $21, $5, $6, $23}' "$f"
done
