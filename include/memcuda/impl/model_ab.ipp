// The A/B model versions of memcuda/model_ab.hpp.
#pragma once

#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "memcuda/detail/cuda/state_dict_copy.hpp"
#include "memcuda/detail/registry/ops/shared_get.hpp"
#include "memcuda/detail/registry/ops/batch_client.hpp"
#include "memcuda/detail/registry/ops/model_ab.hpp"
#include "memcuda/detail/store/selection.hpp"
#include "memcuda/model.hpp"
#include "memcuda/impl/replicas.ipp"  // detail::replicate, for a commit with replicas
#include "memcuda/model_ab.hpp"
#include "memcuda/replicas.hpp"
#include "memcuda/tensor_registry.hpp"
#if MEMCUDA_HAS_CUDA()
#include "memcuda/detail/cuda/ipc_event.hpp"
#endif

MEMCUDA_NAMESPACE_BEGIN

namespace detail {

// The mutexes below guard the fields only: never held across a Redis call.
struct WriterState {
  std::shared_ptr<Core> core;
  std::string prefix;
  AbStaging staging;
  BackendKind backend = BackendKind::host;
  int device = -1;
  std::vector<int> replicas;  // devices that get the version before commit makes it current
  std::mutex mu;
  StateDict tensors;  // by full name
  enum class Phase { staged, finishing, done } phase = Phase::staged;

  ~WriterState() {
    if (phase != Phase::done) ModelAb::forget(staging.token);  // no I/O: the next begin clears the record
  }
};

struct PinnedState {
  std::shared_ptr<Core> core;
  std::string prefix;
  mutable std::mutex mu;
  std::uint64_t version = 0;
  std::string dict_id, hidden;  // the pinned set ("" and the prefix for a model of named tensors)
  StateDict tensors;            // by name relative to the prefix
  OpenModelOptions open;        // local: each tensor from this device's replica where one is current
};

// Replicates a staged set to `devices`, as few devices per command as keep
// one command within kMaxReplicas replicas and its reply within
// kMaxReplyBytes (each command still chains its devices).
inline void replicate_version(const std::shared_ptr<Core>& core, const std::string& hidden,
                              const std::vector<std::pair<std::string, std::uint64_t>>& members,
                              const std::vector<int>& devices) {
  std::size_t per_device = 0;  // reply bytes per device: what the replicator counts
  for (const auto& [n, g] : members) per_device += kReplicaPrefix.size() + 64 + n.size();
  const std::size_t by_count = protocol::kMaxReplicas / std::max<std::size_t>(1, members.size());
  const std::size_t by_bytes = (protocol::kMaxReplyBytes - 4096) / std::max<std::size_t>(1, per_device);
  const std::size_t group = std::max<std::size_t>(1, std::min(by_count, by_bytes));
  for (std::size_t i = 0; i < devices.size(); i += group) {
    ReplicateOptions ro;
    ro.devices.assign(devices.begin() + static_cast<std::ptrdiff_t>(i),
                      devices.begin() + static_cast<std::ptrdiff_t>(std::min(devices.size(), i + group)));
    ro.prefix = true;
    replicate(core, hidden, ro);
  }
}

// A set's handles swapped for the reader's device's replicas (get with
// LocalReplica::use, one script per name) when every name has a current one
// there; else the set's own handles (never a version half local, half not).
// `stream` waits for each replica's copy.
inline StateDict localize(const std::shared_ptr<Core>& core, StateDict set, const std::string& hidden,
                          const OpenModelOptions& o, StreamHandle stream) {
  GetOptions g;
  g.replica = LocalReplica::use;
  g.reader_device = o.reader_device;
  std::vector<SharedGet> reps;
  try {
    for (const auto& [n, t] : set) {
      auto got = get_shared(core, hidden + n, std::nullopt, g);
      if (got.handle->info().replica_of.empty()) return set;  // released with `reps` (queued: no I/O here)
      reps.push_back(std::move(got));
    }
  } catch (const NotFound&) {
    return set;  // a commit retired the version meanwhile: the pinned set itself
  } catch (const Lost&) {
    return set;
  }
  auto r = reps.begin();
  for (auto& [n, t] : set) {
#if MEMCUDA_HAS_CUDA()
    const TensorInfo& i = r->handle->info();  // nullptr: the legacy stream waits, as order_after's does
    if (r->from_cache) r->handle->wait_published(stream);
    else if (!i.event_handle.empty()) stream_wait_ipc_event(stream, i.event_handle);
#else
    (void)stream;
#endif
    t = SharedTensor<void>(std::move(r->handle));
    ++r;
  }
  return set;
}

inline StateDict relative(std::map<std::string, SharedTensor<void>>&& full, std::string_view hidden) {
  StateDict out;
  for (auto& [n, t] : full) out.emplace(n.substr(hidden.size()), std::move(t));
  return out;
}

// An A/B set's handles: through its record (ok), else per name (unlinked:
// a migration or a member's change unlinked the record; its names still say
// the set). Empty when a commit retired it meanwhile.
inline StateDict ab_handles(const std::shared_ptr<Core>& core, AbOpened& o) {
  if (o.kind == AbOpened::Kind::ok) return relative(std::move(o.tensors), o.hidden);
  return relative(BatchClient(core).get(Selection::prefix(o.hidden), {}).take_all(), o.hidden);
}

}  // namespace detail

