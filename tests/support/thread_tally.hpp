// What the threads of a multithreaded test saw, checked on the test's thread
// afterwards (Catch2 assertions are not thread-safe): each thread counts
// "op:outcome" and collects failure messages locally, then merges them.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "memcuda/error.hpp"

namespace memcuda::test {

struct Tally {
  std::mutex mu;
  std::vector<std::string> failures;
  std::map<std::string, int> counts;  // "op:outcome" -> times

  void add(std::map<std::string, int>& local, std::vector<std::string>& fails) {
    std::lock_guard lk(mu);
    for (auto& [k, v] : local) counts[k] += v;
    failures.insert(failures.end(), fails.begin(), fails.end());
  }
  int count(const std::string& k) {
    std::lock_guard lk(mu);
    auto it = counts.find(k);
    return it == counts.end() ? 0 : it->second;
  }
};

// Runs `f`; returns "ok" or the name of the allowed error it threw
// (Allowed... among NotFound, AlreadyExists, StaleHandle). Any other
// exception becomes a failure message in `fails` and "error" is returned.
template <class... Allowed, class F>
std::string outcome(const char* op, const std::string& name, std::vector<std::string>& fails, F&& f) {
  try {
    f();
    return "ok";
  } catch (const NotFound& e) {
    if constexpr ((std::is_same_v<Allowed, NotFound> || ...)) return "NotFound";
    fails.push_back(std::string(op) + " " + name + ": unexpected NotFound: " + e.what());
  } catch (const AlreadyExists& e) {
    if constexpr ((std::is_same_v<Allowed, AlreadyExists> || ...)) return "AlreadyExists";
    fails.push_back(std::string(op) + " " + name + ": unexpected AlreadyExists: " + e.what());
  } catch (const StaleHandle& e) {
    if constexpr ((std::is_same_v<Allowed, StaleHandle> || ...)) return "StaleHandle";
    fails.push_back(std::string(op) + " " + name + ": unexpected StaleHandle: " + e.what());
  } catch (const std::exception& e) {
    fails.push_back(std::string(op) + " " + name + ": unexpected " + typeid(e).name() + ": " + e.what());
  }
  return "error";
}

}  // namespace memcuda::test
