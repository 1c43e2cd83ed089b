// The one place where a failure talking to Redis becomes an exception of the
// memcuda::Error tree (memcuda/error.hpp): classify() looks at hiredis's
// error code and errno for an I/O failure, and at the server's error code
// (the reply's first word) for an error reply, never at free message text.
// docs/design.md ("The Redis layer") has the table.
//
// hiredis 0.14 notes that shape this file:
//  * A read that hits SO_RCVTIMEO fails with REDIS_ERR_IO and errno EAGAIN;
//    a connect that hits its timeout with errno ETIMEDOUT. hiredis 1.x has
//    its own REDIS_ERR_TIMEOUT for both.
//  * hiredis writes strerror(errno) into errstr at the failure; errno itself
//    may be overwritten before it returns (a close() of the failed socket
//    while it tries the next address), so errstr equal to strerror(EAGAIN)
//    or strerror(ETIMEDOUT) counts as that errno.
#pragma once

#include "memcuda/config.hpp"

#include <hiredis/hiredis.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>

#include "memcuda/error.hpp"
#include "memcuda/redis/options.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace redis {

namespace detail {
// What Connection::interrupt() makes the interrupted call throw: a
// ConnectionError to callers (redis_code() 0); told apart inside so that a
// reconnect loop stops on it.
class Interrupted : public ConnectionError {
 public:
  using ConnectionError::ConnectionError;
};
}  // namespace detail
using detail::Interrupted;

// A failure to classify: an I/O failure (redis_code != 0, or interrupted)
// or an error reply (redis_code == 0, text is the reply).
struct Failure {
  std::string_view what{};        // what was asked, for the message ("GET", "connect", ...)
  int redis_code = 0;             // hiredis's context error (REDIS_ERR_*); 0 for an error reply
  int sys_errno = 0;              // errno right after the failed call
  std::string_view text{};        // hiredis's errstr, or the error reply's text
  bool connecting = false;        // a connect(2) failed (no server there yet)
  bool interrupted = false;       // Connection::interrupt() ended it
  std::chrono::milliseconds timeout{0};  // the timeout in force, for the message
  std::string_view hint{};        // appended to an error reply's message
};

