// In-place model updates: the weight-sync loop of RL post-training without
// copies or new handles. A model is the set of tensors whose names start
// with a prefix ("llama/"). The trainer overwrites them in place, then
// publishes a new VERSION of the model with one interprocess event;
// consumers that already hold the tensors wait for the version and order
// their stream on that event (no host synchronisation, nothing re-opened).
//
//   // trainer, after enqueueing its writes on `s`:
//   auto v = memcuda::publish_version(reg, "llama/", s);
//   // each consumer, holding the model's SharedTensors:
//   if (auto v = memcuda::wait_version(reg, "llama/", seen, 10s, my_stream)) {
//     seen = *v;  // work enqueued on my_stream now reads version *v (or newer)
//   }
//
// All three calls are safe from any thread. The Redis record is in
// docs/protocol.md ("Model versions"), the design in docs/design.md
// ("In-place model updates").
#pragma once

#include "memcuda/config.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>

#include "memcuda/stream.hpp"
#include "memcuda/tensor_info.hpp"
#include "memcuda/tensor_registry.hpp"

MEMCUDA_NAMESPACE_BEGIN

struct VersionPublishOptions {
  // Which kind of memory the model's tensors are; default: the registry's
  // default backend. Host: no event is recorded (the writes are done when
  // publish_version is called).
  std::optional<BackendKind> backend;
  // cuda: the device of `producer_stream`; -1: the calling thread's current device.
  int device = -1;
};

// Producer side. Call after ENQUEUEING the writes of the new weights on
// `producer_stream` (no need to synchronise it): records one interprocess
// event on the stream, then bumps the model's version in Redis and wakes
// every waiter (one script, atomic). Returns the new version (1, 2, ...).
// Throws NotFound when the model has no version yet and no tensor name
// starts with `prefix`; the prefix follows the tensor-name rules
// (ProtocolError bad_name). The event is per (model, device) and re-recorded
// by every publish (stricter, never weaker: docs/design.md, "In-place model
// updates"), so publish a model from one thread at a time.
std::uint64_t publish_version(TensorRegistry& reg, std::string_view prefix, StreamHandle producer_stream = nullptr,
                              const VersionPublishOptions& opts = {});

// Consumer side. Blocks until the model's version is greater than `after`
// (without polling: the publish pushes the version and the producer's event
// to this waiter, so a woken waiter makes no further round trip), then
// makes `consumer_stream` wait on the producer's event (cudaStreamWaitEvent,
// no host synchronisation) and returns the version that woke it (a later
// publish may have passed it: ordering is never weaker). Returns std::nullopt when
// `timeout` passes first (a timeout is an expected outcome of a wait, as
// for TensorRegistry::wait). Throws NotFound when the model has no version
// and no tensor under the prefix, Unavailable when the version was
// published on another node or from a device this process cannot see (or
// by CUDA while this build has none). The wait holds a connection of the
// registry's waiting pool (RegistryOptions::waiting_connections) and no lock.
std::optional<std::uint64_t> wait_version(TensorRegistry& reg, std::string_view prefix, std::uint64_t after,
                                          std::chrono::milliseconds timeout, StreamHandle consumer_stream = nullptr);

// The model's current version: 0 when tensors exist under the prefix but no
// version was published; NotFound when neither. One or two round trips; it
// orders nothing (use wait_version(reg, prefix, v - 1, ...) for that).
std::uint64_t current_version(TensorRegistry& reg, std::string_view prefix);

MEMCUDA_NAMESPACE_END  // namespace memcuda
