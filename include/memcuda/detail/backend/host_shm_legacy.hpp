// host_shm: the host allocations of older versions, POSIX shm objects named
// in /dev/shm ("/memcuda.<owner session>.<alloc id>"). This version never
// makes one; it still reads a record that names one (opened by name, as
// before) so that a namespace can be upgraded while such records live, and
// it unlinks what a dead older owner left once no record uses it. Such
// memory is never adopted: a dead owner's tensors take the copy path.
// (docs/protocol.md, "Host allocations".)
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

#include "memcuda/detail/base/holder_id.hpp"
#include "memcuda/detail/base/log.hpp"
#include "memcuda/detail/backend/backend.hpp"
#include "memcuda/error.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {
namespace legacy_shm {

// The name an older version gave allocation `alloc_id` of the session `tag`.
inline std::string shm_name(std::string_view tag, std::uint64_t alloc_id) {
  return "/memcuda." + std::string(tag) + "." + std::to_string(alloc_id);
}

// Whether `t` is a host record of the legacy kind (written by an older
// version: alloc_kind "host_shm", or none at all).
inline bool is_legacy(const TensorInfo& t) noexcept {
  return t.backend == BackendKind::host && (t.alloc_kind.empty() || t.alloc_kind == alloc_kind::host_shm);
}

// Why a legacy record's ipc_handle is not a name the registry made for it,
// or "" when it is: its owner must be a session id and its ipc_handle
// exactly that owner's name of its alloc_id. Anything else (a record
// pointed at another program's object, or at another owner's) is never
// opened or unlinked.
inline std::string name_error(const TensorInfo& t) {
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

inline std::string path_of(const std::string& name) { return "/dev/shm" + name; }

// Whether `name` is a regular object of this effective user (of `size`
// bytes, when given). Does not follow links.
inline bool own_object(const std::string& name, std::optional<std::uint64_t> size) noexcept {
  struct stat st {};
  if (::lstat(path_of(name).c_str(), &st) != 0) return false;
  return S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
         (!size || static_cast<std::uint64_t>(st.st_size) == *size);
}

// Maps the whole object a legacy record points at, once the record names
// an object the registry made (ProtocolError bad_record otherwise) and the
// object is a plain one of this user of the record's size (AccessDenied
// for another user's, Unavailable for anything else). Throws Lost when it
// is gone.
inline void* map_object(const TensorInfo& t) {
  if (auto why = name_error(t); !why.empty()) throw ProtocolError(ProtocolErrc::bad_record, why);
  const std::string what = "shared memory " + t.ipc_handle + " of tensor '" + t.name + "'";
  int fd = ::shm_open(t.ipc_handle.c_str(), O_RDWR, 0);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) throw Lost(what + " no longer exists (its allocator of record freed it or exited)");
    if (e == EACCES || e == EPERM)
      throw AccessDenied(what + " cannot be opened by this process (uid " + std::to_string(::geteuid()) +
                         "): " + std::strerror(e) + "; run every process of a namespace as the same user");
    throw Unavailable("shm_open(" + t.ipc_handle + ") failed: " + std::strerror(e));
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
  const int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) throw Unavailable("mmap of " + t.ipc_handle + " failed: " + std::strerror(e));
  return p;
}

// Unlinks every /dev/shm/memcuda.<tag>.<id> not in `keep`, when it is a
// plain object of this user. The tag must be a session id, so no other
// session's objects match. Returns how many it unlinked.
inline std::size_t reclaim_owner(const std::string& tag, const std::set<std::string>& keep) noexcept {
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

// Unlinks the object of a legacy record whose owner died, only when the
// registry made it for this record (its name, this user's, the record's
// size); anything else is left alone.
inline void reclaim_orphan(const TensorInfo& t) noexcept {
  if (!is_legacy(t) || t.ipc_handle.empty()) return;
  try {
    if (auto why = name_error(t); !why.empty()) {
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

}  // namespace legacy_shm
}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
