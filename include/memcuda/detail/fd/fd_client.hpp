// fetch: obtain another process's fd for an allocation (docs/fd-transfer.md
// says when each path is taken and why). Parked fds first (fd_table.hpp),
// then pidfd_getfd where this process may ptrace the owner in its pid
// namespace (the first refusal turns it off for the process), else the
// owner's FdServer over its unix socket (SCM_RIGHTS), one id or many
// (fetch_many), with the connection kept for the next request
// (fd_conn_cache.hpp).
#pragma once

#include "memcuda/config.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "memcuda/detail/fd/fd_conn_cache.hpp"
#include "memcuda/detail/fd/fd_error.hpp"
#include "memcuda/detail/fd/fd_limit.hpp"
#include "memcuda/detail/fd/fd_table.hpp"
#include "memcuda/detail/process/process.hpp"
#include "memcuda/detail/fd/fd_socket_dir.hpp"
#include "memcuda/detail/fd/fd_wire.hpp"
#include "memcuda/detail/fd/unique_fd.hpp"

// Old libc headers lack the numbers; they are the same on every architecture
// but alpha (which mem-cuda does not target).
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// Which file an fd refers to. Checked after pidfd_getfd, which addresses the
// owner's fd by number: a record that outlived its fd (the number reused for
// another file, or the pid for another process) must not yield the wrong
// file silently. Note: files made by anon_inode_getfd() share one inode, so
// for those the check only catches a number reused by an ordinary file; the
// cuMem backend checks the allocation's size after import as well.
struct FdIdentity {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const FdIdentity&) const = default;
};

inline FdIdentity fd_identity(int fd) noexcept {
  struct stat st{};
  if (::fstat(fd, &st) != 0) return {};
  return {st.st_dev, st.st_ino};
}

// Where an allocation's fd can be had: what the owner publishes in its record.
struct FdSource {
  std::string address;  // the owner's FdServer ("@name" or a path)
  pid_t pid = 0;        // the owner's pid; 0 disables the fast path
  int remote_fd = -1;   // the fd's number in the owner
  FdIdentity identity;  // fd_identity() of it in the owner; {} disables the fast path
};

enum class FdPath {
  automatic,    // pidfd_getfd where permitted, else the socket
  socket_only,  // always the socket (SCM_RIGHTS)
  pidfd_only,   // only pidfd_getfd; fails with pidfd_failed instead of falling back
};

struct FetchOptions {
  std::chrono::milliseconds timeout{2000};  // whole fetch, connect included
  FdPath path = FdPath::automatic;
  // Fds of the owner's other allocations to take along over the socket
  // (parked for their opens, FdTable); -1: as FdTable::offer_for says.
  int offer = -1;
};

struct Fetched {
  UniqueFd fd;
  bool via_pidfd = false;
};

// One id of a batched fetch: its fd, or the error that answered it.
struct BatchFetched {
  std::uint64_t id = 0;
  UniqueFd fd;
  std::exception_ptr error;  // an FdTransferError when !fd
};

namespace fdclient {

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
               " (a socket file left by a killed process is swept when a server starts). Check that the owner "
               "is alive and that both processes see the same runtime directory (one volume, mounted at one path)",
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

// errno of the first permission-type pidfd failure in this process, 0 while
// the fast path is on.
inline std::atomic<int>& pidfd_disabled_errno() {
  static std::atomic<int> e{0};
  return e;
}

// pidfd_open + pidfd_getfd. Returns an empty fd (and sets *err) on failure.
inline UniqueFd try_pidfd(const FdSource& src, int* err) {
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, src.pid, 0)));
  if (!pidfd) {
    *err = errno;
    return {};
  }
  // pidfd_getfd always sets close-on-exec on the new fd.
  UniqueFd fd(static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd.get(), src.remote_fd, 0)));
  if (!fd) *err = errno;
  return fd;
}

