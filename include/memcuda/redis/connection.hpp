// A synchronous Redis connection over hiredis: RAII, move-only, with connect
// and command timeouts, AUTH/SELECT, reconnect with bounded backoff,
// pipelining and Lua scripts run by EVALSHA with a NOSCRIPT fallback.
//
// Thread safety: a Connection is used by one thread at a time. mem-cuda gives
// every thread that talks to Redis its own Connection (the control thread has
// its own, the client API serialises on a mutex).
#pragma once

#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "memcuda/error.hpp"
#include "memcuda/redis/options.hpp"

namespace memcuda::redis {

namespace detail {
struct ContextDeleter {
  void operator()(redisContext* c) const noexcept { redisFree(c); }
};
struct ReplyDeleter {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using ContextPtr = std::unique_ptr<redisContext, ContextDeleter>;
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

inline timeval to_timeval(std::chrono::milliseconds ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}
}  // namespace detail

// Non-owning view of one node of a reply tree.
class ReplyView {
 public:
  explicit ReplyView(const redisReply* r) noexcept : r_(r) {}

  int type() const noexcept { return r_->type; }
  bool is_nil() const noexcept { return r_->type == REDIS_REPLY_NIL; }
  bool is_error() const noexcept { return r_->type == REDIS_REPLY_ERROR; }
  bool is_array() const noexcept { return r_->type == REDIS_REPLY_ARRAY; }
  bool is_integer() const noexcept { return r_->type == REDIS_REPLY_INTEGER; }
  bool is_string() const noexcept {
    return r_->type == REDIS_REPLY_STRING || r_->type == REDIS_REPLY_STATUS;
  }

  // Bulk/status string bytes (binary-safe). Throws ReplyError on other types.
  std::string_view str() const {
    if (!is_string() && !is_error()) throw ReplyError("expected a string reply, got " + type_name());
    return {r_->str, r_->len};
  }
  long long integer() const {
    if (!is_integer()) throw ReplyError("expected an integer reply, got " + type_name());
    return r_->integer;
  }
  std::size_t size() const noexcept { return is_array() ? r_->elements : 0; }
  ReplyView operator[](std::size_t i) const {
    if (i >= size()) throw ReplyError("reply array index out of range");
    return ReplyView(r_->element[i]);
  }
  // nil -> nullopt; string -> value.
  std::optional<std::string> opt_str() const {
    if (is_nil()) return std::nullopt;
    return std::string(str());
  }

  std::string type_name() const {
    switch (r_->type) {
      case REDIS_REPLY_STRING: return "string";
      case REDIS_REPLY_ARRAY: return "array";
      case REDIS_REPLY_INTEGER: return "integer";
      case REDIS_REPLY_NIL: return "nil";
      case REDIS_REPLY_STATUS: return "status";
      case REDIS_REPLY_ERROR: return "error '" + std::string(r_->str, r_->len) + "'";
      default: return "type " + std::to_string(r_->type);
    }
  }

 private:
  const redisReply* r_;
};

// Owning reply (move-only). Error replies never reach the caller as a Reply:
// Connection turns them into ReplyError.
class Reply {
 public:
  Reply() = default;
  explicit Reply(redisReply* r) noexcept : p_(r) {}
  explicit operator bool() const noexcept { return p_ != nullptr; }
  ReplyView view() const noexcept { return ReplyView(p_.get()); }

  bool is_nil() const noexcept { return view().is_nil(); }
  std::string_view str() const { return view().str(); }
  long long integer() const { return view().integer(); }
  std::size_t size() const noexcept { return view().size(); }
  ReplyView operator[](std::size_t i) const { return view()[i]; }
  std::optional<std::string> opt_str() const { return view().opt_str(); }

 private:
  detail::ReplyPtr p_;
};

// One argument of a command: bytes, converted from strings and integers.
class Arg {
 public:
  Arg(std::string_view s) noexcept : view_(s) {}                       // NOLINT
  Arg(const std::string& s) noexcept : view_(s) {}                     // NOLINT
  Arg(const char* s) noexcept : view_(s) {}                            // NOLINT
  template <class I>
    requires(std::is_integral_v<I> && !std::is_same_v<I, bool> && !std::is_same_v<I, char>)
  Arg(I v) : own_(std::to_string(v)), view_(own_) {}                   // NOLINT
  Arg(const Arg& o) : own_(o.own_), view_(o.owns() ? std::string_view(own_) : o.view_) {}
  Arg& operator=(const Arg&) = delete;
  std::string_view view() const noexcept { return view_; }

