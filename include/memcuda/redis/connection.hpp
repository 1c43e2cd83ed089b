// A synchronous Redis connection over hiredis: RAII, move-only, with connect
// and command timeouts, AUTH/SELECT, reconnect with bounded backoff,
// pipelining, blocking commands and interrupt().
//
// The rest of the Redis layer is one role per file beside this one (how it
// connects, through Redis Sentinel too, options and URLs, arguments,
// replies, error classification, scripts, the pool).
//
// Thread safety: a Connection is used by one thread at a time, except for
// interrupt(), which any thread may call. Threads that share Redis access
// take connections from a ConnectionPool (connection_pool.hpp) rather than
// queue on one behind a mutex.
//
// hiredis 0.14 notes that shape this file:
//  * hiredis writes with write(2): a write to a socket the peer reset raises
//    SIGPIPE, which kills a process that did not ignore it. Commands are
//    therefore formatted here and sent with send(MSG_NOSIGNAL); hiredis only
//    reads the replies.
//  * After any I/O failure (errors.hpp tells a timeout from a break) the
//    context is unusable, so it is dropped and a fresh one made later.
//  * redisReconnect() reuses the connect timeout as-is and does not restore
//    the socket timeout, so a fresh context is made instead.
//  * Its sockets are not close-on-exec; a forked child would keep the
//    connection open (and a server that died would look alive to it).
#pragma once

#include "memcuda/config.hpp"

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memcuda/error.hpp"
#include "memcuda/redis/args.hpp"
#include "memcuda/redis/errors.hpp"
#include "memcuda/redis/options.hpp"
#include "memcuda/redis/reply.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace redis {

// A wait for Connection::blocking() meaning "as long as the server blocks"
// (e.g. BLPOP key 0); only interrupt() ends it early.
inline constexpr std::chrono::milliseconds kWaitForever = std::chrono::milliseconds::max();

