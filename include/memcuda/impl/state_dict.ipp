// The state-dict calls of memcuda/state_dict.hpp.
#pragma once

#include <fnmatch.h>

#include <string>
#include <utility>
#include <vector>

#include "memcuda/detail/cuda/state_dict_copy.hpp"
#include "memcuda/detail/registry/ops/state_dicts.hpp"
#include "memcuda/state_dict.hpp"
#include "memcuda/tensor_registry.hpp"

MEMCUDA_NAMESPACE_BEGIN

StateDict publish_state_dict(TensorRegistry& reg, std::string_view prefix, const std::vector<StateDictEntry>& entries,
                             const PublishOptions& opts) {
  if (opts.staging_bytes < 8192)
    throw InvalidArgument("publish_state_dict: staging_bytes must be at least 8192, got " +
                          std::to_string(opts.staging_bytes));
  std::vector<TensorSpec> specs;
  specs.reserve(entries.size());
  for (const auto& e : entries) specs.push_back({std::string(prefix) + e.name, e.dtype, e.shape, opts.create});
  auto made = reg.create_many(specs);
  StateDict out;
  try {
    detail::StateDictCopier copier(opts.stream, opts.staging_bytes);
    for (const auto& e : entries) {
      auto& t = made.at(std::string(prefix) + e.name);
      if (e.data) copier.copy(t, e.data);
      else if (e.read) copier.copy_from(t, e.read);
    }
    copier.finish();
  } catch (...) {
    std::vector<std::string> names;
    for (const auto& [n, t] : made) names.push_back(n);
    made.clear();
    try {
      (void)reg.remove_many(names);
    } catch (...) {
      // the copy's error is the one to report
    }
    throw;
  }
  if (opts.create.persistent) {
    std::vector<std::pair<std::string, std::uint64_t>> members;
    for (const auto& [n, t] : made) members.emplace_back(n, t.generation());
    (void)detail::DictClient(detail::RegistryAccess::shared_core(reg)).link(prefix, members);
  }
  for (auto& [n, t] : made) out.emplace(n.substr(prefix.size()), std::move(t));
  return out;
}

bool link_state_dict(TensorRegistry& reg, std::string_view prefix, const std::vector<SharedTensor<void>>& tensors) {
  std::vector<std::pair<std::string, std::uint64_t>> members;
  members.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (!t) throw InvalidArgument("link_state_dict of an empty SharedTensor");
    members.emplace_back(t.name(), t.generation());
  }
  return detail::DictClient(detail::RegistryAccess::shared_core(reg)).link(prefix, members);
}

StateDict open_state_dict(TensorRegistry& reg, std::string_view prefix) {
  if (auto linked = detail::DictClient(detail::RegistryAccess::shared_core(reg)).open(prefix)) {
    StateDict out;
    for (auto& [n, t] : *linked) out.emplace(n.substr(prefix.size()), std::move(t));
    return out;
  }
  auto all = reg.get_prefix(prefix);
  auto taken = std::move(all).take_all();
  StateDict out;
  for (auto& [n, t] : taken) out.emplace(n.substr(prefix.size()), std::move(t));
  return out;
}

StateDict open_state_dict(TensorRegistry& reg, std::string_view prefix, const ShardRules& shards) {
  if (shards.world == 0 || shards.rank >= shards.world)
    throw InvalidArgument("shard rules for '" + std::string(prefix) + "': rank " + std::to_string(shards.rank) +
                          " of world " + std::to_string(shards.world) + " (want world > 0 and rank < world)");
  StateDict out = open_state_dict(reg, prefix);
  std::vector<bool> used(shards.rules.size(), false);
  for (auto& [name, t] : out) {
    for (std::size_t i = 0; i < shards.rules.size(); ++i) {
      const auto& r = shards.rules[i];
      if (::fnmatch(r.pattern.c_str(), name.c_str(), 0) != 0) continue;
      used[i] = true;
      if (r.dim >= 0) t = t.slice(SliceSpec::tp(r.dim, shards.rank, shards.world));
      break;
    }
  }
  for (std::size_t i = 0; i < used.size(); ++i)
    if (!used[i] && !shards.allow_unused)
      throw InvalidArgument("shard rule '" + shards.rules[i].pattern + "' matches no tensor under '" +
                            std::string(prefix) + "' (a typo? ShardRules::allow_unused accepts it)");
  return out;
}

MEMCUDA_NAMESPACE_END  // namespace memcuda
