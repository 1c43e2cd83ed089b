#!/usr/bin/env bash
# The demo: two processes share one tensor by name, and the `memcuda` tool
# watches. It installs what is missing, builds only the two programs it runs
# (the `memcuda` tool and examples/share_demo) into build/, Release, and
# runs them against Redis: on the GPU when there is one, in host shared
# memory otherwise. scripts/test.sh later builds the rest in the same tree.
#
#   scripts/demo.sh [--backend host|cuda]
#
# MEMCUDA_DEMO_BIN=DIR   run the prebuilt DIR/share_demo and DIR/memcuda;
#                        install and build nothing (e.g. .gpu/bin on a GPU host)
# Redis: MEMCUDA_REDIS_URL when set; else the server answering at
# redis://127.0.0.1:6379; else a private redis-server on a unix socket in a
# temporary directory, without persistence, stopped when the demo ends.
# Backend: cuda when nvidia-smi lists a GPU and the programs have the CUDA
# backend, host otherwise. Build environment: see scripts/setup.sh.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
start=$SECONDS

say() { printf 'demo: %s\n' "$*"; }
die() { printf 'demo: error: %s\n' "$*" >&2; exit 1; }

backend=
if [[ ${1:-} == --backend && -n ${2:-} ]]; then
  backend=$2
