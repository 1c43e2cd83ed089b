#!/usr/bin/env bash
# The scale rows: memcuda_bench_scale of this tree and, with --baseline, the
# same program built from an older tree, one after the other with the same
# sizes; writes both side by side (with ratios) into docs/benchmarks.md,
# between <!-- scale:begin --> and <!-- scale:end --> (appended when absent).
#
#   benchmarks/run_scale.sh [--sizes 1000,10000,100000] [--procs 1,16,64]
#       [--budget 1800] [--bin DIR] [--baseline DIR] [--baseline-label TEXT]
#       [--commit SHA] [--doc FILE | --no-doc] [--python PY | --no-python]
#       [--this-json FILE] [--baseline-json FILE] [-- extra memcuda_bench_scale flags]
#
# Programs: --bin DIR runs DIR/memcuda_bench_scale with the CLI DIR/memcuda;
# else build/benchmarks/memcuda_bench_scale of this tree (which finds
# build/tools/memcuda); else memcuda_bench_scale on PATH. --baseline DIR is a
# folder with the older tree's memcuda_bench_scale and memcuda: each program
# runs with its own tree's `memcuda serve` and `memcuda ls`. redis-server
# must be on PATH (each run starts a private one) or MEMCUDA_REDIS_URL set.
# --budget S is each program's budget (it skips what no longer fits and
# prints "timeout" for a step past its cap, so a slow tree still finishes).
# The Python client's rows (benchmarks/python/scale_worker.py with --python,
# default python3; libmemcuda_c.so from $MEMCUDA_LIBRARY or beside the
# program: build the target memcuda_c) are this tree's alone: the baseline
# runs with --no-python, since its workers would load this tree's package.
# --this-json / --baseline-json FILE: use a run already made (the JSON of
# memcuda_bench_scale --json, e.g. each on its own call of a machine with a
# time limit per command) instead of running that program.
# Output: the section on stdout; JSON, tables and logs in $OUT (or a
# temporary folder). Exit 1 when a program failed (its rows say where).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
say() { printf 'run_scale: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 2; }

sizes=1000,10000,100000 procs=1,16,64 budget=1800 bin="" baseline="" base_label="" doc=docs/benchmarks.md
commit=${MEMCUDA_COMMIT:-}
extra=() py=() this_json="" base_json=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --sizes) sizes=${2:?--sizes needs a list}; shift 2 ;;
    --procs) procs=${2:?--procs needs a list}; shift 2 ;;
    --budget) budget=${2:?--budget needs seconds}; shift 2 ;;
    --bin) bin=${2:?--bin needs a folder}; shift 2 ;;
    --baseline) baseline=${2:?--baseline needs a folder}; shift 2 ;;
    --baseline-label) base_label=${2:?}; shift 2 ;;
    --commit) commit=${2:?}; shift 2 ;;
    --doc) doc=${2:?}; shift 2 ;;
    --no-doc) doc=""; shift ;;
    --python) py=(--python "${2:?--python needs an interpreter}"); shift 2 ;;
    --no-python) py=(--no-python); shift ;;
    --this-json) this_json=${2:?--this-json needs a file}; shift 2 ;;
    --baseline-json) base_json=${2:?--baseline-json needs a file}; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done

if [[ -n $bin ]]; then
  prog=$bin/memcuda_bench_scale cli=(--cli "$bin/memcuda")
elif [[ -x build/benchmarks/memcuda_bench_scale ]]; then
  prog=build/benchmarks/memcuda_bench_scale cli=()
else
  prog=$(command -v memcuda_bench_scale || true) cli=()
fi
[[ -n $this_json || ( -n $prog && -x $prog ) ]] || die "no memcuda_bench_scale (build it: cmake --build build --target memcuda_bench_scale memcuda)"
if [[ -n $baseline && -z $base_json ]]; then
  [[ -x $baseline/memcuda_bench_scale && -x $baseline/memcuda ]] ||
    die "--baseline $baseline needs memcuda_bench_scale and memcuda in it"
fi
command -v python3 >/dev/null 2>&1 || die "python3 is needed to put the two runs side by side"

if [[ -z $commit ]]; then
  top=$(git rev-parse --show-toplevel 2>/dev/null || true)
  if [[ -n $top && $(cd "$top" && pwd -P) == $(pwd -P) ]]; then
    commit=$(git rev-parse --short HEAD)
    git diff --quiet HEAD -- 2>/dev/null || commit+="-dirty"
  else
    commit="unknown (pass --commit SHA)"
  fi
fi
[[ -n $base_label ]] || base_label="baseline ($baseline)"

