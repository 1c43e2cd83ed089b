// CUDA backend: device memory exported with cudaIpcGetMemHandle and mapped
// elsewhere with cudaIpcOpenMemHandle. Facts it relies on (measured on our
// hosts): the exporter may not open its own handle, an interior pointer's
// handle is the base's (so offsets are published beside it), and a handle
// cannot be opened once its exporter exited.
#pragma once

#include "memcuda/config.hpp"
#if MEMCUDA_HAS_CUDA()

#include <cstring>
#include <string>

#include "memcuda/detail/backend/backend.hpp"
#include "memcuda/detail/base/log.hpp"
#include "memcuda/detail/cuda/runtime.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class CudaMapping final : public Mapping {
 public:
  CudaMapping(void* p, std::uint64_t n, int device) {
    base_ = p;
    size_ = n;
    device_ = device;
  }
  // May run during static destruction (mappings kept idle by ProcessCache),
  // after the runtime unloaded: MEMCUDA_CUDA_LOG stays quiet then.
  ~CudaMapping() override {
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) cudaGetLastError();
    if (prev != device_) MEMCUDA_CUDA_LOG(cudaSetDevice(device_));
    MEMCUDA_CUDA_LOG(cudaIpcCloseMemHandle(base_));
    if (prev >= 0 && prev != device_) MEMCUDA_CUDA_LOG(cudaSetDevice(prev));
  }
};

// The default upstream: one cudaMalloc per slab (exportable by IPC).
class CudaMallocResource final : public DeviceMemoryResource {
 private:
  void* do_allocate(std::size_t bytes, int device) override {
    DeviceGuard g(device);
    void* p = nullptr;
    cudaError_t st = cudaMalloc(&p, bytes);
    if (st == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      std::size_t free = 0, total = 0;
      cudaMemGetInfo(&free, &total);
      throw BudgetExceeded("cudaMalloc of " + std::to_string(bytes) + " bytes on device " + std::to_string(device) +
                           " failed: out of device memory (" + std::to_string(free) + " of " +
                           std::to_string(total) + " bytes free)");
    }
    if (st != cudaSuccess) throw_cuda(st, "cudaMalloc");
    return p;
  }
  void do_deallocate(void* p, std::size_t, int device) noexcept override {
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) cudaGetLastError();
    if (prev != device) MEMCUDA_CUDA_LOG(cudaSetDevice(device));
    MEMCUDA_CUDA_LOG(cudaFree(p));
    if (prev >= 0 && prev != device) MEMCUDA_CUDA_LOG(cudaSetDevice(prev));
  }
};

class CudaBackend final : public Backend {
 public:
  BackendKind kind() const noexcept override { return BackendKind::cuda; }
  // Legacy IPC memory dies with its exporter: can_adopt() stays false, and
  // a dead exporter's tensors are saved by copy (migration.hpp).
  std::string_view alloc_kind() const noexcept override { return alloc_kind::cuda_ipc; }

  Allocation allocate(std::uint64_t bytes, int device, std::uint64_t alloc_id, const std::string& /*tag*/,
                      DeviceMemoryResource* upstream = nullptr) override {
    Allocation a;
    a.alloc_id = alloc_id;
    a.kind = BackendKind::cuda;
    a.alloc_kind = std::string(alloc_kind::cuda_ipc);
    a.device = device;
    a.device_uuid = device_uuid(device);
    a.size = bytes == 0 ? 1 : bytes;
    a.upstream = upstream ? upstream : &default_;
    void* p = a.upstream->allocate(a.size, device);
    cudaIpcMemHandle_t h{};
    if (cudaError_t e = cudaIpcGetMemHandle(&h, p); e != cudaSuccess) {
      a.upstream->deallocate(p, a.size, device);
      throw_cuda(e, "cudaIpcGetMemHandle (is the upstream resource's memory plain cudaMalloc memory?)");
    }
    a.base = p;
    a.handle.assign(reinterpret_cast<const char*>(&h), sizeof h);
    return a;
  }

  void deallocate(const Allocation& a) noexcept override { a.upstream->deallocate(a.base, a.size, a.device); }

  // Synchronous, on a stream of its own (cuda.hpp).
  void copy(void* dst, const void* src, std::uint64_t n, int device) override {
    copy_synchronously(dst, src, n, device);
  }

  std::unique_ptr<Mapping> open(const TensorInfo& t) override {
    expect_alloc_kind(t, alloc_kind::cuda_ipc);
    if (t.ipc_handle.size() != sizeof(cudaIpcMemHandle_t))
      throw InternalError("tensor '" + t.name + "': IPC handle of " + std::to_string(t.ipc_handle.size()) +
                          " bytes, expected " + std::to_string(sizeof(cudaIpcMemHandle_t)));
    const int device = ordinal_of_uuid(t.device_uuid, t.device);  // Unavailable when this process cannot see it
    cudaIpcMemHandle_t h{};
    std::memcpy(&h, t.ipc_handle.data(), sizeof h);
    // Opened in the caller's current device context: when that is not the
    // tensor's device, the driver enables peer access to it (lazily), so
    // kernels on the current device can read it. A current device that
    // cannot reach the tensor's as a peer would get a mapping that faults
    // (or none): open in the tensor's own context then, so that data() is
    // valid on device() as SharedTensor promises; check_device() tells the
    // reader its own device cannot use it.
    int current = 0;
    MEMCUDA_CUDA_TRY(cudaGetDevice(&current));
    if (current != device) {
      int can = 0;
      if (cudaDeviceCanAccessPeer(&can, current, device) != cudaSuccess) cudaGetLastError();
      if (!can) current = device;
    }
    DeviceGuard in_context(current);
    void* p = nullptr;
    cudaError_t st = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
    if (st == cudaErrorInvalidResourceHandle || st == cudaErrorMapBufferObjectFailed) {
      cudaGetLastError();
      throw Lost("tensor '" + t.name + "': its IPC handle can no longer be opened (" +
                 cudaGetErrorName(st) + "): the allocator of record that exported it (pid " +
                 std::to_string(t.owner_pid) + ") has exited");
    }
    if (st != cudaSuccess) throw_cuda(st, "cudaIpcOpenMemHandle");
    return std::make_unique<CudaMapping>(p, t.alloc_bytes, current);
  }

 private:
  CudaMallocResource default_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
#endif  // MEMCUDA_HAS_CUDA()
