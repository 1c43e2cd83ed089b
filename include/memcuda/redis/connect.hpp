// Establishing a redis::Connection: one attempt (TCP or a unix socket, with
// the connect timeout; keepalive on TCP; AUTH with the password or the first
// line of its file, read at each attempt so that a rotated secret takes
// effect; SELECT), and the loop that re-establishes a broken connection within
// Options::reconnect_timeout, backing off between attempts. These are private
// members of Connection, kept apart from its commands and I/O
// (connection.hpp): they run only before a command is sent, and decide which
// failures are worth retrying.
//
// Part of connection.hpp, which includes this file; include that one.
#pragma once

#include <hiredis/hiredis.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <fstream>
#include <initializer_list>
#include <new>
#include <string>

#include "memcuda/error.hpp"
#include "memcuda/redis/connection.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace redis {

// Attempts until Options::reconnect_timeout is spent. Wrong credentials
// and refused SELECTs are not retried: waiting does not fix them.
inline void Connection::connect_with_backoff() {
  using clock = std::chrono::steady_clock;
  using ms = std::chrono::milliseconds;
  const auto start = clock::now();
  const auto deadline = start + opts_.reconnect_timeout;
  auto delay = std::max(opts_.reconnect_backoff, ms(1));
  for (;;) {
    auto left = std::chrono::duration_cast<ms>(deadline - clock::now());
    try {
      connect_once(std::min(std::max(left, ms(10)), opts_.connect_timeout));
      return;
    } catch (const AuthError&) {
      throw;
    } catch (const detail::Interrupted&) {
      throw;
    } catch (const ConnectionError& e) {
      if (clock::now() + delay > deadline)
        throw ConnectionError(gave_up(start) + e.what(), e.redis_code(), e.sys_errno());
    } catch (const TimeoutError& e) {
      if (clock::now() + delay > deadline)
        throw TimeoutError(gave_up(start) + e.what(), e.redis_code(), e.sys_errno());
    }
    {
      std::unique_lock lk(intr_->m);
      if (intr_->cv.wait_for(lk, delay, [&] { return intr_->pending; })) {
        intr_->pending = false;
        lk.unlock();
        fail_interrupted("reconnect");
      }
    }
    delay = std::min(delay * 2, ms(250));
  }
}

inline std::string Connection::gave_up(std::chrono::steady_clock::time_point start) const {
  auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  return "gave up reconnecting after " + std::to_string(spent.count()) + " ms (reconnect_timeout " +
         std::to_string(opts_.reconnect_timeout.count()) + " ms): ";
}

inline void Connection::connect_once(std::chrono::milliseconds timeout) {
  if (!opts_.cluster.empty()) return connect_via_cluster(timeout);  // cluster.hpp
  if (opts_.sentinels.empty()) return connect_to(opts_, timeout);
  connect_via_sentinels(timeout);  // sentinel.hpp
}

// Connects to the server `at` names, with opts_'s credentials and db.
inline void Connection::connect_to(const Options& at, std::chrono::milliseconds timeout) {
  auto tv = detail::to_timeval(timeout);
  errno = 0;
  redisContext* raw = at.transport == Options::Transport::unix_socket
                          ? redisConnectUnixWithTimeout(at.path.c_str(), tv)
                          : redisConnectWithTimeout(at.host.c_str(), at.port, tv);
  int e = errno;
  if (!raw) throw std::bad_alloc();
  detail::ContextPtr c(raw);
  if (c->err)
    std::rethrow_exception(classify(at, Failure{.what = "connect",
                                                   .redis_code = c->err,
                                                   .sys_errno = e,
                                                   .text = c->errstr,
                                                   .connecting = true,
                                                   .timeout = timeout}));
  adopt(std::move(c));
  server_ = at.transport == Options::Transport::tcp ? at.host + ":" + std::to_string(at.port) : at.path;
  set_timeout(opts_.command_timeout, "connect");
  if (at.transport == Options::Transport::tcp) redisEnableKeepAlive(ctx_.get());
  const std::string password = opts_.password_file.empty() ? opts_.password : read_password_file();
  if (!password.empty()) {
    Reply r = opts_.user.empty() ? handshake({"AUTH", password}) : handshake({"AUTH", opts_.user, password});
    if (r.is_error()) {
      auto err = reply_error("AUTH", r.view().str());
      drop();
      std::rethrow_exception(err);
    }
  }
  if (opts_.db != 0) {
    Reply r = handshake({"SELECT", opts_.db});
    if (r.is_error()) {
      auto err = reply_error("SELECT " + std::to_string(opts_.db), r.view().str(),
                             " (the server has fewer databases; see `databases` in redis.conf)");
      drop();
      std::rethrow_exception(err);
    }
  }
}

// The first line of Options::password_file, read now (a rotated secret
// counts from the next connect). An unreadable file is an AuthError:
// waiting does not fix it, and the message names the file.
inline std::string Connection::read_password_file() {
  std::ifstream in(opts_.password_file);
  std::string line;
  if (!in || !std::getline(in, line)) {
    const int e = errno;
    drop();
    throw AuthError("cannot read the Redis password file " + opts_.password_file + ": " +
                    (e ? std::strerror(e) : "empty file"));
  }
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return line;
}

// One command during connect; error replies come back as replies.
inline Reply Connection::handshake(std::initializer_list<Arg> args) {
  std::string buf;
  detail::append_resp(buf, args);
  return exchange(buf, std::string(args.begin()->view()));
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::redis

#include "memcuda/redis/sentinel.hpp"  // IWYU pragma: export
#include "memcuda/redis/cluster.hpp"   // IWYU pragma: export