elif [[ $# -gt 0 ]]; then
  die "usage: scripts/demo.sh [--backend host|cuda]"
fi

# --- the programs -------------------------------------------------------------
if [[ -n ${MEMCUDA_DEMO_BIN:-} ]]; then
  share_demo=$MEMCUDA_DEMO_BIN/share_demo
  memcuda=$MEMCUDA_DEMO_BIN/memcuda
else
  build_dir=${MEMCUDA_BUILD_DIR:-build}
  scripts/setup.sh memcuda_cli share_demo
  share_demo=$build_dir/examples/share_demo
  memcuda=$build_dir/tools/memcuda
fi
for p in "$share_demo" "$memcuda"; do
  [[ -x $p ]] || die "$p is missing (not built, or MEMCUDA_DEMO_BIN points elsewhere)"
done

# --- cleanup: on every exit path ----------------------------------------------
tmp=$(mktemp -d /tmp/memcuda-demo.XXXXXX)  # /tmp: a unix socket path must stay under 108 bytes
children=()
# shellcheck disable=SC2317  # called by the traps
cleanup() {
  local p
  for p in ${children[@]+"${children[@]}"}; do kill "$p" 2>/dev/null || true; done
  for p in ${children[@]+"${children[@]}"}; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'die "a demo process went away"' PIPE

# --- Redis ------------------------------------------------------------------
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
  local sock=$tmp/redis.sock i
  redis-server --port 0 --unixsocket "$sock" --unixsocketperm 700 \
    --save '' --appendonly no --daemonize no \
    --dir "$tmp" --logfile "$tmp/redis.log" &
  children+=($!)
  for ((i = 0; i < 200; i++)); do
    kill -0 "${children[-1]}" 2>/dev/null ||
      die "redis-server exited at start: $(tail -n 5 "$tmp/redis.log" 2>/dev/null)"
    if [[ -S $sock ]] && { ! command -v redis-cli >/dev/null 2>&1 ||
      [[ "$(redis-cli -s "$sock" ping 2>/dev/null)" == PONG ]]; }; then
      export MEMCUDA_REDIS_URL="unix://$sock"
      return 0
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
  say "Redis: a private redis-server at $MEMCUDA_REDIS_URL, stopped when the demo ends"
fi

# --- backend ----------------------------------------------------------------
gpu=
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu=$(nvidia-smi -L 2>/dev/null | grep -m 1 '^GPU ' || true)
fi
# Built with the CUDA backend: the build's cache says so, and prebuilt
# programs link the CUDA runtime only then.
with_cuda=no
if { [[ -n ${build_dir:-} ]] && grep -qx 'MEMCUDA_WITH_CUDA:INTERNAL=ON' "$build_dir/CMakeCache.txt"; } ||
  [[ $(ldd "$share_demo" 2>/dev/null) == *libcudart* ]]; then
  with_cuda=yes
fi
if [[ -n $backend ]]; then
  say "backend: $backend (--backend)"
elif [[ -n $gpu && $with_cuda == yes ]]; then
  backend=cuda
  say "backend: cuda (${gpu%% (UUID*})"
elif [[ -n $gpu ]]; then
  backend=host
  say "backend: host (a GPU is present, but the programs were built without the CUDA backend: no nvcc found, or MEMCUDA_CUDA=OFF)"
else
  backend=host
  say "backend: host shared memory (nvidia-smi lists no GPU); on a GPU the same steps share device memory"
fi

# --- the two processes --------------------------------------------------------
# `share_demo producer` and `share_demo consumer` run in the background with
# stdin and stdout on FIFOs: `tell ROLE STEP` sends a step and prints the
# answer, up to the line "." that ends it. Errors reach the terminal directly.
name=demo/weights
declare -A to from pid
start_role() {
  local role=$1 fd
  mkfifo "$tmp/$role.in" "$tmp/$role.out"
  "$share_demo" "$role" --backend "$backend" --name "$name" <"$tmp/$role.in" >"$tmp/$role.out" &
  pid[$role]=$!
  children+=($!)
  exec {fd}>"$tmp/$role.in"
  to[$role]=$fd
  exec {fd}<"$tmp/$role.out"
  from[$role]=$fd
}
tell() {
  local role=$1 line sent=0
  trap '' PIPE  # a process that exited: an error from printf, not the end of the script
  printf '%s\n' "$2" 2>/dev/null >&"${to[$role]}" && sent=1
  trap 'die "a demo process went away"' PIPE
  ((sent)) || die "the $role (pid ${pid[$role]}) exited before '$2'"
  while IFS= read -r -t 60 line <&"${from[$role]}"; do
    [[ $line == . ]] && return 0
    printf '    %s\n' "$line"
  done
  die "the $role (pid ${pid[$role]}) stopped before finishing '$2'"
}
run() {  # run CMD...: show a command of the memcuda tool and its output
  printf '    $ memcuda %s\n' "$*"
  "$memcuda" "$@" | sed 's/^/    /'
}
finish() {  # finish ROLE: close its stdin, wait for it to exit
  local fd=${to[$1]} rc=0 keep=() c
  exec {fd}>&-
  wait "${pid[$1]}" || rc=$?
  for c in "${children[@]}"; do [[ $c == "${pid[$1]}" ]] || keep+=("$c"); done
  children=("${keep[@]}")  # reaped: nothing to kill at exit
  ((rc == 0)) || die "the $1 (pid ${pid[$1]}) exited $rc"
}
proves() { printf '\n[%s] %s\n' "$1" "$2"; }

start_role producer
start_role consumer

proves 1 "One process creates a tensor under a name."
tell producer create
proves 2 "The name is in the registry (Redis): memcuda ls, a third process, lists it."
run ls
proves 3 "Another process opens it by name and sees the same memory, not a copy."
tell consumer open
tell producer check
proves 4 "Each process holding it counts: refcount 2, and memcuda info names both holders."
printf '    $ memcuda info %s   (excerpt: it prints every field)\n' "$name"
"$memcuda" info "$name" | grep -E '^(backend|refcount|owner_pid) |^  ' | sed 's/^/    /' ||
  die "memcuda info $name failed"
proves 5 "The refcount goes down as holders let go; the tensor stays while anyone holds it."
tell producer release
run ls
proves 6 "The memory goes when the last holder lets go."
tell consumer release
finish consumer
run ls

finish producer  # its stdin closes: it exits
printf '\n'
say "done in $((SECONDS - start)) s"
