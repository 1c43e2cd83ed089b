// The upstream the slab pool takes its slabs from.
//
// Shaped like RMM's device_memory_resource: callers use the public,
// non-virtual allocate()/deallocate(), implementations override the private
// do_allocate()/do_deallocate().
//
// The rule every implementation must keep: memory it returns must be
// exportable with cudaIpcGetMemHandle, because the pool exports each slab once
// and other processes map it with cudaIpcOpenMemHandle. That means plain
// cudaMalloc memory (or a wrapper that ends in cudaMalloc). Memory from
// cudaMallocAsync / stream-ordered pools, cudaMallocManaged, cudaMallocHost or
// cuMemCreate-based VMM allocations is not exportable this way and must not be
// handed out. The pool also relies on each allocation being its own
// cudaMalloc: an IPC handle names a whole allocation, so a resource that
// suballocates (another pool underneath) would export its neighbours too.
//
// `device` is always a CUDA device ordinal as the CUDA runtime numbers it in
// this process (the index cudaSetDevice takes, after CUDA_VISIBLE_DEVICES),
// never a PCI bus id or UUID.
//
// This header makes no CUDA calls; the CUDA resource lives with the CUDA
// backend.
#pragma once

#include "memcuda/config.hpp"

#include <cstddef>

MEMCUDA_NAMESPACE_BEGIN

class DeviceMemoryResource {
 public:
  virtual ~DeviceMemoryResource() = default;

  // Returns `bytes` bytes of device memory on CUDA device `device`, aligned
  // to at least 256 bytes and exportable with cudaIpcGetMemHandle. The
  // resource switches to `device` itself and restores the caller's current
  // device before returning. The memory is usable at once on any stream (no
  // stream ordering is implied). Never returns nullptr: failure throws
  // (CudaError from a CUDA resource, InvalidArgument for a bad device).
  // The caller owns the memory until it passes it back to deallocate() on
  // this same resource.
  void* allocate(std::size_t bytes, int device) { return do_allocate(bytes, device); }

  // Returns memory from allocate() on this resource, with the same `bytes`
  // and `device`. The caller must have finished all work on it (the pool
  // synchronises the device first); IPC mappings of it in other processes
  // dangle afterwards, so the pool only returns a slab no tensor uses.
  // Never throws; implementations log failures.
  void deallocate(void* p, std::size_t bytes, int device) noexcept {
    do_deallocate(p, bytes, device);
  }

 protected:
  // Copying a resource through its base would slice it; derived classes decide
  // whether they are copyable.
  DeviceMemoryResource() = default;
  DeviceMemoryResource(const DeviceMemoryResource&) = default;
  DeviceMemoryResource(DeviceMemoryResource&&) = default;
  DeviceMemoryResource& operator=(const DeviceMemoryResource&) = default;
  DeviceMemoryResource& operator=(DeviceMemoryResource&&) = default;

 private:
  virtual void* do_allocate(std::size_t bytes, int device) = 0;
  virtual void do_deallocate(void* p, std::size_t bytes, int device) noexcept = 0;
};

MEMCUDA_NAMESPACE_END  // namespace memcuda
