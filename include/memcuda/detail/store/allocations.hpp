// The allocations Hash of standby holding (docs/design.md, "The fd server
// and standby holding", says what it holds; takeover/standby.hpp): every
// fd-shared allocation's fd source, its version token (renewed by every
// change, in the same script) and each standby's progress marker.
#pragma once

#include "memcuda/config.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/detail/store/keys.hpp"
#include "memcuda/redis/connection.hpp"
#include "memcuda/redis/script.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::store {

// "<owner session> <fd_source>".
inline std::string encode_allocation(const std::string& owner, const std::string& source) { return owner + " " + source; }
struct Allocation {
  std::string owner;
  std::string source;
};
inline std::optional<Allocation> decode_allocation(std::string_view v) {
  auto p = v.find(' ');
  if (p == std::string_view::npos || p == 0 || p + 1 >= v.size()) return std::nullopt;
  return Allocation{std::string(v.substr(0, p)), std::string(v.substr(p + 1))};
}

// Applies `ops` ("S", field, value to set; "D", field to delete) to the
// allocations Hash atomically, and gives it a new version: a random token
// (never a counter: the version key is deleted with the Hash when it goes
// empty, so no key is left behind once nothing is allocated, and a token
// never comes back the way a restarted counter would). Returns the
// version now ("" when the Hash is empty).
inline std::string apply_allocations(redis::Connection& c, const Keys& k, const std::vector<std::string>& ops) {
  // KEYS: allocations Hash, its version   ARGV: new version, ops...
  static const redis::Script script{R"lua(
local i = 2
while i <= #ARGV do
  if ARGV[i] == 'S' then
    redis.call('HSET', KEYS[1], ARGV[i + 1], ARGV[i + 2])
    i = i + 3
  else
    redis.call('HDEL', KEYS[1], ARGV[i + 1])
    i = i + 2
  end
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[2])
  return ''
end
redis.call('SET', KEYS[2], ARGV[1])
return ARGV[1]
)lua"};
  static std::atomic<std::uint64_t> seq{0};
  std::random_device rd;
  char token[48];
  std::snprintf(token, sizeof token, "%08x%08x-%llu", rd(), rd(), static_cast<unsigned long long>(++seq));
  std::vector<redis::Arg> args{std::string_view(token)};
  for (const auto& o : ops) args.emplace_back(o);
  const std::string hk = k.allocations(), vk = k.allocations_version();
  redis::Arg keys[] = {hk, vk};
  return std::string(script.eval(c, keys, args).str());
}

// Every field of the allocations Hash (HGETALL).
inline std::map<std::string, std::string> read_allocations(redis::Connection& c, const Keys& k) {
  std::map<std::string, std::string> out;
  auto r = c.command({"HGETALL", k.allocations()});
  for (std::size_t i = 0; i + 1 < r.size(); i += 2) out.emplace(std::string(r[i].str()), std::string(r[i + 1].str()));
  return out;
}

// The Hash's version token (nil: no Hash).
inline redis::Reply read_allocations_version(redis::Connection& c, const Keys& k) {
  return c.command({"GET", k.allocations_version()});
}

// A standby's progress marker: the version it last synced (nil: none).
inline redis::Reply read_standby_synced(redis::Connection& c, const Keys& k, std::string_view sid) {
  return c.command({"GET", k.standby_synced(sid)});
}
inline void write_standby_synced(redis::Connection& c, const Keys& k, std::string_view sid, std::string_view version,
                                 std::chrono::milliseconds ttl) {
  c.command({"SET", k.standby_synced(sid), version, "PX", std::to_string(ttl.count())});
}
inline void clear_standby_synced(redis::Connection& c, const Keys& k, std::string_view sid) {
  c.command({"DEL", k.standby_synced(sid)});
}

// Wakes the standbys `sids` (a pushed token on each one's wake list, at
// most one kept, gone a minute later if nobody pops it).
inline void wake_standbys(redis::Connection& c, const Keys& k, const std::vector<std::string>& sids) {
  std::vector<redis::Command> cmds;
  for (const auto& s : sids) {
    const std::string key = k.standby_wake(s);
    cmds.push_back({"LPUSH", key, "1"});
    cmds.push_back({"LTRIM", key, "0", "0"});
    cmds.push_back({"PEXPIRE", key, "60000"});
  }
  if (!cmds.empty()) c.pipeline(cmds);
}
// A standby's wait for a wake (BLPOP on its own list; `timeout_arg` in
// seconds, as Connection::blocking's callers spell it).
inline std::vector<std::string> standby_wake_wait_cmd(const Keys& k, std::string_view sid, std::string timeout_arg) {
  return {"BLPOP", k.standby_wake(sid), std::move(timeout_arg)};
}
// The standbys of `sids` that have not synced the Hash's current version
// (one round trip; no Hash: none, nothing to hold).
inline std::vector<std::string> standbys_behind(redis::Connection& c, const Keys& k,
                                                const std::vector<std::string>& sids) {
  std::vector<redis::Command> cmds{{"GET", k.allocations_version()}};
  for (const auto& s : sids) cmds.push_back({"GET", k.standby_synced(s)});
  auto r = c.pipeline(cmds);
  std::vector<std::string> behind;
  if (r[0].is_nil()) return behind;
  for (std::size_t i = 1; i < r.size(); ++i)
    if (r[i].is_nil() || r[i].str() != r[0].str()) behind.push_back(sids[i - 1]);
  return behind;
}

// What a campaign weighs, in one round trip: whether the lease is held,
// the Hash's version and session `sid`'s own progress marker (nil: none).
struct SuccessionView {
  bool lease_held = false;
  std::optional<std::string> version, marker;
};
inline SuccessionView read_succession_view(redis::Connection& c, const Keys& k, std::string_view sid) {
  auto r = c.pipeline({{"EXISTS", k.leader()}, {"GET", k.allocations_version()}, {"GET", k.standby_synced(std::string(sid))}});
  SuccessionView v;
  v.lease_held = r[0].integer() != 0;
  if (!r[1].is_nil()) v.version = std::string(r[1].str());
  if (!r[2].is_nil()) v.marker = std::string(r[2].str());
  return v;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::store
