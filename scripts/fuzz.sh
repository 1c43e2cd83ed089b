#!/usr/bin/env bash
# Fuzzes for longer than CI does, and keeps what it finds.
#
#   scripts/fuzz.sh [--seconds N] [--keep] [TARGET...]
#
# Builds the libFuzzer targets (fuzz/, needs clang and libclang-rt-14-dev)
# into build/ and runs each TARGET (default: all) for N seconds (default
# 300) from a copy of its committed corpus, with its dictionary. CI only
# replays the corpus and fuzzes briefly (tests/fuzz.cmake); this is the
# long run. With --keep, the inputs that reach new code are merged into
# fuzz/corpus/<target>/ (libFuzzer's -merge=1 keeps only those), for you to
# review and commit; without, the source tree is not written. A crash stops
# the run of its target and names the input (docs/fuzzing.md, "Reporting a
# finding"). Environment: MEMCUDA_BUILD_DIR (default build).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
say() { printf 'fuzz: %s\n' "$*"; }
die() { printf 'fuzz: error: %s\n' "$*" >&2; exit 1; }

seconds=300
keep=0
targets=()
while (($#)); do
  case $1 in
    --seconds) [[ ${2:-} =~ ^[0-9]+$ ]] || die "--seconds needs a number"; seconds=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) targets+=("$1"); shift ;;
  esac
done

build_dir=${MEMCUDA_BUILD_DIR:-build}
scripts/setup.sh memcuda_fuzzers >/dev/null
if ((${#targets[@]} == 0)); then
  for f in fuzz/fuzz_*.cpp; do targets+=("$(basename "$f" .cpp)"); done
fi

# The dictionary of each target, as fuzz/CMakeLists.txt sets it.
dict_of() {
  sed -n "s/^set(_dict_$1 \(.*\))$/\1/p" fuzz/CMakeLists.txt
}

failed=0
for t in "${targets[@]}"; do
  bin=$build_dir/fuzz/$t
  [[ -x $bin ]] || die "$bin is not built (is $t a target of fuzz/CMakeLists.txt?)"
  work=$build_dir/fuzz-runs/long/$t
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts"
  cp -r "fuzz/corpus/$t/." "$work/corpus/"
  args=(-timeout=10 -rss_limit_mb=2048 -max_total_time="$seconds" -print_final_stats=1
        -artifact_prefix="$work/artifacts/")
  dict=$(dict_of "$t")
  [[ -n $dict ]] && args+=(-dict="fuzz/$dict")
  say "$t for $seconds s"
  if ! UBSAN_OPTIONS=print_stacktrace=1 "$bin" "${args[@]}" "$work/corpus" >"$work/log" 2>&1; then
    failed=1
    say "$t FAILED: $(ls "$work/artifacts" | tr '\n' ' ')(log: $work/log)"
    continue
  fi
  if ((keep)); then
    before=$(find "fuzz/corpus/$t" -type f | wc -l)
    "$bin" -merge=1 "fuzz/corpus/$t" "$work/corpus" >>"$work/log" 2>&1 ||
      die "$t: merging into fuzz/corpus/$t failed (log: $work/log)"
    say "$t: fuzz/corpus/$t has $(($(find "fuzz/corpus/$t" -type f | wc -l) - before)) new inputs"
  fi
done
((keep)) && say "review and commit the new inputs: git status fuzz/corpus"
exit "$failed"