inline std::string where_many(std::string_view address, const std::vector<std::uint64_t>& ids) {
  std::string list;
  for (std::size_t i = 0; i < ids.size() && i < 8; ++i) list += (i ? ", " : "") + std::to_string(ids[i]);
  if (ids.size() > 8) list += ", ...";
  return ids.size() == 1 ? where(address, ids[0])
                         : "fetching the fds of " + std::to_string(ids.size()) + " allocations (ids " + list +
                               ") from the fd server at '" + std::string(address) + "'";
}

// Waits for the answer on `sock` until the deadline.
inline void await_answer(int sock, std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds timeout,
                         const std::string& ctx) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{sock, POLLIN, 0};
    int n = ::poll(&p, 1, left.count() > 0 ? static_cast<int>(left.count()) : 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(FdErrc::system, ctx + ": poll failed: " + std::strerror(errno), errno);
    if (n == 0)
      fail(FdErrc::timeout, ctx + ": no answer within " + std::to_string(timeout.count()) +
                                " ms; the owner's thread is stuck or the process is stopped");
    return;
  }
}

// One request and its answer on `sock`: *out gets one entry per id asked
// for and offered, with the fds. False: a kept connection (`reused`) that
// its server closed before it answered; the caller asks again on a new one.
// Failures of the whole request throw FdTransferError.
inline bool exchange(int sock, const fdwire::Request& req, std::chrono::steady_clock::time_point deadline,
                     std::chrono::milliseconds timeout, const std::string& ctx, bool reused,
                     std::vector<fdwire::Entry>* out) {
  Process::get().fds().note_request();
  // A server that refuses us may answer and close before reading: our send
  // then fails (EPIPE), but its answer is still queued for us to read.
  if (fdwire::send_message(sock, fdwire::encode_request(req)) < 0) {
    if (reused && (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN)) return false;
    if (errno != EPIPE && errno != ECONNRESET)
      fail(FdErrc::system, ctx + ": send failed: " + std::strerror(errno), errno);
  }
  await_answer(sock, deadline, timeout, ctx);
  fdwire::Received msg;
  ssize_t got = fdwire::recv_message(sock, fdwire::kMaxReply, &msg);
  if (reused && (got == 0 || (got < 0 && errno == ECONNRESET))) return false;
  if (got < 0 && errno == ECONNRESET)
    fail(FdErrc::no_server, ctx + ": the server reset the connection without an answer "
                                  "(it crashed or is exiting?)", errno);
  if (got < 0) fail(FdErrc::system, ctx + ": recvmsg failed: " + std::strerror(errno), errno);
  if (got == 0)
    fail(FdErrc::no_server, ctx + ": the server closed the connection without an answer (the owner is exiting?)");
  // Out of fds here: the kernel installs what fits, in order, and drops the
  // rest. The fds asked for come first, so an answer short of offers only
  // is still whole.
  if (msg.ctrunc && req.offer == 0) throw_fd_exhausted(ctx, 0);
  fdwire::Reply rep;
  std::size_t fds = 0;
  std::string why;
  if (msg.truncated || !fdwire::decode_reply(msg.bytes, &rep, &fds, &why) ||
      (msg.ctrunc ? fds < msg.fds.size() : fds != msg.fds.size()))
    fail(FdErrc::protocol, ctx + ": malformed answer: " + (why.empty() ? "too long, or fds not as announced" : why));
  switch (rep.status) {
    case fdwire::Status::ok: break;
    case fdwire::Status::refused: fail(FdErrc::permission, ctx + ": server " + rep.message);
    default: fail(FdErrc::refused, ctx + ": server answered an error: " + rep.message);
  }
  std::size_t next = 0, asked = 0;
  for (auto& e : rep.entries) {
    if (e.status == fdwire::Status::ok) {
      if (next < msg.fds.size()) e.fd = std::move(msg.fds[next++]);
      else if (!e.offered) throw_fd_exhausted(ctx, 0);  // MSG_CTRUNC took an fd asked for
    }
    if (!e.offered) {
      if (asked >= req.ids.size() || e.id != req.ids[asked])
        fail(FdErrc::protocol, ctx + ": the answer's entry for allocation " + std::to_string(e.id) +
                                   " is not the one asked for in that place");
      ++asked;
    }
  }
  if (asked != req.ids.size())
    fail(FdErrc::protocol, ctx + ": the answer holds " + std::to_string(asked) + " of the " +
                               std::to_string(req.ids.size()) + " allocations asked for");
  *out = std::move(rep.entries);
  return true;
}

