#!/usr/bin/env bash
# Issue 12's model rows, side by side in one run: memcuda_bench_model (the
# mem-cuda side) and the PyTorch baselines (benchmarks/baselines/torch_model_*.py)
# on the same Llama-2-7B-shaped bf16 state dict (291 tensors, 13.5 GB); prints
# a Markdown table with the ratios and writes it into docs/benchmarks.md.
#
#   benchmarks/run_model.sh [--small | --scale N] [--reps N] [--warmup N]
#                           [--bin DIR] [--python PY] [--device N]
#                           [--backend auto|host|cuda] [--torch-device cuda|cpu]
#                           [--consumers 8] [--doc FILE | --no-doc] [--commit SHA]
#
# Programs: --bin DIR (or MEMCUDA_BENCH_BIN=DIR) runs the prebuilt
# DIR/memcuda_bench_model, like MEMCUDA_DEMO_BIN for scripts/demo.sh; else
# memcuda_bench_model on PATH; else .gpu/env.sh is sourced (what
# ../shared/gpu/bundle.sh packs: `MEMCUDA_BENCH_BIN=.gpu/bin` works too);
# else the first build*/benchmarks/memcuda_bench_model of this tree.
# redis-server must be on PATH (or MEMCUDA_REDIS_URL set). Python: --python,
# else $PYTHON, else python3 (the GPU hosts' python3 has torch 2.11); the
# baselines need only the standard library and torch.
#
# Whatever cannot run is a `skip` with its reason in the table (no GPU, no
# torch, no redis-server), never a number. --torch-device cpu runs the
# baselines on CPU tensors: a check of the scripts, not a baseline.
# Goals apply to the full-size state dict only (--scale 1, the cuda default).
#
# Output: the table on stdout; raw rows and logs in $OUT (or a temporary
# folder); the section between <!-- model-rows:begin --> and
# <!-- model-rows:end --> of docs/benchmarks.md replaced (appended when
# absent). benchmarks/run_all.sh rewrites that whole file: run this after it.
# Budget: about 3-5 minutes on one H200 (each PyTorch consumer is a fresh
# Python process that imports torch).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
say() { printf 'run_model: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 2; }

scale_args=() reps=5 warmup=1 bin=${MEMCUDA_BENCH_BIN:-} py=${PYTHON:-} device=0 backend=auto
torch_device="" consumers=8 doc=docs/benchmarks.md commit=${MEMCUDA_COMMIT:-}
while [[ $# -gt 0 ]]; do
  case $1 in
    --small) scale_args=(--small); shift ;;
    --scale) scale_args=(--scale "${2:?--scale needs N}"); shift 2 ;;
    --reps) reps=${2:?}; shift 2 ;;
    --warmup) warmup=${2:?}; shift 2 ;;
    --bin) bin=${2:?}; shift 2 ;;
    --python) py=${2:?}; shift 2 ;;
    --device) device=${2:?}; shift 2 ;;
    --backend) backend=${2:?}; shift 2 ;;
    --torch-device) torch_device=${2:?}; shift 2 ;;
    --consumers) consumers=${2:?}; shift 2 ;;
    --doc) doc=${2:?}; shift 2 ;;
    --no-doc) doc=""; shift ;;
    --commit) commit=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
case $torch_device in
  "") torch_device=$device ;;
  cuda) torch_device=$device ;;
  cpu) ;;
  *) die "--torch-device must be cuda or cpu" ;;
esac

# ---- the programs ----
bench=""
if [[ -n $bin ]]; then
  bench=$bin/memcuda_bench_model
  [[ -x $bench ]] || die "$bench is missing (not built, or --bin/MEMCUDA_BENCH_BIN points elsewhere)"
  [[ -f $bin/../env.sh ]] && ! command -v redis-server >/dev/null 2>&1 && source "$bin/../env.sh"
elif command -v memcuda_bench_model >/dev/null 2>&1; then
  bench=$(command -v memcuda_bench_model)
elif [[ -f .gpu/env.sh ]]; then
  # shellcheck disable=SC1091
  source .gpu/env.sh
  bench=$(command -v memcuda_bench_model || true)
fi
if [[ -z $bench ]]; then
  for b in build/benchmarks/memcuda_bench_model build*/benchmarks/memcuda_bench_model; do
    [[ -x $b ]] && { bench=$root/$b; break; }
  done
fi
[[ -n $py ]] || py=python3
command -v "$py" >/dev/null 2>&1 || py=""
baselines=$root/benchmarks/baselines