 private:
  bool owns() const noexcept { return !own_.empty() && view_.data() == own_.data(); }
  std::string own_;
  std::string_view view_;
};

using Command = std::vector<std::string>;

class Connection {
 public:
  // Connects (and AUTHs, SELECTs). Throws ConnectionError (with the URL and
  // what to do), AuthError or TimeoutError.
  explicit Connection(Options opts) : opts_(std::move(opts)) { connect_once(); }

  Connection(Connection&&) noexcept = default;
  Connection& operator=(Connection&&) noexcept = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection() = default;

  const Options& options() const noexcept { return opts_; }
  bool connected() const noexcept { return ctx_ && ctx_->err == 0; }

  // Runs one command; error replies throw ReplyError (AuthError for NOAUTH/
  // WRONGPASS). A broken connection is re-established first (bounded by
  // Options::reconnect_timeout); a command that fails in flight is not
  // retried, because it may have run.
  Reply command(std::span<const Arg> args) { return run(args, std::nullopt); }
  Reply command(std::initializer_list<Arg> args) {
    return command(std::span<const Arg>(args.begin(), args.size()));
  }
  Reply command(const Command& args) {
    std::vector<Arg> a(args.begin(), args.end());
    return command(std::span<const Arg>(a));
  }

  // A blocking command (BLMOVE, BLPOP, ...): the socket waits `block` on top
  // of the command timeout.
  Reply blocking(std::chrono::milliseconds block, std::initializer_list<Arg> args) {
    return run(std::span<const Arg>(args.begin(), args.size()), block);
  }

  // Sends all commands in one write and reads all replies. An error reply
  // of one command does not stop the others: each is returned as an
  // exception_ptr in `errors` (when given) or the first is thrown at the end.
  std::vector<Reply> pipeline(const std::vector<Command>& cmds,
                              std::vector<std::exception_ptr>* errors = nullptr) {
    ensure_connected();
    for (const auto& c : cmds) {
      auto [argv, lens] = to_argv(std::vector<Arg>(c.begin(), c.end()));
      if (redisAppendCommandArgv(ctx_.get(), static_cast<int>(argv.size()), argv.data(),
                                 lens.data()) != REDIS_OK)
        fail_io("pipeline");
    }
    std::vector<Reply> out;
    out.reserve(cmds.size());
    std::exception_ptr first;
    if (errors) errors->assign(cmds.size(), nullptr);
    for (std::size_t i = 0; i < cmds.size(); ++i) {
      void* r = nullptr;
      if (redisGetReply(ctx_.get(), &r) != REDIS_OK) fail_io("pipeline");
      Reply rep(static_cast<redisReply*>(r));
      if (rep.view().is_error()) {
        auto e = reply_error(rep.view().str());
        if (errors) (*errors)[i] = e;
        else if (!first) first = e;
      }
      out.push_back(std::move(rep));
    }
    if (first) std::rethrow_exception(first);
    return out;
  }

  // Drops the socket and connects again now (used after a Redis restart).
  void reconnect() {
    ctx_.reset();
    connect_with_backoff();
  }

  // Interrupts a command blocked in another thread (e.g. at stop): the
  // blocked call fails with ConnectionError and the next one reconnects.
  // Safe to call from another thread: it touches only the socket.
  void interrupt() noexcept {
    if (ctx_ && ctx_->fd >= 0) ::shutdown(ctx_->fd, SHUT_RDWR);
  }

  // Number of times this connection was re-established after a break.
  std::uint64_t reconnects() const noexcept { return reconnects_; }

