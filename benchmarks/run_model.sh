#!/usr/bin/env bash
# The model rows, side by side in one run: memcuda_bench_model (the
# mem-cuda side) and the PyTorch baselines (benchmarks/baselines/torch_model_*.py)
# on the same Llama-2-7B-shaped bf16 state dict (291 tensors, 13.5 GB); prints
# a Markdown table with the ratios and writes it into docs/benchmarks.md.
#
#   benchmarks/run_model.sh [--small | --scale N] [--reps N] [--warmup N]
#                           [--bin DIR] [--python PY] [--device N]
#                           [--backend auto|host|cuda] [--torch-device cuda|cpu]
#                           [--consumers 8] [--doc FILE | --no-doc] [--commit SHA]
#                           [--budget 540]
#   benchmarks/run_model.sh --template    (the section, numbers "to be measured", nothing run)
#
# Programs: --bin DIR (or MEMCUDA_BENCH_BIN=DIR) runs the prebuilt
# DIR/memcuda_bench_model, like MEMCUDA_DEMO_BIN for scripts/demo.sh; else
# memcuda_bench_model on PATH; else .gpu/env.sh is sourced (a folder of
# prebuilt programs: `MEMCUDA_BENCH_BIN=.gpu/bin` works too);
# else the newest build*/benchmarks/memcuda_bench_model of this tree.
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
# absent).
# Budget: about 3-5 minutes on one H200 (each PyTorch consumer is a fresh
# Python process that imports torch). --budget S (default 540) caps the
# whole run, so that it ends inside one 10-minute command: each program's
# time limit is what is left of it (at most its own cap), and a program
# that would start with under 20 s left is skipped with that reason.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
say() { printf 'run_model: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 2; }

scale_args=() reps=5 warmup=1 bin=${MEMCUDA_BENCH_BIN:-} py=${PYTHON:-} device=0 backend=auto
torch_device="" consumers=8 doc=docs/benchmarks.md commit=${MEMCUDA_COMMIT:-} template=0 budget=540
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
    --template) template=1; shift ;;
    --budget) budget=${2:?}; shift 2 ;;
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
  # A folder of prebuilt programs' bin/: its ../env.sh puts the libraries
  # the programs link and redis-server on the paths.
  # shellcheck disable=SC1091
  [[ -f $bin/../env.sh ]] && source "$bin/../env.sh"
elif command -v memcuda_bench_model >/dev/null 2>&1; then
  bench=$(command -v memcuda_bench_model)
elif [[ -f .gpu/env.sh ]]; then
  # shellcheck disable=SC1091
  source .gpu/env.sh
  bench=$(command -v memcuda_bench_model || true)
fi
if [[ -z $bench ]]; then
  # The newest of this tree's build folders (build/, build-*/).
  b=$(ls -t build*/benchmarks/memcuda_bench_model 2>/dev/null | head -1)
  [[ -n $b && -x $b ]] && bench=$root/$b
fi
[[ -n $py ]] || py=python3
py_asked=$py
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
  local left=$(( start + budget - $(date +%s) ))
  if (( left < 20 )); then
    say "$name: not run: the --budget of $budget s is spent"
    for r in $owns; do echo "skip $r not run: run_model.sh's --budget ($budget s) was spent" >> "$rows"; done
    return
  fi
  (( secs > left - 5 )) && secs=$(( left - 5 ))
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

owns="memcuda_publish_leader memcuda_publish_other memcuda_open_fresh memcuda_open_fresh_dict memcuda_pool_ratio"
if [[ $template == 1 ]]; then
  :
elif [[ -n $bench ]]; then
  run memcuda_bench_model 300 "$bench" --backend "$backend" --device "$device" "${common[@]}"
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
  if [[ $template == 1 ]]; then
    :
  elif [[ -z $py ]]; then
    for r in $owns; do echo "skip $r no Python interpreter: $py_asked not found (--python PY or PYTHON)" >> "$rows"; done
  else
    run "$s" 300 "$py" "$baselines/$s.py" --device "$torch_device" "${common[@]}" "${extra[@]}"
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

