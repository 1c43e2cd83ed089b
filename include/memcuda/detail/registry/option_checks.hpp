// The checks a registry's options pass before anything is built from them.
#pragma once

#include "memcuda/config.hpp"

#include <chrono>
#include <utility>

#include "memcuda/detail/backend/select.hpp"
#include "memcuda/detail/fd/fd_access.hpp"
#include "memcuda/error.hpp"
#include "memcuda/options.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

inline RegistryOptions validated(RegistryOptions o) {
  if (o.lease_ttl < std::chrono::milliseconds(30)) throw InvalidArgument("lease_ttl must be at least 30 ms");
  if (o.client_connections < 1) throw InvalidArgument("client_connections must be at least 1");
  if (o.waiting_connections < 1) throw InvalidArgument("waiting_connections must be at least 1");
  if (o.release_linger.count() < 0 || o.release_linger > std::chrono::seconds(60))
    throw InvalidArgument("release_linger must be between 0 and 60 s");
  if (requested_cuda_allocation(o) == CudaAllocation::vmm && o.pool.upstream)
    throw InvalidArgument("cuda_allocation = vmm cannot use a user upstream resource (PoolOptions::upstream): "
                          "cuMem allocations are made by the backend; use ipc, or drop the upstream");
  // On Redis Cluster the connections go to the node of the namespace's slot (keys.hpp).
  o.redis.cluster_tag = o.name_space.empty() ? "memcuda" : o.name_space;
  o.runtime_dir = normalize_runtime_dir(o.runtime_dir);  // "": the default, filled in
  for (const auto* ids : {&o.allowed_uids, &o.allowed_gids})
    for (auto id : *ids)
      if (id == 4294967295u) throw InvalidArgument("allowed_uids / allowed_gids must not hold 4294967295 (-1)");
  return o;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
