// The bytes of the fd-transfer protocol and the socket plumbing shared by
// fd_server.hpp and fd_client.hpp: AF_UNIX, SOCK_SEQPACKET (one message a
// request, no framing of our own), "@name" an abstract socket, anything
// else a path. docs/fd-transfer.md, "Bytes on the wire", says why, and why a
// request asks for at most kMaxBatch ids (SCM_MAX_FD).
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
#include <vector>

#include "memcuda/detail/fd/unique_fd.hpp"
#include "memcuda/error.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::fdwire {

inline constexpr char kMagic[4] = {'M', 'C', 'F', 'D'};
inline constexpr std::uint8_t kVersion = 1;
inline constexpr std::uint8_t kOpGetFds = 1;
inline constexpr std::size_t kHeader = 16;       // of a request and of a reply
inline constexpr std::size_t kMaxMessage = 512;  // a reply's text
inline constexpr std::size_t kMaxBatch = 253;    // SCM_MAX_FD: fds asked for plus offered
inline constexpr std::size_t kMaxKey = 128;      // an entry's allocation key; longer ones are not sent
inline constexpr std::size_t kEntryHeader = 16;
inline constexpr std::size_t kMaxRequest = kHeader + 8 * kMaxBatch;
inline constexpr std::size_t kMaxReply = kHeader + kMaxMessage + kMaxBatch * (kEntryHeader + kMaxKey);
inline constexpr std::uint8_t kEntryOffered = 1;  // entry flag: not asked for, sent along

// A reply's status byte, and each entry's.
enum class Status : std::uint8_t {
  ok = 0,            // the fd rides along (SCM_RIGHTS)
  bad_request = 1,   // malformed request (size, magic, reserved bytes, op, count, fds sent along)
  bad_version = 2,   // a version this server does not speak
  unknown_id = 3,    // no fd registered under that id
  refused = 4,       // credentials refused (the uid/gid policy)
  server_error = 5,  // the server failed (out of fds, ...)
};

struct Request {
  std::vector<std::uint64_t> ids;  // 1..kMaxBatch
  std::uint16_t offer = 0;         // fds of other allocations the client takes along
};

struct Entry {
  std::uint64_t id = 0;
  Status status = Status::ok;
  bool offered = false;
  std::string key;  // the allocation's key ("host:<session>:<id>", "vmm:..."), may be empty
  UniqueFd fd;      // ok entries, once received
};

struct Reply {
  Status status = Status::ok;  // of the whole request; entries only when ok
  std::string message;
  std::vector<Entry> entries;
};

inline void put_le16(unsigned char* p, std::size_t v) {
  p[0] = static_cast<unsigned char>(v & 0xff);
  p[1] = static_cast<unsigned char>((v >> 8) & 0xff);
}
inline std::size_t get_le16(const unsigned char* p) { return p[0] | (std::size_t{p[1]} << 8); }
inline void put_le64(unsigned char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline std::uint64_t get_le64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t{p[i]} << (8 * i);
  return v;
}

// Request: "MCFD" | version u8 | op u8 | flags u16 = 0 | count u16 | offer
// u16 | reserved u32 = 0 | count ids u64 LE.
inline std::string encode_request(const Request& r) {
  // The counts travel as u16: more would wrap into a shorter, wrong request.
  if (r.ids.size() > kMaxBatch || r.offer > kMaxBatch)
    throw InvalidArgument("fd request of " + std::to_string(r.ids.size()) + " ids offering " +
                          std::to_string(r.offer) + ", at most " + std::to_string(kMaxBatch));
  std::string out(kHeader + 8 * r.ids.size(), '\0');
  auto* p = reinterpret_cast<unsigned char*>(out.data());
  std::memcpy(p, kMagic, 4);
  p[4] = kVersion;
  p[5] = kOpGetFds;
  put_le16(p + 8, r.ids.size());
  put_le16(p + 10, r.offer);
  for (std::size_t i = 0; i < r.ids.size(); ++i) put_le64(p + kHeader + 8 * i, r.ids[i]);
  return out;
}

