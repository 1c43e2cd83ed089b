// CUDA backend on cuMem (virtual memory management), alloc_kind
// "cuda_vmm_fd": allocate is cuMemCreate, exported ONCE as an fd
// (660-685 us measured, so never per open), mapped here and served by this
// process's FdService; open fetches the fd (record_fd.hpp), imports, closes
// and maps it. docs/design.md, "Allocation kinds", has the table.
//
// Facts it relies on (measured on H200 hosts): the
// memory lives while any process holds the fd or a mapping, even after its
// creator's SIGKILL; an imported handle cannot be exported again (so an
// adopter serves the fd it holds, never a re-export).
#pragma once

#include "memcuda/config.hpp"
#if MEMCUDA_HAS_CUDA()

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "memcuda/detail/backend/backend.hpp"
#include "memcuda/detail/backend/record_fd.hpp"
#include "memcuda/detail/base/log.hpp"
#include "memcuda/detail/cuda/driver.hpp"
#include "memcuda/detail/cuda/runtime.hpp"
#include "memcuda/detail/fd/fd_client.hpp"
#include "memcuda/detail/fd/fd_table.hpp"
#include "memcuda/detail/process/process.hpp"
#include "memcuda/detail/fd/fd_service.hpp"
#include "memcuda/detail/fd/fd_source.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

namespace vmm {

inline CUmemAllocationProp prop_for(int device) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

// The allocation granularity of `device` (cached per ordinal).
inline std::uint64_t granularity(int device) {
  // Process-wide: a property of the device, asked of the driver once.
  static std::mutex mu;
  static std::vector<std::uint64_t> cache;
  {
    std::lock_guard lk(mu);
    if (device >= 0 && static_cast<std::size_t>(device) < cache.size() && cache[device]) return cache[device];
  }
  const auto& d = cu_driver_or_throw();
  CUmemAllocationProp p = prop_for(device);
  std::size_t g = 0;
  if (CUresult r = d.MemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM); r != CUDA_SUCCESS)
    throw_cu(r, "cuMemGetAllocationGranularity", "device " + std::to_string(device));
  if (g == 0) g = std::size_t{2} << 20;
  std::lock_guard lk(mu);
  if (cache.size() <= static_cast<std::size_t>(device)) cache.resize(device + 1, 0);
  cache[device] = g;
  return g;
}

inline std::uint64_t round_up(std::uint64_t n, std::uint64_t g) {
  if (n == 0) n = 1;
  if (n > ~std::uint64_t{0} - g) throw InvalidArgument("allocation size overflows");
  return (n + g - 1) / g * g;
}

// Unmaps and frees a range reserved by map(). Noexcept (cleanup).
inline void unmap(CUdeviceptr p, std::uint64_t n, int device) noexcept {
  if (!p) return;
  const auto& d = cu_driver();
  if (!d.ok()) return;
  DeviceGuard g(device, std::nothrow);
  log_cu(d.MemUnmap(p, n), "cuMemUnmap");
  log_cu(d.MemAddressFree(p, n), "cuMemAddressFree");
}

// Maps `h` (n bytes, on `device`) at a fresh address, read-write for the
// device and for `current` (the caller's current device, when it is another
// that can access `device` as a peer: a process on GPU 0 reading a tensor of
// GPU 1). Other peers get access when they ask (grant_access, from
// check_device): granting one costs milliseconds for a large mapping, the
// whole of a fresh open. The handle stays the caller's: the mapping holds
// its own reference to the memory.
inline CUdeviceptr map(CUmemGenericAllocationHandle h, std::uint64_t n, int device, int current,
                       const std::string& what) {
  const auto& d = cu_driver_or_throw();
  CUdeviceptr p = 0;
  if (CUresult r = d.MemAddressReserve(&p, n, granularity(device), 0, 0); r != CUDA_SUCCESS)
    throw_cu(r, "cuMemAddressReserve", what);
  if (CUresult r = d.MemMap(p, n, 0, h, 0); r != CUDA_SUCCESS) {
    log_cu(d.MemAddressFree(p, n), "cuMemAddressFree");
    if (r == CUDA_ERROR_INVALID_VALUE)
      throw Unavailable(what + ": cuMemMap of " + std::to_string(n) + " bytes failed (" + cu_error_text(r) +
                        "): the allocation is smaller than its record says (a stale or corrupt record)");
    throw_cu(r, "cuMemMap", what);
  }
  CUmemAccessDesc own{};
  own.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  own.location.id = device;
  own.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (CUresult r = d.MemSetAccess(p, n, &own, 1); r != CUDA_SUCCESS) {
    log_cu(d.MemUnmap(p, n), "cuMemUnmap");
    log_cu(d.MemAddressFree(p, n), "cuMemAddressFree");
    throw_cu(r, "cuMemSetAccess", what);
  }
  // The current device as a peer: one that refuses costs nothing but its
  // own access (check_device then says why).
  int can = 0;
  if (current != device && current >= 0 && d.DeviceCanAccessPeer(&can, current, device) == CUDA_SUCCESS && can) {
    CUmemAccessDesc peer = own;
    peer.location.id = current;
    log_cu(d.MemSetAccess(p, n, &peer, 1), "cuMemSetAccess (peer device)");
  }
  return p;
}

