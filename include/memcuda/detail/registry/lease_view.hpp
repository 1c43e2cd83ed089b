// The allocator-of-record lease as the roles that do not run it see it:
// whether this process leads, the token its scripts carry, and the one
// thing they may do to it, note that a script found it taken over. A
// client uses it to decide between allocating here and asking the leader,
// a standby to know whether to hold fds. Only the leader's Lease
// (lease/lease.hpp) campaigns, renews and releases.
#pragma once

#include "memcuda/config.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "memcuda/detail/store/reply.hpp"
#include "memcuda/error.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class LeaseView {
 public:
  virtual bool held() const noexcept = 0;
  // The token and epoch of the last lease this process took.
  virtual std::pair<std::string, std::uint64_t> current() const = 0;
  // No longer the leader (logged once); campaigning decides what next.
  virtual void lose(const std::string& why) = 0;

  // A script answered 'notleader': the lease moved on. Throws NotLeader.
  [[noreturn]] void lost(const std::string& what, std::string_view now_held_by = {}) {
    lose("lease taken over" + (now_held_by.empty() ? std::string() : " (now " + std::string(now_held_by) + ")"));
    throw NotLeader("lost the allocator-of-record lease" + (what.empty() ? std::string() : " while " + what));
  }

  // Maps a status no known branch took: 'notleader' is a lost lease,
  // anything else an InternalError (the lease stays).
  [[noreturn]] void fail_status(std::string_view script, std::string_view status, const std::string& what,
                                std::string_view held_by = {}) {
    if (status == "notleader") lost(what, held_by);
    unexpected_status(script, status);
  }

 protected:
  ~LeaseView() = default;  // never owned through this view
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
