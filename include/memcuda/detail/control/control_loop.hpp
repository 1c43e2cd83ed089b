// The thread every registry runs. It keeps the registry's session alive;
// when the registry may be allocator of record it also campaigns for the
// lease every ttl/3 (followers) or renews it, collects garbage and serves
// `tensor_lifecycle` (the leader), taking each command with
// BLMOVE into its own processing list, so a command taken by a leader that
// dies before finishing is queued again by the next leader (kRequeue).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <stop_token>
#include <thread>

#include "memcuda/detail/registry_core.hpp"

namespace memcuda::detail {

class ControlLoop {
 public:
  // `conn` is this thread's own connection, made by the caller so that a
  // bad address fails in the registry's constructor, not in the thread.
  ControlLoop(std::shared_ptr<RegistryCore> core, redis::Connection conn)
      : core_(std::move(core)), conn_(std::move(conn)), beat_conn_(core_->opts.redis) {}

  // Registers the session and, when this registry may be allocator of
  // record, campaigns once, synchronously: the first registry to start is
  // the allocator of record by the time its constructor returns.
  void start() {
    core_->refresh_session(conn_);
    if (core_->opts.control_thread) core_->try_acquire_lease(conn_, scripts_);
  }

  void run(std::stop_token st) {
    std::stop_callback on_stop(st, [this] {
      {
        std::lock_guard lk(mu_);
      }
      cv_.notify_all();
      if (blocked_.load()) conn_.interrupt();
    });
    const bool campaign = core_->opts.control_thread;
    const auto period = std::max(std::min(core_->opts.lease_ttl, core_->opts.session_ttl) / 3,
                                 std::chrono::milliseconds(10));
    // The session and the lease are kept alive by a thread of their own, so
    // a slow command (a large first cudaMalloc, a sanitizer) never lets them
    // expire while this process is alive and serving.
    std::jthread beat([this, period](std::stop_token bst) { heartbeat(bst, period); });
    auto next_tick = std::chrono::steady_clock::now() + period;
    auto next_gc = std::chrono::steady_clock::now() + core_->opts.gc_interval;
    auto next_recover = std::chrono::steady_clock::now();
    while (!st.stop_requested()) {
      try {
        auto now = std::chrono::steady_clock::now();
        if (now >= next_tick) {
          if (campaign) {
            if (!core_->is_leader()) core_->try_acquire_lease(conn_, scripts_);
            if (core_->is_leader()) {
              core_->trim_and_announce(conn_, false);
              core_->publish_pool_stats(conn_);
            }
          }
          next_tick = now + period;
        }
        if (core_->is_leader() && now >= next_gc) {
          core_->gc_round(conn_, scripts_);
          next_gc = now + core_->opts.gc_interval;
        }
        if (recover_.load() && now >= next_recover) {
          // Redis lost our session (data loss or a long stop): put back what
          // this process owns and holds; retried until every reference found
          // its record, for at most kRecoverWindow.
          if (core_->recover(conn_, scripts_) || now >= recover_until_.load()) recover_.store(false);
          next_recover = now + period;
        }
        if (core_->is_leader()) {
          auto until = std::min(next_tick, next_gc);
          serve_one(std::chrono::duration_cast<std::chrono::milliseconds>(until - now), st);
        } else {
          read_inbox(std::chrono::duration_cast<std::chrono::milliseconds>(next_tick - now), st);
        }
        failures_ = 0;
      } catch (const AuthError& e) {
        // Credentials no longer work (e.g. Redis restarted with another
        // password): retrying cannot help; tell the user's next call.
        core_->lose_leadership(e.what());
        core_->set_fatal(std::current_exception());
        return;
      } catch (const std::exception& e) {
        if (st.stop_requested()) break;
        if (++failures_ <= 3 || failures_ % 50 == 0)
          log(LogLevel::warn, std::string("control thread: ") + e.what());
        // Redis away: a leader that cannot renew loses its lease by expiry
        // anyway; back off before trying again.
        std::unique_lock lk(mu_);
        cv_.wait_for(lk, st, std::min(period, std::chrono::milliseconds(200)), [] { return false; });
      }
    }
    beat.request_stop();
    beat.join();
    // The stop callback may have interrupted a blocking call that had just
    // returned: the goodbye below must still reach Redis.
    conn_.clear_interrupt();
    try {
      core_->release_lease(conn_, scripts_);
      core_->end_session(conn_);
    } catch (const std::exception& e) {
      log(LogLevel::warn, std::string("ending the session: ") + e.what());
    }
  }

