// TensorRegistry: the client API of mem-cuda, and the host of the control
// thread that makes one process of the machine the allocator of record.
#pragma once

#include "memcuda/config.hpp"

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "memcuda/batch.hpp"
#include "memcuda/detail/control/control_loop.hpp"
#include "memcuda/detail/registry/batch_client.hpp"
#include "memcuda/detail/registry/core.hpp"
#include "memcuda/options.hpp"
#include "memcuda/shared_tensor.hpp"
#include "memcuda/stats.hpp"

MEMCUDA_NAMESPACE_BEGIN

// A connection to the tensor registry in Redis.
//
// Construction connects to Redis (ConnectionError/AuthError/TimeoutError
// when it cannot), registers a session (a key with a TTL its thread keeps
// alive) and starts the registry's thread. Unless options.control_thread is
// false, the thread campaigns for the allocator-of-record lease: if no
// process holds it, this one takes it before the constructor returns.
// Destruction stops the thread, releases the lease at once (so a follower
// takes over) and ends the session.
//
// Tensors returned by create/get stay usable after the registry is
// destroyed (they keep its connection alive); memory this process
// allocated as allocator of record lives until its last local user is gone.
//
// Thread safety: all member functions may be called from any thread. Each
// call borrows a Redis connection of its own from a small pool
// (options.client_connections; calls that wait in Redis, such as a create
// served by another process or wait(), from options.waiting_connections),
// so one thread's call never waits behind another's.
//
// Releases: destroying the last copy of a SharedTensor (or a DLPack
// deleter) does no Redis I/O on the caller's thread; the release is queued
// and sent, batched, by the registry's release thread, one round trip after
// the batch in flight (see flush()); every later call of any registry of
// this process that talks to Redis first waits for them, so it sees them.
// Releases of tensors that outlive the registry still land.
//
// A moved-from TensorRegistry throws InvalidArgument from every member.
class TensorRegistry {
 public:
  explicit TensorRegistry(RegistryOptions options = {})
      : core_(detail::Core::make(std::move(options))) {
    loop_ = std::make_unique<detail::ControlLoop>(core_, redis::Connection(core_->ctx.opts.redis));
    loop_->start();
    thread_ = std::jthread([loop = loop_.get()](std::stop_token st) { loop->run(st); });
  }
  ~TensorRegistry() = default;  // thread_ stops and joins before loop_ goes
  TensorRegistry(TensorRegistry&&) noexcept = default;
  TensorRegistry& operator=(TensorRegistry&&) = delete;
  TensorRegistry(const TensorRegistry&) = delete;
  TensorRegistry& operator=(const TensorRegistry&) = delete;

  // Creates the named tensor (zero-filled is NOT guaranteed) and returns a
  // handle holding the creator's reference (refcount 1, or 2 when
  // persistent). In the allocator of record it allocates directly; in any
  // other process it sends a create command and waits up to
  // options.request_timeout. Throws AlreadyExists, InvalidArgument (name,
  // shape, device), BudgetExceeded, NotLeader (nobody serves), CudaError.
  template <class T>
  SharedTensor<T> create(std::string_view name, Shape shape, CreateOptions opts = {}) {
    static_assert(TensorElement<std::remove_cv_t<T>>, "create<T>: T needs a dtype (use create_any for untyped)");
    return SharedTensor<T>(create_handle(name, dtype_of<std::remove_cv_t<T>>, std::move(shape), opts));
  }
  SharedTensor<void> create_any(std::string_view name, DType dtype, Shape shape, CreateOptions opts = {}) {
    return SharedTensor<void>(create_handle(name, dtype, std::move(shape), opts));
  }

  // Opens a tensor by name: one Redis round trip (state, dtype and node are
  // checked and this process's reference taken atomically), then the
  // memory is mapped, once per process per allocation. Throws NotFound,
  // TypeMismatch (T is not the stored dtype), Lost, Unavailable (another
  // node, or a device this process cannot see).
  template <class T>
  SharedTensor<T> get(std::string_view name) {
    std::optional<DType> want;
    if constexpr (!std::is_void_v<T>) want = dtype_of<std::remove_cv_t<T>>;
    auto o = core().client.acquire(name, want);
    return SharedTensor<T>(make_handle(std::move(o)));
  }

  // get() for stream-ordered consumers: additionally makes `stream` wait
  // for the producer's last publish() (cudaStreamWaitEvent on its
  // interprocess event; no host synchronisation). Work enqueued on `stream`
  // afterwards sees everything the producer enqueued before publishing.
  template <class T>
  SharedTensor<T> get(std::string_view name, StreamHandle stream) {
    auto t = get<T>(name);
#if MEMCUDA_HAS_CUDA()
    if (t.backend() == BackendKind::cuda && !t.info().event_handle.empty())
      detail::stream_wait_ipc_event(stream, t.info().event_handle);
#else
    (void)stream;
#endif
    return t;
  }

  // Drops the references of dead processes (expired sessions, dead JSON
  // client pids) now and frees what that releases. The allocator of
  // record does this every gc_interval on its own.
  GcReport collect_garbage() { return core().collect_garbage_now(); }

  // Returns the allocator of record's empty slabs to the driver now (in
  // this process, when it is the leader; the control thread also does it
  // on its own). Returns the bytes released.
  std::uint64_t trim() { return core().trim_now(); }

  // Sets the pools' peak statistic to their current use (leader only).
  void reset_peak() { core().alloc.reset_peaks(); }

