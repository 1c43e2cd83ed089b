// The share script: publishes a record of borrowed memory (a buffer its
// owner process shared without a copy; registry/ops/share.hpp). It is the
// create script without the lease fence: the owner of borrowed memory is
// the process that has it, not the allocator of record, so any registry
// runs it for its own buffers. It also names the owner in memcuda:owners,
// so that the owner's death starts the scan that marks its records lost.
#pragma once

#include "memcuda/config.hpp"

#include <span>
#include <string>
#include <vector>

#include "memcuda/detail/store/batch_scripts.hpp"
#include "memcuda/detail/store/dict_scripts.hpp"
#include "memcuda/detail/store/index_fn.hpp"
#include "memcuda/detail/store/keys.hpp"
#include "memcuda/detail/store/scripts.hpp"
#include "memcuda/redis/connection.hpp"
#include "memcuda/redis/script.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

namespace lua {
// KEYS: tensor, names, owners, generation counter, waiters set of the name,
//       lost marker, usage, the holder's reference index, holders index,
//       the linked state-dict prefixes
// ARGV: name, ready channel, holder (the owner's session), persistent (0|1),
//       key prefix, field, value, ...
// -> {'ok', generation, refcount} | {'exists', generation} | {'stray', key type}
inline constexpr auto kShare = join(kUnlinkDictFn, kStrayFn, kIndexFn, kGenerationFn, R"lua(
if redis.call('EXISTS', KEYS[1]) == 1 then
  local g, ty = record_generation(KEYS[1])
  if not g then return {'stray', ty} end
  return {'exists', g}
end
unlink_dicts_over_in(ARGV[5], KEYS[10], ARGV[1])
local gen = take_generations(KEYS[4], 1)
redis.call('DEL', KEYS[6])
local rc = 1
redis.call('HSET', KEYS[1], 'generation', gen, 'state', 'ready', 'refcount', 1, 'holder:' .. ARGV[3], 1,
           unpack(ARGV, 6))
if ARGV[4] == '1' then
  rc = 2
  redis.call('HSET', KEYS[1], 'refcount', 2, 'holder:@name', 1)
end
redis.call('SADD', KEYS[3], ARGV[3])
name_add(KEYS[2], ARGV[1])
hold_in(KEYS[8], KEYS[9], ARGV[3], gen, ARGV[1])
count_usage_in(KEYS[7], KEYS[1], 1)
redis.call('PUBLISH', ARGV[2], gen)
wake_waiters(ARGV[5], KEYS[5], gen)
return {'ok', gen, rc}
)lua");
}  // namespace lua

namespace store {

inline const redis::Script& share_script() {
  static const redis::Script script{lua::kShare};  // eval is const: shared by every thread
  return script;
}

// The share script as one command of a pipeline (EVALSHA: a NOSCRIPT reply
// means it did not run; share_record loads and runs it).
inline redis::Command share_record_cmd(const Keys& k, const std::string& name, const std::string& holder,
                                       bool persistent, const std::vector<std::string>& fields) {
  redis::Command c{"EVALSHA", share_script().sha(), "10", k.tensor(name), k.names(), k.owners(), k.generation(),
                   k.waiters(name), k.lost(name), k.usage(), k.refs(holder), k.holders(), k.dicts(),
                   name, k.ready_channel(name), holder, persistent ? "1" : "0", k.prefix()};
  c.insert(c.end(), fields.begin(), fields.end());
  return c;
}

// Runs the share script for the record `fields` of `name`, held by `holder`.
inline redis::Reply share_record(redis::Connection& c, const Keys& k, const std::string& name,
                                 const std::string& holder, bool persistent, const std::vector<std::string>& fields) {
  const redis::Script& script = share_script();
  const std::string tkey = k.tensor(name), nkey = k.names(), okey = k.owners(), gkey = k.generation(),
                    wkey = k.waiters(name), lkey = k.lost(name), ukey = k.usage(), rkey = k.refs(holder),
                    hkey = k.holders(), dkey = k.dicts();
  redis::Arg kv[] = {tkey, nkey, okey, gkey, wkey, lkey, ukey, rkey, hkey, dkey};
  std::vector<redis::Arg> args{name, k.ready_channel(name), holder, persistent ? "1" : "0", k.prefix()};
  for (const auto& f : fields) args.emplace_back(f);
  return script.eval(c, std::span<const redis::Arg>(kv), std::span<const redis::Arg>(args));
}

}  // namespace store
}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
