// The Lua scripts of the batch operations (get many, create many, remove
// many). Each is one atomic script, so a batch is one Redis round trip and
// no other client sees it half done. They follow the rules of scripts.hpp:
// expected outcomes are {status, ...} tables, names are KEYS/ARGV, and a
// script the allocator of record runs to create is fenced by its token.
#pragma once

#include "memcuda/config.hpp"

#include <string>

#include "memcuda/detail/store/dict_scripts.hpp"
#include "memcuda/detail/store/generation_fn.hpp"
#include "memcuda/detail/store/index_fn.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::lua {

// Prepended to the scripts that find a key under a tensor's name:
// record_generation(key) -> generation, key type. The generation is false
// when the key is not a record of ours (not a Hash, or a Hash without a
// generation, e.g. written by hand): such a stray key is reported, never
// overwritten or renamed.
inline constexpr char kStrayFn[] = R"lua(
local function record_generation(k)
  local ty = redis.call('TYPE', k)['ok']
  if ty ~= 'hash' then return false, ty end
  return redis.call('HGET', k, 'generation'), ty
end
)lua";

// Takes one reference of a holder to each of many tensors, atomically. Each
// name is checked like kAcquire (state, dtype, node); a refused name takes
// nothing, the others are taken. The names are given, or every linked name
// starting with a prefix, or matching an anchored Lua pattern (the caller
// translates a glob and gives its literal prefix: only names under it are
// read), sorted.
// KEYS: leader, names index, the holder's reference index, holders index,
//       then (mode 'names') per name: tensor, lost marker
// ARGV: holder, node, token ('' = unfenced), key prefix (only for the
//       record keys of the names a prefix or pattern selects), mode ('names' |
//       'prefix' | 'pattern'), prefix or pattern, then (mode 'names') per
//       name: name, dtype ('' = any), or (mode 'pattern') the pattern's
//       literal prefix
// -> {'notleader', token} | {{name, status, ...}, ...} where each entry is
//    {name, 'desc', desc, generation, epoch, refcount, event_handle | nil,
//    event_version | nil} (the record's desc field, record_desc.hpp, is of a
//    version this script knows and ends with the record's own epoch and
//    generation)
//    | {name, 'ok', HGETALL...} (no usable desc: a record of a
//    single create, or republished) | {name, 'notfound'} | {name, 'lost',
//    HGETALL of the marker} | {name, 'state', s} | {name, 'dtype', d}
//    | {name, 'node', n} | {name, 'corrupt', what} (no reference taken)
// One HMGET of 8 small fields instead of an HGETALL of ~23 per name: the
// HGETALL and its nested reply were most of a 291-name batch's time in
// Redis (docs/protocol.md, "The desc field").
inline constexpr auto kAcquireMany = join(kNodeFn, kIndexFn, R"lua(
if ARGV[3] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[3] then
  return {'notleader', tostring(redis.call('GET', KEYS[1]))}
end
local function take(name, tkey, lkey, dtype)
  local f = redis.call('HMGET', tkey, 'state', 'dtype', 'node', 'desc', 'generation', 'epoch', 'event_handle',
                      'event_version', 'refcount')
  if not f[1] then
    if redis.call('EXISTS', lkey) == 1 then return {name, 'lost', redis.call('HGETALL', lkey)} end
    return {name, 'notfound'}
  end
  if f[1] ~= 'ready' then return {name, 'state', f[1]} end
  if dtype ~= '' and f[2] ~= dtype then return {name, 'dtype', f[2]} end
  if not same_node(f[3], ARGV[2]) then return {name, 'node', f[3]} end
  local n = tonumber(f[9])
  if not tonumber(f[5]) or (f[9] and (not n or n < 0)) then
    return {name, 'corrupt', 'generation ' .. tostring(f[5]) .. ', refcount ' .. tostring(f[9])}
  end
  local rc = redis.call('HINCRBY', tkey, 'refcount', 1)
  -- only the holder's first reference adds its index member (as kAcquire)
  if redis.call('HINCRBY', tkey, 'holder:' .. ARGV[1], 1) == 1 then hold_in(KEYS[3], KEYS[4], ARGV[1], f[5], name) end
  -- The desc, when of version M1 and ending with this epoch's and this
  -- generation's elements ('<len>:' epoch '<len>:' generation): checked
  -- with string.byte and plain finds, which make no string (the client
  -- checks both exactly again).
  local d, g, e = f[4], f[5], f[6]
  if d and g and e and string.byte(d, 1) == 77 and string.byte(d, 2) == 49 then
    local gs = #d - #g + 1
    local es = gs - 1 - #tostring(#g) - #e
    if es > 3 and string.byte(d, gs - 1) == 58 and string.find(d, g, gs, true) == gs
       and string.byte(d, es - 1) == 58 and string.find(d, e, es, true) == es then
      return {name, 'desc', d, g, e, rc, f[7] or false, f[8] or false}
    end
  end
  return {name, 'ok', redis.call('HGETALL', tkey)}
end
local out = {}
if ARGV[5] == 'names' then
  local n = (#KEYS - 4) / 2
  for i = 1, n do
    out[i] = take(ARGV[5 + 2 * i], KEYS[3 + 2 * i], KEYS[4 + 2 * i], ARGV[6 + 2 * i])
  end
  return out
end
local pre = ARGV[6]
if ARGV[5] == 'pattern' then pre = ARGV[7] or '' end
for _, n in ipairs(names_under(KEYS[2], pre)) do
  if ARGV[5] == 'prefix' or string.match(n, ARGV[6]) ~= nil then
    out[#out + 1] = take(n, ARGV[4] .. 'memcuda:tensor:' .. n, ARGV[4] .. 'memcuda:lost:' .. n, '')
  end
end
return out
)lua");

// Publishes many tensors the leader has just allocated, all or nothing:
// when one name is taken, nothing is written. A retried batch (every name
// already holds its entry's create_id) is answered as a replay. The
// generations are consecutive.
// KEYS: names, leader, generation counter, then per entry: tensor, waiters, lost marker
// ARGV: token, n, then per entry: name, create_id, ready channel, holder,
//       persistent (0|1), desc body (record_desc.hpp; the script appends
//       the generation element), field count k, then k field/value pairs;
//       last, the key prefix (the index and state-dict keys it derives)
// -> {'ok', gen1, rc1, gen2, rc2, ...} | {'replay', gen1, rc1, ...}
//    | {'exists', entry index (1-based), generation} | {'stray', entry index,
//    key type} (its key is not a record of ours; left as it is) | {'notleader', token}
inline constexpr auto kCreateMany = join(kUnlinkDictFn, kStrayFn, kIndexFn, kGenerationFn, R"lua(
local lead = redis.call('GET', KEYS[2])
if lead ~= ARGV[1] then return {'notleader', tostring(lead)} end
local n = tonumber(ARGV[2])
local at = {}
local p = 3
for i = 1, n do
  at[i] = p
  p = p + 7 + 2 * tonumber(ARGV[p + 6])
end
local replays = 0
for i = 1, n do
  local t = KEYS[1 + 3 * i]
  if redis.call('EXISTS', t) == 1 then
    local rg, ty = record_generation(t)
    if not rg then return {'stray', i, ty} end
    local cid = ARGV[at[i] + 1]
    if cid ~= '' and redis.call('HGET', t, 'create_id') == cid then
      replays = replays + 1
    else
      return {'exists', i, rg}
    end
  end
end
if replays > 0 then
  if replays < n then  -- a replay some of whose tensors were removed since
    for i = 1, n do
      if redis.call('EXISTS', KEYS[1 + 3 * i]) == 0 then return {'exists', i, '0'} end
    end
  end
  local out = {'replay'}
  for i = 1, n do
    local t = KEYS[1 + 3 * i]
    out[#out + 1] = redis.call('HGET', t, 'generation')
    out[#out + 1] = redis.call('HGET', t, 'refcount')
  end
  return out
end
local base = take_generations(KEYS[3], n)
-- new names under a linked state dict: the dict no longer says get_prefix's names
local kp = ARGV[#ARGV]
if redis.call('SCARD', kp .. 'memcuda:dicts') > 0 then
  for i = 1, n do unlink_dicts_over(kp, ARGV[at[i]]) end
end
local out = {'ok'}
for i = 1, n do
  local a = at[i]
  local gen = string.format('%.0f', base + i - 1)
  local t = KEYS[1 + 3 * i]
  redis.call('DEL', KEYS[3 + 3 * i])
  local k = tonumber(ARGV[a + 6])
  local desc = ARGV[a + 5] .. #gen .. ':' .. gen
  -- the whole record in one HSET (as create: each redis.call costs a
  -- dispatch), unpack last so that it expands fully
  local rc = 1
  if ARGV[a + 4] == '1' then
    rc = 2
    redis.call('HSET', t, 'generation', gen, 'state', 'ready', 'refcount', rc, 'holder:' .. ARGV[a + 3], 1,
               'holder:@name', 1, 'desc', desc, unpack(ARGV, a + 7, a + 6 + 2 * k))
  else
    redis.call('HSET', t, 'generation', gen, 'state', 'ready', 'refcount', rc, 'holder:' .. ARGV[a + 3], 1,
               'desc', desc, unpack(ARGV, a + 7, a + 6 + 2 * k))
  end
  name_add(KEYS[1], ARGV[a])
  hold(kp, ARGV[a + 3], gen, ARGV[a])
  count_usage(kp, t, 1)
  redis.call('PUBLISH', ARGV[a + 2], gen)
  wake_waiters(kp, KEYS[2 + 3 * i], gen)
  out[#out + 1] = gen
  out[#out + 1] = rc
end
return out
)lua");

// Unlinks many names at once, each as kRemove does (the name's own
// reference of a persistent tensor is dropped; the memory goes with the
// last holder). The names are given, or selected like kAcquireMany. What
// another owner must free goes to the allocator of record as one "free"
// command of many generations.
// KEYS: names, lifecycle, then (mode 'names') per name: tensor
// ARGV: key prefix, caller session, mode, prefix or pattern, then (mode
//       'names') the names, or (mode 'pattern') the pattern's literal prefix
// -> {{name, 'ok', generation, refcount} | {name, 'free', generation}
//     | {name, 'queued', generation} | {name, 'notfound'}
//     | {name, 'stray', key type} (not a record of ours: left as it is), ...}
inline constexpr auto kRemoveMany = join(kUnlinkDictFn, kStrayFn, kIndexFn, R"lua(
local queued = {}
local function rm(name, tkey)
  if redis.call('EXISTS', tkey) == 0 then return {name, 'notfound'} end
  local rg, ty = record_generation(tkey)
  if not rg then return {name, 'stray', ty} end
  local f = redis.call('HMGET', tkey, 'generation', 'name', 'owner', 'dict')
  unlink_dict(ARGV[1], f[4])
  local rkey = ARGV[1] .. 'memcuda:removed:' .. f[1]
  local pc = tonumber(redis.call('HGET', tkey, 'holder:@name') or '0')
  if pc > 0 then
    redis.call('HDEL', tkey, 'holder:@name')
    redis.call('HINCRBY', tkey, 'refcount', -pc)
  end
  count_usage(ARGV[1], tkey, -1)
  redis.call('RENAME', tkey, rkey)
  name_rem(KEYS[1], f[2])
  local rc = tonumber(redis.call('HGET', rkey, 'refcount'))
  if rc > 0 then return {name, 'ok', f[1], rc} end
  local mf = redis.call('HGET', rkey, 'migrated_from')
  if mf then
    for g in string.gmatch(mf, '%d+') do redis.call('DEL', ARGV[1] .. 'memcuda:moved:' .. g) end
  end
  if f[3] == ARGV[2] then
    redis.call('DEL', rkey)
    return {name, 'free', f[1]}
  end
  queued[#queued + 1] = f[1]
  return {name, 'queued', f[1]}
end
local function send_frees()
  -- one command per 1000 generations (a free holds at most 2048)
  for i = 1, #queued, 1000 do
    redis.call('LPUSH', KEYS[2],
               '{"op":"free","generations":[' .. table.concat(queued, ',', i, math.min(i + 999, #queued)) .. ']}')
  end
end
local out = {}
if ARGV[3] == 'names' then
  for i = 3, #KEYS do out[#out + 1] = rm(ARGV[2 + i], KEYS[i]) end
  send_frees()
  return out
end
local pre = ARGV[4]
if ARGV[3] == 'pattern' then pre = ARGV[5] or '' end
for _, n in ipairs(names_under(KEYS[1], pre)) do
  if ARGV[3] == 'prefix' or string.match(n, ARGV[4]) ~= nil then out[#out + 1] = rm(n, ARGV[1] .. 'memcuda:tensor:' .. n) end
end
send_frees()
return out
)lua");

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::lua
