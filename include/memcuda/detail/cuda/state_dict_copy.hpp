// The data copies of publish_state_dict: memcpy into host tensors;
// cudaMemcpyAsync (cudaMemcpyDefault: device-to-device or host-to-device,
// whatever the source is) into device tensors, all on one stream, with one
// synchronisation at the end instead of one per tensor.
#pragma once

#include "memcuda/config.hpp"

#include <cstring>

#include "memcuda/detail/cuda/runtime.hpp"
#include "memcuda/error.hpp"
#include "memcuda/shared_tensor.hpp"
#include "memcuda/stream.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class StateDictCopier {
 public:
  explicit StateDictCopier(StreamHandle stream) : stream_(stream) {}

  void copy(const SharedTensor<void>& t, const void* src) {
    const std::uint64_t n = t.bytes();
    if (n == 0) return;
    if (t.backend() == BackendKind::host) {
#if MEMCUDA_HAS_CUDA()
      // The source may be device memory: let the driver tell.
      cudaPointerAttributes a{};
      if (cudaPointerGetAttributes(&a, src) == cudaSuccess && a.type == cudaMemoryTypeDevice) {
        MEMCUDA_CUDA_TRY(cudaMemcpy(t.data(), src, n, cudaMemcpyDefault));
        return;
      }
      (void)cudaGetLastError();
#endif
      std::memcpy(t.data(), src, n);
      return;
    }
#if MEMCUDA_HAS_CUDA()
    DeviceGuard g(t.device());
    MEMCUDA_CUDA_TRY(cudaMemcpyAsync(t.data(), src, n, cudaMemcpyDefault, stream_));
    pending_ = true;
#else
    throw Unavailable("cuda backend not built");
#endif
  }

  // Waits for every copy: the bytes are visible to other processes after it.
  void finish() {
#if MEMCUDA_HAS_CUDA()
    if (!pending_) return;
    MEMCUDA_CUDA_TRY(cudaStreamSynchronize(stream_));
    pending_ = false;
#endif
  }

 private:
  StreamHandle stream_;
  bool pending_ = false;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