ModelVersionWriter& ModelVersionWriter::operator=(ModelVersionWriter&&) noexcept = default;
ModelVersionWriter::~ModelVersionWriter() = default;

std::uint64_t ModelVersionWriter::version() const {
  if (!s_) throw InvalidArgument("an empty ModelVersionWriter");
  return s_->staging.version;
}

const std::string& ModelVersionWriter::prefix() const {
  if (!s_) throw InvalidArgument("an empty ModelVersionWriter");
  return s_->prefix;
}

StateDict ModelVersionWriter::tensors() const {
  if (!s_) throw InvalidArgument("an empty ModelVersionWriter");
  std::lock_guard lk(s_->mu);
  std::map<std::string, SharedTensor<void>> copy(s_->tensors.begin(), s_->tensors.end());
  return detail::relative(std::move(copy), s_->staging.hidden);
}

std::uint64_t ModelVersionWriter::commit(StreamHandle stream) {
  if (!s_) throw InvalidArgument("commit of an empty ModelVersionWriter");
  std::vector<std::pair<std::string, std::uint64_t>> members;
  {
    std::lock_guard lk(s_->mu);
    if (s_->phase != detail::WriterState::Phase::staged)
      throw InvalidArgument("model '" + s_->prefix + "' version " + std::to_string(s_->staging.version) +
                            " was already committed or aborted");
    s_->phase = detail::WriterState::Phase::finishing;
    for (const auto& [n, t] : s_->tensors) members.emplace_back(n, t.generation());
  }
  std::pair<std::uint64_t, std::string> done;
  try {
    if (!s_->replicas.empty()) {
      // The copies read what the writes on `stream` leave: wait for them,
      // then every asked device gets the set before any reader sees it.
#if MEMCUDA_HAS_CUDA()
      MEMCUDA_CUDA_TRY(cudaStreamSynchronize(stream));
#endif
      detail::replicate_version(s_->core, s_->staging.hidden, members, s_->replicas);
    }
    done = detail::ModelAb::commit(*s_->core, s_->prefix, s_->staging, members, stream, s_->backend, s_->device);
  } catch (...) {
    std::lock_guard lk(s_->mu);
    s_->phase = detail::WriterState::Phase::staged;  // abort() may still give it up
    throw;
  }
  StateDict dropped;  // released outside the lock (queued: no I/O here)
  {
    std::lock_guard lk(s_->mu);
    s_->phase = detail::WriterState::Phase::done;
    s_->staging.version = done.first;
    dropped.swap(s_->tensors);
  }
  return done.first;
}

void ModelVersionWriter::abort() {
  if (!s_) return;
  StateDict dropped;
  {
    std::lock_guard lk(s_->mu);
    if (s_->phase != detail::WriterState::Phase::staged) return;
    s_->phase = detail::WriterState::Phase::done;
    dropped.swap(s_->tensors);
  }
  detail::ModelAb::abort(*s_->core, s_->prefix, s_->staging.token);
}

ModelVersionWriter begin_model_version(TensorRegistry& reg, std::string_view prefix,
                                       const std::vector<StateDictEntry>& entries, const ModelVersionOptions& opts) {
  if (entries.empty()) throw InvalidArgument("begin_model_version of '" + std::string(prefix) + "' with no tensor");
  auto core = detail::RegistryAccess::shared_core(reg);
  auto s = std::make_shared<detail::WriterState>();
  s->core = core;
  s->prefix = std::string(prefix);
  s->backend = opts.backend.value_or(core->ctx.default_backend());
  s->device = s->backend == BackendKind::cuda ? opts.device : -1;
  if (!opts.replicas.empty() && s->backend != BackendKind::cuda)
    throw InvalidArgument("begin_model_version of '" + std::string(prefix) +
                          "': replicas are per CUDA device, and this version is on the host backend");
  if (!opts.replicas.empty() && entries.size() > protocol::kMaxReplicas)
    throw InvalidArgument("begin_model_version of '" + std::string(prefix) + "': " + std::to_string(entries.size()) +
                          " tensors with replicas, at most " + std::to_string(protocol::kMaxReplicas) +
                          " (one replicate command per device)");
  s->replicas = opts.replicas;
  s->staging = detail::ModelAb::begin(*core, prefix, opts.max_versions);
  try {
    std::vector<TensorSpec> specs;
    specs.reserve(entries.size());
    CreateOptions co;
    co.backend = s->backend;
    if (opts.device >= 0) co.device = opts.device;
    co.persistent = false;  // held by this writer alone until commit: a dead producer leaves nothing
    for (const auto& e : entries) specs.push_back({s->staging.hidden + e.name, e.dtype, e.shape, co});
    s->tensors = reg.create_many(specs);
    detail::StateDictCopier copier(opts.copy_stream);
    for (const auto& e : entries)
      if (e.data) copier.copy(s->tensors.at(s->staging.hidden + e.name), e.data);
    copier.finish();
  } catch (...) {
    s->tensors.clear();
    s->phase = detail::WriterState::Phase::done;
    try {
      detail::ModelAb::abort(*core, prefix, s->staging.token);
    } catch (...) {
      // the first error is the one to report; the next begin clears the record
    }
    throw;
  }
  return ModelVersionWriter(std::move(s));
}

