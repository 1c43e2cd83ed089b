// A model's state dict in the registry: publish every tensor of it under a
// prefix in one batch (names, dtypes, shapes, and the data when a source is
// given), and open it again as a name-to-tensor map in one round trip.
//
//   std::vector<memcuda::StateDictEntry> sd = {{"layer0.weight", DType::bf16, {4096, 4096}, src_ptr}, ...};
//   auto published = memcuda::publish_state_dict(reg, "llama/", sd);
//   ...                                            // in a consumer process:
//   auto model = memcuda::open_state_dict(reg, "llama/");   // model["layer0.weight"]
#pragma once

#include "memcuda/config.hpp"

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/detail/cuda/state_dict_copy.hpp"
#include "memcuda/detail/registry/ops/state_dicts.hpp"
#include "memcuda/detail/registry_access.hpp"
#include "memcuda/tensor_registry.hpp"

MEMCUDA_NAMESPACE_BEGIN

// One tensor of a state dict. `name` is relative to the prefix.
struct StateDictEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  // Optional source of the bytes (itemsize(dtype) * elements of them): host
  // memory, or with CUDA any pointer cudaMemcpyDefault understands (device
  // memory of any visible GPU, pinned or pageable host memory). nullptr:
  // the tensor is created but not filled.
  const void* data = nullptr;
};

struct PublishOptions {
  CreateOptions create;          // backend, device and persistence of every tensor
  StreamHandle stream = nullptr;  // cuda: the copies are ordered on it (synchronized before returning)
};

// Names relative to the prefix -> this process's handle.
using StateDict = std::map<std::string, SharedTensor<void>>;

// Creates every tensor under `prefix` + name with create_many (all or
// nothing: AlreadyExists when one name is taken, and none is created), then
// copies each given source into its tensor (device-to-device or
// host-to-device on `stream`, memcpy on the host backend) and waits for the
// copies, so other processes see the data once this returns. A failed copy
// removes what the batch created and rethrows.
//
// Persistent (opts.create.persistent) dicts whose entries are every name
// under the prefix also get a state-dict record (one more script): a
// consumer's open_state_dict then takes ONE reference for the whole dict in
// one O(1) script (docs/design.md, "One reference per model").
inline StateDict publish_state_dict(TensorRegistry& reg, std::string_view prefix,
                                    const std::vector<StateDictEntry>& entries, const PublishOptions& opts = {}) {
  std::vector<TensorSpec> specs;
  specs.reserve(entries.size());
  for (const auto& e : entries) specs.push_back({std::string(prefix) + e.name, e.dtype, e.shape, opts.create});
  auto made = reg.create_many(specs);
  StateDict out;
  try {
    detail::StateDictCopier copier(opts.stream);
    for (const auto& e : entries) {
      auto& t = made.at(std::string(prefix) + e.name);
      if (e.data) copier.copy(t, e.data);
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

// Links a state-dict record over tensors already published under `prefix`
// (what publish_state_dict does for a persistent dict): for a dict made
// another way, e.g. created with create_many, filled, and each tensor's
// writes published. They must be exactly the names under the prefix, each
// persistent and still of the generation held; the events published so far
// go into the record (a later publish on a member unlinks it). Returns
// false, changing nothing, when that does not hold: opens then go name by
// name. InvalidArgument for an empty handle or a name given twice.
inline bool link_state_dict(TensorRegistry& reg, std::string_view prefix,
                            const std::vector<SharedTensor<void>>& tensors) {
  std::vector<std::pair<std::string, std::uint64_t>> members;
  members.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (!t) throw InvalidArgument("link_state_dict of an empty SharedTensor");
    members.emplace_back(t.name(), t.generation());
  }
  return detail::DictClient(detail::RegistryAccess::shared_core(reg)).link(prefix, members);
}

// Every tensor whose name starts with `prefix`, taken in one round trip,
// keyed by the rest of its name. Strict: when one cannot be opened, every
// reference is given back and its error thrown. An empty map when no name
// has the prefix.
//
// Where a state-dict record is linked at the prefix (a persistent
// publish_state_dict, unchanged since), the open is one O(1) script and the
// handles share ONE reference of this process, released when the last of
// them goes; otherwise one reference per tensor (get_prefix). Either way the
// names are exactly get_prefix's.
inline StateDict open_state_dict(TensorRegistry& reg, std::string_view prefix) {
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

MEMCUDA_NAMESPACE_END  // namespace memcuda
