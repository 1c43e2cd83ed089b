// A dead allocator of record's tensors (run by the leader). The dead
// exporter's handle cannot be opened anew, but mappings that live holders
// already have still read its memory: a live holder copies the tensor into
// memory this leader allocates and the record is republished under a new
// generation; with no live holder the tensor is marked lost.
#pragma once

#include "memcuda/config.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "memcuda/detail/process_cache.hpp"
#include "memcuda/detail/registry/allocator.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/inbox.hpp"
#include "memcuda/detail/registry/lease.hpp"
#include "memcuda/detail/registry/sessions.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// Copies a tensor of a dead exporter, through this process's existing
// mapping of it, into its replacement. Throws when this process no longer
// maps the old memory.
inline void copy_for_migration(const TensorInfo& from, const TensorInfo& to) {
  auto [src, keep_src] = ProcessCache::instance().find(from.owner, from.alloc_id);
  if (!src)
    throw Unavailable("this process does not map the memory of '" + from.name + "' (owner " + from.owner + ")");
  auto [dst, keep_dst] =
      ProcessCache::instance().resolve(to.owner, to.alloc_id, [&] { return backend_for(to.backend).open(to); });
  int dev = -1;
#if MEMCUDA_HAS_CUDA()
  if (to.backend == BackendKind::cuda) dev = ordinal_of_uuid(to.device_uuid, to.device);
#endif
  backend_for(to.backend).copy(static_cast<char*>(dst) + to.offset, static_cast<const char*>(src) + from.offset,
                               from.bytes, dev);
}

class Migration {
 public:
  Migration(Context& ctx, Lease& lease, Allocator& alloc) : ctx_(ctx), lease_(lease), alloc_(alloc) {}

  // One round over every record: gives each tensor whose allocator of
  // record died a new home, or marks it lost. One round runs at a time
  // (the registry's thread, collect_garbage()); a second caller waits for
  // the first to finish without holding any lock meanwhile. Returns
  // {migrated, lost}.
  std::pair<std::uint64_t, std::uint64_t> round(redis::Connection& c, const std::string& token) {
    {
      std::unique_lock lk(mu_);
      idle_.wait(lk, [&] { return !running_; });
      running_ = true;
    }
    struct Done {
      Migration* m;
      ~Done() {
        {
          std::lock_guard lk(m->mu_);
          m->running_ = false;
        }
        m->idle_.notify_all();
      }
    } done{this};
    return adopt_orphans(c, token);
  }

 private:
  enum class Adopted { migrated, lost, gone, retry };

  std::pair<std::uint64_t, std::uint64_t> adopt_orphans(redis::Connection& c, const std::string& token) {
    std::uint64_t migrated = 0, lost = 0;
    resolve_parked(c);
    auto rkeys = record_keys(c, ctx_.keys);
    std::set<std::string> still_used;  // ipc handles of dead owners that records still use
    if (!rkeys.empty()) {
      std::vector<redis::Command> cmds;
      for (const auto& k : rkeys) cmds.push_back({"HMGET", k, "owner", "owner_pid", "node", "state"});
      auto rs = c.pipeline(cmds);
      std::map<std::string, bool> dead;  // owner -> dead
      for (std::size_t i = 0; i < rkeys.size(); ++i) {
        if (rs[i][0].is_nil() || rs[i][2].is_nil() || rs[i][3].is_nil()) continue;
        std::string owner(rs[i][0].str());
        if (owner == ctx_.session || rs[i][2].str() != ctx_.node || rs[i][3].str() != "ready") continue;
        if (!dead.count(owner)) {
          std::int64_t pid = rs[i][1].is_nil() ? 0 : reply_int(rs[i][1]);
          dead[owner] = !ctx_.owner_alive(c, owner, pid);
        }
        if (!dead[owner]) continue;
        auto r = c.command({"HGETALL", rkeys[i]});
        if (r.size() == 0) continue;
        TensorInfo t;
        try {
          t = protocol::decode_record(fields_from_reply(r.view()));
        } catch (const ProtocolError& e) {
          log(LogLevel::warn, std::string("orphan scan: skipping a corrupt record: ") + e.what());
          continue;
        }
        Adopted a = adopt_one(c, token, t);
        if (a == Adopted::migrated) ++migrated;
        if (a == Adopted::lost) ++lost;
        if (a == Adopted::retry) still_used.insert(t.ipc_handle);
        else alloc_.add_orphan(t);
      }
    }
    // Unlink what dead owners left once nothing refers to it any more.
    alloc_.reclaim_orphans(still_used);
    return {migrated, lost};
  }

