// Whether a session's process is alive: by its session key, and, where this
// process can judge it (death_watch), by the process or its liveness lock.
#pragma once

#include "memcuda/config.hpp"

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/detail/base/holder_id.hpp"
#include "memcuda/detail/base/node.hpp"
#include "memcuda/detail/fd/fd_socket_dir.hpp"
#include "memcuda/detail/fd/live_lock.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/protocol/session.hpp"
#include "memcuda/redis/connection.hpp"
#include "memcuda/detail/store/sessions.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// How this process can prove a session's process dead before its key
// expires: by its pid, when the session is of this node and pid namespace
// (and not this process); else by its liveness lock (fd/live_lock.hpp),
// when it holds one in this process's runtime directory, which works
// across pid namespaces and containers. Neither (another node, another
// directory, an older writer, a value that does not decode): only its key's
// expiry says it died.
struct DeathWatch {
  pid_t pid = 0;                    // judge by process_ended(pid)
  std::string live;                 // else by the lock this field names
  std::shared_ptr<LiveLock> judge;  // this process's lock: the directory the field must name

  bool armed() const noexcept { return pid > 0 || (judge && !live.empty()); }
  // Proof only: a live pid or a held lock proves nothing either way.
  bool proves_death() const {
    if (pid > 0) return process_ended(pid);
    return judge && !live.empty() && judge->judge(live) == LiveVerdict::dead;
  }
};

inline DeathWatch death_watch(std::string_view session_value, const std::string& node) {
  protocol::SessionInfo s;
  try {
    s = protocol::decode_session(session_value);
  } catch (const ProtocolError&) {
    return {};
  }
  if (!same_node(s.node, node)) return {};
  DeathWatch w;
  if (!s.pid_ns.empty() && s.pid_ns == pid_namespace_id()) {
    if (s.pid != ::getpid()) w.pid = static_cast<pid_t>(s.pid);
    return w;  // our namespace: the pid is exact, and this process is alive
  }
  if (!s.live.empty()) {
    w.judge = LiveLock::existing();
    if (w.judge) w.live = std::move(s.live);
  }
  return w;
}

// Whether a session's process is provably gone although its key has not
// expired yet (death_watch). Its pid: the process kept its pid while it
// lived, so a reused pid can only make a dead one look alive, never the
// reverse. Its lock: the kernel drops it with the process.
inline bool session_proves_death(std::string_view session_value, const std::string& node) {
  return death_watch(session_value, node).proves_death();
}

// The pid namespace of `owner`'s process when its session says one other
// than this process's (another container); nullopt otherwise (the same, not
// said, no session). Legacy CUDA IPC handles open only within one pid
// namespace: a failed open is told apart from a dead owner by this.
inline std::optional<std::string> foreign_pid_namespace(const Context& ctx, redis::Connection& c,
                                                        const std::string& owner) {
  auto v = store::read_session(c, ctx.keys, owner);
  if (v.is_nil()) return std::nullopt;
  try {
    auto s = protocol::decode_session(v.str());
    if (!s.pid_ns.empty() && s.pid_ns != pid_namespace_id()) return s.pid_ns;
  } catch (const ProtocolError&) {
  }
  return std::nullopt;
}

// Whether a tensor's owner session is alive: its session key exists, or
// (no key: Redis lost it, or the process was stopped past its TTL) its
// process still runs, so its memory is still good (a pid of another pid
// namespace may name a live process here: kept, the safe side). A key
// that still exists yet whose process session_proves_death is a dead owner
// whose key has not expired yet, so a takeover need not wait session_ttl.
// `fd_address`, when given, is the owner's fd server socket from another pid
// namespace (its pid means nothing here): with no session key, a server
// still listening there says the owner lives.
inline bool owner_alive(const Context& ctx, redis::Connection& c, const std::string& owner, std::int64_t pid,
                        const std::string& fd_address = {}) {
  if (owner.empty()) return false;
  if (auto v = store::read_session(c, ctx.keys, owner); !v.is_nil()) return !session_proves_death(v.str(), ctx.node);
  if (!fd_address.empty()) return !fd_server_gone(fd_address);
  return pid > 0 && pid <= 0x7fffffff && HolderId::process_alive(static_cast<pid_t>(pid));
}

// After a failover: the live sessions whose value says they last
// registered what they hold on another server than `server` (the
// "registered" field), so not yet on this primary. A session without the
// field (its first beat, an older writer) or one that does not decode is
// not counted: the owner's timing rules cover it (create/held_frees.hpp).
inline std::vector<std::string> sessions_registered_elsewhere(const Context& ctx, redis::Connection& c,
                                                              const std::string& server) {
  auto members = store::session_members(c, ctx.keys);
  std::vector<std::string> ids, out;
  std::vector<redis::Command> reads;
  for (std::size_t i = 0; i < members.size(); ++i) {
    ids.emplace_back(members[i].str());
    reads.push_back(store::read_session_cmd(ctx.keys, ids.back()));
  }
  if (reads.empty()) return out;
  std::vector<std::exception_ptr> errs;
  auto r = c.pipeline(reads, &errs);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (r[i].is_error() || r[i].is_nil()) continue;
    try {
      const auto s = protocol::decode_session(r[i].str());
      if (!s.registered.empty() && s.registered != server && !session_proves_death(r[i].str(), ctx.node))
        out.push_back(ids[i]);
    } catch (const ProtocolError&) {
    }
  }
  return out;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