 private:
  static std::pair<std::vector<const char*>, std::vector<std::size_t>> to_argv(
      std::span<const Arg> args) {
    std::pair<std::vector<const char*>, std::vector<std::size_t>> r;
    r.first.reserve(args.size());
    r.second.reserve(args.size());
    for (const auto& a : args) {
      r.first.push_back(a.view().data());
      r.second.push_back(a.view().size());
    }
    return r;
  }

  Reply run(std::span<const Arg> args, std::optional<std::chrono::milliseconds> block) {
    ensure_connected();
    if (block) set_timeout(opts_.command_timeout + *block);
    auto [argv, lens] = to_argv(args);
    void* r = redisCommandArgv(ctx_.get(), static_cast<int>(argv.size()), argv.data(), lens.data());
    if (!r) fail_io(args.empty() ? "command" : std::string(args[0].view()));
    if (block) set_timeout(opts_.command_timeout);
    Reply rep(static_cast<redisReply*>(r));
    if (rep.view().is_error()) std::rethrow_exception(reply_error(rep.view().str()));
    return rep;
  }

  void set_timeout(std::chrono::milliseconds t) {
    if (redisSetTimeout(ctx_.get(), detail::to_timeval(t)) != REDIS_OK) fail_io("set timeout");
  }

  // Error replies as typed exceptions (an exception_ptr, so pipelines can
  // hand them out per command without slicing).
  static std::exception_ptr reply_error(std::string_view msg) {
    std::string m(msg);
    if (m.starts_with("NOAUTH") || m.starts_with("WRONGPASS"))
      return std::make_exception_ptr(
          AuthError("Redis refused the command: " + m +
                    " (give the password in the URL: redis://user:password@host)"));
    return std::make_exception_ptr(ReplyError("Redis error reply: " + m));
  }

