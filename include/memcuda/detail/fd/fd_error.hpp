// The error of the fd-transfer layer: one class, a reason a caller can switch
// on, and a message that says what to change.
//
// It derives from Unavailable because that is what the registry reports when a
// tensor's memory exists but cannot be reached from this process; code callers
// that only know the public tree still catch it, and the wire code stays
// "unavailable" (throw_for_code re-raises it as Unavailable elsewhere).
#pragma once

#include "memcuda/config.hpp"

#include <string>

#include "memcuda/error.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

enum class FdErrc {
  no_server,     // nothing listens at the address (owner gone, wrong address)
  permission,    // the server's peer policy refused our uid/gid
  unknown_id,    // the server does not serve that allocation id (any more)
  refused,       // the server answered with another error (bad request, ...)
  timeout,       // no answer within the timeout
  exhausted,     // out of file descriptors (EMFILE/ENFILE, MSG_CTRUNC)
  protocol,      // the answer did not follow docs/fd-transfer.md
  pidfd_failed,  // the pidfd_getfd fast path failed and no fallback was allowed
  system,        // any other failed system call
  runtime_dir,   // the runtime directory is unusable (symlink, other owner, ...)
};

inline const char* to_string(FdErrc e) noexcept {
  switch (e) {
    case FdErrc::no_server: return "no_server";
    case FdErrc::permission: return "permission";
    case FdErrc::unknown_id: return "unknown_id";
    case FdErrc::refused: return "refused";
    case FdErrc::timeout: return "timeout";
    case FdErrc::exhausted: return "exhausted";
    case FdErrc::protocol: return "protocol";
    case FdErrc::pidfd_failed: return "pidfd_failed";
    case FdErrc::system: return "system";
    case FdErrc::runtime_dir: return "runtime_dir";
  }
  return "unknown";
}

class FdTransferError : public Unavailable {
 public:
  FdTransferError(FdErrc reason, const std::string& what, int sys_errno = 0)
      : Unavailable(what), reason_(reason), sys_errno_(sys_errno) {}
  FdErrc reason() const noexcept { return reason_; }
  // errno of the failed call, 0 where none applies (a refusal, a timeout).
  int sys_errno() const noexcept { return sys_errno_; }

 private:
  FdErrc reason_;
  int sys_errno_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
