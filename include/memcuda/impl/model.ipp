// The model-version calls of memcuda/model.hpp.
#pragma once

#include "memcuda/detail/registry/ops/model_version.hpp"
#include "memcuda/model.hpp"
#include "memcuda/tensor_registry.hpp"

MEMCUDA_NAMESPACE_BEGIN

std::uint64_t publish_version(TensorRegistry& reg, std::string_view prefix, StreamHandle producer_stream,
                              const VersionPublishOptions& opts) {
  return detail::ModelVersions::publish(detail::RegistryAccess::core(reg), prefix, producer_stream, opts.backend,
                                        opts.device);
}

std::optional<std::uint64_t> wait_version(TensorRegistry& reg, std::string_view prefix, std::uint64_t after,
                                          std::chrono::milliseconds timeout, StreamHandle consumer_stream) {
  return detail::ModelVersions::wait(detail::RegistryAccess::core(reg), prefix, after, timeout, consumer_stream);
}

std::uint64_t current_version(TensorRegistry& reg, std::string_view prefix) {
  return detail::ModelVersions::current(detail::RegistryAccess::core(reg), prefix);
}

MEMCUDA_NAMESPACE_END  // namespace memcuda
