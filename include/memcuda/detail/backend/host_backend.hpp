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
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "memcuda/detail/backend/backend.hpp"
#include "memcuda/detail/base/holder_id.hpp"
#include "memcuda/detail/base/log.hpp"
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

// The shm name allocate() gives allocation `alloc_id` of the session `tag`.
// Records name only such objects: a host record's ipc_handle must be
// exactly shm_name(owner, alloc_id) (host_record_name_error).
inline std::string shm_name(std::string_view tag, std::uint64_t alloc_id) {
  return "/memcuda." + std::string(tag) + "." + std::to_string(alloc_id);
}

// Why a host record's ipc_handle is not a name the registry made for it,
// or "" when it is: its owner must be a session id and its ipc_handle
// exactly that owner's name of its alloc_id. Anything else (a record
// pointed at another program's object, or at another owner's) is never
// opened, adopted or unlinked.
inline std::string host_record_name_error(const TensorInfo& t) {
  auto shown = [](std::string_view v) {
    std::string o;
    for (char c : v.substr(0, 96)) o += (c >= 0x20 && c < 0x7f) ? c : '?';
    return o + (v.size() > 96 ? "..." : "");
  };
  if (!HolderId::is_session_id(t.owner))
    return "tensor '" + t.name + "': its owner \"" + shown(t.owner) +
           "\" is not a session id (\"<pid>-<16 hex>\"), so its shared memory is not the registry's";
  if (t.ipc_handle != shm_name(t.owner, t.alloc_id))
    return "tensor '" + t.name + "': its ipc_handle \"" + shown(t.ipc_handle) +
           "\" is not the shared memory name the registry gives allocation " + std::to_string(t.alloc_id) +
           " of its owner (" + shm_name(t.owner, t.alloc_id) + "); refused (a record edited in Redis?)";
  return {};
}

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
    a.handle = shm_name(tag, alloc_id);
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

  // The handle is this process's own name (allocate(), or the link adopt()
  // made), whichever way the allocation ends; but a retained object (a
  // graceful stop handed it to a standby) is only unmapped: the standby
  // adopts it under its own name, and the new leader's sweep unlinks ours
  // once no record names it.
  void deallocate(const Allocation& a) noexcept override {
    if (a.base) ::munmap(a.base, a.size);
    if (a.is_retained()) return;
    ::shm_unlink(a.handle.c_str());
  }

  std::unique_ptr<Mapping> open(const TensorInfo& t) override {
    expect_alloc_kind(t, alloc_kind::host_shm);
    return std::make_unique<HostMapping>(map_object(t).first, t.alloc_bytes);
  }

  // The shm object outlives its creator; a process that maps it is as good
  // an owner as the one that created it. (adopt() checks the record.)
  bool can_adopt(const TensorInfo& t) const noexcept override {
    return t.backend == BackendKind::host && (t.alloc_kind.empty() || t.alloc_kind == alloc_kind::host_shm) &&
           !t.ipc_handle.empty();
  }

  // Maps the dead owner's object and links it under this process's own name
  // (shm_name(tag, alloc_id)): the record republished to this process then
  // names it as any of its allocations, and live mappings are untouched.
  // The dead owner's name stays until the migration's sweep unlinks it, so
  // a reader of the old record still opens it meanwhile.
  Allocation adopt(const TensorInfo& t, std::uint64_t alloc_id, const std::string& tag) override {
    expect_alloc_kind(t, alloc_kind::host_shm);
    Allocation a;
    a.alloc_id = alloc_id;
    a.kind = BackendKind::host;
    a.alloc_kind = std::string(alloc_kind::host_shm);
    a.size = t.alloc_bytes;
    a.handle = shm_name(tag, alloc_id);
    auto [p, st] = map_object(t);
    std::string why;
    if (::link(path_of(t.ipc_handle).c_str(), path_of(a.handle).c_str()) != 0) {
      why = std::string("link failed: ") + std::strerror(errno);
    } else {
      // The name must still be the object mapped (not replaced meanwhile).
      struct stat now {};
      if (::lstat(path_of(a.handle).c_str(), &now) != 0 || now.st_dev != st.st_dev || now.st_ino != st.st_ino) {
        ::shm_unlink(a.handle.c_str());
        why = "it was replaced while being adopted";
      }
    }
    if (!why.empty()) {
      ::munmap(p, t.alloc_bytes);
      throw Unavailable("adopting shared memory " + t.ipc_handle + " of tensor '" + t.name + "' as " + a.handle +
                        ": " + why);
    }
    a.base = p;
    a.adopted_committed = std::make_shared<std::atomic<bool>>(false);
    a.retained = std::make_shared<std::atomic<bool>>(false);
    return a;
  }

  // Every /dev/shm/memcuda.<tag>.<id> (the names allocate() gives) not in
  // `keep`, when it is a plain object of this user. The tag must be a
  // session id ("<pid>-<16 hex>"), so no other session's objects match.
  std::size_t reclaim_owner(const std::string& tag, const std::set<std::string>& keep) noexcept override {
    if (!HolderId::is_session_id(tag)) return 0;
    const std::string prefix = "memcuda." + tag + ".";
    std::vector<std::string> doomed;
    if (DIR* d = ::opendir("/dev/shm")) {
      while (const dirent* e = ::readdir(d)) {
        std::string n(e->d_name);
        if (!n.starts_with(prefix) || n.size() == prefix.size() || keep.count("/" + n)) continue;
        if (n.find_first_not_of("0123456789", prefix.size()) != std::string::npos) continue;
        doomed.push_back("/" + n);
      }
      ::closedir(d);
    }
    std::size_t n = 0;
    for (const auto& name : doomed)
      if (own_object(name, std::nullopt) && ::shm_unlink(name.c_str()) == 0) ++n;
    return n;
  }

  // Only an object the registry made for this record (its name, this
  // user's, the record's size); anything else is left alone.
  void reclaim_orphan(const TensorInfo& t) noexcept override {
    if (t.ipc_handle.empty()) return;
    try {
      if (auto why = host_record_name_error(t); !why.empty()) {
        log(LogLevel::warn, "not unlinking the shared memory of a record: " + why);
        return;
      }
      if (!own_object(t.ipc_handle, t.alloc_bytes)) {
        log(LogLevel::warn, "not unlinking shared memory " + t.ipc_handle + " of tensor '" + t.name +
                                "': it is not a plain object of this user of the size its record says");
        return;
      }
    } catch (...) {
      return;  // logging failed: leave it
    }
    ::shm_unlink(t.ipc_handle.c_str());
  }

  void copy(void* dst, const void* src, std::uint64_t n, int /*device*/) override { std::memcpy(dst, src, n); }

 private:
  static std::string path_of(const std::string& name) { return "/dev/shm" + name; }

  // Whether `name` is a regular object of this effective user (of `size`
  // bytes, when given). Does not follow links.
  static bool own_object(const std::string& name, std::optional<std::uint64_t> size) noexcept {
    struct stat st {};
    if (::lstat(path_of(name).c_str(), &st) != 0) return false;
    return S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
           (!size || static_cast<std::uint64_t>(st.st_size) == *size);
  }

  // Maps the whole object a record points at, once the record names an
  // object the registry made (ProtocolError bad_record otherwise) and the
  // object is a plain one of this user of the record's size (AccessDenied
  // for another user's, Unavailable for anything else). Throws Lost when
  // it is gone. Returns the mapping and the object's stat.
  static std::pair<void*, struct stat> map_object(const TensorInfo& t) {
    if (auto why = host_record_name_error(t); !why.empty()) throw ProtocolError(ProtocolErrc::bad_record, why);
    const std::string what = "shared memory " + t.ipc_handle + " of tensor '" + t.name + "'";
    int fd = ::shm_open(t.ipc_handle.c_str(), O_RDWR, 0);
    if (fd < 0) {
      const int e = errno;
      if (e == ENOENT)
        throw Lost(what + " no longer exists (its allocator of record freed it or exited)");
      if (e == EACCES || e == EPERM)
        throw AccessDenied(what + " cannot be opened by this process (uid " + std::to_string(::geteuid()) +
                           "): " + std::strerror(e) + "; run every process of a namespace as the same user");
      errno = e;
      throw_errno("shm_open(" + t.ipc_handle + ")");
    }
    struct stat st {};
    std::string why;
    if (::fstat(fd, &st) != 0) {
      why = std::string("fstat failed: ") + std::strerror(errno);
    } else if (st.st_uid != ::geteuid()) {
      ::close(fd);
      throw AccessDenied(what + " belongs to uid " + std::to_string(st.st_uid) + ", not to this process's uid " +
                         std::to_string(::geteuid()) + ": refused (run every process of a namespace as one user)");
    } else if (!S_ISREG(st.st_mode)) {
      why = "it is not a plain shared memory object";
    } else if (static_cast<std::uint64_t>(st.st_size) != t.alloc_bytes) {
      why = "it holds " + std::to_string(st.st_size) + " bytes, its record says " + std::to_string(t.alloc_bytes);
    }
    if (!why.empty()) {
      ::close(fd);
      throw Unavailable(what + " is not what its record says: " + why + "; refused");
    }
    void* p = ::mmap(nullptr, t.alloc_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    ::close(fd);
    if (p == MAP_FAILED) {
      errno = e;
      throw_errno("mmap of " + t.ipc_handle);
    }
    return {p, st};
  }

  [[noreturn]] static void throw_errno(const std::string& what) {
    int e = errno;
    if (e == ENOMEM || e == ENOSPC)
      throw BudgetExceeded(what + ": " + std::strerror(e) + " (is /dev/shm large enough?)");
    throw Error(what + " failed: " + std::strerror(e));
  }
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
