// Typed access to the allocator of record's keys (docs/protocol.md,
// "Keys"): the lease token memcuda:leader ("<epoch> <session>"; taken,
// renewed and given up only by the lease scripts here), the scripts that
// move its commands between lists, the namespace's owner uid, the
// published pool statistics and the counters statistics read. Each
// function sends exactly the commands its name says, in one round trip.
#pragma once

#include "memcuda/config.hpp"

#include <chrono>
#include <exception>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memcuda/detail/store/keys.hpp"
#include "memcuda/detail/store/script_call.hpp"
#include "memcuda/redis/connection.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

namespace lua {
// Takes the lease -> {1, token}, or {0, current token} when someone holds it.
inline constexpr char kLeaseAcquire[] = R"lua(
local cur = redis.call('GET', KEYS[1])
if cur then return {0, cur} end
local e = redis.call('INCR', KEYS[2])
local token = e .. ' ' .. ARGV[1]
redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
return {1, token}
)lua";

// Renews the lease -> 1, or 0 when it is no longer ours.
inline constexpr char kLeaseRenew[] = R"lua(
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
)lua";

// Deletes the lease -> 1, or 0 when it is not ours.
inline constexpr char kLeaseRelease[] = R"lua(
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
)lua";

// Finishes a command the leader took: takes it off the leader's processing
// list and, in the same atomic step, delivers its reply to the list the
// command named in reply_to. A command no longer there (this leader's retry
// after the script's own reply was lost, or a successor re-queued the list)
// is not answered again, so each command taken is answered at most once,
// and a command answered is never re-queued. Only lists (or absent keys)
// receive replies, and only a list this script created (or one that already
// expires) gets the expiry, so a hostile reply_to cannot make the leader
// touch or expire any other key.
// -> 1 delivered, 0 refused (not a list), 2 nothing to deliver, -1 finished before
inline constexpr char kFinish[] = R"lua(
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return -1 end
if ARGV[4] ~= '1' then return 2 end
local t = redis.call('TYPE', KEYS[2])['ok']
if t ~= 'none' and t ~= 'list' then return 0 end
redis.call('LPUSH', KEYS[2], ARGV[2])
if t == 'none' or redis.call('PTTL', KEYS[2]) > 0 then redis.call('PEXPIRE', KEYS[2], ARGV[3]) end
return 1
)lua";

// Moves commands left in the processing lists of earlier leaders back to
// the head of the lifecycle list (oldest first), then registers ours.
// -> number of commands re-queued
inline constexpr char kRequeue[] = R"lua(
local n = 0
for _, l in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if l ~= ARGV[1] then
    while redis.call('LMOVE', l, KEYS[1], 'LEFT', 'RIGHT') do n = n + 1 end
    redis.call('SREM', KEYS[2], l)
  end
end
redis.call('SADD', KEYS[2], ARGV[1])
return n
)lua";
}  // namespace lua

namespace store {

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

// The lease: {true, our token} when taken, else {false, its holder's token}.
inline std::pair<bool, std::string> acquire_lease(redis::Connection& c, const Keys& k, const std::string& session,
                                                  std::chrono::milliseconds ttl) {
  auto r = eval<lua::kLeaseAcquire>(c, {k.leader(), k.epoch()}, {session, ttl.count()});
  return {r[0].integer() == 1, std::string(r[1].str())};
}
// Whether the lease is still `token`'s (then kept `ttl` longer).
inline bool renew_lease(redis::Connection& c, const Keys& k, const std::string& token, std::chrono::milliseconds ttl) {
  return eval<lua::kLeaseRenew>(c, {k.leader()}, {token, ttl.count()}).integer() == 1;
}
// Deletes the lease if it is still `token`'s; whether it was.
inline bool release_lease(redis::Connection& c, const Keys& k, const std::string& token) {
  return eval<lua::kLeaseRelease>(c, {k.leader()}, {token}).integer() == 1;
}
// Moves earlier leaders' unfinished commands back to the lifecycle list and
// registers the processing list of `epoch`; how many it moved.
inline std::int64_t requeue(redis::Connection& c, const Keys& k, std::uint64_t epoch) {
  return eval<lua::kRequeue>(c, {k.lifecycle(), k.processing_lists()}, {k.processing(epoch)}).integer();
}
// Takes `command` off `processing` and, unless `reply_to` is empty,
// delivers `reply` there (kept `ttl`); kFinish's codes.
inline std::int64_t finish_command(redis::Connection& c, const std::string& processing, const std::string& reply_to,
                                   const std::string& command, const std::string& reply,
                                   std::chrono::milliseconds ttl) {
  const bool deliver = !reply_to.empty();
  return eval<lua::kFinish>(c, {processing, deliver ? reply_to : processing},
                            {command, reply, ttl.count(), deliver ? "1" : "0"})
      .integer();
}

}  // namespace store
}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
