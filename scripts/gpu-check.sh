#!/usr/bin/env bash
# Runs the GPU checks on a GPU host from .gpu/, a folder of programs built
# elsewhere (bin/, lib/, a redis-server and env.sh, which puts them on the paths):
# the [gpu] test group on every GPU and on GPU 0 alone, the same under
# compute-sanitizer memcheck (all processes), and the examples on the cuda
# backend against a private redis-server. Logs go to $OUT when set.
#   scripts/gpu-check.sh [--no-sanitizer]
set -uo pipefail
source .gpu/env.sh
out=${OUT:-/tmp}
nvidia-smi -L
rc=0
step() { echo "== $*"; }
# memcuda_tests --report-skips exits 77 when cases were skipped and none
# failed: not a failure, but not a pass either. After its summary it lists
# them ("SKIPPED <n> test case(s), not passed:", then "  <case>: <why>");
# skips() prints that list under the step and keeps a line for the summary
# at the end, so a skipped cuMem case is never mistaken for a passed one.
ok77() { [[ $1 == 77 ]] && echo 0 || echo "$1"; }
skipped=0
skip_lines=()
skips() {  # skips <step label> <log>
  local n
  n=$(sed -n 's/^SKIPPED \([0-9][0-9]*\) test case(s), not passed:$/\1/p' "$2" | tail -n 1)
  [[ -n $n ]] || return 0
  echo "   SKIPPED $n case(s), not passed:"
  sed -n '/^SKIPPED [0-9][0-9]* test case(s), not passed:$/,$ s/^  \(.*\)/     \1/p' "$2"
  skipped=$((skipped + n))
  skip_lines+=("$1: $n skipped")
}
step "[gpu] tests, all GPUs"
memcuda_tests --report-skips '[gpu]' > "$out/gpu-all.log" 2>&1; r=$(ok77 $?)
grep -E '^(All tests passed|test cases:)' "$out/gpu-all.log" | tail -n 1; skips "[gpu] all GPUs" "$out/gpu-all.log"; rc=$((rc | r))
step "[gpu] tests, GPU 0 only"
CUDA_VISIBLE_DEVICES=0 memcuda_tests --report-skips '[gpu]' > "$out/gpu-one.log" 2>&1; r=$(ok77 $?)
grep -E '^(All tests passed|test cases:)' "$out/gpu-one.log" | tail -n 1; skips "[gpu] GPU 0 only" "$out/gpu-one.log"; rc=$((rc | r))

dir=$(mktemp -d /tmp/memcuda-gpu.XXXXXX)
redis-server --port 0 --unixsocket "$dir/r.sock" --save '' --appendonly no --daemonize yes --logfile "$dir/log" --dir "$dir"
for i in $(seq 100); do [[ -S $dir/r.sock ]] && break; sleep 0.05; done
export MEMCUDA_REDIS_URL=unix://$dir/r.sock
for ex in "ipc_demo --backend cuda" "lifecycle_demo --backend cuda" "quickstart --backend cuda" "cub_reduce"; do
  step "$ex"; $ex > "$out/ex.log" 2>&1; r=$?; cat "$out/ex.log" >> "$out/examples.log"; grep -v '^  ' "$out/ex.log" | tail -4; rc=$((rc | r))
done
redis-cli -s "$dir/r.sock" shutdown nosave >/dev/null 2>&1
unset MEMCUDA_REDIS_URL

# The newcomer's demo on the cuda path, from the bundle's programs (its own
# private redis-server); a stray "warn:" line is a failure.
step "scripts/demo.sh (cuda, prebuilt programs)"
MEMCUDA_DEMO_BIN=.gpu/bin scripts/demo.sh > "$out/demo.log" 2>&1; r=$?
grep -E '^demo:|^\[|refcount|GPU memory' "$out/demo.log" | head -20
if grep -q 'warn' "$out/demo.log"; then echo "demo printed a warning:"; grep 'warn' "$out/demo.log"; r=$((r | 1)); fi
rc=$((rc | r))

if [[ ${1:-} != --no-sanitizer ]] && command -v compute-sanitizer >/dev/null; then
  # API errors are not reported: one test provokes cudaErrorInvalidResourceHandle
  # on purpose (opening a handle whose exporter was killed must raise Lost).
  # The [pods] cases are left to the steps above: they start processes in
  # new namespaces (unshare, python3 with torch), which are not this
  # library's code under test and would each be instrumented too.
  step "compute-sanitizer --tool memcheck, [gpu] tests (all processes)"
  compute-sanitizer --tool memcheck --target-processes all --report-api-errors no --error-exitcode 9 \
    memcuda_tests --report-skips '[gpu]~[pods]' \
    > "$out/sanitizer.log" 2>&1; r=$(ok77 $?)
  grep -E "ERROR SUMMARY|All tests passed|test cases" "$out/sanitizer.log" | sort | uniq -c | tail -5
  skips "[gpu] under memcheck" "$out/sanitizer.log"; rc=$((rc | r))
fi
if ((skipped > 0)); then
  echo "gpu-check: $skipped GPU test case(s) SKIPPED, not passed (listed under their steps):"
  printf '  %s\n' "${skip_lines[@]}"
fi
echo "gpu-check rc=$rc skipped=$skipped"
exit $rc
