#!/bin/bash
# One process per rank on the GPU machine: `megamoe ep-procs` (dispatch/combine, the fused and
# the split layer, the missing-peer cases; scripts/multiprocess_gpu_check.sh), the whole Python
# suite (python/tests, with the two-process tests of both kinds), then torchrun with 2 processes
# of python/examples/ep_torchrun.py and of layer_torchrun.py for both kinds: every process on
# GPU 0 (gloo) where one GPU is visible, else one GPU per process (nccl). The wheels of
# WHEEL_DIR (the package's and pytest's) go into a scratch folder for PYTHON (default python3,
# the one with torch). Logs in OUT_DIR; steps.txt has each step's exit code and time.
# usage: scripts/procs_gpu_session.sh MEGAMOE_BINARY WHEEL_DIR OUT_DIR [PYTHON]
set -u
bin=$(realpath "$1")
wheels=$2
out=$3
py=${4:-python3}
mkdir -p "$out"
here=$(dirname "$0")
source "$here/gpu_session_lib.sh"
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
same=
[ "$gpus" -lt 2 ] && same=--same-device
echo "$gpus GPU(s) visible; torchrun ${same:-with one GPU per process}"
run_step multiprocess 300 "$here/multiprocess_gpu_check.sh" "$bin" "$out/multiprocess"
grep -hE '^(PASS|FAIL)' "$out/multiprocess/ep_procs.txt"
site=$(wheel_site "$wheels" "$py")
export PYTHONPATH=$site PYTHONUNBUFFERED=1
run_step pytest 300 "$py" -m pytest -q -rfEs -p no:cacheprovider python/tests
tail -3 "$out/pytest.txt"
run_step torchrun_ep 120 "$py" -m torch.distributed.run --nproc-per-node 2 python/examples/ep_torchrun.py $same
for kind in fused split; do
  run_step "torchrun_layer_$kind" 120 "$py" -m torch.distributed.run --nproc-per-node 2 \
    python/examples/layer_torchrun.py $same --kind "$kind"
done
grep -hE '^(PASS|FAIL)' "$out"/torchrun_*.txt
! grep -q 'rc=[1-9]' "$out/steps.txt"
