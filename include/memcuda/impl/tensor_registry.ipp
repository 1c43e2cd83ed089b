// The out-of-line members of TensorRegistry (memcuda/tensor_registry.hpp).
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "memcuda/detail/base/implementation_guard.hpp"
#include "memcuda/detail/cuda/ipc_event.hpp"
#include "memcuda/detail/registry/control_loop.hpp"
#include "memcuda/detail/registry/core.hpp"
#include "memcuda/detail/registry/ops/batch_client.hpp"
#include "memcuda/detail/registry/ops/shared_get.hpp"
#include "memcuda/tensor_registry.hpp"

MEMCUDA_NAMESPACE_BEGIN

namespace detail {

// The registry's thread and the control loop it runs.
struct RegistryThread {
  std::unique_ptr<ControlLoop> loop;
  std::jthread thread;  // declared after loop: destroyed (joined) first
};

}  // namespace detail

TensorRegistry::TensorRegistry() : TensorRegistry(RegistryOptions::from_env()) {}

// The claim comes first: a second copy of the implementation in this
// process fails before it connects (detail/base/implementation_guard.hpp).
TensorRegistry::TensorRegistry(RegistryOptions options)
    : core_((detail::implementation_guard::claim(), detail::Core::make(std::move(options)))) {
  auto t = std::make_unique<detail::RegistryThread>();
  t->loop = std::make_unique<detail::ControlLoop>(core_, redis::Connection(core_->ctx.opts.redis));
  t->loop->start();
  t->thread = std::jthread([loop = t->loop.get()](std::stop_token st) { loop->run(st); });
  thread_ = std::move(t);
}

TensorRegistry::~TensorRegistry() = default;
TensorRegistry::TensorRegistry(TensorRegistry&&) noexcept = default;

SharedTensor<void> TensorRegistry::create_any(std::string_view name, DType dtype, Shape shape, CreateOptions opts) {
  return SharedTensor<void>(create_handle(name, dtype, std::move(shape), opts));
}

GcReport TensorRegistry::collect_garbage() { return core().collect_garbage_now(); }
std::vector<QuarantinedRecord> TensorRegistry::quarantined() {
  auto& c = core();
  auto conn = c.ctx.pool.acquire();
  return detail::quarantine::list(*conn, c.ctx.keys);
}
bool TensorRegistry::clear_quarantined(std::string_view id) {
  if (id.empty()) throw InvalidArgument("clear_quarantined: empty id");
  auto& c = core();
  auto conn = c.ctx.pool.acquire();
  return detail::quarantine::clear(*conn, c.ctx.keys, id);
}
std::uint64_t TensorRegistry::trim() { return core().trim_now(); }
void TensorRegistry::reset_peak() { core().alloc.reset_peaks(); }
void TensorRegistry::remove(std::string_view name) {
  core().client.remove(name);
  core_ref().holdings.forget_name_everywhere(name);  // this process's remove is seen at once by its caches
}
bool TensorRegistry::wait(std::string_view name, std::chrono::milliseconds timeout) {
  return core().client.wait(name, timeout);
}
std::vector<TensorInfo> TensorRegistry::list(std::string_view pattern) { return core().client.list(pattern); }
ListPage TensorRegistry::list_page(std::string_view pattern, std::string_view after, std::size_t limit) {
  return core().client.list_page(pattern, after, limit);
}

TensorInfo TensorRegistry::info(std::string_view name) {
  auto i = core().client.info(name);
  if (!i) throw NotFound("no tensor named '" + std::string(name) + "'");
  return std::move(*i);
}

RegistryStats TensorRegistry::stats() { return core().stats(); }
LeaderInfo TensorRegistry::leader() { return core().client.leader_info(); }

void TensorRegistry::flush(std::chrono::milliseconds timeout) {
  auto& c = core_ref();
  detail::Core::flush(timeout.count() < 0 ? c.ctx.opts.request_timeout : timeout);
}

void TensorRegistry::check() { core(); }

