// Catch2 main for memcuda_tests (and memcuda_tsan_tests). Catch2 2.13 has no
// SKIP, so skips are reported through the exit status (support/skip.hpp):
//
//   --require-gpu     exit 77 at once, saying why, when no CUDA device is usable
//   --require-gpus N  the same when fewer than N devices are usable
//   --report-skips    exit 77 when a test case skipped (MEMCUDA_SKIP) and none
//                     failed; without it such a run exits 0
//
// 77 is CTest's SKIP_RETURN_CODE on every memcuda_tests entry, so a test that
// cannot run here shows as skipped, with its reason, never as passed. Every
// run ends with the list of the cases it skipped and why.
//
// The library reads options from MEMCUDA_* variables (MEMCUDA_RELEASE_LINGER_MS,
// MEMCUDA_SHARE_REFERENCES, MEMCUDA_REDIS_URL, MEMCUDA_FAULTS, ...). A test
// must not pass or fail by what the caller's shell holds, so they are all
// removed at start-up, before any is read, and the helper processes the tests
// start inherit that clean environment. Kept: MEMCUDA_TEST_*, which the
// harness itself reads (MEMCUDA_TEST_REDIS_SERVER, MEMCUDA_TEST_THREAD_OPS,
// MEMCUDA_TEST_DLPACK_SCRIPT). A test that needs an option sets it itself.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "support/gpu.hpp"
#include "support/skip.hpp"

extern char** environ;

namespace {

// Removes every MEMCUDA_* variable but MEMCUDA_TEST_*; says which, so that a
// run with one set shows that it was not used.
void clear_memcuda_environment() {
  std::vector<std::string> names;
  for (char** e = environ; e && *e; ++e) {
    const std::string_view kv(*e);
    const std::string_view name = kv.substr(0, kv.find('='));
    if (name.rfind("MEMCUDA_", 0) == 0 && name.rfind("MEMCUDA_TEST_", 0) != 0) names.emplace_back(name);
  }
  for (const auto& n : names) {
    ::unsetenv(n.c_str());
    std::cerr << "note: " << n << " is not used by the tests (removed from their environment)\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  clear_memcuda_environment();
  std::vector<char*> args;
  int require_gpus = 0;
  bool report_skips = false;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--require-gpu") == 0) {
      require_gpus = std::max(require_gpus, 1);
    } else if (std::strcmp(argv[i], "--require-gpus") == 0 && i + 1 < argc) {
      require_gpus = std::max(require_gpus, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--report-skips") == 0) {
      report_skips = true;
    } else {
      args.push_back(argv[i]);
    }
  }
  if (require_gpus > 0) {
    std::string why;
    if (!memcuda::test::gpu_available(&why)) {
      std::cout << "SKIPPED: GPU tests need a CUDA device: " << why << "\n";
      return memcuda::test::kSkipExitCode;
    }
    if (const int have = memcuda::test::gpu_count(); have < require_gpus) {
      std::cout << "SKIPPED: these GPU tests need " << require_gpus << " CUDA devices, this host has " << have
                << "\n";
      return memcuda::test::kSkipExitCode;
    }
  }
  const int rc = Catch::Session().run(static_cast<int>(args.size()), args.data());
  const auto skips = memcuda::test::SkipLog::instance().skips();
  if (!skips.empty()) {
    std::cout << "SKIPPED " << skips.size() << " test case(s), not passed:\n";
    for (const auto& s : skips) std::cout << "  " << s.test_case << ": " << s.reason << "\n";
    std::cout.flush();
    if (rc == 0 && report_skips) return memcuda::test::kSkipExitCode;
  }
  return rc;
}
