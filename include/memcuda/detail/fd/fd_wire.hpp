// The bytes of the fd-transfer protocol (docs/fd-transfer.md) and the socket
// plumbing shared by fd_server.hpp and fd_client.hpp.
//
// Transport: AF_UNIX, SOCK_SEQPACKET. The kernel keeps message boundaries, so
// one request is one message, a short read cannot split it, and a message
// larger than our buffer is reported (MSG_TRUNC) instead of running into the
// next one: strict parsing needs no framing of our own.
//
// Addresses: "@name" is a Linux abstract socket, anything else a filesystem
// path. The fd service uses a path in the process's runtime directory
// (fd_socket_dir.hpp): a file is reached from other network and pid
// namespaces (containers sharing the directory), and its mode and
// directory follow the peer policy. An abstract name is reached only within
// one network namespace and has no permissions; versions before the
// runtime directory used one, and tests still do. Either way the server
// checks SO_PEERCRED on every connection.
#pragma once

#include "memcuda/config.hpp"

#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "memcuda/detail/fd/unique_fd.hpp"
#include "memcuda/error.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::fdwire {

inline constexpr char kMagic[4] = {'M', 'C', 'F', 'D'};
inline constexpr std::uint8_t kVersion = 1;
inline constexpr std::uint8_t kOpGetFd = 1;
inline constexpr std::size_t kRequestSize = 16;
inline constexpr std::size_t kReplyHeader = 16;
inline constexpr std::size_t kMaxMessage = 512;  // text of an error reply
inline constexpr std::size_t kMaxReply = kReplyHeader + kMaxMessage;

// Reply status byte.
enum class Status : std::uint8_t {
  ok = 0,            // the fd rides along (SCM_RIGHTS), message empty
  bad_request = 1,   // malformed request (size, magic, reserved bytes, op)
  bad_version = 2,   // a version this server does not speak
  unknown_id = 3,    // no fd registered under that id
  refused = 4,       // credentials refused (the uid/gid policy)
  server_error = 5,  // the server failed (out of fds, ...)
};

struct Request {
  std::uint8_t version = kVersion;
  std::uint8_t op = kOpGetFd;
  std::uint64_t id = 0;
};

struct Reply {
  Status status = Status::ok;
  std::uint64_t id = 0;
  std::string message;
};

inline void put_le64(unsigned char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline std::uint64_t get_le64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t{p[i]} << (8 * i);
  return v;
}

// Request: "MCFD" | version u8 | op u8 | reserved u16 = 0 | id u64 LE.
inline std::string encode_request(const Request& r) {
  std::string out(kRequestSize, '\0');
  auto* p = reinterpret_cast<unsigned char*>(out.data());
  std::memcpy(p, kMagic, 4);
  p[4] = r.version;
  p[5] = r.op;
  put_le64(p + 8, r.id);
  return out;
}

// Parses a request. On failure returns the status to answer and sets *why.
// The version is checked before the size so that a future client with a
// longer request still learns "bad version", not "bad request".
inline Status decode_request(std::string_view in, Request* out, std::string* why) {
  auto* p = reinterpret_cast<const unsigned char*>(in.data());
  if (in.size() < 5 || std::memcmp(p, kMagic, 4) != 0) {
    *why = "request does not start with the magic \"MCFD\" (" + std::to_string(in.size()) + " bytes)";
    return Status::bad_request;
  }
  if (p[4] != kVersion) {
    *why = "request version " + std::to_string(p[4]) + " is not supported; this server speaks versions " +
           std::to_string(kVersion) + " and 2";
    return Status::bad_version;
  }
  if (in.size() != kRequestSize) {
    *why = "request is " + std::to_string(in.size()) + " bytes, expected " + std::to_string(kRequestSize);
    return Status::bad_request;
  }
  if (p[5] != kOpGetFd) {
    *why = "unknown request op " + std::to_string(p[5]);
    return Status::bad_request;
  }
  if (p[6] != 0 || p[7] != 0) {
    *why = "reserved request bytes are not zero";
    return Status::bad_request;
  }
  out->version = p[4];
  out->op = p[5];
  out->id = get_le64(p + 8);
  return Status::ok;
}

// Reply: "MCFD" | version u8 | status u8 | message length u16 LE | id u64 LE |
// message bytes (UTF-8, at most kMaxMessage; longer ones are cut).
inline std::string encode_reply(const Reply& r) {
  std::size_t n = r.message.size() < kMaxMessage ? r.message.size() : kMaxMessage;
  std::string out(kReplyHeader + n, '\0');
  auto* p = reinterpret_cast<unsigned char*>(out.data());
  std::memcpy(p, kMagic, 4);
  p[4] = kVersion;
  p[5] = static_cast<unsigned char>(r.status);
  p[6] = static_cast<unsigned char>(n & 0xff);
  p[7] = static_cast<unsigned char>(n >> 8);
  put_le64(p + 8, r.id);
  std::memcpy(p + kReplyHeader, r.message.data(), n);
  return out;
}

