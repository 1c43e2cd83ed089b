// Which backend does what. A registry allocates with one kind per backend
// (cuda: cuMem with fds or legacy IPC, resolved against the device); it
// opens every kind a record names, with that kind's backend, whatever it
// allocates with: the allocation kind decides only what a process creates.
// A kind this process cannot open is a KindUnavailable saying what it lacks.
#pragma once

#include "memcuda/config.hpp"

#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

#include "memcuda/detail/backend/backend.hpp"
#include "memcuda/detail/backend/borrow.hpp"
#include "memcuda/detail/backend/cuda_backend.hpp"
#include "memcuda/detail/backend/cuda_vmm_backend.hpp"
#include "memcuda/detail/backend/host_backend.hpp"
#include "memcuda/detail/process/process.hpp"
#include "memcuda/error.hpp"
#include "memcuda/options.hpp"
#include "memcuda/tensor_info.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// The process's backend objects (Process::backends()). They are stateless
// (served fds live in FdService, held ones in FdTable; CUDA and the
// driver's entry points are loaded by their first open or allocation), so
// all are made together, before the blocks that free through them.
struct Backends {
  HostBackend host;
  BorrowedMemory borrowed;
#if MEMCUDA_HAS_CUDA()
  CudaBackend ipc;
  CudaVmmBackend vmm;
#endif
};

// The backend of a BackendKind's first allocation kind (host: host_memfd;
// cuda: legacy IPC):
// for what is not about one record's kind.
inline Backend& backend_for(BackendKind k) {
  if (k == BackendKind::host) return Process::get().backends().host;
#if MEMCUDA_HAS_CUDA()
  return Process::get().backends().ipc;
#else
  throw KindUnavailable(KindErrc::built_without_cuda, std::string(alloc_kind::cuda_ipc),
                        "the cuda backend is not available: mem-cuda was built without the CUDA toolkit");
#endif
}

#if MEMCUDA_HAS_CUDA()
inline CudaVmmBackend& vmm_backend() { return Process::get().backends().vmm; }

// The CUDA driver reads /proc as its own pid namespace's: under a /proc of
// another namespace (unshare --pid without --mount-proc) it fails with
// cudaErrorOperatingSystem. Says so, or "" when /proc/self is this process.
inline std::string foreign_proc_hint() {
  char buf[32] = {};
  const ssize_t n = ::readlink("/proc/self", buf, sizeof buf - 1);
  const std::string self = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
  if (self.empty() || self == std::to_string(::getpid())) return {};
  return "; /proc is another pid namespace's (/proc/self is pid " + self + ", this process is pid " +
         std::to_string(::getpid()) + "), and the CUDA driver needs its own: mount one (unshare --mount-proc)";
}

// Why this process can open no cuda memory at all, or nullopt. Asked once:
// the driver and the visible devices do not change during a process's life.
inline const std::optional<std::pair<KindErrc, std::string>>& cuda_lack() {
  static const std::optional<std::pair<KindErrc, std::string>> lack =
      []() -> std::optional<std::pair<KindErrc, std::string>> {
    int n = 0;
    const cudaError_t st = cudaGetDeviceCount(&n);
    if (st == cudaSuccess && n > 0) return std::nullopt;
    cudaGetLastError();
    int driver = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess) cudaGetLastError();
    const std::string why = st == cudaSuccess ? std::string("no device") : cudaGetErrorName(st);
    if (driver == 0 || st == cudaErrorInsufficientDriver || st == cudaErrorStubLibrary)
      return std::pair{KindErrc::no_cuda_driver, "this process has no usable CUDA driver (" + why + ")"};
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    return std::pair{KindErrc::no_cuda_device,
                     "this process sees no CUDA device (" + why + "; CUDA_VISIBLE_DEVICES is " +
                         (visible ? "'" + std::string(visible) + "'" : std::string("unset")) + ")" +
                         foreign_proc_hint()};
  }();
  return lack;
}
#endif

// The backend that opens `t`, by the kind its record names, whatever this
// registry allocates with. KindUnavailable when this process cannot open
// that kind (and says why), ProtocolError(bad_record) when the record's
// kind and backend disagree.
inline Backend& backend_for(const TensorInfo& t) {
  const std::string_view kind = record_kind(t);
  const bool host = kind == alloc_kind::host_memfd;
  const bool cuda = kind == alloc_kind::cuda_ipc || kind == alloc_kind::cuda_vmm_fd;
  if (!host && !cuda)
    throw KindUnavailable(KindErrc::unknown_kind, std::string(kind),
                          "tensor '" + t.name + "' is a " + std::string(kind) +
                              " allocation, a kind this mem-cuda version does not know (its allocator of record "
                              "runs a newer version): upgrade this reader");
  if (host != (t.backend == BackendKind::host))
    throw ProtocolError(ProtocolErrc::bad_record, "tensor '" + t.name + "': its record says backend " +
                                                      std::string(to_string(t.backend)) + " but allocation kind " +
                                                      std::string(kind) + "; refused (a record edited in Redis?)");
  if (host) return Process::get().backends().host;
  const std::string what = "tensor '" + t.name + "' is a " + std::string(kind) + " allocation, but ";
#if MEMCUDA_HAS_CUDA()
  if (const auto& lack = cuda_lack())
    throw KindUnavailable(lack->first, std::string(kind), what + lack->second + ": it cannot open cuda memory");
  if (kind == alloc_kind::cuda_ipc) return Process::get().backends().ipc;
  if (const auto& d = cu_driver(); !d.ok())
    throw KindUnavailable(KindErrc::no_cuda_driver, std::string(kind),
                          what + "this process's CUDA driver lacks " + d.missing +
                              " (cuMem with POSIX fds needs a newer driver)");
  return Process::get().backends().vmm;
#else
  throw KindUnavailable(KindErrc::built_without_cuda, std::string(kind),
                        what + "this mem-cuda was built without the CUDA toolkit: it opens only host memory");
#endif
}

// The requested cuda allocation kind: the option, else automatic (the
// environment is read once, by RegistryOptions::from_env, not here).
inline CudaAllocation requested_cuda_allocation(const RegistryOptions& o) {
  return o.cuda_allocation.value_or(CudaAllocation::automatic);
}

inline bool cuda_usable() {
#if MEMCUDA_HAS_CUDA()
  return device_count() > 0;
#else
  return false;
#endif
}

inline CudaAllocation resolve_cuda_allocation(const RegistryOptions& opts) {
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

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
