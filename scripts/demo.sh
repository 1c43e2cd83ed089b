#!/usr/bin/env bash
# The demo command: installs what is missing, builds, and runs the quickstart
# example against a Redis server, on the GPU when there is one.
#
#   scripts/demo.sh [extra quickstart arguments]
#
# Redis: MEMCUDA_REDIS_URL when set; else the server answering at
# redis://127.0.0.1:6379; else a private redis-server on a unix socket in a
# temporary directory, without persistence, stopped when the demo ends.
# Backend: cuda when nvidia-smi lists a GPU and the build has the CUDA
# backend, host otherwise. Environment: see scripts/setup.sh.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf 'demo: %s\n' "$*"; }
die() { printf 'demo: error: %s\n' "$*" >&2; exit 1; }

build_dir=${MEMCUDA_BUILD_DIR:-build}
quickstart=$build_dir/examples/quickstart

if [[ ! -f examples/CMakeLists.txt ]]; then
  die "the quickstart example is missing: examples/CMakeLists.txt does not exist yet, so there is nothing to run (build/examples/quickstart)"
fi

scripts/setup.sh

if [[ ! -x "$quickstart" ]]; then
  die "$quickstart was not built: examples/CMakeLists.txt must define the target 'quickstart' (and MEMCUDA_BUILD_EXAMPLES must be ON in $build_dir/CMakeCache.txt)"
fi

# --- Redis ------------------------------------------------------------------
redis_pid=
redis_dir=
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
  if [[ -n "$redis_pid" ]]; then
    kill "$redis_pid" 2>/dev/null || true
    wait "$redis_pid" 2>/dev/null || true
  fi
  if [[ -n "$redis_dir" ]]; then
    rm -rf "$redis_dir"
  fi
}
trap cleanup EXIT

# True when a Redis server answers PING on 127.0.0.1:6379 without a password.
redis_on_6379() {
  if command -v redis-cli >/dev/null 2>&1; then
    [[ "$(timeout 3 redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" == PONG ]]
  else
    # shellcheck disable=SC2016  # expanded by the inner bash
    timeout 3 bash -c 'exec 3<>/dev/tcp/127.0.0.1/6379 && printf "PING\r\n" >&3 &&
      IFS= read -r line <&3 && [[ "$line" == "+PONG"* ]]' 2>/dev/null
  fi
}

start_private_redis() {
  command -v redis-server >/dev/null 2>&1 ||
    die "no Redis at redis://127.0.0.1:6379 and redis-server is not installed (apt-get install redis-server), or set MEMCUDA_REDIS_URL"
  # /tmp, not $TMPDIR: a unix socket path must stay under 108 bytes.
  redis_dir=$(mktemp -d /tmp/memcuda-demo-redis.XXXXXX)
  local sock=$redis_dir/redis.sock
  redis-server --port 0 --unixsocket "$sock" --unixsocketperm 700 \
    --save '' --appendonly no --daemonize no \
    --dir "$redis_dir" --logfile "$redis_dir/redis.log" &
  redis_pid=$!
  local i
  for ((i = 0; i < 200; i++)); do
    if ! kill -0 "$redis_pid" 2>/dev/null; then
      redis_pid=
      die "redis-server exited at start: $(tail -n 5 "$redis_dir/redis.log" 2>/dev/null)"
    fi
    if [[ -S "$sock" ]]; then
      if ! command -v redis-cli >/dev/null 2>&1 ||
        [[ "$(redis-cli -s "$sock" ping 2>/dev/null)" == PONG ]]; then
        export MEMCUDA_REDIS_URL="unix://$sock"
        return 0
      fi
    fi
    sleep 0.05
  done
  die "redis-server did not answer on $sock within 10 s"
}

if [[ -n "${MEMCUDA_REDIS_URL:-}" ]]; then
  say "Redis: $MEMCUDA_REDIS_URL (from MEMCUDA_REDIS_URL)"
elif redis_on_6379; then
  export MEMCUDA_REDIS_URL=redis://127.0.0.1:6379
  say "Redis: the server already running at $MEMCUDA_REDIS_URL"
else
  start_private_redis
  say "Redis: nothing answers at redis://127.0.0.1:6379; started a private redis-server (pid $redis_pid) at $MEMCUDA_REDIS_URL, stopped when the demo ends"
fi

# --- Backend ----------------------------------------------------------------
gpu=
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu=$(nvidia-smi -L 2>/dev/null | grep -m 1 '^GPU ' || true)
fi
cuda_build=no
if grep -qx 'MEMCUDA_WITH_CUDA:INTERNAL=ON' "$build_dir/CMakeCache.txt" 2>/dev/null; then
  cuda_build=yes
fi
if [[ -n "$gpu" && "$cuda_build" == yes ]]; then
  backend=cuda
  say "backend: cuda (${gpu%% (UUID*})"
elif [[ -n "$gpu" ]]; then
  backend=host
  say "backend: host (a GPU is present, but $build_dir was built without the CUDA backend: no nvcc found, or MEMCUDA_CUDA=OFF)"
else
  backend=host
  say "backend: host (nvidia-smi lists no GPU)"
fi

say "running $quickstart --backend $backend $*"
rc=0
"$quickstart" --backend "$backend" "$@" || rc=$?
if ((rc == 0)); then
  say "done"
else
  say "quickstart failed (exit $rc)"
fi
exit "$rc"
