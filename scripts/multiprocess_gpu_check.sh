#!/bin/bash
# Dispatch/combine and the fused layer with one process per rank on one GPU: `megamoe ep-procs` starts 2, then 4
# processes (one rank each, peers' symmetric buffers mapped over CUDA IPC, handles swapped
# through a rendezvous directory) that check their rank's dispatch_with_permute, both combine
# orders and both backwards bit for bit against the CPU reference, BF16 and FP8, and one call of
# the fused layer bit for bit against the same batch on virtual ranks; then a peer that never
# starts and ones that never call, which must fail rank 0 within the deadline naming rank 1. Then the single-process ep checks of the selftest, unchanged. One PASS/FAIL line per
# case; logs go to OUT_DIR. Expected: well under a minute, JIT compilation included.
# usage: scripts/multiprocess_gpu_check.sh MEGAMOE_BINARY OUT_DIR
set -u
bin=$(realpath "$1")
out=$2
mkdir -p "$out"
source "$(dirname "$0")/gpu_session_lib.sh"
nvidia-smi --query-gpu=name,compute_mode --format=csv,noheader
start=$(date +%s)
step ep_procs 120 ep-procs --ranks 2,4 --device 0
grep -E '^(PASS|FAIL)|^ +rank|error' "$out/ep_procs.txt"
step selftest_ep 120 selftest --only ep.
grep -E '^(PASS|FAIL)|checks passed' "$out/selftest_ep.txt"
echo "session: $(( $(date +%s) - start )) s"
! grep -q 'rc=[1-9]' "$out/steps.txt"
