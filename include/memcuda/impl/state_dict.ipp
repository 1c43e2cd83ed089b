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
  const auto& rules = shards.rules;
  // matched: the rule matches some name; winner: the earlier rule that took one of them.
  std::vector<bool> matched(rules.size(), false), won(rules.size(), false);
  std::vector<std::size_t> winner(rules.size(), 0);
  for (auto& [name, t] : out) {
    std::size_t w = rules.size();
    for (std::size_t i = 0; i < rules.size(); ++i) {
      if (::fnmatch(rules[i].pattern.c_str(), name.c_str(), 0) != 0) continue;
      matched[i] = true;
      if (w == rules.size()) w = i;
      else winner[i] = w;
    }
    if (w == rules.size()) continue;
    won[w] = true;
    if (rules[w].dim == ShardRule::whole) continue;
    const int rank = static_cast<int>(t.rank());
    const int dim = rules[w].dim < 0 ? rules[w].dim + rank : rules[w].dim;
    if (dim < 0)
      throw InvalidArgument("shard rule '" + rules[w].pattern + "': dimension " + std::to_string(rules[w].dim) +
                            " is out of range for '" + t.name() + "' (rank " + std::to_string(rank) + ")");
    t = t.slice(SliceSpec::tp(dim, shards.rank, shards.world));
  }
  for (std::size_t i = 0; i < rules.size() && !shards.allow_unused; ++i) {
    if (won[i]) continue;
    const std::string why = matched[i] ? "is shadowed: every tensor it matches is taken by an earlier rule '" +
                                             rules[winner[i]].pattern + "'"
                                       : "matches no tensor under '" + std::string(prefix) + "' (a typo?)";
    throw InvalidArgument("shard rule '" + rules[i].pattern + "' " + why + " (ShardRules::allow_unused accepts it)");
  }
  return out;
}

MEMCUDA_NAMESPACE_END  // namespace memcuda
