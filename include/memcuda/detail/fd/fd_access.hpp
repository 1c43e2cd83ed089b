// Who may take this process's fds, and where its fd server's socket lives:
// FdAccess is the policy, the runtime directory and the peers served besides
// the server's own uid and root (allowed uids, allowed gids). The modes of
// the directory and the sockets follow it (docs/fd-transfer.md, "Runtime
// directory and peer policy", has the table).
#pragma once

#include "memcuda/config.hpp"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/detail/fd/fd_error.hpp"
#include "memcuda/error.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

struct FdAccess {
  std::string runtime_dir;                  // absolute, no trailing '/'
  std::vector<std::uint32_t> allowed_uids;  // besides the server's own uid and root
  std::vector<std::uint32_t> allowed_gids;  // a peer's effective gid
  bool operator==(const FdAccess&) const = default;
};

// The longest runtime directory: its socket names ("/fd-<pid>-<pid ns>-<16
// hex>.sock", at most 44 bytes) must fit sockaddr_un's 107 usable bytes.
inline constexpr std::size_t kMaxRuntimeDirBytes = 63;

// /tmp/memcuda-<euid>: the same for every process of a user however it was
// started (a login shell, a service, cron, sudo, a container where
// XDG_RUNTIME_DIR is unset), so processes agree without configuration.
// $XDG_RUNTIME_DIR is not used: it is set for login sessions only, and
// logind removes it at the user's last logout, live sockets included.
inline std::string default_runtime_dir() { return "/tmp/memcuda-" + std::to_string(::geteuid()); }

// "" -> the default; otherwise an absolute path, trailing '/' dropped.
// Throws InvalidArgument for a relative or overlong path.
inline std::string normalize_runtime_dir(std::string_view dir) {
  if (dir.empty()) return default_runtime_dir();
  if (dir.front() != '/')
    throw InvalidArgument("runtime_dir '" + std::string(dir) + "' is not an absolute path");
  while (dir.size() > 1 && dir.back() == '/') dir.remove_suffix(1);
  if (dir.size() > kMaxRuntimeDirBytes)
    throw InvalidArgument("runtime_dir '" + std::string(dir) + "' is " + std::to_string(dir.size()) +
                          " bytes; at most " + std::to_string(kMaxRuntimeDirBytes) +
                          " (a unix socket's path must fit 107 bytes)");
  if (dir.find('\0') != std::string_view::npos) throw InvalidArgument("runtime_dir contains a NUL byte");
  return std::string(dir);
}

