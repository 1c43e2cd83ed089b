// The session value: what each registry's control thread writes (SET ... PX
// session_ttl) under `memcuda:session:<session>` to say that its process is
// alive (docs/protocol.md, "The session value", has its fields, "pidns" and
// "live" included). Expiry of the key means the process is gone. Any client
// can write the key, so decode_session is strict like decode_command;
// fields it does not know are ignored.
#pragma once

#include "memcuda/config.hpp"

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "memcuda/error.hpp"
#include "memcuda/protocol/json_util.hpp"
#include "memcuda/protocol/limits.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace protocol {

inline constexpr std::size_t kMaxPidNsBytes = 64;
inline constexpr std::size_t kMaxLiveBytes = 160;
inline constexpr std::size_t kMaxRegisteredBytes = 255;

struct SessionInfo {
  std::int64_t pid = 0;            // 1..kMaxPid
  std::string node;                // the process's node id (1..kMaxNodeBytes, no controls)
  std::int64_t started_ms = 0;     // wire "started": Unix time in ms the registry started, >= 0
  bool allocator_capable = false;  // it runs a control thread, so it may become the leader
  std::string pid_ns;              // wire "pidns", optional: readlink of /proc/self/ns/pid, or empty
  std::string live;                // wire "live", optional: the liveness lock file, or empty
  // wire "registered", optional: the Redis server (host:port) on which the
  // process last registered what it holds; after a failover, the old one
  // until it re-registered on the new (the owner's held frees wait for it)
  std::string registered;
  friend bool operator==(const SessionInfo&, const SessionInfo&) = default;
};

// Throws ProtocolError: too_large, bad_json, trailing_garbage, not_object;
// missing_field for any of the four fields; wrong_type; bad_value for a pid
// outside 1..kMaxPid, a negative "started", an empty, over-long or
// control-character node, a "pidns" that is not text of 1..64 bytes, a
// "live" that is not text of 1..160 bytes, or a "registered" that is not
// text of 1..255 bytes.
inline SessionInfo decode_session(std::string_view text) {
  namespace json = boost::json;
  constexpr std::string_view what = "session";
  json::value doc = detail::parse_object(text, what);
  const json::object& o = doc.get_object();
  SessionInfo s;
  s.pid = detail::get_int(detail::require(o, "pid", what), "pid", 1, kMaxPid);
  s.node = detail::get_bounded_text(detail::require(o, "node", what), "node", kMaxNodeBytes);
  s.started_ms = detail::get_int(detail::require(o, "started", what), "started", 0,
                                 std::numeric_limits<std::int64_t>::max());
  s.allocator_capable =
      detail::get_bool(detail::require(o, "allocator_capable", what), "allocator_capable");
  if (const auto* ns = detail::find(o, "pidns")) s.pid_ns = detail::get_bounded_text(*ns, "pidns", kMaxPidNsBytes);
  if (const auto* l = detail::find(o, "live")) s.live = detail::get_bounded_text(*l, "live", kMaxLiveBytes);
  if (const auto* r = detail::find(o, "registered"))
    s.registered = detail::get_bounded_text(*r, "registered", kMaxRegisteredBytes);
  return s;
}

// Compact JSON in the order pid, node, started, allocator_capable[, pidns][, live][, registered]. Checked
// with decode_session: a value it would reject throws that ProtocolError.
inline std::string encode_session(const SessionInfo& s) {
  namespace json = boost::json;
  json::object o;
  o["pid"] = s.pid;
  o["node"] = detail::sv(s.node);
  o["started"] = s.started_ms;
  o["allocator_capable"] = s.allocator_capable;
  if (!s.pid_ns.empty()) o["pidns"] = detail::sv(s.pid_ns);
  if (!s.live.empty()) o["live"] = detail::sv(s.live);
  if (!s.registered.empty()) o["registered"] = detail::sv(s.registered);
  std::string out = json::serialize(o);
  (void)decode_session(out);
  return out;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::protocol
