// Host backend: CPU memory shared between processes by file descriptor, with
// the CUDA backend's protocol, so the whole control plane runs where there
// is no GPU. alloc_kind "host_memfd" (docs/design.md, "Allocation kinds").
//
// allocate: an unnamed memfd, its pages committed (posix_fallocate: a full
// memory cgroup is a clear error here, not a SIGBUS at a later write),
// sealed against resizing, mapped, and the fd served as a cuMem one. open:
// the fd from record_fd(), its size and seals checked, then mapped; the
// mapping keeps the fd in FdTable, so a process that maps an allocation can
// adopt it as a standby can.
#pragma once

#include "memcuda/config.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <set>
#include <mutex>
#include <string>
#include <vector>

#include "memcuda/detail/backend/backend.hpp"
#include "memcuda/detail/backend/record_fd.hpp"
#include "memcuda/detail/fd/fd_table.hpp"
#include "memcuda/detail/process/process.hpp"
#include "memcuda/detail/fd/fd_limit.hpp"
#include "memcuda/detail/fd/fd_service.hpp"
#include "memcuda/detail/fd/unique_fd.hpp"
#include "memcuda/error.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// The ipc_handle of a host_memfd allocation, and its key in the
// allocations Hash and FdTable: "host:<owner session>:<alloc id>".
inline std::string host_handle(const std::string& session, std::uint64_t alloc_id) {
  return "host:" + session + ":" + std::to_string(alloc_id);
}

// A host allocation mapped into this process. A host_memfd mapping keeps
// its fd, held in FdTable under a holder of its own, so that this process
// can adopt the allocation (HostBackend::adopt) if its owner dies.
class HostMapping final : public Mapping {
 public:
  HostMapping(void* p, std::uint64_t n, UniqueFd fd = {}, std::string key = {}) : key_(std::move(key)) {
    base_ = p;
    size_ = n;
    if (fd && !key_.empty()) {
      holder_ = "mapping:" + std::to_string(reinterpret_cast<std::uintptr_t>(p));
      Process::get().fds().hold(holder_, key_, std::move(fd));
    }
  }
  ~HostMapping() override {
    if (base_) ::munmap(base_, size_);
    if (!holder_.empty()) Process::get().fds().drop(holder_, key_);
  }

 private:
  std::string key_, holder_;
};

class HostBackend final : public Backend {
 public:
  // What every host_memfd fd carries: its size can never change under a
  // mapping (no SIGBUS from a shrink), nor can a holder add a seal that
  // would stop others writing.
  static constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

  BackendKind kind() const noexcept override { return BackendKind::host; }
  std::string_view alloc_kind() const noexcept override { return alloc_kind::host_memfd; }

  Allocation allocate(std::uint64_t bytes, int /*device*/, std::uint64_t alloc_id, const std::string& tag,
                      DeviceMemoryResource* /*upstream*/ = nullptr) override {
    Allocation a = blank(alloc_id, host_handle(tag, alloc_id), bytes == 0 ? 1 : bytes);
    // The name shows in /proc/<pid>/fd and maps only ("/memfd:memcuda...").
    const std::string label = "memcuda." + tag + "." + std::to_string(alloc_id);
    UniqueFd fd(::memfd_create(label.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!fd) {
      if (is_fd_exhaustion(errno)) throw_fd_exhausted("memfd_create for " + a.handle, errno);
      throw_errno("memfd_create for " + a.handle);
    }
    if (::ftruncate(fd.get(), static_cast<off_t>(a.size)) != 0)
      throw_errno("sizing " + a.handle + " to " + std::to_string(a.size) + " bytes");
    if (int e = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(a.size)); e != 0) {
      errno = e;
      throw_errno("reserving " + std::to_string(a.size) + " bytes of shared host memory");
    }
    if (::fcntl(fd.get(), F_ADD_SEALS, kSeals) != 0) throw_errno("sealing " + a.handle);
    void* p = ::mmap(nullptr, a.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) throw_errno("mmap of " + std::to_string(a.size) + " bytes");
    return serve_mapped(std::move(a), std::move(fd), p, tag);
  }

  // Unmaps and stops serving the fd. The memory goes when no process holds
  // an fd (standbys drop theirs once the allocations Hash forgets it) or a
  // mapping of it; an adopted allocation not yet committed is the same. A
  // retained one (handed to a standby by a graceful stop) is served on
  // until this process exits: its records name this process until then.
  void deallocate(const Allocation& a) noexcept override {
    if (a.base) ::munmap(a.base, a.size);
    if (a.is_retained() && a.served) {
      serve_until_exit(a.served);
      return;
    }
    if (a.served) a.served->withdraw();
  }

