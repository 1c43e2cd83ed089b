// TensorRegistry: the client API of mem-cuda, and the host of the control
// thread that makes one process of the machine the allocator of record.
#pragma once

#include "memcuda/config.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "memcuda/batch.hpp"
#include "memcuda/options.hpp"
#include "memcuda/share_options.hpp"
#include "memcuda/shared_tensor.hpp"
#include "memcuda/stats.hpp"

MEMCUDA_NAMESPACE_BEGIN

namespace detail {
class Core;             // detail/registry/core.hpp
struct Opened;          // detail/registry/get/client.hpp
struct RegistryThread;  // impl/tensor_registry.ipp: the control loop and its thread
struct RegistryAccess;  // below
}  // namespace detail

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
// and sent, batched, by the next registry call of this process or the
// release thread (see flush()). Releases of tensors that outlive the
// registry still land.
//
// Reference sharing: a get() of a name this registry already holds shares
// the held handle and reference, with no Redis round trip (GetOptions::fresh
// asks Redis; docs/design.md, "In-process reference sharing").
//
// A moved-from TensorRegistry throws InvalidArgument from every member.
// Everything but the templates below is defined in the implementation unit
// (memcuda/implementation.hpp).
class TensorRegistry {
 public:
  // With RegistryOptions::from_env(): the defaults and the MEMCUDA_*
  // variables (docs/operations.md, "Environment"), as the C ABI, Python and
  // the memcuda tool use them.
  TensorRegistry();
  // With exactly `options` (RegistryOptions{} reads no environment; start
  // from RegistryOptions::from_env() to honour the variables).
  explicit TensorRegistry(RegistryOptions options);
  ~TensorRegistry();  // the thread stops and joins before the core goes
  TensorRegistry(TensorRegistry&&) noexcept;
  TensorRegistry& operator=(TensorRegistry&&) = delete;
  TensorRegistry(const TensorRegistry&) = delete;
  TensorRegistry& operator=(const TensorRegistry&) = delete;

  // Creates the named tensor (it reads as zeros) and returns a
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
  SharedTensor<void> create_any(std::string_view name, DType dtype, Shape shape, CreateOptions opts = {});

  // Registers `data` (bytes of dtype x shape this process already has: host
  // memory in a MAP_SHARED memfd mapping, or cudaMalloc device memory) under
  // `name`, WITHOUT a copy, and returns this process's handle (refcount 1,
  // as create). The memory lives only as long as this process keeps it:
  // opts.keep_alive is kept until the last reference anywhere goes; after
  // this process dies, other processes' next get() raises Lost
  // (docs/design.md, "Borrowed tensors"; DLPack form: memcuda/share.hpp).
  // Throws InvalidArgument (null pointer, no bytes, name, shape, no control
  // thread), NotShareable (memory that cannot be shared without a copy:
  // plain malloc'd memory, managed memory, cuMem memory without an fd; says
  // why), AlreadyExists.
  SharedTensor<void> share(std::string_view name, void* data, DType dtype, Shape shape, ShareOptions opts = {});
  // share() of many buffers in one Redis round trip (a loaded model's
  // tensors), keyed by name. All or nothing: when one cannot be shared,
  // those already registered are released and the error of the first
  // refused buffer in the order given is thrown (AlreadyExists for a taken
  // name, NotShareable, InvalidArgument for a name given twice); each
  // refused or released buffer's keep-alive goes.
  std::map<std::string, SharedTensor<void>> share_many(std::vector<ShareRequest> items);

  // Opens a tensor by name: one Redis round trip (state, dtype and node are
  // checked and this process's reference taken atomically), then the
  // memory is mapped, once per process per allocation. Throws NotFound,
  // TypeMismatch (T is not the stored dtype), Lost, Unavailable (another
  // node, or a device this process cannot see).
  //
  // A name this registry already holds (a live SharedTensor of it exists in
  // the process) is shared without a Redis round trip: the same handle and
  // reference (docs/design.md, "In-process reference sharing"). Such a get
  // may return a tensor removed by another process up to one invalidation
  // message ago; GetOptions::fresh asks Redis (one round trip).
  template <class T>
  SharedTensor<T> get(std::string_view name, GetOptions opts = {}) {
    std::optional<DType> want;
    if constexpr (!std::is_void_v<T>) want = dtype_of<std::remove_cv_t<T>>;
    return SharedTensor<T>(get_handle(name, want, opts));
  }

  // get() and SharedTensor::slice(spec): a view of one dimension's range
  // (SliceSpec::tp: a tensor-parallel shard), sharing the get's reference.
  template <class T>
  SharedTensor<T> get_slice(std::string_view name, const SliceSpec& spec, GetOptions opts = {}) {
    return get<T>(name, opts).slice(spec);
  }

  // get() for stream-ordered consumers: additionally makes `stream` wait
  // for the producer's last publish() (cudaStreamWaitEvent on its
  // interprocess event; no host synchronisation). Work enqueued on `stream`
  // afterwards sees everything the producer enqueued before publishing.
  template <class T>
  SharedTensor<T> get(std::string_view name, StreamHandle stream) {
    std::optional<DType> want;
    if constexpr (!std::is_void_v<T>) want = dtype_of<std::remove_cv_t<T>>;
    GetOptions o;
    o.stream = stream;
    return SharedTensor<T>(get_handle(name, want, o));
  }

  // Drops the references of dead processes (expired sessions, dead JSON
  // client pids) now and frees what that releases. The allocator of
  // record does this every gc_interval on its own.
  GcReport collect_garbage();

