// The Lua scripts that change registry state. Each runs atomically in Redis,
// so refcounts, holders and the name index never disagree. Scripts run by
// the allocator of record take its lease token and refuse to write when the
// lease is no longer theirs (fencing: a paused ex-leader cannot corrupt
// state). Expected outcomes come back as {status, ...} tables, not errors.
// Names and other data are always KEYS/ARGV, never spliced into the source.
#pragma once

#include "memcuda/config.hpp"

#include "memcuda/detail/store/batch_scripts.hpp"
#include "memcuda/detail/store/dict_scripts.hpp"
#include "memcuda/detail/store/generation_fn.hpp"
#include "memcuda/detail/store/index_fn.hpp"
#include "memcuda/detail/store/release_scripts.hpp"
#include "memcuda/detail/store/model_ab_scripts.hpp"
#include "memcuda/redis/connection.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::lua {

// KEYS: leader, epoch   ARGV: session, ttl_ms
// -> {1, token} when taken, {0, current token} when someone holds it.
inline constexpr const char* kLeaseAcquire = R"lua(
local cur = redis.call('GET', KEYS[1])
if cur then return {0, cur} end
local e = redis.call('INCR', KEYS[2])
local token = e .. ' ' .. ARGV[1]
redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
return {1, token}
)lua";

// KEYS: leader   ARGV: token, ttl_ms  -> 1 renewed, 0 lost
inline constexpr const char* kLeaseRenew = R"lua(
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
)lua";

// KEYS: leader   ARGV: token  -> 1 released, 0 not ours
inline constexpr const char* kLeaseRelease = R"lua(
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
)lua";

// Publishes a tensor the leader has just allocated. The first generation of
// a fresh Redis is its clock in microseconds, so generations stay unique
// across a Redis restart that lost its data (records republished from the
// processes keep theirs).
// KEYS: tensor, names, leader, generation counter, waiters set of the name, lost marker,
//       usage, the holder's reference index, holders index, the linked
//       state-dict prefixes
// ARGV: token, name, create_id, ready channel, holder, persistent(0|1), key prefix
//       (for the state-dict records and links it unlinks: named by data),
//       field, value, ...
// -> {'ok', generation, refcount} | {'replay', generation, refcount} (same create_id
//    already done) | {'exists', generation} | {'stray', key type} (the key is
//    not a record of ours: no generation field, or not a Hash; left as it is)
//    | {'notleader', current token}
inline constexpr auto kCreate = join(kUnlinkDictFn, kStrayFn, kIndexFn, kGenerationFn, R"lua(
local lead = redis.call('GET', KEYS[3])
if lead ~= ARGV[1] then return {'notleader', tostring(lead)} end
if redis.call('EXISTS', KEYS[1]) == 1 then
  local g, ty = record_generation(KEYS[1])
  if not g then return {'stray', ty} end
  if ARGV[3] ~= '' and redis.call('HGET', KEYS[1], 'create_id') == ARGV[3] then
    return {'replay', g, redis.call('HGET', KEYS[1], 'refcount')}
  end
  return {'exists', g}
end
-- a new name under a linked state dict: the dict no longer says get_prefix's names
unlink_dicts_over_in(ARGV[7], KEYS[10], ARGV[2])
local gen = take_generations(KEYS[4], 1)
redis.call('DEL', KEYS[6])
-- The whole record in one HSET (unpack last, so it expands fully): every
-- redis.call costs argument conversion and a command dispatch, and Redis
-- runs nothing else meanwhile. The fields the script sets come first; the
-- caller never sends them (generation, state, refcount, holder:*).
local rc = 1
if ARGV[6] == '1' then
  rc = 2
  redis.call('HSET', KEYS[1], 'generation', gen, 'state', 'ready', 'refcount', rc, 'holder:' .. ARGV[5], 1,
             'holder:@name', 1, unpack(ARGV, 8))
else
  redis.call('HSET', KEYS[1], 'generation', gen, 'state', 'ready', 'refcount', rc, 'holder:' .. ARGV[5], 1,
             unpack(ARGV, 8))
end
name_add(KEYS[2], ARGV[2])
hold_in(KEYS[8], KEYS[9], ARGV[5], gen, ARGV[2])
count_usage_in(KEYS[7], KEYS[1], 1)
redis.call('PUBLISH', ARGV[4], gen)
wake_waiters(ARGV[7], KEYS[5], gen)
return {'ok', gen, rc}
)lua");

