// Freed blocks held out of their pool while a Redis failover could still
// undo the free (Sentinel, Cluster; a single server frees at once).
//
// Replication is asynchronous: the promoted replica may lack the last
// writes of the old primary, and the old primary takes writes until the
// sentinels demote it. When the lost write was a reference taken, another
// holder's release reaches zero on the new primary and frees a block still
// in use; when it was a remove, the record comes back naming a block that
// was freed. Reused, either shows a holder another tensor's bytes. So a
// freed block waits here until
//   1. a replica acknowledged the write that freed it (WAIT 1 for the
//      replica wait, or kFreeWait; not in time: a switch or kUnackedHold), and
//   2. this process would have noticed a switch that came before the
//      free (its heartbeat period and a sentinel poll: notice_), and a
//      grace passed since the last switch it noticed: every process
//      notices a switch within its heartbeat and re-registers what it
//      holds (Recovery), leaving a claim where the record is gone
//      (recovery_scripts.hpp), and, within kUnackedHold of a switch, every
//      live session says it did (its session value's "registered" names
//      this primary). Under Sentinel a switch lasts while the
//      sentinels name different primaries: the one that led the failover
//      names the new primary first, and processes that follow the others
//      still take references on the old one, which the new primary never
//      sees (watch_sentinels);
// then the Redis state is read once more. The record back (under its name
// or unlinked) or a claim: the block stays owned (a claimed one is
// published again, unlinked, for its holders); else it goes to its pool.
#pragma once

#include "memcuda/config.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <optional>

#include "memcuda/detail/base/log.hpp"
#include "memcuda/detail/pool/device_pool.hpp"
#include "memcuda/detail/store/keys.hpp"
#include "memcuda/detail/store/recovery_scripts.hpp"
#include "memcuda/detail/store/script_call.hpp"
#include "memcuda/redis/connection.hpp"
#include "memcuda/redis/errors.hpp"
#include "memcuda/tensor_info.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// An allocation a process owns as (ex-)allocator of record.
struct OwnedBlock {
  DevicePool* pool;
  PoolBlock pb;
  TensorInfo info;  // its record as published (republished if Redis loses it)
  bool persistent = false;
};

class HeldFrees {
 public:
  using Clock = std::chrono::steady_clock;
  // How long a free no replica acknowledged waits for a switch to show up.
  static constexpr std::chrono::seconds kUnackedHold{30};

  // `period`: the heartbeat's. A switch is seen within one period and one
  // sentinel poll (250 ms), and Recovery runs within one more loop pass.
  HeldFrees(bool replicated, std::chrono::milliseconds period)
      : on_(replicated), notice_(period + std::chrono::milliseconds(500)),
        grace_(4 * period + std::chrono::milliseconds(250)) {}

  bool on() const noexcept { return on_; }

  // How long a free waits for one replica to acknowledge it: the replica
  // wait, or kFreeWait when that is off (a free reused on a write the
  // failover rolls back would show a holder another tensor's bytes).
  static constexpr std::chrono::milliseconds kFreeWait{100};

  // Holds a block freed by the last write on `c`, after the replica wait
  // for that write (store::replicate). A Redis error there holds it as
  // not acknowledged (never lost), and is not the caller's: its free is done.
  void hold(redis::Connection& c, OwnedBlock o) {
    bool acked = false;
    try {
      acked = wait_replica(c);
    } catch (const std::exception&) {
    }
    hold_as(std::move(o), acked);
  }
  void hold_as(OwnedBlock o, bool acked) {
    std::lock_guard lk(mu_);
    held_.push_back({std::move(o), Clock::now(), acked});
  }
  // This process saw the keys' server change (heartbeat).
  void note_switch() {
    std::lock_guard lk(mu_);
    switched_ = Clock::now();
  }
  std::size_t size() const {
    std::lock_guard lk(mu_);
    return held_.size();
  }
  std::uint64_t undone() const noexcept { return undone_.load(); }

