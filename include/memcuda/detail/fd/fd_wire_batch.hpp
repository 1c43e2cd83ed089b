// Version 2 of the fd-transfer protocol (docs/fd-transfer.md, "Batches and
// prefetch"): one request asks for many allocation ids, one reply carries
// every fd asked for, each id answered on its own, and, when the client
// asks for them, fds of other allocations the server offers along
// (prefetch). Version 1 (fd_wire.hpp) stays as it was: a server answers a
// request in its own version, so an old client never sees these bytes, and
// an old server answers a version 2 request "bad version" or "bad request",
// on which the client goes back to version 1 for that server.
//
// SCM_RIGHTS carries at most 253 fds per message (the kernel's
// SCM_MAX_FD), so a request asks for at most kMaxBatch ids, offers
// included; callers split larger sets.
#pragma once

#include "memcuda/config.hpp"

#include <sys/socket.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/detail/fd/fd_wire.hpp"
#include "memcuda/detail/fd/unique_fd.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::fdwire {

inline constexpr std::uint8_t kVersionBatch = 2;
inline constexpr std::uint8_t kOpGetFds = 2;
inline constexpr std::size_t kMaxBatch = 253;  // SCM_MAX_FD: fds asked for plus offered
inline constexpr std::size_t kMaxRequestBatch = kRequestSize + 8 * kMaxBatch;
inline constexpr std::size_t kMaxKey = 128;  // an entry's allocation key; longer ones are not sent
inline constexpr std::size_t kEntryHeader = 16;
inline constexpr std::size_t kMaxReplyBatch = kReplyHeader + kMaxMessage + kMaxBatch * (kEntryHeader + kMaxKey);
inline constexpr std::uint8_t kEntryOffered = 1;  // entry flag: not asked for, sent along

struct BatchRequest {
  std::vector<std::uint64_t> ids;  // 1..kMaxBatch
  std::uint16_t offer = 0;         // fds of other allocations the client takes along
};

struct BatchEntry {
  std::uint64_t id = 0;
  Status status = Status::ok;
  bool offered = false;
  std::string key;  // the allocation's key ("host:<session>:<id>", "vmm:..."), may be empty
  UniqueFd fd;      // ok entries, once received
};

struct BatchReply {
  Status status = Status::ok;  // of the whole request; entries only when ok
  std::string message;
  std::vector<BatchEntry> entries;
};

// Request: "MCFD" | 2 u8 | op 2 u8 | flags u16 = 0 | count u16 | offer u16 |
// reserved u32 = 0 | count ids u64 LE.
inline std::string encode_batch_request(const BatchRequest& r) {
  // The counts travel as u16: more would wrap into a shorter, wrong request.
  if (r.ids.size() > kMaxBatch || r.offer > kMaxBatch)
    throw InvalidArgument("fd batch request of " + std::to_string(r.ids.size()) + " ids offering " +
                          std::to_string(r.offer) + ", at most " + std::to_string(kMaxBatch));
  std::string out(kRequestSize + 8 * r.ids.size(), '\0');
  auto* p = reinterpret_cast<unsigned char*>(out.data());
  std::memcpy(p, kMagic, 4);
  p[4] = kVersionBatch;
  p[5] = kOpGetFds;
  p[8] = static_cast<unsigned char>(r.ids.size() & 0xff);
  p[9] = static_cast<unsigned char>(r.ids.size() >> 8);
  p[10] = static_cast<unsigned char>(r.offer & 0xff);
  p[11] = static_cast<unsigned char>(r.offer >> 8);
  for (std::size_t i = 0; i < r.ids.size(); ++i) put_le64(p + kRequestSize + 8 * i, r.ids[i]);
  return out;
}

// The magic and version were checked (decode_request's order); the rest here.
inline Status decode_batch_request(std::string_view in, BatchRequest* out, std::string* why) {
  auto* p = reinterpret_cast<const unsigned char*>(in.data());
  if (in.size() < kRequestSize) {
    *why = "version 2 request of " + std::to_string(in.size()) + " bytes, shorter than its header";
    return Status::bad_request;
  }
  if (p[5] != kOpGetFds) {
    *why = "unknown version 2 request op " + std::to_string(p[5]);
    return Status::bad_request;
  }
  const std::size_t count = p[8] | (std::size_t{p[9]} << 8);
  const std::size_t offer = p[10] | (std::size_t{p[11]} << 8);
  if (p[6] || p[7] || p[12] || p[13] || p[14] || p[15]) {
    *why = "reserved request bytes are not zero";
    return Status::bad_request;
  }
  if (count == 0 || count > kMaxBatch || in.size() != kRequestSize + 8 * count) {
    *why = "version 2 request of " + std::to_string(in.size()) + " bytes for " + std::to_string(count) +
           " ids (1.." + std::to_string(kMaxBatch) + ", 8 bytes each after a 16-byte header)";
    return Status::bad_request;
  }
  out->ids.resize(count);
  for (std::size_t i = 0; i < count; ++i) out->ids[i] = get_le64(p + kRequestSize + 8 * i);
  out->offer = static_cast<std::uint16_t>(offer);
  return Status::ok;
}

