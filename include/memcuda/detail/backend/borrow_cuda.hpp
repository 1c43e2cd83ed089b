// Borrowed device memory (TensorRegistry::share of a device pointer;
// docs/design.md, "Borrowed tensors"): a cudaMalloc allocation, whoever made
// it, goes with legacy CUDA IPC as it is (the record names the allocation
// base and the tensor's offset in it); cuMem memory made exportable as a
// POSIX fd goes as a cuda_vmm_fd served by this process's fd server. A
// tensor that spans two physical allocations cannot be one mapping:
// NotShareable.
#pragma once

#include "memcuda/config.hpp"
#if MEMCUDA_HAS_CUDA()

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <string>

#include "memcuda/detail/backend/backend.hpp"
#include "memcuda/detail/fd/fd_service.hpp"
#include "memcuda/detail/fd/fd_source.hpp"
#include "memcuda/detail/fd/unique_fd.hpp"
#include "memcuda/detail/cuda/driver.hpp"
#include "memcuda/detail/cuda/pointer.hpp"
#include "memcuda/detail/cuda/runtime.hpp"
#include "memcuda/share_options.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// The allocation around `p`: its base and size (cuMemGetAddressRange).
inline std::pair<std::uintptr_t, std::size_t> allocation_range(const void* p, const std::string& what) {
  using Fn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  static Fn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<Fn>(f);
  }();
  if (!fn) throw Unavailable(what + ": the CUDA driver lacks cuMemGetAddressRange");
  CUdeviceptr base = 0;
  size_t size = 0;
  if (CUresult r = fn(&base, &size, reinterpret_cast<CUdeviceptr>(p)); r != CUDA_SUCCESS)
    throw NotShareable(what + ": not an allocation the CUDA driver knows (cuMemGetAddressRange: CUresult " +
                       std::to_string(static_cast<int>(r)) + ")");
  return {static_cast<std::uintptr_t>(base), size};
}

// cuMem memory at `p`: its physical allocation's fd, served as a
// cuda_vmm_fd. Throws NotShareable when it is not cuMem memory or cannot be
// exported as an fd.
inline Allocation borrow_cuda_vmm(const void* p, std::uint64_t bytes, int device, std::uint64_t alloc_id,
                                  const std::string& session, const std::string& what, const std::string& ipc_error) {
  const auto& d = cu_driver();
  const std::string neither = what + ": neither cudaMalloc memory (cudaIpcGetMemHandle: " + ipc_error +
                              ") nor cuMem memory exportable as a POSIX fd";
  if (!d.ok()) throw NotShareable(neither + " (the CUDA driver lacks " + d.missing + ")");
  CUmemGenericAllocationHandle h{};
  if (CUresult r = d.MemRetainAllocationHandle(&h, const_cast<void*>(p)); r != CUDA_SUCCESS)
    throw NotShareable(neither + " (cuMemRetainAllocationHandle: " + cu_error_text(r) +
                       "): managed memory and other allocators' memory cannot be shared without a copy");
  struct Release {
    const CuDriver& d;
    CUmemGenericAllocationHandle h;
    ~Release() { log_cu(d.MemRelease(h), "cuMemRelease"); }  // the retain's reference only
  } release{d, h};
  int raw = -1;
  if (CUresult r = d.MemExportToShareableHandle(&raw, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      r != CUDA_SUCCESS)
    throw NotShareable(what + ": cuMem memory made without a POSIX fd handle type (cuMemExportToShareableHandle: " +
                       cu_error_text(r) + "): its allocator must set requestedHandleTypes = "
                       "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, or copy it into registry memory");
  UniqueFd fd = UniqueFd::adopt_cloexec(raw);
  auto [base, size] = allocation_range(p, what);
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (bytes > base + size - a)
    throw NotShareable(what + ": its " + std::to_string(bytes) + " bytes run past the end of its cuMem allocation (" +
                       std::to_string(base + size - a) + " bytes left): it spans two physical allocations (an "
                       "expandable segment maps in pages), which no one mapping can open; copy it instead");
  Allocation out;
  out.alloc_id = alloc_id;
  out.kind = BackendKind::cuda;
  out.alloc_kind = std::string(alloc_kind::cuda_vmm_fd);
  out.device = device;
  out.device_uuid = device_uuid(device);
  out.base = reinterpret_cast<void*>(base);
  out.size = size;
  out.handle = vmm_handle(session, alloc_id);
  out.served = std::make_shared<ServedFd>(FdService::acquire(), std::move(fd), vmm_key(out.handle), "borrowed");
  out.fd_source = out.served->source_text();
  return out;
}

// The Allocation of `bytes` at `p` on `device`: legacy IPC for cudaMalloc
// memory, else a cuMem fd.
inline Allocation borrow_cuda(const void* p, std::uint64_t bytes, int device, std::uint64_t alloc_id,
                              const std::string& session) {
  const std::string what = "device memory at " + std::to_string(reinterpret_cast<std::uintptr_t>(p)) +
                           " on device " + std::to_string(device);
  DeviceGuard g(device);
  auto [base, size] = allocation_range(p, what);
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  cudaIpcMemHandle_t h{};
  if (cudaError_t e = cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base)); e != cudaSuccess) {
    cudaGetLastError();  // not cudaMalloc memory: cuMem's own checks say what is wrong
    return borrow_cuda_vmm(p, bytes, device, alloc_id, session, what, cudaGetErrorName(e));
  }
  if (bytes > base + size - a)
    throw NotShareable(what + ": its " + std::to_string(bytes) + " bytes run past the end of its allocation (" +
                       std::to_string(base + size - a) + " bytes left)");
  Allocation out;
  out.alloc_id = alloc_id;
  out.kind = BackendKind::cuda;
  out.alloc_kind = std::string(alloc_kind::cuda_ipc);
  out.device = device;
  out.device_uuid = device_uuid(device);
  out.base = reinterpret_cast<void*>(base);
  out.size = size;
  out.handle.assign(reinterpret_cast<const char*>(&h), sizeof h);
  return out;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

#endif  // MEMCUDA_HAS_CUDA()
