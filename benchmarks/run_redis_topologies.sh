#!/usr/bin/env bash
# The hot rows of memcuda_bench (create, warm get, get+release from N
# processes) through three Redis topologies side by side: one server
# (redis://, TCP loopback), a primary with two replicas behind three
# sentinels (redis+sentinel://) and a Redis Cluster of three primaries with
# a replica each (redis+cluster://). All are started here on free loopback
# ports in a temporary folder and stopped on exit.
#
#   benchmarks/run_redis_topologies.sh [--bin DIR] [--backend host|cuda]
#       [--sizes 4KiB] [--clients 16] [--rounds 1] [-- extra memcuda_bench flags]
#
# Programs: DIR/memcuda_bench (default build/benchmarks); redis-server and
# redis-cli from $MEMCUDA_REDIS_SERVER / $MEMCUDA_REDIS_CLI, else PATH.
# --rounds N runs the three N times, interleaved, and keeps each row's best
# (the least disturbed by whatever else the machine runs). Prints one
# Markdown table: each row per topology, and sentinel and cluster as a cost
# relative to the direct connection (time per operation: 1.00 is the same,
# 1.05 is 5% slower); last, the sentinel's primary through redis:// (the
# same server with its replicas, without Sentinel in the client), which
# tells the client's cost from the server's. JSON and logs stay in $OUT
# (or a temporary folder).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
bin=build/benchmarks backend=host sizes=4KiB clients=16 rounds=1 extra=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --bin) bin=${2:?}; shift 2 ;;
    --backend) backend=${2:?}; shift 2 ;;
    --sizes) sizes=${2:?}; shift 2 ;;
    --clients) clients=${2:?}; shift 2 ;;
    --rounds) rounds=${2:?}; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "run_redis_topologies: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
server=${MEMCUDA_REDIS_SERVER:-$(command -v redis-server)}
cli=${MEMCUDA_REDIS_CLI:-$(command -v redis-cli)}
bench=$bin/memcuda_bench
[[ -x $bench ]] || { echo "run_redis_topologies: no $bench (build the target memcuda_bench)" >&2; exit 2; }

tmp=$(mktemp -d) out=${OUT:-$tmp}
pids=()
stop() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap stop EXIT

