// The thread every registry runs. It keeps the registry's session alive; when the registry may be
// allocator of record it also campaigns for the lease every ttl/3 (followers) or renews it,
// collects garbage and serves `tensor_lifecycle` (the leader). docs/design.md, "The lifecycle list",
// says how no command is lost or run twice: BLMOVE into its own processing list, a pending command
// finished first, the list requeued after a failed pass.
#pragma once

#include "memcuda/config.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stop_token>
#include <optional>
#include <thread>

#include "memcuda/detail/registry/core.hpp"
#include "memcuda/detail/registry/takeover/succession.hpp"
#include "memcuda/detail/store/reply.hpp"
#include "memcuda/detail/store/lease.hpp"
#include "memcuda/detail/store/lists.hpp"
#include "memcuda/detail/store/schema_repair.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class ControlLoop {
 public:
  // `conn` is this thread's own connection, made by the caller so that a
  // bad address fails in the registry's constructor, not in the thread.
  ControlLoop(std::shared_ptr<Core> core, redis::Connection conn)
      : core_(std::move(core)), conn_(std::move(conn)), beat_conn_(core_->ctx.opts.redis),
        succession_(core_->ctx, core_->sessions) {}

  // Registers the session and, when this registry may be allocator of
  // record, campaigns once, synchronously: the first registry to start is
  // the allocator of record by the time its constructor returns.
  void start() {
    core_->sessions.refresh(conn_);
    if (core_->ctx.opts.control_thread && !succession_.defer(conn_, defer_limit())) core_->lease.try_acquire(conn_);
    if (core_->ctx.opts.share_references) core_->invalidation.start();  // sharing from the first get on
  }

  void run(std::stop_token st) {
    std::stop_callback on_stop(st, [this] {
      { std::lock_guard lk(mu_); }  // a waiter between its check and its wait sees the stop
      cv_.notify_all();
      if (blocked_.load()) conn_.interrupt();
    });
    const auto& opts = core_->ctx.opts;
    const auto period = opts.heartbeat_period();
    // The session and the lease are kept alive by a thread of their own, so
    // a slow command (a large first cudaMalloc, a sanitizer) never lets them
    // expire while this process is alive and serving.
    std::jthread beat([this, period](std::stop_token bst) { heartbeat(bst, period); });
    // The reference cache's invalidation listener (invalidation.hpp), when
    // references are shared; stopped and joined when this function returns.
    std::jthread invalidation;
    if (opts.share_references) invalidation = std::jthread([this](std::stop_token ist) { core_->invalidation.run(ist); });
    const auto now = std::chrono::steady_clock::now();
    Schedule at{now + period, now + opts.gc_interval, now};
    while (!st.stop_requested()) {
      try {
        pass(st, at, period);
      } catch (const AuthError& e) {
        if (st.stop_requested()) break;
        credentials_refused(e, st, period);
      } catch (const std::exception& e) {
        if (st.stop_requested()) break;
        sweep_ = true;  // the next pass as leader requeues what a lost reply stranded
        if (++failures_ <= 3 || failures_ % 50 == 0)
          log(LogLevel::warn, std::string("control thread: ") + e.what());
        // Redis away: a leader that cannot renew loses its lease by expiry
        // anyway; back off before trying again.
        backoff(st, std::min(period, std::chrono::milliseconds(200)));
      }
    }
    beat.request_stop();
    beat.join();
    end_session();
  }

 private:
  // When the loop's periodic work is next due.
  struct Schedule {
    std::chrono::steady_clock::time_point tick, gc, recover;
  };

  // One pass: the periodic work that is due, then a wait for work (serve
  // one command as the leader, read the inbox as a follower).
  void pass(std::stop_token st, Schedule& at, std::chrono::milliseconds period) {
    const auto& opts = core_->ctx.opts;
    const bool campaign = opts.control_thread;
    // A leader's loop stuck in a call (a driver that hangs): the
    // heartbeat must give the lease up (tests/test_resilience.cpp).
    if (core_->is_leader() && MEMCUDA_FAULT("control.stall"))
      std::this_thread::sleep_for(std::max(3 * opts.serve_stall_timeout, std::chrono::milliseconds(1000)));
    auto now = std::chrono::steady_clock::now();
    if (now >= at.tick) tick(now, at, period);
    if (core_->is_leader() && now >= at.gc) {
      const auto token = core_->lease.current().first;
      task("garbage collection", [&] { core_->sessions.collect(conn_, token); });
      task("migration", [&] { core_->migration.round(conn_, token); });
      at.gc = now + opts.gc_interval;
    }
    if (const auto asked = recover_asked_.load(); asked != recover_ran_.load() && now >= at.recover) {
      // Redis lost our session (data loss, a long stop, a failover): put back what this process
      // owns and holds; retried until every reference found its record, for at most kRecoverWindow.
      // A pass the connection moved under, or a switch noticed meanwhile, runs again.
      bool done = false, moved = true;
      task("recovery", [&] {
        const std::string on = conn_.server();
        done = core_->recovery.run(conn_);
        if ((moved = conn_.server() != on) || recover_asked_.load() != asked) return;
        core_->sessions.registered_on(on);  // each holding re-registered or claimed there, said now:
        core_->sessions.refresh(conn_);     // the owner's held frees wait for it
      });
      if (!moved && (done || now >= recover_until_.load())) recover_ran_.store(asked);
      at.recover = now + period;
    }
    // A command taken under a lease we no longer hold is the next
    // leader's (it re-queues our processing list).
    if (!core_->is_leader()) pending_.reset();
    if (core_->is_leader()) {
      auto until = std::min(at.tick, at.gc);
      serve_one(std::chrono::duration_cast<std::chrono::milliseconds>(until - now), st);
    } else {
      // A follower watching the holder's pid wakes every kWatchPeriod:
      // a proven death is a campaign now, not at the lease's expiry.
      const bool watch = campaign && core_->lease.watching();
      auto until = watch ? std::min(at.tick, now + Lease::kWatchPeriod) : at.tick;
      read_inbox(std::chrono::duration_cast<std::chrono::milliseconds>(until - now), st);
      if (watch && core_->lease.break_if_holder_dead(conn_)) at.tick = std::chrono::steady_clock::now();
    }
    failures_ = 0;
    if (auth_failing_) {
      log(LogLevel::info, "control thread: Redis accepts our credentials again");
      auth_failing_ = false;
      last_auth_error_.clear();
    }
    last_pass_ = std::chrono::steady_clock::now();
  }

  // Every period: campaign (a follower) or trim and publish the pools (the
  // leader).
  void tick(std::chrono::steady_clock::time_point now, Schedule& at, std::chrono::milliseconds period) {
    if (core_->ctx.opts.control_thread) {
      // A new allocator of record takes over its dead predecessor's
      // tensors in its first GC round: run it now, not a gc_interval on.
      // A standby that holds every fd-shared allocation goes first
      // (succession.hpp): it adopts what this process would lose.
      if (!core_->is_leader() && !stalled() && !succession_.defer(conn_, defer_limit()) &&
          core_->lease.try_acquire(conn_))
        at.gc = now;
      if (core_->is_leader()) {
        task("trimming the pools", [&] { core_->alloc.trim_and_announce(conn_, false); });
        task("publishing pool statistics", [&] { core_->alloc.publish_pool_stats(conn_); });
        task("reading the inbox", [&] { core_->drain_inbox(conn_); });
      }
      if (core_->ctx.opts.fleet) task("this node's endpoint", [&] { core_->node.tick(conn_, core_->is_leader()); });
    }
    task("settling held frees", [&] { core_->alloc.settle_held_frees(conn_); });
    at.tick = now + period;
    Process::get().fds().expire();  // fds sent along unasked must not pin memory long
    if (auto live = LiveLock::existing()) live->tend();  // dead processes' marks go
  }

  // Credentials no longer work (a password rotation, an ACL change):
  // nothing this process owns is given up for it. The lease lapses (it
  // cannot be renewed) and the loop keeps trying with backoff, so a
  // password restored, or rotated into the password file, is picked up and
  // this process serves or campaigns again. Logged once per distinct error.
  void credentials_refused(const AuthError& e, std::stop_token st, std::chrono::milliseconds period) {
    core_->lease.lose(e.what());
    if (e.what() != last_auth_error_) {
      log(LogLevel::error, std::string("control thread: Redis refuses our credentials (retrying; rotate them "
                                       "through the password file, docs/operations.md): ") + e.what());
      last_auth_error_ = e.what();
    }
    auth_failing_ = true;
    sweep_ = true;
    last_pass_ = std::chrono::steady_clock::now();  // not a stall: nothing to serve without Redis
    failures_ = std::min(failures_ + 1, 5);
    backoff(st, std::min(period * (1 << failures_), std::chrono::milliseconds(5000)));
  }

  // After the loop: the releases queued so far, then the lease and the
  // session, each given up in Redis.
  void end_session() {
    const auto& opts = core_->ctx.opts;
    // The stop callback may have interrupted a blocking call that had just
    // returned: the goodbye below must still reach Redis.
    conn_.clear_interrupt();
    // Releases queued by destructors land before the session ends (bounded:
    // the garbage collector drops what is left once the session is gone).
    (void)Process::get().releases().flush(std::min(opts.request_timeout, std::chrono::milliseconds(2000)));
    try {
      core_->node.withdraw(conn_);
      if (core_->is_leader()) hand_over();
      core_->lease.release(conn_);
      core_->sessions.end(conn_);
    } catch (const std::exception& e) {
      log(LogLevel::warn, std::string("ending the session: ") + e.what());
    }
  }

  // One periodic task of the loop. Its failure is its own: logged (three
  // times, then every 100th) and the loop goes on serving. A lost link
  // (ConnectionError, TimeoutError) still ends the pass: the loop backs off
  // and sweeps its processing list.
  template <class F>
  void task(const char* what, F&& f) {
    try {
      f();
    } catch (const ConnectionError&) {
      throw;
    } catch (const TimeoutError&) {
      throw;
    } catch (const std::exception& e) {
      auto& n = task_failures_[what];
      if (++n <= 3 || n % 100 == 0)
        log(LogLevel::warn, std::string("control thread: ") + what + " failed (" + std::to_string(n) +
                                " time(s); serving goes on): " + e.what());
    }
  }

  void backoff(std::stop_token& st, std::chrono::milliseconds d) {
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, st, d, [] { return false; });
  }

  // How long in a row a campaign waits for a standby that holds more fds: two of its campaign periods.
  std::chrono::milliseconds defer_limit() const {
    return std::max(2 * core_->ctx.opts.heartbeat_period(), std::chrono::milliseconds(500));
  }

  // No pass for serve_stall_timeout (a fleet pull: its bound from its last move): give the lease up.
  bool stalled() const {
    auto limit = core_->ctx.opts.serve_stall_timeout;
    auto last = last_pass_.load();
    if (const Puller& p = core_->node.puller(); limit.count() > 0 && p.running())
      last = std::max(last, p.last_progress()), limit = std::max(limit, p.wait_bound());
    return limit.count() > 0 && std::chrono::steady_clock::now() - last > limit;
  }

  // A graceful stop of the allocator of record. With a standby, what this
  // process allocated stays alive in the fds the standbys hold (host fds are
  // also served on until exit: Allocation::retained), and the standby adopts
  // it in place, as after a crash. Without one, the tensors go with this
  // process, and it says so.
  void hand_over() {
    auto& c = conn_;
    const auto owned = core_->alloc.owned_summary();
    if (owned.tensors == 0) return;
    const std::size_t standbys = core_->sessions.standbys(c);
    if (standbys == 0) {
      log(LogLevel::warn, "stopping the allocator of record with no standby: its " + std::to_string(owned.tensors) +
                              " tensor(s), " + std::to_string(owned.persistent) +
                              " persistent, are freed with it (start a second `memcuda serve` first to keep them)");
      return;
    }
    // Publish what this process serves now (its standby thread would at its
    // next tick): the standbys' progress is measured against it.
    core_->standby.stop();
    core_->standby.sync_once(c, false);
    wait_for_standbys(c);
    const std::size_t kept = core_->alloc.retain_for_handover();
    log(LogLevel::info, "handing " + std::to_string(owned.tensors) + " tensor(s) over to " +
                            std::to_string(standbys) + " standby(s) (the memory lives on in the fds they hold; " +
                            std::to_string(kept) + " host allocation(s) served on until this process exits)");
    if (owned.legacy_ipc)
      log(LogLevel::warn, std::to_string(owned.legacy_ipc) +
                              " tensor(s) are legacy CUDA IPC allocations, whose memory dies with this process: "
                              "only those another live process maps are copied (use cuda_allocation=vmm)");
  }

  // A standby adopts only what it holds the fd of. Waits (at most kHandoverWait) until every
  // standby's progress marker has caught up with the allocations Hash.
  void wait_for_standbys(redis::Connection& c) {
    const auto deadline = std::chrono::steady_clock::now() + kHandoverWait;
    while (!core_->sessions.standbys_synced(c)) {
      if (std::chrono::steady_clock::now() >= deadline) {
        log(LogLevel::warn, "handing over: a standby has not fetched every allocation's fd yet; "
                            "allocations it lacks are copied from live holders or lost");
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  void heartbeat(std::stop_token st, std::chrono::milliseconds period) {
    std::mutex m;
    std::condition_variable_any cv;
    int failures = 0;
    bool gave_up = false;
    redis::SentinelWatch watch(core_->ctx.opts.redis);  // follows a failover within a period
    std::string server;                                  // the keys' server at the last beat
    while (!st.stop_requested()) {
      watch.poll();
      try {
        const bool lost = !core_->sessions.refresh(beat_conn_);
        // A new primary may lack the old one's last writes (asynchronous replication).
        const bool switched = core_->ctx.opts.redis.replicated() && !server.empty() && beat_conn_.server() != server;
        if (switched)
          log(LogLevel::warn, "the Redis primary of this namespace is now " + beat_conn_.server() + " (was " + server +
                                  "): re-registering what this process owns and holds");
        server = beat_conn_.server();
        if (lost || switched) {
          if (switched) core_->alloc.note_primary_switch();  // frees wait until holders re-registered
          recover_until_ = std::chrono::steady_clock::now() + kRecoverWindow;
          core_->holdings.flush();  // GC may have dropped what we held: no cached get until re-registered
          ++recover_asked_;
        } else if (recover_asked_.load() == recover_ran_.load()) {
          core_->sessions.registered_first(server);  // nothing to re-register yet; after that, recovery says
        }
        core_->invalidation.follow(server);  // the keys' server, as the beat just reached it
        if (core_->is_leader()) {
          if (stalled()) {
            // The loop cannot serve: hand the lease to a standby rather than
            // keep renewing for a leader that answers nobody.
            if (!gave_up)
              log(LogLevel::error, "control thread: no pass completed in " +
                                       std::to_string(core_->ctx.opts.serve_stall_timeout.count()) +
                                       " ms; giving up the allocator-of-record lease");
            gave_up = true;
            core_->lease.release(beat_conn_);
          } else {
            core_->lease.renew(beat_conn_);
          }
        } else if (gave_up && !stalled()) {
          gave_up = false;
        }
        failures = 0;
      } catch (const std::exception& e) {
        if (++failures <= 3 || failures % 50 == 0) log(LogLevel::warn, std::string("heartbeat: ") + e.what());
      }
      std::unique_lock lk(m);
      cv.wait_for(lk, st, period, [] { return false; });
    }
  }

  // One blocking pop (the server waits `block`, the last argument) that
  // the stop callback can interrupt; nil when it timed out or a stop was
  // requested.
  redis::Reply blocking_pop(std::stop_token& st, std::chrono::milliseconds block, std::vector<std::string> cmd) {
    cmd.push_back(seconds_arg(block));
    std::vector<redis::Arg> args(cmd.begin(), cmd.end());
    blocked_.store(true);
    struct Unblock {
      std::atomic<bool>& b;
      ~Unblock() { b.store(false); }
    } unblock{blocked_};
    if (st.stop_requested()) return {};
    return conn_.blocking(block, std::span<const redis::Arg>(args));
  }

  static std::chrono::milliseconds clamp_block(std::chrono::milliseconds budget) {
    return std::clamp(budget, std::chrono::milliseconds(1), std::chrono::milliseconds(250));
  }

  // A follower waits for the next tick on its inbox (messages from the
  // allocator of record: copy a tensor whose exporter died, free memory it
  // still owns, forget a dead exporter's mappings, close returned slabs).
  void read_inbox(std::chrono::milliseconds budget, std::stop_token& st) {
    auto r = schema::own_list(conn_, core_->ctx.keys, core_->ctx.keys.inbox(core_->ctx.session), [&] {
      return blocking_pop(st, clamp_block(budget), store::inbox_pop_cmd(core_->ctx.keys, core_->ctx.session));
    });
    if (r.is_nil()) return;
    core_->handle_inbox(conn_, std::string(r[1].str()));
  }

  // A command taken from the lifecycle list and not finished yet.
  struct Pending {
    std::string processing;  // the processing list it sits in
    std::string raw;
    int attempts = 0;                       // executions that failed on the link
    std::optional<std::string> answer_to;   // decided reply: (reply_to, body)
    std::string answer;
  };

  void serve_one(std::chrono::milliseconds budget, std::stop_token& st) {
    if (pending_) return finish();  // a failed pass left it: before anything new
    const auto& k = core_->ctx.keys;
    const std::string processing = k.processing(core_->lease.current().second);
    if (sweep_) {
      // A pass failed on the link: a BLMOVE may have run with its reply
      // lost, leaving a command in our processing list that no one serves
      // (kRequeue skips the leader's own list). Nothing is pending now, so
      // everything there is such a stray: back onto the lifecycle list, at
      // the end served next, oldest first.
      while (schema::own_list(conn_, k, processing, [&] { return store::requeue_one(conn_, k, processing); })) {
      }
      sweep_ = false;
    }
    auto r = schema::own_list(conn_, k, processing, [&] {
      return blocking_pop(st, clamp_block(budget), store::take_command_cmd(k, processing));
    });
    if (r.is_nil()) return;
    if (MEMCUDA_FAULT("control.blmove_reply_lost")) throw ConnectionError("fault point control.blmove_reply_lost");
    pending_.emplace();
    pending_->processing = processing;
    pending_->raw = std::string(r.str());
    finish();
  }

  // Executes (or answers) the pending command, replies, and takes it off
  // the processing list. A link failure leaves it pending (the loop backs
  // off and calls again); nothing else does.
  void finish() {
    Pending& p = *pending_;
    if (!p.answer_to) decide(p);
    send_reply(p);
    pending_.reset();
  }

  void decide(Pending& p) {
    protocol::Command cmd;
    try {
      cmd = protocol::decode_command(p.raw);
    } catch (const std::exception& e) {
      log(LogLevel::warn, std::string("rejected lifecycle command: ") + e.what());
      auto route = protocol::peek_reply_route(p.raw);
      p.answer_to = route ? route->reply_to : std::string();
      if (route) {
        auto rep = protocol::make_error_reply(nullptr, e);
        rep.id = route->id;
        rep.id_is_number = route->id_is_number;
        p.answer = protocol::encode_reply(rep);
      }
      return;
    }
    protocol::Reply rep;
    try {
      rep = core_->executor.execute(conn_, cmd);
    } catch (const IoError& e) {
      if (Executor::idempotent(cmd.op) && ++p.attempts < kMaxAttempts) throw;  // stays pending: replayed next pass
      log(LogLevel::warn, std::string(to_string(cmd.op)) + " '" + cmd.name +
                              "': the link to Redis failed while executing it: " + e.what());
      rep = protocol::make_error_reply(
          &cmd, Unavailable("the allocator of record lost its link to Redis while executing " +
                            std::string(to_string(cmd.op)) + " '" + cmd.name +
                            "'; it may or may not have taken effect (" + e.what() + ")"));
    } catch (const RedisError& e) {
      rep = protocol::make_error_reply(&cmd, e);
    } catch (const std::exception& e) {
      log(LogLevel::info, std::string(to_string(cmd.op)) + " '" + cmd.name + "' failed: " + e.what());
      rep = protocol::make_error_reply(&cmd, e);
    }
    p.answer_to = cmd.reply_to.value_or(std::string());
    if (cmd.reply_to) p.answer = protocol::encode_reply(rep);
  }

  // Replies and takes the command off the processing list in one script
  // (kFinish): a retry, or a successor re-queuing the list, never answers
  // it twice.
  void send_reply(const Pending& p) {
    // reply_to is untrusted: never write into mem-cuda's own keys (other
    // than registries' reply lists) or the lifecycle list itself.
    const std::string& to = *p.answer_to;
    const auto& k = core_->ctx.keys;
    bool deliver = !to.empty();
    if (deliver && (to == k.lifecycle() || (to.starts_with(k.own_prefix()) && !k.is_reply(to)))) {
      log(LogLevel::warn, "refusing to reply to '" + to + "': a key of the registry itself");
      deliver = false;
    }
    auto done = store::finish_command(conn_, p.processing, deliver ? to : std::string(), p.raw, p.answer,
                                      std::chrono::milliseconds(60000));
    if (MEMCUDA_FAULT("control.after_reply")) throw ConnectionError("fault point control.after_reply");
    if (done == 0) log(LogLevel::warn, "could not reply to '" + to + "': not a list");
  }

  std::shared_ptr<Core> core_;
  redis::Connection conn_;
  redis::Connection beat_conn_;  // the heartbeat thread's own
  Succession succession_;        // this thread's only (and start()'s, before it runs)
  std::optional<Pending> pending_;  // this thread's only
  bool sweep_ = false;              // this thread's only: a pass failed, sweep our processing list
  static constexpr int kMaxAttempts = 20;
  std::mutex mu_;
  std::condition_variable_any cv_;
  std::atomic<bool> blocked_{false};
  int failures_ = 0;
  bool auth_failing_ = false;     // this thread's only
  std::string last_auth_error_;   // this thread's only: logged once per change
  std::map<std::string, std::uint64_t> task_failures_;  // this thread's only
  std::atomic<std::chrono::steady_clock::time_point> last_pass_{std::chrono::steady_clock::now()};  // stall watch's
  static constexpr auto kHandoverWait = std::chrono::milliseconds(2000);
  static constexpr auto kRecoverWindow = std::chrono::milliseconds(Sessions::kRepublishGraceMs);
  std::atomic<std::uint64_t> recover_asked_{0}, recover_ran_{0};  // by the heartbeat; by the loop's recovery
  std::atomic<std::chrono::steady_clock::time_point> recover_until_{};
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