// The server's error code: the first word of an error reply when it is
// upper case ("ERR", "WRONGTYPE", "NOSCRIPT", ...), else empty (a script's
// redis.error_reply("my failure")).
inline std::string_view error_prefix(std::string_view reply) noexcept {
  std::string_view word = reply.substr(0, reply.find(' '));
  if (word.empty()) return {};
  for (char c : word)
    if (!((c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) return {};
  return word;
}

namespace detail {
inline bool is_timeout(const Failure& f) noexcept {
#ifdef REDIS_ERR_TIMEOUT
  if (f.redis_code == REDIS_ERR_TIMEOUT) return true;
#endif
  if (f.redis_code != REDIS_ERR_IO) return false;
  if (f.sys_errno == EAGAIN || f.sys_errno == EWOULDBLOCK || f.sys_errno == ETIMEDOUT) return true;
  return f.text == std::strerror(EAGAIN) || f.text == std::strerror(ETIMEDOUT);
}

// What to do about the server's conditions that a caller can fix or wait out.
inline std::string_view advice(std::string_view prefix) noexcept {
  if (prefix == "LOADING") return " (the server is loading its dataset: retry shortly)";
  if (prefix == "BUSY") return " (a script is running on the server: wait, or SCRIPT KILL it)";
  if (prefix == "MASTERDOWN") return " (the replica lost its master: wait, or point the URL at the master)";
  if (prefix == "READONLY") return " (this server is a read-only replica: point the URL at the master)";
  if (prefix == "OOM") return " (the server reached maxmemory: free memory or raise maxmemory)";
  return {};
}

inline std::exception_ptr classify_reply(const Options& server, const Failure& f) {
  const std::string prefix(error_prefix(f.text));
  const std::string text(f.text);
  if (prefix == "NOAUTH")
    return std::make_exception_ptr(AuthError(
        "Redis at " + server.describe() + " requires a password (" + text +
            "): give it in the URL (redis://:password@host or redis://user:password@host) "
            "or in Options::password",
        prefix));
  // Any refusal of AUTH is about the credentials (Redis 7 answers a password
  // sent to a server without one with a plain ERR).
  if (prefix == "WRONGPASS" || f.what == "AUTH")
    return std::make_exception_ptr(AuthError(
        "Redis at " + server.describe() + " rejected the credentials" +
            (server.user.empty() ? std::string() : " of user '" + server.user + "'") + ": " + text +
            " (check the password in the URL or Options::password)",
        prefix));
  if (prefix == "NOPERM")
    return std::make_exception_ptr(AuthError(
        "Redis at " + server.describe() + " does not let user '" +
            (server.user.empty() ? std::string("default") : server.user) + "' run " + std::string(f.what) +
            ": " + text + " (grant it with ACL SETUSER, or connect as another user)",
        prefix));
  return std::make_exception_ptr(ReplyError("Redis at " + server.describe() + " refused " +
                                                std::string(f.what) + ": " + text +
                                                std::string(advice(prefix)) + std::string(f.hint),
                                            prefix));
}

inline std::exception_ptr classify_io(const Options& server, const Failure& f) {
  const std::string at = server.describe();
  const std::string what(f.what);
  const int code = f.redis_code, err = f.sys_errno;
  if (f.interrupted)
    return std::make_exception_ptr(
        Interrupted("'" + what + "' to Redis at " + at + " was interrupted (Connection::interrupt)", code, err));
  const std::string why = f.text.empty() ? std::string("connection closed") : std::string(f.text);
  if (f.connecting) {
    if (is_timeout(f))
      return std::make_exception_ptr(TimeoutError("connecting to Redis at " + at + " timed out after " +
                                                      std::to_string(f.timeout.count()) +
                                                      " ms (connect_timeout): is the address right and the "
                                                      "server up?",
                                                  code, err));
    return std::make_exception_ptr(ConnectionError("no Redis at " + at + " (" + why +
                                                       "): start redis-server or set " + kUrlEnv +
                                                       " to where it listens",
                                                   code, err));
  }
  if (is_timeout(f))
    return std::make_exception_ptr(TimeoutError("Redis at " + at + " did not answer '" + what + "' within " +
                                                    std::to_string(f.timeout.count()) +
                                                    " ms (command_timeout): the server is busy or stopped",
                                                code, err));
  if (code == REDIS_ERR_PROTOCOL)
    return std::make_exception_ptr(ConnectionError(
        "Redis protocol error during '" + what + "' with " + at + ": " + why + " (connection dropped)", code, err));
  if (code == REDIS_ERR_OOM)
    return std::make_exception_ptr(ConnectionError(
        "out of memory reading the reply to '" + what + "' from " + at + " (connection dropped)", code, err));
  return std::make_exception_ptr(ConnectionError(
      "lost connection to Redis at " + at + " during '" + what + "': " +
          (code == REDIS_ERR_EOF ? std::string("the server closed the connection") : why) +
          " (server restarted or stopped?)",
      code, err));
}
}  // namespace detail

// The exception for a failure, as an exception_ptr so that a pipeline can
// hand out one per command without slicing:
//   interrupted                      -> Interrupted (a ConnectionError)
//   REDIS_ERR_TIMEOUT, or REDIS_ERR_IO with EAGAIN/EWOULDBLOCK/ETIMEDOUT
//                                    -> TimeoutError
//   any other I/O failure (IO, EOF, PROTOCOL, OOM, OTHER)
//                                    -> ConnectionError, keeping the code
//   error reply NOAUTH/WRONGPASS/NOPERM, or any to AUTH
//                                    -> AuthError, keeping the prefix
//   any other error reply            -> ReplyError, keeping the prefix
// Messages name the server (never the password) and say what to do.
inline std::exception_ptr classify(const Options& server, const Failure& f) {
  if (f.redis_code != 0 || f.interrupted || f.connecting) return detail::classify_io(server, f);
  return detail::classify_reply(server, f);
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::redis
