#!/bin/bash
# GPU session of the Python package's API: the one tensor checker (alignment included) and the
# one-rank calls taking plain tensors, with the per-rank calls behind forward_ranks /
# dispatch_with_permute_ranks / combine_with_unpermute_ranks. Runs the whole Python suite
# (python/tests: the layer of both kinds at R = 1 and 2, one process per rank, the serving and
# DeepGEMM-API tests, dispatch/combine, the HybridEP buffer) and the two examples that use the
# changed calls (moe_block.py, per-rank lists; serve_layer.py, one rank), with the wheels of
# WHEEL_DIR (the package's, and pytest's where PYTHON has none) installed into a scratch folder
# for PYTHON, then the host time per call at decode (scripts/serving_host_overhead.py, flash/32).
# Logs go to OUT_DIR (pytest.txt, moe_block.txt, serve_layer.txt, host_overhead.txt, steps.txt);
# a summary table is printed last. MEGAMOE_BINARY is the release CLI (the suite's two tests that
# want target/'s binary skip without it).
# usage: scripts/python_api_gpu_session.sh MEGAMOE_BINARY WHEEL_DIR OUT_DIR [PYTHON]
set -u
bin=$(realpath "$1")
wheels=$2
out=$3
py=${4:-python3}
mkdir -p "$out"
out=$(realpath "$out")
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit --format=csv,noheader
site=$(wheel_site "$wheels" "$py")
export PYTHONPATH=$site PYTHONUNBUFFERED=1
"$py" -c 'import megamoe, sys; assert megamoe.__file__.startswith(sys.argv[1]), megamoe.__file__' "$site" \
  || echo "warning: megamoe is not the wheel's" >&2
run_step pytest 420 "$py" -m pytest -q -rfEs -p no:cacheprovider python/tests
run_step moe_block 120 "$py" python/examples/moe_block.py --ranks 2
run_step serve_layer 120 "$py" python/examples/serve_layer.py --tokens 64
# The host time of the checked calls (docs/perf/serving-host-overhead.md): every tensor of
# fp8_mega_moe and forward(y) now goes through the native checker.
run_step host_overhead 200 "$py" scripts/serving_host_overhead.py --presets flash --tokens 64 --calls 200

echo
echo "| check | rc | result |"
echo "|---|---|---|"
while read -r name rc _; do
  result=$(tail -n 1 "$out/$name.txt")
  [[ $name == host_overhead ]] && result="the table below"
  echo "| $name | ${rc#rc=} | $result |"
done < "$out/steps.txt"
echo
grep -E '^\|' "$out/host_overhead.txt" | head -n 3
