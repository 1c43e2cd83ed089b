// What every role of a registry shares and never changes after
// construction: the options, the keys, this session's identity, the loaded
// scripts and the client connection pools; plus the slot through which the
// registry's thread hands an unrecoverable error to the next API call.
#pragma once

#include "memcuda/config.hpp"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "memcuda/detail/backend/backend.hpp"
#include "memcuda/detail/backend/cuda_backend.hpp"
#include "memcuda/detail/backend/cuda_vmm_backend.hpp"
#include "memcuda/detail/backend/host_backend.hpp"
#include "memcuda/detail/control/keys.hpp"
#include "memcuda/detail/control/scripts.hpp"
#include "memcuda/detail/fault.hpp"
#include "memcuda/detail/holder_id.hpp"
#include "memcuda/detail/log.hpp"
#include "memcuda/detail/node.hpp"
#include "memcuda/error.hpp"
#include "memcuda/options.hpp"
#include "memcuda/protocol.hpp"
#include "memcuda/redis/connection.hpp"
#include "memcuda/redis/connection_pool.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

inline Backend& backend_for(BackendKind k) {
  static HostBackend host;  // stateless; process-wide so blocks never outlive it
  if (k == BackendKind::host) return host;
#if MEMCUDA_HAS_CUDA()
  static CudaBackend cuda;
  return cuda;
#else
  throw Unavailable("the cuda backend is not available: mem-cuda was built without the CUDA toolkit");
#endif
}

#if MEMCUDA_HAS_CUDA()
// The cuMem backend (stateless: its served fds live in FdService, its
// standby fds in FdHolds).
inline CudaVmmBackend& vmm_backend() {
  static CudaVmmBackend vmm;
  return vmm;
}
#endif

// The backend that opens `t` by its record's alloc_kind, whatever this
// registry allocates with: for internal paths (a migration copy into a new
// home, adoption), not for a user's get (Context::backend checks the kind).
inline Backend& backend_for(const TensorInfo& t) {
  if (t.backend == BackendKind::cuda && t.alloc_kind == alloc_kind::cuda_vmm_fd) {
#if MEMCUDA_HAS_CUDA()
    return vmm_backend();
#else
    throw Unavailable("tensor '" + t.name + "' is a cuda_vmm_fd allocation: mem-cuda was built without CUDA");
#endif
  }
  return backend_for(t.backend);
}

// The pid a session value names, when it means the same process here: the
// session is of this node and this pid namespace (and not this process).
// 0 otherwise (another node or namespace, an older writer without "pidns",
// a value that does not decode): then only its key's expiry says it died.
inline pid_t judgeable_pid(std::string_view session_value, const std::string& node) {
  protocol::SessionInfo s;
  try {
    s = protocol::decode_session(session_value);
  } catch (const ProtocolError&) {
    return 0;
  }
  if (s.node != node || s.pid_ns.empty() || s.pid_ns != pid_namespace_id() || s.pid == ::getpid()) return 0;
  return static_cast<pid_t>(s.pid);
}

// Whether a session's process is provably gone although its key has not
// expired yet: its pid is judgeable here and that process has ended
// (process_ended: no process has the pid, or it is a zombie; the process
// kept its pid while it lived, so a reused pid can only make a dead one
// look alive, never the reverse).
inline bool session_proves_death(std::string_view session_value, const std::string& node) {
  return process_ended(judgeable_pid(session_value, node));
}

// The requested cuda allocation kind: the option, else MEMCUDA_CUDA_ALLOCATION,
// else automatic. Throws InvalidArgument for an unknown value.
inline CudaAllocation requested_cuda_allocation(const RegistryOptions& o) {
  if (o.cuda_allocation) return *o.cuda_allocation;
  const char* e = std::getenv("MEMCUDA_CUDA_ALLOCATION");
  if (!e || !*e) return CudaAllocation::automatic;
  if (auto v = cuda_allocation_from_string(e)) return *v;
  throw InvalidArgument("MEMCUDA_CUDA_ALLOCATION is '" + std::string(e) + "'; expected auto, vmm or ipc");
}

inline bool cuda_usable() {
#if MEMCUDA_HAS_CUDA()
  return device_count() > 0;
#else
  return false;
#endif
}

// A number from a script's table: Lua numbers arrive as integers, Hash
// values (HGET) as strings.
inline std::int64_t reply_int(redis::ReplyView v) {
  if (v.is_integer()) return v.integer();
  std::string s(v.str());
  try {
    return std::stoll(s);
  } catch (const std::exception&) {
    throw InternalError("expected a number from Redis, got '" + s + "'");
  }
}
inline std::uint64_t reply_u64(redis::ReplyView v) { return static_cast<std::uint64_t>(reply_int(v)); }

inline protocol::Fields fields_from_reply(redis::ReplyView r) {
  protocol::Fields f;
  f.reserve(r.size() / 2);
  for (std::size_t i = 0; i + 1 < r.size(); i += 2)
    f.emplace_back(std::string(r[i].str()), std::string(r[i + 1].str()));
  return f;
}

// The server-side block of BLPOP/BLMOVE, in seconds with millisecond digits.
inline std::string seconds_arg(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", std::max<double>(ms.count(), 1.0) / 1000.0);
  return buf;
}

// The status a script returned (the first element of its table). The
// fault point makes it one no script returns, to test how unknown ones are
// handled.
inline std::string script_status(const redis::Reply& r) {
  if (MEMCUDA_FAULT("script.unknown_status")) return "fault:unknown-status";
  return std::string(r[0].str());
}

