// The data copies of publish_state_dict: memcpy into host tensors;
// cudaMemcpyAsync into device tensors, all on one stream, with one
// synchronisation at the end instead of one per tensor. A reader fills
// device tensors through a pinned staging buffer in two halves
// (docs/design.md, "The code, by role", the state dict).
#pragma once

#include "memcuda/config.hpp"

#include <algorithm>
#include <cstring>
#include <functional>

#include "memcuda/detail/cuda/runtime.hpp"
#include "memcuda/error.hpp"
#include "memcuda/stream.hpp"
#include "memcuda/tensor_info.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

using ReadPiece = std::function<void(std::uint64_t offset, void* dst, std::size_t bytes)>;

// Where a copy goes: what the copier needs of a tensor, taken from any
// tensor type (a SharedTensor) so that this layer does not depend on it.
struct CopyTarget {
  template <class Tensor>
  CopyTarget(const Tensor& t)  // NOLINT(google-explicit-constructor): call sites pass the tensor
      : data(t.data()), bytes(t.bytes()), backend(t.backend()), device(t.device()) {
    // Written as one dense run: a strided view's gaps are not its own.
    if (!t.contiguous()) throw InvalidArgument("copy target '" + t.name() + "' is a strided view");
  }
  void* data;
  std::uint64_t bytes;
  BackendKind backend;
  int device;
};

class StateDictCopier {
 public:
  explicit StateDictCopier(StreamHandle stream, std::size_t staging_bytes = std::size_t{64} << 20)
      : stream_(stream), half_(std::max<std::size_t>(staging_bytes / 2, 4096)) {}
  StateDictCopier(const StateDictCopier&) = delete;
  StateDictCopier& operator=(const StateDictCopier&) = delete;
  ~StateDictCopier() {
#if MEMCUDA_HAS_CUDA()
    if (pending_) (void)cudaStreamSynchronize(stream_);  // never free staging a copy still reads
    for (auto& e : done_)
      if (e) (void)cudaEventDestroy(e);
    if (staging_) (void)cudaFreeHost(staging_);
#endif
  }

  // Fills `t` from `read`, piece by piece.
  void copy_from(const CopyTarget& t, const ReadPiece& read) {
    const std::uint64_t n = t.bytes;
    if (t.backend == BackendKind::host) {
      auto* dst = static_cast<unsigned char*>(t.data);
      for (std::uint64_t off = 0; off < n; off += half_)
        read(off, dst + off, static_cast<std::size_t>(std::min<std::uint64_t>(half_, n - off)));
      return;
    }
#if MEMCUDA_HAS_CUDA()
    DeviceGuard g(t.device);
    ensure_staging();
    auto* dst = static_cast<unsigned char*>(t.data);
    for (std::uint64_t off = 0; off < n; off += half_) {
      const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(half_, n - off));
      unsigned char* buf = static_cast<unsigned char*>(staging_) + next_ * half_;
      // The copy that last read this half must be done before it is refilled.
      MEMCUDA_CUDA_TRY(cudaEventSynchronize(done_[next_]));
      read(off, buf, len);
      MEMCUDA_CUDA_TRY(cudaMemcpyAsync(dst + off, buf, len, cudaMemcpyHostToDevice, stream_));
      MEMCUDA_CUDA_TRY(cudaEventRecord(done_[next_], stream_));
      pending_ = true;
      next_ ^= 1;
    }
#else
    (void)read;
    throw Unavailable("cuda backend not built");
#endif
  }

  void copy(const CopyTarget& t, const void* src) {
    const std::uint64_t n = t.bytes;
    if (n == 0) return;
    if (t.backend == BackendKind::host) {
#if MEMCUDA_HAS_CUDA()
      // The source may be device memory: let the driver tell.
      cudaPointerAttributes a{};
      if (cudaPointerGetAttributes(&a, src) == cudaSuccess && a.type == cudaMemoryTypeDevice) {
        MEMCUDA_CUDA_TRY(cudaMemcpy(t.data, src, n, cudaMemcpyDefault));
        return;
      }
      (void)cudaGetLastError();
#endif
      std::memcpy(t.data, src, n);
      return;
    }
#if MEMCUDA_HAS_CUDA()
    DeviceGuard g(t.device);
    MEMCUDA_CUDA_TRY(cudaMemcpyAsync(t.data, src, n, cudaMemcpyDefault, stream_));
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
#if MEMCUDA_HAS_CUDA()
  void ensure_staging() {
    if (staging_) return;
    MEMCUDA_CUDA_TRY(cudaMallocHost(&staging_, 2 * half_));
    for (auto& e : done_) {
      MEMCUDA_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      MEMCUDA_CUDA_TRY(cudaEventRecord(e, stream_));  // "done" before first use
    }
  }
  cudaEvent_t done_[2] = {nullptr, nullptr};
#endif
  StreamHandle stream_;
  std::size_t half_;
  void* staging_ = nullptr;
  int next_ = 0;
  bool pending_ = false;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
