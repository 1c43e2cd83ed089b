// Connection::pipeline(): commands sent in one write, their replies read
// in order; on a cluster, a slot that moved or is busy answers every
// command so, and then none ran, so the whole batch is sent again.
//
// Part of connection.hpp, which includes this file; include that one.
#pragma once

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "memcuda/error.hpp"
#include "memcuda/redis/connection.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace redis {

inline std::vector<Reply> Connection::pipeline(const std::vector<Command>& cmds,
                                              std::vector<std::exception_ptr>* errors) {
  std::string buf;
  for (const auto& c : cmds) {
    if (c.empty()) throw InvalidArgument("Redis pipeline: empty command");
    detail::append_resp(buf, c);
  }
  const std::string what = "pipeline of " + std::to_string(cmds.size()) + " commands";
  if (errors) errors->assign(cmds.size(), nullptr);
  const auto until = std::chrono::steady_clock::now() + opts_.reconnect_timeout;
  std::vector<Reply> out;
  do {  // a cluster's slot that moved or is busy answers every command so, and none ran
    ensure_connected(what);
    if (cmds.empty()) return {};
    in_flight_ = true;
    send_all(buf, what);
    out.clear();
    for (std::size_t i = 0; i < cmds.size(); ++i) out.push_back(read_reply(what));
    in_flight_ = false;
    for (const auto& r : out)  // a demoted primary: the next command asks the sentinels again
      if (primary_lost(r)) drop();
  } while (std::all_of(out.begin(), out.end(), [&](const Reply& r) { return cluster_retry(r); }) &&
           follow_cluster(out.front(), buf, what, until));
  follow_ask(out, cmds, what);
  std::exception_ptr first;
  for (std::size_t i = 0; i < cmds.size(); ++i) {
    if (!out[i].is_error()) continue;
    auto e = reply_error(command_name(cmds[i].front()) + " (command " + std::to_string(i + 1) + " of a " + what + ")",
                         out[i].view().str());
    if (errors) (*errors)[i] = e;
    else if (!first) first = e;
  }
  if (first) std::rethrow_exception(first);
  return out;
}

// Only the receive timeout changes (one setsockopt each way).
inline std::vector<Reply> Connection::pipeline(const std::vector<Command>& cmds,
                                              std::vector<std::exception_ptr>* errors,
                                              std::chrono::milliseconds wait) {
  if (!ctx_) ensure_connected("pipeline");
  auto set_rcv = [&](std::chrono::milliseconds t) {
    timeval tv = detail::to_timeval(t);
    if (::setsockopt(ctx_->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0) {
      int e = errno;
      fail_io("pipeline", REDIS_ERR_IO, e, "cannot set the socket timeout: " + std::string(std::strerror(e)));
    }
    timeout_ = t;
  };
  set_rcv(blocking_timeout(wait));
  auto restore = [&] {
    if (!ctx_) return;  // an I/O failure dropped the socket, timeout and all
    timeval tv = detail::to_timeval(opts_.command_timeout);
    if (::setsockopt(ctx_->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0)
      timeout_ = opts_.command_timeout;
    else
      drop();
  };
  std::vector<Reply> out;
  try {
    out = pipeline(cmds, errors);  // a dead socket is replaced here, with the command timeout
  } catch (...) {
    restore();
    throw;
  }
  restore();
  return out;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::redis
