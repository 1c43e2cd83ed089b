// Borrowed memory: a buffer this process already has (a framework's tensor)
// shared by name without a copy (TensorRegistry::share; docs/design.md,
// "Borrowed tensors", says what can be shared and why). This file finds out
// how other processes can open a host buffer and makes the Allocation that
// stands for it; the registry side (the record, the keep-alive, the release
// route) is registry/ops/share.hpp.
//
// Host memory can be shared only when it lies in a sealed MAP_SHARED
// mapping of a memfd; its fd is found among this process's open fds
// (/proc/self/map_files, which needs CAP_SYS_ADMIN, only last).
#pragma once

#include "memcuda/config.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include "memcuda/detail/backend/host_backend.hpp"
#include "memcuda/detail/fd/fd_service.hpp"
#include "memcuda/detail/fd/unique_fd.hpp"
#include "memcuda/detail/process/process.hpp"
#include "memcuda/share_options.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// The alloc ids of borrowed buffers: far above a pool's (which count from
// 1), so (owner session, alloc id) never names two things in ProcessCache.
inline constexpr std::uint64_t kBorrowedAllocIdBase = std::uint64_t(1) << 62;

// One line of /proc/self/maps.
struct MapsEntry {
  std::uintptr_t start = 0, end = 0;
  std::uint64_t file_offset = 0;
  dev_t dev = 0;
  ino_t ino = 0;
  bool shared = false;
  std::string path;
};

// The mapping of this process that contains `p`, if any.
inline std::optional<MapsEntry> mapping_of(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::ifstream in("/proc/self/maps");
  std::string line;
  while (std::getline(in, line)) {
    // The range first: only the line that holds `p` is parsed in full (a
    // process with a framework loaded has thousands).
    char* endp = nullptr;
    const auto lo = std::strtoull(line.c_str(), &endp, 16);
    if (*endp != '-' || a < lo || a >= std::strtoull(endp + 1, nullptr, 16)) continue;
    std::istringstream ls(line);
    std::string range, perms, off, dev, path;
    unsigned long long ino = 0;
    ls >> range >> perms >> off >> dev >> ino;
    std::getline(ls >> std::ws, path);
    const auto dash = range.find('-');
    const auto colon = dev.find(':');
    if (dash == std::string::npos || colon == std::string::npos || perms.size() < 4) continue;
    MapsEntry e;
    e.start = std::stoull(range.substr(0, dash), nullptr, 16);
    e.end = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (a < e.start || a >= e.end) continue;
    e.file_offset = std::stoull(off, nullptr, 16);
    e.dev = makedev(std::stoul(dev.substr(0, colon), nullptr, 16), std::stoul(dev.substr(colon + 1), nullptr, 16));
    e.ino = static_cast<ino_t>(ino);
    e.shared = perms[3] == 's';
    e.path = path;
    return e;
  }
  return std::nullopt;
}

// The regular files this process has open, by (device, inode), as of the
// last scan of /proc/self/fd: a hit is checked with one fstat before use,
// a miss rescans. So sharing many buffers scans once, not once per buffer
// (a process with a model loaded has hundreds of fds). A part of the
// process object (Process::open_files()): the fd table it mirrors is.
class OpenFiles {
 public:
  // A duplicate of an open fd of (dev, ino), or none.
  UniqueFd find(dev_t dev, ino_t ino) {
    std::lock_guard lk(mu_);  // leaf: no I/O but the local fd table
    if (auto fd = dup_if(dev, ino)) return fd;
    rescan();
    return dup_if(dev, ino);
  }

 private:
  UniqueFd dup_if(dev_t dev, ino_t ino) {
    auto it = fds_.find({dev, ino});
    if (it == fds_.end()) return {};
    struct stat st {};
    if (::fstat(it->second, &st) != 0 || !S_ISREG(st.st_mode) || st.st_dev != dev || st.st_ino != ino) {
      fds_.erase(it);  // closed or reused since the scan
      return {};
    }
    return UniqueFd(::fcntl(it->second, F_DUPFD_CLOEXEC, 0));
  }
  void rescan() {
    fds_.clear();
    DIR* d = ::opendir("/proc/self/fd");
    if (!d) return;
    const int own = ::dirfd(d);
    while (dirent* e = ::readdir(d)) {
      char* endp = nullptr;
      const long fd = std::strtol(e->d_name, &endp, 10);
      if (*endp != '\0' || fd == own) continue;
      struct stat st {};
      if (::fstat(static_cast<int>(fd), &st) == 0 && S_ISREG(st.st_mode))
        fds_.emplace(std::pair{st.st_dev, st.st_ino}, static_cast<int>(fd));
    }
    ::closedir(d);
  }
  std::mutex mu_;
  std::map<std::pair<dev_t, ino_t>, int> fds_;
};

