// The client side of version 2 (fd_wire_batch.hpp): many fds from one
// owner in one request, and the fds it sends along parked (fd_parking.hpp).
//
// A server of an older version answers a version 2 request "bad version" or
// "bad request" (in version 1) and closes the connection: the address is
// then remembered as version 1 only, and its fds are asked for one by one
// as before.
#pragma once

#include "memcuda/config.hpp"

#include <poll.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "memcuda/detail/fd/fd_conn_cache.hpp"
#include "memcuda/detail/fd/fd_connect.hpp"
#include "memcuda/detail/fd/fd_error.hpp"
#include "memcuda/detail/fd/fd_parking.hpp"
#include "memcuda/detail/fd/fd_wire.hpp"
#include "memcuda/detail/fd/fd_wire_batch.hpp"
#include "memcuda/detail/fd/unique_fd.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// One id of a batched fetch: its fd, or the error that answered it.
struct BatchFetched {
  std::uint64_t id = 0;
  UniqueFd fd;
  std::exception_ptr error;  // an FdTransferError (or InvalidArgument) when !fd
};

namespace fdclient {

// Servers that answered version 2 as an older version does.
class V1Servers {
 public:
  static V1Servers& instance() {
    static V1Servers* v = new V1Servers();  // never destroyed, like the caches
    return *v;
  }
  bool has(std::string_view address) {
    std::lock_guard lk(mu_);
    return set_.count(std::string(address)) != 0;
  }
  void add(std::string_view address) {
    std::lock_guard lk(mu_);
    if (set_.size() > 4096) set_.clear();  // bounded; a forgotten one is asked again once
    set_.insert(std::string(address));
  }

