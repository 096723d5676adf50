#!/bin/bash
# Multi-GPU session of Megatron-Core on megamoe's HybridEP-compatible buffer: the checks of
# scripts/megatron_gpu_session.sh (imports, Megatron's container tests with ep = N, the MoELayer
# parity against alltoall, the training run, the speed table) under
# `torchrun --nproc_per_node N`, one process per GPU, ep = N; with N = 8 also NVIDIA's unchanged
# tests/unit_tests/transformer/moe/test_token_dispatcher.py, `-k "Flex and hybridep"` (its
# parametrizations need tp·ep = 8 ranks, so with N = 2 it is left out). WHEEL_DIR and
# MEGATRON_SRC as for the one-GPU session; logs and JSON to OUT_DIR (steps.txt: exit codes).
# usage: scripts/megatron_multi_gpu_session.sh N WHEEL_DIR MEGATRON_SRC OUT_DIR [PYTHON]
set -u
n=$1
wheels=$(realpath "$2")
msrc=$(realpath "$3")
out=$4
py=${5:-python3}
mkdir -p "$out"
out=$(realpath "$out")
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
site=$(wheel_site "$wheels" "$py")
export PYTHONPATH=$site PYTHONUNBUFFERED=1
run_step switch 60 "$py" -m megamoe.compat install-deep-ep --target "$site"
torchrun=("$py" -m torch.distributed.run --standalone --nproc_per_node "$n")
checks=scripts/megatron_checks.py
run_step imports 120 "${torchrun[@]}" $checks imports --out "$out" --megatron-src "$msrc"
run_step containers 300 "${torchrun[@]}" $checks containers --out "$out" --megatron-src "$msrc"
grep -E '^container|containers:' "$out/containers.txt"
run_step parity 240 "${torchrun[@]}" $checks parity --out "$out"
grep -E '^parity' "$out/parity.txt"
run_step train 300 "${torchrun[@]}" $checks train --out "$out" --steps 60
grep -E '^train' "$out/train.txt"
run_step speed 400 "${torchrun[@]}" $checks speed --out "$out"
grep -E '^speed' "$out/speed.txt"
if [ "$n" -eq 8 ]; then
  # NVIDIA's file, unchanged, from the Megatron tree (its conftest and test utilities).
  (cd "$msrc" && PYTHONPATH=$msrc:$site run_step nvidia_tests 600 "${torchrun[@]}" -m pytest -q -rA \
    -p no:cacheprovider tests/unit_tests/transformer/moe/test_token_dispatcher.py -k "Flex and hybridep")
  tail -15 "$out/nvidia_tests.txt"
fi
run_step report 60 "$py" scripts/megatron_report.py "$out"
cat "$out/steps.txt"
cat "$out/report.txt"
