// The checks a registry's options pass before anything is built from them.
#pragma once

#include "memcuda/config.hpp"

#include <chrono>
#include <utility>

#include "memcuda/detail/backend/select.hpp"
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
  return o;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
