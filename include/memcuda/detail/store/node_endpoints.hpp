// Typed access to the node endpoint records (docs/protocol.md, "Keys"):
// memcuda:node:<node>, a Hash per node naming where its byte mover
// (detail/transfer/) is reached, with a TTL its publisher's heartbeat
// renews. The incarnation is a fresh random id per publisher: a restarted
// node publishes a new one, so a reader that still has the old one (and
// keys of the old process's memory) sees it changed and never uses them.
// The endpoint is opaque bytes here; the store knows no transfer engine.
#pragma once

#include "memcuda/config.hpp"

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/detail/store/keys.hpp"
#include "memcuda/detail/store/script_call.hpp"
#include "memcuda/redis/connection.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

namespace lua {
// Replaces the node's record (a key of another type too) and sets its TTL;
// ARGV[7..] are further field, value pairs (the exposed regions).
inline constexpr char kNodePublish[] = R"lua(
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'incarnation', ARGV[2], 'mover', ARGV[3], 'endpoint', ARGV[4],
           'session', ARGV[5], 'published_ms', ARGV[6])
for i = 7, #ARGV - 1, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
)lua";

// Sets (value given) or deletes (none) region fields of the record if it is
// still of this incarnation -> 1, else 0 (the next refresh publishes all).
// ARGV: incarnation, then field, value ('' deletes) pairs.
inline constexpr char kNodeRegions[] = R"lua(
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then return 0 end
if redis.call('HGET', KEYS[1], 'incarnation') ~= ARGV[1] then return 0 end
for i = 2, #ARGV - 1, 2 do
  if ARGV[i + 1] == '' then redis.call('HDEL', KEYS[1], ARGV[i]) else redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
return 1
)lua";

// Renews the record's TTL -> 1, or 0 when it is gone, not a Hash or of
// another incarnation (the caller publishes again, or stops: superseded).
inline constexpr char kNodeRefresh[] = R"lua(
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then return 0 end
if redis.call('HGET', KEYS[1], 'incarnation') ~= ARGV[2] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
)lua";

// Deletes the record -> 1, or 0 when it is not of this incarnation.
inline constexpr char kNodeWithdraw[] = R"lua(
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then return 0 end
if redis.call('HGET', KEYS[1], 'incarnation') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
)lua";
}  // namespace lua

namespace store {

struct NodeEndpoint {
  std::string node;         // the node id (detail/base/node.hpp)
  std::string incarnation;  // the publisher's random id
  std::string mover;        // the engine's name (Mover::kind())
  std::string endpoint;     // the engine's address bytes (Mover::endpoint())
  std::string session;      // the publishing registry session, for people
  std::int64_t published_ms = 0;
};

// The field of a node record that describes the exposed allocation
// `alloc_id` of its publisher ("<address> <size> <key in hex>").
inline std::string region_field(std::uint64_t alloc_id) { return "region:" + std::to_string(alloc_id); }

inline void publish_node_endpoint(redis::Connection& c, const Keys& k, const NodeEndpoint& e,
                                  std::chrono::milliseconds ttl,
                                  const std::map<std::string, std::string>& regions = {}) {
  std::vector<redis::Arg> args{ttl.count(), e.incarnation, e.mover, e.endpoint, e.session, e.published_ms};
  for (const auto& [f, v] : regions) {
    args.emplace_back(f);
    args.emplace_back(v);
  }
  eval<lua::kNodePublish>(c, {k.node(e.node)}, args);
}

// Region fields set or ('' value) deleted; false when the record is no
// longer this incarnation's.
inline bool update_node_regions(redis::Connection& c, const Keys& k, std::string_view node,
                                std::string_view incarnation, const std::map<std::string, std::string>& changes) {
  std::vector<redis::Arg> args{incarnation};
  for (const auto& [f, v] : changes) {
    args.emplace_back(f);
    args.emplace_back(v);
  }
  return eval<lua::kNodeRegions>(c, {k.node(node)}, args).integer() == 1;
}

// One region field of a node's record ("" when absent).
inline std::string read_node_region(redis::Connection& c, const Keys& k, std::string_view node,
                                    std::uint64_t alloc_id) {
  auto r = c.command({"HGET", k.node(node), region_field(alloc_id)});
  return r.is_nil() ? std::string() : std::string(r.str());
}

inline bool refresh_node_endpoint(redis::Connection& c, const Keys& k, std::string_view node,
                                  std::string_view incarnation, std::chrono::milliseconds ttl) {
  return eval<lua::kNodeRefresh>(c, {k.node(node)}, {ttl.count(), incarnation}).integer() == 1;
}

inline bool withdraw_node_endpoint(redis::Connection& c, const Keys& k, std::string_view node,
                                   std::string_view incarnation) {
  return eval<lua::kNodeWithdraw>(c, {k.node(node)}, {incarnation}).integer() == 1;
}

// The node's live record, or nullopt when it expired or never was. A key of
// another type is a ReplyError (WRONGTYPE); its node's next publish replaces it.
inline std::optional<NodeEndpoint> read_node_endpoint(redis::Connection& c, const Keys& k, std::string_view node) {
  auto r = c.command({"HMGET", k.node(node), "incarnation", "mover", "endpoint", "session", "published_ms"});
  if (r.size() != 5 || r[0].is_nil() || r[2].is_nil()) return std::nullopt;
  NodeEndpoint e{std::string(node), std::string(r[0].str()), r[1].is_nil() ? std::string() : std::string(r[1].str()),
                 std::string(r[2].str()), r[3].is_nil() ? std::string() : std::string(r[3].str()), 0};
  if (!r[4].is_nil()) e.published_ms = std::strtoll(std::string(r[4].str()).c_str(), nullptr, 10);
  return e;
}

}  // namespace store
}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