  // Unlinks the name now: get() fails and create() may reuse it at once.
  // Handles already open stay valid (valid() turns false); the memory is
  // freed when the last holder releases. Throws NotFound.
  void remove(std::string_view name) { core().client.remove(name); }

  // Blocks until the named tensor exists and is ready, or the timeout
  // passes (returns false). No polling: the create wakes the waiter.
  bool wait(std::string_view name, std::chrono::milliseconds timeout) { return core().client.wait(name, timeout); }

  // Records of the named tensors matching a glob pattern, sorted by name.
  std::vector<TensorInfo> list(std::string_view pattern = "*") { return core().client.list(pattern); }

  // The current record of one tensor. Throws NotFound, InvalidArgument (a
  // name no tensor can have).
  TensorInfo info(std::string_view name) {
    auto i = core().client.info(name);
    if (!i) throw NotFound("no tensor named '" + std::string(name) + "'");
    return std::move(*i);
  }

  // Counts and bytes per device and backend, the leader, this process.
  RegistryStats stats() { return core().stats(); }

  // Who holds the allocator-of-record lease (two Redis commands).
  LeaderInfo leader() { return core().client.leader_info(); }

  // Waits until every release queued by this process's destructors (last
  // SharedTensor copies, DLPack deleters) before the call is in Redis (every
  // other call that talks to Redis waits for them too, without throwing), for
  // at most `timeout` (default: options.request_timeout); throws
  // TimeoutError when Redis did not take them in time (they stay queued).
  void flush(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) {
    auto& c = core_ref();
    detail::Core::flush(timeout.count() < 0 ? c.ctx.opts.request_timeout : timeout);
  }

  // Rethrows an error the registry's thread could not recover from (e.g.
  // credentials no longer accepted after a Redis restart); every other call
  // does this too. No-op when all is well.
  void check() { core(); }

  // ---- batch operations: one Redis round trip per batch (all in
  // detail/registry/batch_client.hpp; docs/protocol.md, "Batch operations") ----
  // Takes a reference to each name at once; a refused name (NotFound,
  // TypeMismatch with `dtype`, Lost, ...) is in .errors and took nothing.
  BatchGetResult get_many(const std::vector<std::string>& names, std::optional<DType> dtype = {}) { return batch().get(detail::Selection::of(names), dtype); }
  // The same for every name starting with `prefix`, or matching a glob.
  BatchGetResult get_prefix(std::string_view prefix) { return batch().get(detail::Selection::prefix(prefix), {}); }
  BatchGetResult get_matching(std::string_view glob) { return batch().get(detail::Selection::glob(glob), {}); }
  // Strict get_many: all or the first error (every reference given back).
  std::map<std::string, SharedTensor<void>> get_all(const std::vector<std::string>& names) { return get_many(names).take_all(); }
  // Creates every tensor, all or nothing (AlreadyExists names the first taken name).
  std::map<std::string, SharedTensor<void>> create_many(const std::vector<TensorSpec>& specs) { return batch().create(specs); }
  // Unlinks each name (as remove()); a missing name is in .errors.
  BatchRemoveResult remove_many(const std::vector<std::string>& names) { return batch().remove(detail::Selection::of(names)); }
  BatchRemoveResult remove_prefix(std::string_view prefix) { return batch().remove(detail::Selection::prefix(prefix)); }
  // Drops the handles; their releases are queued and sent as one pipeline.
  template <class Handles> static void release_many(Handles& handles) { handles.clear(); }

  // True while this registry holds the allocator-of-record lease (no I/O).
  bool is_leader() const { return core_ref().is_leader(); }
  const std::string& session_id() const { return core_ref().ctx.session; }
  const std::string& node_id() const { return core_ref().ctx.node; }
  const RegistryOptions& options() const { return core_ref().ctx.opts; }

 private:
  detail::BatchClient batch() { core(); return detail::BatchClient(core_); }

  std::shared_ptr<detail::TensorHandle> create_handle(std::string_view name, DType dtype, Shape shape,
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
    auto o = c.client.create(std::move(cmd));
    return make_handle(std::move(o));
  }

  // The handle of a reference just taken. If its constructor throws (a
  // device this process cannot see, bad_alloc), the reference is given back
  // rather than leaked until the session ends.
  template <class Opened>
  std::shared_ptr<detail::TensorHandle> make_handle(Opened o) {
    std::string name = o.info.name;
    const std::uint64_t gen = o.info.generation;
    try {
      return std::make_shared<detail::TensorHandle>(core_, std::move(o.info), o.data, std::move(o.keep));
    } catch (...) {
      detail::Core::release_later(core_, std::move(name), gen);
      throw;
    }
  }

  // The core, for a call that may talk to Redis: rethrows an error the
  // registry's thread could not recover from, then waits for the releases
  // this process queued before the call (so the call sees them).
  detail::Core& core() {
    auto& c = core_ref();
    c.ctx.check_fatal();
    c.see_own_releases();
    return c;
  }
  detail::Core& core_ref() const {
    if (!core_) throw InvalidArgument("use of a moved-from TensorRegistry");
    return *core_;
  }

  std::shared_ptr<detail::Core> core_;
  std::unique_ptr<detail::ControlLoop> loop_;
  std::jthread thread_;  // declared after loop_: destroyed (joined) first
};

MEMCUDA_NAMESPACE_END  // namespace memcuda