// The calling thread's current device (-1 when none can be told).
inline int current_device() noexcept {
  int c = -1;
  if (cudaGetDevice(&c) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return c;
}

// Imports the fd (not taken: the caller closes it) and maps n bytes of it.
inline CUdeviceptr import_and_map(int fd, std::uint64_t n, int device, const std::string& what) {
  const auto& d = cu_driver_or_throw();
  const int current = current_device();
  DeviceGuard g(device, std::nothrow);
  MEMCUDA_CUDA_TRY(cudaFree(nullptr));  // the device's primary context, current on this thread
  CUmemGenericAllocationHandle h{};
  void* os_handle = reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd));
  if (CUresult r = d.MemImportFromShareableHandle(&h, os_handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      r != CUDA_SUCCESS)
    throw_cu(r, "cuMemImportFromShareableHandle", what);
  CUdeviceptr p = 0;
  try {
    p = map(h, n, device, current, what);
  } catch (...) {
    log_cu(d.MemRelease(h), "cuMemRelease");
    throw;
  }
  log_cu(d.MemRelease(h), "cuMemRelease");  // the mapping keeps the memory
  return p;
}

}  // namespace vmm

class VmmMapping final : public Mapping {
 public:
  VmmMapping(CUdeviceptr p, std::uint64_t n, int device) {
    base_ = reinterpret_cast<void*>(p);
    size_ = n;
    device_ = device;
  }
  ~VmmMapping() override { vmm::unmap(reinterpret_cast<CUdeviceptr>(base_), size_, device_); }
};

class CudaVmmBackend final : public Backend {
 public:
  BackendKind kind() const noexcept override { return BackendKind::cuda; }
  std::string_view alloc_kind() const noexcept override { return alloc_kind::cuda_vmm_fd; }

  Allocation allocate(std::uint64_t bytes, int device, std::uint64_t alloc_id, const std::string& tag,
                      DeviceMemoryResource* upstream = nullptr) override {
    if (upstream)
      throw InvalidArgument("cuda_vmm_fd allocations are made with cuMemCreate and cannot come from a user "
                            "upstream resource (PoolOptions::upstream); use cuda_allocation = ipc for that");
    const auto& d = cu_driver_or_throw();
    Allocation a;
    a.alloc_id = alloc_id;
    a.kind = BackendKind::cuda;
    a.alloc_kind = std::string(alloc_kind::cuda_vmm_fd);
    a.device = device;
    a.device_uuid = device_uuid(device);
    a.handle = vmm_handle(tag, alloc_id);
    const std::string what = "cuMem allocation " + vmm_key(a.handle) + " on device " + std::to_string(device);
    const int current = vmm::current_device();
    DeviceGuard g(device);
    MEMCUDA_CUDA_TRY(cudaFree(nullptr));
    a.size = vmm::round_up(bytes, vmm::granularity(device));
    CUmemAllocationProp prop = vmm::prop_for(device);
    CUmemGenericAllocationHandle h{};
    if (CUresult r = d.MemCreate(&h, a.size, &prop, 0); r != CUDA_SUCCESS) {
      if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        std::size_t free = 0, total = 0;
        if (cudaMemGetInfo(&free, &total) != cudaSuccess) cudaGetLastError();
        throw BudgetExceeded("cuMemCreate of " + std::to_string(a.size) + " bytes on device " +
                             std::to_string(device) + " failed: out of device memory (" + std::to_string(free) +
                             " of " + std::to_string(total) + " bytes free)");
      }
      throw_cu(r, "cuMemCreate", what);
    }
    struct Release {
      const CuDriver& d;
      CUmemGenericAllocationHandle h;
      ~Release() { log_cu(d.MemRelease(h), "cuMemRelease"); }  // mapping and fd keep the memory
    } release{d, h};
    int raw = -1;
    if (CUresult r = d.MemExportToShareableHandle(&raw, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        r != CUDA_SUCCESS)
      throw_cu(r, "cuMemExportToShareableHandle", what);
    UniqueFd fd = UniqueFd::adopt_cloexec(raw);
    CUdeviceptr p = vmm::map(h, a.size, device, current, what);
    try {
      a.served = std::make_shared<ServedFd>(FdService::acquire(), std::move(fd), vmm_key(a.handle), tag);
      a.fd_source = a.served->source_text();
    } catch (...) {
      vmm::unmap(p, a.size, device);
      throw;
    }
    a.base = reinterpret_cast<void*>(p);
    return a;
  }

