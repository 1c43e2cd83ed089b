// A pool of redis::Connection for callers on many threads, so that one
// caller's slow or blocking command (BLPOP, a script, a reconnect) never
// makes another queue behind it. Its one mutex guards only the free list
// and the count of open connections, never a connection talking to Redis;
// the free list lives in state shared with the leases, so a Lease may
// outlive its pool (docs/design.md, "The connection pool and its locking rule").
#pragma once

#include "memcuda/config.hpp"

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "memcuda/error.hpp"
#include "memcuda/redis/connection.hpp"
#include "memcuda/redis/options.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace redis {

struct PoolOptions {
  std::size_t size = 4;                           // connections at most (>= 1)
  std::chrono::milliseconds wait_timeout{10000};  // acquire() waits this long when all are busy, then TimeoutError
};

namespace detail {
// What the pool and its leases share. `open` counts every connection made
// and not yet closed: idle ones, leased ones and one being made (counted
// before the connect, so that concurrent acquire()s never exceed the size).
struct PoolState {
  PoolState(Options o, PoolOptions p) : opts(std::move(o)), pool(p) {}
  const Options opts;
  const PoolOptions pool;
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::unique_ptr<Connection>> idle;  // LIFO: the warmest socket goes out first
  std::size_t open = 0;
};
}  // namespace detail

// Thread-safe. Connections are made lazily up to `size` (the first one
// eagerly in the constructor, so a bad address or password fails there).
// Not copyable; moves are noexcept and leave the source empty (acquire()
// on it throws ConnectionError, its counts read 0).
class ConnectionPool {
 public:
  // Far above any Redis maxclients; a larger size is a mistake.
  static constexpr std::size_t kMaxSize = 100000;

  // Throws InvalidArgument (size 0, a negative wait_timeout, bad Options)
  // and whatever Connection's constructor throws for the first connection
  // (ConnectionError, AuthError, TimeoutError, ReplyError).
  explicit ConnectionPool(Options opts, PoolOptions pool = {}) {
    if (pool.size == 0)
      throw InvalidArgument("redis::PoolOptions::size is 0: a connection pool needs room for at least one connection");
    if (pool.wait_timeout.count() < 0)
      throw InvalidArgument("redis::PoolOptions::wait_timeout is negative (" +
                            std::to_string(pool.wait_timeout.count()) + " ms)");
    if (pool.size > kMaxSize)
      throw InvalidArgument("redis::PoolOptions::size " + std::to_string(pool.size) + " is over " +
                            std::to_string(kMaxSize) + ", more connections than a Redis server accepts");
    opts.validate();
    state_ = std::make_shared<detail::PoolState>(std::move(opts), pool);
    // Room for every connection up front, so that giving one back (noexcept)
    // never allocates.
    state_->idle.reserve(pool.size);
    auto first = std::make_unique<Connection>(state_->opts);
    state_->idle.push_back(std::move(first));
    state_->open = 1;
  }

  ConnectionPool(ConnectionPool&&) noexcept = default;
  ConnectionPool& operator=(ConnectionPool&&) noexcept = default;
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;
  // Idle connections close with the last of the pool and its leases; closing
  // a socket is no network wait.
  ~ConnectionPool() = default;

