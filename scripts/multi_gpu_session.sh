#!/bin/bash
# The layer and dispatch/combine across the GPUs of one host, one rank per GPU (R = the visible
# GPUs: 2 for EP2, 8 for EP8). Each step under its own timeout, logs in OUT_DIR, steps.txt with
# every exit code and time, the short table last:
#   selftest  the whole selftest on a fresh JIT cache (its R > 1 checks now span real GPUs)
#   layer     `bench layer --ranks R` on flash and pro, split and fused interleaved, 64 … 8192
#             tokens/rank, buffers for 8192
#   dispatch  `bench dispatch --ranks R` on flash at 512 and 4096 tokens/rank, BF16 and FP8, SMs
#             16, 24, 32, 48, both combine orders
#   plan      `megamoe plan` by bound (128 … 8192) for flash and pro: symmetric bytes per kind
#   skew      flash at 4096 tokens/rank with Zipf routing and with 30 % of the slots masked;
#             glm at 4096 once (R = 8 only: its 288 experts split over 8 ranks)
#   bits      `megamoe run` of one batch (flash, 1024 tokens/rank, both kinds) on the R GPUs and
#             again as R virtual ranks on GPU 0: the output hashes must be equal
#   procs     scripts/procs_gpu_session.sh: ep-procs, the Python suite, torchrun (one process
#             per GPU)
# usage: scripts/multi_gpu_session.sh MEGAMOE_BINARY WHEEL_DIR OUT_DIR [PYTHON] [STEPS]
#   STEPS: a subset of "selftest layer dispatch plan skew bits procs" (default all; the whole
#   session may need more than one 10-minute call: split it by steps).
set -u
bin=$(realpath "$1")
wheels=$2
out=$3
py=${4:-python3}
steps=${5:-selftest layer dispatch plan skew bits procs}
mkdir -p "$out"
here=$(dirname "$0")
source "$here/gpu_session_lib.sh"
nvidia-smi --query-gpu=index,name,clocks.sm,power.draw,power.limit --format=csv,noheader
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
echo "$gpus GPU(s): R = $gpus"
nvidia-smi topo -m > "$out/topology.txt" 2>&1
start=$(date +%s)
for s in $steps; do
  case $s in
    selftest)
      step selftest 300 selftest
      grep -E '^FAIL|checks passed' "$out/selftest.txt" ;;
    layer)
      for p in flash pro; do step "layer_$p" 240 bench layer --preset $p --ranks "$gpus"; done ;;
    dispatch)
      for t in 512 4096; do
        for d in bf16 fp8; do
          step "dispatch_${d}_t$t" 120 bench dispatch --preset flash --tokens $t --dtype $d --ranks "$gpus" \
            --sms 16,24,32,48 --combine exact,per_rank
        done
      done ;;
    plan)
      for p in flash pro; do step "plan_$p" 30 plan --preset $p --ranks "$gpus" --tokens 8192; done ;;
    skew)
      step skew_zipf 150 bench layer --preset flash --ranks "$gpus" --tokens 4096 --routing zipf
      step skew_masked 150 bench layer --preset flash --ranks "$gpus" --tokens 4096 --masked 0.3
      [ "$gpus" -eq 8 ] && step glm 200 bench layer --preset glm --ranks 8 --tokens 4096 ;;
    bits)
      for k in fused split; do
        step "bits_${k}_gpus" 120 run --preset flash --ranks "$gpus" --tokens 1024 --kernel $k --backend gpu --json
        (export CUDA_VISIBLE_DEVICES=0; step "bits_${k}_one_gpu" 180 run --preset flash --ranks "$gpus" --tokens 1024 \
          --kernel $k --backend gpu --json)
        a=$(grep -o '"output_hash":"[0-9a-f]*"' "$out/bits_${k}_gpus.txt")
        b=$(grep -o '"output_hash":"[0-9a-f]*"' "$out/bits_${k}_one_gpu.txt")
        if [ -n "$a" ] && [ "$a" = "$b" ]; then verdict=PASS; else verdict=FAIL; fi
        echo "$verdict  $k: $gpus GPUs $a, $gpus virtual ranks on GPU 0 $b" | tee -a "$out/bits.txt"
      done ;;
    procs)
      run_step procs 1000 "$here/procs_gpu_session.sh" "$bin" "$wheels" "$out/procs" "$py"
      tail -8 "$out/procs.txt" ;;
    *) echo "unknown step $s" ;;
  esac
done
echo "session: $(( $(date +%s) - start )) s"
for f in "$out"/layer_*.txt "$out"/skew_*.txt "$out"/glm.txt; do
  [ -f "$f" ] && { echo "== $(basename "$f" .txt)"; grep -A9 '^ tokens  *slots' "$f"; }
done
for f in "$out"/dispatch_*.txt; do
  [ -f "$f" ] && { echo "== $(basename "$f" .txt)"; grep -E 'with_permute|per_rank|exact' "$f" | head -12; }
done
[ -f "$out/bits.txt" ] && cat "$out/bits.txt"
true
