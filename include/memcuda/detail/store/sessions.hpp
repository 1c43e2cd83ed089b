// Typed access to the session keys (docs/protocol.md, "Keys"): each
// registry's memcuda:session:<id> (protocol/session.hpp's value, kept alive
// by the heartbeat), the index memcuda:sessions, and memcuda:owners, the
// sessions that may own records (the orphan scan watches them). Each
// function sends exactly the commands its name says, in one round trip.
#pragma once

#include "memcuda/config.hpp"

#include <chrono>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/detail/store/keys.hpp"
#include "memcuda/redis/connection.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::store {

// A session's value (GET): nil when it expired or never was.
inline redis::Reply read_session(redis::Connection& c, const Keys& k, std::string_view sid) {
  return c.command({"GET", k.session(sid)});
}
inline redis::Command read_session_cmd(const Keys& k, std::string_view sid) { return {"GET", k.session(sid)}; }
inline bool session_exists(redis::Connection& c, const Keys& k, std::string_view sid) {
  return c.command({"EXISTS", k.session(sid)}).integer() == 1;
}

// Writes (and renews) a session's value with its TTL, returning the value
// it had (SET ... PX ttl GET), and lists it in the index: one pipeline.
inline std::vector<redis::Reply> refresh_session(redis::Connection& c, const Keys& k, const std::string& sid,
                                                 std::string value, std::chrono::milliseconds ttl,
                                                 std::vector<std::exception_ptr>* errs) {
  return c.pipeline({{"SET", k.session(sid), std::move(value), "PX", std::to_string(ttl.count()), "GET"},
                     {"SADD", k.sessions(), sid}},
                    errs);
}

// Ends a session: its key and its index entry, one pipeline.
inline void end_session(redis::Connection& c, const Keys& k, const std::string& sid) {
  c.pipeline({{"DEL", k.session(sid)}, {"SREM", k.sessions(), sid}});
}

// The session index (SMEMBERS); the _checked form answers an index of the
// wrong type as an error reply in `errs` rather than throwing.
inline redis::Reply session_members(redis::Connection& c, const Keys& k) { return c.command({"SMEMBERS", k.sessions()}); }
inline redis::Reply session_members_checked(redis::Connection& c, const Keys& k, std::vector<std::exception_ptr>* errs) {
  return std::move(c.pipeline({{"SMEMBERS", k.sessions()}}, errs)[0]);
}

// The holders index and the session index, one pipeline (the collector's view).
inline std::vector<redis::Reply> holders_and_sessions(redis::Connection& c, const Keys& k,
                                                      std::vector<std::exception_ptr>* errs) {
  return c.pipeline({{"SMEMBERS", k.holders()}, {"SMEMBERS", k.sessions()}}, errs);
}

// The session index and the lease token, one pipeline.
inline std::vector<redis::Reply> sessions_and_leader(redis::Connection& c, const Keys& k,
                                                     std::vector<std::exception_ptr>* errs) {
  return c.pipeline({{"SMEMBERS", k.sessions()}, {"GET", k.leader()}}, errs);
}

// ---- memcuda:owners ----

inline redis::Reply owner_members(redis::Connection& c, const Keys& k) { return c.command({"SMEMBERS", k.owners()}); }
inline void add_owner(redis::Connection& c, const Keys& k, std::string_view sid) { c.command({"SADD", k.owners(), sid}); }
inline redis::Command add_owner_cmd(const Keys& k, std::string sid) { return {"SADD", k.owners(), std::move(sid)}; }
inline void remove_owner(redis::Connection& c, const Keys& k, std::string_view sid) {
  c.command({"SREM", k.owners(), sid});
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::store
