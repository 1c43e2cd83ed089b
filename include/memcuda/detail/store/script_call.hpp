// How the store runs its scripts: one immutable Script per source (its SHA
// computed once, shared by every thread). Only detail/store/ runs scripts
// (scripts/check-tree.py): each script's KEYS and ARGV are built by its one
// typed call, which lists them in the order the Lua reads them.
#pragma once

#include "memcuda/config.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "memcuda/detail/base/log.hpp"
#include "memcuda/detail/store/reply.hpp"
#include "memcuda/redis/script.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::store {

// On a Redis Cluster the ready channel is a sharded one (Redis 7), kept on
// the slot's node: there a script runs with SPUBLISH for PUBLISH. A single
// server runs the source as written.
inline std::string sharded_publish(std::string src) {
  static constexpr std::string_view kPlain = "redis.call('PUBLISH',", kSharded = "redis.call('SPUBLISH',";
  for (auto at = src.find(kPlain); at != std::string::npos; at = src.find(kPlain, at + kSharded.size()))
    src.replace(at, kPlain.size(), kSharded);
  return src;
}
template <const auto& Source>
const redis::Script& script(bool cluster = false) {
  static const redis::Script plain{std::string(Source)}, sharded{sharded_publish(std::string(Source))};
  return cluster ? sharded : plain;
}
template <const auto& Source>
const redis::Script& script(const redis::Connection& c) {
  return script<Source>(!c.options().cluster.empty());
}
template <const auto& Source>
redis::Reply eval(redis::Connection& c, std::span<const redis::Arg> keys, std::span<const redis::Arg> args) {
  return script<Source>(c).eval(c, keys, args);
}
template <const auto& Source>
redis::Reply eval(redis::Connection& c, std::initializer_list<redis::Arg> keys, std::span<const redis::Arg> args) {
  return script<Source>(c).eval(c, {keys.begin(), keys.size()}, args);
}
template <const auto& Source>
redis::Reply eval(redis::Connection& c, std::initializer_list<redis::Arg> keys,
                  std::initializer_list<redis::Arg> args) {
  return script<Source>(c).eval(c, keys, args);
}

// A script's {status, ...} answer, its status read once (script_status).
struct Answer {
  std::string status;
  redis::Reply reply;
  bool is(std::string_view s) const { return status == s; }
  redis::ReplyView operator[](std::size_t i) const { return reply[i]; }
  std::size_t size() const { return reply.size(); }
};
inline Answer answer(redis::Reply r) {
  std::string st = script_status(r);
  return {std::move(st), std::move(r)};
}

// Writes since start that no replica acknowledged within replica_wait.
inline std::atomic<std::uint64_t>& replica_wait_misses() {
  static std::atomic<std::uint64_t> n{0};
  return n;
}
// When a replica wait last timed out (steady clock, ns since its epoch),
// and how many timed out in a row since one was acknowledged.
inline std::atomic<std::int64_t>& replica_wait_missed_at() {
  static std::atomic<std::int64_t> t{std::numeric_limits<std::int64_t>::min() / 2};
  return t;
}
inline std::atomic<int>& replica_wait_streak() {
  static std::atomic<int> n{0};
  return n;
}

// With redis::Options::replica_wait, a create, a version flip or a free is
// followed by WAIT 1 <ms>, so that a failover to that replica keeps it. A
// replica that does not acknowledge in time is logged and counted, not an
// error: the write is on the primary, and what a failover loses anyway the
// processes write back (docs/operations.md, "Redis Sentinel"). After a
// timeout, writes do not wait for a while (the wait, doubled at each
// timeout in a row, at most 30 s: a primary left without replicas, as
// after a cluster failover, would make every write wait it out) and count
// as not acknowledged. False: not acknowledged.
inline bool replicate(redis::Connection& c, std::chrono::milliseconds wait) {
  if (wait.count() <= 0) return true;
  using namespace std::chrono;
  const auto now = steady_clock::now().time_since_epoch().count();
  const int streak = std::min(replica_wait_streak().load(std::memory_order_relaxed), 8);
  const auto quiet = std::min(duration_cast<steady_clock::duration>(wait * (1 << streak)),
                              duration_cast<steady_clock::duration>(seconds(30))).count();
  if (now - replica_wait_missed_at().load(std::memory_order_relaxed) < quiet) {
    replica_wait_misses().fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  if (c.blocking(wait, {"WAIT", 1, static_cast<std::int64_t>(wait.count())}).integer() >= 1) {
    replica_wait_streak().store(0, std::memory_order_relaxed);
    return true;
  }
  replica_wait_streak().fetch_add(1, std::memory_order_relaxed);
  replica_wait_missed_at().store(steady_clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  const auto n = replica_wait_misses().fetch_add(1, std::memory_order_relaxed) + 1;
  if (n <= 3 || n % 100 == 0)
    log(LogLevel::warn, "no Redis replica acknowledged a write within " + std::to_string(wait.count()) +
                            " ms (" + std::to_string(n) + " such write(s) so far): a failover now could lose it");
  return false;
}
inline bool replicate(redis::Connection& c) { return replicate(c, c.options().replica_wait); }

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::store
