// What every role of a registry shares and never changes after
// construction: the options, the keys, this session's identity and the
// client connection pools.
#pragma once

#include "memcuda/config.hpp"

#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "memcuda/detail/backend/backend.hpp"
#include "memcuda/detail/backend/select.hpp"
#include "memcuda/detail/base/holder_id.hpp"
#include "memcuda/detail/base/node.hpp"
#include "memcuda/detail/fd/fd_service.hpp"
#include "memcuda/detail/fd/live_lock.hpp"
#include "memcuda/detail/process/process.hpp"
#include "memcuda/detail/registry/option_checks.hpp"
#include "memcuda/detail/store/keys.hpp"
#include "memcuda/options.hpp"
#include "memcuda/redis/connection_pool.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class Context {
 public:
  explicit Context(RegistryOptions o)
      : opts(validated(std::move(o))),
        fd_pin(FdService::pin(FdAccess{opts.runtime_dir, opts.allowed_uids, opts.allowed_gids})),
        live(LiveLock::acquire()),
        keys(opts.name_space, !opts.redis.cluster.empty(), opts.fleet ? node_scope(node_id()) : std::string()),
        session(new_session_id()),
        node(node_id()),
        pool(opts.redis, redis::PoolOptions{opts.client_connections, opts.request_timeout * 2}),
        waits(opts.redis, redis::PoolOptions{opts.waiting_connections, opts.request_timeout * 2}) {
    ProcessOptions p;  // the process-wide parts' settings: the last registry made sets them
    p.fd_prefetch = opts.fd_prefetch;
    p.fd_park_window = opts.fd_park_window;
    p.import_cache = opts.import_cache;
    Process::get().configure(p);
  }

  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  const RegistryOptions opts;
  // The process's fd service uses this registry's runtime directory and
  // peer policy while it lives (FdService::pin: others are refused).
  const std::shared_ptr<void> fd_pin;
  // The process's liveness lock in that directory (null when it cannot
  // hold one): named in the session value, so processes of other pid
  // namespaces that share the directory can prove this one's death.
  const std::shared_ptr<LiveLock> live;
  const Keys keys;
  const std::string session;
  const std::string node;
  const std::int64_t started_ms = now_ms();
  // Short client commands borrow from `pool`; calls that block in Redis
  // for long (a reply from the allocator of record, wait(), a holder's
  // copy) borrow from `waits`, so they never starve the short ones.
  redis::ConnectionPool pool;
  redis::ConnectionPool waits;

  // The cuda allocation kind of this registry, resolved on first use (it
  // asks the device, so not in the constructor): vmm or ipc, never automatic.
  CudaAllocation cuda_allocation() const {
    std::call_once(cuda_once_, [this] { cuda_kind_ = resolve_cuda_allocation(opts); });
    return cuda_kind_;
  }
  // The backend this registry allocates `k` with. It opens records by
  // their own kind (backend_for(const TensorInfo&)), whatever this is.
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

 private:
  mutable std::once_flag cuda_once_;
  mutable CudaAllocation cuda_kind_ = CudaAllocation::ipc;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