// Reply: "MCFD" | 2 u8 | status u8 | message length u16 | count u16 | fds
// u16 | reserved u32 | message | count entries, each: id u64 | status u8 |
// flags u8 | key length u16 | reserved u32 | key. The fds ride along in
// entry order, one per ok entry.
inline std::string encode_batch_reply(const BatchReply& r) {
  if (r.entries.size() > kMaxBatch)
    throw InvalidArgument("fd batch reply of " + std::to_string(r.entries.size()) + " entries, at most " +
                          std::to_string(kMaxBatch));
  const std::size_t n = r.message.size() < kMaxMessage ? r.message.size() : kMaxMessage;
  std::size_t size = kReplyHeader + n, fds = 0;
  for (const auto& e : r.entries) {
    size += kEntryHeader + (e.key.size() <= kMaxKey ? e.key.size() : 0);
    fds += e.status == Status::ok;
  }
  std::string out(size, '\0');
  auto* p = reinterpret_cast<unsigned char*>(out.data());
  std::memcpy(p, kMagic, 4);
  p[4] = kVersionBatch;
  p[5] = static_cast<unsigned char>(r.status);
  p[6] = static_cast<unsigned char>(n & 0xff);
  p[7] = static_cast<unsigned char>(n >> 8);
  p[8] = static_cast<unsigned char>(r.entries.size() & 0xff);
  p[9] = static_cast<unsigned char>(r.entries.size() >> 8);
  p[10] = static_cast<unsigned char>(fds & 0xff);
  p[11] = static_cast<unsigned char>(fds >> 8);
  std::memcpy(p + kReplyHeader, r.message.data(), n);
  unsigned char* q = p + kReplyHeader + n;
  for (const auto& e : r.entries) {
    const std::size_t k = e.key.size() <= kMaxKey ? e.key.size() : 0;
    put_le64(q, e.id);
    q[8] = static_cast<unsigned char>(e.status);
    q[9] = e.offered ? kEntryOffered : 0;
    q[10] = static_cast<unsigned char>(k & 0xff);
    q[11] = static_cast<unsigned char>(k >> 8);
    std::memcpy(q + kEntryHeader, e.key.data(), k);
    q += kEntryHeader + k;
  }
  return out;
}

// Parses a version 2 reply (entries without fds); false (with *why) when it
// does not follow the protocol. *fds: how many fds it says ride along.
inline bool decode_batch_reply(std::string_view in, BatchReply* out, std::size_t* fds, std::string* why) {
  auto* p = reinterpret_cast<const unsigned char*>(in.data());
  if (in.size() < kReplyHeader || std::memcmp(p, kMagic, 4) != 0 || p[4] != kVersionBatch) {
    *why = "reply of " + std::to_string(in.size()) + " bytes without a version 2 \"MCFD\" header";
    return false;
  }
  const std::size_t n = p[6] | (std::size_t{p[7]} << 8);
  const std::size_t count = p[8] | (std::size_t{p[9]} << 8);
  *fds = p[10] | (std::size_t{p[11]} << 8);
  if (p[5] > static_cast<unsigned char>(Status::server_error) || n > kMaxMessage || count > kMaxBatch ||
      in.size() < kReplyHeader + n + count * kEntryHeader) {
    *why = "version 2 reply header (status " + std::to_string(p[5]) + ", message " + std::to_string(n) +
           ", entries " + std::to_string(count) + ") does not match its " + std::to_string(in.size()) + " bytes";
    return false;
  }
  out->status = static_cast<Status>(p[5]);
  out->message.assign(in.data() + kReplyHeader, n);
  out->entries.clear();
  std::size_t at = kReplyHeader + n, ok = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (in.size() < at + kEntryHeader) break;
    const unsigned char* q = p + at;
    const std::size_t k = q[10] | (std::size_t{q[11]} << 8);
    if (q[8] > static_cast<unsigned char>(Status::server_error) || k > kMaxKey || in.size() < at + kEntryHeader + k) {
      *why = "version 2 reply entry " + std::to_string(i) + " is malformed";
      return false;
    }
    BatchEntry e;
    e.id = get_le64(q);
    e.status = static_cast<Status>(q[8]);
    e.offered = (q[9] & kEntryOffered) != 0;
    e.key.assign(in.data() + at + kEntryHeader, k);
    ok += e.status == Status::ok;
    out->entries.push_back(std::move(e));
    at += kEntryHeader + k;
  }
  if (out->entries.size() != count || at != in.size() || ok != *fds) {
    *why = "version 2 reply of " + std::to_string(in.size()) + " bytes does not hold its " + std::to_string(count) +
           " entries and " + std::to_string(*fds) + " fds";
    return false;
  }
  return true;
}

// Sends one message with `fds` (at most kMaxBatch) as SCM_RIGHTS.
inline ssize_t send_message_fds(int sock, std::string_view bytes, const std::vector<int>& fds) {
  if (fds.size() <= 1) return send_message(sock, bytes, fds.empty() ? -1 : fds[0]);
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> ctrl(CMSG_SPACE(sizeof(int) * fds.size()) + alignof(cmsghdr));
  msg.msg_control = ctrl.data();
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  ssize_t n;
  do n = ::sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  return n;
}

// One received message with every fd that came along (owned, close-on-exec).
struct ReceivedMany {
  std::string bytes;
  std::vector<UniqueFd> fds;
  bool truncated = false;
  bool ctrunc = false;
};

inline ssize_t recv_message_fds(int sock, std::size_t max_bytes, ReceivedMany* r) {
  r->bytes.assign(max_bytes + 1, '\0');
  iovec iov{r->bytes.data(), r->bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * kMaxBatch)] = {};
  msg.msg_control = ctrl;
  msg.msg_controllen = sizeof ctrl;
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