  Adopted adopt_one(redis::Connection& c, const std::string& token, const TensorInfo& t) {
    const std::string& session = ctx_.session;
    // Live registry sessions that hold it, this process first.
    std::vector<std::string> live;
    for (const auto& [h, n] : t.holders)
      if (n > 0 && HolderId::is_session_id(h) &&
          (h == session || c.command({"EXISTS", ctx_.keys.session(h)}).integer() == 1))
        live.push_back(h);
    std::stable_partition(live.begin(), live.end(), [&](const std::string& h) { return h == session; });
    const std::string dead_owner = t.owner;
    for (const auto& h : live) {
      std::optional<PoolBlock> pb;
      DevicePool* pool = nullptr;
      try {
        int device = t.device;
#if MEMCUDA_HAS_CUDA()
        if (t.backend == BackendKind::cuda) device = ordinal_of_uuid(t.device_uuid, t.device);
#endif
        auto [tok, epoch] = lease_.current();
        pool = &alloc_.pool_for(t.backend, device);
        pb = pool->allocate(t.bytes);
        const Allocation& a = pb->slab->allocation();
        TensorInfo n = t;
        n.ipc_handle = a.handle;
        n.offset = pb->block.offset;
        n.alloc_bytes = a.size;
        n.alloc_id = a.alloc_id;
        n.owner = session;
        n.owner_pid = ::getpid();
        n.epoch = epoch;
        n.device = a.device;
        n.device_uuid = a.device_uuid;
        n.node = ctx_.node;
        if (h == session) copy_for_migration(t, n);
        else ask_holder_to_copy(h, t, n);
        std::vector<redis::Arg> args{token, t.generation, dead_owner, ctx_.keys.prefix()};
        std::vector<std::pair<std::string, std::string>> fv{
            {"ipc_handle", n.ipc_handle},       {"offset", std::to_string(n.offset)},
            {"alloc_bytes", std::to_string(n.alloc_bytes)}, {"alloc_id", std::to_string(n.alloc_id)},
            {"owner", n.owner},                 {"owner_pid", std::to_string(n.owner_pid)},
            {"epoch", std::to_string(n.epoch)}, {"device", std::to_string(n.device)},
            {"device_uuid", n.device_uuid},     {"node", n.node}};
        for (const auto& [k, v] : fv) {
          args.emplace_back(k);
          args.emplace_back(v);
        }
        const std::string tk = ctx_.keys.tensor(t.name), lk = ctx_.keys.leader(), gk = ctx_.keys.generation();
        redis::Arg kv[] = {tk, lk, gk};
        redis::Reply r;
        try {
          r = ctx_.scripts.migrate.eval(c, std::span<const redis::Arg>(kv), std::span<const redis::Arg>(args));
          if (MEMCUDA_FAULT("migration.reply_lost")) throw ConnectionError("fault point migration.reply_lost");
        } catch (const RedisError& e) {
          if (!dynamic_cast<const ConnectionError*>(&e) && !dynamic_cast<const TimeoutError*>(&e)) throw;
          // The script may have run: the record may point at this block.
          // Keep it parked; the next round adopts or frees it.
          std::lock_guard lk(mu_);
          parked_.push_back({pool, *pb, n, t.holders.count(std::string(HolderId::kName)) > 0});
          pb.reset();
          throw;
        }
        const std::string st = script_status(r);
        if (st == "ok") {
          n.generation = reply_u64(r[1]);
          alloc_.adopt(n, pool, *pb, t.holders.count(std::string(HolderId::kName)) > 0);
          log(LogLevel::info, "migrated '" + t.name + "' of dead allocator " + dead_owner + " (pid " +
                                  std::to_string(t.owner_pid) + "): generation " + std::to_string(t.generation) +
                                  " -> " + std::to_string(n.generation) + ", copied by " +
                                  (h == session ? std::string("this process") : h));
          forget_attempts(t.generation);
          return Adopted::migrated;
        }
        pool->deallocate(*pb);
        pb.reset();
        if (st == "gone") return Adopted::gone;
        lease_.fail_status("migrate", st, "migrating '" + t.name + "'");
      } catch (const NotLeader&) {
        throw;
      } catch (const InternalError&) {
        throw;
      } catch (const ConnectionError&) {
        if (pb && pool) pool->deallocate(*pb);
        throw;
      } catch (const TimeoutError&) {
        if (pb && pool) pool->deallocate(*pb);  // not the script's (that one is parked): a holder's copy
        log(LogLevel::warn, "migrating '" + t.name + "' through holder " + h + " timed out");
      } catch (const std::exception& e) {
        if (pb && pool) pool->deallocate(*pb);
        log(LogLevel::warn, "migrating '" + t.name + "' through holder " + h + " failed: " + e.what());
      }
    }
    // Nobody alive can copy it (or every holder failed, several times).
    bool force = false;
    if (!live.empty()) {
      std::lock_guard lk(mu_);
      if (++attempts_[t.generation] < kMigrateAttempts) return Adopted::retry;
      force = true;
    }
    const std::string tk = ctx_.keys.tensor(t.name), nk = ctx_.keys.names(), lk = ctx_.keys.leader(),
                      mk = ctx_.keys.lost(t.name);
    redis::Arg kv[] = {tk, lk, nk, mk};
    std::vector<redis::Arg> args{token, t.generation, dead_owner, ctx_.keys.prefix(), kLostMarkerTtlMs, now_ms(),
                                 force ? "1" : "0"};
    auto r = ctx_.scripts.mark_lost.eval(c, std::span<const redis::Arg>(kv), std::span<const redis::Arg>(args));
    const std::string st = script_status(r);
    if (st == "lost") {
      forget_attempts(t.generation);
      log(LogLevel::warn, "'" + t.name + "' (generation " + std::to_string(t.generation) +
                              ") is lost: its allocator of record " + dead_owner + " (pid " +
                              std::to_string(t.owner_pid) + ") died and no live process could copy it");
      return Adopted::lost;
    }
    if (st == "held") return Adopted::retry;  // a holder appeared meanwhile: next round
    if (st == "gone") return Adopted::gone;
    lease_.fail_status("mark_lost", st, "giving up '" + t.name + "'");
  }

