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

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::lua
