// STAND-IN for the redis helper's pool (branch wip/redis), same API as
// /work/notes/POOL_API.md; replaced by theirs at merge.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "memcuda/redis/connection.hpp"

namespace memcuda::redis {

struct PoolOptions {
  std::size_t size = 4;
  std::chrono::milliseconds wait_timeout{10000};
};

class ConnectionPool {
 public:
  explicit ConnectionPool(Options opts, PoolOptions pool = {}) : opts_(std::move(opts)), pool_(pool) {
    if (pool_.size < 1) throw InvalidArgument("a connection pool needs at least one connection");
    free_.push_back(std::make_unique<Connection>(opts_));
    open_ = 1;
  }

  class Lease {
   public:
    Lease(ConnectionPool* p, std::unique_ptr<Connection> c) : p_(p), c_(std::move(c)) {}
    Lease(Lease&& o) noexcept : p_(o.p_), c_(std::move(o.c_)) {}
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (p_ && c_) p_->give_back(std::move(c_));
      else if (p_ && !c_ && discarded_) p_->dropped();
    }
    Connection& operator*() const noexcept { return *c_; }
    Connection* operator->() const noexcept { return c_.get(); }
    void discard() noexcept {
      c_.reset();
      discarded_ = true;
    }

   private:
    ConnectionPool* p_;
    std::unique_ptr<Connection> c_;
    bool discarded_ = false;
  };

  Lease acquire() {
    std::unique_lock lk(mu_);
    for (;;) {
      if (!free_.empty()) {
        auto c = std::move(free_.back());
        free_.pop_back();
        return Lease(this, std::move(c));
      }
      if (open_ < pool_.size) {
        ++open_;
        lk.unlock();
        try {
          return Lease(this, std::make_unique<Connection>(opts_));
        } catch (...) {
          lk.lock();
          --open_;
          cv_.notify_one();
          throw;
        }
      }
      if (!cv_.wait_for(lk, pool_.wait_timeout, [&] { return !free_.empty() || open_ < pool_.size; }))
        throw TimeoutError("no Redis connection free in the pool within " +
                           std::to_string(pool_.wait_timeout.count()) + " ms");
    }
  }
  const Options& options() const noexcept { return opts_; }
  std::size_t capacity() const noexcept { return pool_.size; }
  std::size_t idle() const {
    std::lock_guard lk(mu_);
    return free_.size();
  }
  std::size_t open() const {
    std::lock_guard lk(mu_);
    return open_;
  }

 private:
  void give_back(std::unique_ptr<Connection> c) {
    std::lock_guard lk(mu_);
    free_.push_back(std::move(c));
    cv_.notify_one();
  }
  void dropped() {
    std::lock_guard lk(mu_);
    --open_;
    cv_.notify_one();
  }
  Options opts_;
  PoolOptions pool_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Connection>> free_;
  std::size_t open_ = 0;
};

}  // namespace memcuda::redis