 private:
  std::mutex mu_;  // leaf
  std::unordered_set<std::string> set_;
};

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

enum class BatchOutcome { answered, stale, old_server };

// One version 2 request and its answer on `sock`: *out gets one entry per
// id asked for and offered, with the fds. `stale`: a kept connection
// (`reused`) that its server closed; `old_server`: a server that speaks
// version 1 only (it closed the connection). Failures of the whole request
// throw FdTransferError.
inline BatchOutcome exchange_batch(int sock, const fdwire::BatchRequest& req,
                                   std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds timeout,
                                   const std::string& ctx, bool reused, std::vector<fdwire::BatchEntry>* out) {
  FdParking::instance().note_request();
  if (fdwire::send_message(sock, fdwire::encode_batch_request(req)) < 0) {
    if (reused && (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN)) return BatchOutcome::stale;
    if (errno != EPIPE && errno != ECONNRESET)
      fail(FdErrc::system, ctx + ": send failed: " + std::strerror(errno), errno);
  }
  await_answer(sock, deadline, timeout, ctx);
  fdwire::ReceivedMany msg;
  ssize_t got = fdwire::recv_message_fds(sock, fdwire::kMaxReplyBatch, &msg);
  if (reused && (got == 0 || (got < 0 && errno == ECONNRESET))) return BatchOutcome::stale;
  if (got < 0) fail(errno == ECONNRESET ? FdErrc::no_server : FdErrc::system,
                    ctx + ": recvmsg failed: " + std::strerror(errno), errno);
  if (got == 0)
    fail(FdErrc::no_server, ctx + ": the server closed the connection without an answer (the owner is exiting?)");
  // Out of fds here: the kernel installs what fits, in order, and drops the
  // rest. The fds asked for come first, so an answer short of offers only
  // is still whole.
  if (msg.ctrunc && req.offer == 0) throw_fd_exhausted(ctx, 0);
  if (msg.bytes.size() >= 5 && static_cast<unsigned char>(msg.bytes[4]) == fdwire::kVersion) {
    fdwire::Reply rep;
    std::string why;
    if (msg.truncated || !msg.fds.empty() || !fdwire::decode_reply(msg.bytes, &rep, &why))
      fail(FdErrc::protocol, ctx + ": malformed version 1 answer: " + (why.empty() ? "too long or with fds" : why));
    if (rep.status == fdwire::Status::bad_version || rep.status == fdwire::Status::bad_request)
      return BatchOutcome::old_server;
    if (rep.status == fdwire::Status::refused) fail(FdErrc::permission, ctx + ": server " + rep.message);
    fail(FdErrc::refused, ctx + ": server answered an error: " + rep.message);
  }
  fdwire::BatchReply rep;
  std::size_t fds = 0;
  std::string why;
  if (msg.truncated || !fdwire::decode_batch_reply(msg.bytes, &rep, &fds, &why) ||
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
  return BatchOutcome::answered;
}

// The error an entry answered with, as the version 1 path reports it.
inline std::exception_ptr entry_error(const fdwire::BatchEntry& e, std::string_view address) {
  const std::string ctx = where(address, e.id);
  if (e.status == fdwire::Status::unknown_id)
    return std::make_exception_ptr(FdTransferError(
        FdErrc::unknown_id, ctx + ": the server serves no allocation with id " + std::to_string(e.id) +
                                " (freed, or the record is stale)"));
  return std::make_exception_ptr(FdTransferError(
      FdErrc::refused, ctx + ": the server could not duplicate its fd (status " +
                           std::to_string(static_cast<int>(e.status)) + "; out of file descriptors?)"));
}

}  // namespace fdclient

// Asks the server at `address` for the fds of `ids` (in requests of at most
// fdwire::kMaxBatch), and, when `offer` > 0, for up to `offer` more of its
// allocations along with the first, which are parked (FdParking). Each id
// gets its fd or its own error; a failure of a whole request (no server,
// refused, timeout) throws. An older server is asked one id at a time
// through `single` (the version 1 fetch).
template <class Single>
std::vector<BatchFetched> fetch_batch(std::string_view address, const std::vector<std::uint64_t>& ids, int offer,
                                      std::chrono::milliseconds timeout, Single&& single) {
  std::vector<BatchFetched> out;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  FdConnCache& cache = FdConnCache::instance();
  auto one_by_one = [&](std::size_t from) {
    for (std::size_t i = from; i < ids.size(); ++i) {
      BatchFetched b;
      b.id = ids[i];
      try {
        b.fd = single(ids[i]);
      } catch (const std::exception&) {
        b.error = std::current_exception();
      }
      out.push_back(std::move(b));
    }
  };
  if (fdclient::V1Servers::instance().has(address)) {
    one_by_one(0);
    return out;
  }
  for (std::size_t at = 0; at < ids.size();) {
    fdwire::BatchRequest req;
    const std::size_t n = std::min(ids.size() - at, fdwire::kMaxBatch);
    req.ids.assign(ids.begin() + static_cast<std::ptrdiff_t>(at), ids.begin() + static_cast<std::ptrdiff_t>(at + n));
    if (at == 0 && offer > 0) req.offer = static_cast<std::uint16_t>(std::min<std::size_t>(offer, fdwire::kMaxBatch - n));
    const std::string ctx = fdclient::where_many(address, req.ids);
    std::vector<fdwire::BatchEntry> entries;
    auto outcome = fdclient::BatchOutcome::stale;
    UniqueFd sock = cache.take(address);
    if (sock) outcome = fdclient::exchange_batch(sock.get(), req, deadline, timeout, ctx, true, &entries);
    if (outcome == fdclient::BatchOutcome::stale) {
      sock = fdclient::connect_to(address, deadline, timeout, ctx);
      outcome = fdclient::exchange_batch(sock.get(), req, deadline, timeout, ctx, false, &entries);
    }
    if (outcome == fdclient::BatchOutcome::old_server) {
      fdclient::V1Servers::instance().add(address);
      one_by_one(at);
      return out;
    }
    cache.give(address, std::move(sock));
    std::size_t parked = 0;
    for (auto& e : entries) {
      if (e.offered) {
        if (!e.fd) continue;
        FdParking::instance().park(std::string(address), e.id, std::move(e.key), std::move(e.fd));
        ++parked;
        continue;
      }
      BatchFetched b;
      b.id = e.id;
      if (e.fd) b.fd = std::move(e.fd);
      else b.error = fdclient::entry_error(e, address);
      out.push_back(std::move(b));
    }
    if (req.offer) FdParking::instance().note_offered(address, parked);
    at += n;
  }
  return out;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
