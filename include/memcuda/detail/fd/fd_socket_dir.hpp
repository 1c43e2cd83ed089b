// The fd servers' sockets in the runtime directory: their names
// (<runtime dir>/fd-<pid>-<pid ns>-<16 hex>.sock), how a reader checks an
// address, and the sweep of sockets whose server died (docs/fd-transfer.md,
// "Runtime directory and peer policy", says why the names are so).
#pragma once

#include "memcuda/config.hpp"

#include <dirent.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "memcuda/detail/fd/fd_access.hpp"
#include "memcuda/detail/fd/fd_wire.hpp"
#include "memcuda/detail/fd/unique_fd.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// A per-process file of the runtime directory: "<prefix><pid>-<pid ns>-<16
// hex><suffix>" (the fd server's socket here, the liveness lock in
// live_lock.hpp).
struct ProcessName {
  std::int64_t pid = 0;
  std::uint64_t pid_ns = 0;
};
using SocketName = ProcessName;

inline std::string process_name(std::string_view prefix, std::int64_t pid, std::uint64_t pid_ns,
                                std::uint64_t random, std::string_view suffix) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%lld-%llu-%016llx", static_cast<long long>(pid),
                static_cast<unsigned long long>(pid_ns), static_cast<unsigned long long>(random));
  return std::string(prefix) + buf + std::string(suffix);
}

// The pid and pid namespace of a name of that form; nullopt otherwise
// (every part strictly decimal or lower-case hex, no sign, no extra bytes).
inline std::optional<ProcessName> parse_process_name(std::string_view n, std::string_view prefix,
                                                     std::string_view suffix) {
  if (n.size() <= prefix.size() + suffix.size() || !n.starts_with(prefix) || !n.ends_with(suffix))
    return std::nullopt;
  n = n.substr(prefix.size(), n.size() - prefix.size() - suffix.size());
  auto decimal = [&](auto* out) {
    auto dash = n.find('-');
    if (dash == 0 || dash == std::string_view::npos || n[0] == '0') return false;
    auto [p, ec] = std::from_chars(n.data(), n.data() + dash, *out);
    if (ec != std::errc() || p != n.data() + dash) return false;
    n.remove_prefix(dash + 1);
    return true;
  };
  ProcessName s;
  if (!decimal(&s.pid) || !decimal(&s.pid_ns) || s.pid <= 0 || n.size() != 16) return std::nullopt;
  for (char c : n)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return std::nullopt;
  return s;
}

inline std::string socket_name(std::int64_t pid, std::uint64_t pid_ns, std::uint64_t random) {
  return process_name("fd-", pid, pid_ns, random, ".sock");
}
inline std::optional<SocketName> parse_socket_name(std::string_view n) { return parse_process_name(n, "fd-", ".sock"); }

// `address` as a socket of the runtime directory `dir`: exactly
// "<dir>/<name>" with a name of the form above.
inline std::optional<SocketName> parse_socket_path(std::string_view address, std::string_view dir) {
  if (dir.empty() || address.size() <= dir.size() + 1 || !address.starts_with(dir) || address[dir.size()] != '/')
    return std::nullopt;
  std::string_view name = address.substr(dir.size() + 1);
  if (name.find('/') != std::string_view::npos) return std::nullopt;
  return parse_socket_name(name);
}

// Whether the pid of a source served at `address` names the owner in this
// process's pid namespace, so the pidfd fast path may address it by pid. A
// socket name says its server's namespace; an abstract address (tests
// serve on one) is assumed ours. Any other path: no.
inline bool owner_pid_is_ours(std::string_view address) {
  if (address.starts_with("@")) return true;
  auto slash = address.rfind('/');
  auto s = parse_socket_name(slash == std::string_view::npos ? address : address.substr(slash + 1));
  const std::uint64_t mine = pid_namespace_inode();
  return s && mine != 0 && s->pid_ns == mine;
}

// Whether no server listens at the socket `path`: a connect refused
// (ECONNREFUSED: nothing listens on that file, its process closed it) or no
// such file. A connect that succeeds is closed at once (the server reads it
// as a probe); any other error (a full backlog, no permission) is not proof.
inline bool fd_server_gone(const std::string& path) {
  sockaddr_un sa;
  socklen_t len = fdwire::make_address(path, &sa);
  UniqueFd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s || ::connect(s.get(), reinterpret_cast<sockaddr*>(&sa), len) == 0) return false;
  return errno == ECONNREFUSED || errno == ENOENT;
}

// Removes the sockets of `dir` whose server is gone: a connect refused
// (ECONNREFUSED) means nothing listens on that file. A socket only takes
// its name once it listens (FdServer::bind_path), so a live server is never
// mistaken for a dead one; one that connects is closed at once (its server
// reads it as a probe, not a refusal). "<name>.new" files left by a server
// killed between bind and rename are removed once a minute old. Best
// effort: returns how many files went; errors (a file of another uid in a
// sticky directory) leave the file.
inline std::size_t sweep_stale_sockets(const std::string& dir) {
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (!d) return 0;
  std::size_t removed = 0;
  while (dirent* e = ::readdir(d.get())) {
    std::string_view name = e->d_name;
    const std::string path = dir + "/" + std::string(name);
    if (name.starts_with("fd-") && name.ends_with(".new")) {
      std::string as_sock = std::string(name.substr(0, name.size() - 4)) + ".sock";
      struct stat st{};
      if (parse_socket_name(as_sock) && ::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) &&
          st.st_mtime + 60 < std::time(nullptr) && ::unlink(path.c_str()) == 0)
        ++removed;
      continue;
    }
    if (!parse_socket_name(name)) continue;
    struct stat st{};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    if (fd_server_gone(path) && ::unlink(path.c_str()) == 0) ++removed;
  }
  return removed;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
