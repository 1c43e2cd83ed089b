// Who campaigns first for a vacant lease (docs/design.md, "The fd server
// and standby holding"): a new allocator of record adopts fd-shared memory
// only from the fds it holds itself, so a process whose progress marker is
// not the allocations Hash's version lets a live standby whose marker is
// take the vacant lease first, for at most a bound (that standby may be
// stuck).
#pragma once

#include "memcuda/config.hpp"

#include <chrono>
#include <optional>
#include <string>

#include "memcuda/detail/base/log.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/gc/sessions.hpp"
#include "memcuda/detail/store/allocations.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class Succession {
 public:
  Succession(Context& ctx, Sessions& sessions) : ctx_(ctx), sessions_(sessions) {}

  // Whether this process should not campaign now. `limit`: how long in a
  // row it defers at most. One round trip while the lease is held; one
  // more per live session when this process lacks fds and the lease is
  // vacant. Called by the control thread only.
  bool defer(redis::Connection& c, std::chrono::milliseconds limit) {
    const auto v = store::read_succession_view(c, ctx_.keys, ctx_.session);
    if (v.lease_held || !v.version || v.marker == v.version) {
      since_.reset();  // the next vacancy is weighed afresh
      logged_ = gave_up_ = false;
      return false;
    }
    const auto now = std::chrono::steady_clock::now();
    if (!since_) since_ = now;
    if (now - *since_ >= limit) {
      if (!gave_up_) log(LogLevel::warn, "campaigning without holding every allocation's fd: no standby that "
                                         "holds them took the lease (what this process lacks may be lost)");
      gave_up_ = true;
      return false;
    }
    for (const auto& id : sessions_.standby_sessions(c)) {
      auto m = store::read_standby_synced(c, ctx_.keys, id);
      if (!m.is_nil() && m.str() == *v.version) {
        if (!logged_) log(LogLevel::info, "leaving the vacant lease to standby " + id + ", which holds every allocation's fd");
        logged_ = true;
        return true;
      }
    }
    return false;
  }

 private:
  Context& ctx_;
  Sessions& sessions_;
  std::optional<std::chrono::steady_clock::time_point> since_;  // deferring since
  bool logged_ = false, gave_up_ = false;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