// Takes a reference (the get fast path; also the leader's JSON get).
// KEYS: tensor, leader, lost marker of the name, the holder's reference
//       index, holders index (every key it touches: none derived)
// ARGV: holder, dtype ('' = any), node, token ('' = unfenced),
//       generation the caller has cached ('' = none), its event_version, name
// -> {'ok', HGETALL...} | {'same', refcount} (the cached record is current:
//    same generation and event version, nothing else changes after creation)
//    | {'notfound'} | {'lost', HGETALL of the marker} | {'state', s} | {'dtype', d}
//    | {'node', n} | {'notleader', token} | {'corrupt', what} (no reference
//    taken: the generation or refcount field does not parse, or is negative)
inline constexpr auto kAcquire = join(kNodeFn, kIndexFn, R"lua(
if ARGV[4] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[4] then
  return {'notleader', tostring(redis.call('GET', KEYS[2]))}
end
local f = redis.call('HMGET', KEYS[1], 'state', 'dtype', 'node', 'generation', 'event_version', 'refcount')
if not f[1] then
  if redis.call('EXISTS', KEYS[3]) == 1 then return {'lost', redis.call('HGETALL', KEYS[3])} end
  return {'notfound'}
end
if f[1] ~= 'ready' then return {'state', f[1]} end
if ARGV[2] ~= '' and f[2] ~= ARGV[2] then return {'dtype', f[2]} end
if not same_node(f[3], ARGV[3]) then return {'node', f[3]} end
local n = tonumber(f[6])
if not tonumber(f[4]) or (f[6] and (not n or n < 0)) then
  return {'corrupt', 'generation ' .. tostring(f[4]) .. ', refcount ' .. tostring(f[6])}
end
local rc = redis.call('HINCRBY', KEYS[1], 'refcount', 1)
-- the index has one member per record a holder has references to: only
-- its first reference adds it (a release removes it with the last)
if redis.call('HINCRBY', KEYS[1], 'holder:' .. ARGV[1], 1) == 1 then hold_in(KEYS[4], KEYS[5], ARGV[1], f[4], ARGV[7]) end
if ARGV[5] ~= '' and f[4] == ARGV[5] and f[5] == ARGV[6] then return {'same', rc} end
return {'ok', redis.call('HGETALL', KEYS[1])}
)lua");

// Unlinks a name now (a new create may reuse it). A persistent tensor's
// reference held by the name is dropped; memory goes when the last holder
// releases.
// KEYS: tensor, names, lifecycle   ARGV: key prefix, caller session
// -> {'ok', generation, refcount} | {'free', generation} | {'queued', generation} | {'notfound'}
//    | {'stray', key type} (not a record of ours: left as it is)
inline constexpr auto kRemove = join(kUnlinkDictFn, kStrayFn, kIndexFn, R"lua(
if redis.call('EXISTS', KEYS[1]) == 0 then return {'notfound'} end
local rg, ty = record_generation(KEYS[1])
if not rg then return {'stray', ty} end
local f = redis.call('HMGET', KEYS[1], 'generation', 'name', 'owner', 'dict')
unlink_dict(ARGV[1], f[4])
local rkey = ARGV[1] .. 'memcuda:removed:' .. f[1]
local pc = tonumber(redis.call('HGET', KEYS[1], 'holder:@name') or '0')
if pc > 0 then
  redis.call('HDEL', KEYS[1], 'holder:@name')
  redis.call('HINCRBY', KEYS[1], 'refcount', -pc)
end
count_usage(ARGV[1], KEYS[1], -1)
redis.call('RENAME', KEYS[1], rkey)
name_rem(KEYS[2], f[2])
local rc = tonumber(redis.call('HGET', rkey, 'refcount'))
if rc > 0 then return {'ok', f[1], rc} end
local mf = redis.call('HGET', rkey, 'migrated_from')
if mf then
  for g in string.gmatch(mf, '%d+') do redis.call('DEL', ARGV[1] .. 'memcuda:moved:' .. g) end
end
if f[3] == ARGV[2] then
  redis.call('DEL', rkey)
  return {'free', f[1]}
end
redis.call('LPUSH', KEYS[3], '{"op":"free","name":' .. cjson.encode(f[2]) .. ',"generation":' .. f[1] .. '}')
return {'queued', f[1]}
)lua");

// The start of the scripts that act on a dead allocator's tensor (fenced;
// KEYS[1] tensor, KEYS[2] leader; ARGV[1] token, ARGV[2] generation,
// ARGV[4] key prefix): finds the record of that generation, named or
// unlinked, as `key` (and `linked`), or answers 'gone'.
inline constexpr char kDeadOwnerRecord[] = R"lua(
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return {'notleader', tostring(redis.call('GET', KEYS[2]))} end
local key = KEYS[1]
local linked = true
if redis.call('HGET', key, 'generation') ~= ARGV[2] then
  key = ARGV[4] .. 'memcuda:removed:' .. ARGV[2]
  linked = false
  if redis.call('EXISTS', key) == 0 then return {'gone'} end