if [[ -z $commit ]]; then
  top=$(git -C "$root" rev-parse --show-toplevel 2>/dev/null || true)
  if [[ -n $top && $(cd "$top" && pwd -P) == $(pwd -P) ]]; then
    commit=$(git -C "$root" rev-parse --short HEAD)
    git -C "$root" diff --quiet HEAD -- 2>/dev/null || commit+="-dirty"
  else
    commit="unknown (no git checkout here: pass --commit SHA or MEMCUDA_COMMIT)"
  fi
fi

out=${OUT:-$(mktemp -d /tmp/memcuda-model.XXXXXX)}
mkdir -p "$out"
rows=$out/model.rows
: > "$rows"
with_timeout() {
  local s=$1; shift
  if command -v timeout >/dev/null 2>&1; then timeout --kill-after=10 "$s" "$@"; else "$@"; fi
}
# run NAME SECONDS cmd...: its `row`/`skip` lines into $rows; a program that
# printed none gets a skip for every row it owns (listed in $owns).
run() {
  local name=$1 secs=$2; shift 2
  say "$name: $*"
  with_timeout "$secs" "$@" > "$out/$name.out" 2> "$out/$name.log"
  local rc=$?
  grep -E '^(row|skip) ' "$out/$name.out" >> "$rows"
  case $rc in
    0) ;;
    77) say "$name: skipped (exit 77): $(grep -m1 '^skip ' "$out/$name.out" | cut -d' ' -f3-)" ;;
    124|137) say "$name: timed out after $secs s"; failed=1 ;;
    *) say "$name: exit $rc; see $out/$name.log"; tail -n 15 "$out/$name.log" >&2; failed=1 ;;
  esac
  for r in $owns; do
    grep -qE "^(row|skip) $r " "$rows" || echo "skip $r $name exited $rc without this row (see $name.log)" >> "$rows"
  done
}
failed=0
start=$(date +%s)
common=(--reps "$reps" --warmup "$warmup" ${scale_args[@]+"${scale_args[@]}"})

owns="memcuda_publish_leader memcuda_publish_other memcuda_open_fresh memcuda_pool_ratio"
if [[ -n $bench ]]; then
  run memcuda_bench_model 900 "$bench" --backend "$backend" --device "$device" "${common[@]}"
else
  for r in $owns; do echo "skip $r memcuda_bench_model not found (--bin DIR, PATH, .gpu/env.sh or build*/benchmarks)" >> "$rows"; done
fi

suffix=""; [[ $torch_device == cpu ]] && suffix=_cpu
torch_scripts=(torch_model_handoff torch_model_empty torch_model_reshare)
declare -A torch_rows=(
  [torch_model_handoff]="torch_queue_handoff torch_reduce_pickle"
  [torch_model_empty]="torch_empty_cold torch_empty_reduce_cold torch_empty_cached"
  [torch_model_reshare]="torch_reshare_queue torch_reshare_pickle")
for s in "${torch_scripts[@]}"; do
  owns=""
  for r in ${torch_rows[$s]}; do owns+="$r$suffix "; done
  extra=(); [[ $s == torch_model_reshare ]] && extra=(--consumers "$consumers")
  if [[ -z $py ]]; then
    for r in $owns; do echo "skip $r no python3 on PATH (--python PY)" >> "$rows"; done
  else
    run "$s" 600 "$py" "$baselines/$s.py" --device "$torch_device" "${common[@]}" "${extra[@]}"
  fi
done
elapsed=$(( $(date +%s) - start ))

# ---- the table ----
machine="no GPU (nvidia-smi not found)"
command -v nvidia-smi >/dev/null 2>&1 && machine=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)
torch_v=$([[ -n $py ]] && "$py" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "not importable")
scale=1
[[ ${scale_args[0]:-} == --small ]] && scale=64
[[ ${scale_args[0]:-} == --scale ]] && scale=${scale_args[1]}
backend_used=$(grep -m1 -o 'backend=[a-z]*' "$rows" | cut -d= -f2)
[[ -z $backend_used && $backend == auto ]] && backend_used="?"
[[ -z $backend_used ]] && backend_used=$backend
[[ $backend_used == host && $scale == 1 && -z ${scale_args[0]:-} ]] && scale="8 (memcuda_bench_model's host default; the PyTorch rows are full size)"

