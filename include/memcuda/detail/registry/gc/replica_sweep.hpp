// The collector's sweep of replicas (replicas.hpp): a page of the reserved
// range `.memcuda-rep/` of the name index at a time, each replica with its
// source in one script (detail/store/replica_scripts.hpp), which unlinks the
// replicas whose source is gone or re-created and those unused past their
// idle time. Their memory goes with their last reader, as a removed
// tensor's; what this process owns and nobody holds is freed here.
#pragma once

#include "memcuda/config.hpp"

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/own_allocator.hpp"
#include "memcuda/detail/store/name_index.hpp"
#include "memcuda/detail/store/replica_scripts.hpp"
#include "memcuda/detail/store/reply.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// The source name of a replica name, or "" for a name of the reserved range
// that is not `<prefix><uuid>/<name>`.
inline std::string replica_source(std::string_view rep) {
  if (!rep.starts_with(kReplicaPrefix)) return {};
  const auto rest = rep.substr(kReplicaPrefix.size());
  const auto slash = rest.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == rest.size()) return {};
  return std::string(rest.substr(slash + 1));
}

// Returns the replicas unlinked.
inline std::size_t sweep_replicas(redis::Connection& c, Context& ctx, OwnAllocator& alloc, const std::string& token) {
  constexpr std::size_t kPage = 500;
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  std::size_t removed = 0;
  std::string after;
  for (;;) {
    auto names = names_page(c, ctx.keys, kReplicaPrefix, after, kPage);
    if (names.empty()) break;
    after = names.back();
    std::vector<std::pair<std::string, std::string>> pairs;
    for (auto& n : names)
      if (auto src = replica_source(n); !src.empty()) pairs.emplace_back(std::move(n), std::move(src));
    if (!pairs.empty()) {
      auto r = store::replica_sweep(c, ctx.keys, token, ctx.session, pairs, now);
      if (r.is("notleader")) break;  // the next leader sweeps
      removed += r[1].size();
      for (std::size_t i = 0; i < r[2].size(); ++i) alloc.free_unlinked(c, reply_u64(r[2][i]), true);
    }
    if (names.size() < kPage) break;
  }
  return removed;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
