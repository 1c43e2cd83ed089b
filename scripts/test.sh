#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs the whole test
# suite and exits with CTest's status. It builds into the same tree as
# scripts/demo.sh (build/, Release), so what the demo built is not built again.
#
#   scripts/test.sh [extra ctest arguments, e.g. -R redis or -L packaging]
#
# Needs no GPU and no running Redis: the tests start private redis-servers,
# and the GPU group reports itself skipped where there is no CUDA device.
# Environment: see scripts/setup.sh (MEMCUDA_BUILD_DIR, MEMCUDA_CUDA, ...);
# MEMCUDA_TEST_JOBS sets CTest's parallelism (default: nproc).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
start=$SECONDS

scripts/setup.sh

build_dir=${MEMCUDA_BUILD_DIR:-build}
jobs=${MEMCUDA_TEST_JOBS:-$(nproc 2>/dev/null || echo 2)}
log=$build_dir/Testing/test-sh.log
mkdir -p "$build_dir/Testing"

cuda=off
if grep -qx 'MEMCUDA_WITH_CUDA:INTERNAL=ON' "$build_dir/CMakeCache.txt" 2>/dev/null; then
  cuda=on
fi
printf 'test: ctest in %s with %s jobs (CUDA backend %s)\n' "$build_dir" "$jobs" "$cuda"

# --no-tests=error: a build that defines no tests is a failure, not a pass.
set +e
ctest --test-dir "$build_dir" --output-on-failure --no-tests=error -j "$jobs" "$@" 2>&1 |
  tee "$log"
statuses=("${PIPESTATUS[@]}")
set -e
rc=${statuses[0]}

summary=$(grep -E '^[0-9]+% tests passed' "$log" | tail -n 1 || true)
skipped=$(grep -c '\*\*\*Skipped' "$log" || true)
elapsed=$((SECONDS - start))
if [[ -z "$summary" ]]; then
  summary="ctest printed no summary (see $log)"
fi
if ((rc == 0)); then
  printf 'test: PASS: %s; %s skipped; %d s\n' "$summary" "$skipped" "$elapsed"
else
  printf 'test: FAIL (ctest exit %d): %s; %s skipped; %d s\n' "$rc" "$summary" "$skipped" "$elapsed"
fi
exit "$rc"
