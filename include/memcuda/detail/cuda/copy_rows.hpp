// The one copy of a view (detail::Rows, detail/base/view.hpp): rows of `width`
// bytes at a pitch on either side. Host memory: a memcpy per row; anything
// CUDA touches: one cudaMemcpy2DAsync (cudaMemcpyDefault: any direction).
#pragma once

#include "memcuda/config.hpp"

#include <cstring>

#include "memcuda/error.hpp"
#include "memcuda/detail/base/view.hpp"
#include "memcuda/stream.hpp"
#if MEMCUDA_HAS_CUDA()
#include "memcuda/detail/cuda/runtime.hpp"
#endif

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// Copies r.height rows of r.width bytes from `src` (rows `spitch` apart) to
// `dst` (rows `dpitch` apart). host: both are host memory. Otherwise ordered
// on `stream` (null: the legacy default stream) of `device`, and waited for
// when `wait`.
inline void copy_rows(void* dst, std::uint64_t dpitch, const void* src, std::uint64_t spitch, const Rows& r, bool host,
                      int device, StreamHandle stream, bool wait) {
  if (r.width == 0 || r.height == 0) return;
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  if (host) {
    for (std::uint64_t i = 0; i < r.height; ++i) std::memcpy(d + i * dpitch, s + i * spitch, r.width);
    return;
  }
#if MEMCUDA_HAS_CUDA()
  DeviceGuard g(device);
  cudaStream_t st = stream ? stream : cudaStreamLegacy;
  // cudaMemcpy2D takes pitches below cudaDevAttrMaxPitch (2^31 - 1): wider rows go one call each.
  constexpr std::uint64_t kMaxPitch = (std::uint64_t{1} << 31) - 1;
  if (r.height == 1 || dpitch > kMaxPitch || spitch > kMaxPitch) {
    for (std::uint64_t i = 0; i < r.height; ++i)
      MEMCUDA_CUDA_TRY(cudaMemcpyAsync(d + i * dpitch, s + i * spitch, r.width, cudaMemcpyDefault, st));
  } else {
    MEMCUDA_CUDA_TRY(cudaMemcpy2DAsync(d, dpitch, s, spitch, r.width, r.height, cudaMemcpyDefault, st));
  }
  // From pageable memory the call may return before the DMA has landed.
  if (wait) MEMCUDA_CUDA_TRY(cudaStreamSynchronize(st));
#else
  (void)device, (void)stream, (void)wait;
  throw Unavailable("cuda backend not built");
#endif
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
