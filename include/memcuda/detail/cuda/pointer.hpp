// Which device a pointer points into (cudaPointerGetAttributes), for code
// that must tell a caller's device memory from host memory: borrowed
// buffers (backend/borrow_cuda.hpp) and the Arrow import.
#pragma once

#include "memcuda/config.hpp"
#if MEMCUDA_HAS_CUDA()

#include <cuda_runtime_api.h>

#include <optional>

#include "memcuda/detail/cuda/runtime.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// The ordinal of the device `p` points into, or nullopt for anything else
// (host memory, managed memory, no usable GPU).
inline std::optional<int> device_of_pointer(const void* p) {
  if (device_count() == 0) return std::nullopt;
  cudaPointerAttributes at{};
  if (cudaError_t st = cudaPointerGetAttributes(&at, p); st != cudaSuccess) {
    cudaGetLastError();
    return std::nullopt;
  }
  if (at.type == cudaMemoryTypeDevice) return at.device;
  return std::nullopt;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

#endif  // MEMCUDA_HAS_CUDA()