 private:
  void heartbeat(std::stop_token st, std::chrono::milliseconds period) {
    std::mutex m;
    std::condition_variable_any cv;
    int failures = 0;
    while (!st.stop_requested()) {
      try {
        if (!core_->refresh_session(beat_conn_)) {
          recover_until_ = std::chrono::steady_clock::now() + kRecoverWindow;
          recover_.store(true);
        }
        if (core_->is_leader()) core_->renew_lease(beat_conn_, beat_scripts_);
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
    cmd.push_back(RegistryCore::seconds_arg(block));
    std::vector<redis::Arg> args(cmd.begin(), cmd.end());
    redis::Reply r;
    blocked_.store(true);
    if (st.stop_requested()) {
      blocked_.store(false);
      return r;
    }
    try {
      r = conn_.blocking(block, std::span<const redis::Arg>(args));
    } catch (...) {
      blocked_.store(false);
      throw;
    }
    blocked_.store(false);
    return r;
  }

  static std::chrono::milliseconds clamp_block(std::chrono::milliseconds budget) {
    return std::clamp(budget, std::chrono::milliseconds(1), std::chrono::milliseconds(250));
  }

  // A follower waits for the next tick on its inbox (messages from the
  // allocator of record: copy a tensor whose exporter died, free memory it
  // still owns, forget a dead exporter's mappings, close returned slabs).
  void read_inbox(std::chrono::milliseconds budget, std::stop_token& st) {
    auto r = blocking_pop(st, clamp_block(budget), {"BLPOP", core_->keys.inbox(core_->session)});
    if (r.is_nil()) return;
    core_->handle_inbox(conn_, std::string(r[1].str()));
  }

  void serve_one(std::chrono::milliseconds budget, std::stop_token& st) {
    const std::string processing = core_->keys.processing(core_->lease().second);
    auto r = blocking_pop(st, clamp_block(budget), {"BLMOVE", core_->keys.lifecycle(), processing, "RIGHT", "LEFT"});
    if (r.is_nil()) return;
    std::string raw(r.str());
    handle(raw);
    conn_.command({"LREM", processing, 1, raw});
  }

  void handle(const std::string& raw) {
    protocol::Command cmd;
    try {
      cmd = protocol::decode_command(raw);
    } catch (const std::exception& e) {
      log(LogLevel::warn, std::string("rejected lifecycle command: ") + e.what());
      reply_malformed(raw, e);
      return;
    }
    protocol::Reply rep;
    try {
      rep = core_->execute(conn_, scripts_, cmd);
    } catch (const ConnectionError&) {
      throw;  // Redis away: the command stays in the processing list
    } catch (const TimeoutError&) {
      throw;
    } catch (const std::exception& e) {
      log(LogLevel::info, std::string(to_string(cmd.op)) + " '" + cmd.name + "' failed: " + e.what());
      rep = protocol::make_error_reply(&cmd, e);
    }
    if (cmd.reply_to) send_reply(*cmd.reply_to, protocol::encode_reply(rep));
  }

  // A command that did not decode may still name reply_to (and an id):
  // answer it there so the sender learns why.
  void reply_malformed(const std::string& raw, const std::exception& e) {
    auto route = protocol::peek_reply_route(raw);
    if (!route) return;
    auto rep = protocol::make_error_reply(nullptr, e);
    rep.id = route->id;
    rep.id_is_number = route->id_is_number;
    send_reply(route->reply_to, protocol::encode_reply(rep));
  }

  void send_reply(const std::string& to, const std::string& body) {
    // reply_to is untrusted: never write into mem-cuda's own keys (other
    // than registries' reply lists) or the lifecycle list itself.
    const auto& k = core_->keys;
    const std::string own = k.prefix() + "memcuda:";
    if (to == k.lifecycle() || (to.starts_with(own) && !to.starts_with(own + "reply:"))) {
      log(LogLevel::warn, "refusing to reply to '" + to + "': a key of the registry itself");
      return;
    }
    if (scripts_.reply.eval(conn_, {to}, {body, "60000"}).integer() == 0)
      log(LogLevel::warn, "could not reply to '" + to + "': not a list");
  }

  std::shared_ptr<RegistryCore> core_;
  redis::Connection conn_;
  lua::Scripts scripts_;
  redis::Connection beat_conn_;  // the heartbeat thread's own
  lua::Scripts beat_scripts_;
  std::mutex mu_;
  std::condition_variable_any cv_;
  std::atomic<bool> blocked_{false};
  int failures_ = 0;
  static constexpr auto kRecoverWindow = std::chrono::milliseconds(RegistryCore::kRepublishGraceMs);
  std::atomic<bool> recover_{false};
  std::atomic<std::chrono::steady_clock::time_point> recover_until_{};
};

}  // namespace memcuda::detail