// An fd of the file (dev, ino) this process has open, duplicated; else one
// opened through /proc/self/map_files (CAP_SYS_ADMIN); else none.
inline UniqueFd fd_of_file(const MapsEntry& m) {
  if (auto fd = Process::get().open_files().find(m.dev, m.ino)) return fd;
  char name[96];
  std::snprintf(name, sizeof name, "/proc/self/map_files/%lx-%lx", static_cast<unsigned long>(m.start),
                static_cast<unsigned long>(m.end));
  UniqueFd fd(::open(name, O_RDWR | O_CLOEXEC));
  struct stat st {};
  if (fd && ::fstat(fd.get(), &st) == 0 && st.st_dev == m.dev && st.st_ino == m.ino) return fd;
  return {};
}

// Noexcept frees of a borrowed allocation: stop serving its fd (the
// keep-alive goes with the Allocation). Nothing is ever allocated here.
// Stateless; one of the process's backends (Backends::borrowed).
class BorrowedMemory final : public Backend {
 public:
  BackendKind kind() const noexcept override { return BackendKind::host; }
  std::string_view alloc_kind() const noexcept override { return alloc_kind::host_memfd; }
  Allocation allocate(std::uint64_t, int, std::uint64_t, const std::string&, DeviceMemoryResource*) override {
    throw InternalError("borrowed memory is never allocated");
  }
  void deallocate(const Allocation& a) noexcept override {
    if (a.served) a.served->withdraw();
  }
  std::unique_ptr<Mapping> open(const TensorInfo&) override {
    throw InternalError("borrowed memory is opened by its kind's backend");
  }
  void copy(void*, const void*, std::uint64_t, int) override { throw InternalError("borrowed memory is never copied"); }
};

// The Allocation of `bytes` of host memory at `p`, served from this
// process: host_memfd, its base the address of the file's first byte as
// this process sees it (p - file offset), so that record.offset = the
// file offset of p. Throws NotShareable (why, and what to do instead).
inline Allocation borrow_host(const void* p, std::uint64_t bytes, std::uint64_t alloc_id, const std::string& session) {
  const std::string what = "host memory at " + std::to_string(reinterpret_cast<std::uintptr_t>(p));
  auto m = mapping_of(p);
  const std::string copy_hint =
      ": it cannot be shared without a copy. Copy it into registry memory (create + write, put() in Python), or "
      "allocate it shareable (memcuda.shareable_empty in Python, or a memfd mapped MAP_SHARED)";
  if (!m || m->ino == 0)
    throw NotShareable(what + " is private anonymous memory (malloc, new, a framework's own allocator)" + copy_hint);
  if (!m->shared)
    throw NotShareable(what + " lies in a private (copy-on-write) mapping of " + m->path + copy_hint);
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (bytes > m->end - a)
    throw NotShareable(what + ": its " + std::to_string(bytes) + " bytes run past the end of the mapping of " +
                       m->path + " (" + std::to_string(m->end - a) + " bytes left)");
  UniqueFd fd = fd_of_file(*m);
  if (!fd)
    throw NotShareable(what + " lies in a mapping of " + m->path +
                       ", but this process has no fd of it open (and /proc/self/map_files needs CAP_SYS_ADMIN): "
                       "keep an fd of the memfd open while it is shared");
  int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0)
    throw NotShareable(what + " lies in " + m->path +
                       ", a file that cannot be sealed against resizing (only a memfd can): a truncate would crash "
                       "its readers (SIGBUS)" + copy_hint);
  const int want = HostBackend::kSeals;
  if ((seals & want) != want && ::fcntl(fd.get(), F_ADD_SEALS, want & ~seals) != 0)
    throw NotShareable(what + " lies in the memfd " + m->path + ", which cannot be sealed against resizing (" +
                       std::strerror(errno) + "; create it with MFD_ALLOW_SEALING)" + copy_hint);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw Error(what + ": fstat failed: " + std::strerror(errno));
  const std::uint64_t file_off = m->file_offset + (a - m->start);
  if (file_off + bytes > static_cast<std::uint64_t>(st.st_size))
    throw NotShareable(what + ": its bytes run past the end of " + m->path);
  Allocation out;
  out.alloc_id = alloc_id;
  out.kind = BackendKind::host;
  out.alloc_kind = std::string(alloc_kind::host_memfd);
  out.size = static_cast<std::uint64_t>(st.st_size);
  out.handle = host_handle(session, alloc_id);
  out.base = reinterpret_cast<void*>(a - file_off);  // only ever used plus the record's offset
  out.served = std::make_shared<ServedFd>(FdService::acquire(), std::move(fd), out.handle, "borrowed");
  out.fd_source = out.served->source_text();
  return out;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
