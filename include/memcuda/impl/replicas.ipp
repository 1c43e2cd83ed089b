// The replica calls of memcuda/replicas.hpp.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "memcuda/detail/registry/core.hpp"
#include "memcuda/detail/store/replica_scripts.hpp"
#include "memcuda/replicas.hpp"
#include "memcuda/tensor_registry.hpp"
#if MEMCUDA_HAS_CUDA()
#include "memcuda/detail/cuda/runtime.hpp"
#endif

MEMCUDA_NAMESPACE_BEGIN

namespace detail {
// The UUIDs of `devices` (ordinals of this process; empty: every visible one).
inline std::vector<std::string> uuids_of(const std::vector<int>& devices, std::string_view what) {
#if MEMCUDA_HAS_CUDA()
  (void)what;
  if (devices.empty()) return device_uuids();
  std::vector<std::string> out;
  for (int d : devices) {
    std::string u = device_uuid(d);  // InvalidArgument: no such device
    if (std::find(out.begin(), out.end(), u) == out.end()) out.push_back(std::move(u));
  }
  return out;
#else
  (void)devices;
  throw Unavailable(std::string(what) + ": replicas are per CUDA device, and mem-cuda was built without CUDA");
#endif
}

std::vector<ReplicaRef> replicate(const std::shared_ptr<Core>& core, std::string_view name, const ReplicateOptions& opts);
}  // namespace detail

std::vector<ReplicaRef> replicate(TensorRegistry& reg, std::string_view name, const ReplicateOptions& opts) {
  return detail::replicate(detail::RegistryAccess::shared_core(reg), name, opts);
}

// The body of replicate(), also A/B commit's (model_ab.ipp).
std::vector<ReplicaRef> detail::replicate(const std::shared_ptr<Core>& core, std::string_view name,
                                          const ReplicateOptions& opts) {
  if (!opts.prefix) validate_name(name);
  else if (name.empty()) throw InvalidArgument("replicate: an empty prefix would be every tensor; name one");
  if (opts.idle.count() < 0 || opts.idle.count() > protocol::kMaxIdleMs)
    throw InvalidArgument("replicate: idle must be 0.." + std::to_string(protocol::kMaxIdleMs) + " ms, got " +
                          std::to_string(opts.idle.count()));
  protocol::Command cmd;
  cmd.op = protocol::Op::replicate;
  cmd.name = std::string(name);
  cmd.replicate_prefix = opts.prefix;
  if (opts.idle.count() > 0) cmd.idle_ms = opts.idle.count();
  cmd.devices = detail::uuids_of(opts.devices, "replicate");
  if (cmd.devices.empty()) throw InvalidArgument("replicate of '" + cmd.name + "': this process sees no CUDA device");
  if (cmd.devices.size() > protocol::kMaxReplicaDevices)
    throw InvalidArgument("replicate: " + std::to_string(cmd.devices.size()) + " devices, at most " +
                          std::to_string(protocol::kMaxReplicaDevices));
  std::vector<ReplicaRef> out;
  for (auto& t : core->client.replicate(std::move(cmd))) out.push_back({std::move(t.name), t.generation});
  return out;
}

std::size_t drop_replicas(TensorRegistry& reg, std::string_view name, const ReplicaTargets& which) {
  if (!which.prefix) validate_name(name);
  else if (name.empty()) throw InvalidArgument("drop_replicas: an empty prefix would be every replica; name one");
  std::size_t n = 0;
  for (const auto& u : detail::uuids_of(which.devices, "drop_replicas")) {
    const std::string rep = detail::replica_name(u, name);
    if (which.prefix) {
      n += reg.remove_prefix(rep).removed.size();
      continue;
    }
    if (!is_valid_name(rep)) continue;
    try {
      reg.remove(rep);
      ++n;
    } catch (const NotFound&) {
    }
  }
  return n;
}

MEMCUDA_NAMESPACE_END  // namespace memcuda
