// The allocator-of-record lease: who may allocate and publish tensors.
// One key holds "<epoch> <session>" with a TTL; the holder renews it every
// ttl/3 from the heartbeat thread, and every script that acts as the
// allocator of record checks the token, so a deposed leader cannot act on
// a stale view. Campaigning, renewing and releasing run only on the
// registry's own threads, each on its own connection (passed in).
//
// A lease ends by expiry, or sooner when a follower whose campaign failed
// proves the holder dead (liveness.hpp, death_watch; checked every
// kWatchPeriod, no Redis): it then deletes the lease if it still holds
// exactly that token and campaigns at once (docs/design.md, "Liveness").
#pragma once

#include "memcuda/config.hpp"

#include <signal.h>
#include <sys/types.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <string>
#include <utility>

#include "memcuda/detail/base/node.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/index_repair.hpp"
#include "memcuda/detail/registry/lease/owner_uid.hpp"
#include "memcuda/detail/registry/lease_view.hpp"
#include "memcuda/detail/registry/liveness.hpp"
#include "memcuda/detail/store/lease.hpp"
#include "memcuda/detail/store/reply.hpp"
#include "memcuda/detail/store/sessions.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class Lease final : public LeaseView {
 public:
  explicit Lease(Context& ctx) : ctx_(ctx), owner_uid_(ctx.keys) {}

  bool held() const noexcept override { return leader_.load(std::memory_order_acquire); }

  // The token and epoch of the last lease this process took.
  std::pair<std::string, std::uint64_t> current() const override {
    std::lock_guard lk(mu_);
    return {token_, epoch_};
  }

  // Campaigns once. On success this process is the allocator of record and
  // commands left by dead leaders are queued again. A lease key of the wrong
  // type or format (no leader could be elected to repair it) is moved aside
  // and rebuilt here, then the campaign tried once more.
  bool try_acquire(redis::Connection& c) {
    try {
      return campaign(c);
    } catch (const ReplyError& e) {
      if (!schema::is_fault(e) || schema::check_lease_keys(c, ctx_.keys) == 0) throw;
      return campaign(c);
    }
  }

  bool campaign(redis::Connection& c) {
    if (!owner_uid_.may_campaign(c)) return false;  // another user's namespace: it could serve none of it
    const auto& k = ctx_.keys;
    auto [taken, token] = store::acquire_lease(c, k, ctx_.session, ctx_.opts.lease_ttl);
    if (!taken) {
      // {0, our own token}: we won it in an earlier campaign whose requeue
      // threw before we marked it held. Ours: finish taking it.
      bool ours;
      {
        std::lock_guard lk(mu_);
        ours = !token_.empty() && token == token_;
      }
      if (!ours) {
        watch(c, token);
        return false;
      }
    }
    std::uint64_t epoch = std::stoull(token.substr(0, token.find(' ')));
    {
      std::lock_guard lk(mu_);
      token_ = token;
      epoch_ = epoch;
    }
    owner_uid_.claim(c);
    // Before it allocates: an index key another client wrote with the wrong
    // type is moved aside and rebuilt (index_repair.hpp), and the orphan
    // scan learns from memcuda:owners whom to watch (migration.hpp).
    index_repair::check(c, ctx_, token, true);
    store::add_owner(c, k, ctx_.session);
    if (MEMCUDA_FAULT("lease.requeue")) throw ConnectionError("fault point lease.requeue");
    const auto n = store::requeue(c, k, epoch);
    leader_.store(true, std::memory_order_release);
    log(LogLevel::info, "became allocator of record, epoch " + std::to_string(epoch) +
                            (n ? ", re-queued " + std::to_string(n) + " command(s)" : ""));
    return true;
  }

  bool renew(redis::Connection& c) {
    auto [token, epoch] = current();
    if (store::renew_lease(c, ctx_.keys, token, ctx_.opts.lease_ttl)) return true;
    lose("lease expired before renewal");
    return false;
  }

  void release(redis::Connection& c) {
    if (!held()) return;
    auto [token, epoch] = current();
    leader_.store(false, std::memory_order_release);
    store::release_lease(c, ctx_.keys, token);
    log(LogLevel::info, "released the allocator-of-record lease (epoch " + std::to_string(epoch) + ")");
  }

  void lose(const std::string& why) override {
    if (leader_.exchange(false)) log(LogLevel::warn, "no longer allocator of record: " + why);
  }

  // How often a follower checks the watched holder's pid (a kill(2), no
  // Redis): a proven death is acted on within about this long.
  static constexpr std::chrono::milliseconds kWatchPeriod{50};

  // Whether a holder is being watched (the control loop then wakes every
  // kWatchPeriod to call break_if_holder_dead).
  bool watching() const {
    std::lock_guard lk(mu_);
    return watched_.armed();
  }

  // When the watched holder's process is gone, deletes its lease if it is
  // still that token's and returns true: campaign now. One attempt per
  // holder; false when nothing is proven (no pid watched, or it runs).
  bool break_if_holder_dead(redis::Connection& c) {
    std::string token;
    DeathWatch w;
    {
      std::lock_guard lk(mu_);
      token = watched_token_;
      w = watched_;
    }
    if (!w.armed() || !w.proves_death()) return false;
    {
      std::lock_guard lk(mu_);
      if (watched_token_ == token) watched_ = {};
    }
    // Compare-and-delete, the script a holder releases with: a lease taken
    // since (another token) is left alone.
    if (store::release_lease(c, ctx_.keys, token))
      log(LogLevel::info, "the allocator of record (lease " + token +
                              (w.pid > 0 ? ", pid " + std::to_string(w.pid) : std::string(", its liveness lock free")) +
                              ") is gone: broke its lease, campaigning now");
    return true;
  }

 private:
  // After a lost campaign: notes who holds the lease, and how its death can
  // be proven here (death_watch). Reads the holder's session once per token.
  void watch(redis::Connection& c, const std::string& token) {
    {
      std::lock_guard lk(mu_);
      if (token == watched_token_) return;
      watched_token_ = token;
      watched_ = {};
    }
    const auto sp = token.find(' ');
    if (sp == std::string::npos) return;
    auto v = store::read_session(c, ctx_.keys, std::string_view(token).substr(sp + 1));
    if (v.is_nil()) {  // not registered (yet): read it again at the next lost campaign
      std::lock_guard lk(mu_);
      if (watched_token_ == token) watched_token_.clear();
      return;
    }
    DeathWatch w = death_watch(v.str(), ctx_.node);  // not armed: not ours to judge, expiry decides
    std::lock_guard lk(mu_);
    if (watched_token_ == token) watched_ = std::move(w);
  }

  Context& ctx_;
  OwnerUid owner_uid_;
  std::atomic<bool> leader_{false};
  mutable std::mutex mu_;  // leaf: guards token_, epoch_ and the watched holder
  std::string token_;
  std::uint64_t epoch_ = 0;
  std::string watched_token_;  // the holder seen at the last lost campaign
  DeathWatch watched_;         // how its death can be proven here (not armed: it cannot)
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