// "1000,1001" -> {1000, 1001}; spaces around entries allowed. Throws
// InvalidArgument naming `what`.
inline std::vector<std::uint32_t> parse_id_list(std::string_view text, const std::string& what) {
  std::vector<std::uint32_t> ids;
  if (text.empty()) return ids;
  for (;;) {
    auto comma = text.find(',');
    std::string_view part = text.substr(0, comma);
    while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
    while (!part.empty() && part.back() == ' ') part.remove_suffix(1);
    std::uint32_t v = 0;
    auto [p, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (part.empty() || ec != std::errc() || p != part.data() + part.size() || v == 4294967295u)
      throw InvalidArgument(what + ": '" + std::string(part) +
                            "' is not a numeric id (expected a comma-separated list such as 1000,1001)");
    ids.push_back(v);
    if (comma == std::string_view::npos) return ids;
    text.remove_prefix(comma + 1);
  }
}

inline std::string id_list_text(const std::vector<std::uint32_t>& ids) {
  std::string s;
  for (auto id : ids) {
    if (!s.empty()) s += ',';  // appends, not "," + to_string(): GCC 12 warns -Wrestrict on the latter
    s += std::to_string(id);
  }
  return s;
}

// The policy in words, for refusals: "uid 1000 (its own) and root, uids
// 1001,1002, gids 100".
inline std::string describe_policy(const FdAccess& a) {
  std::string s = "uid " + std::to_string(::geteuid()) + " (its own) and root";
  if (!a.allowed_uids.empty()) s += ", uids " + id_list_text(a.allowed_uids);
  if (!a.allowed_gids.empty()) s += ", gids " + id_list_text(a.allowed_gids);
  return s;
}

inline bool contains(const std::vector<std::uint32_t>& v, std::uint32_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// "" when the peer may have fds, else why not (for the log and the peer).
inline std::string peer_refusal(const FdAccess& a, const ucred& cr) {
  if (cr.uid == ::geteuid() || cr.uid == 0 || contains(a.allowed_uids, cr.uid) || contains(a.allowed_gids, cr.gid))
    return {};
  return "peer pid " + std::to_string(cr.pid) + " (uid " + std::to_string(cr.uid) + ", gid " +
         std::to_string(cr.gid) + ") is not allowed by the policy of this fd server (pid " +
         std::to_string(::getpid()) + "), which serves " + describe_policy(a) +
         ": run both as one user, or allow the peer on the serving side (MEMCUDA_ALLOWED_UIDS / "
         "MEMCUDA_ALLOWED_GIDS, RegistryOptions::allowed_uids / allowed_gids)";
}

inline mode_t runtime_dir_mode(const FdAccess& a) {
  if (!a.allowed_gids.empty()) return 02770;
  if (!a.allowed_uids.empty()) return 01777;
  return 0700;
}
inline mode_t socket_mode(const FdAccess& a) {
  if (!a.allowed_gids.empty()) return 0660;
  if (!a.allowed_uids.empty()) return 0666;
  return 0600;
}

[[noreturn]] inline void bad_runtime_dir(const std::string& dir, const std::string& why, int err = 0) {
  throw FdTransferError(FdErrc::runtime_dir, "runtime directory '" + dir + "': " + why +
                                                 " (set MEMCUDA_RUNTIME_DIR / RegistryOptions::runtime_dir "
                                                 "to another directory, or fix this one)", err);
}

// Creates the directory (its parent must exist) or checks the one there,
// and gives it the policy's mode when it is ours. Refuses, with
// FdTransferError(runtime_dir): a symlink, a non-directory, a directory
// owned by a uid the policy does not allow (one another user made first,
// e.g. in /tmp; root's is allowed), and one writable by others without the
// sticky bit.
inline void prepare_runtime_dir(const FdAccess& a) {
  const std::string& dir = a.runtime_dir;
  const mode_t want = runtime_dir_mode(a);
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    int e = errno;
    bad_runtime_dir(dir, std::string("cannot create it: ") + std::strerror(e) +
                             (e == ENOENT ? " (its parent must exist)" : ""), e);
  }
  struct stat st{};
  if (::lstat(dir.c_str(), &st) != 0) bad_runtime_dir(dir, std::string("lstat: ") + std::strerror(errno), errno);
  if (S_ISLNK(st.st_mode)) bad_runtime_dir(dir, "is a symbolic link; refused (it could point anywhere)");
  if (!S_ISDIR(st.st_mode)) bad_runtime_dir(dir, "is not a directory");
  const uid_t me = ::geteuid();
  if (st.st_uid == me) {
    if (!a.allowed_gids.empty() && st.st_gid != a.allowed_gids.front() &&
        ::chown(dir.c_str(), static_cast<uid_t>(-1), a.allowed_gids.front()) != 0)
      bad_runtime_dir(dir, "cannot give it group " + std::to_string(a.allowed_gids.front()) + ": " +
                               std::strerror(errno) + " (this user must be a member of that group)", errno);
    if ((st.st_mode & 07777) != want && ::chmod(dir.c_str(), want) != 0)
      bad_runtime_dir(dir, std::string("chmod: ") + std::strerror(errno), errno);
    return;
  }
  // Root is trusted as a peer, so a directory root made (a volume prepared
  // for the pods) is too; the mode checks below still apply.
  if (st.st_uid != 0 && !contains(a.allowed_uids, st.st_uid))
    bad_runtime_dir(dir, "is owned by uid " + std::to_string(st.st_uid) + ", not by this process's uid " +
                             std::to_string(me) + " nor by a uid the policy allows (" + describe_policy(a) +
                             "); refused (another user may have made it first)");
  if ((st.st_mode & S_IWOTH) && !(st.st_mode & S_ISVTX))
    bad_runtime_dir(dir, "is writable by every user without the sticky bit; refused");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    bad_runtime_dir(dir, std::string("is not writable by this process: ") + std::strerror(errno), errno);
}

inline FdAccess default_fd_access() { return FdAccess{default_runtime_dir(), {}, {}}; }

class FdService;
// The process's fd service (fd_service.hpp) and the FdAccess its
// registries pinned (FdService::pin). Process-wide: one fd server per
// process, so one policy, reached by code that has no registry (a reader's
// source check, the liveness lock, tests).
struct FdServiceState {
  std::mutex mu;  // leaf; no wait under it
  std::weak_ptr<FdService> current;
  FdAccess pinned;
  std::size_t pins = 0;
  // The pinned FdAccess, else the default one; under `mu`.
  FdAccess access_locked() const { return pins ? pinned : default_fd_access(); }
};
inline FdServiceState& fd_service_state() {
  static FdServiceState s;  // process-wide: see above
  return s;
}
inline FdAccess process_fd_access() {
  auto& s = fd_service_state();
  std::lock_guard lk(s.mu);
  return s.access_locked();
}

// This process's pid namespace, as the inode of /proc/self/ns/pid (0 if
// unknown). Read each time: a forked child may have entered another.
inline std::uint64_t pid_namespace_inode() noexcept {
  struct stat st{};
  if (::stat("/proc/self/ns/pid", &st) != 0) return 0;
  return static_cast<std::uint64_t>(st.st_ino);
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
