#!/usr/bin/env bash
# Runs every benchmark on a GPU host and writes docs/benchmarks.md.
#
#   benchmarks/run_all.sh [--commit SHA] [extra memcuda_bench flags...]   (from anywhere)
#
# The document names the project commit measured: --commit SHA, else
# $MEMCUDA_COMMIT, else `git rev-parse HEAD` when this directory is the top
# of a git checkout (with "-dirty" when it has local changes). A copy of the
# tree carried to a GPU host has no .git, or sits inside some other
# repository whose HEAD is not ours: pass the commit there, e.g.
#   MEMCUDA_COMMIT=$(git rev-parse --short HEAD)   (here, before carrying it)
#
# Built here, run there: the programs, the libraries they link and a
# redis-server are copied into .gpu/ (bin/, lib/, env.sh, which puts them on
# the paths); on the GPU host, from the repository root, this script
# sources .gpu/env.sh (programs and redis-server on PATH) unless
# memcuda_bench is already on PATH. Each program starts its own private
# redis-server on a unix socket unless MEMCUDA_REDIS_URL is set.
#
# Writes its section of docs/benchmarks.md (MEMCUDA_BENCH_DOC overrides),
# between <!-- run-all:begin --> and <!-- run-all:end -->, and, when $OUT is
# set, the raw JSON, the logs and a copy of the document under $OUT.
# Budget: about 6-8 minutes on one H200 (memcuda_bench stops timing loops
# early once --budget is spent, so the run ends inside one 10-minute call).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
say() { printf 'run_all: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

commit=${MEMCUDA_COMMIT:-}
case ${1:-} in
  --commit) [[ -n ${2:-} ]] || die "--commit needs a SHA"; commit=$2; shift 2 ;;
  --commit=*) commit=${1#--commit=}; shift ;;
esac
if [[ -z $commit ]]; then
  # Only this repository's own HEAD: an enclosing repository's is not ours.
  top=$(git -C "$root" rev-parse --show-toplevel 2>/dev/null || true)
  if [[ -n $top && $(cd "$top" && pwd -P) == $(pwd -P) ]]; then
    commit=$(git -C "$root" rev-parse --short HEAD)
    git -C "$root" diff --quiet HEAD -- 2>/dev/null || commit+="-dirty"
  fi
fi
if [[ -z $commit ]]; then
  commit="unknown: no git checkout here; pass --commit SHA or MEMCUDA_COMMIT"
  say "warning: commit $commit"
fi

if ! command -v memcuda_bench >/dev/null 2>&1; then
  [[ -f .gpu/env.sh ]] || die "memcuda_bench is not on PATH and there is no .gpu/env.sh (build, then copy the programs there)"
  # shellcheck disable=SC1091
  source .gpu/env.sh
fi
command -v memcuda_bench >/dev/null 2>&1 || die "memcuda_bench not found on PATH"
command -v redis-server >/dev/null 2>&1 || [[ -n ${MEMCUDA_REDIS_URL:-} ]] || die "redis-server not on PATH and MEMCUDA_REDIS_URL unset"

out=${OUT:-$(mktemp -d /tmp/memcuda-bench.XXXXXX)}
mkdir -p "$out"
doc=${MEMCUDA_BENCH_DOC:-docs/benchmarks.md}
mkdir -p "$(dirname "$doc")"
with_timeout() {  # with_timeout SECONDS cmd...: coreutils timeout where there is one
  local s=$1; shift
  if command -v timeout >/dev/null 2>&1; then timeout --kill-after=10 "$s" "$@"; else "$@"; fi
}

# ---- the machine ----
gpu="no GPU (nvidia-smi not found)"
cuda="?"
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv 2>&1)
  cuda=$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: *[0-9.]*' | head -1 | sed 's/CUDA Version: *//')
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used,utilization.gpu,clocks.sm,clocks.mem,persistence_mode \
    --format=csv > "$out/nvidia-smi.csv" 2>&1 || true
fi
date_utc=$(date -u +%Y-%m-%dT%H:%M:%SZ)
say "device: $(echo "$gpu" | tail -n +2 | head -1); CUDA $cuda; output in $out"

rc=0
start=$(date +%s)

# ---- 1. read bandwidth through an imported mapping ----
bw_args=()
if command -v bench_bandwidth >/dev/null 2>&1; then
  say "bench_bandwidth"
  if with_timeout 90 bench_bandwidth --json "$out/bandwidth.json" > "$out/bandwidth.md" 2> "$out/bandwidth.log"; then
    bw_args=(--bandwidth-json "$out/bandwidth.json")
  else
    say "bench_bandwidth failed (exit $?); see $out/bandwidth.log"
    rc=1
  fi
  cat "$out/bandwidth.log" >&2
else
  say "bench_bandwidth not built (no nvcc at build time): bandwidth target n/a"
fi

# ---- 2. registry latency and throughput, both backends, all baselines ----
say "memcuda_bench (progress below)"
torch_script=$root/benchmarks/baselines/torch_handoff.py
{
  with_timeout 450 memcuda_bench --backend both --budget 360 --json "$out/memcuda_bench.json" \
    --torch-script "$torch_script" ${bw_args[@]+"${bw_args[@]}"} "$@" > "$out/memcuda_bench.md"
} 2>&1 | tee "$out/memcuda_bench.log" >&2
bench_rc=${PIPESTATUS[0]}
if [[ $bench_rc -ne 0 ]]; then
  say "memcuda_bench exited $bench_rc; see $out/memcuda_bench.log"
  rc=1
fi
elapsed=$(( $(date +%s) - start ))

# ---- 3. docs/benchmarks.md ----
# This script's section lies between <!-- run-all:begin --> and
# <!-- run-all:end --> (appended when absent); the rest of the file is kept
# as it is (run_model.sh and run_scale.sh write between their own markers).
{
  echo "<!-- run-all:begin -->"
  echo "## Latency and throughput"
  echo
  echo "\`benchmarks/run_all.sh\` (\`memcuda_bench --backend both --budget 360\`, \`bench_bandwidth\`),"
  echo "programs of $commit, $date_utc, run ${elapsed} s. $(uname -srm); CUDA $cuda (driver);"
  echo "GPU and driver:"
  echo
  echo '```'
  echo "$gpu"
  echo '```'
  echo
  if [[ -s $out/memcuda_bench.md ]]; then
    cat "$out/memcuda_bench.md"
  else
    echo "memcuda_bench produced no results (exit $bench_rc); its log ends with:"
    echo
    echo '```'
    tail -n 30 "$out/memcuda_bench.log" 2>/dev/null
    echo '```'
  fi
  echo "<!-- run-all:end -->"
} > "$out/run_all.md"
if [[ -f $doc ]] && grep -q '<!-- run-all:begin -->' "$doc"; then
  awk -v f="$out/run_all.md" '
    /<!-- run-all:begin -->/ { while ((getline l < f) > 0) print l; skip = 1; next }
    /<!-- run-all:end -->/ { skip = 0; next }
    !skip' "$doc" > "$doc.new" && mv "$doc.new" "$doc"
else
  { [[ -f $doc ]] && echo; cat "$out/run_all.md"; } >> "$doc"
fi
cp "$doc" "$out/benchmarks.md"
say "wrote $doc (and $out/benchmarks.md) in ${elapsed} s"
exit $rc