# 19 free ports below 55535 (a cluster node's bus is its port + 10000 unless
# set: here each has its own), held together while picked.
mapfile -t free < <(python3 -c '
import socket
ss = []
while len(ss) < 19:
    s = socket.socket(); s.bind(("127.0.0.1", 0))
    if s.getsockname()[1] <= 55535: ss.append(s)
    else: s.close()
print("\n".join(str(s.getsockname()[1]) for s in ss))')
k=0
# start NAME PORT [--sentinel] [config lines...]: a server in a folder of its own.
start() {
  local name=$1 p=$2 mode=(); shift 2
  [[ ${1:-} == --sentinel ]] && { mode=(--sentinel); shift; }
  mkdir -p "$tmp/$name"
  printf '%s\n' "bind 127.0.0.1" "port $p" "dir $tmp/$name" "logfile $tmp/$name/log" "$@" >"$tmp/$name/redis.conf"
  "$server" "$tmp/$name/redis.conf" "${mode[@]}" &
  pids+=($!)
  for _ in $(seq 100); do "$cli" -p "$p" ping >/dev/null 2>&1 && return; sleep 0.1; done
  echo "run_redis_topologies: $name did not start: $(tail -3 "$tmp/$name/log")" >&2; exit 1
}
until_ok() {  # until_ok WHAT COMMAND...: up to 30 s
  for _ in $(seq 300); do "${@:2}" >/dev/null 2>&1 && return; sleep 0.1; done
  echo "run_redis_topologies: $1 not reached" >&2; exit 1
}

data=("save \"\"" "appendonly no")
direct=${free[k++]}; start direct "$direct" "${data[@]}"

primary=${free[k++]}; start primary "$primary" "${data[@]}"
for i in 1 2; do start "replica$i" "${free[k++]}" "${data[@]}" "replicaof 127.0.0.1 $primary"; done
sentinels=()
for i in 1 2 3; do
  p=${free[k++]}; sentinels+=("127.0.0.1:$p")
  start "sentinel$i" "$p" --sentinel "sentinel monitor mc 127.0.0.1 $primary 2" \
    "sentinel down-after-milliseconds mc 5000"
done
until_ok "two replicas in sync" bash -c "'$cli' -p $primary info replication | grep -q connected_slaves:2"

nodes=()
for i in 1 2 3 4 5 6; do
  p=${free[k++]}; nodes+=("127.0.0.1:$p")
  start "node$i" "$p" "${data[@]}" "cluster-enabled yes" "cluster-config-file nodes.conf" "cluster-node-timeout 5000" \
    "cluster-port ${free[k++]}"
done
"$cli" --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >"$tmp/cluster-create.log" 2>&1
for n in "${nodes[@]}"; do
  until_ok "cluster_state:ok on $n" bash -c "'$cli' -p ${n#*:} cluster info | grep -q cluster_state:ok"
done

declare -A url=(
  [direct]="redis://127.0.0.1:$direct"
  [sentinel]="redis+sentinel://$(IFS=,; echo "${sentinels[*]}")/mc"
  [cluster]="redis+cluster://${nodes[0]},${nodes[1]}"
  [primary]="redis://127.0.0.1:$primary"
)
for r in $(seq "$rounds"); do
  for t in direct sentinel cluster primary; do
    echo "run_redis_topologies: round $r, $t (${url[$t]})" >&2
    "$bench" --url "${url[$t]}" --hot --backend "$backend" --sizes "$sizes" --clients "$clients" --no-torch \
      --json "$out/$t-$r.json" "${extra[@]}" >"$out/$t-$r.md" 2>"$out/$t-$r.log" ||
      { echo "run_redis_topologies: memcuda_bench failed on $t: $(tail -5 "$out/$t-$r.log")" >&2; exit 1; }
  done
done

python3 - "$out" "$rounds" "$clients" <<'EOF'
import json, sys
out, rounds, clients = sys.argv[1], int(sys.argv[2]), int(sys.argv[3].split(",")[-1])
rows = [("create_leader", 1, "create (in the allocator of record), p50 us"),
        ("create_follower", 1, "create (from another process), p50 us"),
        ("get_warm", 1, "get (allocation already mapped), p50 us"),
        ("release", 1, "release (not the last handle), p50 us"),
        ("get_release_tput", clients, f"get+release, {clients} processes, ops/s")]
best = {}
tops = ("direct", "sentinel", "cluster", "primary")
for t in tops:
    for r in range(1, rounds + 1):
        for x in json.load(open(f"{out}/{t}-{r}.json"))["results"]:
            for op, procs, _ in rows:
                if x["op"] == op and x["procs"] == procs:
                    v = x["ops_per_s"] if op.endswith("tput") else x["p50_us"]
                    k = (t, op)
                    better = max if op.endswith("tput") else min
                    best[k] = better(best.get(k, v), v)
print("| row | direct | sentinel | cluster | sentinel / direct | cluster / direct | sentinel's primary, redis:// | sentinel / its primary |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for op, _, label in rows:
    d, s, c, p = (best.get((t, op)) for t in tops)
    if None in (d, s, c, p):
        print(f"| {label} | {d} | {s} | {c} | - | - | {p} | - |")
        continue
    cost = (lambda x, b: b / x) if op.endswith("tput") else (lambda x, b: x / b)
    fmt = (lambda v: f"{v:,.0f}") if op.endswith("tput") else (lambda v: f"{v:.1f}")
    print(f"| {label} | {fmt(d)} | {fmt(s)} | {fmt(c)} | {cost(s, d):.2f} | {cost(c, d):.2f} | {fmt(p)} | "
          f"{cost(s, p):.2f} |")
EOF
