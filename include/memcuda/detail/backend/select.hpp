// Which backend opens what: the process-wide backend objects, and the cuda
// allocation kind (cuMem with fds, or legacy IPC) a registry asks for and
// resolves against the device.
#pragma once

#include "memcuda/config.hpp"

#include <cstdlib>
#include <string>

#include "memcuda/detail/backend/backend.hpp"
#include "memcuda/detail/backend/cuda_backend.hpp"
#include "memcuda/detail/backend/cuda_vmm_backend.hpp"
#include "memcuda/detail/backend/host_backend.hpp"
#include "memcuda/error.hpp"
#include "memcuda/options.hpp"
#include "memcuda/tensor_info.hpp"

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
