// Why a command sent to the allocator of record got no answer in time, for
// the NotLeader a client throws: nobody holds the lease (start one), or its
// holder is alive by its session yet does not serve the lifecycle list
// (stopped, stuck), or its session has expired (a successor takes over when
// the lease runs out). Telling these apart is what an operator needs: the
// cure for the first is `memcuda serve`, for the others not.
#pragma once

#include "memcuda/config.hpp"

#include <chrono>
#include <string>
#include <string_view>

#include "memcuda/detail/store/keys.hpp"
#include "memcuda/protocol/session.hpp"
#include "memcuda/redis/connection.hpp"
#include "memcuda/detail/store/lease.hpp"
#include "memcuda/detail/store/sessions.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// The lease and its holder's session as read now, in words. Never throws:
// a failure to read them is said instead.
inline std::string silent_leader_reason(redis::Connection& c, const Keys& k) noexcept {
  try {
    auto rs = store::read_lease(c, k);
    if (rs[0].is_nil())
      return "nobody holds the allocator-of-record lease: no process hosts the control thread "
             "(start one, e.g. `memcuda serve`)";
    const std::string token(rs[0].str());
    const std::string session = token.substr(token.find(' ') + 1);
    const std::string left = std::to_string(rs[1].integer());
    auto sv = store::read_session(c, k, session);
    std::string who = "session " + session;
    if (sv.is_nil()) {
      // The session id starts with the pid ("<pid>-<hex>").
      return "the allocator of record (" + who + ", pid " + session.substr(0, session.find('-')) +
             ") holds the lease but its session has expired: it has likely died, and a successor takes over "
             "when the lease runs out (in " + left + " ms)";
    }
    try {
      auto info = protocol::decode_session(sv.str());
      who += ", pid " + std::to_string(info.pid) + " on node " + info.node;
    } catch (const ProtocolError&) {
      who += ", pid " + session.substr(0, session.find('-'));
    }
    return "the allocator of record (" + who +
           ") holds the lease and its session is alive, but it did not serve the lifecycle list: it may be "
           "stopped (SIGSTOP, a debugger), stuck or overloaded; look at that process (its lease has " + left +
           " ms left)";
  } catch (const std::exception& e) {
    return std::string("the lease could not be read: ") + e.what();
  }
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