out=${OUT:-$(mktemp -d /tmp/memcuda-scale.XXXXXX)}
mkdir -p "$out"
with_timeout() {  # with_timeout SECONDS cmd...
  local s=$1; shift
  if command -v timeout >/dev/null 2>&1; then timeout --kill-after=10 "$s" "$@"; else "$@"; fi
}
rc=0
start=$(date +%s)
run_one() {  # run_one NAME LABEL PROGRAM ARGS...
  local name=$1 label=$2 p=$3; shift 3
  say "$name: $p --sizes $sizes --procs $procs --budget $budget $* ${extra[*]}"
  with_timeout $((budget + 300)) "$p" --sizes "$sizes" --procs "$procs" --budget "$budget" --label "$label" \
    --json "$out/$name.json" "$@" ${extra[@]+"${extra[@]}"} > "$out/$name.md" 2> "$out/$name.log"
  local r=$?
  cat "$out/$name.md" >&2
  if [[ $r -ne 0 ]]; then
    say "$name exited $r; see $out/$name.log"
    rc=1
  fi
}
if [[ -n $this_json ]]; then
  cp "$this_json" "$out/this.json" || die "cannot read $this_json"
else
  run_one this "this tree ($commit)" "$prog" ${cli[@]+"${cli[@]}"} ${py[@]+"${py[@]}"}
fi
if [[ -n $base_json ]]; then
  cp "$base_json" "$out/baseline.json" || die "cannot read $base_json"
elif [[ -n $baseline ]]; then
  run_one baseline "$base_label" "$baseline/memcuda_bench_scale" --cli "$baseline/memcuda" --no-python
fi
elapsed=$(( $(date +%s) - start ))
[[ -n $this_json || -n $base_json ]] && elapsed=reused

python3 - "$out" "$commit" "$base_label" "$elapsed" > "$out/scale.md" <<'PY'
import json, os, sys
out, commit, base_label, elapsed = sys.argv[1:5]
def load(name):
    p = os.path.join(out, name + ".json")
    return json.load(open(p)) if os.path.exists(p) else None
this, base = load("this"), load("baseline")

def step(row, key, k=None):
    if row is None: return None
    if key == "gc":
        return next((g for g in row.get("gc", []) if g.get("k") == k), None)
    return row.get(key)

def val(s, field):
    if s is None: return None, "n/a"
    if s.get("status") != "ok" or s.get(field) is None: return None, s.get("status", "?")
    return float(s[field]), None

def fmt(v, prec):
    return f"{v:.{prec}f}"

def count(k):
    return f"{k // 1000000}M" if k >= 1000000 and k % 1000000 == 0 else f"{k // 1000}k" if k >= 1000 and k % 1000 == 0 else str(k)

cfg = (this or base or {}).get("config", {})
metrics = [("create p50 (ms)", "create", "p50_ms", 2), ("create p99 (ms)", "create", "p99_ms", 2),
           ("get p50 (µs)", "get", "p50_us", 0), ("get p99 (µs)", "get", "p99_us", 0),
           ("Redis PING p50, same client (µs)", "get", "ping_p50_us", 0), ("get p50 / PING p50", "get", "get_over_ping", 1),
           ("Redis µs per script call in the get loop (INFO commandstats)", "get", "redis_script_us", 1),
           ("get p50, names among the first 1000 only (µs)", "get_ws", "p50_us", 0),
           ("Redis µs per script call in that loop", "get_ws", "redis_script_us", 1),
           ("Python get p50 (µs)", "py_get", "p50_us", 0), ("Python get p99 (µs)", "py_get", "p99_us", 0),
           ("Python get p50 / C++ get p50", "py_get", "over_cpp", 2),
           ("`memcuda ls` wall (s)", "ls", "wall_s", 3), ("`memcuda ls` max RSS (MiB)", "ls", "max_rss_mib", 1),
           ("list() in a client (s)", "list", "wall_s", 3), ("Redis used_memory per tensor (B)", "memory", "bytes_per_tensor", 0)]
metrics += [(f"GC of a killed holder of {count(k)} references (s)", ("gc", k), "s", 2) for k in cfg.get("gc_counts", [])]
rmc = count(cfg.get('rm_count', 0))
metrics += [(f"remove_prefix of {rmc}: the call returns (s)", "rm", "remove_call_s", 2),
            (f"remove_prefix of {rmc}: no record left (s)", "rm", "records_gone_s", 2),
            (f"remove_prefix of {rmc}: records gone and pool bytes back (s)", "rm", "s", 2)]

def rows_by_n(d):
    return {r["n"]: r for r in d["sizes"]} if d else {}