// Parses a request. On failure returns the status to answer and sets *why.
// The version is checked before the size so that a client of another
// version learns "bad version", not "bad request".
inline Status decode_request(std::string_view in, Request* out, std::string* why) {
  auto* p = reinterpret_cast<const unsigned char*>(in.data());
  if (in.size() < 5 || std::memcmp(p, kMagic, 4) != 0) {
    *why = "request does not start with the magic \"MCFD\" (" + std::to_string(in.size()) + " bytes)";
    return Status::bad_request;
  }
  if (p[4] != kVersion) {
    *why = "request version " + std::to_string(p[4]) + " is not supported; this server speaks version " +
           std::to_string(kVersion);
    return Status::bad_version;
  }
  if (in.size() < kHeader) {
    *why = "request of " + std::to_string(in.size()) + " bytes, shorter than its header";
    return Status::bad_request;
  }
  if (p[5] != kOpGetFds) {
    *why = "unknown request op " + std::to_string(p[5]);
    return Status::bad_request;
  }
  if (p[6] || p[7] || p[12] || p[13] || p[14] || p[15]) {
    *why = "reserved request bytes are not zero";
    return Status::bad_request;
  }
  const std::size_t count = get_le16(p + 8);
  if (count == 0 || count > kMaxBatch) {
    *why = "request for " + std::to_string(count) + " ids (1.." + std::to_string(kMaxBatch) + ")";
    return Status::bad_request;
  }
  if (in.size() != kHeader + 8 * count) {
    *why = "request of " + std::to_string(in.size()) + " bytes for " + std::to_string(count) +
           " ids (8 bytes each after a 16-byte header)";
    return Status::bad_request;
  }
  out->ids.resize(count);
  for (std::size_t i = 0; i < count; ++i) out->ids[i] = get_le64(p + kHeader + 8 * i);
  out->offer = static_cast<std::uint16_t>(get_le16(p + 10));
  return Status::ok;
}

// Reply: "MCFD" | version u8 | status u8 | message length u16 | count u16 |
// fds u16 | reserved u32 | message (UTF-8, cut at kMaxMessage) | count
// entries, each: id u64 | status u8 | flags u8 | key length u16 | reserved
// u32 | key. The fds ride along in entry order, one per ok entry.
inline std::string encode_reply(const Reply& r) {
  if (r.entries.size() > kMaxBatch)
    throw InvalidArgument("fd reply of " + std::to_string(r.entries.size()) + " entries, at most " +
                          std::to_string(kMaxBatch));
  const std::size_t n = r.message.size() < kMaxMessage ? r.message.size() : kMaxMessage;
  std::size_t size = kHeader + n, fds = 0;
  for (const auto& e : r.entries) {
    size += kEntryHeader + (e.key.size() <= kMaxKey ? e.key.size() : 0);
    fds += e.status == Status::ok;
  }
  std::string out(size, '\0');
  auto* p = reinterpret_cast<unsigned char*>(out.data());
  std::memcpy(p, kMagic, 4);
  p[4] = kVersion;
  p[5] = static_cast<unsigned char>(r.status);
  put_le16(p + 6, n);
  put_le16(p + 8, r.entries.size());
  put_le16(p + 10, fds);
  std::memcpy(p + kHeader, r.message.data(), n);
  unsigned char* q = p + kHeader + n;
  for (const auto& e : r.entries) {
    const std::size_t k = e.key.size() <= kMaxKey ? e.key.size() : 0;
    put_le64(q, e.id);
    q[8] = static_cast<unsigned char>(e.status);
    q[9] = e.offered ? kEntryOffered : 0;
    put_le16(q + 10, k);
    std::memcpy(q + kEntryHeader, e.key.data(), k);
    q += kEntryHeader + k;
  }
  return out;
}

