// Whether a standby holds every allocation's fd yet. Host and cuMem memory
// outlives its allocator of record only in the fds other processes hold, so
// a test that kills the allocator of record right after creating tensors
// first waits for its standby to have fetched them (docs/design.md,
// "What is lost when").
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "memcuda/redis/connection.hpp"
#include "support/text.hpp"

namespace memcuda::test {

// The standby process `pid` (namespace prefix `ns`, "" for the default)
// holds the fd of every allocation the records of `names` use: each one's
// allocation is published in the allocations Hash, and the standby's
// progress marker (memcuda:standby:<session>) names the Hash's current
// version. With no names, only the marker is checked (false when nothing
// was published).
inline bool standby_synced(redis::Connection& c, pid_t pid, const std::vector<std::string>& names = {},
                           const std::string& ns = "") {
  for (const auto& n : names) {
    auto h = c.command({"HGET", ns + "memcuda:tensor:" + n, "ipc_handle"});
    if (h.is_nil() || c.command({"HEXISTS", ns + "memcuda:allocations", std::string(h.str())}).integer() != 1)
      return false;
  }
  auto v = c.command({"GET", ns + "memcuda:allocations_version"});
  if (v.is_nil()) return false;
  auto keys = c.command({"KEYS", ns + "memcuda:standby:" + std::to_string(pid) + "-*"});
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto m = c.command({"GET", std::string(keys[i].str())});
    if (!m.is_nil() && m.str() == v.str()) return true;
  }
  return false;
}

}  // namespace memcuda::test
