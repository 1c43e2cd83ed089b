// A/B model versions: a producer writes version N+1 of a model into a
// SECOND set of buffers while readers keep using N; one atomic step makes
// N+1 current; each reader keeps the version it opened until it moves, at a
// point it chooses, on its stream; N's memory goes when its last reader
// leaves. The in-place update (memcuda/model.hpp) stays the way to publish
// new bytes into the same buffers.
//
//   // producer
//   auto w = memcuda::begin_model_version(reg, "llama/", {{"w", DType::bf16, {4096, 4096}, src}});
//   ...                                   // or fill w.tensors() on a stream
//   auto v = w.commit(stream);            // the version readers move to
//   // reader
//   auto m = memcuda::open_model(reg, "llama/", stream);   // pins the current version
//   use(m.tensors().at("w"));
//   if (m.advance(stream)) { ... }        // moved: m.tensors() is the new version
//   // every GPU: version N+1 is copied to GPUs 1-3 before it is current,
//   // and a reader there reads its own device's copy
//   memcuda::ModelVersionOptions o;
//   o.replicas = {1, 2, 3};
//   auto m = memcuda::open_model(reg, "llama/", stream, {.local = true});
//
// At most `max_versions` versions (2 by default) have memory at a time: the
// current one and older ones a reader still holds; a begin beyond that is
// BudgetExceeded (docs/design.md, "A/B model versions", says how much
// memory that bounds). An older version no reader holds counts until its
// memory is freed: begin waits for that (up to request_timeout) rather than
// fail. Every call is safe from any thread; destructors do no network I/O.
// The record is in docs/protocol.md.
#pragma once

#include "memcuda/config.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/state_dict.hpp"
#include "memcuda/stream.hpp"
#include "memcuda/tensor_info.hpp"
#include "memcuda/tensor_registry.hpp"

MEMCUDA_NAMESPACE_BEGIN

struct ModelVersionOptions {
  // The new tensors' memory; default: the registry's default backend. cuda:
  // commit records one interprocess event on its stream (host: none; the
  // writes must be done when commit is called).
  std::optional<BackendKind> backend;
  int device = -1;  // cuda: the tensors' and the commit stream's device; -1: the current device
  // Versions whose memory may exist at once, the new one included: the
  // current version and older ones still held by a reader. 2 or more.
  unsigned max_versions = 2;
  StreamHandle copy_stream = nullptr;  // cuda: the entries' copies (synchronized before begin returns)
  // cuda: devices (ordinals of this process) that get a replica of the
  // version (memcuda/replicas.hpp) before it becomes current: commit waits
  // for the writes on its stream, replicates the set, then makes it
  // current. Readers there open it with OpenModelOptions::local.
  std::vector<int> replicas;
};

namespace detail {
struct WriterState;
struct PinnedState;
}  // namespace detail

// A version being staged: its tensors are writable and no reader sees them
// until commit. Dropped without commit or abort, the staging is given up
// (its tensors go with their handles; the model's next begin clears the
// record). Movable, not copyable.
class ModelVersionWriter {
 public:
  ModelVersionWriter() = default;
  explicit ModelVersionWriter(std::shared_ptr<detail::WriterState> s) : s_(std::move(s)) {}
  ModelVersionWriter(ModelVersionWriter&&) noexcept = default;
  ModelVersionWriter& operator=(ModelVersionWriter&&) noexcept;
  ~ModelVersionWriter();

  // The version commit will make current (unless an in-place publish_version comes first).
  std::uint64_t version() const;
  const std::string& prefix() const;
  // The staged tensors by name relative to the prefix; empty after commit or abort.
  StateDict tensors() const;
  // Makes the version current in one atomic step: records the model's
  // event on `stream` (cuda: after the writes enqueued there), links the
  // set, retires the previous set's names and wakes wait_version's waiters.
  // Returns the version. The writer's own references go (readers open the
  // set through the model). StaleHandle when the staging was aborted or a
  // tensor of it removed; InvalidArgument when already committed or aborted.
  std::uint64_t commit(StreamHandle stream = nullptr);
  // Gives the staging up: its tensors go. Idempotent.
  void abort();
  explicit operator bool() const noexcept { return s_ != nullptr; }

 private:
  std::shared_ptr<detail::WriterState> s_;
};

// Stages version N+1 of `prefix`: creates each entry (names relative to the
// prefix) as a new tensor under a hidden prefix, copying `data` where
// given. AlreadyExists while another live process stages a version of the
// model; BudgetExceeded when max_versions versions still have memory;
// InvalidArgument for a prefix that overlaps the reserved ".memcuda-ab/".
ModelVersionWriter begin_model_version(TensorRegistry& reg, std::string_view prefix,
                                       const std::vector<StateDictEntry>& entries,
                                       const ModelVersionOptions& opts = {});

// begin_model_version + commit(stream): every entry's data is copied.
std::uint64_t publish_model(TensorRegistry& reg, std::string_view prefix, const std::vector<StateDictEntry>& entries,
                            const ModelVersionOptions& opts = {}, StreamHandle stream = nullptr);

// A reader's model: the version it opened, kept (with its memory) until
// advance() or close(). Movable, not copyable.
class PinnedModel {
 public:
  PinnedModel() = default;
  explicit PinnedModel(std::shared_ptr<detail::PinnedState> s) : s_(std::move(s)) {}

  const std::string& prefix() const;
  // The pinned version (after an in-place publish_version: that version).
  std::uint64_t version() const;
  // The pinned version's tensors by name relative to the prefix.
  StateDict tensors() const;
  // The model's current version (one round trip; orders nothing).
  std::uint64_t latest() const;
  // Moves to the current version when it is newer: orders `stream` after
  // the producer's event of that version (no host synchronisation), then
  // tensors() is the new version's and the old handles are dropped (their
  // memory goes when no other reference holds it). For an in-place
  // publish of the pinned set, only the stream is ordered. False when the
  // pinned version is current. After Redis lost its data the model's record
  // is gone: advance() throws NotFound until the producer publishes again,
  // then moves to that set, whose version counts again from 1 (version()
  // may go down; the pinned set stays readable until then).
  bool advance(StreamHandle stream = nullptr);
  // Drops the pinned version (no network I/O here: the release is queued).
  void close();
  explicit operator bool() const noexcept { return s_ != nullptr; }

 private:
  std::shared_ptr<detail::PinnedState> s_;
};

// Opens the model's current version with one reference (an O(1) script for
// an A/B model) and orders `stream` after its producer's event. A model
// never published A/B (tensors named under the prefix) is opened as
// open_state_dict does. NotFound when the model has neither.
PinnedModel open_model(TensorRegistry& reg, std::string_view prefix, StreamHandle stream = nullptr);

struct OpenModelOptions {
  // The tensors from the reader's device's replicas when every one of the
  // version has a current replica there (ModelVersionOptions::replicas),
  // else the version's own (a version is never half local); `stream` also
  // waits for the replicas' copies. One round trip per tensor, at the open
  // and at each advance that moves.
  bool local = false;
  int reader_device = -1;  // with `local`: a CUDA ordinal; -1: the calling thread's current device
};
PinnedModel open_model(TensorRegistry& reg, std::string_view prefix, StreamHandle stream, const OpenModelOptions& opts);

MEMCUDA_NAMESPACE_END  // namespace memcuda