end
)lua";

// Republishes a tensor of a dead allocator of record after a live holder
// copied its bytes into a replacement this leader allocated: the record
// (named or unlinked) gets the new memory's fields and a new generation,
// and memcuda:moved:<old> forwards releases of the old generation.
// KEYS: tensor, leader, generation counter
// ARGV: token, old generation, dead owner, key prefix, field, value, ...
// -> {'ok', new generation} | {'gone'} (released, removed or migrated
//    meanwhile) | {'notleader', t}
inline constexpr auto kMigrate = join(kUnlinkDictFn, kIndexFn, kDeadOwnerRecord, kGenerationFn, R"lua(
local f = redis.call('HMGET', key, 'owner', 'refcount', 'migrated_from', 'dict')
if f[1] ~= ARGV[3] or tonumber(f[2] or '0') <= 0 then return {'gone'} end
unlink_dict(ARGV[4], f[4])  -- its desc described the old placement
-- as text: Lua would print a number this large as 1.79e+15
local gen = string.format('%.0f', take_generations(KEYS[3], 1))
if linked then count_usage(ARGV[4], key, -1) end
redis.call('HSET', key, unpack(ARGV, 5))
if linked then count_usage(ARGV[4], key, 1) end
redis.call('HDEL', key, 'event_handle', 'desc')  -- desc described the old placement
redis.call('HSET', key, 'generation', gen, 'event_version', 0,
           'migrated_from', (f[3] and (f[3] .. ' ') or '') .. ARGV[2])
redis.call('SET', ARGV[4] .. 'memcuda:moved:' .. ARGV[2], gen)
if not linked then redis.call('RENAME', key, ARGV[4] .. 'memcuda:removed:' .. gen) end
return {'ok', gen}
)lua");

// Gives up a tensor of a dead allocator of record that no live process can
// copy: the record goes, the name is free again, and a marker (kept
// ARGV[5] ms) makes get() say what happened. Refused while a live session
// holds a reference, unless forced.
// KEYS: tensor, leader, names, lost marker of the name
// ARGV: token, generation, dead owner, key prefix, marker ttl ms, now ms, force ('1'|'0')
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
if linked then count_usage(ARGV[4], key, -1) end
redis.call('DEL', key)
if linked then
  name_rem(KEYS[3], m[1])
  redis.call('DEL', KEYS[4])
  redis.call('HSET', KEYS[4], 'generation', ARGV[2], 'owner', ARGV[3], 'owner_pid', m[2] or '0',
             'epoch', m[3] or '0', 'lost_ms', ARGV[6])
  redis.call('PEXPIRE', KEYS[4], ARGV[5])
  return {'lost', 1}
end
return {'lost', 0}
)lua");

