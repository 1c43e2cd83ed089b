// hot_path_count: a fixed number of gets, get+release cycles or creates on
// the allocator of record, for instruction counts (callgrind) and Redis
// command counts (redis-cli MONITOR) that do not depend on a loaded machine.
// Public API only, so the same file builds against an older tree (without
// TensorRegistry::flush, releases were synchronous there). Not part of the
// CMake build; docs/benchmarks.md ("The hot paths before and after the registry core
// split") gives the commands:
//
//   g++ -std=c++20 -O2 -g -I<tree>/include benchmarks/hot_path_count.cpp \
//       -o hot_path_count -lhiredis -lboost_json -pthread
//   MEMCUDA_REDIS_URL=unix:///tmp/r.sock valgrind --tool=callgrind \
//       --instr-atstart=no --separate-threads=yes ./hot_path_count get 1000
//
// Redis's side of one script: run redis-server itself under callgrind and
// compare evalShaCommand's inclusive cost for N and for 0 operations
// (docs/benchmarks.md, "The create regression, found and fixed").
//
// MODE: get (N gets, handles kept) | getrel (N x get, release, flush) |
// create (N x create, remove, release, flush) | createonly. Only the loop is
// instrumented (CALLGRIND_START/STOP_INSTRUMENTATION).
#include <valgrind/callgrind.h>
#include <chrono>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>
// One translation unit: newer trees split declarations (memcuda.hpp) from
// definitions (implementation.hpp, which includes memcuda.hpp).
#if __has_include("memcuda/implementation.hpp")
#include "memcuda/implementation.hpp"
#else
#include "memcuda/memcuda.hpp"
#endif
#if __has_include("memcuda/detail/registry/process/release_queue.hpp")
#define HAVE_FLUSH 1
#else
#define HAVE_FLUSH 0
#endif
using namespace memcuda;
static void flush(TensorRegistry& r) {
#if HAVE_FLUSH
  r.flush();
#else
  (void)r;
#endif
}
int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "getrel";
  int n = argc > 2 ? std::atoi(argv[2]) : 1000;
  RegistryOptions o = RegistryOptions::from_env();
  o.name_space = "hot-" + std::to_string(::getpid());
  o.default_backend = BackendKind::host;
  o.lease_ttl = std::chrono::milliseconds(6000);
  o.session_ttl = std::chrono::milliseconds(12000);
  o.gc_interval = std::chrono::milliseconds(3000);
  o.request_timeout = std::chrono::milliseconds(20000);
  TensorRegistry reg(o);
  for (int i = 0; i < 100 && !reg.is_leader(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (!reg.is_leader()) { std::fprintf(stderr, "not leader\n"); return 1; }
  auto keep = reg.create_any("warm", DType::u8, {4096});
  for (int i = 0; i < 50; ++i) { reg.get<void>("warm").release(); flush(reg); }
  for (int i = 0; i < 20; ++i) { auto t = reg.create_any("w/" + std::to_string(i), DType::u8, {4096}); reg.remove(t.name()); t.release(); flush(reg); }
  std::vector<SharedTensor<void>> held;
  held.reserve(n);
  std::fprintf(stderr, "START\n");
  auto t0 = std::chrono::steady_clock::now();
  CALLGRIND_START_INSTRUMENTATION;
  if (mode == "getrel") {
    for (int i = 0; i < n; ++i) { auto t = reg.get<void>("warm"); t.release(); flush(reg); }
  } else if (mode == "get") {
    for (int i = 0; i < n; ++i) held.push_back(reg.get<void>("warm"));
  } else if (mode == "create") {
    for (int i = 0; i < n; ++i) {
      auto t = reg.create_any("c/" + std::to_string(i), DType::u8, {4096});
      reg.remove(t.name()); t.release(); flush(reg);
    }
  } else if (mode == "createonly") {
    for (int i = 0; i < n; ++i) held.push_back(reg.create_any("c/" + std::to_string(i), DType::u8, {4096}));
  }
  CALLGRIND_STOP_INSTRUMENTATION;
  auto t1 = std::chrono::steady_clock::now();
  std::fprintf(stderr, "STOP\n");
  std::printf("%s n=%d %.2f us/op\n", mode.c_str(), n, std::chrono::duration<double, std::micro>(t1 - t0).count() / n);
  held.clear();
  flush(reg);
  return 0;
}
