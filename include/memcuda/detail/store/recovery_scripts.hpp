// The Lua scripts that rebuild or give up records after a loss (a dead
// allocator of record, a Redis that lost its data), and their typed calls
// (scripts.hpp says how scripts are written).
#pragma once

#include "memcuda/config.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/detail/base/node.hpp"
#include "memcuda/detail/store/dict_scripts.hpp"
#include "memcuda/detail/store/generation_fn.hpp"
#include "memcuda/detail/store/index_fn.hpp"
#include "memcuda/detail/store/keys.hpp"
#include "memcuda/detail/store/records.hpp"
#include "memcuda/detail/store/script_call.hpp"
#include "memcuda/protocol/record.hpp"
#include "memcuda/redis/connection.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {
namespace lua {

// The start of the scripts that act on a dead allocator's tensor (fenced;
// generation, KEYS[4] usage; ARGV[1] token, ARGV[2] generation): finds the
// record of that generation, named or unlinked, as `key` (and `linked`), or
// answers 'gone'.
inline constexpr char kDeadOwnerRecord[] = R"lua(
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return {'notleader', tostring(redis.call('GET', KEYS[2]))} end
local key = KEYS[1]
local linked = true
if redis.call('HGET', key, 'generation') ~= ARGV[2] then
  key = KEYS[3]
  linked = false
  if redis.call('EXISTS', key) == 0 then return {'gone'} end
end
)lua";

// Republishes a tensor of a dead allocator of record after a live holder
// copied its bytes into a replacement this leader allocated: the record
// (named or unlinked) gets the new memory's fields and a new generation,
// and memcuda:moved:<old> forwards releases of the old generation.
// -> {'ok', new generation} | {'gone'} (released, removed or migrated
//    meanwhile) | {'notleader', t}
inline constexpr auto kMigrate = join(kUnlinkDictFn, kIndexFn, kDeadOwnerRecord, kGenerationFn, R"lua(
local f = redis.call('HMGET', key, 'owner', 'refcount', 'migrated_from', 'dict')
if f[1] ~= ARGV[3] or tonumber(f[2] or '0') <= 0 then return {'gone'} end
unlink_dict(ARGV[4], f[4])  -- its desc described the old placement
-- as text: Lua would print a number this large as 1.79e+15
local gen = string.format('%.0f', take_generations(KEYS[5], 1))
if linked then count_usage_in(KEYS[4], key, -1) end
redis.call('HSET', key, unpack(ARGV, 5))
if linked then count_usage_in(KEYS[4], key, 1) end
redis.call('HDEL', key, 'event_handle', 'desc')  -- desc described the old placement
redis.call('HSET', key, 'generation', gen, 'event_version', 0,
           'migrated_from', (f[3] and (f[3] .. ' ') or '') .. ARGV[2])
redis.call('SET', KEYS[6], gen)
if not linked then redis.call('RENAME', key, ARGV[4] .. 'memcuda:removed:' .. gen) end
return {'ok', gen}
)lua");

// Gives up a tensor of a dead allocator of record that no live process can
// copy: the record goes, the name is free again, and a marker (kept
// holds a reference, unless forced.
// -> {'lost', 1 named | 0 unlinked} | {'held', session} | {'gone'} | {'notleader', t}
inline constexpr auto kMarkLost = join(kUnlinkDictFn, kIndexFn, kDeadOwnerRecord, R"lua(
if redis.call('HGET', key, 'owner') ~= ARGV[3] then return {'gone'} end
if ARGV[7] ~= '1' then
  local function live(k)
    local h = string.match(k, '^holder:(%d+%-%x+)$')
    if h and redis.call('EXISTS', ARGV[4] .. 'memcuda:session:' .. h) == 1 then return h end
  end
  for _, k in ipairs(redis.call('HKEYS', key)) do
    local h = live(k)
    if h then return {'held', h} end
    local d = string.match(k, '^holder:@dict:(%d+)$')  -- held through a state dict's record
    if d then
      for _, dk in ipairs(redis.call('HKEYS', ARGV[4] .. 'memcuda:dict:' .. d)) do
        h = live(dk)
        if h then return {'held', h} end
      end
    end
  end
end
local m = redis.call('HMGET', key, 'name', 'owner_pid', 'epoch', 'migrated_from', 'dict')
unlink_dict(ARGV[4], m[5])
if m[4] then
  for g in string.gmatch(m[4], '%d+') do redis.call('DEL', ARGV[4] .. 'memcuda:moved:' .. g) end
end
if linked then count_usage_in(KEYS[4], key, -1) end
redis.call('DEL', key)
if linked then
  name_rem(KEYS[5], m[1])
  redis.call('DEL', KEYS[6])
  redis.call('HSET', KEYS[6], 'generation', ARGV[2], 'owner', ARGV[3], 'owner_pid', m[2] or '0',
             'epoch', m[3] or '0', 'lost_ms', ARGV[6])
  redis.call('PEXPIRE', KEYS[6], ARGV[5])
  return {'lost', 1}
end
return {'lost', 0}
)lua");

