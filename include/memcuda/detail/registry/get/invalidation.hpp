// The holdings table's invalidation connection: one Redis connection per
// registry, with client tracking in broadcast mode redirected to itself
// over the memcuda:removed:, memcuda:moved: and memcuda:lost: prefixes, and
// SUBSCRIBEd to __redis__:invalidate (RESP2). docs/design.md, "In-process
// reference sharing", says why these keys and not the tensor's Hash.
//
// Liveness: shares are served only between a confirmed SUBSCRIBE and the
// first error on this connection (Holdings::set_live). A break flushes the
// table; until the connection is back (retried every kRetry), every get
// goes to Redis.
//
// Tracking messages come only from the server the connection is on. When
// the registry's keys move to another server (a resharded slot, a cluster
// or Sentinel failover), the heartbeat's connection follows them at its
// next beat and calls follow() with where it landed: a listener elsewhere
// is broken off, which flushes the table, and connects again.
#pragma once

#include "memcuda/config.hpp"

#include <charconv>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>

#include "memcuda/detail/base/fault.hpp"
#include "memcuda/detail/base/log.hpp"
#include "memcuda/detail/registry/get/holdings.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/redis/connection.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class Invalidation {
 public:
  // The channel Redis sends tracking messages to in RESP2.
  static constexpr std::string_view kChannel = "__redis__:invalidate";
  static constexpr auto kRetry = std::chrono::milliseconds(100);

  Invalidation(Context& ctx, Holdings& holdings) : ctx_(ctx), holdings_(holdings) {
    holdings_.set_linger(ctx.opts.release_linger);  // windows only while the table is live (set_live)
  }

  // Subscribes once, synchronously (the registry's constructor), so that
  // sharing starts with the registry rather than some time after it: gets
  // right after construction behave like every later one. A failure is
  // logged; the thread tries again.
  void start() {
    try {
      first_.emplace(connect());
      holdings_.set_live(true);
    } catch (const std::exception& e) {
      first_.reset();
      log(LogLevel::warn, std::string("reference sharing: no invalidation connection yet (gets go to Redis): ") +
                              e.what());
    }
  }

  // The listener thread's body (the registry's thread starts it): applies
  // messages until stopped; reconnects and subscribes again after a break.
  void run(std::stop_token st) {
    int failures = 0;
    while (!st.stop_requested()) {
      try {
        // start()'s connection is live already (and what was cached since
        // stays: its messages wait in the socket); a new one goes live now.
        const bool fresh = !first_;
        redis::Connection c = fresh ? connect() : std::move(*first_);
        first_.reset();
        std::stop_callback on_stop(st, [&c] { c.interrupt(); });
        Listening listening(*this, c);
        if (failures > 0) log(LogLevel::info, "reference sharing: invalidation connection is back");
        failures = 0;
        if (fresh) holdings_.set_live(true);
        while (!st.stop_requested()) apply(c.receive(redis::kWaitForever));
      } catch (const std::exception& e) {
        holdings_.set_live(false);
        if (st.stop_requested()) break;
        bool followed = false;
        {
          std::lock_guard lk(mu_);
          followed = std::exchange(following_, false);
        }
        if (!followed && (++failures <= 3 || failures % 50 == 0))
          log(LogLevel::warn, std::string("reference sharing: invalidation connection lost (gets go to Redis until it "
                                          "is back): ") + e.what());
      }
      std::unique_lock lk(mu_);
      cv_.wait_for(lk, st, kRetry, [] { return false; });
    }
    holdings_.set_live(false);
  }

  // The registry's keys are on `server` now (the heartbeat's connection
  // says so, having followed them): a listener on another server hears
  // nothing of them, so it is broken off (run() connects again).
  void follow(const std::string& server) {
    std::string was;
    {
      std::lock_guard lk(mu_);
      if (!listener_ || server.empty() || listener_->server() == server) return;
      was = listener_->server();
      following_ = true;
      listener_->interrupt();
    }
    log(LogLevel::info, "reference sharing: the registry's keys moved from " + was + " to " + server +
                            "; the invalidation connection follows them");
  }

 private:
  // run()'s connection, published to follow() while it listens.
  struct Listening {
    Invalidation& self;
    Listening(Invalidation& s, redis::Connection& c) : self(s) {
      std::lock_guard lk(self.mu_);
      self.listener_ = &c;
    }
    ~Listening() {
      std::lock_guard lk(self.mu_);
      self.listener_ = nullptr;
    }
  };

  redis::Connection connect() {
    // The fault point holds the connection down, for the tests of what a
    // get does meanwhile.
    if (MEMCUDA_FAULT("invalidation.connect")) throw ConnectionError("fault: invalidation.connect");
    redis::Connection c(ctx_.opts.redis);
    subscribe(c);
    return c;
  }

  void subscribe(redis::Connection& c) {
    const auto& k = ctx_.keys;
    const long long id = c.command({"CLIENT", "ID"}).integer();
    c.command({"CLIENT", "SETNAME", "memcuda-invalidate-" + ctx_.session});
    c.command({"CLIENT", "TRACKING", "ON", "REDIRECT", std::to_string(id), "BCAST", "PREFIX", k.removed_prefix(),
               "PREFIX", k.moved_prefix(), "PREFIX", k.lost_prefix()});
    auto r = c.command({"SUBSCRIBE", std::string(kChannel)});
    if (r.size() < 1 || r[0].str() != "subscribe")
      throw InternalError("SUBSCRIBE " + std::string(kChannel) + " was answered with a " + r.type_name());
  }

  // One pushed message: ["message", channel, [key, ...] | nil (flush)].
  void apply(const redis::Reply& m) {
    if (!m.is_array() || m.size() != 3 || m[0].str() != "message" || m[1].str() != kChannel) return;
    auto keys = m[2];
    if (!keys.is_array()) {  // nil: FLUSHALL/FLUSHDB (or tracking table overflow)
      holdings_.flush();
      return;
    }
    const auto& k = ctx_.keys;
    const std::string removed = k.removed_prefix(), moved = k.moved_prefix(), lost = k.lost_prefix();
    for (std::size_t i = 0; i < keys.size(); ++i) {
      std::string_view key = keys[i].str();
      if (key.starts_with(removed)) forget_gen(key.substr(removed.size()));
      else if (key.starts_with(moved)) forget_gen(key.substr(moved.size()));
      else if (key.starts_with(lost)) holdings_.forget_lost(key.substr(lost.size()));
    }
  }

  void forget_gen(std::string_view digits) {
    std::uint64_t g = 0;
    auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), g);
    if (ec != std::errc() || p != digits.data() + digits.size()) return;
    holdings_.forget_generation(g);
  }

  Context& ctx_;
  Holdings& holdings_;
  std::optional<redis::Connection> first_;  // start()'s, until run() takes it
  std::mutex mu_;  // leaf: for the retry wait and listener_
  redis::Connection* listener_ = nullptr;  // run()'s, while it listens
  bool following_ = false;                 // follow() broke it off: no failure
  std::condition_variable_any cv_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
