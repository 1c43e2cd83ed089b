// The Lua scripts that drop references (scripts.hpp says how scripts are
// written): one holder's reference to one generation, and every reference
// of a dead holder (the garbage collector).
#pragma once

#include "memcuda/config.hpp"

#include "memcuda/detail/store/dict_scripts.hpp"
#include "memcuda/detail/store/index_fn.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::lua {

// release_one(p, names, tkey, gen, name, holder, all, caller, refs, usage): drops one
// reference (all = every reference) of a holder to one generation of a
// tensor, wherever its Hash is (still named, or unlinked by remove). A
// generation that was migrated to a new allocator of record is followed
// through its memcuda:moved:<gen> forward. The last reference unlinks the
// name at once, so nobody can take memory about to be freed; the owner frees
// it, or the allocator of record through a "free" command. `refs` is the
// holder's reference index, `usage` the usage counters; the unlinked and
// forwarding keys of a generation are derived from the key prefix p (the
// generation is only known once the forwards were followed).
// -> {'ok', refcount} | {'free', generation} (caller owns it: record deleted,
//    free now) | {'queued', generation, name} (the caller sends the free)
//    | {'notfound'} | {'notholder'}; and the references dropped
inline constexpr auto kReleaseFn = join(kIndexFn, R"lua(
local function release_one(p, names, tkey, gen0, name, holder, all, caller, refs, usage)
  local gen = gen0
  local key, linked, held
  local h = 'holder:' .. holder
  for _ = 1, 64 do
    -- the named record's generation and the holder's count in one call
    -- (each redis.call costs about as much as the command it runs)
    local f = redis.call('HMGET', tkey, 'generation', h)
    if f[1] == gen then key = tkey; linked = true; held = f[2]; break end
    local r = p .. 'memcuda:removed:' .. gen
    if redis.call('EXISTS', r) == 1 then key = r; linked = false; break end
    gen = redis.call('GET', p .. 'memcuda:moved:' .. gen)
    if not gen then break end
  end
  if not key then
    unhold_in(refs, holder, gen0, name)
    return {'notfound'}, 0
  end
  if not linked then held = redis.call('HGET', key, h) end
  local c = tonumber(held or '0')
  if c <= 0 then
    unhold_in(refs, holder, gen0, name)
    return {'notholder'}, 0
  end
  local drop = 1
  if all then drop = c end
  if c == drop then
    redis.call('HDEL', key, h)
    unhold_in(refs, holder, gen0, name)
  else
    redis.call('HINCRBY', key, h, -drop)
  end
  local rc = redis.call('HINCRBY', key, 'refcount', -drop)
  if rc > 0 then return {'ok', rc}, drop end
  local f = redis.call('HMGET', key, 'name', 'owner', 'migrated_from')
  if f[3] then
    for g in string.gmatch(f[3], '%d+') do redis.call('DEL', p .. 'memcuda:moved:' .. g) end
  end
  if linked then
    count_usage_in(usage, key, -1)
    name_rem(names, f[1])
  end
  if f[2] == caller then
    redis.call('DEL', key)  -- the caller owns the memory and frees it now
    return {'free', gen}, drop
  end
  if linked then redis.call('RENAME', key, p .. 'memcuda:removed:' .. gen) end
  return {'queued', gen, f[1]}, drop
end
)lua");

// Drops one reference of a holder to one generation of a tensor
// (release_one above).
// KEYS: tensor, names, lifecycle, leader, the holder's reference index, usage
// ARGV: generation, holder, key prefix, caller session, token ('' = unfenced),
//       'all' to drop every reference of the holder, name
// -> {'ok', refcount} | {'free', generation} (caller owns it: record deleted, free now)
//    | {'queued', generation} | {'notfound'} | {'notholder'} | {'notleader', t}
inline constexpr auto kRelease = join(kReleaseFn, R"lua(
if ARGV[5] ~= '' and redis.call('GET', KEYS[4]) ~= ARGV[5] then
  return {'notleader', tostring(redis.call('GET', KEYS[4]))}
end
local r = release_one(ARGV[3], KEYS[2], KEYS[1], ARGV[1], ARGV[7] or '', ARGV[2], ARGV[6] == 'all', ARGV[4], KEYS[5],
                      KEYS[6])
if r[1] == 'queued' then
  -- generations pass 2^47: written as digits, not through cjson's 14-digit numbers
  redis.call('LPUSH', KEYS[3], '{"op":"free","name":' .. cjson.encode(r[3]) .. ',"generation":' .. r[2] .. '}')
  return {'queued', r[2]}
end
return r
)lua");

// Drops every reference of one dead holder to the records its index names
// (the garbage collector; fenced). Each member goes from the index as it is
// handled; the holder leaves memcuda:holders with its last member. What the
// caller owns comes back to be freed; what another owner has goes to the
// allocator of record in one "free" command of many generations.
// KEYS: names, lifecycle, leader, the holder's index, holders set, usage, then
//       per index member the tensor key of its name (any key for a member
//       without ':', which is only dropped)
// ARGV: token ('' = unfenced), holder, key prefix, caller session, then index members
//       ('<generation>:<name>')
// -> {'ok', references dropped, tensors unlinked, generation to free, ...}
//    | {'notleader', t}
inline constexpr auto kReleaseHolder = join(kReleaseFn, R"lua(
if ARGV[1] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[1] then
  return {'notleader', tostring(redis.call('GET', KEYS[3]))}
end
local p = ARGV[3]
local out = {'ok', 0, 0}
local queued = {}
for i = 5, #ARGV do
  local m = ARGV[i]
  local c = string.find(m, ':', 1, true)
  if c then
    local gen, name = string.sub(m, 1, c - 1), string.sub(m, c + 1)
    local r, dropped = release_one(p, KEYS[1], KEYS[2 + i], gen, name, ARGV[2], true, ARGV[4], KEYS[4], KEYS[6])
    out[2] = out[2] + dropped
    if r[1] == 'free' then
      out[3] = out[3] + 1
      out[#out + 1] = r[2]
    elseif r[1] == 'queued' then
      out[3] = out[3] + 1
      queued[#queued + 1] = r[2]
    end
  end
  redis.pcall('SREM', KEYS[4], m)  -- an index of the wrong type: GC moves it aside
end
if #queued > 0 then
  redis.call('LPUSH', KEYS[2], '{"op":"free","generations":[' .. table.concat(queued, ',') .. ']}')
end
if redis.call('EXISTS', KEYS[4]) == 0 then redis.pcall('SREM', KEYS[5], ARGV[2]) end
return out
)lua");

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::lua
