// A node's endpoint in the registry: the publisher (one per node: the
// process whose mover serves the node's memory) and the reader's check.
// Only bytes and names cross here; which engine made them is the mover's
// business (detail/transfer/), so the registry holds no engine type.
#pragma once

#include "memcuda/config.hpp"

#include <sys/random.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "memcuda/detail/base/node.hpp"
#include "memcuda/detail/store/keys.hpp"
#include "memcuda/detail/store/node_endpoints.hpp"
#include "memcuda/detail/transfer/mover.hpp"
#include "memcuda/protocol/limits.hpp"
#include "memcuda/error.hpp"
#include "memcuda/redis/connection.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// A fresh incarnation id: 128 random bits in hex, so that no two publishers
// (a node's process and its restarted successor) ever share one.
inline std::string new_incarnation() {
  std::uint64_t r[2] = {0, 0};
  if (::getrandom(r, sizeof r, 0) != static_cast<ssize_t>(sizeof r))
    throw InternalError("getrandom failed: no incarnation id for the node endpoint");
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(r[0]),
                static_cast<unsigned long long>(r[1]));
  return buf;
}

// Publishes this node's endpoint under a new incarnation and keeps it alive:
// refresh() from the heartbeat, every third of the TTL or more often.
// Calls take the caller's connection; none keeps a lock.
class NodePublisher {
 public:
  NodePublisher(Keys keys, std::string mover, std::string endpoint, std::string session,
                std::chrono::milliseconds ttl, std::string node = node_id())
      : keys_(std::move(keys)), ttl_(ttl) {
    if (ttl.count() <= 0) throw InvalidArgument("node endpoint TTL must be positive");
    if (endpoint.empty()) throw InvalidArgument("node endpoint: the mover gave no address");
    rec_ = {std::move(node), new_incarnation(), std::move(mover), std::move(endpoint), std::move(session), 0};
  }

  const store::NodeEndpoint& record() const noexcept { return rec_; }

  void publish(redis::Connection& c) {
    rec_.published_ms = now_ms();
    store::publish_node_endpoint(c, keys_, rec_, ttl_, regions_);
    dirty_ = false;
  }
  // Adds (value) or removes ('' value) region fields, kept for every
  // later publish of the record; written now through `c` when given (the
  // whole record again when it is no longer this incarnation's).
  void set_regions(redis::Connection* c, const std::map<std::string, std::string>& changes) {
    if (changes.empty()) return;
    for (const auto& [f, v] : changes) {
      if (v.empty()) regions_.erase(f);
      else regions_[f] = v;
    }
    if (!c) return;
    if (dirty_) return publish(*c);  // an earlier change Redis failed under: the whole record
    dirty_ = true;                   // until written: else the next refresh's
    if (!store::update_node_regions(*c, keys_, rec_.node, rec_.incarnation, changes)) return publish(*c);
    dirty_ = false;
  }
  // Renews the TTL, publishing again when the record expired or was
  // replaced (a Redis that lost its data, a key of another type, or another
  // publisher on this node, whose record this one then replaces: the node's
  // newest live process wins at its next beat). Returns whether it had to.
  bool refresh(redis::Connection& c) {
    if (!dirty_ && store::refresh_node_endpoint(c, keys_, rec_.node, rec_.incarnation, ttl_)) return false;
    publish(c);
    return true;
  }
  // Deletes the record if it is still this incarnation's.
  void withdraw(redis::Connection& c) { store::withdraw_node_endpoint(c, keys_, rec_.node, rec_.incarnation); }

 private:
  Keys keys_;
  std::chrono::milliseconds ttl_;
  store::NodeEndpoint rec_;
  std::map<std::string, std::string> regions_;
  bool dirty_ = false;  // regions_ has changes Redis may lack
};

// A node record's field of an exposed region ("region:<alloc_id>", or
// "stage" for its staging ring): "<address> <size> <key in hex>".
inline constexpr std::string_view kStageField = "stage";
inline std::string region_text(const transfer::Region& r) {
  char head[64];
  std::snprintf(head, sizeof head, "%" PRIu64 " %" PRIu64 " ", r.address(), static_cast<std::uint64_t>(r.size()));
  return head + transfer::to_hex(r.key());
}
// Throws Unavailable for a malformed field (another client's writing).
inline transfer::RemoteRegion parse_region(std::string_view field, const std::string& node, const std::string& name) {
  const auto s1 = field.find(' '), s2 = s1 == std::string_view::npos ? s1 : field.find(' ', s1 + 1);
  const auto addr = protocol::detail::parse_decimal<std::uint64_t>(field.substr(0, s1));
  const auto size = s2 == std::string_view::npos
                        ? std::nullopt
                        : protocol::detail::parse_decimal<std::uint64_t>(field.substr(s1 + 1, s2 - s1 - 1));
  if (!addr || !size || s2 + 1 >= field.size())
    throw Unavailable("node " + node + ": its field '" + name + "' is malformed ('" +
                      std::string(field.substr(0, 80)) + "')");
  transfer::RemoteRegion r;
  r.address = *addr;
  r.size = *size;
  r.key = transfer::from_hex(field.substr(s2 + 1));
  return r;
}

// The node scopes the record of `name` (made on `source`) lists as having
// a replica of it, `mine` and the source's left out, shuffled: the nodes a
// pull on node `mine` may read it from before the source.
inline std::vector<std::string> replica_peers(redis::Connection& c, const Keys& k, const std::string& name,
                                              const std::string& source, const std::string& mine) {
  auto f = c.command({"HMGET", k.tensor(name), "replicas"});
  std::vector<std::string> out;
  if (f.size() < 1 || f[0].is_nil()) return out;
  const std::string me = node_scope(mine), src = node_scope(source), all(f[0].str());
  for (std::size_t at = 0; at < all.size();) {
    const auto sp = std::min(all.find(' ', at), all.size());
    std::string t = all.substr(at, sp - at);
    if (!t.empty() && t != me && t != src) out.push_back(std::move(t));
    at = sp + 1;
  }
  std::shuffle(out.begin(), out.end(), std::mt19937_64(std::random_device{}()));
  return out;
}

// The live endpoint of `node` for a reader that took keys of its memory
// under `incarnation` (empty: any, for a reader that takes them now).
// Unavailable when the node publishes none (never did, or its publisher
// stopped beating); StaleHandle when it restarted since: the keys were of a
// process that is gone, and must not be used against its successor.
inline store::NodeEndpoint endpoint_of(redis::Connection& c, const Keys& k, const std::string& node,
                                       const std::string& incarnation = {}) {
  auto e = store::read_node_endpoint(c, k, node);
  if (!e) throw Unavailable("node '" + node + "' publishes no endpoint (not running, or not reachable by transfer)");
  if (!incarnation.empty() && e->incarnation != incarnation)
    throw StaleHandle("node '" + node + "' restarted (incarnation " + e->incarnation + ", keys from " + incarnation +
                      "): its old memory keys are void");
  return *e;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
