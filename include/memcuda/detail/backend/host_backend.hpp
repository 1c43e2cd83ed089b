// Host backend: POSIX shared memory. A real backend for CPU tensors shared
// between processes, with the CUDA backend's protocol, so the whole control
// plane runs where there is no GPU.
#pragma once

#include "memcuda/config.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

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

  Allocation allocate(std::uint64_t bytes, int /*device*/, std::uint64_t alloc_id, const std::string& tag,
                      DeviceMemoryResource* /*upstream*/ = nullptr) override {
    Allocation a;
    a.alloc_id = alloc_id;
    a.kind = BackendKind::host;
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
    return a;
  }

  void deallocate(const Allocation& a) noexcept override {
    if (a.base) ::munmap(a.base, a.size);
    ::shm_unlink(a.handle.c_str());
  }

  std::unique_ptr<Mapping> open(const TensorInfo& t) override {
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
    return std::make_unique<HostMapping>(p, t.alloc_bytes);
  }

  void copy(void* dst, const void* src, std::uint64_t n, int /*device*/) override { std::memcpy(dst, src, n); }

  void reclaim_orphan(const TensorInfo& t) noexcept override {
    if (!t.ipc_handle.empty()) ::shm_unlink(t.ipc_handle.c_str());
  }

 private:
  [[noreturn]] static void throw_errno(const std::string& what) {
    int e = errno;
    if (e == ENOMEM || e == ENOSPC)
      throw BudgetExceeded(what + ": " + std::strerror(e) + " (is /dev/shm large enough?)");
    throw Error(what + " failed: " + std::strerror(e));
  }
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
