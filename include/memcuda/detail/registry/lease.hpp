// The allocator-of-record lease: who may allocate and publish tensors.
// One key holds "<epoch> <session>" with a TTL; the holder renews it every
// ttl/3 from the heartbeat thread, and every script that acts as the
// allocator of record checks the token, so a deposed leader cannot act on
// a stale view. Campaigning, renewing and releasing run only on the
// registry's own threads, each on its own connection (passed in).
#pragma once

#include "memcuda/config.hpp"

#include <atomic>
#include <mutex>
#include <string>
#include <utility>

#include "memcuda/detail/registry/context.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class Lease {
 public:
  explicit Lease(Context& ctx) : ctx_(ctx) {}

  bool held() const noexcept { return leader_.load(std::memory_order_acquire); }

  // The token and epoch of the last lease this process took.
  std::pair<std::string, std::uint64_t> current() const {
    std::lock_guard lk(mu_);
    return {token_, epoch_};
  }

  // Campaigns once. On success this process is the allocator of record and
  // commands left by dead leaders are queued again.
  bool try_acquire(redis::Connection& c) {
    const auto& k = ctx_.keys;
    auto r = ctx_.scripts.lease_acquire.eval(c, {k.leader(), k.epoch()}, {ctx_.session, ctx_.opts.lease_ttl.count()});
    std::string token(r[1].str());
    if (r[0].integer() != 1) {
      // {0, our own token}: we won it in an earlier campaign whose requeue
      // threw before we marked it held. Ours: finish taking it.
      std::lock_guard lk(mu_);
      if (token_.empty() || token != token_) return false;
    }
    std::uint64_t epoch = std::stoull(token.substr(0, token.find(' ')));
    {
      std::lock_guard lk(mu_);
      token_ = token;
      epoch_ = epoch;
    }
    if (MEMCUDA_FAULT("lease.requeue")) throw ConnectionError("fault point lease.requeue");
    auto n = ctx_.scripts.requeue.eval(c, {k.lifecycle(), k.processing_lists()}, {k.processing(epoch)});
    leader_.store(true, std::memory_order_release);
    log(LogLevel::info, "became allocator of record, epoch " + std::to_string(epoch) +
                            (n.integer() ? ", re-queued " + std::to_string(n.integer()) + " command(s)" : ""));
    return true;
  }

  bool renew(redis::Connection& c) {
    auto [token, epoch] = current();
    if (ctx_.scripts.lease_renew.eval(c, {ctx_.keys.leader()}, {token, ctx_.opts.lease_ttl.count()}).integer() == 1)
      return true;
    lose("lease expired before renewal");
    return false;
  }

  void release(redis::Connection& c) {
    if (!held()) return;
    auto [token, epoch] = current();
    leader_.store(false, std::memory_order_release);
    ctx_.scripts.lease_release.eval(c, {ctx_.keys.leader()}, {token});
    log(LogLevel::info, "released the allocator-of-record lease (epoch " + std::to_string(epoch) + ")");
  }

  void lose(const std::string& why) {
    if (leader_.exchange(false)) log(LogLevel::warn, "no longer allocator of record: " + why);
  }

  // A script answered 'notleader': the lease moved on. Throws NotLeader.
  [[noreturn]] void lost(const std::string& what, std::string_view now_held_by = {}) {
    lose("lease taken over" + (now_held_by.empty() ? std::string() : " (now " + std::string(now_held_by) + ")"));
    throw NotLeader("lost the allocator-of-record lease" + (what.empty() ? std::string() : " while " + what));
  }

  // Maps a status no known branch took: 'notleader' is a lost lease,
  // anything else an InternalError (the lease stays).
  [[noreturn]] void fail_status(std::string_view script, std::string_view status, const std::string& what,
                                std::string_view held_by = {}) {
    if (status == "notleader") lost(what, held_by);
    unexpected_status(script, status);
  }

 private:
  Context& ctx_;
  std::atomic<bool> leader_{false};
  mutable std::mutex mu_;  // leaf: guards token_ and epoch_
  std::string token_;
  std::uint64_t epoch_ = 0;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