// Parses a reply (entries without fds); false (with *why) when it does not
// follow the protocol. *fds: how many fds it says ride along.
inline bool decode_reply(std::string_view in, Reply* out, std::size_t* fds, std::string* why) {
  auto* p = reinterpret_cast<const unsigned char*>(in.data());
  if (in.size() < kHeader || std::memcmp(p, kMagic, 4) != 0 || p[4] != kVersion) {
    *why = "reply of " + std::to_string(in.size()) + " bytes without a version " + std::to_string(kVersion) +
           " \"MCFD\" header";
    return false;
  }
  const std::size_t n = get_le16(p + 6);
  const std::size_t count = get_le16(p + 8);
  *fds = get_le16(p + 10);
  if (p[5] > static_cast<unsigned char>(Status::server_error) || n > kMaxMessage || count > kMaxBatch ||
      in.size() < kHeader + n + count * kEntryHeader) {
    *why = "reply header (status " + std::to_string(p[5]) + ", message " + std::to_string(n) + ", entries " +
           std::to_string(count) + ") does not match its " + std::to_string(in.size()) + " bytes";
    return false;
  }
  out->status = static_cast<Status>(p[5]);
  out->message.assign(in.data() + kHeader, n);
  out->entries.clear();
  std::size_t at = kHeader + n, ok = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (in.size() < at + kEntryHeader) break;
    const unsigned char* q = p + at;
    const std::size_t k = get_le16(q + 10);
    if (q[8] > static_cast<unsigned char>(Status::server_error) || k > kMaxKey || in.size() < at + kEntryHeader + k) {
      *why = "reply entry " + std::to_string(i) + " is malformed";
      return false;
    }
    Entry e;
    e.id = get_le64(q);
    e.status = static_cast<Status>(q[8]);
    e.offered = (q[9] & kEntryOffered) != 0;
    e.key.assign(in.data() + at + kEntryHeader, k);
    ok += e.status == Status::ok;
    out->entries.push_back(std::move(e));
    at += kEntryHeader + k;
  }
  if (out->entries.size() != count || at != in.size() || ok != *fds) {
    *why = "reply of " + std::to_string(in.size()) + " bytes does not hold its " + std::to_string(count) +
           " entries and " + std::to_string(*fds) + " fds";
    return false;
  }
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

// Sends one message with `fds` (at most kMaxBatch) as SCM_RIGHTS.
// MSG_NOSIGNAL: a peer that went away must not kill the registry's process
// with SIGPIPE.
inline ssize_t send_message(int sock, std::string_view bytes, const std::vector<int>& fds = {}) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> ctrl(fds.empty() ? 0 : CMSG_SPACE(sizeof(int) * fds.size()) + alignof(cmsghdr));
  if (!fds.empty()) {
    msg.msg_control = ctrl.data();
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do n = ::sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  return n;
}

// One received message: its bytes, every fd that came along (owned,
// close-on-exec through MSG_CMSG_CLOEXEC), and the kernel's flags.
struct Received {
  std::string bytes;
  std::vector<UniqueFd> fds;
  bool truncated = false;  // MSG_TRUNC: the message was longer than the buffer
  bool ctrunc = false;     // MSG_CTRUNC: an fd could not be delivered
};

// recvmsg of one message of at most max_bytes and max_fds fds (the kernel
// drops more, with MSG_CTRUNC); returns -1 with errno on failure, 0 on
// orderly close, else the byte count (with r filled).
inline ssize_t recv_message(int sock, std::size_t max_bytes, Received* r, std::size_t max_fds = kMaxBatch) {
  r->bytes.assign(max_bytes + 1, '\0');  // one spare byte to see truncation ourselves
  iovec iov{r->bytes.data(), r->bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * kMaxBatch)] = {};
  msg.msg_control = ctrl;
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * (max_fds < kMaxBatch ? max_fds : kMaxBatch));
  ssize_t n;
  do n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n < 0) return n;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      r->fds.emplace_back(fd);
    }
  }
  r->truncated = (msg.msg_flags & MSG_TRUNC) || static_cast<std::size_t>(n) > max_bytes;
  r->ctrunc = (msg.msg_flags & MSG_CTRUNC) != 0;
  r->bytes.resize(static_cast<std::size_t>(n) > max_bytes ? max_bytes : static_cast<std::size_t>(n));
  return n;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::fdwire
