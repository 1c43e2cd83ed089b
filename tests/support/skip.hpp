// Skipping a test case that cannot run here (no GPU, one GPU where two are
// needed, no torch, a program that was not built), so that CTest reports it
// as SKIPPED with its reason instead of passed. Catch2 2.13 has no SKIP.
//
// MEMCUDA_SKIP(reason) records the skip (test case name and reason), prints
// it at once, and returns from the test case. The runner (tests/main.cpp)
// lists every skip at the end of the run; with --report-skips a run in which
// something skipped and nothing failed exits with kSkipExitCode, which the
// CTest entries map to "skipped" through SKIP_RETURN_CODE. Each ~[gpu] case
// is its own CTest entry, so a skip there marks exactly that case.
//
// Use it at the top level of a TEST_CASE body (it returns from the enclosing
// function), before anything the case would have to clean up.
#pragma once

#include <catch2/catch.hpp>

#include <iostream>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace memcuda::test {

// CTest's SKIP_RETURN_CODE for every memcuda_tests entry (77: the automake
// convention, also what --require-gpu returns).
inline constexpr int kSkipExitCode = 77;

struct Skip {
  std::string test_case;
  std::string reason;
};

class SkipLog {
 public:
  static SkipLog& instance() {
    static SkipLog log;
    return log;
  }
  void add(std::string reason) {
    Skip s{Catch::getResultCapture().getCurrentTestName(), std::move(reason)};
    std::cout << "SKIPPED: " << s.test_case << ": " << s.reason << std::endl;
    std::lock_guard lk(mu_);
    skips_.push_back(std::move(s));
  }
  std::vector<Skip> skips() const {
    std::lock_guard lk(mu_);
    return skips_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<Skip> skips_;
};

}  // namespace memcuda::test

// Ends the current test case as skipped. `why` is streamed: MEMCUDA_SKIP("needs " << n << " GPUs").
#define MEMCUDA_SKIP(why)                                      \
  do {                                                         \
    std::ostringstream memcuda_skip_os_;                       \
    memcuda_skip_os_ << why;                                   \
    ::memcuda::test::SkipLog::instance().add(memcuda_skip_os_.str()); \
    WARN("SKIPPED: " << memcuda_skip_os_.str());               \
    return;                                                    \
  } while (0)
