// LocalTensor<T>: a process-local "stack" tensor for intermediates. Never
// registered, never shared; freed as soon as it goes out of scope. On the
// cuda backend the allocation and the free are stream-ordered
// (cudaMallocAsync / cudaFreeAsync on the given stream), so freeing never
// waits for the GPU and the memory is reused by later work on that stream.
#pragma once

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "memcuda/config.hpp"
#include "memcuda/dtype.hpp"
#include "memcuda/error.hpp"
#include "memcuda/shape.hpp"
#include "memcuda/stream.hpp"
#include "memcuda/tensor_info.hpp"
#if MEMCUDA_HAS_CUDA()
#include "memcuda/detail/cuda/runtime.hpp"
#endif

MEMCUDA_NAMESPACE_BEGIN

struct LocalOptions {
  BackendKind backend = BackendKind::cuda;
  int device = 0;               // cuda: ordinal in this process
  StreamHandle stream = nullptr;  // cuda: stream the allocation and free are ordered on
};

// Move-only owner of a contiguous tensor. Stream rule: the memory may be
// used by work on options.stream (or after synchronising with it); the
// destructor enqueues the free on that stream.
template <class T>
class LocalTensor {
  static_assert(TensorElement<T>, "LocalTensor<T>: T needs a memcuda dtype");

 public:
  LocalTensor() noexcept = default;
  LocalTensor(Shape shape, LocalOptions opts = {}) : shape_(std::move(shape)), opts_(opts) {
    bytes_ = byte_size(dtype_of<T>, shape_);
    const std::size_t n = bytes_ == 0 ? 1 : bytes_;
    if (opts_.backend == BackendKind::host) {
      data_ = static_cast<T*>(::operator new(n, std::align_val_t{256}));
      return;
    }
#if MEMCUDA_HAS_CUDA()
    detail::DeviceGuard g(opts_.device);
    void* p = nullptr;
    cudaError_t st = cudaMallocAsync(&p, n, opts_.stream);
    if (st == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw BudgetExceeded("cudaMallocAsync of " + std::to_string(n) + " bytes on device " +
                           std::to_string(opts_.device) + ": out of device memory");
    }
    if (st != cudaSuccess) detail::throw_cuda(st, "cudaMallocAsync");
    data_ = static_cast<T*>(p);
#else
    throw Unavailable("LocalTensor on the cuda backend: mem-cuda was built without CUDA");
#endif
  }
  ~LocalTensor() { reset(); }
  LocalTensor(LocalTensor&& o) noexcept
      : shape_(std::move(o.shape_)), opts_(o.opts_), bytes_(o.bytes_), data_(std::exchange(o.data_, nullptr)) {}
  LocalTensor& operator=(LocalTensor&& o) noexcept {
    if (this != &o) {
      reset();
      shape_ = std::move(o.shape_);
      opts_ = o.opts_;
      bytes_ = o.bytes_;
      data_ = std::exchange(o.data_, nullptr);
    }
    return *this;
  }
  LocalTensor(const LocalTensor&) = delete;
  LocalTensor& operator=(const LocalTensor&) = delete;

  T* data() const noexcept { return data_; }
  const Shape& shape() const noexcept { return shape_; }
  std::uint64_t bytes() const noexcept { return bytes_; }
  std::uint64_t size() const { return element_count(shape_); }
  BackendKind backend() const noexcept { return opts_.backend; }
  int device() const noexcept { return opts_.backend == BackendKind::host ? -1 : opts_.device; }
  StreamHandle stream() const noexcept { return opts_.stream; }

  // Frees now (stream-ordered on cuda).
  void reset() noexcept {
    if (!data_) return;
    if (opts_.backend == BackendKind::host) {
      ::operator delete(data_, std::align_val_t{256});
    } else {
#if MEMCUDA_HAS_CUDA()
      int prev = -1;
      cudaGetDevice(&prev);
      if (prev != opts_.device) cudaSetDevice(opts_.device);
      if (cudaFreeAsync(data_, opts_.stream) != cudaSuccess) cudaGetLastError();
      if (prev >= 0 && prev != opts_.device) cudaSetDevice(prev);
#endif
    }
    data_ = nullptr;
  }

 private:
  Shape shape_;
  LocalOptions opts_;
  std::uint64_t bytes_ = 0;
  T* data_ = nullptr;
};

MEMCUDA_NAMESPACE_END  // namespace memcuda
