#!/usr/bin/env bash
# The Python benchmarks in one run, each beside its PyTorch baselines:
# bench_get.py (a Registry.get against the torch.multiprocessing Queue
# handoff) and bench_state_dict.py (the 7B-shaped state dict opened by a
# fresh Python process against the Queue handoff and reduce_tensor + pickle).
# Prints every `row`/`skip` line (see bench_common.py) on stdout.
#
#   benchmarks/python/run.sh [--device cuda|cpu] [--scale F] [--repeat N]
#                            [--warmup N] [--get-repeat N] [--bytes N] [--python PY] [--budget S]
#
# --scale F: fraction of the full 13.5 GB state dict (default 1); --repeat:
# fresh consumers per state-dict row (default 5), after --warmup untimed ones
# (default 1); --get-repeat: iterations
# of each get row (default 200); --bytes: the tensor of bench_get (1 MiB).
# --device cpu (host backend, CPU torch tensors) is a functional check, not
# a measurement: the CTest entry python_bench_smoke runs it with small sizes.
#
# The environment the GPU host gives: MEMCUDA_LIBRARY (libmemcuda_c.so;
# unset: what the memcuda package finds itself), PYTHONPATH (unset: this
# tree's python/), MEMCUDA_REDIS_URL (unset: each script starts a private
# redis-server; .gpu/env.sh is sourced when redis-server is not on PATH),
# PYTHON or --python (default python3; the GPU hosts' has torch 2.11).
# Raw output and logs in $OUT (or a temporary folder). Exit: 0, 1 when a
# script failed or read a wrong value, 77 when every row was skipped.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$(pwd)
say() { printf 'run.sh: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 2; }

device=cuda scale=1 repeat=5 warmup=1 get_repeat=200 bytes=1048576 py=${PYTHON:-python3} budget=540
while [[ $# -gt 0 ]]; do
  case $1 in
    --device) device=${2:?}; shift 2 ;;
    --scale) scale=${2:?}; shift 2 ;;
    --repeat) repeat=${2:?}; shift 2 ;;
    --warmup) warmup=${2:?}; shift 2 ;;
    --get-repeat) get_repeat=${2:?}; shift 2 ;;
    --bytes) bytes=${2:?}; shift 2 ;;
    --python) py=${2:?}; shift 2 ;;
    --budget) budget=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ $device == cuda || $device == cpu ]] || die "--device must be cuda or cpu"
export PYTHONPATH=${PYTHONPATH:-$root/python}
export PYTHONDONTWRITEBYTECODE=1
if [[ -z ${MEMCUDA_REDIS_URL:-} ]] && ! command -v redis-server >/dev/null 2>&1 && [[ -f .gpu/env.sh ]]; then
  # shellcheck disable=SC1091
  source .gpu/env.sh
fi
command -v "$py" >/dev/null 2>&1 || { echo "skip python_benchmarks no Python interpreter: $py not found (--python PY or PYTHON)"; exit 77; }

out=${OUT:-$(mktemp -d /tmp/memcuda-pybench.XXXXXX)}
mkdir -p "$out"
with_timeout() {
  local s=$1; shift
  if command -v timeout >/dev/null 2>&1; then timeout --kill-after=10 "$s" "$@"; else "$@"; fi
}
start=$(date +%s) failed=0 rows=0 skips=0
# run NAME cmd...: prints its row/skip lines; the time limit is what is left of --budget.
run() {
  local name=$1; shift
  local left=$(( start + budget - $(date +%s) ))
  if (( left < 20 )); then
    echo "skip $name not run: run.sh's --budget ($budget s) was spent"; skips=$((skips + 1)); return
  fi
  say "$name: $*"
  with_timeout "$left" "$@" > "$out/$name.out" 2> "$out/$name.log"
  local rc=$?
  grep -E '^(#|row|skip) ' "$out/$name.out"
  rows=$(( rows + $(grep -c '^row ' "$out/$name.out") ))
  skips=$(( skips + $(grep -c '^skip ' "$out/$name.out") ))
  case $rc in
    0|77) ;;
    124|137) say "$name: timed out (budget $budget s)"; failed=1 ;;
    *) say "$name: exit $rc; see $out/$name.log"; tail -n 15 "$out/$name.log" >&2; failed=1 ;;
  esac
  grep -qE '^(row|skip) ' "$out/$name.out" || { echo "skip $name exited $rc without a row (see $out/$name.log)"; skips=$((skips + 1)); }
}

say "python $("$py" -c 'import sys; print(sys.version.split()[0])'), device $device, output in $out"
run bench_get "$py" benchmarks/python/bench_get.py --device "$device" --repeat "$get_repeat" \
  --warmup $(( get_repeat / 10 )) --bytes "$bytes"
run bench_state_dict "$py" benchmarks/python/bench_state_dict.py --device "$device" --scale "$scale" \
  --repeat "$repeat" --warmup "$warmup"
say "$rows row(s), $skips skip(s) in $(( $(date +%s) - start )) s"
(( failed )) && exit 1
(( rows == 0 )) && exit 77
exit 0