std::uint64_t publish_model(TensorRegistry& reg, std::string_view prefix, const std::vector<StateDictEntry>& entries,
                            const ModelVersionOptions& opts, StreamHandle stream) {
  auto w = begin_model_version(reg, prefix, entries, opts);
  try {
    return w.commit(stream);
  } catch (...) {
    try {
      w.abort();
    } catch (...) {
    }
    throw;
  }
}

const std::string& PinnedModel::prefix() const {
  if (!s_) throw InvalidArgument("an empty PinnedModel");
  return s_->prefix;
}

std::uint64_t PinnedModel::version() const {
  if (!s_) throw InvalidArgument("an empty PinnedModel");
  std::lock_guard lk(s_->mu);
  return s_->version;
}

StateDict PinnedModel::tensors() const {
  if (!s_) throw InvalidArgument("an empty PinnedModel");
  std::lock_guard lk(s_->mu);
  return s_->tensors;
}

std::uint64_t PinnedModel::latest() const {
  if (!s_) throw InvalidArgument("an empty PinnedModel");
  return detail::ModelVersions::current(*s_->core, s_->prefix);
}

bool PinnedModel::advance(StreamHandle stream) {
  if (!s_) throw InvalidArgument("advance of an empty PinnedModel");
  std::string dict, ver;
  {
    std::lock_guard lk(s_->mu);
    dict = s_->dict_id;
    ver = std::to_string(s_->version);
  }
  using K = detail::AbOpened::Kind;
  auto& core = s_->core;
  auto o = detail::ModelAb::open(core, s_->prefix, dict, ver);
  if (o.kind == K::same) return false;
  if (o.kind == K::none) {  // a model of named tensors never published: nothing newer
    if (dict.empty()) return false;
    throw NotFound("model '" + s_->prefix + "' has no version record any more");
  }
  StateDict fresh;
  const bool moves = o.kind == K::ok || o.kind == K::unlinked;
  if (moves) {
    fresh = detail::ab_handles(core, o);
    if (fresh.empty()) return false;  // retired by a newer commit meanwhile: the next advance sees that one
    if (s_->open.local) fresh = detail::localize(core, std::move(fresh), o.hidden, s_->open, stream);
  }
  detail::ModelVersions::order_after(core->ctx, s_->prefix, o.rec, stream);
  std::lock_guard lk(s_->mu);
  // A concurrent advance went further ('fresh' goes, queued). A new set at
  // a version not above ours while we still hold the set we asked from is
  // the model's numbering starting again after Redis lost its data: move.
  if (s_->dict_id != dict || (o.rec.version <= s_->version && !moves)) return false;
  s_->version = o.rec.version;
  if (moves) {
    s_->dict_id = o.dict_id;
    s_->hidden = o.hidden;
    fresh.swap(s_->tensors);  // the old handles go with `fresh` after the lock (queued releases)
  }
  return true;
}

void PinnedModel::close() {
  if (!s_) return;
  StateDict dropped;
  std::lock_guard lk(s_->mu);
  dropped.swap(s_->tensors);
}

PinnedModel open_model(TensorRegistry& reg, std::string_view prefix, StreamHandle stream) {
  return open_model(reg, prefix, stream, OpenModelOptions{});
}

PinnedModel open_model(TensorRegistry& reg, std::string_view prefix, StreamHandle stream, const OpenModelOptions& opts) {
  detail::ModelVersions::validate_prefix(prefix);
  auto core = detail::RegistryAccess::shared_core(reg);
  auto s = std::make_shared<detail::PinnedState>();
  s->core = core;
  s->prefix = std::string(prefix);
  s->open = opts;
  using K = detail::AbOpened::Kind;
  for (int attempt = 0; attempt < 8; ++attempt) {
    auto o = detail::ModelAb::open(core, prefix, "", "");
    if (o.kind == K::none || o.kind == K::plain) {
      s->tensors = open_state_dict(reg, prefix);
      if (s->tensors.empty())
        throw NotFound("no model '" + std::string(prefix) + "': no version was committed and no tensor name starts with it");
      s->version = o.rec.version;
      s->hidden = s->prefix;
    } else {
      s->tensors = detail::ab_handles(core, o);
      if (s->tensors.empty()) continue;  // retired by a commit between the script and the per-name open
      s->version = o.rec.version;
      s->dict_id = o.dict_id;
      s->hidden = o.hidden;
    }
    detail::ModelVersions::order_after(core->ctx, prefix, o.rec, stream);
    if (opts.local) s->tensors = detail::localize(core, std::move(s->tensors), s->hidden, opts, stream);
    return PinnedModel(std::move(s));
  }
  throw Unavailable("model '" + std::string(prefix) + "': its current version kept changing under the open");
}

MEMCUDA_NAMESPACE_END  // namespace memcuda