// The error an entry answered with.
inline std::exception_ptr entry_error(const fdwire::Entry& e, std::string_view address) {
  const std::string ctx = where(address, e.id);
  if (e.status == fdwire::Status::unknown_id)
    return std::make_exception_ptr(FdTransferError(
        FdErrc::unknown_id, ctx + ": the server serves no allocation with id " + std::to_string(e.id) +
                                " (freed, or the record is stale)"));
  return std::make_exception_ptr(FdTransferError(
      FdErrc::refused, ctx + ": the server could not duplicate its fd (status " +
                           std::to_string(static_cast<int>(e.status)) + "; out of file descriptors?)"));
}

// Asks the server at `address` for the fds of `ids` (in requests of at most
// fdwire::kMaxBatch), and, when `offer` > 0, for up to `offer` more of its
// allocations along with the first, which are parked (FdTable). Each id
// gets its fd or its own error; a failure of a whole request (no server,
// refused, timeout) throws. A connection is kept again only after a full
// answer; one that failed in any way is closed.
inline std::vector<BatchFetched> ask(std::string_view address, const std::vector<std::uint64_t>& ids, int offer,
                                     std::chrono::milliseconds timeout) {
  std::vector<BatchFetched> out;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  FdConnCache& cache = Process::get().conns();
  for (std::size_t at = 0; at < ids.size();) {
    fdwire::Request req;
    const std::size_t n = std::min(ids.size() - at, fdwire::kMaxBatch);
    req.ids.assign(ids.begin() + static_cast<std::ptrdiff_t>(at), ids.begin() + static_cast<std::ptrdiff_t>(at + n));
    if (at == 0 && offer > 0) req.offer = static_cast<std::uint16_t>(std::min<std::size_t>(offer, fdwire::kMaxBatch - n));
    const std::string ctx = where_many(address, req.ids);
    std::vector<fdwire::Entry> entries;
    UniqueFd sock = cache.take(address);
    if (!sock || !exchange(sock.get(), req, deadline, timeout, ctx, true, &entries)) {
      sock = connect_to(address, deadline, timeout, ctx);
      exchange(sock.get(), req, deadline, timeout, ctx, false, &entries);
    }
    cache.give(address, std::move(sock));
    std::size_t parked = 0;
    for (auto& e : entries) {
      if (e.offered) {
        if (!e.fd) continue;
        Process::get().fds().park(std::string(address), e.id, std::move(e.key), std::move(e.fd));
        ++parked;
        continue;
      }
      BatchFetched b;
      b.id = e.id;
      if (e.fd) b.fd = std::move(e.fd);
      else b.error = entry_error(e, address);
      out.push_back(std::move(b));
    }
    if (req.offer) Process::get().fds().note_offered(address, parked);
    at += n;
  }
  return out;
}

// The fd of `id` from the server at `address`: parked, else asked for,
// with `offer` (-1: FdTable::offer_for) more of its allocations sent
// along and parked.
inline UniqueFd via_socket(std::string_view address, std::uint64_t id, std::chrono::milliseconds timeout,
                           int offer) {
  if (UniqueFd fd = Process::get().fds().take(address, id)) return fd;
  if (offer < 0) offer = Process::get().fds().offer_for(address);  // after the take: it counts the use
  auto r = ask(address, {id}, offer, timeout);
  if (r.size() != 1) fail(FdErrc::protocol, where(address, id) + ": no answer for it");
  if (!r[0].fd) std::rethrow_exception(r[0].error);
  return std::move(r[0].fd);
}

}  // namespace fdclient

// Whether pidfd_getfd is still tried in this process, and why not.
inline int pidfd_fast_path_disabled_errno() noexcept { return fdclient::pidfd_disabled_errno().load(); }

