// Connecting to an owner's fd server: the first step of every socket
// fetch (fd_client.hpp, fd_client_batch.hpp), and the errors it reports.
#pragma once

#include "memcuda/config.hpp"

#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>

#include "memcuda/detail/fd/fd_error.hpp"
#include "memcuda/detail/fd/fd_limit.hpp"
#include "memcuda/detail/fd/fd_wire.hpp"
#include "memcuda/detail/fd/unique_fd.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::fdclient {

[[noreturn]] inline void fail(FdErrc why, const std::string& what, int err = 0) {
  throw FdTransferError(why, what, err);
}

inline std::string where(std::string_view address, std::uint64_t id) {
  return "fetching the fd of allocation " + std::to_string(id) + " from the fd server at '" +
         std::string(address) + "'";
}

// A new connection to the server at `address`.
inline UniqueFd connect_to(std::string_view address, std::chrono::steady_clock::time_point deadline,
                           std::chrono::milliseconds timeout, const std::string& ctx) {
  sockaddr_un sa;
  socklen_t len = fdwire::make_address(address, &sa);
  UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!sock) {
    if (is_fd_exhaustion(errno)) throw_fd_exhausted(ctx + ": socket()", errno);
    fail(FdErrc::system, ctx + ": socket() failed: " + std::strerror(errno), errno);
  }
  // A non-blocking unix connect fails with EAGAIN while the server's backlog
  // is full: retry until the deadline rather than block the caller.
  while (::connect(sock.get(), reinterpret_cast<sockaddr*>(&sa), len) != 0) {
    int e = errno;
    if (e == EINTR) continue;
    if (e == EAGAIN && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    if (e == ECONNREFUSED || e == ENOENT)
      fail(FdErrc::no_server,
           ctx + ": no server listens there (" + std::strerror(e) + "); its owner has exited or serves no fds" +
               (address.starts_with("@")
                    ? ". Check that the owner is alive and that both run in one network namespace "
                      "(an abstract socket, of an older version, is per network namespace)"
                    : " (a socket file left by a killed process is swept when a server starts). Check "
                      "that the owner is alive and that both processes see the same runtime directory "
                      "(one volume, mounted at one path)"),
           e);
    if (e == EACCES || e == EPERM)
      fail(FdErrc::permission, ctx + ": permission denied on the socket file or its directory (" +
                                     std::strerror(e) + "); the runtime directory's mode follows the "
                                     "owner's peer policy: run both as one user, or allow this one's gid "
                                     "(MEMCUDA_ALLOWED_GIDS) on the owner's side", e);
    if (e == EAGAIN) fail(FdErrc::timeout, ctx + ": the server's backlog stayed full for " +
                                               std::to_string(timeout.count()) + " ms", e);
    fail(FdErrc::system, ctx + ": connect failed: " + std::strerror(e), e);
  }
  return sock;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::fdclient
