#!/bin/sh
# Runs a program with a private redis-server on a unix socket:
#   c_api_with_redis.sh PROGRAM [ARGS...]
# The program gets the server's URL in MEMCUDA_TEST_REDIS_URL. Exits 77
# (skipped) when redis-server is missing. redis-server: $MEMCUDA_TEST_REDIS_SERVER,
# else PATH, as tests/support/redis_server.hpp finds it.
set -u
server=${MEMCUDA_TEST_REDIS_SERVER:-$(command -v redis-server || true)}
if [ -z "$server" ]; then
  echo "SKIPPED: redis-server not found (apt-get install redis-server, or set MEMCUDA_TEST_REDIS_SERVER)"
  exit 77
fi
dir=$(mktemp -d /tmp/memcuda-capi-XXXXXX)
sock=$dir/redis.sock
"$server" --port 0 --unixsocket "$sock" --unixsocketperm 700 --save "" --appendonly no \
  --dir "$dir" --logfile "$dir/redis.log" </dev/null >"$dir/stdout.log" 2>&1 &
pid=$!
cleanup() { kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
i=0
while [ ! -S "$sock" ]; do
  i=$((i + 1))
  if [ $i -gt 1000 ] || ! kill -0 "$pid" 2>/dev/null; then
    echo "redis-server did not start; its log:"; cat "$dir/redis.log" "$dir/stdout.log" 2>/dev/null
    exit 1
  fi
  sleep 0.01
done
MEMCUDA_TEST_REDIS_URL="unix://$sock" "$@"
