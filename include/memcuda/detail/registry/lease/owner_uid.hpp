// The user a namespace's allocators of record run as: its memory is this
// user's alone, so a process of another user that took the lease could
// open none of it. `<ns>:memcuda:owner_uid` holds the effective uid of the
// last process that won the lease, and a candidate of another effective
// uid does not campaign (it logs why, once). docs/operations.md says how to
// hand a namespace to another user.
#pragma once

#include "memcuda/config.hpp"

#include <unistd.h>

#include <atomic>
#include <charconv>
#include <string>

#include "memcuda/detail/base/log.hpp"
#include "memcuda/detail/store/keys.hpp"
#include "memcuda/redis/connection.hpp"
#include "memcuda/detail/store/lease.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class OwnerUid {
 public:
  explicit OwnerUid(const Keys& keys) : keys_(keys), key_(keys.owner_uid()) {}

  // Whether this process may campaign: no owner recorded, or the same
  // effective uid. One GET per campaign.
  bool may_campaign(redis::Connection& c) {
    auto v = store::read_owner_uid(c, keys_);
    const std::string me = std::to_string(::geteuid());
    if (v.is_nil() || v.str() == me) {
      refused_logged_.store(false, std::memory_order_relaxed);
      return true;
    }
    long long uid = -1;
    const std::string_view s = v.str();
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), uid);
    if (ec != std::errc() || p != s.data() + s.size() || uid < 0) {
      log(LogLevel::warn, "ignoring an unreadable " + key_ + " (\"" + std::string(s.substr(0, 32)) +
                              "\"); this process may campaign and will rewrite it");
      return true;
    }
    if (!refused_logged_.exchange(true, std::memory_order_relaxed))
      log(LogLevel::error, "not campaigning for the allocator-of-record lease: this namespace's tensors belong to "
                           "uid " + std::string(s) + " (" + key_ + "), this process runs as uid " + me +
                               " and could open none of them (shared memory is 0600, fd servers serve their own "
                               "user only). Run it as uid " + std::string(s) +
                               "; to hand the namespace to another user, stop every process of uid " +
                               std::string(s) + " and delete " + key_);
    return false;
  }

  // Records this process's effective uid as the namespace's (on winning).
  void claim(redis::Connection& c) { store::write_owner_uid(c, keys_, std::to_string(::geteuid())); }

 private:
  Keys keys_;
  std::string key_;  // its name, for messages
  std::atomic<bool> refused_logged_{false};
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
