// GPU presence for tests: [gpu] cases call MEMCUDA_REQUIRE_GPU() first, which
// ends the case with a visible warning where no CUDA device is usable.
#pragma once

#include <string>

#include "memcuda/config.hpp"
#if MEMCUDA_HAS_CUDA()
#include <cuda_runtime_api.h>
#endif

namespace memcuda::test {

inline bool gpu_available(std::string* why = nullptr) {
#if MEMCUDA_HAS_CUDA()
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    cudaGetLastError();
    return false;
  }
  if (n == 0) {
    if (why) *why = "no CUDA device";
    return false;
  }
  return true;
#else
  if (why) *why = "built without the CUDA toolkit (MEMCUDA_CUDA=OFF or not found)";
  return false;
#endif
}

inline int gpu_count() {
#if MEMCUDA_HAS_CUDA()
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) { cudaGetLastError(); return 0; }
  return n;
#else
  return 0;
#endif
}

}  // namespace memcuda::test

#define MEMCUDA_REQUIRE_GPU()                                      \
  do {                                                             \
    std::string memcuda_why_;                                      \
    if (!::memcuda::test::gpu_available(&memcuda_why_)) {          \
      WARN("SKIPPED (no GPU): " << memcuda_why_);                  \
      return;                                                      \
    }                                                              \
  } while (0)

#define MEMCUDA_REQUIRE_GPUS(n)                                    \
  do {                                                             \
    MEMCUDA_REQUIRE_GPU();                                         \
    if (::memcuda::test::gpu_count() < (n)) {                      \
      WARN("SKIPPED: needs " << (n) << " GPUs, have "              \
           << ::memcuda::test::gpu_count());                       \
      return;                                                      \
    }                                                              \
  } while (0)
