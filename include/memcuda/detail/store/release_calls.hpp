// The release scripts as pipelined commands (EVALSHA of a loaded script):
// the release queue sends a batch of them in one round trip
// (detail/registry/release_queue.hpp). Their KEYS and ARGV are
// those of kRelease (scripts.hpp) and kDictRelease (dict_scripts.hpp).
#pragma once

#include "memcuda/config.hpp"

#include <cstdint>
#include <string>
#include <string_view>

#include "memcuda/detail/store/keys.hpp"
#include "memcuda/redis/connection.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::store {

// The keys every release of one session's batch shares, built once per batch.
struct ReleaseBatch {
  ReleaseBatch(const Keys& k, std::string_view session)
      : keys(k), names(k.names()), lifecycle(k.lifecycle()), leader(k.leader()), refs(k.refs(session)),
        usage(k.usage()), prefix(k.prefix()) {}
  const Keys& keys;
  std::string names, lifecycle, leader, refs, usage, prefix;
};

// One reference of `session` (the batch's) to generation `gen` of `name`,
// released by its own session, unfenced.
inline redis::Command release_cmd(const ReleaseBatch& b, const std::string& sha, const std::string& session,
                                  std::string_view name, std::uint64_t gen) {
  return {"EVALSHA", sha,       "6",     b.keys.tensor(name), b.names, b.lifecycle, b.leader, b.refs, b.usage,
          std::to_string(gen), session, b.prefix, session, "", "", std::string(name)};
}

// One reference of `session` to the state-dict record `dict_id`.
inline redis::Command dict_release_cmd(const ReleaseBatch& b, const std::string& sha, const std::string& session,
                                       std::uint64_t dict_id) {
  return {"EVALSHA", sha, "1", b.keys.dict(dict_id), session, "", b.prefix, std::to_string(dict_id)};
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::store