// Batch operations: detail/registry/ops/batch_client.hpp. References a batch get
// takes are not put in the reference cache (a later single get takes its own).
BatchGetResult TensorRegistry::get_many(const std::vector<std::string>& names, std::optional<DType> dtype) {
  core();
  auto sel = detail::Selection::of(names);  // validates every name before anything is taken
  if (sel.names.empty()) return {};         // nothing asked: no script
  return detail::BatchClient(core_).get(sel, dtype);
}
std::map<std::string, SharedTensor<void>> TensorRegistry::get_all(const std::vector<std::string>& names,
                                                                  std::optional<DType> dtype) {
  auto r = get_many(names, dtype);
  for (const auto& n : names) {
    auto it = r.errors.find(n);
    if (it == r.errors.end()) continue;
    r.tensors.clear();  // every reference given back (queued) before the throw
    it->second.rethrow();
  }
  return std::move(r).take_all();  // no refusal (take_all still never passes one silently)
}
BatchGetResult TensorRegistry::get_prefix(std::string_view prefix) {
  core();
  return detail::BatchClient(core_).get(detail::Selection::prefix(prefix), {});
}
BatchGetResult TensorRegistry::get_matching(std::string_view glob) {
  core();
  return detail::BatchClient(core_).get(detail::Selection::glob(glob), {});
}
std::map<std::string, SharedTensor<void>> TensorRegistry::create_many(const std::vector<TensorSpec>& specs) {
  core();
  return detail::BatchClient(core_).create(specs);
}
// A batch remove, like remove(), is seen at once by this process's caches.
BatchRemoveResult TensorRegistry::remove_many(const std::vector<std::string>& names) {
  core();
  auto r = detail::BatchClient(core_).remove(detail::Selection::of(names));
  for (const auto& n : r.removed) core_ref().holdings.forget_name_everywhere(n);
  return r;
}
BatchRemoveResult TensorRegistry::remove_prefix(std::string_view prefix) {
  if (prefix.empty())
    throw InvalidArgument("remove_prefix: the prefix is empty, which would remove every tensor; "
                          "call remove_all() to mean that");
  core();
  auto r = detail::BatchClient(core_).remove(detail::Selection::prefix(prefix));
  for (const auto& n : r.removed) core_ref().holdings.forget_name_everywhere(n);
  return r;
}
BatchRemoveResult TensorRegistry::remove_all() {
  core();
  auto r = detail::BatchClient(core_).remove(detail::Selection::prefix(""));
  for (const auto& n : r.removed) core_ref().holdings.forget_name_everywhere(n);
  return r;
}

bool TensorRegistry::is_leader() const { return core_ref().is_leader(); }
const std::string& TensorRegistry::session_id() const { return core_ref().ctx.session; }
const std::string& TensorRegistry::node_id() const { return core_ref().ctx.node; }
const RegistryOptions& TensorRegistry::options() const { return core_ref().ctx.opts; }

std::shared_ptr<detail::TensorHandle> TensorRegistry::create_handle(std::string_view name, DType dtype, Shape shape,
                                                                    const CreateOptions& opts) {
  validate_name(name);
  validate_shape(shape);
  protocol::Command cmd;
  cmd.op = protocol::Op::create;
  cmd.name = std::string(name);
  cmd.dtype = dtype;
  cmd.shape = std::move(shape);
  auto& c = core();
  cmd.device = opts.device.value_or(c.ctx.opts.default_device);
  cmd.backend = opts.backend;
  if (opts.persistent) cmd.persistent = true;
  if (cmd.backend.value_or(c.ctx.default_backend()) == BackendKind::cuda) {
#if MEMCUDA_HAS_CUDA()
    // The command names the device by its UUID-stable ordinal of the
    // allocator of record; translate ours when they differ.
    cmd.device_uuid = detail::device_uuid(*cmd.device);
#else
    throw Unavailable("the cuda backend is not available: mem-cuda was built without the CUDA toolkit");
#endif
  }
  const auto token = c.holdings.begin();  // reference sharing: a later get shares the creator's handle
  auto o = c.client.create(std::move(cmd));
  return detail::remember(c, detail::handle_of(core_, std::move(o)), token);
}

// get(): a name this registry holds is shared from the reference cache (no
// Redis); see detail/registry/ops/shared_get.hpp.
// With a stream: a shared handle's record may predate the producer's last
// publish(), so it reads the current event (one round trip); a fresh acquire
// carries it in the record it just read.
std::shared_ptr<detail::TensorHandle> TensorRegistry::get_handle(std::string_view name, std::optional<DType> want,
                                                                 const GetOptions& opts) {
  core_ref();  // get_shared waits for own releases on a miss
  auto g = detail::get_shared(core_, name, want, opts);
  if (!opts.stream) return std::move(g.handle);
  if (!g.from_cache)
    wait_for_event(g.handle->info(), *opts.stream);
  else if (g.handle->info().backend == BackendKind::cuda)
    g.handle->wait_published(*opts.stream);
  return std::move(g.handle);
}

void TensorRegistry::wait_for_event(const TensorInfo& info, StreamHandle stream) {
#if MEMCUDA_HAS_CUDA()
  if (info.backend == BackendKind::cuda && !info.event_handle.empty()) detail::stream_wait_ipc_event(stream, info.event_handle);
#else
  (void)info;
  (void)stream;
#endif
}

detail::Core& TensorRegistry::core() {
  auto& c = core_ref();
  c.see_own_releases();
  return c;
}

detail::Core& TensorRegistry::core_ref() const {
  if (!core_) throw InvalidArgument("use of a moved-from TensorRegistry");
  return *core_;
}

MEMCUDA_NAMESPACE_END  // namespace memcuda
