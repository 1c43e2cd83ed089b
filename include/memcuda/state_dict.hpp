// A model's state dict in the registry: publish every tensor of it under a
// prefix in one batch (names, dtypes, shapes, and the data when a source is
// given), and open it again as a name-to-tensor map in one round trip.
//
//   #include <memcuda/memcuda.hpp>   // or <memcuda/state_dict.hpp> alone
//   std::vector<memcuda::StateDictEntry> sd = {{"layer0.weight", DType::bf16, {4096, 4096}, src_ptr}, ...};
//   auto published = memcuda::publish_state_dict(reg, "llama/", sd);
//   ...                                            // in a consumer process:
//   auto model = memcuda::open_state_dict(reg, "llama/");   // model["layer0.weight"]
#pragma once

#include "memcuda/config.hpp"

#include <climits>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/dtype.hpp"
#include "memcuda/options.hpp"
#include "memcuda/shape.hpp"
#include "memcuda/shared_tensor.hpp"
#include "memcuda/stream.hpp"
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
  // Or, where `data` is nullptr, a reader of the bytes (a file, a
  // decompressor, a network stream): called in pieces of at most half of
  // PublishOptions::staging_bytes, in order, as read(offset, destination,
  // bytes). Host tensors are filled in place; device tensors through a
  // pinned staging buffer, so a model larger than the host memory a producer
  // can spare is published with staging_bytes of it. A reader may throw:
  // the publish then removes what it made and rethrows.
  std::function<void(std::uint64_t offset, void* dst, std::size_t bytes)> read = {};
};

struct PublishOptions {
  CreateOptions create;          // backend, device and persistence of every tensor
  StreamHandle stream = nullptr;  // cuda: the copies are ordered on it (synchronized before returning)
  // The pinned host memory the copies from readers into device tensors may
  // use (two halves: one is read into while the other is copied). Allocated
  // only when a reader fills a device tensor; at least 8 KiB.
  std::size_t staging_bytes = std::size_t{64} << 20;
};

// Names relative to the prefix -> this process's handle.
using StateDict = std::map<std::string, SharedTensor<void>>;

// Creates every tensor under `prefix` + name with create_many (all or
// nothing: AlreadyExists when one name is taken, and none is created), then
// copies each given source (data, or read) into its tensor (device-to-device or
// host-to-device on `stream`, memcpy on the host backend) and waits for the
// copies, so other processes see the data once this returns. A failed copy
// removes what the batch created and rethrows.
//
// Persistent (opts.create.persistent) dicts whose entries are every name
// under the prefix also get a state-dict record (one more script): a
// consumer's open_state_dict then takes ONE reference for the whole dict in
// one O(1) script (docs/design.md, "One reference per model").
StateDict publish_state_dict(TensorRegistry& reg, std::string_view prefix, const std::vector<StateDictEntry>& entries,
                             const PublishOptions& opts = {});

// Links a state-dict record over tensors already published under `prefix`
// (what publish_state_dict does for a persistent dict): for a dict made
// another way, e.g. created with create_many, filled, and each tensor's
// writes published. They must be exactly the names under the prefix, each
// persistent and still of the generation held; the events published so far
// go into the record (a later publish on a member unlinks it). Returns
// false, changing nothing, when that does not hold: opens then go name by
// name. InvalidArgument for an empty handle or a name given twice.
bool link_state_dict(TensorRegistry& reg, std::string_view prefix, const std::vector<SharedTensor<void>>& tensors);

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
StateDict open_state_dict(TensorRegistry& reg, std::string_view prefix);

// Which tensors of a dict a tensor-parallel rank opens as its shard.
struct ShardRule {
  static constexpr int whole = INT_MIN;  // dim: opened whole
  std::string pattern;  // fnmatch(3) glob on the name relative to the prefix, get_matching's rule
  int dim = 0;          // the dimension split across ranks; negative counts from the end (-1: the last)
};
struct ShardRules {
  unsigned rank = 0, world = 1;
  std::vector<ShardRule> rules;  // the first matching rule wins; names none matches are opened whole
  bool allow_unused = false;     // false: a rule that matched no name is InvalidArgument (a typo)
};

// open_state_dict, then each matching tensor narrowed to SliceSpec::tp(dim,
// rank, world): zero-copy views sharing the open's reference, so a rank's
// shard of a linked dict is still one O(1) script and one reference.
// InvalidArgument (nothing held) for an unused or shadowed rule, a dimension
// out of range or one that does not split evenly.
StateDict open_state_dict(TensorRegistry& reg, std::string_view prefix, const ShardRules& shards);

MEMCUDA_NAMESPACE_END  // namespace memcuda
