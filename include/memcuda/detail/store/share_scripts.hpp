// The share script: publishes a record of borrowed memory (a buffer its
// owner process shared without a copy; registry/ops/share.hpp). It is the
// create script without the lease fence: the owner of borrowed memory is
// the process that has it, not the allocator of record, so any registry
// runs it for its own buffers. It also names the owner in memcuda:owners,
// so that the owner's death starts the scan that marks its records lost.
#pragma once

#include "memcuda/config.hpp"

#include <string>
#include <vector>

#include "memcuda/detail/store/batch_scripts.hpp"
#include "memcuda/detail/store/dict_scripts.hpp"
#include "memcuda/detail/store/index_fn.hpp"
#include "memcuda/detail/store/keys.hpp"
#include "memcuda/detail/store/scripts.hpp"
#include "memcuda/redis/connection.hpp"
#include "memcuda/detail/store/script_call.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

namespace lua {
// -> {'ok', generation, refcount} | {'exists', generation} | {'stray', key type}
inline constexpr auto kShare = join(kUnlinkDictFn, kStrayFn, kIndexFn, kGenerationFn, kPublishNewFn, R"lua(
if redis.call('EXISTS', KEYS[1]) == 1 then
  local g, ty = record_generation(KEYS[1])
  if not g then return {'stray', ty} end
  return {'exists', g}
end
redis.call('SADD', KEYS[3], ARGV[3])
return publish_new(ARGV[5], ARGV[1], ARGV[2], ARGV[3], ARGV[4] == '1', 6)
)lua");
}  // namespace lua

namespace store {

// The share script as one command of a pipeline (share_records).
inline redis::Command share_record_cmd(const Keys& k, const std::string& name, const std::string& holder,
                                       bool persistent, const std::vector<std::string>& fields) {
  redis::Command c{"EVALSHA", script<lua::kShare>(k.cluster()).sha(), "10", k.tensor(name), k.names(), k.owners(),
                   k.generation(), k.waiters(name), k.lost(name), k.usage(), k.refs(holder), k.holders(), k.dicts(),
                   name, k.ready_channel(name), holder, persistent ? "1" : "0", k.prefix()};
  c.insert(c.end(), fields.begin(), fields.end());
  return c;
}

// Runs the share script for the record `fields` of `name`, held by `holder`.
inline redis::Reply share_record(redis::Connection& c, const Keys& k, const std::string& name,
                                 const std::string& holder, bool persistent, const std::vector<std::string>& fields) {
  std::vector<redis::Arg> args{name, k.ready_channel(name), holder, persistent ? "1" : "0", k.prefix()};
  for (const auto& f : fields) args.emplace_back(f);
  return eval<lua::kShare>(c, {k.tensor(name), k.names(), k.owners(), k.generation(), k.waiters(name), k.lost(name),
                               k.usage(), k.refs(holder), k.holders(), k.dicts()}, args);
}

// Many share_record_cmd()s in one round trip; `errors` as Script::eval_each.
inline std::vector<redis::Reply> share_records(redis::Connection& c, const std::vector<redis::Command>& cmds,
                                               std::vector<std::exception_ptr>& errors) {
  return script<lua::kShare>(c).eval_each(c, cmds, &errors);
}

}  // namespace store
}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
