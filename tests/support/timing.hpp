// Waiting and measuring in tests, without timed assertions.
//
// eventually(): polls for an outcome; its limit is a bound for a slow or
// loaded machine, not an assertion on how fast something happens.
//
// MEMCUDA_CHECK_MS_BELOW(ms, bound): where a test must tell "returned at
// once" from "waited for something long" and no ordering check can, the
// bound is generous (far above what a loaded two-core machine takes, far
// below what the defect under test costs) and the measured figure is always
// printed, so the log shows how close each run came.
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <thread>

namespace memcuda::test {

using Clock = std::chrono::steady_clock;

inline long long ms_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

// Polls `done` every `every` until it holds or `limit` passes; returns its
// last value.
template <class F>
bool eventually(F&& done, std::chrono::milliseconds limit = std::chrono::seconds(20),
                std::chrono::milliseconds every = std::chrono::milliseconds(20)) {
  const auto until = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() > until) return done();
    std::this_thread::sleep_for(every);
  }
  return true;
}

// Prints a measured duration (with where and what) to stdout, which CTest
// keeps. bound 0: none is checked (an order of events is the check).
inline void print_ms(const char* file, int line, const char* what, long long ms, long long bound = 0) {
  if (bound > 0)
    std::printf("timing: %s:%d: %s = %lld ms (bound %lld ms)\n", file, line, what, ms, bound);
  else
    std::printf("timing: %s:%d: %s = %lld ms\n", file, line, what, ms);
  std::fflush(stdout);
}

}  // namespace memcuda::test

#define MEMCUDA_CHECK_MS_BELOW(ms, bound)                                                      \
  do {                                                                                         \
    const long long memcuda_ms_ = static_cast<long long>(ms);                                 \
    const long long memcuda_bound_ = static_cast<long long>(bound);                           \
    ::memcuda::test::print_ms(__FILE__, __LINE__, #ms, memcuda_ms_, memcuda_bound_);           \
    INFO("measured " << memcuda_ms_ << " ms, generous bound " << memcuda_bound_ << " ms");     \
    CHECK(memcuda_ms_ < memcuda_bound_);                                                       \
  } while (0)
