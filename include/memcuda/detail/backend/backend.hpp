// The storage backend interface. A backend allocates memory that other
// processes of this machine can map (export) and maps what others exported
// (import). The allocator of record is the only exporter; everyone imports.
#pragma once

#include "memcuda/config.hpp"

#include <cstdint>
#include <memory>
#include <string>

#include "memcuda/memory_resource.hpp"
#include "memcuda/tensor_info.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// An exported allocation, owned by the allocator of record's process.
struct Allocation {
  std::uint64_t alloc_id = 0;
  BackendKind kind = BackendKind::host;
  int device = -1;          // CUDA ordinal in the exporter; -1 for host
  std::string device_uuid;  // "" for host
  void* base = nullptr;     // the exporter's own pointer (it may not open its handle)
  std::uint64_t size = 0;   // bytes of the exported allocation
  std::string handle;       // what an importer needs: 64-byte IPC handle, shm name
  DeviceMemoryResource* upstream = nullptr;  // cuda: where the memory came from
};

// An allocation exported by another process, mapped into this one. Unmapped
// by the destructor. Shared by every tensor of this process that lives in it.
class Mapping {
 public:
  virtual ~Mapping() = default;
  void* base() const noexcept { return base_; }
  std::uint64_t size() const noexcept { return size_; }
  int device() const noexcept { return device_; }  // local ordinal, -1 for host

 protected:
  void* base_ = nullptr;
  std::uint64_t size_ = 0;
  int device_ = -1;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const noexcept = 0;

  // Allocates at least `bytes` (>= 1) on `device` and exports it. `tag`
  // makes exported names unique (the owner's session id). `upstream`
  // (cuda only) supplies the memory; null means cudaMalloc.
  virtual Allocation allocate(std::uint64_t bytes, int device, std::uint64_t alloc_id, const std::string& tag,
                              DeviceMemoryResource* upstream = nullptr) = 0;
  // Frees an allocation of this process. Importers that mapped it keep
  // their mapping; nobody can map it afterwards.
  virtual void deallocate(const Allocation& a) noexcept = 0;
  // Maps an allocation exported by another process of this node.
  virtual std::unique_ptr<Mapping> open(const TensorInfo& t) = 0;
  // Frees what a dead exporter left behind, where the backend can (a shm
  // object outlives its creator; CUDA memory does not).
  virtual void reclaim_orphan(const TensorInfo&) noexcept {}
  // Copies n bytes between two mappings of this backend and returns when
  // the copy is complete (migration of a dead allocator's tensors).
  // `device` is the local ordinal of the destination, -1 for host.
  virtual void copy(void* dst, const void* src, std::uint64_t n, int device) = 0;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
