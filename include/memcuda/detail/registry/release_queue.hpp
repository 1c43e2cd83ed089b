// Releases from destructors. The last SharedTensor copy of a reference and
// a DLPack deleter (which may run on a framework's thread) must not wait
// for Redis: they push the release here and return. One thread per
// process sends what accumulated, as one pipeline of release scripts per
// registry session.
//
// Bound: a release is in Redis one round trip after the batch in flight
// when it was queued has landed (well under a millisecond on a local
// Redis). While Redis is unreachable, batches wait and are retried every
// 100 ms; a batch whose pipeline broke midway is not resent (it may have
// run: sending it again could drop a second reference), and the garbage
// collector drops those references when the session ends.
//
// Visibility: every TensorRegistry call that talks to Redis first waits
// until the releases this process queued before the call have been sent
// (read your own releases, across the registries of the process); flush()
// does only that.
//
// Lifetime: a queued release holds its registry's core (what a handle
// held), so releases of tensors that outlive their TensorRegistry still
// land; the core goes, on this thread, once its last release is sent. At
// process exit the thread makes one last attempt and stops.
#pragma once

#include "memcuda/config.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/detail/process_cache.hpp"
#include "memcuda/detail/registry/allocator.hpp"
#include "memcuda/detail/registry/context.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class ReleaseQueue {
 public:
  static ReleaseQueue& instance() {
    static ReleaseQueue q;
    return q;
  }

  // Queues one release of `ctx.session`'s reference; `keep` keeps the
  // registry's core (ctx, alloc) alive until it is sent. Never blocks on I/O.
  void push(std::shared_ptr<void> keep, Context& ctx, Allocator& alloc, std::string name,
            std::uint64_t gen) noexcept {
    try {
      std::lock_guard lk(mu_);
      if (exiting_) {
        // Static destruction has begun: no new thread on a queue that is
        // going away. The session's references go with the session (GC).
        log(LogLevel::info, "release of '" + name + "' dropped at exit: the garbage collector drops it");
        return;
      }
      q_.push_back({std::move(keep), &ctx, &alloc, std::move(name), gen});
      queued_.fetch_add(1, std::memory_order_release);
      if (!worker_.joinable()) worker_ = std::jthread([this](std::stop_token st) { run(st); });
    } catch (const std::exception& e) {
      log(LogLevel::warn, std::string("could not queue a release: ") + e.what());
      return;
    }
    cv_.notify_all();
  }

  // Waits until every release queued before the call has been sent (or
  // given up); false when `timeout` passed first. No lock is held while
  // the sending thread talks to Redis.
  bool flush(std::chrono::milliseconds timeout) {
    const std::uint64_t target = queued_.load(std::memory_order_acquire);
    if (done_.load(std::memory_order_acquire) >= target) return true;  // the common case: nothing pending
    std::unique_lock lk(mu_);
    return done_cv_.wait_for(lk, timeout, [&] { return done_.load() >= target; });
  }

  ~ReleaseQueue() {
    {
      std::lock_guard lk(mu_);
      exiting_ = true;
      if (!worker_.joinable()) return;  // read under mu_: push() starts it under mu_
    }
    worker_.request_stop();
    cv_.notify_all();
    worker_.join();
  }

 private:
  struct Item {
    std::shared_ptr<void> keep;
    Context* ctx;
    Allocator* alloc;
    std::string name;
    std::uint64_t gen;
  };

  // What the worker may use while it runs ~Core (the last release of a
  // core drops it on this thread) must outlive the queue: function-local
  // statics are destroyed in reverse order of construction, so construct
  // them first. Core's constructor constructs the queue, so every registry
  // (even a static one) is destroyed before it.
  ReleaseQueue() {
    (void)ProcessCache::instance();
    (void)backend_for(BackendKind::host);
#if MEMCUDA_HAS_CUDA()
    try {
      (void)backend_for(BackendKind::cuda);
    } catch (...) {
    }
#endif
  }

  void run(std::stop_token st) {
    std::unique_lock lk(mu_);
    for (;;) {
      cv_.wait(lk, st, [&] { return !q_.empty(); });
      if (q_.empty()) return;  // stop requested, nothing left
      std::vector<Item> batch;
      const std::size_t n = std::min<std::size_t>(q_.size(), kMaxBatch);
      batch.reserve(n);
      for (std::size_t i = 0; i < n; ++i) {
        batch.push_back(std::move(q_.front()));
        q_.pop_front();
      }
      const bool last_try = exiting_;
      lk.unlock();
      // One pipeline per registry session; what could not be sent at all goes back.
      std::map<Context*, std::vector<Item>> by_session;
      for (auto& it : batch) by_session[it.ctx].push_back(std::move(it));
      std::vector<Item> unsent;
      for (auto& [ctx, items] : by_session)
        if (!send(*ctx, items) && !last_try)
          for (auto& it : items) unsent.push_back(std::move(it));
      const std::uint64_t sent = n - unsent.size();
      batch.clear();
      by_session.clear();  // cores whose last release this was go here, on this thread
      lk.lock();
      done_.fetch_add(sent, std::memory_order_release);
      done_cv_.notify_all();
      if (!unsent.empty()) {
        // Redis unreachable: nothing of these was sent; back in front, retry later.
        for (auto it = unsent.rbegin(); it != unsent.rend(); ++it) q_.push_front(std::move(*it));
        lk.unlock();
        unsent.clear();
        lk.lock();
        cv_.wait_for(lk, st, kRetry, [] { return false; });
      }
    }
  }

  // False when nothing of `items` could be sent (retry them later).
  bool send(Context& ctx, const std::vector<Item>& items) {
    std::optional<redis::ConnectionPool::Lease> lease;
    try {
      lease.emplace(ctx.pool.acquire());
      (*lease)->command({"PING"});  // fails before anything of the batch was sent
    } catch (const std::exception& e) {
      if (lease) lease->discard();
      if (++failures_ <= 3 || failures_ % 50 == 0)
        log(LogLevel::warn, std::string("releases wait for Redis: ") + e.what());
      return false;
    }
    failures_ = 0;
    redis::Connection& c = **lease;
    const Keys& k = ctx.keys;
    const std::string& sha = ctx.scripts.release.sha();
    std::vector<redis::Command> cmds;
    cmds.reserve(items.size());
    for (const auto& it : items)
      cmds.push_back({"EVALSHA", sha, "4", k.tensor(it.name), k.names(), k.lifecycle(), k.leader(),
                      std::to_string(it.gen), ctx.session, k.prefix(), ctx.session, "", ""});
    std::vector<std::exception_ptr> errors;
    std::vector<redis::Reply> replies;
    try {
      replies = c.pipeline(cmds, &errors);
    } catch (const std::exception& e) {
      lease->discard();
      log(LogLevel::warn, "a batch of " + std::to_string(items.size()) +
                              " release(s) broke off (the garbage collector drops what did not land): " + e.what());
      return true;
    }
    for (std::size_t i = 0; i < items.size(); ++i) {
      const auto& it = items[i];
      try {
        if (errors[i]) {
          try {
            std::rethrow_exception(errors[i]);
          } catch (const ReplyError& e) {
            if (e.prefix() != "NOSCRIPT") throw;
            // Not loaded yet (a fresh Redis): one at a time, which loads it.
            it.alloc->release(c, it.name, it.gen, ctx.session, "");
            continue;
          }
        }
        it.alloc->release_outcome(c, replies[i], it.name, it.gen, ctx.session);
      } catch (const std::exception& e) {
        log(LogLevel::warn, "release of '" + it.name + "': " + e.what());
      }
    }
    return true;
  }

  static constexpr std::size_t kMaxBatch = 512;
  static constexpr auto kRetry = std::chrono::milliseconds(100);

  std::mutex mu_;  // leaf: guards q_, exiting_, worker_ start; never held across Redis
  std::condition_variable_any cv_;
  std::condition_variable_any done_cv_;
  std::deque<Item> q_;
  std::atomic<std::uint64_t> queued_{0}, done_{0};
  bool exiting_ = false;
  int failures_ = 0;  // the thread's own
  std::jthread worker_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