t_rows, b_rows = rows_by_n(this), rows_by_n(base)
lines = []
head = ["N", "measure", "this tree"] + (["baseline", "baseline / this"] if base else [])
lines.append("| " + " | ".join(head) + " |")
lines.append("|" + "|".join([" ---: ", " --- ", " ---: "] + ([" ---: ", " ---: "] if base else [])) + "|")
for n in sorted(set(t_rows) | set(b_rows)):
    for label, key, field, prec in metrics:
        k = key[1] if isinstance(key, tuple) else None
        kk = key[0] if isinstance(key, tuple) else key
        tv, ts = val(step(t_rows.get(n), kk, k), field)
        if kk == "gc" and n < k: continue
        if kk == "rm" and n < cfg.get("rm_count", 0): continue
        cells = [str(n), label, fmt(tv, prec) if tv is not None else ts]
        if base:
            bstep = step(b_rows.get(n), kk, k)
            bv, bs = val(bstep, field)
            if kk == "py_get" and (bstep is None or bstep.get("status") == "skipped"): bs = "-"  # no Python run
            cells.append(fmt(bv, prec) if bv is not None else bs)
            cells.append(fmt(bv / tv, 2) if tv and bv is not None and field != "over_cpp" else "-")
        lines.append("| " + " | ".join(cells) + " |")
table = "\n".join(lines)

def tput(d):
    return {r["procs"]: r for r in d.get("throughput", [])} if d else {}
tt, bt = tput(this), tput(base)
def cellv(s, field, prec):
    v, st = val(s, field)
    return fmt(v, prec) if v is not None else st
tl = ["| processes | this: get+release pairs/s | this: PING/s | this: pairs / PING | this: Python pairs/s | this: Python / C++" +
      (" | baseline: pairs/s | baseline: PING/s | baseline: Python pairs/s | pairs/s this / baseline |" if base else " |")]
tl.append("| ---: | ---: | ---: | ---: | ---: | ---:" + (" | ---: | ---: | ---: | ---: |" if base else " |"))
for p in sorted(set(tt) | set(bt)):
    a, b = tt.get(p), bt.get(p)
    av, ast = val(a, "get_release_per_s")
    apy = (a or {}).get("python")
    c = [str(p), cellv(a, "get_release_per_s", 0), cellv(a, "ping_per_s", 0), cellv(a, "ratio", 3),
         cellv(apy, "get_release_per_s", 0) if apy else "-", cellv(apy, "over_cpp", 2) if apy else "-"]
    if base:
        bv, bst = val(b, "get_release_per_s")
        bpy = (b or {}).get("python")
        c += [cellv(b, "get_release_per_s", 0), cellv(b, "ping_per_s", 0),
              cellv(bpy, "get_release_per_s", 0) if bpy and bpy.get("status") != "skipped" else "-",
              fmt(av / bv, 2) if av is not None and bv else "-"]
    tl.append("| " + " | ".join(c) + " |")
ttable = "\n".join(tl)

d = this or base or {}
n_small = min(cfg.get("sizes", [0]))
print("<!-- scale:begin -->")
print("## Scale: how the registry's costs grow with its size (memcuda_bench_scale)\n")
print(f"Written by `benchmarks/run_scale.sh` on {d.get('date_utc', '?')} (this tree: {commit}"
      + (f"; {base_label}" if base else "")
      + (f"; both runs {elapsed} s)." if elapsed != "reused" else "; each program run on its own, then put together).")
      + (f" Baseline run: {base.get('date_utc', '?')} on {base.get('host', '?')}, {base.get('cpus', '?')} CPU threads."
         if base and elapsed == "reused" else ""))
print(f"Machine: {d.get('host', '?')}, {d.get('cpus', '?')} CPU threads; Redis: {d.get('redis', '?')}; "
      f"budget {cfg.get('budget_s')} s per program, each step capped at {cfg.get('step_timeout_s')} s.\n")
print(table + "\n")
print(f"Throughput at N = {n_small}, {cfg.get('window_s')} s window, all processes at once:\n")
print(ttable + "\n")
pyi = (this or {}).get("python")
if pyi is None:
    print("Python client: not measured (the program of this run has no Python rows).\n")
elif pyi.get("status"):
    print(f"Python client: {pyi['status']} ({pyi.get('why', '')}).\n")
else:
    print(f"Python client: `{pyi['python']}` (Python {pyi['version']}), memcuda {pyi['memcuda']}, "
          f"`{os.path.basename(pyi['library'])}` from `{os.path.dirname(pyi['library'])}`.\n")
