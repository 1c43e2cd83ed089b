// The fd of a record's allocation, for the kinds whose memory is shared by
// file descriptor (cuda_vmm_fd, host_memfd): one way to obtain it, shared
// by their open() and adopt(). A standby's held fd first, else fetched from
// the record's fd_source once that names its owner's fd server; the fd must
// be the file the source published, before anything is mapped
// (docs/fd-transfer.md).
#pragma once

#include "memcuda/config.hpp"

#include <cerrno>
#include <string>

#include "memcuda/detail/fd/fd_client.hpp"
#include "memcuda/detail/fd/fd_table.hpp"
#include "memcuda/detail/process/process.hpp"
#include "memcuda/detail/fd/fd_source.hpp"
#include "memcuda/detail/fd/unique_fd.hpp"
#include "memcuda/error.hpp"
#include "memcuda/tensor_info.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// Whether a failed transfer says that this system refuses fd transfer
// itself (not that this owner or this fd could not be had): the pidfd
// path refused with no socket path allowed, or a unix socket call failed
// with an error of policy or of a missing facility.
inline bool refuses_fd_transfer(const FdTransferError& e) noexcept {
  if (e.reason() == FdErrc::pidfd_failed) return true;
  if (e.reason() != FdErrc::system) return false;
  const int n = e.sys_errno();
  return n == EPERM || n == EACCES || n == ENOSYS || n == EAFNOSUPPORT || n == EPROTONOSUPPORT || n == EOPNOTSUPP;
}

// The held fd of `key` (FdTable), else the one `t.fd_source` names.
// `what` names the tensor in messages. Throws ProtocolError(bad_record)
// for a source that is not the owner's fd server or a file that is not the
// one it published, Lost when the owner has exited and no process of this
// one holds the fd, KindUnavailable(no_fd_support) when the system refuses
// fd transfer, Unavailable (FdTransferError) for the other transfer
// failures, each with a message that says what to change.
inline UniqueFd record_fd(const TensorInfo& t, const std::string& key, const std::string& what) {
  if (UniqueFd held = Process::get().fds().dup(key)) return held;
  if (t.fd_source.empty())
    throw Unavailable(what + ": its record has no fd_source, so no process can hand this reader the memory's fd "
                             "(a record written by hand or by another program?)");
  ServedSource src = decode_fd_source(t.fd_source);
  check_fd_source(src, t.owner_pid, what);
  UniqueFd fd;
  try {
    fd = fetch(src.source, src.id).fd;
  } catch (const FdTransferError& e) {
    if (refuses_fd_transfer(e))
      throw KindUnavailable(KindErrc::no_fd_support, t.alloc_kind,
                            what + ": this process cannot receive the fd of a " + t.alloc_kind +
                                " allocation: the system refuses fd transfer here (" + e.what() +
                                "); a seccomp or LSM policy that denies unix sockets, SCM_RIGHTS or pidfd_getfd "
                                "must allow them for processes that share memory by fd");
    // Nothing listens: the owner's process is gone (its socket file went
    // with it, or refuses connections). A standby that held the fd adopts it at the takeover, which
    // republishes the record.
    if (e.reason() != FdErrc::no_server) throw;
    throw Lost(what + ": its allocator of record (pid " + std::to_string(t.owner_pid) +
               ") has exited and this process holds no fd of it (" + e.what() +
               "); unless a standby adopts it at the takeover (get again then), it is lost");
  }
  if (src.source.identity != FdIdentity{} && fd_identity(fd.get()) != src.source.identity)
    throw ProtocolError(ProtocolErrc::bad_record,
                        what + ": the fd its owner serves under id " + std::to_string(src.id) +
                            " is not the file its fd source names (st_dev " +
                            std::to_string(static_cast<std::uint64_t>(src.source.identity.dev)) + ", st_ino " +
                            std::to_string(static_cast<std::uint64_t>(src.source.identity.ino)) +
                            "); refused (a record edited in Redis?)");
  return fd;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
