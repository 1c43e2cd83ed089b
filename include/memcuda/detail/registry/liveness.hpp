// Whether a session's process is alive: by its session key, and, where the
// session names a process of this node and pid namespace, by the process.
#pragma once

#include "memcuda/config.hpp"

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "memcuda/detail/base/holder_id.hpp"
#include "memcuda/detail/base/node.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/protocol/session.hpp"
#include "memcuda/redis/connection.hpp"
#include "memcuda/detail/store/sessions.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// The pid a session value names, when it means the same process here: the
// session is of this node and this pid namespace (and not this process).
// 0 otherwise (another node or namespace, an older writer without "pidns",
// a value that does not decode): then only its key's expiry says it died.
inline pid_t judgeable_pid(std::string_view session_value, const std::string& node) {
  protocol::SessionInfo s;
  try {
    s = protocol::decode_session(session_value);
  } catch (const ProtocolError&) {
    return 0;
  }
  if (s.node != node || s.pid_ns.empty() || s.pid_ns != pid_namespace_id() || s.pid == ::getpid()) return 0;
  return static_cast<pid_t>(s.pid);
}

// Whether a session's process is provably gone although its key has not
// expired yet: its pid is judgeable here and that process has ended
// (process_ended: no process has the pid, or it is a zombie; the process
// kept its pid while it lived, so a reused pid can only make a dead one
// look alive, never the reverse).
inline bool session_proves_death(std::string_view session_value, const std::string& node) {
  return process_ended(judgeable_pid(session_value, node));
}

// Whether a tensor's owner session is alive: its session key exists, or
// (no key: Redis lost it, or the process was stopped past its TTL) its
// process still runs, so its memory is still good. A key that still
// exists yet names a process of this node and pid namespace that no
// longer exists (kill(2): ESRCH) is a dead owner whose key has not
// expired yet: proven dead, so a takeover need not wait session_ttl.
inline bool owner_alive(const Context& ctx, redis::Connection& c, const std::string& owner, std::int64_t pid) {
  if (owner.empty()) return false;
  if (auto v = store::read_session(c, ctx.keys, owner); !v.is_nil()) return !session_proves_death(v.str(), ctx.node);
  return pid > 0 && pid <= 0x7fffffff && HolderId::process_alive(static_cast<pid_t>(pid));
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