// Writes back a record its owner still has after Redis lost its data: under
// the name when the name is free, else as unlinked. Holders re-register
// their references with kReregister. The generation counter is raised past
// every republished generation (and, on a fresh Redis, to its clock).
// KEYS: tensor, names, generation counter
// ARGV: generation, key prefix, persistent ('1'|'0'), name, now ms, field, value, ...
// -> {'named'} | {'unlinked'} | {'present'}
inline constexpr auto kRepublish = join(kIndexFn, R"lua(
local g = ARGV[1]
if redis.call('HGET', KEYS[1], 'generation') == g then return {'present'} end
local r = ARGV[2] .. 'memcuda:removed:' .. g
if redis.call('EXISTS', r) == 1 then return {'present'} end
local named = redis.call('EXISTS', KEYS[1]) == 0
local key = r
if named then key = KEYS[1] end
redis.call('HDEL', key, 'desc')  -- a fresh key here; kept so the fields stay the only truth
redis.call('HSET', key, unpack(ARGV, 6))
local rc = 0
if named and ARGV[3] == '1' then
  rc = 1
  redis.call('HSET', key, 'holder:@name', 1)
end
redis.call('HSET', key, 'generation', g, 'state', 'ready', 'refcount', rc, 'republished', ARGV[5])
if named then
  name_add(KEYS[2], ARGV[4])
  count_usage(ARGV[2], key, 1)
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
// knows it holds (re-registration after Redis lost its data, or after this
// session's key expired). Idempotent.
// KEYS: tensor   ARGV: generation, holder, count, key prefix, name
// -> {'ok', refcount} | {'absent'}
inline constexpr auto kReregister = join(kIndexFn, R"lua(
local key = KEYS[1]
if redis.call('HGET', key, 'generation') ~= ARGV[1] then
  key = ARGV[4] .. 'memcuda:removed:' .. ARGV[1]
  if redis.call('EXISTS', key) == 0 then return {'absent'} end
end
local h = 'holder:' .. ARGV[2]
local d = tonumber(ARGV[3]) - tonumber(redis.call('HGET', key, h) or '0')
if d ~= 0 then
  if tonumber(ARGV[3]) == 0 then redis.call('HDEL', key, h) else redis.call('HSET', key, h, ARGV[3]) end
  redis.call('HINCRBY', key, 'refcount', d)
end
if tonumber(ARGV[3]) == 0 then unhold(ARGV[4], ARGV[2], ARGV[1], ARGV[5]) else hold(ARGV[4], ARGV[2], ARGV[1], ARGV[5]) end
return {'ok', redis.call('HGET', key, 'refcount')}
)lua");

// Publishes a producer's interprocess event for one generation.
// A state dict linked over the tensor is unlinked: its record carries the
// events of its link time.
// KEYS: tensor   ARGV: generation, event handle (raw bytes), key prefix
// -> new event_version, or -1 when the name no longer has that generation
inline constexpr auto kPublish = join(kUnlinkDictFn, R"lua(
if redis.call('HGET', KEYS[1], 'generation') ~= ARGV[1] then return -1 end
unlink_dict(ARGV[3], redis.call('HGET', KEYS[1], 'dict'))
redis.call('HSET', KEYS[1], 'event_handle', ARGV[2])
return redis.call('HINCRBY', KEYS[1], 'event_version', 1)
)lua");

// Publishes a new version of a model (a name prefix): bumps the version,
// stores the producer's event and identity, wakes every waiter (one push
// per registered list, like create's waiters). The first publish of a
// prefix needs a tensor under it (a typo must not make a model appear).
// Each waiter is pushed what it needs to order itself (version, backend,
// device, device uuid, node, session, then the event handle, '\n'-separated;
// the handle last: it is binary), so a woken waiter makes no round trip.
// KEYS: model record, its waiters set, names
// ARGV: prefix, event handle ('' = host), backend, device, device uuid,
//       node, session, pid, time ms
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

// Finishes a command the leader took: takes it off the leader's processing
// list and, in the same atomic step, delivers its reply to the list the
// command named in reply_to. A command no longer there (this leader's retry
// after the script's own reply was lost, or a successor re-queued the list)
// is not answered again, so each command taken is answered at most once,
// and a command answered is never re-queued. Only lists (or absent keys)
// receive replies, and only a list this script created (or one that already
// expires) gets the expiry, so a hostile reply_to cannot make the leader
// touch or expire any other key.
// KEYS: processing list, reply list   ARGV: command, reply body, ttl_ms, deliver ('1'|'0')
// -> 1 delivered, 0 refused (not a list), 2 nothing to deliver, -1 finished before
inline constexpr const char* kFinish = R"lua(
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
// KEYS: lifecycle, processing list set   ARGV: our processing list
// -> number of commands re-queued
inline constexpr const char* kRequeue = R"lua(
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

// One set of loaded scripts; each thread that runs scripts owns one (the
// SHA cache inside a Script is not shared between threads).
struct Scripts {
  redis::Script lease_acquire{kLeaseAcquire};
  redis::Script lease_renew{kLeaseRenew};
  redis::Script lease_release{kLeaseRelease};
  redis::Script create{kCreate};
  redis::Script acquire{kAcquire};
  redis::Script release{kRelease};
  redis::Script remove{kRemove};
  redis::Script requeue{kRequeue};
  redis::Script publish{kPublish};
  redis::Script finish{kFinish};
  redis::Script migrate{kMigrate};
  redis::Script mark_lost{kMarkLost};
  redis::Script republish{kRepublish};
  redis::Script reregister{kReregister};
  redis::Script publish_version{kPublishVersion};
  redis::Script release_holder{kReleaseHolder};
  // batch operations (batch_scripts.hpp)
  redis::Script acquire_many{kAcquireMany};
  redis::Script create_many{kCreateMany};
  redis::Script remove_many{kRemoveMany};
  // state-dict records (dict_scripts.hpp)
  redis::Script dict_link{kDictLink};
  redis::Script dict_acquire{kDictAcquire};
  redis::Script dict_release{kDictRelease};
  redis::Script dict_reregister{kDictReregister};
  // A/B model versions (model_ab_scripts.hpp)
  redis::Script ab_begin{kAbBegin};
  redis::Script ab_abort{kAbAbort};
  redis::Script ab_commit{kAbCommit};
  redis::Script ab_open{kAbOpen};
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::lua
