#!/bin/bash
# GPU session of the per_rank combine and the Python dispatch/combine: every ep check of the
# selftest (both combine orders bitwise, R = 1, 2, 4, 8, flash at 4096 tokens), `bench dispatch`
# at flash 4096 tokens/rank BF16 with both combine orders (24 SMs), then the Python GPU tests
# (python/tests/test_gpu_ep.py, test_gpu_ep_dist.py) with the wheels of WHEEL_DIR (the
# package's and pytest's) installed into a scratch folder for PYTHON (default python3, the one
# with torch).
# Logs go to OUT_DIR: selftest.txt, bench_per_rank.txt, python.txt, steps.txt.
# usage: scripts/py_ep_gpu_session.sh MEGAMOE_BINARY WHEEL_DIR OUT_DIR [PYTHON]
set -u
bin=$(realpath "$1")
wheels=$2
out=$3
py=${4:-python3}
mkdir -p "$out"
source "$(dirname "$0")/gpu_session_lib.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv,noheader
step selftest 100 selftest --only ep.
grep -E '^(PASS|FAIL)|checks passed' "$out/selftest.txt"
step bench_per_rank 60 bench dispatch --preset flash --tokens 4096 --dtype bf16 --ranks 2 --sms 24 --combine exact,per_rank
cat "$out/bench_per_rank.txt"
site=$(wheel_site "$wheels" "$py")
PYTHONPATH=$site PYTHONUNBUFFERED=1 run_step python 240 "$py" -m pytest -q -rA -s -p no:cacheprovider \
  python/tests/test_gpu_ep.py python/tests/test_gpu_ep_dist.py
tail -5 "$out/python.txt"
