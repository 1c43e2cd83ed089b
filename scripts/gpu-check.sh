#!/usr/bin/env bash
# Runs the GPU checks on a GPU host from a .gpu/ bundle (../shared/gpu/bundle.sh):
# the [gpu] test group, the Redis-backed suite, and the examples on the cuda
# backend against a private redis-server. Logs go to $OUT when set.
set -uo pipefail
source .gpu/env.sh
out=${OUT:-/tmp}
nvidia-smi -L
rc=0
memcuda_tests '[gpu]' 2>&1 | tee "$out/gpu.log" | tail -5; rc=$((rc | ${PIPESTATUS[0]}))
dir=$(mktemp -d /tmp/memcuda-gpu.XXXXXX)
redis-server --port 0 --unixsocket "$dir/r.sock" --save '' --appendonly no --daemonize yes --logfile "$dir/log" --dir "$dir"
for i in $(seq 100); do [[ -S $dir/r.sock ]] && break; sleep 0.05; done
export MEMCUDA_REDIS_URL=unix://$dir/r.sock
for ex in "ipc_demo --backend cuda" "lifecycle_demo --backend cuda" "quickstart --backend cuda"; do
  echo "== $ex"; $ex 2>&1 | tee -a "$out/examples.log"; rc=$((rc | ${PIPESTATUS[0]}))
done
redis-cli -s "$dir/r.sock" shutdown nosave >/dev/null 2>&1
echo "gpu-check rc=$rc"
exit $rc
