// Whether a standby holds every allocation's fd yet. Host and cuMem memory
// outlives its allocator of record only in the fds other processes hold, so
// a test that kills the allocator of record right after creating tensors
// first waits for its standby to have fetched them (docs/design.md,
// "What is lost when").
#pragma once

#include <sys/types.h>

#include <string>

#include "memcuda/redis/connection.hpp"
#include "support/text.hpp"

namespace memcuda::test {

// The standby process `pid` (namespace prefix `ns`, "" for the default)
// has caught up with the allocations Hash: its progress marker
// (memcuda:standby:<session>) names the Hash's current version. True when
// nothing was ever published.
inline bool standby_synced(redis::Connection& c, pid_t pid, const std::string& ns = "") {
  auto v = c.command({"GET", ns + "memcuda:allocations_version"});
  if (v.is_nil()) return true;
  auto keys = c.command({"KEYS", ns + "memcuda:standby:" + std::to_string(pid) + "-*"});
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto m = c.command({"GET", std::string(keys[i].str())});
    if (!m.is_nil() && m.str() == v.str()) return true;
  }
  return false;
}

}  // namespace memcuda::test