print("""How it is measured (`benchmarks/bench_scale.cpp`). Each program starts a private redis-server on a
unix socket, `memcuda serve --backend host` of its own tree (the allocator of record) and a standby
`memcuda serve`, in a namespace of its own; the program itself is a client registry (control thread
off, no reference sharing). The registry grows from one size to the next by `create_many` of 1000
persistent float32[4] tensors (`t/0000000`...); at each size N:

- create: 200 single `create_any` through the allocator of record (5 untimed first; removed after).
- get: 2000 gets of random names, each release flushed to Redis before the next get (µs of the get
  call); a Redis PING from the same process after each pair. Redis's own time per script call
  over the loop (EVALSHA in `INFO commandstats`, reset first: the acquire and release scripts,
  and the few the allocator of record runs meanwhile). The client keeps the last 4096 records it
  read and the acquire script answers "same" for one it has (no Hash sent back, nothing decoded):
  at N = 1000 every name is soon cached, above 4096 most are not. "names among the first 1000
  only" is the same loop over the first 1000 names at every N: the like-for-like comparison.
- Python get: the same loop (20 untimed first) in a Python client process:
  `benchmarks/python/scale_worker.py`, the `memcuda` package over `libmemcuda_c.so`, with the C++
  client's options (control thread off, `MEMCUDA_SHARE_REFERENCES=0`: every get is a Redis
  acquire; host backend). µs of `Registry.get` (the C call and the `Tensor` it returns); its p50
  over the C++ get's p50 is the Python client's overhead, meant to stay at 1.3 or below.
- `memcuda ls`: the CLI listing every tensor, stdout to /dev/null; wall time from fork to exit and
  the child's peak RSS (wait4's ru_maxrss). list(): `TensorRegistry::list("*")` in a client
  process, the call alone.
- Redis used_memory per tensor: INFO memory's used_memory after the fill minus before the first
  tensor, divided by N.
- GC of a killed holder: a client process takes a reference to each of the first K names
  (`get_many`, 10k a call) and is `kill -9`'d; time from the kill until each of those records'
  refcount is back to its value before (HGET pipelines, every 20 ms).
- remove_prefix until freed: as many more tensors under `rm/`, then `remove_prefix("rm/")` in a
  client process; time until no `rm/` record is left and the pools' bytes in use (the leader's
  `memcuda:pool_stats`, published at each lease renewal, so about 0.5 s resolution) are back to
  their value before the fill.
- Throughput: P C++ client processes doing get+release pairs (release in Redis before the next
  get) over the same window, then P processes doing Redis PINGs, then P Python client processes
  doing the C++ ones' pairs (as in Python get).

"timeout": the step passed its cap; "skipped": it no longer fit the budget; "n/a": not run at that
size. Ratios: baseline / this tree, so above 1 means this tree is faster or smaller (for the
throughput table: this tree / baseline). Python / C++: the Python figure over the C++ one (for
the get p50, above 1 means Python is slower; for pairs/s, below 1 means it does fewer). The Python
rows are this tree's alone ("-" for the baseline: it runs with `--no-python`, since its workers
would load this tree's package); "skipped" names its reason in the Python client line. Raw JSON:
`memcuda_bench_scale --json FILE`.

To run it again (a baseline is the same source built in an older checkout: copy
`benchmarks/bench_scale*.{cpp,hpp}` there and add the target; its `memcuda_bench_scale` and
`memcuda` in one folder; the Python rows want `libmemcuda_c.so`, target memcuda_c, beside
`memcuda_bench_scale` or in `$MEMCUDA_LIBRARY`, and `python3`):

```
cmake --build build --target memcuda_bench_scale memcuda memcuda_c
benchmarks/run_scale.sh --sizes 1000,10000,100000 --baseline DIR --baseline-label "baseline SHA"
```""")
print("<!-- scale:end -->")
PY
py_rc=$?
[[ $py_rc -eq 0 ]] || die "could not put the runs together (python3 exited $py_rc); see $out"
cat "$out/scale.md"

if [[ -n $doc ]]; then
  mkdir -p "$(dirname "$doc")"
  if [[ -f $doc ]] && grep -q '<!-- scale:begin -->' "$doc"; then
    awk -v f="$out/scale.md" '
      /<!-- scale:begin -->/ { while ((getline l < f) > 0) print l; skip = 1; next }
      /<!-- scale:end -->/ { skip = 0; next }
      !skip' "$doc" > "$doc.tmp" && mv "$doc.tmp" "$doc"
  else
    { [[ -f $doc ]] && echo; cat "$out/scale.md"; } >> "$doc"
  fi
  say "wrote the scale section of $doc"
fi
say "JSON, tables and logs in $out (${elapsed} s)"
exit $rc
