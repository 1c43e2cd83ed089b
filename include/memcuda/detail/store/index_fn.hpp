// Lua functions prepended to the scripts that take, drop or unlink a
// tensor's references: they keep the indexes memcuda:refs:<holder>,
// memcuda:holders and memcuda:usage (docs/protocol.md, "Redis keys and
// scripts", says what each holds), so that every periodic task of the
// allocator of record is proportional to what changed, not to what exists.
//
// The records are the truth; these keys (and memcuda:names) are derived from
// them. A write to one of the wrong Redis type (another client's SET over
// it) is skipped (redis.pcall: no extra call on the hot path), never the
// script's failure half way: the allocator of record moves such a key aside
// and rebuilds it (detail/registry/index_repair.hpp).
#pragma once

#include "memcuda/config.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::lua {

inline constexpr char kIndexFn[] = R"lua(
-- A generation may arrive as a Lua number (INCR, TIME): written with all
-- its digits, never as '..' would (1.79e+15).
local function gen_text(g)
  if type(g) == 'number' then return string.format('%.0f', g) end
  return g
end
-- The index keys are the caller's KEYS, but for hold's prefix form: a
-- state-dict record's pins ('@dict:<id>', an id taken in the script) derive
-- them from the namespace's key prefix p (docs/protocol.md, "Keys a script
-- derives").
local function hold_in(refs, holders, h, g, n)
  if h == '@name' then return end
  redis.pcall('SADD', refs, gen_text(g) .. ':' .. n)
  -- A registry session ('<pid>-<hex>') is judged through memcuda:sessions,
  -- which the collector reads too: one call less on every get. Any other
  -- holder (pid:<n>, @dict:<id>, a JSON client's own name) is listed here.
  if not string.find(h, '^%d+%-%x+$') then redis.pcall('SADD', holders, h) end
end
local function hold(p, h, g, n) hold_in(p .. 'memcuda:refs:' .. h, p .. 'memcuda:holders', h, g, n) end
local function unhold_in(refs, h, g, n)
  if h == '@name' then return end
  redis.pcall('SREM', refs, gen_text(g) .. ':' .. n)
end
local function count_usage_in(u, key, sign)
  local f = redis.call('HMGET', key, 'backend', 'device', 'device_uuid', 'bytes')
  local b = tonumber(f[4])
  if not f[1] or not b then return end
  local d = f[1] .. ':' .. (f[2] or '') .. ':' .. (f[3] or '')
  redis.pcall('HINCRBY', u, 'tensors:' .. d, sign)
  -- never '-0' (a zero-byte tensor): Redis refuses it as an integer
  if b ~= 0 then redis.pcall('HINCRBY', u, 'bytes:' .. d, string.format('%.0f', sign * b)) end
end
-- Wakes the wait()ers of a name (pushes g onto each list of its waiters
-- set, deletes the set). A set of the wrong type (another client's) is
-- moved aside, as the allocator of record moves a key (key prefix p), and
-- a list of the wrong type skipped: never the script's failure after the
-- record is written.
local function wake_waiters(p, set, g)
  local waiting = redis.pcall('SMEMBERS', set)
  if waiting.err then
    local id = string.sub(set, #p + 9)
    local t = redis.call('TIME')
    redis.call('RENAME', set, p .. 'memcuda:quarantine:' .. id)
    redis.pcall('HSET', p .. 'memcuda:quarantined', id,
                string.format('%.0f', t[1] * 1000 + math.floor(t[2] / 1000)) .. ' a ' ..
                redis.call('TYPE', p .. 'memcuda:quarantine:' .. id)['ok'] .. ' where the key (a set) belongs')
    return
  end
  for _, l in ipairs(waiting) do
    local pushed = redis.pcall('LPUSH', l, gen_text(g))  -- a length, or an error table (a list of the wrong type)
    if type(pushed) ~= 'table' then redis.call('PEXPIRE', l, 60000) end
  end
  if #waiting > 0 then redis.call('DEL', set) end
end
-- A name in and out of the index (memcuda:names): as the writes above.
local function name_add(names, n) redis.pcall('ZADD', names, 0, n) end
local function name_rem(names, n) redis.pcall('ZREM', names, n) end
-- The names of the index (a sorted set, all scores 0) under a literal
-- prefix: a range read, never the whole index. Byte 255 never occurs in a
-- name (A-Z a-z 0-9 . _ : / -), so '(' .. pre .. '\255' bounds every name starting with pre.
-- An index of the wrong type fails the script here, before it writes, with
-- what to expect.
local function names_under(names, pre, limit)
  local r
  if limit then
    r = redis.pcall('ZRANGEBYLEX', names, '[' .. pre, '(' .. pre .. '\255', 'LIMIT', 0, limit)
  else
    r = redis.pcall('ZRANGEBYLEX', names, '[' .. pre, '(' .. pre .. '\255')
  end
  if r.err then
    error({err = 'WRONGTYPE the name index ' .. names .. ' is a ' .. redis.call('TYPE', names)['ok'] ..
                 ', not a sorted set: the allocator of record moves it aside and rebuilds it from the records' ..
                 ' at its next garbage collection round; retry then'})
  end
  return r
end
)lua";

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::lua
