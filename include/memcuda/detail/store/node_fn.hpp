// The Lua form of same_node (base/node.hpp), prepended to the scripts that
// refuse a record of another node: containers of one machine have
// hostnames of their own and one boot id, the part after the last '/'.
#pragma once

#include "memcuda/config.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::lua {

inline constexpr char kNodeFn[] = R"lua(
local function same_node(a, b)
  if a == b then return true end
  if type(a) ~= 'string' or type(b) ~= 'string' then return false end
  local x, y = string.match(a, '/([^/]+)$'), string.match(b, '/([^/]+)$')
  return x ~= nil and x == y
end
)lua";

// owner_list(list, node): the lifecycle list of the node whose allocator of
// record owns a record (`node`, its node field), given the caller's. In a
// fleet the caller's list ends in "@<scope>" and another node's record goes
// to its own node's list ("@" and node_scope of base/node.hpp: the part
// after the last '/'); outside a fleet there is one list. frees_add and
// frees_send group the frees a script queues by that list.
inline constexpr char kOwnerListFn[] = R"lua(
local function owner_list(list, node)
  local at = string.find(list, '@', 1, true)
  if not at or type(node) ~= 'string' or node == '' then return list end
  return string.sub(list, 1, at) .. (string.match(node, '/([^/]+)$') or node)
end
local function frees_add(q, list, node, gen)
  local l = owner_list(list, node)
  if not q[l] then q[l] = {} end
  q[l][#q[l] + 1] = gen
end
local function frees_send(q)
  -- one command per 1000 generations (a free holds at most 2048)
  for l, gens in pairs(q) do
    for i = 1, #gens, 1000 do
      redis.call('LPUSH', l, '{"op":"free","generations":[' .. table.concat(gens, ',', i, math.min(i + 999, #gens)) .. ']}')
    end
  end
end
)lua";

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::lua