  std::unique_ptr<Mapping> open(const TensorInfo& t) override {
    expect_alloc_kind(t, alloc_kind::host_memfd);
    const std::string what = "tensor '" + t.name + "' (" + t.ipc_handle + ")";
    UniqueFd fd = record_fd(t, t.ipc_handle, what);
    void* p = map_fd(fd.get(), t.alloc_bytes, what);
    return std::make_unique<HostMapping>(p, t.alloc_bytes, std::move(fd), t.ipc_handle);
  }

  // A dead owner's allocation outlives it while some process holds its fd
  // or a mapping: this one can adopt it when it holds the fd (a standby's,
  // or one of its own mappings').
  bool can_adopt(const TensorInfo& t) const noexcept override {
    if (t.backend != BackendKind::host || t.alloc_kind != alloc_kind::host_memfd) return false;
    try {
      return Process::get().fds().held(t.ipc_handle);
    } catch (...) {
      return false;
    }
  }

  // Maps the held fd and serves a copy of it from this process. The served
  // entry is published by the session that commits it (ServedFd::retag,
  // migration.hpp); the record keeps its ipc_handle (the same memory).
  Allocation adopt(const TensorInfo& t, std::uint64_t alloc_id, const std::string& /*tag*/) override {
    expect_alloc_kind(t, alloc_kind::host_memfd);
    const std::string what = "adopting " + t.ipc_handle + " of tensor '" + t.name + "'";
    UniqueFd fd = Process::get().fds().dup(t.ipc_handle);
    if (!fd)
      throw Lost(what + ": this process holds no fd of it (no standby fetched it and no mapping of this process "
                        "has it)");
    Allocation a = blank(alloc_id, t.ipc_handle, t.alloc_bytes);
    a.adopted_committed = std::make_shared<std::atomic<bool>>(false);
    void* p = map_fd(fd.get(), a.size, what);
    return serve_mapped(std::move(a), std::move(fd), p, std::string());
  }

  void copy(void* dst, const void* src, std::uint64_t n, int /*device*/) override { std::memcpy(dst, src, n); }

 private:
  static Allocation blank(std::uint64_t alloc_id, std::string handle, std::uint64_t size) {
    Allocation a;
    a.alloc_id = alloc_id;
    a.kind = BackendKind::host;
    a.alloc_kind = std::string(alloc_kind::host_memfd);
    a.handle = std::move(handle);
    a.size = size;
    return a;
  }

  // `a`, mapped at `p` from `fd`, which this process serves from now on
  // (unmapped again when serving fails).
  static Allocation serve_mapped(Allocation a, UniqueFd fd, void* p, const std::string& tag) {
    try {
      a.served = std::make_shared<ServedFd>(FdService::acquire(), std::move(fd), a.handle, tag);
      a.fd_source = a.served->source_text();
    } catch (...) {
      ::munmap(p, a.size);
      throw;
    }
    a.base = p;
    a.retained = std::make_shared<std::atomic<bool>>(false);
    return a;
  }

  // Keeps `s` served until static destruction (process exit). Noexcept: a
  // failure only ends the serving early (the standby still holds the fd).
  static void serve_until_exit(const std::shared_ptr<ServedFd>& s) noexcept {
    // Process-wide: an adopted allocation is served past the registry that
    // adopted it, until exit.
    static std::mutex mu;                                // leaf
    static std::vector<std::shared_ptr<ServedFd>> kept;
    try {
      std::lock_guard lk(mu);
      kept.push_back(s);
    } catch (...) {
      s->withdraw();
    }
  }

  // Maps n bytes of the memfd `fd` (not taken) once it is what a host
  // allocation is: a regular file of exactly n bytes, sealed (kSeals).
  static void* map_fd(int fd, std::uint64_t n, const std::string& what) {
    struct stat st {};
    std::string why;
    if (::fstat(fd, &st) != 0) {
      why = std::string("fstat failed: ") + std::strerror(errno);
    } else if (!S_ISREG(st.st_mode)) {
      why = "it is not a memory file";
    } else if (static_cast<std::uint64_t>(st.st_size) != n) {
      why = "it holds " + std::to_string(st.st_size) + " bytes, its record says " + std::to_string(n);
    } else if (int seals = ::fcntl(fd, F_GET_SEALS); seals < 0 || (seals & kSeals) != kSeals) {
      why = "it is not sealed against resizing (not made by mem-cuda)";
    }
    if (!why.empty()) throw Unavailable(what + ": the fd obtained is not what its record says: " + why + "; refused");
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) throw_errno(what + ": mmap of " + std::to_string(n) + " bytes");
    return p;
  }

  [[noreturn]] static void throw_errno(const std::string& what) {
    int e = errno;
    if (e == ENOMEM || e == ENOSPC)
      throw BudgetExceeded(what + ": " + std::strerror(e) + " (host memory or the memory cgroup's limit is exhausted)");
    throw Error(what + " failed: " + std::strerror(e));
  }
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
