// Identity of this machine and this process.
#pragma once

#include "memcuda/config.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <random>
#include <string>

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// Node id: hostname plus the kernel boot id, so that a reboot (after which no
// IPC handle or shm object of before can be valid) is a different node.
inline const std::string& node_id() {
  static const std::string id = [] {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    std::string boot;
    std::ifstream f("/proc/sys/kernel/random/boot_id");
    std::getline(f, boot);
    std::string h = host[0] ? host : "localhost";
    return boot.empty() ? h : h + "/" + boot.substr(0, 8);
  }();
  return id;
}

inline std::int64_t now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

// A fresh session id per registry: pid plus 64 random bits (pids are reused).
inline std::string new_session_id() {
  static std::atomic<std::uint32_t> seq{0};
  std::random_device rd;
  std::uint64_t r = (std::uint64_t{rd()} << 32) ^ rd() ^ (std::uint64_t{seq++} << 48);
  char buf[48];
  std::snprintf(buf, sizeof buf, "%d-%016llx", static_cast<int>(::getpid()),
                static_cast<unsigned long long>(r));
  return buf;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