// Parses a reply; false (with *why) when it does not follow the protocol.
inline bool decode_reply(std::string_view in, Reply* out, std::string* why) {
  auto* p = reinterpret_cast<const unsigned char*>(in.data());
  if (in.size() < kReplyHeader || std::memcmp(p, kMagic, 4) != 0) {
    *why = "reply of " + std::to_string(in.size()) + " bytes without the \"MCFD\" header";
    return false;
  }
  if (p[4] != kVersion) {
    *why = "reply version " + std::to_string(p[4]) + ", expected " + std::to_string(kVersion);
    return false;
  }
  std::size_t n = p[6] | (std::size_t{p[7]} << 8);
  if (n > kMaxMessage || in.size() != kReplyHeader + n) {
    *why = "reply length field " + std::to_string(n) + " does not match its " + std::to_string(in.size()) + " bytes";
    return false;
  }
  if (p[5] > static_cast<unsigned char>(Status::server_error)) {
    *why = "unknown reply status " + std::to_string(p[5]);
    return false;
  }
  out->status = static_cast<Status>(p[5]);
  out->id = get_le64(p + 8);
  out->message.assign(in.data() + kReplyHeader, n);
  return true;
}

// Fills a sockaddr_un for "@abstract" or a path; throws InvalidArgument for
// an empty or too long address.
inline socklen_t make_address(std::string_view address, sockaddr_un* sa) {
  std::memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  bool abstract = !address.empty() && address[0] == '@';
  std::string_view body = abstract ? address.substr(1) : address;
  // sun_path holds 108 bytes: an abstract name uses one for its leading NUL,
  // a path one for its trailing NUL.
  if (body.empty() || body.size() + 1 > sizeof sa->sun_path)
    throw InvalidArgument("fd server address '" + std::string(address) + "' must be 1.." +
                          std::to_string(sizeof sa->sun_path - 1) + " bytes (\"@name\" or a path)");
  if (body.find('\0') != std::string_view::npos)
    throw InvalidArgument("fd server address must not contain NUL bytes");
  std::memcpy(sa->sun_path + (abstract ? 1 : 0), body.data(), body.size());
  // An abstract name's length is exactly what is given (no trailing NUL).
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + body.size() + 1);
}

inline UniqueFd make_socket() {
  return UniqueFd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
}

// Sends one message, with fd (if >= 0) as SCM_RIGHTS. MSG_NOSIGNAL: a peer
// that went away must not kill the registry's process with SIGPIPE.
inline ssize_t send_message(int sock, std::string_view bytes, int fd = -1) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = ctrl;
    msg.msg_controllen = sizeof ctrl;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  ssize_t n;
  do n = ::sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  return n;
}

// One received message: its bytes, the fds that came with it (each owned,
// close-on-exec through MSG_CMSG_CLOEXEC), and the kernel's flags.
struct Received {
  std::string bytes;
  UniqueFd fd;            // the first fd received, if any
  int extra_fds = 0;      // more fds than the protocol allows (closed)
  bool truncated = false;  // MSG_TRUNC: the message was longer than the buffer
  bool ctrunc = false;     // MSG_CTRUNC: an fd could not be delivered
};

// recvmsg of one message of at most max_bytes; returns -1 with errno on
// failure, 0 on orderly close, else the byte count (>= 0 with r filled).
inline ssize_t recv_message(int sock, std::size_t max_bytes, Received* r) {
  r->bytes.assign(max_bytes + 1, '\0');  // one spare byte to see truncation ourselves
  iovec iov{r->bytes.data(), r->bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * 4)] = {};
  msg.msg_control = ctrl;
  msg.msg_controllen = sizeof ctrl;
  ssize_t n;
  do n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n < 0) return n;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      if (!r->fd) r->fd.reset(fd);
      else {
        ::close(fd);
        ++r->extra_fds;
      }
    }
  }
  r->truncated = (msg.msg_flags & MSG_TRUNC) || static_cast<std::size_t>(n) > max_bytes;
  r->ctrunc = (msg.msg_flags & MSG_CTRUNC) != 0;
  r->bytes.resize(static_cast<std::size_t>(n) > max_bytes ? max_bytes : static_cast<std::size_t>(n));
  return n;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::fdwire