namespace detail {
struct ContextDeleter {
  void operator()(redisContext* c) const noexcept { redisFree(c); }
};
using ContextPtr = std::unique_ptr<redisContext, ContextDeleter>;

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

}  // namespace detail

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
  // The server of the last connect: "host:port" (through sentinels or a
  // cluster, the one they led to), or the socket's path.
  const std::string& server() const noexcept { return server_; }

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

  // Runs one command; error replies throw ReplyError with the server's
  // prefix (AuthError for NOAUTH/WRONGPASS/NOPERM; see classify() in
  // errors.hpp for the whole table). A broken connection is re-established first (bounded by
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
                              std::vector<std::exception_ptr>* errors = nullptr);

  // pipeline() whose replies may take `wait` longer than command_timeout
  // (like blocking()): for a batch that must not be cut off by a short stall
  // of the server, since a batch cut off midway may or may not have run.
  // Only the receive timeout changes (one setsockopt each way).
  std::vector<Reply> pipeline(const std::vector<Command>& cmds, std::vector<std::exception_ptr>* errors,
                              std::chrono::milliseconds wait);

  // Makes sure a usable socket is there (re-establishing a broken one, as
  // the next command would) without sending anything: what throws here
  // left nothing half-sent.
  void ensure_ready() { ensure_connected("connect"); }

  // Reads the next reply without sending anything: a message pushed to a
  // SUBSCRIBEd connection (RESP2). Waits up to `block` on top of the command
  // timeout (kWaitForever: until one comes or interrupt()). Never
  // reconnects, since a fresh socket would have lost the subscription: a
  // broken connection throws ConnectionError (Interrupted after interrupt()).
  Reply receive(std::chrono::milliseconds block) {
    const std::string what = "read of a subscribed connection";
    ensure_not_moved();
    if (take_interrupt()) fail_interrupted(what);
    if (!connected())
      std::rethrow_exception(classify(opts_, Failure{.what = what, .redis_code = REDIS_ERR_EOF, .text = "not connected"}));
    set_timeout(blocking_timeout(block), what);
    in_flight_ = true;
    Reply rep = read_reply(what);
    in_flight_ = false;
    if (redisSetTimeout(ctx_.get(), detail::to_timeval(opts_.command_timeout)) == REDIS_OK)
      timeout_ = opts_.command_timeout;
    else
      drop();
    return rep;
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
  // The command's name for messages: at most 32 bytes, controls masked.
  static std::string command_name(std::string_view first) {
    std::string n(first.substr(0, 32));
    for (char& c : n)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    return n;
  }

  Reply run(std::span<const Arg> args, std::optional<std::chrono::milliseconds> block) {
    if (args.empty()) throw InvalidArgument("Redis command without arguments");
    std::string buf;
    detail::append_resp(buf, args);
    const std::string what = command_name(args.front().view());
    const auto until = std::chrono::steady_clock::now() + opts_.reconnect_timeout;
    for (;;) {
      ensure_connected(what);
      if (!block) {
        Reply rep = exchange(buf, what);
        if (!follow_failover(rep, until) && !follow_cluster(rep, buf, what, until)) return finish(std::move(rep), what);
        continue;
      }
      set_timeout(blocking_timeout(*block), what);
      Reply rep = exchange(buf, what);  // on failure the socket is gone, timeout and all
      // Restore before looking at the reply, so an error reply leaves the
      // command timeout in force; a failure here must not lose a good reply.
      if (redisSetTimeout(ctx_.get(), detail::to_timeval(opts_.command_timeout)) == REDIS_OK)
        timeout_ = opts_.command_timeout;
      else
        drop();
      if (!follow_failover(rep, until) && !follow_cluster(rep, buf, what, until)) return finish(std::move(rep), what);
    }
  }

  Reply exchange(std::string_view buf, const std::string& what) {
    in_flight_ = true;
    send_all(buf, what);
    Reply rep = read_reply(what);
    in_flight_ = false;
    return rep;
  }

  Reply finish(Reply rep, const std::string& what) {
    if (rep.is_error()) std::rethrow_exception(reply_error(what, rep.view().str()));
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

  // Error replies as typed exceptions (classify() picks the type by the
  // server's error code).
  std::exception_ptr reply_error(std::string_view what, std::string_view text,
                                 std::string_view hint = {}) const {
    return classify(opts_, Failure{.what = what, .text = text, .hint = hint});
  }

  // The one place hiredis/socket failures become exceptions (classify()
  // picks the type). The context is unusable after any of them, so it is
  // dropped first; a pending interrupt is what caused it.
  [[noreturn]] void fail_io(const std::string& what, int redis_err, int sys_errno, std::string_view why) {
    const std::string text(why);  // may point into the context dropped next
    drop();
    const bool interrupted = take_interrupt();
    std::rethrow_exception(classify(opts_, Failure{.what = what,
                                                   .redis_code = redis_err,
                                                   .sys_errno = sys_errno,
                                                   .text = text,
                                                   .interrupted = interrupted,
                                                   .timeout = timeout_}));
  }

  // An interrupt() that came while no command was in flight.
  [[noreturn]] void fail_interrupted(std::string_view what) {
    std::rethrow_exception(classify(opts_, Failure{.what = what, .interrupted = true}));
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

  void ensure_connected(std::string_view what) {
    ensure_not_moved();
    if (take_interrupt()) {
      drop();
      fail_interrupted(what);
    }
    if (!socket_dead() && !primary_moved()) return;
    drop();
    connect_with_backoff();
    ++reconnects_;
  }

  // Establishing the socket: connect.hpp.
  void connect_with_backoff();
  std::string gave_up(std::chrono::steady_clock::time_point start) const;
  void connect_once(std::chrono::milliseconds timeout);
  void connect_to(const Options& at, std::chrono::milliseconds timeout);
  // Following a failover: sentinel.hpp.
  void connect_via_sentinels(std::chrono::milliseconds timeout);
  bool backoff(std::chrono::milliseconds d);
  // Following the slot of a cluster: cluster.hpp.
  static constexpr std::chrono::milliseconds kClusterWait{50};
  void connect_via_cluster(std::chrono::milliseconds timeout);
  bool follow_cluster(Reply& rep, std::string_view buf, const std::string& what,
                      std::chrono::steady_clock::time_point until);
  bool cluster_retry(const Reply& rep) const;
  void follow_ask(std::vector<Reply>& out, const std::vector<Command>& cmds, const std::string& what);
  std::vector<Reply> ask(std::string_view addr, const std::vector<std::string>& cmds, const std::string& what);
  bool primary_lost(const Reply& rep) const;
  bool primary_moved() const noexcept;
  bool follow_failover(const Reply& rep, std::chrono::steady_clock::time_point until);
  std::string read_password_file();
  Reply handshake(std::initializer_list<Arg> args);

  Options opts_;
  detail::ContextPtr ctx_;
  std::unique_ptr<detail::InterruptState> intr_;
  std::uint64_t reconnects_ = 0;
  std::uint64_t primary_changes_ = 0;     // through sentinels: primary changes heard of before this connect
  std::string cluster_node_;              // "host:port" a MOVED named: the next connect goes there
  std::string server_;                    // server(), set by connect_to
  std::chrono::milliseconds timeout_{0};  // socket timeout now in force (for messages)
  bool in_flight_ = false;                // sent, reply not read yet
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::redis

// The definitions of Connection's pipelines and connect members; they need
// the whole class.
#include "memcuda/redis/pipeline.hpp"  // IWYU pragma: export
#include "memcuda/redis/connect.hpp"   // IWYU pragma: export

// Script is part of what this header always offered; script.hpp needs
// Connection, so it comes last (its own #include of this file is then a no-op).
#include "memcuda/redis/script.hpp"  // IWYU pragma: export
