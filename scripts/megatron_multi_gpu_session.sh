#!/bin/bash
# Multi-GPU session of Megatron-Core on megamoe's HybridEP-compatible buffer: the checks of
# scripts/megatron_gpu_session.sh under `torchrun --nproc_per_node N`, one process per GPU,
# ep = N (N = 2 or 8); with N = 8 also NVIDIA's unchanged
# tests/unit_tests/transformer/moe/test_token_dispatcher.py, `-k "Flex and hybridep"`.
# usage: scripts/megatron_multi_gpu_session.sh N MEGAMOE_BINARY WHEEL_DIR MEGATRON_SRC OUT_DIR [PYTHON]
MEGATRON_GPUS=$1 exec "$(dirname "$0")/megatron_gpu_session.sh" "${@:2}"
