// Standby holders (docs/design.md, "The fd server and standby holding",
// says what is published where and why): every registry that hosts the
// control thread runs a Standby thread that publishes the fds this session
// serves, and when not the leader fetches and keeps, WITHOUT importing, the
// fd of every other allocation, so that a standby that becomes the
// allocator of record adopts everything in place (migration.hpp).
//
// The thread talks to Redis on its own connection and holds no lock across
// it. Its state (published_, last versions) is its own; FdTable and
// FdService have their own leaf mutexes.
#pragma once

#include "memcuda/config.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <span>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/detail/fd/fd_client.hpp"
#include "memcuda/detail/fd/fd_table.hpp"
#include "memcuda/detail/process/process.hpp"
#include "memcuda/detail/fd/fd_service.hpp"
#include "memcuda/detail/fd/fd_source.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/lease_view.hpp"
#include "memcuda/detail/store/allocations.hpp"
#include "memcuda/detail/store/reply.hpp"
#include "memcuda/redis/script.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// The allocations Hash's schema lives in store/allocations.hpp.
class Standby {
 public:
  // At most this long between two passes: bounds the window above.
  static constexpr std::chrono::milliseconds kTick{100};
  // A full pass (HGETALL) at least every this many ticks, changes or not:
  // repairs what a lost reply or a Redis restart left inconsistent.
  static constexpr int kFullEvery = 20;

  Standby(Context& ctx, LeaseView& lease) : ctx_(ctx), lease_(lease) {}
  ~Standby() { stop(); }
  Standby(const Standby&) = delete;
  Standby& operator=(const Standby&) = delete;

  struct Pass {
    bool full = false;          // the Hash was read
    std::size_t published = 0;  // fields written for this session's entries
    std::size_t withdrawn = 0;  // this session's fields deleted
    std::size_t fetched = 0;    // fds fetched and held
    std::size_t dropped = 0;    // held fds closed (their allocation left the Hash)
    std::size_t failed = 0;     // fetches that failed (retried next pass)
  };

  // One pass on `c` (see the file comment). `fetch_missing`: hold what we
  // lack (standbys: true; the leader: false). Thread-safe against itself
  // only through the caller (one thread runs it).
  Pass sync_once(redis::Connection& c, bool fetch_missing) {
    Pass p;
    const auto& k = ctx_.keys;
    auto svc = FdService::existing();
    const std::uint64_t sv = svc ? svc->version() : 0;
    auto vr = store::read_allocations_version(c, k);
    const std::string v = vr.is_nil() ? std::string() : std::string(vr.str());
    if (v == last_version_ && sv == last_service_version_ && !last_failed_ && ++quiet_ < kFullEvery) return p;
    quiet_ = 0;
    p.full = true;
    auto all = store::read_allocations(c, k);

    // 1. This session's entries, as it serves them now.
    std::map<std::string, std::string> mine;
    if (svc)
      for (const auto& e : svc->entries(ctx_.session))
        mine[e.key] = store::encode_allocation(ctx_.session, encode_fd_source(e.source));
    std::vector<std::string> writes;
    for (const auto& [key, value] : mine) {
      auto it = all.find(key);
      if (it != all.end() && it->second == value) continue;
      writes.insert(writes.end(), {"S", key, value});
      all[key] = value;
      ++p.published;
    }
    for (auto it = all.begin(); it != all.end();) {
      auto e = store::decode_allocation(it->second);
      if (e && e->owner == ctx_.session && !mine.count(it->first)) {
        writes.insert(writes.end(), {"D", it->first});
        it = all.erase(it);
        ++p.withdrawn;
      } else {
        ++it;
      }
    }
    std::string synced = v;
    if (!writes.empty()) synced = store::apply_allocations(c, k, writes);

    // 2. Close what left the Hash.
    auto& holds = Process::get().fds();
    for (const auto& key : holds.keys(ctx_.session)) {
      if (all.count(key)) continue;
      holds.drop(ctx_.session, key);
      ++p.dropped;
    }

    // 3. Hold what we lack.
    if (fetch_missing) hold_missing(all, p);
    last_version_ = synced;
    last_service_version_ = sv;
    last_failed_ = p.failed != 0;
    // The progress marker is a standby's: the leader holds nothing it
    // fetched, so it has none (and drops the one it had as a standby).
    if (fetch_missing && p.failed == 0) {
      store::write_standby_synced(c, k, ctx_.session, synced,
                                  std::chrono::milliseconds(std::max<std::int64_t>(3 * ctx_.opts.session_ttl.count(), 1000)));
      marker_ = true;
    } else if (!fetch_missing && marker_) {
      store::clear_standby_synced(c, k, ctx_.session);
      marker_ = false;
    }
    return p;
  }

  // Fetches and holds, without importing, the fd of every allocation in
  // `all` that another session serves and this one does not hold yet.
  void hold_missing(const std::map<std::string, std::string>& all, Pass& p) {
    auto& holds = Process::get().fds();
    for (const auto& [key, value] : all) {
      if (holds.holds(ctx_.session, key)) continue;
      auto e = store::decode_allocation(value);
      if (!e || e->owner == ctx_.session) continue;
      try {
        ServedSource src = decode_fd_source(e->source);
        // Only the registry's own fd server of the entry's owner process.
        check_fd_source(src, HolderId::pid_of(e->owner).value_or(0), "allocation " + key);
        FetchOptions fo;
        fo.timeout = std::chrono::milliseconds(500);
        holds.hold(ctx_.session, key, fetch(src.source, src.id, fo).fd);
        ++p.fetched;
      } catch (const std::exception& ex) {
        ++p.failed;
        if (++fetch_failures_ <= 5 || fetch_failures_ % 100 == 0)
          log(LogLevel::info, "standby: cannot hold allocation " + key + " yet: " + ex.what());
      }
    }
  }

