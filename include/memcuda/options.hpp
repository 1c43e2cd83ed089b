// Option structs of the client API. Every field has a default; environment
// variables only fill defaults (MEMCUDA_REDIS_URL for the Redis address).
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "memcuda/redis/options.hpp"
#include "memcuda/tensor_info.hpp"

namespace memcuda {

struct RegistryOptions {
  // Where the registry lives. Defaults to MEMCUDA_REDIS_URL, else
  // redis://127.0.0.1:6379.
  redis::Options redis = redis::options_from_env();

  // Isolates registries sharing one Redis: every key gets the prefix "ns:".
  // Empty (default): the lifecycle list is plain `tensor_lifecycle`.
  std::string name_space;

  // Host the control thread: campaign for the allocator-of-record lease,
  // serve the lifecycle list while holding it, follow otherwise. A process
  // that only reads tensors may switch it off; some process must host it.
  bool control_thread = true;

  // Allocator-of-record lease. The leader renews every ttl/3; followers
  // campaign every ttl/3, so a dead leader is replaced within about
  // ttl + ttl/3.
  std::chrono::milliseconds lease_ttl{1500};

  // How long a create sent to the allocator of record waits for its reply.
  std::chrono::milliseconds request_timeout{5000};

  // Backend and device of create() when CreateOptions leaves them unset.
  // nullopt: cuda when this build has CUDA and a device is visible, else host.
  std::optional<BackendKind> default_backend;
  int default_device = 0;
};

struct CreateOptions {
  std::optional<int> device;            // CUDA ordinal in this process; unset: registry default
  std::optional<BackendKind> backend;   // unset: registry default
  // A persistent tensor is also held by its name: it outlives every handle
  // and is freed only after remove() and the last release. Without it, the
  // tensor is freed when its last holder releases (the seed's refcounting).
  bool persistent = false;
};

}  // namespace memcuda
