// Releases from destructors (docs/design.md, "Releases", says the bound,
// the retries and what a caller sees). The last SharedTensor copy of a
// reference and a DLPack deleter push the release here and return, with no
// Redis I/O; what accumulated is sent as one pipeline per registry session
// by the next thread of this process that calls the registry, or else by
// the queue's own thread after kLinger. That thread also ends the reference
// cache's lingering windows (call_at). A queued release holds its
// registry's core, so releases of tensors that outlive their registry land.
#pragma once

#include "memcuda/config.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/detail/backend/process_cache.hpp"
#include "memcuda/detail/backend/select.hpp"
#include "memcuda/detail/process/process.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/own_allocator.hpp"
#include "memcuda/detail/store/release_scripts.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class ReleaseQueue {
 public:
  // Part of the process object (Process::releases()), made after and
  // destroyed before all it uses: what the worker may touch while it runs
  // ~Core (the last release of a core drops it on the thread that sent
  // it), the process cache and the backends among them (process.hpp).
  ReleaseQueue() = default;

  // Queues one release of `ctx.session`'s reference; `keep` keeps the
  // registry's core (ctx, alloc) alive until it is sent. Never blocks on
  // I/O; wakes the sending thread only when it sleeps.
  void push(std::shared_ptr<void> keep, Context& ctx, OwnAllocator& alloc, std::string name,
            std::uint64_t gen) noexcept {
    push_item(std::move(keep), ctx, alloc, std::move(name), gen, 0);
  }

  // Queues the release of one of `ctx.session`'s references to the
  // state-dict record `dict_id` (state_dicts.hpp), in order with the rest.
  void push_dict(std::shared_ptr<void> keep, Context& ctx, OwnAllocator& alloc, std::uint64_t dict_id) noexcept {
    push_item(std::move(keep), ctx, alloc, std::string(), 0, dict_id);
  }

 private:
  void push_item(std::shared_ptr<void> keep, Context& ctx, OwnAllocator& alloc, std::string name, std::uint64_t gen,
                 std::uint64_t dict_id) noexcept {
    bool wake = false;
    try {
      std::lock_guard lk(mu_);
      if (exiting_) {
        // Static destruction has begun: no new thread on a queue that is
        // going away. The session's references go with the session (GC).
        log(LogLevel::info, "release of '" + name + "' dropped at exit: the garbage collector drops it");
        return;
      }
      q_.push_back({std::move(keep), &ctx, &alloc, std::move(name), gen, last_seq_ + 1, dict_id});
      queued_.store(++last_seq_, std::memory_order_release);
      if (!worker_.joinable()) worker_ = std::jthread([this] { run(); });
      wake = std::exchange(worker_sleeps_, false);
    } catch (const std::exception& e) {
      log(LogLevel::warn, std::string("could not queue a release: ") + e.what());
      return;
    }
    if (wake) cv_.notify_one();
  }

 public:
  using Clock = std::chrono::steady_clock;
  using TimerFn = Clock::time_point (*)(Clock::time_point now) noexcept;

  // Calls `fn(now)` on the queue's thread once `at` has passed: the end of
  // the reference cache's lingering windows (Holdings::expire_all, the one
  // timer of the process), whose dropped handles queue their releases
  // right here. `fn` returns when it wants to be called next
  // (time_point::max(): not). Never blocks on I/O.
  void call_at(Clock::time_point at, TimerFn fn) noexcept {
    bool wake = false;
    try {
      std::lock_guard lk(mu_);
      if (exiting_) return;  // the registries are gone: nothing lingers
      timer_fn_ = fn;
      if (at >= timer_at_) return;  // an earlier call is due first and reschedules
      timer_at_ = at;
      if (!worker_.joinable()) worker_ = std::jthread([this] { run(); });
      wake = std::exchange(worker_sleeps_, false);
    } catch (const std::exception& e) {
      log(LogLevel::warn, std::string("could not schedule the end of a lingering window: ") + e.what());
      return;
    }
    if (wake) cv_.notify_one();
  }

  // Waits until every release queued before the call has been sent (or
  // given up); false when `timeout` passed first. With `send`, releases
  // still queued are sent by the calling thread itself (no hand-off to the
  // sending thread and back): only for threads that may do I/O, never a
  // destructor. No lock is held while anyone talks to Redis. A send under
  // way is not cut short by `timeout`: it may take up to request_timeout
  // plus command_timeout when Redis stalls.
  bool flush(std::chrono::milliseconds timeout, bool send = true) {
    const std::uint64_t target = queued_.load(std::memory_order_acquire);
    if (done_.load(std::memory_order_acquire) >= target) return true;  // the common case: nothing pending
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::unique_lock lk(mu_);
    while (done_.load(std::memory_order_relaxed) < target) {
      if (send && !q_.empty() && q_.front().seq <= target && std::chrono::steady_clock::now() >= retry_after_) {
        send_one_batch(lk, false);
        continue;
      }
      ++waiters_;
      const bool timed_out = done_cv_.wait_until(lk, deadline) == std::cv_status::timeout;
      --waiters_;
      if (timed_out) return done_.load(std::memory_order_relaxed) >= target;
    }
    return true;
  }

  ~ReleaseQueue() {
    {
      std::lock_guard lk(mu_);
      exiting_ = true;
      stop_ = true;
      if (!worker_.joinable()) return;  // read under mu_: push() starts it under mu_
    }
    cv_.notify_all();
    worker_.join();
  }

 private:
  struct Item {
    std::shared_ptr<void> keep;
    Context* ctx;
    OwnAllocator* alloc;
    std::string name;
    std::uint64_t gen;
    std::uint64_t seq;  // order of push(), from 1
    std::uint64_t dict_id = 0;  // not 0: a state-dict record's reference (name, gen unused)
  };

  void run() {
    std::unique_lock lk(mu_);
    for (;;) {
      while (!stop_ && q_.empty() && Clock::now() < timer_at_) {
        // Set before every wait: a wake that leaves us waiting (call_at's,
        // for a window that has not ended yet) must not stop the next
        // push() from waking us.
        worker_sleeps_ = true;
        if (timer_at_ == Clock::time_point::max()) cv_.wait(lk);
        else cv_.wait_until(lk, timer_at_);
      }
      worker_sleeps_ = false;
      if (!stop_ && Clock::now() >= timer_at_) {
        run_timer(lk);
        continue;
      }
      if (q_.empty()) return;  // stop requested, nothing left
      if (!stop_) {
        // Linger: the thread that dropped the handle usually calls the
        // registry (or flush()) next and sends these itself, with no
        // hand-off; what nobody took is sent after kLinger.
        cv_.wait_for(lk, kLinger, [&] { return stop_; });
        if (q_.empty()) continue;
        const auto now = std::chrono::steady_clock::now();
        if (now < retry_after_) {
          cv_.wait_until(lk, retry_after_, [&] { return stop_; });
          continue;
        }
      }
      send_one_batch(lk, exiting_);
    }
  }

  // The timer's function, with `lk` released: the handles it drops push
  // their releases (push() takes mu_).
  void run_timer(std::unique_lock<std::mutex>& lk) {
    const TimerFn fn = timer_fn_;
    timer_at_ = Clock::time_point::max();
    lk.unlock();
    const auto next = fn ? fn(Clock::now()) : Clock::time_point::max();
    lk.lock();
    timer_at_ = std::min(timer_at_, next);
  }

  // Takes up to kMaxBatch releases from the front of the queue and sends
  // them with `lk` released; what could not be sent at all goes back in
  // order (unless `last_try`). `lk` is held on entry and on return.
  void send_one_batch(std::unique_lock<std::mutex>& lk, bool last_try) {
    std::vector<Item> batch;
    const std::size_t n = std::min<std::size_t>(q_.size(), kMaxBatch);
    batch.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      batch.push_back(std::move(q_.front()));
      q_.pop_front();
    }
    const std::uint64_t lo = batch.front().seq;
    in_flight_.insert(lo);
    lk.unlock();
    std::vector<Item> unsent;
    try {
      // One pipeline per registry session (usually the batch is one session's).
      const bool one = std::all_of(batch.begin(), batch.end(), [&](const Item& it) { return it.ctx == batch.front().ctx; });
      if (one) {
        if (!send(*batch.front().ctx, batch, last_try) && !last_try) unsent = std::move(batch);
        batch.clear();
      } else {
        std::map<Context*, std::vector<Item>> by_session;
        for (auto& it : batch) by_session[it.ctx].push_back(std::move(it));
        batch.clear();
        for (auto& [ctx, items] : by_session)
          if (!send(*ctx, items, last_try) && !last_try)
            for (auto& it : items) unsent.push_back(std::move(it));
      }
      // The sent items went here: cores whose last release this was go with
      // them, on this thread (no lock held).
    } catch (const std::exception& e) {
      log(LogLevel::warn, std::string("sending releases: ") + e.what());  // bad_alloc: GC drops them
    }
    lk.lock();
    // Back in seq order: another thread's batch may have gone back meanwhile.
    for (auto it = unsent.rbegin(); it != unsent.rend(); ++it) {
      auto pos = std::upper_bound(q_.begin(), q_.end(), it->seq, [](std::uint64_t s, const Item& x) { return s < x.seq; });
      q_.insert(pos, std::move(*it));
    }
    in_flight_.erase(in_flight_.find(lo));
    if (!unsent.empty()) retry_after_ = std::chrono::steady_clock::now() + kRetry;
    // Settled: everything before the first release still queued or in flight.
    std::uint64_t settled = q_.empty() ? last_seq_ : q_.front().seq - 1;
    if (!in_flight_.empty()) settled = std::min(settled, *in_flight_.begin() - 1);
    done_.store(settled, std::memory_order_release);
    if (waiters_ > 0) done_cv_.notify_all();
  }

  // False when nothing of `items` could be sent (retry them later).
  bool send(Context& ctx, const std::vector<Item>& items, bool last_try) {
    std::optional<redis::ConnectionPool::Lease> lease;
    try {
      lease.emplace(ctx.pool.acquire());
      // A broken socket is re-established here, before anything of the
      // batch is sent: what fails here may be retried.
      (*lease)->ensure_ready();
    } catch (const std::exception& e) {
      if (lease) lease->discard();
      const int f = ++failures_;
      if (f <= 3 || f % 50 == 0) log(LogLevel::warn, std::string("releases wait for Redis: ") + e.what());
      return false;
    }
    failures_ = 0;
    redis::Connection& c = **lease;
    const Keys& k = ctx.keys;
    const store::ReleaseBatch batch(k, ctx.session);  // the keys every command of the session shares
    std::vector<redis::Command> cmds;
    cmds.reserve(items.size());
    for (const auto& it : items) {
      if (it.dict_id) {
        cmds.push_back(store::dict_release_cmd(batch, ctx.session, it.dict_id));
        continue;
      }
      cmds.push_back(store::release_cmd(batch, ctx.session, it.name, it.gen));
    }
    std::vector<std::exception_ptr> errors;
    std::vector<redis::Reply> replies;
    try {
      // A batch cut off midway may have run, so it is never resent: give a
      // stalled server (a pause, a slow script, a fork) request_timeout on
      // top of the command timeout before giving up on it.
      replies = last_try ? c.pipeline(cmds, &errors) : c.pipeline(cmds, &errors, ctx.opts.request_timeout);
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
            if (it.dict_id) store::release_dict(c, ctx.keys, std::to_string(it.dict_id), ctx.session, false);
            else it.alloc->release(c, it.name, it.gen, ctx.session, "");
            continue;
          }
        }
        // A dict reference has nothing to free here: the garbage collector
        // drops the pins of a record its last reference deleted.
        if (!it.dict_id)
          it.alloc->release_outcome(c, store::answer(std::move(replies[i])), it.name, it.gen, ctx.session);
      } catch (const std::exception& e) {
        log(LogLevel::warn, "release of '" + it.name + "': " + e.what());
      }
    }
    return true;
  }

  static constexpr std::size_t kMaxBatch = 512;
  static constexpr auto kRetry = std::chrono::milliseconds(100);
  static constexpr auto kLinger = std::chrono::microseconds(200);

  std::mutex mu_;  // leaf: guards everything below but the atomics; never held across Redis
  std::condition_variable cv_;       // the sending thread sleeps on it
  std::condition_variable done_cv_;  // flush() waiters
  std::deque<Item> q_;               // in seq order
  std::multiset<std::uint64_t> in_flight_;  // first seq of each batch being sent
  std::uint64_t last_seq_ = 0;
  // queued_: the last seq pushed; done_: every seq up to it is sent (or given up).
  std::atomic<std::uint64_t> queued_{0}, done_{0};
  std::chrono::steady_clock::time_point retry_after_{};  // no sends before (Redis was unreachable)
  Clock::time_point timer_at_ = Clock::time_point::max();  // call_at: when timer_fn_ is due
  TimerFn timer_fn_ = nullptr;
  int waiters_ = 0;
  bool worker_sleeps_ = false;
  bool exiting_ = false;
  bool stop_ = false;
  std::atomic<int> failures_{0};
  std::jthread worker_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