  // Move-only RAII lease of one connection; gives it back on destruction. A
  // connection that is not Connection::reusable() any more (its last call
  // threw ConnectionError, TimeoutError or Interrupted, or an interrupt is
  // pending) is closed instead, and the pool makes a fresh one when needed.
  // The connection is the lessee's alone: use it from one thread at a time
  // (interrupt() excepted) and not after the lease is gone.
  class Lease {
   public:
    Lease() = default;  // empty: holds nothing
    Lease(Lease&& o) noexcept = default;
    Lease& operator=(Lease&& o) noexcept {
      if (this != &o) {
        give_back();
        state_ = std::move(o.state_);
        conn_ = std::move(o.conn_);
      }
      return *this;
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { give_back(); }

    // The leased connection. An empty lease (moved-from, discarded,
    // default-made) holds none: do not dereference it.
    Connection& operator*() const noexcept { return *conn_; }
    Connection* operator->() const noexcept { return conn_.get(); }
    explicit operator bool() const noexcept { return conn_ != nullptr; }

    // Closes the connection instead of returning it (its state is unknown,
    // e.g. a MULTI left open); the lease is empty afterwards.
    void discard() noexcept {
      if (!conn_) return;
      std::unique_ptr<Connection> dead = std::move(conn_);
      forget(std::move(state_));
      // `dead` closes here, outside the pool's mutex.
    }

   private:
    friend class ConnectionPool;
    Lease(std::shared_ptr<detail::PoolState> s, std::unique_ptr<Connection> c) noexcept
        : state_(std::move(s)), conn_(std::move(c)) {}

    void give_back() noexcept {
      if (!conn_) return;
      if (!conn_->reusable()) return discard();
      auto s = std::move(state_);
      {
        std::lock_guard lk(s->m);
        // No allocation: the free list was reserved to the size.
        s->idle.push_back(std::move(conn_));
      }
      s->cv.notify_one();
    }

    // One connection fewer: a waiter in acquire() may now make its own.
    static void forget(std::shared_ptr<detail::PoolState> s) noexcept {
      {
        std::lock_guard lk(s->m);
        --s->open;
      }
      s->cv.notify_one();
    }

    std::shared_ptr<detail::PoolState> state_;
    std::unique_ptr<Connection> conn_;
  };

  // A connection for the caller's exclusive use: an idle one if any, else a
  // new one while fewer than `size` are open, else waits (no lock held) up
  // to wait_timeout for one to come back and then throws TimeoutError. A
  // failed connect throws as Connection's constructor does and takes no room.
  Lease acquire() {
    if (!state_) throw ConnectionError("acquire() on a moved-from redis::ConnectionPool");
    auto& s = *state_;
    const auto deadline = std::chrono::steady_clock::now() + s.pool.wait_timeout;
    std::unique_lock lk(s.m);
    for (;;) {
      if (auto l = take_free(lk, true)) return std::move(*l);
      if (s.cv.wait_until(lk, deadline) == std::cv_status::timeout && s.idle.empty() &&
          s.open >= s.pool.size)
        throw TimeoutError("no Redis connection to " + s.opts.describe() + " came free within " +
                           std::to_string(s.pool.wait_timeout.count()) +
                           " ms (PoolOptions::wait_timeout): all " + std::to_string(s.pool.size) +
                           " of the pool are leased; raise PoolOptions::size or hold leases for "
                           "shorter");
    }
  }

  // A connection only when one is free now (idle, or room to open one):
  // never waits for another lease. For work that can also be done on the
  // connection the caller holds (a page split across connections).
  std::optional<Lease> try_acquire() {
    if (!state_) return std::nullopt;
    std::unique_lock lk(state_->m);
    return take_free(lk, false);
  }

  // The options every connection of the pool is made with (empty after a move).
  const Options& options() const noexcept { return state_ ? state_->opts : empty_options(); }
  // PoolOptions::size (0 after a move).
  std::size_t capacity() const noexcept { return state_ ? state_->pool.size : 0; }
  // Connections ready in the free list.
  std::size_t idle() const {
    if (!state_) return 0;
    std::lock_guard lk(state_->m);
    return state_->idle.size();
  }
  // Connections currently made (leased + idle, and any being made).
  std::size_t open() const {
    if (!state_) return 0;
    std::lock_guard lk(state_->m);
    return state_->open;
  }

 private:
  // A connection free now: an idle one, else a new one while fewer than
  // `size` are open (made with `lk` released); nothing when neither. A
  // failed connect takes no room and throws, or gives nothing when not
  // `rethrow`. `lk` (on s.m) is held on entry, and on return with nothing.
  std::optional<Lease> take_free(std::unique_lock<std::mutex>& lk, bool rethrow) {
    auto& s = *state_;
    if (!s.idle.empty()) {
      std::unique_ptr<Connection> c = std::move(s.idle.back());
      s.idle.pop_back();
      return Lease(state_, std::move(c));
    }
    if (s.open >= s.pool.size) return std::nullopt;
    ++s.open;
    lk.unlock();
    try {
      return Lease(state_, std::make_unique<Connection>(s.opts));
    } catch (...) {
      Lease::forget(state_);
      if (rethrow) throw;
      return std::nullopt;
    }
  }

  static const Options& empty_options() noexcept {
    static const Options o;
    return o;
  }

  std::shared_ptr<detail::PoolState> state_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::redis
