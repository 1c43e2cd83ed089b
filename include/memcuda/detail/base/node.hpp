// Identity of this machine and this process.
#pragma once

#include "memcuda/config.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/random.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// Node id: hostname plus the kernel boot id, so that a reboot (after which no
// IPC handle or shm object of before can be valid) is a different node.
// Which node a process is on is the boot id's to say (same_node): a
// container has a hostname of its own (its UTS namespace), a boot id it
// shares with every container of the machine. The hostname part is there
// for people reading records.
// MEMCUDA_NODE_ID, when set, is the node id instead (letters, digits, '.',
// '_', '-'; no '/', so that no boot id makes two such ids one node): for
// machines whose hostnames are not unique, and for fake nodes on one
// machine (separate namespaces without a shared socket directory, which
// cannot pass fds to each other as containers of one node can).
inline const std::string& node_id() {
  static const std::string id = [] {
    if (const char* v = std::getenv("MEMCUDA_NODE_ID"); v && *v) {
      std::string s(v);
      bool ok = s.size() <= 64;
      for (char c : s) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-');
      if (ok) return s;
      std::fprintf(stderr, "mem-cuda: MEMCUDA_NODE_ID='%s' ignored: at most 64 letters, digits, '.', '_', '-'\n", v);
    }
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    // Plain read(2), not <fstream>/<random>: those two headers alone cost
    // about 0.7 s of every translation unit that includes mem-cuda.
    std::string boot;
    if (int fd = ::open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC); fd >= 0) {
      char b[64] = {};
      ssize_t n = ::read(fd, b, sizeof b - 1);
      ::close(fd);
      if (n > 0) boot.assign(b, static_cast<std::size_t>(n));
      if (auto nl = boot.find('\n'); nl != std::string::npos) boot.resize(nl);
    }
    std::string h = host[0] ? host : "localhost";
    return boot.empty() ? h : h + "/" + boot.substr(0, 8);
  }();
  return id;
}

// Whether two node ids name the same machine since the same boot: equal,
// or their boot ids (the parts after the last '/') equal. The Lua scripts
// compare the same way (store/node_fn.hpp).
inline bool same_node(std::string_view a, std::string_view b) noexcept {
  if (a == b) return true;
  const auto sa = a.rfind('/'), sb = b.rfind('/');
  if (sa == std::string_view::npos || sb == std::string_view::npos) return false;
  const auto ba = a.substr(sa + 1), bb = b.substr(sb + 1);
  return !ba.empty() && ba == bb;
}

// What a fleet scopes the allocator of record's keys by (store/keys.hpp):
// the machine, as same_node judges it: the boot id of a default node id
// (containers of one machine have hostnames of their own, one boot id),
// the whole id when it has no boot part (MEMCUDA_NODE_ID).
inline std::string node_scope(std::string_view id) {
  const auto s = id.rfind('/');
  return std::string(s == std::string_view::npos || s + 1 == id.size() ? id : id.substr(s + 1));
}

// This process's pid namespace as the kernel names it ("pid:[4026531836]"),
// or empty when /proc cannot say. With the node id it tells whether a pid
// another process wrote means the same process here (namespace inodes are
// unique while the namespace lives, and the node id changes with a reboot).
inline const std::string& pid_namespace_id() {
  static const std::string id = [] {
    char buf[64] = {};
    ssize_t n = ::readlink("/proc/self/ns/pid", buf, sizeof buf - 1);
    return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
  }();
  return id;
}

// Whether the process `pid` (of this pid namespace) has provably ended: no
// process has the pid (ESRCH), or it is a zombie, dead but not yet reaped by
// its parent. A zombie keeps its pid, so neither answer can be about a
// reused pid; anything else (it runs, is stopped, or /proc cannot say) is
// not proof. The zombie test reads /proc/<pid>/status and wants state Z
// with at most one thread: a process whose main thread called pthread_exit
// also shows Z, but with its other threads still counted, and it lives.
inline bool process_ended(pid_t pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  char path[40];
  std::snprintf(path, sizeof path, "/proc/%d/status", static_cast<int>(pid));
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[2048];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = 0;
  const char* state = std::strstr(buf, "\nState:");
  const char* threads = std::strstr(buf, "\nThreads:");
  if (!state || !threads) return false;
  state += 7;
  while (*state == ' ' || *state == '\t') ++state;
  threads += 9;
  while (*threads == ' ' || *threads == '\t') ++threads;
  const long nthreads = std::strtol(threads, nullptr, 10);
  return (*state == 'Z' || *state == 'X') && nthreads <= 1;
}

inline std::int64_t now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

// A fresh session id per registry: pid plus 64 random bits (pids are reused).
inline std::string new_session_id() {
  static std::atomic<std::uint32_t> seq{0};
  std::uint64_t r = 0;
  if (::getrandom(&r, sizeof r, 0) != static_cast<ssize_t>(sizeof r)) {
    // No entropy source (very old kernel): time and address still differ
    // between processes that share a pid over time.
    r = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
        reinterpret_cast<std::uintptr_t>(&r);
  }
  r ^= std::uint64_t{seq++} << 48;
  char buf[48];
  std::snprintf(buf, sizeof buf, "%d-%016llx", static_cast<int>(::getpid()),
                static_cast<unsigned long long>(r));
  return buf;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