  // Settles what is due (the loop's tick): `keep` takes a block back as
  // owned. On a Redis error the due blocks go back to wait, and it throws.
  // Frees not acknowledged yet are probed first, at most once a second: a
  // write to `ack_key` and one WAIT cover all of them.
  // `elsewhere` lists the live sessions not yet registered on this primary
  // (sessions_registered_elsewhere): while any is, nothing is settled.
  void settle(redis::Connection& c, const Keys& k, const std::string& ack_key,
              const std::function<void(OwnedBlock)>& keep, const std::function<std::vector<std::string>()>& elsewhere) {
    watch_sentinels(c);
    probe(c, ack_key);
    std::vector<Entry> due = take_due();
    if (due.empty()) return;
    bool wait = true;
    try {
      wait = awaiting_reregistration(elsewhere);
    } catch (...) {
      requeue(due);
      throw;
    }
    if (wait) return requeue(due);
    std::vector<redis::Command> cmds;
    for (const auto& e : due)
      for (auto& cmd : store::freed_state_cmds(k, e.o.info.name, e.o.info.generation)) cmds.push_back(std::move(cmd));
    try {
      std::vector<std::exception_ptr> errs;
      auto r = c.pipeline(cmds, &errs);
      for (std::size_t i = 0; i < due.size(); ++i) {
        auto& e = due[i];
        const auto& name = r[3 * i];
        const auto& unl = r[3 * i + 1];
        const auto& claim = r[3 * i + 2];
        if (transient(name) || transient(unl) || transient(claim)) continue;  // next tick
        const auto gen = std::to_string(e.o.info.generation);
        const bool named = !name.is_error() && !name.is_nil() && name.str() == gen;
        const bool unlinked = !unl.is_error() && unl.integer() == 1;
        bool claimed = false;  // by a holder's count: a hand-written key claims nothing
        for (std::size_t j = 1; !claim.is_error() && j < claim.size(); j += 2) claimed |= count_of(claim[j].str()) > 0;
        if (!named && !unlinked && !claimed) {
          e.o.pool->deallocate(e.o.pb);
          e.o.pool = nullptr;
          continue;
        }
        if (!named && !unlinked) store::republish(c, k, e.o.info, e.o.persistent, /*may_name=*/false);
        // The claimants' references, registered for them: a holder whose
        // recovery window has closed would not come back for them.
        for (std::size_t j = 0; claimed && j + 1 < claim.size(); j += 2)
          if (const auto n = count_of(claim[j + 1].str()); n > 0)
            store::reregister(c, k, e.o.info.name, e.o.info.generation, std::string(claim[j].str()), n);
        if (claimed) store::drop_claim(c, k, e.o.info.generation);
        log(LogLevel::warn, "a Redis failover undid the free of '" + e.o.info.name + "' generation " + gen + " (" +
                                (named ? "its record is back" : unlinked ? "its unlinked record is back"
                                                                         : "a holder re-registered it") +
                                "): its memory stays allocated");
        ++undone_;
        keep(std::move(e.o));
        e.o.pool = nullptr;
      }
      requeue(due);  // the ones an error reply left: again at the next tick
    } catch (...) {
      requeue(due);
      throw;
    }
  }

 private:
  static bool wait_replica(redis::Connection& c) {
    const auto wait = c.options().replica_wait;
    return store::replicate(c, wait.count() > 0 ? wait : kFreeWait);
  }
  // A WRONGTYPE reply is a key someone overwrote: it names nothing, so it
  // counts as absent (else the block would stay held forever); any other
  // error (LOADING, BUSY) is transient.
  static bool transient(const redis::Reply& r) {
    return r.is_error() && redis::error_prefix(r.str()) != "WRONGTYPE";
  }
  // A claim's count, or 0 for what no holder wrote.
  static std::int64_t count_of(std::string_view v) {
    std::int64_t n = 0;
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    return ec == std::errc{} && p == v.data() + v.size() && n > 0 ? n : 0;
  }

  // A holder's recovery runs on its own loop, which a busy machine or a
  // connection still waiting out the dead primary can hold up past the
  // grace: within kUnackedHold of a switch, frees wait until every live
  // session has re-registered on this primary (it says so in its session
  // value). Past that, one still behind is named once, and not waited for.
  bool awaiting_reregistration(const std::function<std::vector<std::string>()>& elsewhere) {
    Clock::time_point sw;
    {
      std::lock_guard lk(mu_);
      sw = switched_;
    }
    const bool late = Clock::now() - sw >= kUnackedHold;
    if (sw == Clock::time_point{} || (late && sw == late_checked_)) return false;
    const auto behind = elsewhere();
    if (!late) return !behind.empty();
    late_checked_ = sw;
    if (!behind.empty())
      log(LogLevel::warn, std::to_string(behind.size()) + " session(s), one " + behind.front() +
                              ", have not re-registered on the new Redis primary " +
                              std::to_string(kUnackedHold.count()) +
                              " s after the switch: freed blocks no longer wait for them");
    return false;
  }

