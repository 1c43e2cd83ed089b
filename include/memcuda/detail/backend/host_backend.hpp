// Host backend: POSIX shared memory. A real backend for CPU tensors shared
// between processes, with the CUDA backend's protocol, so the whole control
// plane runs where there is no GPU.
#pragma once

#include "memcuda/config.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "memcuda/detail/backend/backend.hpp"
#include "memcuda/detail/log.hpp"
#include "memcuda/error.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class HostMapping final : public Mapping {
 public:
  HostMapping(void* p, std::uint64_t n) {
    base_ = p;
    size_ = n;
  }
  ~HostMapping() override {
    if (base_) ::munmap(base_, size_);
  }
};

class HostBackend final : public Backend {
 public:
  BackendKind kind() const noexcept override { return BackendKind::host; }
  std::string_view alloc_kind() const noexcept override { return alloc_kind::host_shm; }

  Allocation allocate(std::uint64_t bytes, int /*device*/, std::uint64_t alloc_id, const std::string& tag,
                      DeviceMemoryResource* /*upstream*/ = nullptr) override {
    Allocation a;
    a.alloc_id = alloc_id;
    a.kind = BackendKind::host;
    a.alloc_kind = std::string(alloc_kind::host_shm);
    a.size = bytes == 0 ? 1 : bytes;
    a.handle = "/memcuda." + tag + "." + std::to_string(alloc_id);
    int fd = ::shm_open(a.handle.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) throw_errno("shm_open(" + a.handle + ")");
    // Commit the pages now: a full /dev/shm is then a clear error here
    // instead of a SIGBUS at some later write.
    if (int e = ::posix_fallocate(fd, 0, static_cast<off_t>(a.size)); e != 0) {
      ::close(fd);
      ::shm_unlink(a.handle.c_str());
      errno = e;
      throw_errno("reserving " + std::to_string(a.size) + " bytes of shared memory in /dev/shm");
    }
    void* p = ::mmap(nullptr, a.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    ::close(fd);
    if (p == MAP_FAILED) {
      ::shm_unlink(a.handle.c_str());
      errno = e;
      throw_errno("mmap of " + std::to_string(a.size) + " bytes");
    }
    a.base = p;
    a.retained = std::make_shared<std::atomic<bool>>(false);
    return a;
  }

  // A retained object (a graceful stop handed it to a standby) is only
  // unmapped: the standby adopts it by name. An adopted object is unlinked only once a record was republished
  // pointing at it (Allocation::adopted_committed): before that its name
  // still belongs to the dead owner's records.
  void deallocate(const Allocation& a) noexcept override {
    if (a.base) ::munmap(a.base, a.size);
    if (a.is_retained()) return;
    if (!a.adopted() || a.adopted_committed->load()) ::shm_unlink(a.handle.c_str());
  }

  std::unique_ptr<Mapping> open(const TensorInfo& t) override {
    expect_alloc_kind(t, alloc_kind::host_shm);
    return std::make_unique<HostMapping>(map_object(t), t.alloc_bytes);
  }

  // The shm object outlives its creator; a process that maps it is as good
  // an owner as the one that created it.
  bool can_adopt(const TensorInfo& t) const noexcept override {
    return t.backend == BackendKind::host && (t.alloc_kind.empty() || t.alloc_kind == alloc_kind::host_shm) &&
           !t.ipc_handle.empty();
  }

  Allocation adopt(const TensorInfo& t, std::uint64_t alloc_id) override {
    expect_alloc_kind(t, alloc_kind::host_shm);
    Allocation a;
    a.alloc_id = alloc_id;
    a.kind = BackendKind::host;
    a.alloc_kind = std::string(alloc_kind::host_shm);
    a.size = t.alloc_bytes;
    a.handle = t.ipc_handle;
    a.base = map_object(t);
    a.adopted_committed = std::make_shared<std::atomic<bool>>(false);
    a.retained = std::make_shared<std::atomic<bool>>(false);
    return a;
  }

  // Every /dev/shm/memcuda.<tag>.<id> (the names allocate() gives) not in
  // `keep`. The tag is a session id ("<pid>-<16 hex>"), so no other
  // session's objects match.
  std::size_t reclaim_owner(const std::string& tag, const std::set<std::string>& keep) noexcept override {
    if (tag.empty()) return 0;
    const std::string prefix = "memcuda." + tag + ".";
    std::vector<std::string> doomed;
    if (DIR* d = ::opendir("/dev/shm")) {
      while (const dirent* e = ::readdir(d)) {
        std::string n(e->d_name);
        if (n.starts_with(prefix) && !keep.count("/" + n)) doomed.push_back("/" + n);
      }
      ::closedir(d);
    }
    std::size_t n = 0;
    for (const auto& name : doomed)
      if (::shm_unlink(name.c_str()) == 0) ++n;
    return n;
  }

  void reclaim_orphan(const TensorInfo& t) noexcept override {
    if (!t.ipc_handle.empty()) ::shm_unlink(t.ipc_handle.c_str());
  }

  void copy(void* dst, const void* src, std::uint64_t n, int /*device*/) override { std::memcpy(dst, src, n); }

 private:
  // Maps the whole object a record points at. Throws Lost when it is gone.
  static void* map_object(const TensorInfo& t) {
    int fd = ::shm_open(t.ipc_handle.c_str(), O_RDWR, 0);
    if (fd < 0) {
      if (errno == ENOENT)
        throw Lost("shared memory " + t.ipc_handle + " of tensor '" + t.name +
                   "' no longer exists (its allocator of record freed it or exited)");
      throw_errno("shm_open(" + t.ipc_handle + ")");
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) < t.alloc_bytes) {
      ::close(fd);
      throw InternalError("shared memory " + t.ipc_handle + " is smaller than its record says");
    }
    void* p = ::mmap(nullptr, t.alloc_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    ::close(fd);
    if (p == MAP_FAILED) {
      errno = e;
      throw_errno("mmap of " + t.ipc_handle);
    }
    return p;
  }

  [[noreturn]] static void throw_errno(const std::string& what) {
    int e = errno;
    if (e == ENOMEM || e == ENOSPC)
      throw BudgetExceeded(what + ": " + std::strerror(e) + " (is /dev/shm large enough?)");
    throw Error(what + " failed: " + std::strerror(e));
  }
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
