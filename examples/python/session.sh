#!/usr/bin/env bash
# One session of the Python examples, the way a person types it in two
# shells: a PyTorch producer publishes the model tiny/ by name (and versions
# of it), and a PyTorch consumer started on its own opens it by name, checks
# its values and waits for each next version. Each command is echoed with a
# `$ ` prompt, each output line is prefixed with its shell.
#
#   examples/python/session.sh [--device cuda|cpu] [--versions 3] [--python PY]
#
# Device: cuda when torch sees a GPU and libmemcuda_c has CUDA, else cpu
# (the host backend). Redis: $MEMCUDA_REDIS_URL, else a private redis-server
# (shown as the first command). Environment: PYTHONPATH (unset: this tree's
# python/), MEMCUDA_LIBRARY (unset: what the memcuda package finds). Exits
# 77 (skipped) without torch, memcuda or redis-server; 1 when either side failed.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
py=${PYTHON:-python3} device="" versions=3
while [[ $# -gt 0 ]]; do
  case $1 in
    --device) device=${2:?}; shift 2 ;;
    --versions) versions=${2:?}; shift 2 ;;
    --python) py=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "session.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
export PYTHONPATH=${PYTHONPATH:-$(pwd)/python} PYTHONDONTWRITEBYTECODE=1
skip() { echo "SKIPPED: $*"; exit 77; }
why=$("$py" -c 'import torch, memcuda' 2>&1 | tail -1) || skip "$py cannot import torch and memcuda: $why"
if [[ -z $device ]]; then
  device=$("$py" -c 'import torch, memcuda; print("cuda" if torch.cuda.is_available() and memcuda.has_cuda() else "cpu")')
fi

dir=$(mktemp -d /tmp/memcuda-session.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
show() { printf '%s $ %s\n' "$1" "$2"; }
prefixed() { sed -u "s/^/$1 | /"; }

if [[ -z ${MEMCUDA_REDIS_URL:-} ]]; then
  command -v redis-server >/dev/null 2>&1 || skip "redis-server not found and MEMCUDA_REDIS_URL not set"
  show "shell 0" "redis-server --port 0 --unixsocket $dir/redis.sock --save '' &"
  redis-server --port 0 --unixsocket "$dir/redis.sock" --save "" --appendonly no --dir "$dir" \
    --logfile "$dir/redis.log" </dev/null >/dev/null 2>&1 &
  pids+=($!)
  for _ in $(seq 500); do [[ -S $dir/redis.sock ]] && break; sleep 0.01; done
  sleep 0.1  # the socket file appears at bind(), just before listen()
  show "shell 0" "export MEMCUDA_REDIS_URL=unix://$dir/redis.sock"
  export MEMCUDA_REDIS_URL=unix://$dir/redis.sock
fi
echo

show "shell 1" "python3 examples/python/producer.py --device $device --versions $versions"
"$py" examples/python/producer.py --device "$device" --versions "$versions" 2>&1 | prefixed "shell 1" &
producer=$!
pids+=($producer)
sleep 1  # the person switches to the other shell
show "shell 2" "python3 examples/python/consumer.py --versions $versions"
"$py" examples/python/consumer.py --versions "$versions" 2>&1 | prefixed "shell 2"
consumer_rc=${PIPESTATUS[0]}
wait "$producer"
producer_rc=$?
echo
echo "producer exit $producer_rc, consumer exit $consumer_rc (device $device)"
(( producer_rc == 0 && consumer_rc == 0 )) || exit 1
exit 0
