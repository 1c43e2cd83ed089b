// Helper programs the multi-process tests drive: memcuda_test_worker's
// READY line, and the memcuda CLI's path.
#pragma once

#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include "support/process.hpp"
#include "support/text.hpp"

namespace memcuda::test {

// memcuda_test_worker (tests/worker.cpp) on `url`, with `args` (--ttl,
// --backend, --no-control, ...).
inline std::unique_ptr<Child> start_worker(const std::string& url, const std::vector<std::string>& args = {}) {
  std::vector<std::string> argv{sibling_program("memcuda_test_worker"), "--url", url};
  argv.insert(argv.end(), args.begin(), args.end());
  return std::make_unique<Child>(argv);
}

// How many shm objects of these processes /dev/shm holds: those whose names
// carry a session id of one of `pids` (a session id is "<pid>-<random>"),
// whatever other tests on this machine keep there. Host allocations are
// memfds and never appear there; older versions made such objects.
inline int shm_objects_of(const std::vector<pid_t>& pids) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string f = e.path().filename().string();
    for (pid_t p : pids) n += starts_with(f, "memcuda." + std::to_string(p) + "-");
  }
  return n;
}

// The host allocations (memfds) made by sessions of `pids` that still exist
// anywhere on this machine, by label ("memcuda.<session>.<alloc id>"): a
// memfd lives exactly as long as some process holds an fd or a mapping of
// it, and both show its label ("/memfd:memcuda.<...> (deleted)") in
// /proc/<pid>/fd and /proc/<pid>/maps. Processes that exit meanwhile are
// skipped; so is this process when `here` is false (its import cache may
// keep an idle mapping of what it read: process_cache.hpp).
inline std::set<std::string> memfds_of(const std::vector<pid_t>& pids, bool here = true) {
  std::set<std::string> out;
  auto note = [&](std::string_view text) {
    for (pid_t p : pids) {
      const std::string head = "/memfd:memcuda." + std::to_string(p) + "-";
      auto at = text.find(head);
      if (at == std::string_view::npos) continue;
      auto label = text.substr(at + 7);
      label = label.substr(0, label.find(' '));
      out.insert(std::string(label));
    }
  };
  std::error_code ec;
  for (const auto& proc : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string pid = proc.path().filename().string();
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (!here && pid == std::to_string(::getpid())) continue;
    std::error_code e2;
    for (const auto& fd : std::filesystem::directory_iterator(proc.path() / "fd", e2)) {
      std::error_code e3;
      auto target = std::filesystem::read_symlink(fd.path(), e3);
      if (!e3) note(target.string());
    }
    std::ifstream maps(proc.path() / "maps");
    for (std::string line; std::getline(maps, line);) note(line);
  }
  return out;
}

// Reads a worker's READY line (waiting at most `limit`: a cuda worker's
// first CUDA calls take seconds); true when it came up as the leader.
inline bool ready(Child& w, std::chrono::milliseconds limit = std::chrono::seconds(30)) {
  auto l = w.read_line(limit);
  REQUIRE(l);
  INFO(*l);
  REQUIRE(starts_with(*l, "READY"));
  return contains(*l, "leader=1");
}

// The memcuda binary. The tool is built in build/tools/ and the tests in
// build/tests/; on a GPU host the binaries are flattened into one
// directory. So: next to this binary first, then ../tools/. No absolute
// build path is compiled in.
inline std::string cli_path() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  REQUIRE(n > 0);
  buf[n] = 0;
  const auto dir = std::filesystem::path(buf).parent_path();
  for (const auto& cand : {dir / "memcuda", dir / ".." / "tools" / "memcuda"}) {
    struct stat st {};
    if (::stat(cand.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(cand.c_str(), X_OK) == 0)
      return cand.lexically_normal().string();
  }
  FAIL("the memcuda binary is neither next to " << buf << " nor in " << (dir / ".." / "tools").string()
                                                << ": build the memcuda_cli target");
  return {};
}

// Reads a child's lines until one starts with `prefix` (for at most
// `limit`); returns every line read, that one included. Fails the test
// with what was read when none came.
inline std::string read_until(Child& c, const std::string& prefix,
                              std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  std::string seen;
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    auto l = c.read_line(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()));
    if (!l) break;
    seen += *l + "\n";
    if (starts_with(*l, prefix)) return seen;
  }
  FAIL("no line starting with '" << prefix << "' from the child; got:\n" << seen);
  return seen;
}

}  // namespace memcuda::test
