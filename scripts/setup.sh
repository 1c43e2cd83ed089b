#!/usr/bin/env bash
# Installs what mem-cuda needs from Debian packages (only what is missing),
# then configures and builds the tree into build/.
#
#   scripts/setup.sh [TARGET...]     # from anywhere; idempotent
#
# With TARGETs only those are built (scripts/demo.sh builds its two
# programs); without, everything. One tree serves both: scripts/test.sh
# after scripts/demo.sh builds only what the demo did not.
#
# Environment (all optional):
#   MEMCUDA_BUILD_DIR    build directory (default: build, relative to the repo)
#   MEMCUDA_BUILD_TYPE   CMAKE_BUILD_TYPE (default: Release)
#   MEMCUDA_CUDA         AUTO | ON | OFF (default: AUTO; AUTO builds the CUDA
#                        backend when nvcc is found, on PATH or /usr/local/cuda)
#   MEMCUDA_JOBS         build parallelism (default: nproc)
#   MEMCUDA_CMAKE_ARGS   extra arguments for the first configure
#   MEMCUDA_SKIP_PACKAGES=1   do not look at or install packages
#
# The redis-server package is installed without starting its system service:
# the tests start private servers on their own sockets and ports, and the demo
# starts one when nothing answers on 127.0.0.1:6379.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$(pwd -P)

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

packages=(libhiredis-dev libucx-dev libboost-json1.81-dev libdlpack-dev catch2 redis-server cmake g++ pkg-config ninja-build clang-14 libclang-rt-14-dev
  python3-pytest python3-numpy python3-torch python3-venv python3-pip python3-setuptools python3-wheel)

install_packages() {
  if [[ "${MEMCUDA_SKIP_PACKAGES:-0}" == 1 ]]; then
    return 0
  fi
  if ! command -v dpkg-query >/dev/null 2>&1; then
    say "not a Debian system (no dpkg-query); make sure these are installed: ${packages[*]}"
    return 0
  fi
  local missing=() p status
  for p in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
    [[ "$status" == installed ]] || missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then
    return 0
  fi

  local sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    if ! command -v sudo >/dev/null 2>&1; then
      die "missing packages: ${missing[*]}; not root and no sudo here. As root run:
  apt-get update && apt-get install -y --no-install-recommends ${missing[*]}
or set MEMCUDA_SKIP_PACKAGES=1 if they are installed some other way."
    fi
    # Without a terminal (CI) sudo must not wait for a password.
    if [[ -t 0 ]]; then sudo=(sudo); else sudo=(sudo -n); fi
  fi

  say "installing missing packages: ${missing[*]}"
  # policy-rc.d exit 101 tells invoke-rc.d not to start services, so the
  # package does not start a system redis-server. Only ours is removed.
  local policy=/usr/sbin/policy-rc.d placed_policy=0
  if [[ ! -e "$policy" ]]; then
    "${sudo[@]}" sh -c "printf '#!/bin/sh\n# placed by mem-cuda scripts/setup.sh during apt-get install\nexit 101\n' > $policy && chmod 755 $policy"
    placed_policy=1
  fi
  local rc=0
  {
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
      "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends "${missing[@]}"
  } || rc=$?
  if ((placed_policy)); then
    "${sudo[@]}" rm -f "$policy"
  fi
  ((rc == 0)) || die "apt-get failed (exit $rc) installing: ${missing[*]}"
}

configure_and_build() {
  local build_dir=${MEMCUDA_BUILD_DIR:-build}
  local build_type=${MEMCUDA_BUILD_TYPE:-Release}
  local cuda=${MEMCUDA_CUDA:-AUTO}
  local jobs=${MEMCUDA_JOBS:-$(nproc 2>/dev/null || echo 2)}
  command -v cmake >/dev/null 2>&1 || die "cmake not found"

  # A build directory configured from another checkout (a copied or moved
  # tree) cannot be reused: CMake refuses it. Start that one afresh.
  local cache=$build_dir/CMakeCache.txt
  if [[ -f "$cache" ]]; then
    local home
    home=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$cache")
    if [[ -n "$home" && "$(cd "$home" 2>/dev/null && pwd -P)" != "$repo" ]]; then
      say "$build_dir was configured for $home; configuring it afresh for $repo"
      rm -rf "$build_dir/CMakeCache.txt" "$build_dir/CMakeFiles"
    fi
  fi

  if [[ ! -f "$cache" ]]; then
    local gen=()
    if command -v ninja >/dev/null 2>&1; then gen=(-G Ninja); fi
    # Word splitting of MEMCUDA_CMAKE_ARGS is intended.
    # shellcheck disable=SC2206
    local extra=(${MEMCUDA_CMAKE_ARGS:-})
    say "configuring $build_dir (${gen[1]:-default generator}, $build_type, MEMCUDA_CUDA=$cuda)"
    configure "$build_dir" "${gen[@]}" -DCMAKE_BUILD_TYPE="$build_type" -DMEMCUDA_CUDA="$cuda" "${extra[@]}"
  else
    # Re-run only when the cache disagrees with what was asked for, or when
    # examples/ or benchmarks/ got a CMakeLists.txt after the last configure
    # (the build only adds them if they exist, and does not watch for them).
    local why=
    if ! grep -qx "CMAKE_BUILD_TYPE:STRING=$build_type" "$cache" ||
      ! grep -qx "MEMCUDA_CUDA:STRING=$cuda" "$cache"; then
      why="$build_type, MEMCUDA_CUDA=$cuda"
    fi
    local sub
    for sub in examples benchmarks; do
      if [[ -f $sub/CMakeLists.txt && ! -f $build_dir/$sub/cmake_install.cmake ]] &&
        ! grep -qx "MEMCUDA_BUILD_${sub^^}:BOOL=OFF" "$cache"; then
        why="${why:+$why, }new $sub/CMakeLists.txt"
      fi
    done
    if [[ -n "$why" ]]; then
      say "reconfiguring $build_dir ($why)"
      configure "$build_dir" -DCMAKE_BUILD_TYPE="$build_type" -DMEMCUDA_CUDA="$cuda"
    fi
  fi

  if (($# > 0)); then
    say "building $* in $build_dir with $jobs jobs"
    cmake --build "$build_dir" --parallel "$jobs" --target "$@"
  else
    say "building $build_dir with $jobs jobs"
    cmake --build "$build_dir" --parallel "$jobs"
  fi
}

# configure BUILD_DIR ARGS...: runs CMake with its chatter in
# BUILD_DIR/setup-configure.log; shows the log when it fails, else only
# what the project itself reports (lines starting "-- memcuda").
configure() {
  local build_dir=$1 log
  shift
  mkdir -p "$build_dir"
  log=$build_dir/setup-configure.log
  if ! cmake -S . -B "$build_dir" "$@" >"$log" 2>&1; then
    cat "$log" >&2
    die "cmake failed to configure $build_dir (log: $log)"
  fi
  grep -E '^-- memcuda' "$log" || true
  if grep -q '^CMake Warning' "$log"; then say "cmake printed warnings: see $log"; fi
}

install_packages
configure_and_build "$@"
