#!/usr/bin/env bash
# The wheel on a machine it was not built on. Installs the megamoe wheel of WHEEL_DIR into an
# empty folder and, with a bare environment (every MEGAMOE_* variable and LD_LIBRARY_PATH unset,
# no source tree or .toolchain/ in reach, an empty JIT cache so that NVRTC must compile the
# kernels), prints `megamoe.info()` and runs python/examples/serve_layer.py:
#   as-installed   the machine as it is (NVRTC from wherever the documented order finds it first);
#   torch-only     the same with /usr/local/cuda hidden (a tmpfs over it in a private mount
#                  namespace), so that NVRTC can only come from PyTorch's nvidia pip packages.
# Then the benchmarks' JSON Lines on small sizes (`bench layer --json`, `bench dispatch --json`),
# every line checked for the documented fields. Prints a summary table last.
# usage: scripts/wheel_gpu_check.sh MEGAMOE_BINARY WHEEL_DIR OUT_DIR [PYTHON]
set -uo pipefail
bin=$(realpath "$1")
wheels=$(realpath "$2")
mkdir -p "$3"
out=$(realpath "$3")
python=${4:-/opt/torch/.venv/bin/python3}
# Absolute, but not resolved: a venv's python must keep its own path.
python=$(cd "$(dirname "$python")" && pwd)/$(basename "$python")
repo=$(cd "$(dirname "$0")/.." && pwd)
scratch=$(mktemp -d /tmp/megamoe-wheel.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
summary=()
record() { summary+=("$(printf '%-22s %-5s %s' "$1" "$2" "$3")"); }

"$python" -m pip install -q --no-index --no-deps --no-compile --target "$scratch/site" \
  "$wheels"/megamoe-*.whl
# The example alone, outside the source tree; the working folder has no .toolchain/ above it.
cp "$repo/python/examples/serve_layer.py" "$scratch/"
for d in / /tmp "$scratch"; do
  [[ -e "$d/.toolchain" ]] && echo "warning: $d/.toolchain exists and is in the search" >&2
done
site_packages=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
ls "$site_packages/nvidia" > "$out/nvidia_packages.txt" 2>&1
cat > "$scratch/info.py" <<'EOF'
import sys
import megamoe
assert megamoe.__file__.startswith(sys.argv[1]), megamoe.__file__
print(megamoe.__file__)
print(megamoe.info())
EOF

# `bare NAME COMMAND...`: COMMAND in $scratch with a bare environment and its own empty caches.
bare() {
  local name=$1
  shift
  mkdir -p "$scratch/home-$name"
  (cd "$scratch" && timeout 600 env -i PATH=/usr/local/bin:/usr/bin:/bin \
    HOME="$scratch/home-$name" XDG_CACHE_HOME="$scratch/home-$name/.cache" \
    PYTHONPATH="$scratch/site" "$@")
}

# `variant NAME [unshare prefix...]`: info and the example in one environment.
variant() {
  local name=$1
  shift
  "$@" bash -c "$(declare -f bare); scratch=$scratch; $(
    [[ $# -gt 0 ]] && echo 'mount -t tmpfs tmpfs /usr/local/cuda || exit 97;'
  ) bare $name $python $scratch/info.py $scratch/site && \
    bare $name $python $scratch/serve_layer.py --tokens 64" > "$out/$name.txt" 2>&1
  local rc=$?
  local nvrtc
  nvrtc=$(grep -m1 '^nvrtc' "$out/$name.txt" | sed 's/^nvrtc *//')
  if [[ $rc -eq 97 ]]; then
    record "$name" SKIP "could not hide /usr/local/cuda (no private mount namespace)"
  elif [[ $rc -ne 0 ]]; then
    record "$name" FAIL "rc=$rc nvrtc: $nvrtc (see $name.txt)"
  elif [[ $name == torch-only && $nvrtc != *"$site_packages/nvidia/"* ]]; then
    record "$name" FAIL "NVRTC not from PyTorch's packages: $nvrtc"
  else
    record "$name" PASS "nvrtc: $nvrtc; $(grep -m1 '^diff' "$out/$name.txt")"
  fi
}
variant as-installed
variant torch-only unshare -m --propagation private

# `jsonl NAME FILE FIELDS...`: every line of FILE is a JSON object with FIELDS.
jsonl() {
  local name=$1 file=$2
  shift 2
  if "$python" - "$file" "$@" >> "$out/$name.txt" 2>&1 <<'EOF'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert lines, "no line"
for line in lines:
    cell = json.loads(line)
    missing = [f for f in sys.argv[2:] if f not in cell]
    assert not missing, f"missing {missing} in {line}"
print(f"{len(lines)} lines, arms: {sorted({json.loads(l)['arm'] for l in lines})}")
EOF
  then
    record "$name" PASS "$(tail -n1 "$out/$name.txt")"
  else
    record "$name" FAIL "$(tail -n1 "$out/$name.txt")"
  fi
}
common=(bench preset hidden intermediate experts topk ranks routing tokens arm median_us floor_us
  x_floor tflops)
timeout 300 "$bin" bench layer --preset tiny --tokens 64,256 --rounds 2 --iters 5 \
  --json "$out/layer.jsonl" > "$out/bench-layer.txt" 2>&1
echo "rc=$?" >> "$out/bench-layer.txt"
jsonl bench-layer "$out/layer.jsonl" "${common[@]}" masked valid_slots rounds iters ratio_of \
  ratio_min ratio_max lag_units
timeout 300 "$bin" bench layer --preset tiny --tokens 64 --rounds 1 --iters 3 --kernel split \
  --json - > "$out/layer-stdout.jsonl" 2> "$out/bench-layer-stdout.txt"
echo "rc=$?" >> "$out/bench-layer-stdout.txt"
jsonl bench-layer-stdout "$out/layer-stdout.jsonl" "${common[@]}"
timeout 300 "$bin" bench dispatch --preset tiny --ranks 2 --tokens 256 --iters 5 \
  --json "$out/dispatch.jsonl" > "$out/bench-dispatch.txt" 2>&1
echo "rc=$?" >> "$out/bench-dispatch.txt"
jsonl bench-dispatch "$out/dispatch.jsonl" "${common[@]}" dtype pad_multiple sms iters rounds_us \
  round_min_us round_max_us nvlink_bytes_per_gpu hbm_bytes_per_gpu nvlink_gb_per_s_per_gpu

printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