  // Sends a holder the old and new places of a tensor and waits for it to
  // copy (its registry thread executes the inbox message). The wait runs
  // on a connection of the waiting pool; no lock is held meanwhile.
  void ask_holder_to_copy(const std::string& holder, const TensorInfo& from, const TensorInfo& to) {
    const std::string rk = ctx_.keys.migrate_reply(ctx_.session);
    const std::uint64_t id = ++seq_;
    auto c = ctx_.waits.acquire();
    inbox::send(*c, ctx_.keys, holder, inbox::Migrate{id, rk, from, to});
    auto deadline = std::chrono::steady_clock::now() + ctx_.opts.request_timeout;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0)
        throw TimeoutError("holder " + holder + " did not copy '" + from.name + "' within " +
                           std::to_string(ctx_.opts.request_timeout.count()) + " ms");
      auto r = c->blocking(left, {"BLPOP", rk, seconds_arg(left)});
      if (r.is_nil()) continue;
      auto ans = inbox::decode_answer(r[1].str());
      if (ans.id != id) continue;  // a late answer to an earlier ask
      if (!ans.ok) throw Unavailable(ans.error);
      return;
    }
  }

  // Blocks of migrations whose script reply was lost: adopted when the
  // record now points at them (the script ran), else given back.
  struct Parked {
    DevicePool* pool;
    PoolBlock pb;
    TensorInfo info;  // the record as the script would have written it
    bool persistent;
  };
  void resolve_parked(redis::Connection& c) {
    std::vector<Parked> todo;
    {
      std::lock_guard lk(mu_);
      todo.swap(parked_);
    }
    for (std::size_t i = 0; i < todo.size(); ++i) {
      auto& p = todo[i];
      try {
        auto r = c.command({"HMGET", ctx_.keys.tensor(p.info.name), "owner", "ipc_handle", "offset", "generation"});
        const bool ours = !r[0].is_nil() && !r[1].is_nil() && !r[2].is_nil() && !r[3].is_nil() &&
                          r[0].str() == ctx_.session && r[1].str() == p.info.ipc_handle &&
                          r[2].str() == std::to_string(p.info.offset);
        if (ours) {
          p.info.generation = std::stoull(std::string(r[3].str()));
          alloc_.adopt(p.info, p.pool, p.pb, p.persistent);
          log(LogLevel::info, "migration of '" + p.info.name + "' had run: adopted generation " +
                                  std::to_string(p.info.generation));
        } else {
          p.pool->deallocate(p.pb);
        }
      } catch (...) {
        std::lock_guard lk(mu_);  // still unknown: next round
        for (std::size_t j = i; j < todo.size(); ++j) parked_.push_back(std::move(todo[j]));
        throw;
      }
    }
  }

  void forget_attempts(std::uint64_t gen) {
    std::lock_guard lk(mu_);
    attempts_.erase(gen);
  }

  static constexpr int kMigrateAttempts = 5;
  static constexpr std::int64_t kLostMarkerTtlMs = 24 * 3600 * 1000;

  Context& ctx_;
  Lease& lease_;
  Allocator& alloc_;
  std::mutex mu_;  // leaf: guards running_, attempts_, parked_; never held across Redis
  std::condition_variable idle_;
  bool running_ = false;
  std::map<std::uint64_t, int> attempts_;  // failed rounds per generation
  std::vector<Parked> parked_;             // guarded by mu_
  std::atomic<std::uint64_t> seq_{0};
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
