// The text form of "where an allocation's fd can be had": the "fd_source"
// field of a cuda_vmm_fd record and the values of the per-namespace
// allocations Hash (docs/protocol.md, docs/fd-transfer.md).
//
//   v1;<served id>;<pid>;<fd number>;<st_dev>;<st_ino>;<fd server address>
//
// The address is last because it is the one part that may contain ';'
// (a filesystem path). Every number is decimal. pid 0, fd -1 or identity
// 0;0 turn the pidfd fast path off for that source (fetch() then asks the
// socket only).
#pragma once

#include "memcuda/config.hpp"

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "memcuda/detail/fd/fd_access.hpp"
#include "memcuda/detail/fd/fd_client.hpp"
#include "memcuda/detail/fd/fd_socket_dir.hpp"
#include "memcuda/error.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// An FdSource and the id its server serves the fd under.
struct ServedSource {
  std::uint64_t id = 0;
  FdSource source;
  bool operator==(const ServedSource& o) const {
    return id == o.id && source.address == o.source.address && source.pid == o.source.pid &&
           source.remote_fd == o.source.remote_fd && source.identity == o.source.identity;
  }
};

inline std::string encode_fd_source(const ServedSource& s) {
  return "v1;" + std::to_string(s.id) + ";" + std::to_string(s.source.pid) + ";" + std::to_string(s.source.remote_fd) +
         ";" + std::to_string(static_cast<std::uint64_t>(s.source.identity.dev)) + ";" +
         std::to_string(static_cast<std::uint64_t>(s.source.identity.ino)) + ";" + s.source.address;
}

// Throws ProtocolError(bad_record) naming what is wrong.
[[noreturn]] inline void bad_fd_source(std::string_view text, const std::string& why) {
  throw ProtocolError(ProtocolErrc::bad_record, "fd source \"" + std::string(text.substr(0, 120)) + "\": " + why);
}

inline ServedSource decode_fd_source(std::string_view text) {
  auto bad = [&](const std::string& why) { bad_fd_source(text, why); };
  std::string_view rest = text;
  auto next = [&]() -> std::string_view {
    auto p = rest.find(';');
    if (p == std::string_view::npos) bad("has fewer than 7 ';'-separated parts");
    std::string_view part = rest.substr(0, p);
    rest.remove_prefix(p + 1);
    return part;
  };
  auto number = [&](std::string_view part, const char* what, auto* out) {
    std::int64_t v = 0;
    auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (ec != std::errc() || ptr != part.data() + part.size() || part.empty())
      bad(std::string(what) + " is \"" + std::string(part) + "\", not a decimal number");
    *out = static_cast<std::remove_pointer_t<decltype(out)>>(v);
  };
  if (next() != "v1") bad("unknown version (expected \"v1;...\")");
  ServedSource s;
  std::uint64_t id = 0;
  {
    auto part = next();
    auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), id);
    if (ec != std::errc() || ptr != part.data() + part.size() || part.empty())
      bad("served id is \"" + std::string(part) + "\", not a decimal number");
  }
  s.id = id;
  number(next(), "pid", &s.source.pid);
  number(next(), "fd number", &s.source.remote_fd);
  std::uint64_t dev = 0, ino = 0;
  for (auto* out : {&dev, &ino}) {
    auto part = next();
    auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), *out);
    if (ec != std::errc() || ptr != part.data() + part.size() || part.empty())
      bad("file identity part \"" + std::string(part) + "\" is not a decimal number");
  }
  s.source.identity = {static_cast<dev_t>(dev), static_cast<ino_t>(ino)};
  if (rest.empty()) bad("names no fd server address");
  s.source.address = std::string(rest);
  return s;
}

// Whether `a` is an address FdService gives the fd server of process
// `pid`: a socket of the runtime directory `dir` named for that pid
// ("<dir>/fd-<pid>-<pid ns>-<16 hex>.sock").
inline bool is_registry_fd_address(std::string_view a, std::int64_t pid, std::string_view dir) {
  auto s = parse_socket_path(a, dir);
  return s && s->pid == pid;
}

// A source read from Redis is used only when it names what the registry
// itself serves: the fd server of the process `owner_pid` (the record's
// owner) under FdService's naming, in this process's own runtime directory
// `dir`, and an fd of that same process. Throws ProtocolError(bad_record)
// otherwise, before anything is connected to or taken from another process.
inline void check_fd_source(const ServedSource& s, std::int64_t owner_pid, const std::string& what,
                            std::string_view dir) {
  if (s.source.pid != owner_pid || !is_registry_fd_address(s.source.address, owner_pid, dir))
    throw ProtocolError(ProtocolErrc::bad_record,
                        what + ": its fd source (pid " + std::to_string(s.source.pid) + ", server '" +
                            s.source.address.substr(0, 120) + "') is not the fd server of its owner (pid " +
                            std::to_string(owner_pid) + ") in this process's runtime directory ('" +
                            std::string(dir) + "/fd-" + std::to_string(owner_pid) +
                            "-<pid ns>-<16 hex>.sock'); refused (a record edited in Redis, or "
                            "processes configured with different runtime directories?)");
}
// The same against the process's runtime directory (FdService::pin).
inline void check_fd_source(const ServedSource& s, std::int64_t owner_pid, const std::string& what) {
  check_fd_source(s, owner_pid, what, process_fd_access().runtime_dir);
}

// The ipc_handle of a cuda_vmm_fd allocation: "vmm:<owner session>:<alloc
// id>", NUL-padded to the 64 bytes every cuda record's ipc_handle has (so
// readers of any version decode the record and fail, if at all, on its
// alloc_kind). It never changes, adoptions included: it names the memory.
inline std::string vmm_handle(const std::string& session, std::uint64_t alloc_id) {
  std::string h = "vmm:" + session + ":" + std::to_string(alloc_id);
  if (h.size() > 64) throw InternalError("vmm handle '" + h + "' longer than 64 bytes");
  h.resize(64, '\0');
  return h;
}

// The handle without its padding: the field name in the allocations Hash.
inline std::string vmm_key(std::string_view handle) {
  auto end = handle.find('\0');
  return std::string(handle.substr(0, end));
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
