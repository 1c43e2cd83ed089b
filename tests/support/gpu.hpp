// GPU presence for tests: [gpu] cases call MEMCUDA_REQUIRE_GPU() (or
// MEMCUDA_REQUIRE_GPUS(n)) first, which ends the case as skipped, with the
// reason, where the GPUs it needs are not usable (support/skip.hpp: CTest
// then reports it as skipped, not passed).
#pragma once

#include <string>

#include "support/skip.hpp"

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
    if (!::memcuda::test::gpu_available(&memcuda_why_))            \
      MEMCUDA_SKIP("needs a CUDA device: " << memcuda_why_);       \
  } while (0)

// Tag such cases [multi-gpu] too: they run as their own CTest entry.
#define MEMCUDA_REQUIRE_GPUS(n)                                            \
  do {                                                                     \
    MEMCUDA_REQUIRE_GPU();                                                 \
    if (::memcuda::test::gpu_count() < (n))                                \
      MEMCUDA_SKIP("needs " << (n) << " GPUs, this host has "              \
                   << ::memcuda::test::gpu_count());                       \
  } while (0)