  // The context is dead when hiredis flagged an error or the peer closed the
  // socket while we were idle (a restart): a readable socket with nothing
  // expected means EOF. Checking before sending means no command is sent
  // into a dead socket, so none is executed twice.
  bool socket_dead() const noexcept {
    if (!ctx_ || ctx_->err) return true;
    pollfd p{ctx_->fd, POLLIN, 0};
    int n = ::poll(&p, 1, 0);
    if (n <= 0) return false;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return true;
    char b;
    return ::recv(ctx_->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
  }

  void ensure_connected() {
    if (!socket_dead()) return;
    ctx_.reset();
    connect_with_backoff();
    ++reconnects_;
  }

  void connect_with_backoff() {
    using clock = std::chrono::steady_clock;
    auto deadline = clock::now() + opts_.reconnect_timeout;
    auto delay = std::max(opts_.reconnect_backoff, std::chrono::milliseconds(1));
    for (;;) {
      try {
        connect_once();
        return;
      } catch (const AuthError&) {
        throw;  // retrying a wrong password only delays the error
      } catch (const RedisError&) {
        if (clock::now() + delay > deadline) throw;
      }
      std::this_thread::sleep_for(delay);
      delay = std::min(delay * 2, std::chrono::milliseconds(250));
    }
  }

  [[noreturn]] void fail_io(const std::string& what) {
    std::string msg = ctx_ ? std::string(ctx_->errstr) : "no connection";
    int err = ctx_ ? ctx_->err : REDIS_ERR_IO;
    int saved_errno = errno;
    ctx_.reset();  // hiredis contexts are unusable after an I/O error
    if (err == REDIS_ERR_IO && (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK ||
                                saved_errno == ETIMEDOUT || msg.find("timed out") != std::string::npos))
      throw TimeoutError("Redis at " + opts_.describe() + " did not answer '" + what + "' within " +
                         std::to_string(opts_.command_timeout.count()) + " ms");
    if (err == REDIS_ERR_PROTOCOL) throw RedisError("Redis protocol error during '" + what + "': " + msg);
    throw ConnectionError("lost connection to Redis at " + opts_.describe() + " during '" + what +
                          "': " + (msg.empty() ? "connection closed" : msg));
  }

  void connect_once() {
    auto tv = detail::to_timeval(opts_.connect_timeout);
    redisContext* raw = opts_.transport == Options::Transport::unix_socket
                            ? redisConnectUnixWithTimeout(opts_.path.c_str(), tv)
                            : redisConnectWithTimeout(opts_.host.c_str(), opts_.port, tv);
    if (!raw) throw ConnectionError("cannot allocate a Redis context");
    detail::ContextPtr c(raw);
    if (c->err) {
      std::string why = c->errstr;
      bool timeout = why.find("timed out") != std::string::npos || errno == ETIMEDOUT ||
                     errno == EINPROGRESS;
      if (timeout)
        throw TimeoutError("connecting to Redis at " + opts_.describe() + " timed out after " +
                           std::to_string(opts_.connect_timeout.count()) + " ms");
      throw ConnectionError("no Redis at " + opts_.describe() + " (" + why +
                            "): start redis-server or set " + kUrlEnv);
    }
    ctx_ = std::move(c);
    set_timeout(opts_.command_timeout);
    if (opts_.transport == Options::Transport::tcp) redisEnableKeepAlive(ctx_.get());
    try {
      if (!opts_.password.empty()) {
        if (opts_.user.empty()) run_raw({"AUTH", opts_.password});
        else run_raw({"AUTH", opts_.user, opts_.password});
      }
      if (opts_.db != 0) run_raw({"SELECT", opts_.db});
    } catch (const ReplyError& e) {
      std::string m = e.what();
      ctx_.reset();
      if (m.find("WRONGPASS") != std::string::npos || m.find("invalid password") != std::string::npos ||
          m.find("invalid username") != std::string::npos ||
          m.find("without any password") != std::string::npos)
        throw AuthError("Redis at " + opts_.describe() + " rejected the credentials" +
                        (opts_.user.empty() ? std::string() : " of user '" + opts_.user + "'") +
                        ": " + m.substr(m.find(':') + 2) + " (check the password in the URL)");
      throw;
    }
  }

  void run_raw(std::initializer_list<Arg> args) {
    auto [argv, lens] = to_argv(std::span<const Arg>(args.begin(), args.size()));
    void* r = redisCommandArgv(ctx_.get(), static_cast<int>(argv.size()), argv.data(), lens.data());
    if (!r) fail_io(std::string(args.begin()->view()));
    Reply rep(static_cast<redisReply*>(r));
    if (rep.view().is_error()) throw ReplyError("Redis error reply: " + std::string(rep.view().str()));
  }

  Options opts_;
  detail::ContextPtr ctx_;
  std::uint64_t reconnects_ = 0;
};

// A Lua script run by EVALSHA; loads itself on first use and again after
// NOSCRIPT (a Redis restart flushes the script cache). Keys and arguments
// are passed as data, never spliced into the source, so names are
// binary-safe.
class Script {
 public:
  explicit Script(std::string source) : source_(std::move(source)) {}

  const std::string& source() const noexcept { return source_; }

  Reply eval(Connection& c, std::span<const Arg> keys, std::span<const Arg> args) const {
    if (sha_.empty()) load(c);
    auto run = [&] {
      std::vector<Arg> argv;
      argv.reserve(3 + keys.size() + args.size());
      std::string nkeys = std::to_string(keys.size());
      argv.emplace_back("EVALSHA");
      argv.emplace_back(std::string_view(sha_));
      argv.emplace_back(std::string_view(nkeys));
      for (const auto& k : keys) argv.push_back(k);
      for (const auto& a : args) argv.push_back(a);
      return c.command(std::span<const Arg>(argv));
    };
    try {
      return run();
    } catch (const ReplyError& e) {
      if (std::string_view(e.what()).find("NOSCRIPT") == std::string_view::npos) throw;
      load(c);
      return run();
    }
  }
  Reply eval(Connection& c, std::initializer_list<Arg> keys, std::initializer_list<Arg> args) const {
    return eval(c, std::span<const Arg>(keys.begin(), keys.size()),
                std::span<const Arg>(args.begin(), args.size()));
  }

 private:
  void load(Connection& c) const {
    Reply r = c.command({"SCRIPT", "LOAD", source_});
    sha_ = std::string(r.str());
  }

  std::string source_;
  // SHA1 of the source as the server reports it (the same on every server).
  // Filled on first use: a Script belongs to one thread, like a Connection.
  mutable std::string sha_;
};

}  // namespace memcuda::redis
