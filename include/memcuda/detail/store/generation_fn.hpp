// The Lua function every script that hands out generations (or ids from
// the same counter) is prepended with. A generation names one record for
// good: the check that guards every stale handle compares it, so none may
// ever repeat. The counter memcuda:generation is only a hint for that:
// another Redis client can set it back or to garbage. So a new generation
// is never below the clock in microseconds, and a counter that is not a number fails the script,
// before it writes, with what to do; the allocator of record moves such a
// counter aside and raises a new one past every record's generation
// (schema_repair.hpp), then runs the command again.
#pragma once

#include "memcuda/config.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::lua {

inline constexpr char kGenerationFn[] = R"lua(
-- The first of n new consecutive generations (a Lua number); the counter
-- keeps the last.
local function take_generations(key, n)
  local cur = redis.pcall('GET', key)
  local last = 0
  if type(cur) == 'table' and cur.err then
    error({err = 'WRONGTYPE the generation counter ' .. key .. ' is a ' .. redis.call('TYPE', key)['ok'] ..
                 ', not a string: the allocator of record moves it aside and raises a new one past every' ..
                 ' generation in use; retry'})
  elseif cur then
    last = tonumber(cur)
    if not last or last < 0 or last ~= math.floor(last) then
      error({err = 'ERR the generation counter ' .. key .. " is '" .. string.sub(cur, 1, 40) ..
                   "', not a number: the allocator of record moves it aside and raises a new one past every" ..
                   ' generation in use; retry'})
    end
  end
  local t = redis.call('TIME')
  local first = math.max(last + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
  redis.call('SET', key, string.format('%.0f', first + n - 1))
  return first
end
)lua";

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::lua
