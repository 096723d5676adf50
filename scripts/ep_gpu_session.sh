#!/bin/bash
# Dispatch/combine GPU session on the H200 pair: every ep check of the selftest (bitwise against
# the CPU reference; R = 2, 4, 8 with every routing, the uneven one included, and flash at 4096
# tokens), then `bench dispatch` at flash 4096 tokens/rank BF16 (16, 24, 32 SMs) and FP8 (24 SMs)
# and at 512 tokens/rank BF16 (24 SMs). Logs go to OUT_DIR; a short table comes last, with the
# metadata phase (dispatch_with_permute minus the cached replay, BF16 only), v3's numbers and
# the v4 prediction of docs/PERF.md beside each measurement. Each step has its own timeout (two
# minutes in all at worst); expected about a minute, JIT compilation on a fresh machine included.
# usage: scripts/ep_gpu_session.sh MEGAMOE_BINARY OUT_DIR
set -u
bin=$(realpath "$1")
out=$2
mkdir -p "$out"
source "$(dirname "$0")/gpu_session_lib.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv,noheader
start=$(date +%s)
step selftest 60 selftest --only ep.
grep -E '^(PASS|FAIL)|checks passed' "$out/selftest.txt"
step bf16_t4096 30 bench dispatch --preset flash --tokens 4096 --dtype bf16 --sms 16,24,32
step fp8_t4096 15 bench dispatch --preset flash --tokens 4096 --dtype fp8 --sms 24
step bf16_t512 15 bench dispatch --preset flash --tokens 512 --dtype bf16 --sms 24
echo "session: $(( $(date +%s) - start )) s"
python3 - "$out" <<'PY'
import sys
out = sys.argv[1]
# v3 (docs/PERF.md, run 3) and the v4 prediction: dispatch_with_permute µs, dispatch alone µs;
# v3's metadata phase (dispatch_with_permute minus the cached replay), µs.
v3 = {("bf16_t4096", 16): (364.2, 214.3), ("bf16_t4096", 24): (292.8, 199.3),
      ("bf16_t4096", 32): (257.1, 191.7), ("fp8_t4096", 24): (190.5, 145.9),
      ("bf16_t512", 24): (130.9, 45.2)}
pred = {("bf16_t4096", 16): (318, 167), ("bf16_t4096", 24): (246, 152),
        ("bf16_t4096", 32): (213, 146), ("fp8_t4096", 24): (144, 99),
        ("bf16_t512", 24): (123, 36)}
v3meta = {("bf16_t4096", 16): 56.5, ("bf16_t4096", 24): 56.4, ("bf16_t4096", 32): 54.0,
          ("bf16_t512", 24): 14.7}
arms = {"dispatch_with_permute": "dwp", "dispatch alone (no permute)": "alone",
        "combine backward (bf16 dispatch)": "cached", "combine_with_unpermute": "combine",
        "NCCL path / dispatch_with_permute": "nccl_ratio"}
print()
print("| setting | SMs | dispatch_with_permute µs (v3 / v4 predicted) | metadata µs (v3) | dispatch alone µs (v3 / pred) | cached replay µs | combine µs | NCCL path / ours |")
print("|---|---|---|---|---|---|---|---|")
for name in ["bf16_t4096", "fp8_t4096", "bf16_t512"]:
    rows = {}
    try:
        text = open(f"{out}/{name}.txt").read()
    except OSError:
        text = ""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].isdigit() and cells[1] in arms:
            rows.setdefault(int(cells[0]), {})[arms[cells[1]]] = cells[2].split(" ")[0]
    if not rows:
        print(f"| {name} | – | no result (see {name}.txt) | | | | | |")
    for sms, r in sorted(rows.items()):
        key = (name, sms)
        (v3d, v3a), (pd, pa) = v3.get(key, ("?", "?")), pred.get(key, ("?", "?"))
        meta, v3m = "–", v3meta.get(key, "–")
        if name.startswith("bf16") and "dwp" in r and "cached" in r:
            meta = f"{float(r['dwp']) - float(r['cached']):.1f}"
        print(f"| {name} | {sms} | {r.get('dwp', '?')} ({v3d} / {pd}) | {meta} ({v3m}) | "
              f"{r.get('alone', '?')} ({v3a} / {pa}) | {r.get('cached', '?')} | {r.get('combine', '?')} | "
              f"{r.get('nccl_ratio', '?')} |")
PY
echo "selftest (ep checks): $(grep -c '^PASS' "$out/selftest.txt") passed, $(grep -c '^FAIL' "$out/selftest.txt") failed"
