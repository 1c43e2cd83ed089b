// UniqueFd: the one owner of a POSIX file descriptor.
//
// The cuMem backend keeps device memory alive by holding the fd cuMem exported, so
// an fd leaked or closed twice is memory leaked or freed under a reader. Every
// fd of the fd-transfer layer is therefore owned by exactly one UniqueFd, and
// every fd it creates is close-on-exec: a child a user forks and execs must not
// inherit (and so pin) tensors it never asked for.
#pragma once

#include "memcuda/config.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class UniqueFd {
 public:
  UniqueFd() noexcept = default;
  // Takes ownership of fd (-1 = empty). Does not change its flags: use
  // adopt_cloexec() for an fd from an API that cannot set O_CLOEXEC itself.
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  ~UniqueFd() { reset(); }

  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  // Takes ownership of fd and sets FD_CLOEXEC on it. Returns an empty UniqueFd
  // for fd < 0, so `adopt_cloexec(::some_call())` keeps errno for the caller.
  static UniqueFd adopt_cloexec(int fd) noexcept {
    if (fd >= 0) {
      int saved = errno;
      int flags = ::fcntl(fd, F_GETFD);
      if (flags >= 0 && !(flags & FD_CLOEXEC)) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
      errno = saved;
    }
    return UniqueFd(fd);
  }

  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  explicit operator bool() const noexcept { return valid(); }

  // Gives up ownership without closing.
  [[nodiscard]] int release() noexcept { return std::exchange(fd_, -1); }

  // Closes the held fd (if any) and takes fd. close() is not retried on
  // EINTR: on Linux the fd is released even then, and a retry could close an
  // fd another thread just opened under the same number.
  void reset(int fd = -1) noexcept {
    int old = std::exchange(fd_, fd);
    if (old >= 0) {
      int saved = errno;
      ::close(old);
      errno = saved;
    }
  }

  // A second, close-on-exec descriptor of the same open file (shares offset
  // and status flags). Empty with errno set on failure (EMFILE, ...).
  UniqueFd dup() const noexcept {
    if (fd_ < 0) {
      errno = EBADF;
      return UniqueFd();
    }
    return UniqueFd(::fcntl(fd_, F_DUPFD_CLOEXEC, 0));
  }

 private:
  int fd_ = -1;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