  // Malformed records the allocator of record moved aside (a key of the
  // wrong Redis type under a listed name, fields that do not parse), and
  // deleting one for good by its id (false: no such record). Their data is
  // kept unchanged until cleared; `memcuda quarantine` does the same.
  std::vector<QuarantinedRecord> quarantined();
  bool clear_quarantined(std::string_view id);

  // Returns the allocator of record's empty slabs to the driver now (in
  // this process, when it is the leader; the control thread also does it
  // on its own). Returns the bytes released.
  std::uint64_t trim();

  // Sets the pools' peak statistic to their current use (leader only).
  void reset_peak();

  // Unlinks the name now: get() fails and create() may reuse it at once.
  // Handles already open stay valid (valid() turns false); the memory is
  // freed when the last holder releases. Throws NotFound.
  void remove(std::string_view name);

  // Blocks until the named tensor exists and is ready, or the timeout
  // passes (returns false). No polling: the create wakes the waiter.
  bool wait(std::string_view name, std::chrono::milliseconds timeout);

  // Records of the named tensors matching a glob pattern, sorted by name.
  // Reads the index a page at a time, and only the names under the glob's
  // literal prefix ("model/*" reads model/ only); the result is in memory
  // at once: for a large registry, page with list_page.
  std::vector<TensorInfo> list(std::string_view pattern = "*");

  // One page of list(pattern): at most `limit` names (1..), those after
  // `after` ("" = from the first), in name order; pass the page's `next`
  // as `after` until it is "". Bounded memory whatever the registry holds;
  // a name created or removed meanwhile may or may not appear.
  ListPage list_page(std::string_view pattern = "*", std::string_view after = {}, std::size_t limit = 1000);

  // The current record of one tensor. Throws NotFound, InvalidArgument (a
  // name no tensor can have).
  TensorInfo info(std::string_view name);

  // Counts and bytes per device and backend, the leader, this process.
  RegistryStats stats();

  // Who holds the allocator-of-record lease (two Redis commands).
  LeaderInfo leader();

  // Waits until every release queued by this process's destructors (last
  // SharedTensor copies, DLPack deleters) before the call is in Redis (every
  // other call that talks to Redis waits for them too, without throwing), for
  // at most `timeout` (default: options.request_timeout); throws
  // TimeoutError when Redis did not take them in time (they stay queued).
  void flush(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));

  // Sends this process's queued releases, as every call that talks to Redis
  // does first. The registry's thread never throws at a caller: it logs and
  // retries (refused credentials included).
  void check();

  // ---- batch operations: one Redis round trip per batch (docs/protocol.md,
  // "Batch operations"; get_many and get_all: "The get_many contract") ----
  // Per name: a refused name (NotFound, TypeMismatch with `dtype`, Lost,
  // ...) is in .errors and took nothing; the others are in .tensors.
  BatchGetResult get_many(const std::vector<std::string>& names, std::optional<DType> dtype = {});
  // The strict form: every tensor, or, when a name is refused, every
  // reference given back and the error of the first refused name IN THE
  // ORDER GIVEN thrown (what a get of that name alone throws).
  std::map<std::string, SharedTensor<void>> get_all(const std::vector<std::string>& names,
                                                    std::optional<DType> dtype = {});
  // get_many of every name starting with `prefix`, or matching a glob (in
  // name order: their take_all() throws the first refused name's error).
  BatchGetResult get_prefix(std::string_view prefix);
  BatchGetResult get_matching(std::string_view glob);
  // Creates every tensor, all or nothing (AlreadyExists names the first taken
  // name); each reads as zeros.
  std::map<std::string, SharedTensor<void>> create_many(const std::vector<TensorSpec>& specs);
  // Unlinks each name (as remove()); a missing name is in .errors.
  BatchRemoveResult remove_many(const std::vector<std::string>& names);
  // Every name starting with `prefix`. An empty prefix throws
  // InvalidArgument (an unset variable must not mean "everything"):
  // remove_all() says that.
  BatchRemoveResult remove_prefix(std::string_view prefix);
  BatchRemoveResult remove_all();

  // True while this registry holds the allocator-of-record lease (no I/O).
  bool is_leader() const;
  const std::string& session_id() const;
  const std::string& node_id() const;
  const RegistryOptions& options() const;

 private:
  // The non-template halves of create/get (the implementation unit).
  std::shared_ptr<detail::TensorHandle> create_handle(std::string_view name, DType dtype, Shape shape,
                                                      const CreateOptions& opts);
  std::shared_ptr<detail::TensorHandle> get_handle(std::string_view name, std::optional<DType> want,
                                                   const GetOptions& opts);
  // get(name, stream): makes `stream` wait for the producer's last publish.
  static void wait_for_event(const TensorInfo& info, StreamHandle stream);

  // The core, for a call that may talk to Redis: waits for the releases
  // this process queued before the call (so the call sees them).
  detail::Core& core();
  detail::Core& core_ref() const;

  std::shared_ptr<detail::Core> core_;
  std::unique_ptr<detail::RegistryThread> thread_;  // declared after core_: joined first

  friend struct detail::RegistryAccess;
};

namespace detail {
// How the free functions of other public headers (state_dict.hpp, model.hpp:
// their bodies in impl/*.ipp) and white-box tests reach a registry's core
// without widening TensorRegistry's public interface. Core stays incomplete
// here; only the implementation unit uses what these return.
struct RegistryAccess {
  // The core for a call that talks to Redis: like the registry's own calls,
  // it sends this process's queued releases first.
  static Core& core(TensorRegistry& r) { return r.core(); }
  // The same, shared: for what outlives the call (handles).
  static std::shared_ptr<Core> shared_core(TensorRegistry& r) {
    (void)r.core();
    return r.core_;
  }
};
}  // namespace detail

MEMCUDA_NAMESPACE_END  // namespace memcuda
