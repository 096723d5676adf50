#!/bin/bash
# The reliability run on one GPU: the fault checks of the selftest alone (their deadlines are
# 200 ms), then the sanitizer session (scripts/sanitizer_session.sh, four tools at once) beside
# a soak of SOAK_SECONDS. Logs in OUT_DIR: selftest-h200-reliability.txt, soak-h200.txt,
# sanitizer-h200-{plain,memcheck,racecheck,synccheck,initcheck}.txt.
# usage: scripts/reliability_session.sh MEGAMOE_BINARY OUT_DIR
set -u
bin=$(realpath "$1")
out=$2
mkdir -p "$out"
here=$(dirname "$0")
export MEGAMOE_JIT_CACHE_DIR=${MEGAMOE_JIT_CACHE_DIR:-$(mktemp -d)}
t0=$(date +%s)
timeout 90 "$bin" selftest --only fault > "$out/selftest-h200-reliability.txt" 2>&1
echo "fault checks: rc=$? ($(( $(date +%s) - t0 )) s), $(grep -c '^PASS' "$out/selftest-h200-reliability.txt") passed, $(grep -c '^FAIL' "$out/selftest-h200-reliability.txt") failed"
grep '^FAIL' "$out/selftest-h200-reliability.txt" | cut -c1-400
san=$(mktemp -d)
SANITIZER_TIMEOUT=${SANITIZER_TIMEOUT:-120} "$here/sanitizer_session.sh" "$bin" "$san" > "$out/sanitizer-summary.txt" 2>&1 &
timeout $(( ${SOAK_SECONDS:-100} + 60 )) "$bin" soak --calls 1000000 --seconds "${SOAK_SECONDS:-100}" > "$out/soak-h200.txt" 2>&1
echo "soak: rc=$?"
wait
for f in plain memcheck racecheck synccheck initcheck; do cp "$san/$f.txt" "$out/sanitizer-h200-$f.txt"; done
cat "$out/sanitizer-summary.txt"
tail -n 6 "$out/soak-h200.txt"
echo "total $(( $(date +%s) - t0 )) s"