table=$(awk -v scale="$scale" -v suffix="$suffix" -v tmpl="$template" '
  $1 == "row"  { med[$2] = $3; mn[$2] = $4; line[$2] = $0 }
  $1 == "skip" { why[$2] = substr($0, length($1) + length($2) + 3) }
  function cell(r) {
    if (r == "") return "-"
    if (r in med) return sprintf("%s (%s)", med[r], mn[r])
    if (r in why) return "skipped: " why[r]
    return tmpl ? "to be measured on H200" : "not measured"
  }
  function ratio(m, b) {
    if (!(m in med) || !(b in med) || med[m] <= 0) return "-"
    x = med[b] / med[m]
    return x >= 1 ? sprintf("%.1fx faster", x) : sprintf("%.2fx (slower)", x)
  }
  function status(m, goal_ms, b, min_x,   ok) {
    if (tmpl) return "-"
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
    out("(same, through its state-dict record: one reference)", "memcuda_open_fresh_dict", q, "<= 5 ms, >= 10x PyTorch", status("memcuda_open_fresh_dict", 5, q, 10))
    out("(same)", "memcuda_open_fresh_dict", p, "<= 5 ms, >= 10x PyTorch", status("memcuda_open_fresh_dict", 5, p, 10))
    e = "torch_empty_cold" suffix
    out("state dict published from scratch by the allocator of record (no data fill)", "memcuda_publish_leader", e, "<= 50 ms", status("memcuda_publish_leader", 50, "", 0))
    out("(same; PyTorch plus the IPC export a sharing producer needs)", "memcuda_publish_leader", "torch_empty_reduce_cold" suffix, "<= 50 ms", status("memcuda_publish_leader", 50, "", 0))
    out("(same; PyTorch caching allocator warm)", "memcuda_publish_leader", "torch_empty_cached" suffix, "-", "-")
    out("state dict published by another process", "memcuda_publish_other", "", "<= 100 ms", status("memcuda_publish_other", 100, "", 0))
    rq = "torch_reshare_queue" suffix; rp = "torch_reshare_pickle" suffix
    out("in-place update observed by all consumers", "memcuda_inplace_update", rq, "<= 1 ms", status("memcuda_inplace_update", 1, "", 0))
    out("(same)", "memcuda_inplace_update", rp, "<= 1 ms", status("memcuda_inplace_update", 1, "", 0))
    pr = "memcuda_pool_ratio"
    st = tmpl ? "-" : (scale != "1") ? "n/a (scaled run)" : ((pr in med) ? (med[pr] <= 1.10 ? "met" : "missed") : "not measured")
    printf "| pool reserved / in use, state dict live (a ratio, not ms) | %s | %s | - | - | - | <= 1.10 | %s |\n", pr, cell(pr), st
  }' "$rows")

if [[ $template == 1 ]]; then
  head_text="Numbers: to be measured on H200 (\`benchmarks/run_model.sh\` on a GPU host replaces this section)."
  raw=""
else
  head_text="Written by \`benchmarks/run_model.sh\` on $(date -u +%Y-%m-%dT%H:%M:%SZ) (commit $commit, run ${elapsed} s).
Machine: $machine; torch $torch_v; mem-cuda backend $backend_used; scale $scale (1 = 291 bf16 tensors,
13.5 GB); $reps repetitions after $warmup warm-up; in-place update with $consumers PyTorch consumers.
Times are milliseconds, median (min) over the repetitions; ratio = baseline median / mem-cuda median."
  fence='```'
  raw="Raw rows (\`row <name> <median> <min> n=<runs> ...\`, \`skip <name> <reason>\`):

$fence
$(cat "$rows")
$fence"
fi
describe() {
  cat <<'DESC'
What each row measures (the state dict: 32 layers of q, k, v, o 4096x4096, gate and up
11008x4096, down 4096x11008, two norms 4096; embedding and LM head 32000x4096; final norm
4096: 291 bf16 tensors, 13,476,831,232 bytes; the same list in `bench_model.cpp` and
`baselines/model_common.py`, each checks the total):

- `memcuda_open_fresh`: a fresh consumer process (spawned per repetition; its registry,
  CUDA context and Redis connection made before the clock starts) opens all 291 by name
  and makes each usable: a 2-byte `cudaMemcpyAsync` of element 0 of every tensor to pinned
  memory, one stream synchronisation, every value checked (host backend: a read).
  `open_ms` is the opens alone, `redis_script_ms` Redis's own time in scripts meanwhile
  (`INFO commandstats`), `import_opens` the IPC opens they needed. The opens are one batch
  get (a reference per tensor). `memcuda_open_fresh_dict`: the same dict once a state-dict
  record is linked over it (`link_state_dict`), opened with `open_state_dict`: one O(1)
  script and one reference for the whole dict (docs/design.md, "One reference per model").
  Baselines: `torch_queue_handoff` (the producer puts the dict on a `torch.multiprocessing`
  Queue) and `torch_reduce_pickle` (`reduce_tensor` on each tensor, the dict pickled with
  ForkingPickler and written to a pipe; the consumer calls each rebuild function), timed
  from the producer's stamp before it shares to the consumer's stamp after a copy kernel
  per tensor into one buffer and one synchronising copy to the host, values checked;
  the consumer is spawned, imports torch and makes its CUDA context untimed.
- `memcuda_publish_leader`: the 291 `create` calls (persistent, no data fill) in the
  allocator of record, its pool trimmed first, so every slab comes from the driver.
  Baselines: `torch_empty_cold` (`torch.empty` of the same tensors after
  `torch.cuda.empty_cache()`), `torch_empty_reduce_cold` (plus `reduce_tensor` on each,
  the IPC export a sharing producer pays), `torch_empty_cached` (caching allocator warm).
- `memcuda_publish_other`: the same creates from another process (`control_thread=false`):
  each one is a command the allocator of record serves.
- In-place update: `torch_reshare_queue` / `torch_reshare_pickle`: 8 consumers already
  hold the dict (every handle open); the producer writes new values in place (untimed),
  re-shares the dict (a Queue put per consumer, or one `reduce_tensor` pickle written to 8
  pipes), timed until the last consumer has rebuilt it and read every new value. The
  mem-cuda side (`memcuda_inplace_update`: publish a version, consumers stream-ordered on
  it) is filled in when the program prints that row .
- `memcuda_pool_ratio`: the allocator of record's pools, reserved / in use, with the state
  dict live after the publish runs' churn (not a time). Meaningless at `--small` (one slab
  for 3 MB).

How to run (programs prebuilt here, carried to the GPU host in .gpu/: bin/, lib/, env.sh):

```
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release && ninja -C build memcuda_bench_model
# copy the programs, their libraries and a redis-server into .gpu/; on the GPU host:
benchmarks/run_all.sh                 # the latency rows (its own section)
MEMCUDA_BENCH_BIN=.gpu/bin benchmarks/run_model.sh     # replaces this section
benchmarks/run_model.sh --small --torch-device cpu     # a quick check without a GPU
```

Each program alone: `memcuda_bench_model [--backend cuda] [--small | --scale N] [--reps 5]`,
`python3 benchmarks/baselines/torch_model_{handoff,empty,reshare}.py [--small] [--reps 5]`;
each prints `row <name> <median_ms> <min_ms> n=<runs> ...` lines and exits 77 (skipped) where
it cannot run.
DESC
}
section=$(cat <<EOF
<!-- model-rows:begin -->
## Model rows: a Llama-2-7B-shaped state dict, mem-cuda beside PyTorch

$head_text

$table

$raw

$(describe)
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
