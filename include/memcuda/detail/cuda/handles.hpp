// Owning handles for CUDA streams, events and pinned host memory: each is
// made on a given device and destroyed (logging, never throwing) with its
// owner, so that an exception half-way through building a set of them
// leaks nothing. Callers guard with MEMCUDA_HAS_CUDA().
#pragma once

#include "memcuda/config.hpp"

#if MEMCUDA_HAS_CUDA()
#include <cstddef>
#include <utility>

#include "memcuda/detail/cuda/runtime.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// A non-blocking stream of one device.
class UniqueStream {
 public:
  UniqueStream() = default;
  explicit UniqueStream(int device) : device_(device) {
    DeviceGuard g(device);
    MEMCUDA_CUDA_TRY(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
  }
  UniqueStream(UniqueStream&& o) noexcept : s_(std::exchange(o.s_, nullptr)), device_(o.device_) {}
  UniqueStream& operator=(UniqueStream&& o) noexcept {
    std::swap(s_, o.s_);
    std::swap(device_, o.device_);
    return *this;
  }
  ~UniqueStream() {
    if (s_) MEMCUDA_CUDA_LOG(cudaStreamDestroy(s_));  // a stream knows its device
  }
  cudaStream_t get() const noexcept { return s_; }
  int device() const noexcept { return device_; }

 private:
  cudaStream_t s_ = nullptr;
  int device_ = -1;
};

// An event of one device, without timing (cheaper to record and wait on).
class UniqueEvent {
 public:
  UniqueEvent() = default;
  explicit UniqueEvent(int device) : device_(device) {
    DeviceGuard g(device);
    MEMCUDA_CUDA_TRY(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming));
  }
  UniqueEvent(UniqueEvent&& o) noexcept : e_(std::exchange(o.e_, nullptr)), device_(o.device_) {}
  UniqueEvent& operator=(UniqueEvent&& o) noexcept {
    std::swap(e_, o.e_);
    std::swap(device_, o.device_);
    return *this;
  }
  ~UniqueEvent() {
    if (e_) MEMCUDA_CUDA_LOG(cudaEventDestroy(e_));  // released once the last record completes
  }
  cudaEvent_t get() const noexcept { return e_; }
  int device() const noexcept { return device_; }

 private:
  cudaEvent_t e_ = nullptr;
  int device_ = -1;
};

// Page-locked host memory, usable by every device's copy engines.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t bytes) : bytes_(bytes) {
    MEMCUDA_CUDA_TRY(cudaHostAlloc(&p_, bytes, cudaHostAllocPortable));
  }
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  // The owner makes sure no copy still uses it (cudaFreeHost does not wait for one).
  ~PinnedBuffer() {
    if (p_) MEMCUDA_CUDA_LOG(cudaFreeHost(p_));
  }
  unsigned char* get() const noexcept { return static_cast<unsigned char*>(p_); }
  std::size_t bytes() const noexcept { return bytes_; }
  explicit operator bool() const noexcept { return p_ != nullptr; }

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
#endif  // MEMCUDA_HAS_CUDA()