// Obtains a close-on-exec duplicate of the owner's fd for allocation `id`.
// The fd is the caller's (close it when the allocation is no longer needed:
// an fd held is device memory held). Throws FdTransferError (an Unavailable)
// with a reason and a message that says what to change; InvalidArgument for
// a bad address.
inline Fetched fetch(const FdSource& src, std::uint64_t id, const FetchOptions& opt = {}) {
  raise_nofile_limit();
  // Sent along with an earlier answer, or by a batched open (fd_table.hpp).
  if (opt.path != FdPath::pidfd_only)
    if (UniqueFd fd = Process::get().fds().take(src.address, id)) return {std::move(fd), false};
  // The pid must name the owner here too: not so for an owner in another
  // pid namespace (another container), which the socket still reaches.
  const bool fast_possible = src.pid > 0 && src.remote_fd >= 0 && src.identity != FdIdentity{} &&
                             owner_pid_is_ours(src.address);
  if (opt.path == FdPath::pidfd_only ||
      (opt.path == FdPath::automatic && fast_possible && pidfd_fast_path_disabled_errno() == 0)) {
    std::string ctx = "pidfd_getfd of fd " + std::to_string(src.remote_fd) + " (allocation " +
                      std::to_string(id) + ") from pid " + std::to_string(src.pid);
    if (!fast_possible)
      fdclient::fail(FdErrc::pidfd_failed, ctx + ": the source names no pid, fd or identity, or an owner in "
                                                 "another pid namespace (pidfd_getfd needs one pid namespace "
                                                 "and ptrace rights; the socket path needs neither)");
    int err = 0;
    UniqueFd fd = fdclient::try_pidfd(src, &err);
    if (fd && fd_identity(fd.get()) == src.identity) return {std::move(fd), true};
    if (fd) {  // a live process, but that number is another file now
      fd.reset();
      err = ESTALE;
    }
    if (is_fd_exhaustion(err)) throw_fd_exhausted(ctx, err);
    if (err == EPERM || err == EACCES || err == ENOSYS) {
      int expected = 0;  // remember only the first failure
      fdclient::pidfd_disabled_errno().compare_exchange_strong(expected, err);
    }
    if (opt.path == FdPath::pidfd_only)
      fdclient::fail(FdErrc::pidfd_failed,
                     ctx + " failed: " + std::strerror(err) +
                         (err == EPERM || err == EACCES
                              ? " (no ptrace rights over the owner: Yama ptrace_scope, another "
                                "user, or a container without CAP_SYS_PTRACE; pidfd_getfd needs one pid "
                                "namespace and ptrace rights, the socket path needs neither)"
                              : ""),
                     err);
    // ESRCH (owner gone), EBADF/ESTALE (fd closed or reused): the socket
    // answers with the precise reason.
  }
  return {fdclient::via_socket(src.address, id, opt.timeout, opt.offer), false};
}

// The fds of `ids`, all served by the server at `address`, in as few
// requests as SCM_RIGHTS allows (docs/fd-transfer.md, "Batches and
// prefetch"); each id gets its fd or its own error (rethrow it). Parked fds
// are used first. Throws when a request as a whole fails.
inline std::vector<BatchFetched> fetch_many(std::string_view address, const std::vector<std::uint64_t>& ids,
                                            std::chrono::milliseconds timeout = std::chrono::milliseconds(2000),
                                            int offer = 0) {
  raise_nofile_limit();
  std::vector<BatchFetched> out;
  std::vector<std::uint64_t> rest;
  for (std::uint64_t id : ids) {
    if (UniqueFd fd = Process::get().fds().take(address, id)) out.push_back({id, std::move(fd), nullptr});
    else rest.push_back(id);
  }
  if (rest.empty()) return out;
  for (auto& b : fdclient::ask(address, rest, offer, timeout)) out.push_back(std::move(b));
  return out;
}

// The socket path alone, for callers that know only the server's address.
inline UniqueFd fetch_fd(std::string_view address, std::uint64_t id,
                         std::chrono::milliseconds timeout = std::chrono::milliseconds(2000)) {
  raise_nofile_limit();
  return fdclient::via_socket(address, id, timeout, -1);
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