// Writes back a record its owner still has after Redis lost its data: under
// the name when the name is free, else as unlinked. Holders re-register
// their references with kReregister. The generation counter is raised past
// every republished generation (and, on a fresh Redis, to its clock).
// ARGV[6] '0' writes it unlinked even where the name is free (a removed
// tensor a holder claimed back after a failover).
// -> {'named'} | {'unlinked'} | {'present'}
inline constexpr auto kRepublish = join(kIndexFn, R"lua(
local g = ARGV[1]
if redis.call('HGET', KEYS[1], 'generation') == g then return {'present'} end
local r = KEYS[4]
if redis.call('EXISTS', r) == 1 then return {'present'} end
local named = ARGV[6] == '1' and redis.call('EXISTS', KEYS[1]) == 0
local key = r
if named then key = KEYS[1] end
redis.call('HDEL', key, 'desc')  -- a fresh key here; kept so the fields stay the only truth
redis.call('HSET', key, unpack(ARGV, 7))
local rc = 0
if named and ARGV[3] == '1' then
  rc = 1
  redis.call('HSET', key, 'holder:@name', 1)
end
redis.call('HSET', key, 'generation', g, 'state', 'ready', 'refcount', rc, 'republished', ARGV[5])
if named then
  name_add(KEYS[2], ARGV[4])
  count_usage_in(KEYS[5], key, 1)
end
-- A counter of the wrong type or not a number is left to the allocator of
-- record's repair (store/schema_repair.hpp): the record is put back anyway.
local cur = redis.pcall('GET', KEYS[3])
if not cur then
  local t = redis.call('TIME')
  cur = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
  redis.call('SET', KEYS[3], cur)
end
local n = type(cur) == 'string' and tonumber(cur)
if n and n < tonumber(g) then redis.call('SET', KEYS[3], g) end
if named then return {'named'} end
return {'unlinked'}
)lua");

// Sets a holder's reference count on one generation to what the holder
// knows it holds (re-registration after Redis lost its data, after this
// session's key expired, or after a failover). Idempotent. With ARGV[5] >
// 0 (a replicated Redis) a record not found leaves a claim for that long
// (the holder's count in the Hash memcuda:claim:<gen>):
// its owner may hold the block still, freed on a write the failover lost,
// and keeps it (held_frees.hpp).
// -> {'ok', refcount} | {'absent'}
inline constexpr auto kReregister = join(kIndexFn, R"lua(
local key = KEYS[1]
if redis.call('HGET', key, 'generation') ~= ARGV[1] then
  key = KEYS[2]
  if redis.call('EXISTS', key) == 0 then
    if tonumber(ARGV[5]) > 0 then
      if redis.call('TYPE', KEYS[5])['ok'] ~= 'hash' then redis.call('DEL', KEYS[5]) end
      redis.call('HSET', KEYS[5], ARGV[2], ARGV[3])
      redis.call('PEXPIRE', KEYS[5], ARGV[5])
    end
    return {'absent'}
  end
end
local h = 'holder:' .. ARGV[2]
local d = tonumber(ARGV[3]) - tonumber(redis.call('HGET', key, h) or '0')
if d ~= 0 then
  if tonumber(ARGV[3]) == 0 then redis.call('HDEL', key, h) else redis.call('HSET', key, h, ARGV[3]) end
  redis.call('HINCRBY', key, 'refcount', d)
end
if tonumber(ARGV[3]) == 0 then
  unhold_in(KEYS[3], ARGV[2], ARGV[1], ARGV[4])
else
  hold_in(KEYS[3], KEYS[4], ARGV[2], ARGV[1], ARGV[4])
end
return {'ok', redis.call('HGET', key, 'refcount')}
)lua");

}  // namespace lua

