#!/bin/bash
# GPU session of Megatron-Core on megamoe's HybridEP-compatible buffer (docs/INTEGRATION.md):
# the wheels of WHEEL_DIR (megamoe's, megatron_core 0.19.2's and the pure-Python ones Megatron's
# test conftest imports) installed into a scratch folder, the switch
# (`python -m megamoe.compat install-deep-ep --target` that folder), the compat tests
# (python/tests/test_compat_*.py) and megamoe.ep's (test_gpu_ep.py), then
# scripts/megatron_checks.py: imports, Megatron's container dispatcher tests (tp = 1, ep = the
# GPUs, hybridep, fusion off and on; MEGATRON_SRC is a Megatron-LM tree whose tests/ they come
# from), the MoELayer parity against alltoall, a 60-step training run (flex + megamoe, alltoall,
# alltoall from another seed), the speed table; last the loss plot and a summary table
# (scripts/megatron_report.py).
# One GPU by default; with MEGATRON_GPUS=N (scripts/megatron_multi_gpu_session.sh) the checks run
# under `torchrun --nproc_per_node N` (ep = N), and with N = 8 NVIDIA's unchanged
# tests/unit_tests/transformer/moe/test_token_dispatcher.py runs too, `-k "Flex and hybridep"`
# (its parametrizations need tp·ep = 8 ranks).
# Logs and JSON go to OUT_DIR (steps.txt has every step's exit code and time). The megamoe CLI
# binary only reports its version here. About 6 minutes on one GPU.
# usage: scripts/megatron_gpu_session.sh MEGAMOE_BINARY WHEEL_DIR MEGATRON_SRC OUT_DIR [PYTHON]
set -u
bin=$(realpath "$1")
wheels=$(realpath "$2")
msrc=$(realpath "$3")
out=$4
py=${5:-python3}
gpus=${MEGATRON_GPUS:-1}
mkdir -p "$out"
out=$(realpath "$out")
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv,noheader
"$bin" --version
site=$(wheel_site "$wheels" "$py")
export PYTHONPATH=$site PYTHONUNBUFFERED=1
run_step switch 60 "$py" -m megamoe.compat install-deep-ep --target "$site"
"$py" -m megamoe.compat status | tee -a "$out/switch.txt"
run_step compat_tests 240 "$py" -m pytest -q -rA -p no:cacheprovider python/tests/test_compat_cpu.py \
  python/tests/test_compat_hybrid_ep_gpu.py
tail -3 "$out/compat_tests.txt"
# megamoe.ep's own GPU tests: its host path (run_dispatch/run_combine, the combine writing into
# the caller's tensors) keeps its answers.
run_step ep_tests 300 "$py" -m pytest -q -rA -p no:cacheprovider python/tests/test_gpu_ep.py
tail -3 "$out/ep_tests.txt"
checks=("$py" scripts/megatron_checks.py)
if [ "$gpus" -gt 1 ]; then
  checks=("$py" -m torch.distributed.run --standalone --nproc_per_node "$gpus" scripts/megatron_checks.py)
fi
run_step imports 120 "${checks[@]}" imports --out "$out" --megatron-src "$msrc"
cat "$out/imports.txt"
run_step containers 300 "${checks[@]}" containers --out "$out" --megatron-src "$msrc"
grep -E '^container|containers:' "$out/containers.txt"
run_step parity 240 "${checks[@]}" parity --out "$out"
grep -E '^parity' "$out/parity.txt"
run_step train 300 "${checks[@]}" train --out "$out" --steps 60
grep -E '^train' "$out/train.txt"
run_step speed 400 "${checks[@]}" speed --out "$out"
grep -E '^speed' "$out/speed.txt"
if [ "$gpus" -eq 8 ]; then
  # NVIDIA's file, unchanged, from the Megatron tree (with its conftest and test utilities).
  (cd "$msrc" && PYTHONPATH=$msrc:$site run_step nvidia_tests 600 "$py" -m torch.distributed.run --standalone \
    --nproc_per_node 8 -m pytest -q -rA -p no:cacheprovider tests/unit_tests/transformer/moe/test_token_dispatcher.py \
    -k "Flex and hybridep")
  tail -15 "$out/nvidia_tests.txt"
fi
run_step report 60 "$py" scripts/megatron_report.py "$out"
cat "$out/steps.txt"
cat "$out/report.txt"
