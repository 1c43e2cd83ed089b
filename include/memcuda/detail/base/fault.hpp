// Fault points: named places in the real code where a test can make the
// next pass fail, deterministically, without mocking anything around it.
//
//   if (MEMCUDA_FAULT("executor.execute")) throw ConnectionError("fault");
//
// A test arms a point in its own process with fault::arm("name", n) (the
// next n passes fire; n < 0: every pass until disarmed) or, for a worker
// process, through the environment: MEMCUDA_FAULTS="name[=n],name2[=n2]",
// read once at the first check; "name=die" kills the process (SIGKILL) the
// first time the point is reached, a crash at exactly that place; "name=wait"
// holds the thread there once, the point not firing: it creates the file
// $MEMCUDA_FAULT_GATE.reached and waits for $MEMCUDA_FAULT_GATE.go, so that
// a test does what must happen meanwhile (kills another process) and then
// lets it go on (a signal would not do: a pod's first process ignores
// SIGSTOP). Unarmed, a check costs one relaxed atomic
// load: the points are compiled into every build, so the code a test
// exercises is the code users run.
//
// The points: grep MEMCUDA_FAULT; each call site says what it makes fail.
#pragma once

#include "memcuda/config.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>

#include "memcuda/detail/process/process_options.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::fault {

struct Registry {
  std::atomic<int> armed{0};  // number of armed points: the unarmed fast path
  std::mutex mu;
  std::map<std::string, long, std::less<>> left;  // passes left to fire; < 0: forever
  std::set<std::string, std::less<>> die;          // points that kill the process when they fire
  std::set<std::string, std::less<>> wait;         // points that hold their thread once, not firing

  static Registry& instance() {
    // Its own static, not the process object's: points fire while that
    // object is made and destroyed, and in code that has no registry.
    static Registry r = [] {
      Registry x;
      try {
        x.parse(ProcessOptions::from_env().faults);
      } catch (...) {  // a bad MEMCUDA_FD_* or MEMCUDA_IMPORT_CACHE: none armed; the first registry says why
      }
      return x;
    }();
    return r;
  }
  Registry() = default;
  Registry(Registry&& o) noexcept
      : armed(o.armed.load()), left(std::move(o.left)), die(std::move(o.die)), wait(std::move(o.wait)) {}

  void parse(std::string_view spec) {
    while (!spec.empty()) {
      auto comma = spec.find(',');
      std::string_view item = spec.substr(0, comma);
      spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
      if (item.empty()) continue;
      long n = 1;
      if (auto eq = item.find('='); eq != std::string_view::npos) {
        if (item.substr(eq + 1) == "die") die.insert(std::string(item.substr(0, eq)));
        else if (item.substr(eq + 1) == "wait") wait.insert(std::string(item.substr(0, eq)));
        else n = std::strtol(std::string(item.substr(eq + 1)).c_str(), nullptr, 10);
        item = item.substr(0, eq);
      }
      left[std::string(item)] = n;
    }
    armed.store(static_cast<int>(left.size()), std::memory_order_relaxed);
  }

  // The "wait" action: at most ten minutes, then on regardless.
  static void hold_at_gate() {
    const char* g = std::getenv("MEMCUDA_FAULT_GATE");
    if (!g || !*g) return;
    const std::string gate(g);
    if (FILE* f = std::fopen((gate + ".reached").c_str(), "w")) std::fclose(f);
    for (int i = 0; i < 60000 && ::access((gate + ".go").c_str(), F_OK) != 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  bool fire(std::string_view name) {
    std::unique_lock lk(mu);
    auto it = left.find(name);
    if (it == left.end()) return false;
    if (die.count(name)) {
      ::kill(::getpid(), SIGKILL);
      ::_exit(128 + SIGKILL);  // the first process of a pid namespace ignores its own SIGKILL: gone all the same
    }
    if (wait.erase(std::string(name))) {
      left.erase(it);
      armed.fetch_sub(1, std::memory_order_relaxed);
      lk.unlock();  // the other threads' points (the lease's heartbeat) go on
      hold_at_gate();
      return false;
    }
    if (it->second > 0 && --it->second == 0) {
      left.erase(it);
      armed.fetch_sub(1, std::memory_order_relaxed);
    }
    return true;
  }
};

// Arms `name` for the next `times` passes (< 0: until disarm).
inline void arm(std::string_view name, long times = 1) {
  auto& r = Registry::instance();
  std::lock_guard lk(r.mu);
  auto [it, fresh] = r.left.insert_or_assign(std::string(name), times);
  (void)it;
  if (fresh) r.armed.fetch_add(1, std::memory_order_relaxed);
}

inline void disarm(std::string_view name) {
  auto& r = Registry::instance();
  std::lock_guard lk(r.mu);
  if (auto it = r.left.find(name); it != r.left.end()) {
    r.left.erase(it);
    r.armed.fetch_sub(1, std::memory_order_relaxed);
  }
  const std::string n(name);
  r.die.erase(n);
  r.wait.erase(n);
}

// Whether the point fires on this pass (and counts the pass).
inline bool hit(std::string_view name) {
  auto& r = Registry::instance();
  if (r.armed.load(std::memory_order_relaxed) == 0) return false;
  return r.fire(name);
}

// Whether `name` is still armed (a test checks its point was reached).
inline bool pending(std::string_view name) {
  auto& r = Registry::instance();
  std::lock_guard lk(r.mu);
  return r.left.count(std::string(name)) > 0;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::fault

#define MEMCUDA_FAULT(name) (::memcuda::detail::fault::hit(name))
