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
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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
            "): set MEMCUDA_REDIS_PASSWORD (and MEMCUDA_REDIS_USER for an ACL user) or Options::password; "
            "a password in the URL works too, but on a command line every user sees it in ps",
        prefix));
  // Any refusal of AUTH is about the credentials (Redis 7 answers a password
  // sent to a server without one with a plain ERR).
  if (prefix == "WRONGPASS" || f.what == "AUTH")
    return std::make_exception_ptr(AuthError(
        "Redis at " + server.describe() + " rejected the credentials" +
            (server.user.empty() ? std::string() : " of user '" + server.user + "'") + ": " + text +
            " (check MEMCUDA_REDIS_PASSWORD, the URL's password or Options::password)",
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

// The errno of a failed connect: hiredis's errstr is strerror(errno) taken
// at the failure, more reliable than errno read afterwards (file comment).
inline int connect_errno(const Failure& f) noexcept {
  for (int e : {EACCES, EPERM, ENOENT, ENOTDIR, ECONNREFUSED})
    if (f.text == std::strerror(e)) return e;
  return f.sys_errno;
}

// Why connecting to a unix socket failed, in words an operator can act on:
// a permission problem is not a missing server. Looks at the path (stat) to
// tell a missing directory, a file that is not a socket and a socket nobody
// listens on apart.
inline std::string unix_connect_failure(const std::string& path, int err, std::string_view text) {
  const std::string why = text.empty() ? std::string(std::strerror(err)) : std::string(text);
  const std::string dir = path.substr(0, std::max<std::size_t>(path.rfind('/'), 1));
  struct stat st {};
  if (err == EACCES || err == EPERM)
    return "permission denied connecting to the Redis socket " + path + " (" + why + "): this user (uid " +
           std::to_string(::geteuid()) +
           ") may not write the socket or search a directory above it; run as a user the socket admits "
           "(redis.conf unixsocketperm, e.g. 770 with a shared group) or connect over TCP";
  if (err == ENOENT || err == ENOTDIR) {
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      return "no Redis socket at " + path + ": the directory " + dir +
             " does not exist; start redis-server with `unixsocket " + path + "` or set " + kUrlEnv +
             " to where it listens";
    return "no Redis socket at " + path + " (" + why + "): start redis-server with `unixsocket " + path +
           "` or set " + kUrlEnv + " to where it listens";
  }
  if (err == ECONNREFUSED && ::stat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      return path + " exists but is not a socket, so no Redis listens there; set " + std::string(kUrlEnv) +
             " (or --url) to the socket redis.conf names in `unixsocket`";
    return "no Redis listens on the socket " + path + " (" + why +
           "): a file left by a server that stopped? start redis-server or set " + kUrlEnv +
           " to where it listens";
  }
  return "no Redis answers on " + path + " (" + why + "): start redis-server or set " + kUrlEnv +
         " to where it listens";
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
    if (server.transport == Options::Transport::unix_socket)
      return std::make_exception_ptr(
          ConnectionError("Redis at " + at + ": " + unix_connect_failure(server.path, connect_errno(f), f.text),
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
