#!/bin/bash
# Front-end cost of mem-cuda's headers (docs/design.md, "Compile cost"):
# CPU time (user+sys) of `g++ -std=c++20 -fsyntax-only`, the minimum of N
# runs (default 3), for
#   umbrella        a TU holding only #include <memcuda/memcuda.hpp>
#   user            a quickstart-like TU: a registry, create<float>, get<float>,
#                   copies, info, remove
#   implementation  a TU holding only #include <memcuda/implementation.hpp>
#                   (the one TU per program that defines the library)
# each with CUDA off and, when the toolkit's headers are there, on.
#
# usage: scripts/compile_cost.sh [include-dir] [runs]
#   include-dir  default: include/ of this checkout (give another tree's to
#                compare, e.g. from `git archive <rev> include | tar x -C /tmp/old`)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
inc=${1:-$here/include}
runs=${2:-3}
cxx=${CXX:-g++}
cuda_inc=${CUDA_INCLUDE:-/usr/local/cuda/include}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

printf '#include <memcuda/memcuda.hpp>\n' >"$tmp/umbrella.cpp"
printf '#include <memcuda/implementation.hpp>\n' >"$tmp/implementation.cpp"
cat >"$tmp/user.cpp" <<'CPP'
#include <memcuda/memcuda.hpp>

#include <iostream>
#include <vector>

int main() {
  memcuda::TensorRegistry reg;
  auto w = reg.create<float>("quickstart/weights", {4, 256});
  std::vector<float> host(w.size(), 1.f);
  w.copy_from_host(host);
  auto r = reg.get<float>("quickstart/weights");
  std::vector<float> back(r.size());
  r.copy_to_host(back);
  std::cout << r.name() << " " << reg.info(r.name()).refcount << "\n";
  reg.remove("quickstart/weights");
  return back == host ? 0 : 1;
}
CPP

# min over $runs of user+sys seconds; "-" when the TU does not compile.
measure() {
  local src=$1 best="" t
  shift
  for _ in $(seq "$runs"); do
    if ! /usr/bin/time -o "$tmp/t" -f '%U %S' "$cxx" -std=c++20 -fsyntax-only -I"$inc" "$@" "$src" \
        >/dev/null 2>"$tmp/err"; then
      echo "-"
      return
    fi
    t=$(awk '{printf "%.2f", $1 + $2}' "$tmp/t")
    if [[ -z $best ]] || awk -v a="$t" -v b="$best" 'BEGIN { exit !(a < b) }'; then best=$t; fi
  done
  echo "$best"
}

configs=("off:-DMEMCUDA_ENABLE_CUDA=0")
[[ -f $cuda_inc/cuda_runtime_api.h ]] && configs+=("on:-DMEMCUDA_ENABLE_CUDA=1 -I$cuda_inc")
printf '%-16s %8s %8s\n' "TU" "CUDA off" "CUDA on"
for tu in umbrella user implementation; do
  row=()
  for c in "${configs[@]}"; do
    # shellcheck disable=SC2086  # the flags are words
    row+=("$(measure "$tmp/$tu.cpp" ${c#*:})")
  done
  printf '%-16s %8s %8s\n' "$tu" "${row[0]}" "${row[1]:--}"
done
