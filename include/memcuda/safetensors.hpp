// A model's state dict from a safetensors file, published with bounded host
// memory: the entries read their bytes from the file in pieces, so a
// producer publishes a model larger than the memory it can spare with
// PublishOptions::staging_bytes of pinned staging (state_dict.hpp).
//
//   auto entries = memcuda::safetensors_entries("model.safetensors");
//   memcuda::PublishOptions o;
//   o.create.persistent = true;
//   o.staging_bytes = 64 << 20;
//   auto sd = memcuda::publish_state_dict(reg, "llama/", entries, o);
#pragma once

#include "memcuda/config.hpp"

#include <string>
#include <vector>

#include "memcuda/state_dict.hpp"

MEMCUDA_NAMESPACE_BEGIN

// One entry per tensor of the file (in the header's order; "__metadata__"
// is skipped), with its name, dtype and shape, and a `read` that preads its
// bytes from the file, which the entries keep open between them. Nothing of
// the data is read here. NotFound when the file does not exist;
// InvalidArgument (naming the file and the fault) when it is not a
// well-formed safetensors file: a header that is not JSON, a dtype mem-cuda
// has not (the F8 kinds), offsets that do not match the shape or lie past
// the end of the file. A read that comes up short later (the file shrank)
// is InvalidArgument too, and fails the publish.
std::vector<StateDictEntry> safetensors_entries(const std::string& path);

MEMCUDA_NAMESPACE_END  // namespace memcuda