table=$(awk -v scale="$scale" -v suffix="$suffix" '
  $1 == "row"  { med[$2] = $3; mn[$2] = $4; line[$2] = $0 }
  $1 == "skip" { why[$2] = substr($0, length($1) + length($2) + 3) }
  function cell(r) {
    if (r == "") return "-"
    if (r in med) return sprintf("%s (%s)", med[r], mn[r])
    if (r in why) return "skipped: " why[r]
    return "not measured"
  }
  function ratio(m, b) {
    if (!(m in med) || !(b in med) || med[m] <= 0) return "-"
    x = med[b] / med[m]
    return x >= 1 ? sprintf("%.1fx faster", x) : sprintf("%.2fx (slower)", x)
  }
  function status(m, goal_ms, b, min_x,   ok) {
    if (scale != "1") return "n/a (scaled run)"
    if (!(m in med)) return "not measured"
    ok = med[m] <= goal_ms
    if (b != "" && (b in med) && min_x > 0) ok = ok && (med[b] / med[m] >= min_x)
    if (b != "" && !(b in med) && min_x > 0) return (ok ? "time met, ratio unmeasured" : "missed")
    return ok ? "met" : "missed"
  }
  function out(scen, m, b, goal, st) {
    printf "| %s | %s | %s | %s | %s | %s | %s |\n", scen, (m == "" ? "-" : m), cell(m), (b == "" ? "-" : b), cell(b), ratio(m, b), goal " | " st
  }
  END {
    print "| scenario | mem-cuda row | mem-cuda ms, median (min) | baseline row | baseline ms, median (min) | ratio (p50) | goal | status |"
    print "| --- | --- | ---: | --- | ---: | --- | --- | --- |"
    q = "torch_queue_handoff" suffix; p = "torch_reduce_pickle" suffix
    out("state dict opened by a fresh consumer until every tensor is usable", "memcuda_open_fresh", q, "<= 5 ms, >= 10x PyTorch", status("memcuda_open_fresh", 5, q, 10))
    out("(same)", "memcuda_open_fresh", p, "<= 5 ms, >= 10x PyTorch", status("memcuda_open_fresh", 5, p, 10))
    e = "torch_empty_cold" suffix
    out("state dict published from scratch by the allocator of record (no data fill)", "memcuda_publish_leader", e, "<= 50 ms", status("memcuda_publish_leader", 50, "", 0))
    out("(same; PyTorch plus the IPC export a sharing producer needs)", "memcuda_publish_leader", "torch_empty_reduce_cold" suffix, "<= 50 ms", status("memcuda_publish_leader", 50, "", 0))
    out("(same; PyTorch caching allocator warm)", "memcuda_publish_leader", "torch_empty_cached" suffix, "-", "-")
    out("state dict published by another process", "memcuda_publish_other", "", "<= 100 ms", status("memcuda_publish_other", 100, "", 0))
    rq = "torch_reshare_queue" suffix; rp = "torch_reshare_pickle" suffix
    out("in-place update observed by all consumers", "memcuda_inplace_update", rq, "<= 1 ms", status("memcuda_inplace_update", 1, "", 0))
    out("(same)", "memcuda_inplace_update", rp, "<= 1 ms", status("memcuda_inplace_update", 1, "", 0))
    pr = "memcuda_pool_ratio"
    st = (scale != "1") ? "n/a (scaled run)" : ((pr in med) ? (med[pr] <= 1.10 ? "met" : "missed") : "not measured")
    printf "| pool reserved / in use, state dict live | %s | %s (ratio) | - | - | - | <= 1.10 | %s |\n", pr, cell(pr), st
  }' "$rows")

section=$(cat <<EOF
<!-- model-rows:begin -->
## Model rows (issue 12): a Llama-2-7B-shaped state dict, mem-cuda beside PyTorch

Written by \`benchmarks/run_model.sh\` on $(date -u +%Y-%m-%dT%H:%M:%SZ) (commit $commit, run ${elapsed} s).
Machine: $machine; torch $torch_v; mem-cuda backend $backend_used; scale $scale (1 = 291 bf16 tensors,
13.5 GB); $reps repetitions after $warmup warm-up; in-place update with $consumers PyTorch consumers.
Times are milliseconds, median (min) over the repetitions; ratio = baseline median / mem-cuda median.

$table

Raw rows (\`row <name> <median> <min> n=<runs> ...\`, \`skip <name> <reason>\`):

\`\`\`
$(cat "$rows")
\`\`\`
<!-- model-rows:end -->
EOF
)
printf '%s\n' "$section" > "$out/model.md"
printf '%s\n' "$section"

if [[ -n $doc ]]; then
  mkdir -p "$(dirname "$doc")"
  if [[ -f $doc ]] && grep -q '<!-- model-rows:begin -->' "$doc"; then
    # Replace the old section in place, keep everything around it.
    awk -v f="$out/model.md" '
      /<!-- model-rows:begin -->/ { while ((getline l < f) > 0) print l; skip = 1; next }
      /<!-- model-rows:end -->/ { skip = 0; next }
      !skip' "$doc" > "$doc.tmp" && mv "$doc.tmp" "$doc"
  else
    { [[ -f $doc ]] && echo; cat "$out/model.md"; } >> "$doc"
  fi
  say "wrote the model section of $doc"
fi
say "rows and logs in $out (${elapsed} s)"
exit $failed
