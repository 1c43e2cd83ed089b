// The Lua scripts of model versions and their typed calls: a plain publish
// of the next version, and A/B versions (docs/protocol.md, "A/B model
// versions", lists the ab_* fields of the model record): a producer stages
// version N+1 in a second set of ordinary non-persistent tensors under a
// hidden prefix (a producer that dies before its commit leaves nothing)
// while readers keep N, and ONE script makes N+1 current.
#pragma once

#include "memcuda/config.hpp"

#include <unistd.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memcuda/detail/base/node.hpp"
#include "memcuda/detail/store/dict_scripts.hpp"
#include "memcuda/detail/store/index_fn.hpp"
#include "memcuda/detail/store/keys.hpp"
#include "memcuda/detail/store/node_fn.hpp"
#include "memcuda/detail/store/script_call.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {
namespace lua {

// Publishes a new version of a model (a name prefix): bumps the version,
// stores the producer's event and identity, wakes every waiter (one push
// per registered list, like create's waiters). The first publish of a
// prefix needs a tensor under it (a typo must not make a model appear).
// Each waiter is pushed what it needs to order itself (version, backend,
// device, device uuid, node, session, then the event handle, '\n'-separated;
// the handle last: it is binary), so a woken waiter makes no round trip.
// -> {'ok', version} | {'notfound'}
inline constexpr auto kPublishVersion = join(kIndexFn, R"lua(
if redis.call('EXISTS', KEYS[1]) == 0 then
  if #names_under(KEYS[3], ARGV[1], 1) == 0 then return {'notfound'} end
end
local v = redis.call('HINCRBY', KEYS[1], 'version', 1)
redis.call('HSET', KEYS[1], 'event_handle', ARGV[2], 'backend', ARGV[3], 'device', ARGV[4],
           'device_uuid', ARGV[5], 'node', ARGV[6], 'session', ARGV[7], 'pid', ARGV[8], 'published_ms', ARGV[9])
local msg = v .. '\n' .. ARGV[3] .. '\n' .. ARGV[4] .. '\n' .. ARGV[5] .. '\n' .. ARGV[6] .. '\n' .. ARGV[7] ..
            '\n' .. ARGV[2]
for _, l in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  redis.call('LPUSH', l, msg)
  redis.call('PEXPIRE', l, 60000)
end
redis.call('DEL', KEYS[2])
return {'ok', v}
)lua");


// live_sets(p, record fields): the entries of ab_live whose memory may
// still exist: the current set, a set whose record exists (linked or held
// by a reader), or one whose member the collector has not freed yet.
inline constexpr char kLiveSetsFn[] = R"lua(
local function live_sets(p, live, current)
  local kept = {}
  for v, id, g in string.gmatch(live or '', '(%d+):(%d+):(%d+)') do
    if v == current or redis.call('EXISTS', p .. 'memcuda:dict:' .. id) == 1
       or redis.call('EXISTS', p .. 'memcuda:removed:' .. g) == 1 then
      kept[#kept + 1] = v .. ':' .. id .. ':' .. g
    end
  end
  return kept
end
)lua";

// retire_under(p, names, lifecycle, usage, hidden prefix): every name under the
// prefix goes as kRemove retires it; the memory goes with its last holder
// (a free is pushed for a record nobody holds). Returns how many went.
inline constexpr auto kRetireUnderFn = join(kOwnerListFn, R"lua(
local function retire_under(p, names, lifecycle, usage, hp)
  local n = 0
  for _, name in ipairs(names_under(names, hp)) do
    local key = p .. 'memcuda:tensor:' .. name
    local f = redis.call('HMGET', key, 'generation', 'owner', 'dict', 'node')
    if f[1] then
      unlink_dict(p, f[3])
      local pc = tonumber(redis.call('HGET', key, 'holder:@name') or '0')
      if pc > 0 then
        redis.call('HDEL', key, 'holder:@name')
        redis.call('HINCRBY', key, 'refcount', -pc)
      end
      count_usage_in(usage, key, -1)
      local rkey = p .. 'memcuda:removed:' .. f[1]
      redis.call('RENAME', key, rkey)
      name_rem(names, name)
      n = n + 1
      if tonumber(redis.call('HGET', rkey, 'refcount')) <= 0 then
        local mf = redis.call('HGET', rkey, 'migrated_from')
        if mf then
          for g in string.gmatch(mf, '%d+') do redis.call('DEL', p .. 'memcuda:moved:' .. g) end
        end
        redis.call('LPUSH', owner_list(lifecycle, f[4]),
                   '{"op":"free","name":' .. cjson.encode(name) .. ',"generation":' .. f[1] .. '}')
      end
    end
  end
  return n
end
)lua");

// Reserves the staging of a new set. Refused while another live session
// stages one (a dead one's staging is taken over: its tensors go with its
// references), and when the sets whose memory may exist, plus the new one,
// would be more than max_versions. A full answer names the versions among
// them that no reader holds any more, whose memory is only waiting for the
// allocator of record to free it (a retry soon succeeds).
//
// A model without a current set whose hidden names remain lost its record
// with Redis's data (the allocator of record republished the tensors): those
// sets are retired here (their memory goes with their last reader), and the
// staging number goes on past them so that no hidden name is used twice.
// -> {'ok', next version, seq, names retired} | {'busy', session, seq}
//    | {'full', live sets, versions being released}
inline constexpr auto kAbBegin = join(kUnlinkDictFn, kIndexFn, kRetireUnderFn, kLiveSetsFn, R"lua(
local p = ARGV[1]
local f = redis.call('HMGET', KEYS[1], 'version', 'ab_staged', 'ab_live', 'ab_version')
if f[2] then
  local seq, sess = string.match(f[2], '^(%d+) (.+)$')
  if sess and redis.call('EXISTS', p .. 'memcuda:session:' .. sess) == 1 then return {'busy', sess, seq} end
end
local retired, past = 0, 0
if not f[4] then
  for _, name in ipairs(names_under(KEYS[2], ARGV[4])) do
    local s = tonumber(string.match(string.sub(name, #ARGV[4] + 1), '^(%d+)/'))
    if s and s > past then past = s end
  end
  if past > 0 then retired = retire_under(p, KEYS[2], KEYS[3], KEYS[4], ARGV[4]) end
end
local kept = live_sets(p, f[3], f[4])
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], 'ab_live', table.concat(kept, ' ')) end
if #kept + 1 > tonumber(ARGV[3]) then
  local releasing = {}
  for _, e in ipairs(kept) do
    local v, id, g = string.match(e, '^(%d+):(%d+):(%d+)$')
    -- the gone record's own pin is no reader: the collector drops it, then frees
    local h = redis.call('HMGET', p .. 'memcuda:removed:' .. g, 'refcount', 'holder:@dict:' .. id)
    if v ~= f[4] and redis.call('EXISTS', p .. 'memcuda:dict:' .. id) == 0
       and tonumber(h[1] or '0') - tonumber(h[2] or '0') <= 0 then
      releasing[#releasing + 1] = v
    end
  end
  return {'full', table.concat(kept, ' '), table.concat(releasing, ' ')}
end
local seq = redis.call('HINCRBY', KEYS[1], 'ab_seq', 1)
if seq <= past then
  seq = past + 1
  redis.call('HSET', KEYS[1], 'ab_seq', seq)
end
redis.call('HSET', KEYS[1], 'ab_staged', seq .. ' ' .. ARGV[2])
return {'ok', tonumber(f[1] or '0') + 1, seq, retired}
)lua");

// Gives up a staging (its tensors go with the producer's references).
// -> 1 | 0 (not staged)
inline constexpr char kAbAbort[] = R"lua(
if redis.call('HGET', KEYS[1], 'ab_staged') ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], 'ab_staged')
return 1
)lua";

