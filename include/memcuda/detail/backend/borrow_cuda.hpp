// Borrowed device memory (TensorRegistry::share of a device pointer): a
// cudaMalloc allocation, whoever made it (a framework's caching allocator
// included), is exported with legacy CUDA IPC as it is. The handle of an
// interior pointer is the allocation's (opening it returns the base), so the
// record names the allocation base (cuMemGetAddressRange) and the tensor's
// offset in it; readers open it with cudaIpcOpenMemHandle whatever kind
// their registry allocates (docs/design.md, "Borrowed tensors"). The handle
// dies with this process: a new open after its exit fails, mappings already
// open keep reading (the driver's rule).
//
// cuMem memory (PyTorch's expandable segments) has no legacy IPC handle:
// NotShareable, saying so.
#pragma once

#include "memcuda/config.hpp"
#if MEMCUDA_HAS_CUDA()

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <string>

#include "memcuda/detail/backend/backend.hpp"
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

// The Allocation of `bytes` at `p` on `device`, exported with legacy IPC.
inline Allocation borrow_cuda(const void* p, std::uint64_t bytes, int device, std::uint64_t alloc_id) {
  const std::string what = "device memory at " + std::to_string(reinterpret_cast<std::uintptr_t>(p)) +
                           " on device " + std::to_string(device);
  DeviceGuard g(device);
  auto [base, size] = allocation_range(p, what);
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (bytes > base + size - a)
    throw NotShareable(what + ": its " + std::to_string(bytes) + " bytes run past the end of its allocation (" +
                       std::to_string(base + size - a) + " bytes left)");
  cudaIpcMemHandle_t h{};
  if (cudaError_t e = cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base)); e != cudaSuccess) {
    cudaGetLastError();
    throw NotShareable(what + ": cudaIpcGetMemHandle failed (" + cudaGetErrorName(e) +
                       "): only cudaMalloc memory has a legacy IPC handle; cuMem memory (PyTorch's expandable "
                       "segments: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False) and managed memory "
                       "cannot be shared without a copy");
  }
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
