// A synchronous Redis connection over hiredis: RAII, move-only, with connect
// and command timeouts, AUTH/SELECT, reconnect with bounded backoff,
// pipelining and Lua scripts run by EVALSHA with a NOSCRIPT fallback.
//
// Thread safety: a Connection is used by one thread at a time, except for
// interrupt(), which any thread may call. mem-cuda gives every thread that
// talks to Redis its own Connection (the control thread has its own, the
// client API serialises on a mutex).
//
// hiredis 0.14 notes that shape this file:
//  * hiredis writes with write(2): a write to a socket the peer reset raises
//    SIGPIPE, which kills a process that did not ignore it. Commands are
//    therefore formatted here and sent with send(MSG_NOSIGNAL); hiredis only
//    reads the replies.
//  * A read that hits SO_RCVTIMEO fails with REDIS_ERR_IO and errno EAGAIN
//    ("Resource temporarily unavailable"); a connect that hits its timeout
//    fails with errno ETIMEDOUT ("Connection timed out"). The context is
//    unusable afterwards, so it is dropped and a fresh one made later.
//  * redisReconnect() reuses the connect timeout as-is and does not restore
//    the socket timeout, so a fresh context is made instead.
//  * Its sockets are not close-on-exec; a forked child would keep the
//    connection open (and a server that died would look alive to it).
#pragma once

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "memcuda/error.hpp"
#include "memcuda/redis/options.hpp"

