// The storage backend interface. A backend allocates memory that other
// processes of this machine can map (export) and maps what others exported
// (import). The allocator of record is the only exporter; everyone imports.
#pragma once

#include "memcuda/config.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <string_view>

#include "memcuda/detail/fd/fd_service.hpp"
#include "memcuda/error.hpp"
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
  std::string handle;       // what an importer needs: 64-byte IPC handle, or the key of an fd-shared kind
  std::string alloc_kind;   // the records' "alloc_kind" (namespace alloc_kind below)
  DeviceMemoryResource* upstream = nullptr;  // cuda: where the memory came from
  // Set for an allocation adopted from a dead exporter (Backend::adopt):
  // false until a record was republished pointing at it (migration.hpp).
  std::shared_ptr<std::atomic<bool>> adopted_committed;
  bool adopted() const noexcept { return adopted_committed != nullptr; }
  // Set (true) when a stopping allocator of record hands its allocations to
  // a standby (Allocator::retain_for_handover): a host_memfd deallocate()
  // then only unmaps, and its fd is served on until this process exits, so
  // readers still fetch it while the records name this process (a live
  // pid keeps its records from adoption); the standby adopts it once the
  // process is gone, from the fd it holds. Null for other kinds.
  std::shared_ptr<std::atomic<bool>> retained;
  bool is_retained() const noexcept { return retained && retained->load(); }
  // cuda_vmm_fd, host_memfd: the exported fd as this process serves it
  // (FdService), and its text form for the records' "fd_source". Empty for
  // other kinds.
  std::shared_ptr<ServedFd> served;
  std::string fd_source;
  // Borrowed memory (borrow.hpp): what keeps the owner's buffer alive,
  // dropped with the allocation (after deallocate() stopped serving it).
  std::shared_ptr<void> keep_alive;
};

// Which kind of allocation a record points at ("alloc_kind" in the tensor
// Hash, docs/protocol.md). A reader opens every kind it knows, whatever it
// allocates with (select.hpp, backend_for(const TensorInfo&)).
namespace alloc_kind {
inline constexpr std::string_view host_memfd = "host_memfd";  // memfd, POSIX fd from the owner (fd_source)
inline constexpr std::string_view cuda_ipc = "cuda_ipc";    // legacy cudaIpcGetMemHandle handle
inline constexpr std::string_view cuda_vmm_fd = "cuda_vmm_fd";  // cuMem, POSIX fd from the owner (fd_source)
}  // namespace alloc_kind

// The kind `t` names: its alloc_kind, or for a record written before the
// field without it, its backend's first kind (host_memfd, cuda_ipc).
inline std::string_view record_kind(const TensorInfo& t) noexcept {
  if (!t.alloc_kind.empty()) return t.alloc_kind;
  return t.backend == BackendKind::host ? alloc_kind::host_memfd : alloc_kind::cuda_ipc;
}

// The memory a record points at belongs to another user: the object is
// owned by another uid, or the system refused this process (EACCES, EPERM).
// A process of that user can serve it, so migration leaves such tensors
// for a leader that can instead of marking them lost. On the wire it is
// plain Unavailable.
class AccessDenied final : public Unavailable {
 public:
  using Unavailable::Unavailable;
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

// Throws Unavailable when `t` is of an allocation kind other than `mine`:
// opens are dispatched by kind (select.hpp), so only a caller that picked
// a backend itself (a test, a takeover's pool) gets here with another.
inline void expect_alloc_kind(const TensorInfo& t, std::string_view mine) {
  const std::string_view kind = record_kind(t);
  if (kind == mine) return;
  throw Unavailable("tensor '" + t.name + "' is a " + std::string(kind) + " allocation; the " + std::string(mine) +
                    " backend opens only " + std::string(mine) + " allocations");
}

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const noexcept = 0;
  // The alloc_kind this backend writes into the records of what it allocates.
  virtual std::string_view alloc_kind() const noexcept = 0;

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

  // ---- adoption: a dead exporter's memory taken over in place ----
  // Whether this process can take ownership of the allocation holding `t`,
  // whose exporter died, without copying it: true where the memory outlives
  // its exporter (a memfd or a cuMem allocation whose fd this process
  // holds). Legacy CUDA IPC answers false: its memory dies with the
  // exporter and only a copy through a live mapping saves it (migration.hpp).
  virtual bool can_adopt(const TensorInfo&) const noexcept { return false; }
  // Maps the allocation holding `t` and returns it as one this process now
  // owns (deallocate() frees it: see Allocation), under the new `alloc_id`;
  // `handle` is what importers open from then on (the same key: fd-shared
  // memory keeps its name). Throws Lost when it is gone, AccessDenied when it belongs to
  // another user, Unavailable or ProtocolError when it cannot be adopted.
  virtual Allocation adopt(const TensorInfo& t, std::uint64_t /*alloc_id*/, const std::string& /*tag*/) {
    throw Unavailable("tensor '" + t.name + "': its memory cannot be adopted by this backend");
  }
  // Copies n bytes between two mappings of this backend and returns when
  // the copy is complete (migration of a dead allocator's tensors).
  // `device` is the local ordinal of the destination, -1 for host.
  virtual void copy(void* dst, const void* src, std::uint64_t n, int device) = 0;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