  // Unmaps and stops serving the fd. The memory goes when no process holds
  // an fd (standbys drop theirs once the allocations Hash forgets it) or a
  // mapping of it. An adopted allocation not yet committed is the same:
  // standbys' fds keep it for a successor.
  void deallocate(const Allocation& a) noexcept override {
    vmm::unmap(reinterpret_cast<CUdeviceptr>(a.base), a.size, a.device);
    if (a.served) a.served->withdraw();
  }

  std::unique_ptr<Mapping> open(const TensorInfo& t) override {
    expect_alloc_kind(t, alloc_kind::cuda_vmm_fd);
    const int device = ordinal_of_uuid(t.device_uuid, t.device);
    const std::string key = vmm_key(t.ipc_handle);
    const std::string what = "tensor '" + t.name + "' (" + key + ")";
    UniqueFd fd = record_fd(t, key, what);  // a standby's held fd, else fetched from fd_source
    CUdeviceptr p = vmm::import_and_map(fd.get(), t.alloc_bytes, device, what);
    return std::make_unique<VmmMapping>(p, t.alloc_bytes, device);
  }

  // A dead owner's allocation outlives it while some process holds its fd:
  // this one can adopt it when one of its standbys holds it.
  bool can_adopt(const TensorInfo& t) const noexcept override {
    if (t.backend != BackendKind::cuda || t.alloc_kind != alloc_kind::cuda_vmm_fd) return false;
    try {
      return Process::get().fds().held(vmm_key(t.ipc_handle));
    } catch (...) {
      return false;
    }
  }

  // Imports and maps the held fd and serves a copy of it from this process
  // (an imported handle cannot be exported again: the fd itself is passed
  // on). The served entry is published by the session that commits it
  // (ServedFd::retag, migration.hpp).
  Allocation adopt(const TensorInfo& t, std::uint64_t alloc_id, const std::string& /*tag*/) override {
    expect_alloc_kind(t, alloc_kind::cuda_vmm_fd);
    const std::string key = vmm_key(t.ipc_handle);
    const std::string what = "adopting " + key + " of tensor '" + t.name + "'";
    UniqueFd fd = Process::get().fds().dup(key);
    if (!fd)
      throw Lost(what + ": this process holds no fd of it (no standby fetched it before its allocator of record "
                        "died)");
    Allocation a;
    a.alloc_id = alloc_id;
    a.kind = BackendKind::cuda;
    a.alloc_kind = std::string(alloc_kind::cuda_vmm_fd);
    a.device = ordinal_of_uuid(t.device_uuid, t.device);
    a.device_uuid = t.device_uuid;
    a.handle = t.ipc_handle;
    a.size = t.alloc_bytes;
    CUdeviceptr p = vmm::import_and_map(fd.get(), a.size, a.device, what);
    try {
      a.served = std::make_shared<ServedFd>(FdService::acquire(), std::move(fd), key, std::string());
      a.fd_source = a.served->source_text();
    } catch (...) {
      vmm::unmap(p, a.size, a.device);
      throw;
    }
    a.base = reinterpret_cast<void*>(p);
    a.adopted_committed = std::make_shared<std::atomic<bool>>(false);
    return a;
  }

  // Synchronous, on a stream of its own (cuda.hpp).
  void copy(void* dst, const void* src, std::uint64_t n, int device) override {
    copy_synchronously(dst, src, n, device);
  }
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
#endif  // MEMCUDA_HAS_CUDA()
