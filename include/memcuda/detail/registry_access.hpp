// How the free functions of public headers (model.hpp, ...) reach a
// registry's core without widening TensorRegistry's public interface.
#pragma once

#include "memcuda/config.hpp"

#include "memcuda/tensor_registry.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

struct RegistryAccess {
  // The core for a call that talks to Redis: like the registry's own calls,
  // rethrows an error of its thread and sends this process's queued releases first.
  static Core& core(TensorRegistry& r) { return r.core(); }
  // The same, shared: for what outlives the call (handles).
  static std::shared_ptr<Core> shared_core(TensorRegistry& r) {
    (void)r.core();
    return r.core_;
  }
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