// What a script's 'stray' status means: the key under a tensor's name is not
// a record of ours (a Hash without a generation, e.g. written by hand, or not
// a Hash at all). It is left as it is; this says what it is and how to clear it.
inline std::string stray_record(const std::string& key, std::string_view type) {
  const std::string what = type == "hash" ? std::string("a Hash without a 'generation' field")
                                          : "a " + std::string(type) + ", not a Hash";
  return "the key '" + key + "' exists but is not a mem-cuda tensor record (" + what +
         "); it was left untouched. If nothing of yours is stored there, delete it (redis-cli DEL '" + key +
         "') and try again";
}

// A status the code does not know: a bug or a script of another version,
// never a lost lease (only 'notleader' says that).
// A record the acquire scripts refused to take a reference to: its
// generation or refcount does not parse or is negative.
inline ProtocolError corrupt_record(const std::string& name, std::string_view what) {
  return ProtocolError(ProtocolErrc::bad_record, "the record of '" + name + "' is corrupt (" + std::string(what) +
                                                     "): no reference taken; the allocator of record quarantines "
                                                     "it (`memcuda quarantine`)");
}

[[noreturn]] inline void unexpected_status(std::string_view script, std::string_view status) {
  throw InternalError("the " + std::string(script) + " script returned '" + std::string(status) +
                      "', a status this version of mem-cuda does not know");
}

class Context {
 public:
  explicit Context(RegistryOptions o)
      : opts(validated(std::move(o))),
        keys(opts.name_space),
        session(new_session_id()),
        node(node_id()),
        pool(opts.redis, redis::PoolOptions{opts.client_connections, opts.request_timeout * 2}),
        waits(opts.redis, redis::PoolOptions{opts.waiting_connections, opts.request_timeout * 2}) {}

  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  const RegistryOptions opts;
  const Keys keys;
  const std::string session;
  const std::string node;
  const std::int64_t started_ms = now_ms();
  // Script objects are immutable (SHA and source): one set serves every thread.
  const lua::Scripts scripts;
  // Short client commands borrow from `pool`; calls that block in Redis
  // for long (a reply from the allocator of record, wait(), a holder's
  // copy) borrow from `waits`, so they never starve the short ones.
  redis::ConnectionPool pool;
  redis::ConnectionPool waits;

  // The cuda allocation kind of this registry, resolved on first use (it
  // asks the device, so not in the constructor): vmm or ipc, never automatic.
  CudaAllocation cuda_allocation() const {
    std::call_once(cuda_once_, [this] { cuda_kind_ = resolve_cuda_allocation(); });
    return cuda_kind_;
  }
  // The backend this registry allocates and opens `k` with.
  Backend& backend(BackendKind k) const {
    if (k == BackendKind::cuda && cuda_allocation() == CudaAllocation::vmm) {
#if MEMCUDA_HAS_CUDA()
      return vmm_backend();
#endif
    }
    return backend_for(k);
  }

  BackendKind default_backend() const {
    if (opts.default_backend) return *opts.default_backend;
    return cuda_usable() ? BackendKind::cuda : BackendKind::host;
  }

  // Whether a tensor's owner session is alive: its session key exists, or
  // (no key: Redis lost it, or the process was stopped past its TTL) its
  // process still runs, so its memory is still good. A key that still
  // exists yet names a process of this node and pid namespace that no
  // longer exists (kill(2): ESRCH) is a dead owner whose key has not
  // expired yet: proven dead, so a takeover need not wait session_ttl.
  bool owner_alive(redis::Connection& c, const std::string& owner, std::int64_t pid) const {
    if (owner.empty()) return false;
    if (auto v = c.command({"GET", keys.session(owner)}); !v.is_nil()) return !session_proves_death(v.str(), node);
    return pid > 0 && pid <= 0x7fffffff && HolderId::process_alive(static_cast<pid_t>(pid));
  }

  // ---- error hand-off from the registry's thread ----
  void set_fatal(std::exception_ptr e) {
    std::lock_guard lk(fatal_mu_);
    if (!fatal_) fatal_ = e;
  }
  void check_fatal() {
    std::lock_guard lk(fatal_mu_);
    if (fatal_) std::rethrow_exception(std::exchange(fatal_, nullptr));
  }

 private:
  static RegistryOptions validated(RegistryOptions o) {
    if (o.lease_ttl < std::chrono::milliseconds(30)) throw InvalidArgument("lease_ttl must be at least 30 ms");
    if (o.client_connections < 1) throw InvalidArgument("client_connections must be at least 1");
    if (o.waiting_connections < 1) throw InvalidArgument("waiting_connections must be at least 1");
    if (o.release_linger.count() < 0 || o.release_linger > std::chrono::seconds(60))
      throw InvalidArgument("release_linger must be between 0 and 60 s");
    if (requested_cuda_allocation(o) == CudaAllocation::vmm && o.pool.upstream)
      throw InvalidArgument("cuda_allocation = vmm cannot use a user upstream resource (PoolOptions::upstream): "
                            "cuMem allocations are made by the backend; use ipc, or drop the upstream");
    return o;
  }

  CudaAllocation resolve_cuda_allocation() const {
    CudaAllocation want = requested_cuda_allocation(opts);
    if (want != CudaAllocation::automatic) return want;
#if MEMCUDA_HAS_CUDA()
    if (opts.pool.upstream) return CudaAllocation::ipc;  // a user resource: plain cudaMalloc memory
    if (!cuda_usable()) return CudaAllocation::ipc;
    int dev = opts.default_device >= 0 && opts.default_device < device_count() ? opts.default_device : 0;
    return vmm_fd_supported(dev) ? CudaAllocation::vmm : CudaAllocation::ipc;
#else
    return CudaAllocation::ipc;
#endif
  }

  mutable std::once_flag cuda_once_;
  mutable CudaAllocation cuda_kind_ = CudaAllocation::ipc;

  std::mutex fatal_mu_;  // leaf
  std::exception_ptr fatal_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