  // Writes the entries this session serves that the Hash lacks (or has
  // otherwise), at once: the create path of the allocator of record
  // (Core::secure_new_allocations), rather than the thread's next tick.
  // Never deletes (the thread's pass does, from what it serves after
  // reading the Hash, so it never drops what this wrote for a served fd).
  // Stateless, so safe beside the thread.
  void publish_now(redis::Connection& c) {
    const auto& k = ctx_.keys;
    auto svc = FdService::existing();
    if (!svc) return;
    auto all = store::read_allocations(c, k);
    std::vector<std::string> ops;
    for (const auto& e : svc->entries(ctx_.session)) {
      std::string value = store::encode_allocation(ctx_.session, encode_fd_source(e.source));
      auto it = all.find(e.key);
      if (it == all.end() || it->second != value) ops.insert(ops.end(), {"S", e.key, std::move(value)});
    }
    if (!ops.empty()) store::apply_allocations(c, k, ops);
  }

  // Deletes the fields this session owns but no longer serves, at once
  // (trim_now: a trimmed slab's field goes before the call returns, rather
  // than at the thread's next tick). Stateless, so safe beside the thread.
  std::size_t withdraw_stale(redis::Connection& c) {
    const auto& k = ctx_.keys;
    std::set<std::string> mine;
    if (auto svc = FdService::existing())
      for (const auto& e : svc->entries(ctx_.session)) mine.insert(e.key);
    std::vector<std::string> ops;
    for (const auto& [key, value] : store::read_allocations(c, k)) {
      auto e = store::decode_allocation(value);
      if (e && e->owner == ctx_.session && !mine.count(key)) ops.insert(ops.end(), {"D", key});
    }
    if (ops.empty()) return 0;
    store::apply_allocations(c, k, ops);
    return ops.size() / 2;
  }

  // Starts the thread (once).
  void start() {
    std::lock_guard lk(mu_);
    if (thread_.joinable()) return;
    thread_ = std::jthread([this](std::stop_token st) { run(st); });
  }
  // Stops and joins the thread (at most one Redis command's timeout).
  void stop() {
    std::jthread t;
    {
      std::lock_guard lk(mu_);
      t = std::move(thread_);
    }
    if (t.joinable()) {
      t.request_stop();
      cv_.notify_all();
      t.join();
    }
  }

 private:
  void run(std::stop_token st) {
    std::optional<redis::Connection> conn;
    // A stop ends the wait on the wake list at once.
    std::stop_callback on_stop(st, [this] {
      std::lock_guard lk(mu_);
      if (blocked_on_) blocked_on_->interrupt();
    });
    int failures = 0;
    while (!st.stop_requested()) {
      bool standby = false;
      try {
        if (!conn) conn.emplace(ctx_.opts.redis);
        standby = !lease_.held();
        sync_once(*conn, standby);
        failures = 0;
      } catch (const std::exception& e) {
        if (++failures <= 3 || failures % 50 == 0) log(LogLevel::warn, std::string("standby: ") + e.what());
        if (dynamic_cast<const ConnectionError*>(&e)) conn.reset();
        last_failed_ = true;
        standby = false;
      }
      if (standby && conn && !st.stop_requested()) {
        // A standby waits on its wake list: the allocator of record pushes
        // to it as soon as it made an allocation (secure_new_allocations),
        // so the fd is held within milliseconds, not at the next tick.
        wait_for_wake(*conn);
        continue;
      }
      std::unique_lock lk(mu_);
      cv_.wait_for(lk, st, kTick, [] { return false; });
    }
    // Its progress marker goes with it (a killed process's expires).
    try {
      if (conn) {
        conn->clear_interrupt();
        store::clear_standby_synced(*conn, ctx_.keys, ctx_.session);
      }
    } catch (const std::exception&) {
    }
  }

  // At most kTick on the wake list; any failure (a stop's interrupt, a
  // lost link) just ends the wait: the next pass finds out.
  void wait_for_wake(redis::Connection& conn) {
    {
      std::lock_guard lk(mu_);
      blocked_on_ = &conn;
    }
    try {
      auto cmd = store::standby_wake_wait_cmd(ctx_.keys, ctx_.session, seconds_arg(kTick));
      std::vector<redis::Arg> args(cmd.begin(), cmd.end());
      (void)conn.blocking(kTick, std::span<const redis::Arg>(args));
    } catch (const std::exception&) {
    }
    std::lock_guard lk(mu_);
    blocked_on_ = nullptr;
  }

  Context& ctx_;
  LeaseView& lease_;
  std::mutex mu_;  // leaf: guards thread_ (start/stop), blocked_on_ and the tick wait
  redis::Connection* blocked_on_ = nullptr;  // the thread's connection while it waits on its wake list
  std::condition_variable_any cv_;
  std::jthread thread_;
  // The pass's own state (one thread runs sync_once).
  std::string last_version_ = "\x01";  // never a real version: the first pass is full
  std::uint64_t last_service_version_ = 0;
  bool last_failed_ = false;
  bool marker_ = false;  // this pass's thread wrote the progress marker
  int quiet_ = 0;
  std::uint64_t fetch_failures_ = 0;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
