#!/bin/bash
# GPU session of the serving path on one H200: the fused layer's selftest (its output hashes
# compared with docs/perf/selftest-h200-v9-fused.txt: the staging kernel and the per-expert
# statistics must not move a bit), the GPU tests of the layer (python/tests/test_gpu_layer*.py:
# DeepGEMM's call sequence through megamoe.deep_gemm at world size 1 and with one process per
# rank, CUDA graph replays bit-equal to eager calls, the values the device checks, and the
# layer's earlier tests), the decode-graph example, then the host overhead at decode
# (scripts/serving_host_overhead.py, flash/32 and pro/48). The wheels of WHEEL_DIR (the
# package's, pytest's) are installed into a scratch folder for PYTHON (default python3, the one
# with torch). Logs go to OUT_DIR; each step has its own timeout; the summary comes last.
# usage: scripts/serving_gpu_session.sh MEGAMOE_BINARY WHEEL_DIR OUT_DIR [PYTHON] [STEPS]
#   STEPS: which of "selftest serving layer example overhead" to run (default all).
set -u
bin=$(realpath "$1")
wheels=$2
out=$3
py=${4:-python3}
steps=${5:-selftest serving layer example overhead}
mkdir -p "$out"
source "$(dirname "$0")/gpu_session_lib.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv,noheader
start=$(date +%s)
site=$(wheel_site "$wheels" "$py")
export PYTHONPATH=$site PYTHONUNBUFFERED=1
# name -> hash of each check of a selftest log.
hashes() { grep -oE '^PASS +layer fused .* hash [0-9a-f]{16}' "$1" | sed -E 's/ +[0-9.]+ ms .* hash / /'; }
summary=()
for s in $steps; do
  case $s in
    selftest)
      step selftest_fused 300 selftest --only "layer fused"
      hashes docs/perf/selftest-h200-v9-fused.txt | sort > "$out/hashes_recorded.txt"
      hashes "$out/selftest_fused.txt" | sort > "$out/hashes_now.txt"
      if [ -s "$out/hashes_now.txt" ] && diff "$out/hashes_recorded.txt" "$out/hashes_now.txt" > "$out/hashes_diff.txt"; then
        verdict="unchanged ($(wc -l < "$out/hashes_now.txt") checks)"
      else
        verdict="CHANGED or missing (see hashes_diff.txt)"
      fi
      summary+=("$(grep -E 'checks passed' "$out/selftest_fused.txt")"
                "selftest fused hashes against docs/perf/selftest-h200-v9-fused.txt: $verdict") ;;
    serving)
      run_step pytest_serving 300 "$py" -m pytest -q -rA -s -p no:cacheprovider \
        python/tests/test_gpu_layer_serving.py
      summary+=("$(tail -n 1 "$out/pytest_serving.txt")") ;;
    layer)
      run_step pytest_layer 300 "$py" -m pytest -q -rA -s -p no:cacheprovider \
        python/tests/test_gpu_layer.py python/tests/test_gpu_layer_dist.py
      summary+=("$(tail -n 1 "$out/pytest_layer.txt")") ;;
    example)
      run_step example_graphs 120 "$py" python/examples/serve_decode_graphs.py --preset flash --steps 12
      summary+=("example: $(tail -n 1 "$out/example_graphs.txt")") ;;
    overhead)
      run_step host_overhead 300 "$py" scripts/serving_host_overhead.py --presets flash,pro --tokens 64
      summary+=("$(grep -E '^\|' "$out/host_overhead.txt")") ;;
  esac
done

echo "== summary (session $(( $(date +%s) - start )) s)"
cat "$out/steps.txt"
printf '%s\n' "${summary[@]}"
