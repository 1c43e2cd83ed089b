// The fd of a record's allocation, for the kinds whose memory is shared by
// file descriptor (cuda_vmm_fd, host_memfd; docs/fd-transfer.md): one way
// to obtain it, shared by their open() and adopt().
//
// A standby of this process may hold it already (FdHolds); else it is
// fetched from where the record says (fd_source), once that names the
// registry's own fd server of the record's owner (check_fd_source). The fd
// obtained must be the file the source published ((st_dev, st_ino)):
// a server that answers an id with another file is refused, as is a forged
// source, before anything is mapped.
#pragma once

#include "memcuda/config.hpp"

#include <string>

#include "memcuda/detail/fd/fd_client.hpp"
#include "memcuda/detail/fd/fd_holds.hpp"
#include "memcuda/detail/fd/fd_source.hpp"
#include "memcuda/detail/fd/unique_fd.hpp"
#include "memcuda/error.hpp"
#include "memcuda/tensor_info.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// The held fd of `key` (FdHolds), else the one `t.fd_source` names.
// `what` names the tensor in messages. Throws ProtocolError(bad_record)
// for a source that is not the owner's fd server or a file that is not the
// one it published, Lost when the owner has exited and no process of this
// one holds the fd, Unavailable (FdTransferError) for the other transfer
// failures, each with a message that says what to change.
inline UniqueFd record_fd(const TensorInfo& t, const std::string& key, const std::string& what) {
  if (UniqueFd held = FdHolds::instance().dup(key)) return held;
  if (t.fd_source.empty())
    throw Unavailable(what + ": its record has no fd_source (written by a build that shares " + t.alloc_kind +
                      " memory another way?)");
  ServedSource src = decode_fd_source(t.fd_source);
  check_fd_source(src, t.owner_pid, what);
  UniqueFd fd;
  try {
    fd = fetch(src.source, src.id).fd;
  } catch (const FdTransferError& e) {
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
