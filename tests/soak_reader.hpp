// The reader of the Redis fault tests under load (support/redis_load.hpp),
// a mode of memcuda_soak_worker: `--reader N` creates the persistent
// tensors load.p0 .. load.p<N-1> (u32, a pattern of name and index), prints
// "READY N", then gets and checks every one of them in turn, holding
// load.p0 throughout and checking it too, until SIGTERM; then prints "DONE
// reads=.. verified=.. errors=..". Typed errors of a get (a failover under
// way) are counted; a byte that differs prints "FAIL ..." and exits 1.
// `--reader N --verify` (a fresh process, after the fault) checks each once
// and prints "VERIFIED N"; any error fails it.
#pragma once

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/memcuda.hpp"

namespace {

std::uint32_t reader_value(int k, std::size_t i) {
  return static_cast<std::uint32_t>(k) * 2654435761u ^ static_cast<std::uint32_t>(i * 40503u + 17u);
}

constexpr int kReaderElems = 1024;

// "" when t holds the pattern of load.p<k>, else what differs.
std::string reader_mismatch(const memcuda::SharedTensor<std::uint32_t>& t, int k) {
  std::vector<std::uint32_t> v(t.size());
  t.copy_to_host(v);
  if (v.size() != kReaderElems) return t.name() + " has " + std::to_string(v.size()) + " elements";
  for (std::size_t i = 0; i < v.size(); ++i)
    if (v[i] != reader_value(k, i)) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "%s element %zu is 0x%08x, expected 0x%08x", t.name().c_str(), i, v[i],
                    reader_value(k, i));
      return buf;
    }
  return {};
}

int run_reader(memcuda::TensorRegistry& reg, int n, bool verify_only, volatile std::sig_atomic_t& stop) {
  using namespace memcuda;
  auto name = [](int k) { return "load.p" + std::to_string(k); };
  auto failed = [](const std::string& what) {
    std::cout << "FAIL " << what << std::endl;
    std::cerr << "memcuda_soak_worker reader FAIL " << what << std::endl;
    return 1;
  };
  if (verify_only) {
    for (int k = 0; k < n; ++k) {
      try {
        if (auto bad = reader_mismatch(reg.get<std::uint32_t>(name(k)), k); !bad.empty()) return failed(bad);
      } catch (const Error& e) {
        return failed(name(k) + " is not readable: " + e.code() + ": " + e.what());
      }
    }
    std::cout << "VERIFIED " << n << std::endl;
    return 0;
  }
  CreateOptions co;
  co.persistent = true;
  for (int k = 0; k < n; ++k) {
    auto t = reg.create<std::uint32_t>(name(k), {kReaderElems}, co);
    std::vector<std::uint32_t> v(kReaderElems);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = reader_value(k, i);
    t.copy_from_host(v);
    t.publish();
  }
  auto held = reg.get<std::uint32_t>(name(0));
  std::cout << "READY " << n << std::endl;
  long reads = 0, verified = 0, errors = 0;
  std::map<std::string, long> codes;
  for (int k = 0; !stop; k = (k + 1) % n) {
    ++reads;
    try {
      if (auto bad = reader_mismatch(reg.get<std::uint32_t>(name(k)), k); !bad.empty()) return failed(bad);
      ++verified;
    } catch (const Error& e) {
      ++errors;
      ++codes[e.code()];
    }
    if (auto bad = reader_mismatch(held, 0); !bad.empty()) return failed("held: " + bad);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // a reader, not a second load
  }
  std::cout << "DONE reads=" << reads << " verified=" << verified << " errors=" << errors;
  for (const auto& [c, v] : codes) std::cout << " " << c << "=" << v;
  std::cout << std::endl;
  return 0;
}

}  // namespace