namespace memcuda::redis {

// A wait for Connection::blocking() meaning "as long as the server blocks"
// (e.g. BLPOP key 0); only interrupt() ends it early.
inline constexpr std::chrono::milliseconds kWaitForever = std::chrono::milliseconds::max();

namespace detail {
struct ContextDeleter {
  void operator()(redisContext* c) const noexcept { redisFree(c); }
};
struct ReplyDeleter {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using ContextPtr = std::unique_ptr<redisContext, ContextDeleter>;
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

// Zero (or negative) gives {0, 0}, which SO_RCVTIMEO reads as "no timeout".
inline timeval to_timeval(std::chrono::milliseconds ms) {
  timeval tv{};
  if (ms.count() <= 0) return tv;
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

// What interrupt() needs, shared with the thread that calls it: the socket
// (published under the mutex, withdrawn before it is closed, so a shutdown
// never hits a reused descriptor) and a pending flag that makes the command
// in flight, or else the next one, fail.
struct InterruptState {
  std::mutex m;
  std::condition_variable cv;
  int fd = -1;
  bool pending = false;
};

// What interrupt() makes the interrupted call throw: a ConnectionError to
// callers; told apart inside so that a reconnect loop stops on it.
class Interrupted : public ConnectionError {
 public:
  using ConnectionError::ConnectionError;
};

// SHA-1 (FIPS 180-4) of a script, as Redis names it in EVALSHA.
inline std::string sha1_hex(std::string_view data) {
  std::uint32_t h[5] = {0x67452301u, 0xEFCDAB89u, 0x98BADCFEu, 0x10325476u, 0xC3D2E1F0u};
  std::string m(data);
  const std::uint64_t bits = static_cast<std::uint64_t>(data.size()) * 8;
  m.push_back(static_cast<char>(0x80));
  while (m.size() % 64 != 56) m.push_back('\0');
  for (int i = 7; i >= 0; --i) m.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  for (std::size_t off = 0; off < m.size(); off += 64) {
    std::uint32_t w[80];
    for (int i = 0; i < 16; ++i) {
      auto b = [&](int k) { return static_cast<std::uint32_t>(static_cast<unsigned char>(m[off + 4 * i + k])); };
      w[i] = (b(0) << 24) | (b(1) << 16) | (b(2) << 8) | b(3);
    }
    for (int i = 16; i < 80; ++i) w[i] = std::rotl(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    std::uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    for (int i = 0; i < 80; ++i) {
      std::uint32_t f, k;
      if (i < 20) { f = (b & c) | (~b & d); k = 0x5A827999u; }
      else if (i < 40) { f = b ^ c ^ d; k = 0x6ED9EBA1u; }
      else if (i < 60) { f = (b & c) | (b & d) | (c & d); k = 0x8F1BBCDCu; }
      else { f = b ^ c ^ d; k = 0xCA62C1D6u; }
      std::uint32_t t = std::rotl(a, 5) + f + e + k + w[i];
      e = d; d = c; c = std::rotl(b, 30); b = a; a = t;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e;
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(40);
  for (auto v : h)
    for (int s = 28; s >= 0; s -= 4) out += kHex[(v >> s) & 15];
  return out;
}
}  // namespace detail

// Non-owning view of one node of a reply tree. Valid while the Reply that
// owns the tree lives. A view of no reply (from an empty Reply) is of no
// type: its accessors throw ReplyError.
class ReplyView {
 public:
  explicit ReplyView(const redisReply* r) noexcept : r_(r) {}

  // REDIS_REPLY_* constant; 0 for a view of no reply.
  int type() const noexcept { return r_ ? r_->type : 0; }
  bool is_nil() const noexcept { return type() == REDIS_REPLY_NIL; }
  bool is_error() const noexcept { return type() == REDIS_REPLY_ERROR; }
  bool is_array() const noexcept { return type() == REDIS_REPLY_ARRAY; }
  bool is_integer() const noexcept { return type() == REDIS_REPLY_INTEGER; }
  bool is_string() const noexcept {
    return type() == REDIS_REPLY_STRING || type() == REDIS_REPLY_STATUS;
  }

  // Bulk/status/error string bytes (binary-safe). Throws ReplyError on other types.
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
    if (i >= size())
      throw ReplyError("reply array index " + std::to_string(i) + " out of range (size " +
                       std::to_string(size()) + ", " + type_name() + ")");
    return ReplyView(r_->element[i]);
  }
  // nil -> nullopt; string -> value.
  std::optional<std::string> opt_str() const {
    if (is_nil()) return std::nullopt;
    return std::string(str());
  }

  std::string type_name() const {
    if (!r_) return "no reply";
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

// Owning reply (move-only). Connection::command turns error replies into
// ReplyError; only Connection::pipeline hands out error replies (is_error()).
// A default-constructed or moved-from Reply is empty: operator bool is false
// and the accessors throw ReplyError.
class Reply {
 public:
  Reply() = default;
  explicit Reply(redisReply* r) noexcept : p_(r) {}
  explicit operator bool() const noexcept { return p_ != nullptr; }
  ReplyView view() const noexcept { return ReplyView(p_.get()); }

  int type() const noexcept { return view().type(); }
  bool is_nil() const noexcept { return view().is_nil(); }
  bool is_error() const noexcept { return view().is_error(); }
  bool is_array() const noexcept { return view().is_array(); }
  bool is_integer() const noexcept { return view().is_integer(); }
  bool is_string() const noexcept { return view().is_string(); }
  std::string_view str() const { return view().str(); }
  long long integer() const { return view().integer(); }
  std::size_t size() const noexcept { return view().size(); }
  ReplyView operator[](std::size_t i) const { return view()[i]; }
  std::optional<std::string> opt_str() const { return view().opt_str(); }
  std::string type_name() const { return view().type_name(); }

 private:
  detail::ReplyPtr p_;
};

// One argument of a command: bytes, converted from strings and integers.
// Lvalue strings, string_views and C strings are viewed: their bytes must
// outlive the Arg. A temporary std::string is moved in and owned, so
// `std::vector<Arg> v{make_key()}` does not dangle.
class Arg {
 public:
  Arg(std::string_view s) noexcept : view_(s) {}                       // NOLINT
  Arg(const std::string& s) noexcept : view_(s) {}                     // NOLINT
  Arg(std::string&& s) noexcept : own_(std::move(s)), view_(own_) {}   // NOLINT
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
  // Connects (and AUTHs, SELECTs) once, without retrying. Throws
  // InvalidArgument (Options::validate), ConnectionError (with the URL and
  // what to do), AuthError, TimeoutError, or ReplyError (SELECT refused).
  explicit Connection(Options opts)
      : opts_(std::move(opts)), intr_(std::make_unique<detail::InterruptState>()) {
    opts_.validate();
    connect_once(opts_.connect_timeout);
  }

  // Moves leave the source empty(): destroying it is safe, using it throws
  // ConnectionError. No other thread may interrupt() either side meanwhile.
  Connection(Connection&&) noexcept = default;
  Connection& operator=(Connection&&) noexcept = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection() { drop(); }

  const Options& options() const noexcept { return opts_; }
  // True while a socket is open and hiredis saw no error on it (a server that
  // went away since the last command is only noticed by the next one).
  bool connected() const noexcept { return ctx_ && ctx_->err == 0; }
  // True for a moved-from connection.
  bool empty() const noexcept { return intr_ == nullptr; }

  // True when the next user can trust this connection: a socket hiredis saw
  // no error on, no command left half-done and no interrupt pending. Every
  // ConnectionError, TimeoutError and Interrupted drops the socket, so after
  // any of them this is false (ConnectionPool closes such a connection
  // rather than lending it again). An error reply leaves it true.
  bool reusable() const noexcept {
    if (!intr_ || !ctx_ || ctx_->err || in_flight_) return false;
    std::lock_guard lk(intr_->m);
    return !intr_->pending;
  }

  // Runs one command; error replies throw ReplyError (AuthError for NOAUTH/
  // WRONGPASS). A broken connection is re-established first (bounded by
  // Options::reconnect_timeout); a command that fails in flight is not
  // retried, because it may have run. I/O failures throw TimeoutError
  // (no answer within command_timeout) or ConnectionError; either way the
  // socket is dropped and the next command reconnects. An empty command
  // throws InvalidArgument.
  Reply command(std::span<const Arg> args) { return run(args, std::nullopt); }
  Reply command(std::initializer_list<Arg> args) {
    return command(std::span<const Arg>(args.begin(), args.size()));
  }
  Reply command(const Command& args) {
    std::vector<Arg> a(args.begin(), args.end());
    return command(std::span<const Arg>(a));
  }

  // A blocking command (BLMOVE, BLPOP, ...): the socket waits `block` on top
  // of the command timeout, so pass the same wait as in the command.
  // kWaitForever (for a server-side timeout of 0) disables the socket
  // timeout for this command; only interrupt() ends it early. The command
  // timeout is back in force afterwards, whatever the outcome.
  Reply blocking(std::chrono::milliseconds block, std::span<const Arg> args) { return run(args, block); }
  Reply blocking(std::chrono::milliseconds block, std::initializer_list<Arg> args) {
    return run(std::span<const Arg>(args.begin(), args.size()), block);
  }

  // Sends all commands in one write and reads all replies, in order. An error
  // reply of one command does not stop the others: each is returned as an
  // exception_ptr in `errors` (when given; its reply is_error()) or the first
  // is thrown once all replies are read. An I/O failure throws as command()
  // does; the commands sent may or may not have run.
  std::vector<Reply> pipeline(const std::vector<Command>& cmds,
                              std::vector<std::exception_ptr>* errors = nullptr) {
    std::string buf;
    for (const auto& c : cmds) {
      if (c.empty()) throw InvalidArgument("Redis pipeline: empty command");
      append_resp(buf, c);
    }
    if (errors) errors->assign(cmds.size(), nullptr);
    ensure_connected();
    if (cmds.empty()) return {};
    const std::string what = "pipeline of " + std::to_string(cmds.size()) + " commands";
    in_flight_ = true;
    send_all(buf, what);
    std::vector<Reply> out;
    out.reserve(cmds.size());
    std::exception_ptr first;
    for (std::size_t i = 0; i < cmds.size(); ++i) {
      Reply rep = read_reply(what);
      if (rep.is_error()) {
        auto e = reply_error(rep.view().str());
        if (errors) (*errors)[i] = e;
        else if (!first) first = e;
      }
      out.push_back(std::move(rep));
    }
    in_flight_ = false;
    if (first) std::rethrow_exception(first);
    return out;
  }

  // Drops the socket and connects again now (used after a Redis restart),
  // retrying within Options::reconnect_timeout.
  void reconnect() {
    ensure_not_moved();
    drop();
    connect_with_backoff();
  }

  // Makes the command in flight in another thread (e.g. a BLPOP at stop)
  // fail promptly with ConnectionError, or, when none is in flight, the next
  // command; the one after that reconnects. Ends a reconnect backoff too; a
  // connect(2) under way finishes first (bounded by connect_timeout).
  // Safe to call from any thread while the connection lives.
  void interrupt() noexcept {
    if (!intr_) return;
    std::lock_guard lk(intr_->m);
    intr_->pending = true;
    if (intr_->fd >= 0) ::shutdown(intr_->fd, SHUT_RDWR);
    intr_->cv.notify_all();
  }

  // Forgets an interrupt that found no command to fail (e.g. one that came
  // just after a blocking call returned), so the next command runs; a socket
  // the interrupt shut down is re-established by that command.
  void clear_interrupt() noexcept { (void)take_interrupt(); }

  // Number of times this connection was re-established after a break.
  std::uint64_t reconnects() const noexcept { return reconnects_; }

 private:
  static std::string_view bytes_of(const Arg& a) noexcept { return a.view(); }
  static std::string_view bytes_of(const std::string& s) noexcept { return s; }

  // RESP encoding of one command. Done here rather than by hiredis so the
  // bytes can be sent with MSG_NOSIGNAL.
  template <class Range>
  static void append_resp(std::string& out, const Range& args) {
    out += '*';
    out += std::to_string(std::size(args));
    out += "\r\n";
    for (const auto& a : args) {
      std::string_view v = bytes_of(a);
      out += '$';
      out += std::to_string(v.size());
      out += "\r\n";
      out.append(v.data(), v.size());
      out += "\r\n";
    }
  }

  static std::string command_name(std::span<const Arg> args) {
    std::string n(args.front().view().substr(0, 32));
    for (char& c : n)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    return n;
  }

  Reply run(std::span<const Arg> args, std::optional<std::chrono::milliseconds> block) {
    if (args.empty()) throw InvalidArgument("Redis command without arguments");
    std::string buf;
    append_resp(buf, args);
    ensure_connected();
    const std::string what = command_name(args);
    if (!block) return finish(exchange(buf, what));
    set_timeout(blocking_timeout(*block), what);
    Reply rep = exchange(buf, what);  // on failure the socket is gone, timeout and all
    // Restore before looking at the reply, so an error reply leaves the
    // command timeout in force; a failure here must not lose a good reply.
    if (redisSetTimeout(ctx_.get(), detail::to_timeval(opts_.command_timeout)) == REDIS_OK)
      timeout_ = opts_.command_timeout;
    else
      drop();
    return finish(std::move(rep));
  }

  Reply exchange(std::string_view buf, const std::string& what) {
    in_flight_ = true;
    send_all(buf, what);
    Reply rep = read_reply(what);
    in_flight_ = false;
    return rep;
  }

  Reply finish(Reply rep) {
    if (rep.is_error()) std::rethrow_exception(reply_error(rep.view().str()));
    return rep;
  }

  std::chrono::milliseconds blocking_timeout(std::chrono::milliseconds block) const {
    using ms = std::chrono::milliseconds;
    if (block == kWaitForever || opts_.command_timeout.count() == 0) return ms(0);  // none
    block = std::max(block, ms(0));
    if (block > ms::max() - opts_.command_timeout) return ms(0);
    return opts_.command_timeout + block;
  }

  void set_timeout(std::chrono::milliseconds t, const std::string& what) {
    timeout_ = t;
    if (redisSetTimeout(ctx_.get(), detail::to_timeval(t)) != REDIS_OK) {
      int e = errno;
      fail_io(what, REDIS_ERR_IO, e, "cannot set the socket timeout: " + std::string(ctx_->errstr));
    }
  }

  void send_all(std::string_view data, const std::string& what) {
    while (!data.empty()) {
      ssize_t n = ::send(ctx_->fd, data.data(), data.size(), MSG_NOSIGNAL);
      if (n >= 0) {
        data.remove_prefix(static_cast<std::size_t>(n));
        continue;
      }
      int e = errno;
      if (e == EINTR) continue;
      fail_io(what, REDIS_ERR_IO, e, std::strerror(e));
    }
  }

  Reply read_reply(const std::string& what) {
    void* r = nullptr;
    if (redisGetReply(ctx_.get(), &r) != REDIS_OK) {
      int e = errno;
      fail_io(what, ctx_->err, e, ctx_->errstr);
    }
    return Reply(static_cast<redisReply*>(r));
  }

  // Error replies as typed exceptions (an exception_ptr, so pipelines can
  // hand them out per command without slicing).
  std::exception_ptr reply_error(std::string_view msg) const {
    std::string m(msg);
    if (m.starts_with("NOAUTH"))
      return std::make_exception_ptr(
          AuthError("Redis at " + opts_.describe() + " requires a password (" + m +
                    "): give it in the URL (redis://:password@host or "
                    "redis://user:password@host) or in Options::password"));
    if (m.starts_with("WRONGPASS"))
      return std::make_exception_ptr(AuthError("Redis at " + opts_.describe() +
                                               " rejected the credentials: " + m));
    return std::make_exception_ptr(ReplyError("Redis error reply: " + m));
  }

  // The one place hiredis/socket failures become exceptions. The context is
  // unusable after any of them, so it is dropped first.
  [[noreturn]] void fail_io(const std::string& what, int redis_err, int sys_errno, std::string why) {
    drop();
    if (take_interrupt())
      throw detail::Interrupted("'" + what + "' to Redis at " + opts_.describe() +
                            " was interrupted (Connection::interrupt)");
    bool timeout = redis_err == REDIS_ERR_IO &&
                   (sys_errno == EAGAIN || sys_errno == EWOULDBLOCK || sys_errno == ETIMEDOUT ||
                    why == std::strerror(EAGAIN) || why.find("timed out") != std::string::npos);
    if (timeout)
      throw TimeoutError("Redis at " + opts_.describe() + " did not answer '" + what + "' within " +
                         std::to_string(timeout_.count()) +
                         " ms (command_timeout): the server is busy or stopped");
    if (redis_err == REDIS_ERR_PROTOCOL)
      throw RedisError("Redis protocol error during '" + what + "' with " + opts_.describe() + ": " +
                       why + " (connection dropped)");
    if (redis_err == REDIS_ERR_OOM) throw RedisError("out of memory reading the reply to '" + what + "'");
    if (redis_err == REDIS_ERR_EOF) why = "the server closed the connection";
    throw ConnectionError("lost connection to Redis at " + opts_.describe() + " during '" + what +
                          "': " + (why.empty() ? "connection closed" : why) +
                          " (server restarted or stopped?)");
  }

  void ensure_not_moved() const {
    if (!intr_) throw ConnectionError("use of a moved-from redis::Connection");
  }

  // Clears a pending interrupt; true if there was one.
  bool take_interrupt() noexcept {
    if (!intr_) return false;
    std::lock_guard lk(intr_->m);
    return std::exchange(intr_->pending, false);
  }

  // Makes `c` the connection, visible to interrupt(). An interrupt that came
  // while there was no socket shuts this one down at once.
  void adopt(detail::ContextPtr c) noexcept {
    ::fcntl(c->fd, F_SETFD, FD_CLOEXEC);
    std::lock_guard lk(intr_->m);
    intr_->fd = c->fd;
    if (intr_->pending) ::shutdown(c->fd, SHUT_RDWR);
    ctx_ = std::move(c);
    in_flight_ = false;
  }

  // Closes the socket (after withdrawing it from interrupt()).
  void drop() noexcept {
    if (!ctx_) return;
    if (intr_) {
      std::lock_guard lk(intr_->m);
      intr_->fd = -1;
    }
    ctx_.reset();
    in_flight_ = false;
  }

  // The context cannot be trusted when hiredis flagged an error, when a
  // command was left half-done (an exception between send and reply), or
  // when the idle socket is readable: EOF (a restart, CLIENT KILL), a reset,
  // or bytes nobody asked for (which would be read as the next reply).
  // Checking before sending means no command goes into a dead socket, so
  // none is executed twice.
  bool socket_dead() const noexcept {
    if (!ctx_ || ctx_->err || in_flight_) return true;
    if (ctx_->reader && ctx_->reader->pos < ctx_->reader->len) return true;
    pollfd p{ctx_->fd, POLLIN, 0};
    int n;
    do n = ::poll(&p, 1, 0);
    while (n < 0 && errno == EINTR);
    return n != 0;
  }

  void ensure_connected() {
    ensure_not_moved();
    if (take_interrupt()) {
      drop();
      throw detail::Interrupted("command to Redis at " + opts_.describe() +
                                " interrupted (Connection::interrupt)");
    }
    if (!socket_dead()) return;
    drop();
    connect_with_backoff();
    ++reconnects_;
  }

  // Attempts until Options::reconnect_timeout is spent. Wrong credentials
  // and refused SELECTs are not retried: waiting does not fix them.
  void connect_with_backoff() {
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
        if (clock::now() + delay > deadline) throw ConnectionError(gave_up(start) + e.what());
      } catch (const TimeoutError& e) {
        if (clock::now() + delay > deadline) throw TimeoutError(gave_up(start) + e.what());
      }
      {
        std::unique_lock lk(intr_->m);
        if (intr_->cv.wait_for(lk, delay, [&] { return intr_->pending; })) {
          intr_->pending = false;
          throw detail::Interrupted("reconnecting to Redis at " + opts_.describe() +
                                    " interrupted (Connection::interrupt)");
        }
      }
      delay = std::min(delay * 2, ms(250));
    }
  }

  std::string gave_up(std::chrono::steady_clock::time_point start) const {
    auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    return "gave up reconnecting after " + std::to_string(spent.count()) + " ms (reconnect_timeout " +
           std::to_string(opts_.reconnect_timeout.count()) + " ms): ";
  }

  void connect_once(std::chrono::milliseconds timeout) {
    auto tv = detail::to_timeval(timeout);
    errno = 0;
    redisContext* raw = opts_.transport == Options::Transport::unix_socket
                            ? redisConnectUnixWithTimeout(opts_.path.c_str(), tv)
                            : redisConnectWithTimeout(opts_.host.c_str(), opts_.port, tv);
    int e = errno;
    if (!raw) throw std::bad_alloc();
    detail::ContextPtr c(raw);
    if (c->err) {
      std::string why = c->errstr;
      if (e == ETIMEDOUT || why.find("timed out") != std::string::npos)
        throw TimeoutError("connecting to Redis at " + opts_.describe() + " timed out after " +
                           std::to_string(timeout.count()) +
                           " ms (connect_timeout): is the address right and the server up?");
      throw ConnectionError("no Redis at " + opts_.describe() + " (" + why + "): start redis-server or set " +
                            kUrlEnv + " to where it listens");
    }
    adopt(std::move(c));
    set_timeout(opts_.command_timeout, "connect");
    if (opts_.transport == Options::Transport::tcp) redisEnableKeepAlive(ctx_.get());
    if (!opts_.password.empty()) {
      Reply r = opts_.user.empty() ? handshake({"AUTH", opts_.password})
                                   : handshake({"AUTH", opts_.user, opts_.password});
      if (r.is_error()) {
        std::string m(r.view().str());
        drop();
        throw AuthError("Redis at " + opts_.describe() + " rejected the credentials" +
                        (opts_.user.empty() ? std::string() : " of user '" + opts_.user + "'") + ": " + m +
                        " (check the password in the URL or Options::password)");
      }
    }
    if (opts_.db != 0) {
      Reply r = handshake({"SELECT", opts_.db});
      if (r.is_error()) {
        std::string m(r.view().str());
        drop();
        if (m.starts_with("NOAUTH")) std::rethrow_exception(reply_error(m));
        throw ReplyError("Redis at " + opts_.describe() + " refused SELECT " + std::to_string(opts_.db) +
                         ": " + m + " (the server has fewer databases; see `databases` in redis.conf)");
      }
    }
  }

  // One command during connect; error replies come back as replies.
  Reply handshake(std::initializer_list<Arg> args) {
    std::string buf;
    append_resp(buf, args);
    return exchange(buf, std::string(args.begin()->view()));
  }

  Options opts_;
  detail::ContextPtr ctx_;
  std::unique_ptr<detail::InterruptState> intr_;
  std::uint64_t reconnects_ = 0;
  std::chrono::milliseconds timeout_{0};  // socket timeout now in force (for messages)
  bool in_flight_ = false;                // sent, reply not read yet
};

// A Lua script run by EVALSHA; loaded on first NOSCRIPT (a new server, a
// Redis restart or SCRIPT FLUSH empties the script cache). Keys and
// arguments are passed as data, never spliced into the source, so names are
// binary-safe. The SHA-1 is computed at construction, so a const Script may
// be shared between threads (each with its own Connection).
class Script {
 public:
  explicit Script(std::string source) : source_(std::move(source)), sha_(detail::sha1_hex(source_)) {}

  const std::string& source() const noexcept { return source_; }
  // The SHA-1 Redis knows the script by (lowercase hex).
  const std::string& sha() const noexcept { return sha_; }

  // Runs the script; its error replies throw ReplyError, I/O failures as
  // Connection::command. After NOSCRIPT the script is loaded and run once more
  // (NOSCRIPT means it did not run).
  Reply eval(Connection& c, std::span<const Arg> keys, std::span<const Arg> args) const {
    std::vector<Arg> argv;
    argv.reserve(3 + keys.size() + args.size());
    std::string nkeys = std::to_string(keys.size());
    argv.emplace_back("EVALSHA");
    argv.emplace_back(std::string_view(sha_));
    argv.emplace_back(std::string_view(nkeys));
    for (const auto& k : keys) argv.push_back(k);
    for (const auto& a : args) argv.push_back(a);
    try {
      return c.command(std::span<const Arg>(argv));
    } catch (const ReplyError& e) {
      if (!std::string_view(e.what()).starts_with("Redis error reply: NOSCRIPT")) throw;
    }
    Reply loaded = c.command({"SCRIPT", "LOAD", source_});
    if (loaded.str() != sha_)
      throw InternalError("Redis loaded the script as " + std::string(loaded.str()) + ", expected " + sha_);
    return c.command(std::span<const Arg>(argv));
  }
  Reply eval(Connection& c, std::initializer_list<Arg> keys, std::initializer_list<Arg> args) const {
    return eval(c, std::span<const Arg>(keys.begin(), keys.size()),
                std::span<const Arg>(args.begin(), args.size()));
  }

 private:
  std::string source_;
  std::string sha_;
};

}  // namespace memcuda::redis
