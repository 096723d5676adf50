# Shared by the GPU session scripts (sourced): an empty JIT cache, so compiling the kernels is
# part of the session as on a fresh machine, and `step NAME TIMEOUT_S ARGS...`, which runs
# `$bin ARGS...` into "$out/NAME.txt" under a timeout and logs its exit code and time to
# "$out/steps.txt" (`run_step NAME TIMEOUT_S COMMAND...` for any other command). The caller
# sets `bin` and `out`.
export MEGAMOE_JIT_CACHE_DIR
MEGAMOE_JIT_CACHE_DIR=$(mktemp -d)
trap 'rm -rf "$MEGAMOE_JIT_CACHE_DIR"' EXIT
# `wheel_site WHEEL_DIR PYTHON`: installs the wheels of WHEEL_DIR (the package's, pytest's) into
# a scratch folder for PYTHON and prints the folder (for PYTHONPATH).
wheel_site() {
  local site
  site=$(mktemp -d)
  "$2" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$1"/*.whl
  echo "$site"
}
# `run_step NAME TIMEOUT_S COMMAND...`: the same for any command.
run_step() {
  local name=$1 limit=$2
  shift 2
  local t0
  t0=$(date +%s%N)
  timeout "$limit" "$@" > "$out/$name.txt" 2>&1
  local rc=$?
  printf '%-14s rc=%-3s %6d ms  %s\n' "$name" "$rc" $(( ($(date +%s%N) - t0) / 1000000 )) "$*" \
    | tee -a "$out/steps.txt"
}
step() {
  local name=$1 limit=$2
  shift 2
  run_step "$name" "$limit" "$bin" "$@"
}
