// The per-process fd limit: raised once, and running out reported as such.
// Standby holders keep one fd per live allocation, so a registry of a few
// thousand tensors passes the common soft limit of 1024; the soft limit is
// raised toward the hard one once per process. mem-cuda polls with poll(),
// never select(), so fds above FD_SETSIZE are fine for us.
#pragma once

#include "memcuda/config.hpp"

#include <sys/resource.h>
#include <dirent.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>

#include "memcuda/detail/fd/fd_error.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// Cap for an unlimited hard limit: the kernel's default fs.nr_open.
inline constexpr rlim_t kMaxNofileSoft = 1048576;

// Raises the soft RLIMIT_NOFILE toward the hard one, once per process (later
// calls return at once, even if the limit was lowered meanwhile: a user who
// lowers it means it). Returns the soft limit as it is now. Never throws.
inline rlim_t raise_nofile_limit() noexcept {
  static std::once_flag once;
  std::call_once(once, [] {
    rlimit rl{};
    if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    rlim_t want = rl.rlim_max == RLIM_INFINITY ? kMaxNofileSoft : rl.rlim_max;
    if (want > kMaxNofileSoft) want = kMaxNofileSoft;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
      rl.rlim_cur = want;
      ::setrlimit(RLIMIT_NOFILE, &rl);  // may fail under a strict sandbox: keep going
    }
  });
  rlimit now{};
  ::getrlimit(RLIMIT_NOFILE, &now);
  return now.rlim_cur;
}

// Number of fds this process has open (-1 if /proc is not readable).
inline long count_open_fds() noexcept {
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return -1;
  long n = 0;
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++n;
  ::closedir(d);
  return n - 1;  // the directory stream's own fd
}

inline bool is_fd_exhaustion(int err) noexcept { return err == EMFILE || err == ENFILE; }

// The message for running out of fds while doing `what` (err: EMFILE, ENFILE,
// or 0 for a control message truncated by the kernel, MSG_CTRUNC, which is
// how recvmsg reports an fd it could not install).
inline std::string fd_exhaustion_message(const std::string& what, int err) {
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  auto lim = [](rlim_t v) { return v == RLIM_INFINITY ? std::string("unlimited") : std::to_string(v); };
  std::string open = std::to_string(count_open_fds());
  if (err == ENFILE)
    return what + ": the system is out of file descriptors (ENFILE, fs.file-max reached); close "
                  "processes or tensors, or raise fs.file-max (sysctl -w fs.file-max=...)";
  std::string head = err == EMFILE ? what + ": this process is out of file descriptors (EMFILE"
                                   : what + ": the kernel could not install the received file "
                                            "descriptor (MSG_CTRUNC), most likely because this "
                                            "process is out of file descriptors (";
  return head + ", " + open + " open, RLIMIT_NOFILE soft " + lim(rl.rlim_cur) + " hard " +
         lim(rl.rlim_max) +
         "); release tensors this process no longer uses, or raise the limit (ulimit -Hn in the "
         "shell that starts it, LimitNOFILE= for a systemd unit, docker run --ulimit nofile=N:N)";
}

[[noreturn]] inline void throw_fd_exhausted(const std::string& what, int err) {
  throw FdTransferError(FdErrc::exhausted, fd_exhaustion_message(what, err), err);
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
