// Typed access to the allocator of record's keys outside its scripts
// (docs/protocol.md, "Keys"): the lease token memcuda:leader
// ("<epoch> <session>"; taken, renewed and given up only by the lease
// scripts), the namespace's owner uid, the published pool statistics and
// the counters statistics read. Each function sends exactly the commands
// its name says, in one round trip.
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

// The lease token and its time left, one pipeline: [GET, PTTL].
inline std::vector<redis::Reply> read_lease(redis::Connection& c, const Keys& k) {
  return c.pipeline({{"GET", k.leader()}, {"PTTL", k.leader()}});
}

// The effective uid recorded for the namespace's allocators of record (nil: none).
inline redis::Reply read_owner_uid(redis::Connection& c, const Keys& k) { return c.command({"GET", k.owner_uid()}); }
inline void write_owner_uid(redis::Connection& c, const Keys& k, std::string uid) {
  c.command({"SET", k.owner_uid(), std::move(uid)});
}

// The leader's pool statistics (protocol/pool_stats.hpp), kept `ttl`.
inline redis::Reply read_pool_stats(redis::Connection& c, const Keys& k) { return c.command({"GET", k.pool_stats()}); }
inline void write_pool_stats(redis::Connection& c, const Keys& k, std::string encoded, std::chrono::milliseconds ttl) {
  c.command({"SET", k.pool_stats(), std::move(encoded), "PX", std::to_string(ttl.count())});
}

// What statistics count, one pipeline: [ZCARD names, HGETALL usage,
// LLEN lifecycle, HLEN quarantined]; a key of the wrong type is an error
// reply in `errs`.
inline std::vector<redis::Reply> read_counters(redis::Connection& c, const Keys& k,
                                               std::vector<std::exception_ptr>* errs) {
  return c.pipeline({{"ZCARD", k.names()}, {"HGETALL", k.usage()}, {"LLEN", k.lifecycle()}, {"HLEN", k.quarantined()}},
                    errs);
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::store