// Makes a staged set current. Its members must be exactly the names under
// its hidden prefix, each ready and of the generation given; they become
// persistent, a state-dict record pins them (linked at the hidden prefix),
// the previous set's names are retired as kRemove does, the version is
// bumped and waiters are woken as kPublishVersion does. One atomic step:
// a reader opens the old set or the new one, never neither.
// -> {'ok', version, dict id} | {'notstaged', staged} | {'mismatch', count}
//    | {'changed', name} | {'nodesc', name}
inline constexpr auto kAbCommit = join(kUnlinkDictFn, kIndexFn, kRetireUnderFn, kLiveSetsFn, kDescMatchesFn, kGenerationFn, R"lua(
local p, hp = ARGV[1], ARGV[3]
local m = redis.call('HMGET', KEYS[1], 'ab_staged', 'ab_prefix', 'ab_live', 'ab_version')
if m[1] ~= ARGV[2] then return {'notstaged', tostring(m[1])} end
local n = #KEYS - 9
local under = redis.call('ZLEXCOUNT', KEYS[3], '[' .. hp, '(' .. hp .. '\255')
if under ~= n or n == 0 then return {'mismatch', under} end
local parts, seen, named = {}, {}, {}
local function put(s) parts[#parts + 1] = #s .. ':' .. s end
for i = 1, n do
  local name, gen = ARGV[10 + 2 * i], ARGV[11 + 2 * i]
  if string.sub(name, 1, #hp) ~= hp or seen[name] then return {'mismatch', under} end
  seen[name] = true
  local f = redis.call('HMGET', KEYS[9 + i], 'state', 'generation', 'desc', 'epoch', 'event_handle', 'event_version',
                      'holder:@name')
  if f[1] ~= 'ready' or f[2] ~= gen then return {'changed', name} end
  local d, e = f[3], f[4]
  if not desc_matches(d, gen, e) then return {'nodesc', name} end
  put(name) put(d) put(gen) put(e) put(f[5] or '') put(f[6] or '')
  named[i] = f[7] ~= false
end
-- the new set: persistent, pinned by a linked record
local id = string.format('%.0f', take_generations(KEYS[5], 1))
local rk = p .. 'memcuda:dict:' .. id
redis.call('HSET', rk, 'prefix', hp, 'state', 'linked', 'refcount', 0, 'node', ARGV[4], 'count', n,
           'blob', table.concat(parts))
local pin = 'holder:@dict:' .. id
for i = 1, n do
  if not named[i] then
    redis.call('HSET', KEYS[9 + i], 'holder:@name', 1)
    redis.call('HINCRBY', KEYS[9 + i], 'refcount', 1)
  end
  redis.call('HSET', KEYS[9 + i], 'dict', id)
  -- the version's event orders what copies a member elsewhere (a fleet's stager) after its writes
  if ARGV[5] ~= '' then redis.call('HSET', KEYS[9 + i], 'event_handle', ARGV[5]) end
  redis.call('HINCRBY', KEYS[9 + i], pin, 1)
  redis.call('HINCRBY', KEYS[9 + i], 'refcount', 1)
  hold(p, '@dict:' .. id, ARGV[11 + 2 * i], ARGV[10 + 2 * i])
end
redis.call('SET', KEYS[6], id)
redis.call('SADD', KEYS[7], hp)
redis.call('SADD', KEYS[8], id)
-- the previous set: its names go now (as kRemove), its memory with its last holder
if m[2] then retire_under(p, KEYS[3], KEYS[4], KEYS[9], m[2]) end
-- the flip, and the wake (kPublishVersion's)
local v = redis.call('HINCRBY', KEYS[1], 'version', 1)
local kept = live_sets(p, m[3], m[4])
kept[#kept + 1] = v .. ':' .. id .. ':' .. ARGV[13]
redis.call('HSET', KEYS[1], 'event_handle', ARGV[5], 'backend', ARGV[6], 'device', ARGV[7], 'device_uuid', ARGV[8],
           'node', ARGV[4], 'session', ARGV[9], 'pid', ARGV[10], 'published_ms', ARGV[11], 'ab_prefix', hp,
           'ab_version', v, 'ab_dict', id, 'ab_live', table.concat(kept, ' '))
redis.call('HDEL', KEYS[1], 'ab_staged')
local msg = v .. '\n' .. ARGV[6] .. '\n' .. ARGV[7] .. '\n' .. ARGV[8] .. '\n' .. ARGV[4] .. '\n' .. ARGV[9] ..
            '\n' .. ARGV[5]
for _, l in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  redis.call('LPUSH', l, msg)
  redis.call('PEXPIRE', l, 60000)
end
redis.call('DEL', KEYS[2])
return {'ok', v, id}
)lua");

// A reader's open (or advance) of a model's current set: one reference of
// the holder on its record, in the same atomic step that reads which set
// is current, so a commit cannot retire it in between.
// -> {'none'} (no record) | {'plain', HGETALL} (no A/B set: a model of named tensors)
//    | {'same'} (the pinned version is current) | {'inplace', HGETALL} (a newer
//    version of the pinned set) | {'unlinked', HGETALL, hidden prefix, dict id} (open per name)
//    | {'ok', HGETALL, dict id, blob, hidden prefix}
inline constexpr auto kAbOpen = join(kNodeFn, R"lua(
local p = ARGV[1]
local f = redis.call('HMGET', KEYS[1], 'version', 'ab_prefix', 'ab_dict')
if redis.call('EXISTS', KEYS[1]) == 0 then return {'none'} end
-- the same version of the same set (after Redis lost its data the numbering starts again: a new set may
-- reach the pinned version's number)
if ARGV[5] ~= '' and (f[1] or '0') == ARGV[5] and (ARGV[4] == '' or f[3] == ARGV[4]) then return {'same'} end
local rec = redis.call('HGETALL', KEYS[1])
if not f[2] then return {'plain', rec} end
if f[3] == ARGV[4] then return {'inplace', rec} end
local rk = p .. 'memcuda:dict:' .. f[3]
local d = redis.call('HMGET', rk, 'state', 'node', 'blob')
if d[1] ~= 'linked' or not same_node(d[2], ARGV[3]) then return {'unlinked', rec, f[2], f[3]} end
redis.call('HINCRBY', rk, 'refcount', 1)
redis.call('HINCRBY', rk, 'holder:' .. ARGV[2], 1)
return {'ok', rec, f[3], d[3], f[2]}
)lua");

}  // namespace lua

namespace store {

// kPublishVersion of the model `prefix`: the producer's event ('' on host),
// backend, device and device uuid order its writes for the readers.
inline Answer publish_version(redis::Connection& c, const Keys& k, std::string_view prefix, const std::string& handle,
                              std::string_view backend, int device, const std::string& uuid, const std::string& node,
                              const std::string& session) {
  Answer a = answer(eval<lua::kPublishVersion>(c, {k.model(prefix), k.model_waiters(prefix), k.names()},
                                               {prefix, handle, backend, device, uuid, node, session,
                                                static_cast<std::int64_t>(::getpid()), now_ms()}));
  replicate(c);
  return a;
}

inline Answer ab_begin(redis::Connection& c, const Keys& k, std::string_view prefix, const std::string& session,
                       unsigned max_versions, const std::string& hidden_root) {
  return answer(eval<lua::kAbBegin>(c, {k.model(prefix), k.names(), k.lifecycle(), k.usage()},
                                    {k.prefix(), session, static_cast<std::int64_t>(max_versions), hidden_root}));
}

// kAbAbort of the staging `token` ('<seq> <session>').
inline void ab_abort(redis::Connection& c, const Keys& k, std::string_view prefix, const std::string& token) {
  (void)eval<lua::kAbAbort>(c, {k.model(prefix)}, {token});
}

// kAbCommit of the set staged by `token` under `hidden`: `members` (full names, generations).
inline Answer ab_commit(redis::Connection& c, const Keys& k, std::string_view prefix, const std::string& token,
                        const std::string& hidden, const std::string& handle, std::string_view backend, int device,
                        const std::string& uuid, const std::string& node, const std::string& session,
                        const std::vector<std::pair<std::string, std::uint64_t>>& members) {
  std::vector<redis::Arg> keys{k.model(prefix), k.model_waiters(prefix), k.names(), k.lifecycle(), k.generation(),
                               k.dict_link(hidden), k.dicts(), k.dict_ids(), k.usage()};
  std::vector<redis::Arg> args{k.prefix(), token, hidden, node, handle, backend, device, uuid, session,
                               static_cast<std::int64_t>(::getpid()), now_ms()};
  for (const auto& [name, gen] : members) {
    keys.emplace_back(k.tensor(name));
    args.emplace_back(name);
    args.emplace_back(gen);
  }
  Answer a = answer(eval<lua::kAbCommit>(c, keys, args));
  replicate(c);
  return a;
}

inline Answer ab_open(redis::Connection& c, const Keys& k, std::string_view prefix, const std::string& holder,
                      const std::string& node, const std::string& pinned_dict, const std::string& pinned_version) {
  return answer(eval<lua::kAbOpen>(c, {k.model(prefix)}, {k.prefix(), holder, node, pinned_dict, pinned_version}));
}

}  // namespace store
}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
