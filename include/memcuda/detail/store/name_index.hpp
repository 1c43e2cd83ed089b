// The index of linked names (memcuda:names, a sorted set whose scores are
// all 0): listings and prefix selections read it a page at a time, in name
// order, and a glob reads only the names under its literal prefix.
#pragma once

#include "memcuda/config.hpp"

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/detail/store/keys.hpp"
#include "memcuda/redis/connection.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// The longest prefix every name a glob matches starts with: what comes
// before its first `*`, `?`, `[` or `\`.
inline std::string_view glob_literal_prefix(std::string_view glob) {
  return glob.substr(0, std::min(glob.size(), glob.find_first_of("*?[\\")));
}

// Up to `limit` names that start with `prefix` and sort after `after`
// ("" = from the first), in name order. Byte 255 never occurs in a name,
// so "(prefix\xff" bounds every name under the prefix.
inline std::vector<std::string> names_page(redis::Connection& c, const Keys& k, std::string_view prefix,
                                           std::string_view after, std::size_t limit) {
  std::string lo = after.empty() || after < prefix ? "[" + std::string(prefix) : "(" + std::string(after);
  std::string hi = "(" + std::string(prefix) + '\xff';
  redis::Reply r;
  try {
    r = c.command({"ZRANGEBYLEX", k.names(), lo, hi, "LIMIT", "0", std::to_string(limit)});
  } catch (const ReplyError& e) {
    if (e.prefix() != "WRONGTYPE") throw;
    // Another client wrote the key: say what it is and what happens next.
    std::string type = "key of another type";
    try {
      type = std::string(c.command({"TYPE", k.names()}).str());
    } catch (const ReplyError&) {
    }
    throw ReplyError("the name index '" + k.names() + "' is a " + type +
                         ", not a sorted set: the allocator of record moves it aside and rebuilds it from the records "
                         "at its next garbage collection round (docs/operations.md, \"Keys of the wrong type\"); "
                         "retry then",
                     "WRONGTYPE");
  }
  std::vector<std::string> out;
  out.reserve(r.size());
  for (std::size_t i = 0; i < r.size(); ++i) out.emplace_back(r[i].str());
  return out;
}

// recount_usage(names, usage, p): counts memcuda:usage (absent) from the
// records of the names in the index, in the calling script (atomic: no
// create or remove lands between the count and the counters). Returns how
// many records it counted.
inline constexpr char kRecountUsageFn[] = R"lua(
local function recount_usage(names, usage, p)
  local n = 0
  for _, name in ipairs(redis.call('ZRANGE', names, 0, -1)) do
    local ok, f = pcall(redis.call, 'HMGET', p .. 'memcuda:tensor:' .. name, 'backend', 'device', 'device_uuid',
                        'bytes')
    local b = ok and tonumber(f[4])
    if b and f[1] then
      local d = f[1] .. ':' .. (f[2] or '') .. ':' .. (f[3] or '')
      redis.call('HINCRBY', usage, 'tensors:' .. d, 1)
      redis.call('HINCRBY', usage, 'bytes:' .. d, string.format('%.0f', b))
      n = n + 1
    end
  end
  return n
end
)lua";

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