namespace store {

// kMigrate of the dead owner's record `from` to the placement of `to`.
inline Answer migrate(redis::Connection& c, const Keys& k, const std::string& token, const TensorInfo& from,
                      const TensorInfo& to) {
  std::vector<redis::Arg> args{token, from.generation, from.owner, k.prefix()};
  auto put = [&](std::string_view f, redis::Arg v) {
    args.emplace_back(f);
    args.push_back(std::move(v));
  };
  put(field::ipc_handle, to.ipc_handle);
  put(field::offset, to.offset);
  put(field::alloc_bytes, to.alloc_bytes);
  put(field::alloc_id, to.alloc_id);
  put(field::owner, to.owner);
  put(field::owner_pid, to.owner_pid);
  put(field::epoch, to.epoch);
  put(field::device, to.device);
  put(field::device_uuid, to.device_uuid);
  put(field::node, to.node);
  if (!to.alloc_kind.empty()) put(field::alloc_kind, to.alloc_kind);
  // Also written empty when the old record had one: a copy into legacy IPC
  // memory must clear the vmm source.
  if (!to.fd_source.empty() || !from.fd_source.empty()) put(field::fd_source, to.fd_source);
  return answer(eval<lua::kMigrate>(c, {k.tensor(from.name), k.leader(), k.removed(from.generation), k.usage(),
                                        k.generation(), k.moved(from.generation)}, args));
}

inline Answer mark_lost(redis::Connection& c, const Keys& k, const std::string& token, const TensorInfo& t,
                        std::int64_t marker_ttl_ms, bool force) {
  return answer(eval<lua::kMarkLost>(c, {k.tensor(t.name), k.leader(), k.removed(t.generation), k.usage(), k.names(),
                                         k.lost(t.name)},
                                     {token, t.generation, t.owner, k.prefix(), marker_ttl_ms, now_ms(),
                                      force ? "1" : "0"}));
}

inline Answer republish(redis::Connection& c, const Keys& k, const TensorInfo& t, bool persistent,
                        bool may_name = true) {
  TensorInfo r = t;
  r.holders.clear();
  const protocol::Fields fields = protocol::encode_record(r);  // args point into it
  std::vector<redis::Arg> args{t.generation, k.prefix(), persistent ? "1" : "0", t.name, now_ms(),
                               may_name ? "1" : "0"};
  for (const auto& [f, v] : fields)
    if (f != field::generation && f != field::state && f != field::refcount && f != field::event_handle &&
        f != field::event_version) {
      args.emplace_back(f);
      args.emplace_back(v);
    }
  return answer(eval<lua::kRepublish>(c, {k.tensor(t.name), k.names(), k.generation(), k.removed(t.generation),
                                          k.usage()}, args));
}

// How long a holder's claim lives (kReregister): past any grace of held frees.
inline constexpr std::int64_t kClaimMs = 60000;

// kReregister: `holder` holds `n` references to generation `gen` of `name`;
// `claim_ms` > 0 leaves a claim when no record is found.
inline Answer reregister(redis::Connection& c, const Keys& k, const std::string& name, std::uint64_t gen,
                         const std::string& holder, std::int64_t n, std::int64_t claim_ms = 0) {
  return answer(eval<lua::kReregister>(c, {k.tensor(name), k.removed(gen), k.refs(holder), k.holders(),
                                           k.claim(gen)}, {gen, holder, n, name, claim_ms}));
}

// What a failover may have brought back of a freed generation: the
// record's generation under its name, whether it exists unlinked, and a
// holder's claims (held_frees.hpp: session, count, ...). Three replies per generation.
inline std::vector<redis::Command> freed_state_cmds(const Keys& k, const std::string& name, std::uint64_t gen) {
  return {{"HGET", k.tensor(name), "generation"}, {"EXISTS", k.removed(gen)}, {"HGETALL", k.claim(gen)}};
}
inline void drop_claim(redis::Connection& c, const Keys& k, std::uint64_t gen) { c.command({"DEL", k.claim(gen)}); }

}  // namespace store
}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