  // While frees are held, each tick asks every sentinel: names that differ,
  // one other than the server `c` reads, or another than at the last ask
  // mean a failover is spreading, a switch now. A split that outlasts
  // kUnackedHold (a sentinel watching another server under the service's
  // name) is logged once and holds frees no longer. No sentinel answering
  // leaves the timing rules alone.
  void watch_sentinels(redis::Connection& c) {
    if (c.options().sentinels.empty() || size() == 0) return;
    if (!census_) census_.emplace(c.options());
    const auto a = census_->ask();
    if (a.answered == 0) return;
    const auto now = Clock::now();
    const bool moved = a.agreed && !agreed_.empty() && *a.agreed != agreed_;
    if (a.agreed) agreed_ = *a.agreed;
    if (a.agreed && *a.agreed == c.server() && !moved) {
      split_since_.reset();
      split_logged_ = false;
      return;
    }
    if (!split_since_) split_since_ = now;
    if (now - *split_since_ <= kUnackedHold) return note_switch();
    if (!split_logged_)
      log(LogLevel::warn, "the sentinels have named different primaries for over " +
                              std::to_string(kUnackedHold.count()) +
                              " s: freed blocks no longer wait for them to agree (check each sentinel's "
                              "SENTINEL get-master-addr-by-name)");
    split_logged_ = true;
  }

  void probe(redis::Connection& c, const std::string& ack_key) {
    const auto now = Clock::now();
    {
      std::lock_guard lk(mu_);
      if (now - probed_ < std::chrono::seconds(1) ||
          std::none_of(held_.begin(), held_.end(), [](const Entry& e) { return !e.acked; }))
        return;
      probed_ = now;
    }
    c.command({"SET", ack_key, std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count(),
               "PX", 60000});
    if (!wait_replica(c) && !replicaless(c)) return;
    std::lock_guard lk(mu_);
    for (auto& e : held_)
      if (e.at <= now) e.acked = true;
  }

  // A primary with no replica attached (ROLE lists the ones it has now, as
  // after a cluster failover whose old primary died): no failover can
  // promote a server that lacks the free, since one that attaches later
  // syncs from this primary first; the free stands as if acknowledged, and
  // the blocks do not wait kUnackedHold. Left open: a replica whose link
  // was down just then, promoted before it reconnected.
  static bool replicaless(redis::Connection& c) noexcept {
    try {
      auto r = c.command({"ROLE"});
      return r.size() >= 3 && r[0].is_string() && r[0].str() == "master" && r[2].size() == 0;
    } catch (const std::exception&) {
      return false;
    }
  }

  struct Entry {
    OwnedBlock o;
    Clock::time_point at;
    bool acked;
  };

  // Due entries not settled (their pool still set) wait again.
  void requeue(std::vector<Entry>& due) {
    std::lock_guard lk(mu_);
    for (auto& e : due)
      if (e.o.pool) held_.push_back(std::move(e));
  }

  std::vector<Entry> take_due() {
    std::vector<Entry> due;
    const auto now = Clock::now();
    std::lock_guard lk(mu_);
    auto it = std::partition(held_.begin(), held_.end(), [&](const Entry& e) {
      const bool switched_since = switched_ > e.at;
      const bool safe = e.acked || switched_since || now - e.at >= kUnackedHold;
      return !(safe && now >= std::max(e.at + notice_, switched_ + grace_));
    });
    due.assign(std::make_move_iterator(it), std::make_move_iterator(held_.end()));
    held_.erase(it, held_.end());
    return due;
  }

  const bool on_;
  const std::chrono::milliseconds notice_, grace_;
  mutable std::mutex mu_;  // leaf: guards held_, switched_; never held across Redis or a pool's call
  std::vector<Entry> held_;
  Clock::time_point switched_{}, probed_{};
  std::atomic<std::uint64_t> undone_{0};
  Clock::time_point late_checked_{};  // the switch checked for laggards once late (the loop's thread only)
  // watch_sentinels' state: the loop's thread only
  std::optional<redis::SentinelCensus> census_;
  std::string agreed_;  // the primary the sentinels agreed on at the last ask
  std::optional<Clock::time_point> split_since_;
  bool split_logged_ = false;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
