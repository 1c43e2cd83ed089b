// A dead allocator of record's tensors (run by the leader, once the lease
// is ours), saved by adoption in place where the backend can take the
// memory over (fds the standbys hold: no byte copied, holders' mappings
// kept), else copied by a live holder into memory this leader allocates,
// else marked lost; then the dead owner's unused allocations are freed.
// docs/design.md, "When the allocator of record dies", has each step.
#pragma once

#include "memcuda/config.hpp"

#include <unistd.h>

#include <algorithm>
#include <optional>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "memcuda/detail/backend/select.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/create/allocator.hpp"
#include "memcuda/detail/registry/gc/give_up.hpp"
#include "memcuda/detail/registry/lease/lease.hpp"
#include "memcuda/detail/registry/takeover/migration_copy.hpp"
#include "memcuda/detail/registry/gc/orphan_scan.hpp"
#include "memcuda/detail/registry/gc/sessions.hpp"
#include "memcuda/detail/registry/liveness.hpp"
#include "memcuda/detail/fd/fd_source.hpp"
#include "memcuda/detail/store/allocations.hpp"
#include "memcuda/detail/store/reply.hpp"
#include "memcuda/detail/store/records.hpp"
#include "memcuda/detail/store/recovery_scripts.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

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
    resolve_parked(c);
    std::vector<std::string> owners;  // memcuda:owners: every allocator of record that may own records
    if (!orphans_possible(c, owners)) return {0, 0};
    scanned_ = true;
    OrphanScan scan;
    scan_records(ctx_, lease_, c, token, scan);
    judge_other_owners(ctx_, c, owners, scan);
    settle_orphans(c, token, scan);
    sweep_dead_owners(c, scan);
    return {scan.migrated, scan.lost};
  }

  // Each orphan adopted in place, copied, or given up as lost.
  void settle_orphans(redis::Connection& c, const std::string& token, OrphanScan& scan) {
    for (auto gen : scan.frees) alloc_.free_unlinked(c, gen);
    std::vector<TensorInfo> denied;  // another user's memory: left for a leader that can open it
    for (const auto& t : adopt_in_place(c, token, std::move(scan.orphans), scan.live_used, scan.migrated, denied)) {
      Adopted a = adopt_one(c, token, t);
      if (a == Adopted::migrated) ++scan.migrated;
      if (a == Adopted::lost) ++scan.lost;
      if (a == Adopted::retry) {
        scan.still_used.insert(t.ipc_handle);
        scan.unsettled.insert(t.owner);
      }
    }
    for (const auto& t : denied) {
      scan.still_used.insert(t.ipc_handle);
      scan.unsettled.insert(t.owner);
    }
  }

  void sweep_dead_owners(redis::Connection& c, OrphanScan& scan) {
    // What this process adopted is its own now: never freed as a dead
    // owner's.
    std::set<std::string> keep = scan.still_used;
    for (DevicePool* p : alloc_.pools())
      for (auto& h : p->adopted_handles()) keep.insert(std::move(h));
    // A dead owner all of whose records were settled: whatever else of its
    // naming remains (empty slabs it kept, blocks whose records went
    // meanwhile) is referenced by no record and is freed, one round later:
    // the scan above is not atomic (a remove may move a record between
    // its two parts), so the sweep waits for a round in which the owner
    // is again settled, with that round's records kept.
    keep.insert(scan.seen.begin(), scan.seen.end());
    std::set<std::string> due;
    due.swap(sweep_next_);
    for (const auto& owner : due) {
      if (scan.unsettled.count(owner)) {
        sweep_next_.insert(owner);  // not yet: next round again
        continue;
      }
      // Standbys close the fds of what no record uses.
      const std::size_t n = forget_allocations_of(c, ctx_.keys, owner, keep);
      if (n)
        log(LogLevel::info, "freed " + std::to_string(n) + " allocation(s) of dead allocator " + owner +
                                " that no record uses");
      store::remove_owner(c, ctx_.keys, owner);  // settled: no more scans for it
    }
    for (const auto& [owner, is_dead] : scan.dead)
      if (is_dead) sweep_next_.insert(owner);
  }

  // The tensors whose backend can take their memory over in place: grouped
  // by allocation, each allocation is taken into this leader's pool once
  // and each record republished pointing at it. Returns the tensors left
  // for the copy path (not adoptable, or their allocation could not be
  // adopted); counts the adopted ones into `adopted`.
  // Tensors whose memory belongs to another user (AccessDenied) go to
  // `denied`: neither copied nor marked lost, their memory never touched.
  // An allocation that records of a live owner use (`live_used`: it adopted
  // it before and lives on) is that owner's: taken into this pool, its free
  // space would hand their bytes to new tensors. Its orphans are copied.
  std::vector<TensorInfo> adopt_in_place(redis::Connection& c, const std::string& token,
                                         std::vector<TensorInfo> orphans, const std::set<std::string>& live_used,
                                         std::uint64_t& adopted, std::vector<TensorInfo>& denied) {
    std::vector<TensorInfo> rest;
    std::map<std::pair<BackendKind, std::string>, std::vector<TensorInfo>> groups;
    for (auto& t : orphans) {
      if (adoptable(t)) groups[{t.backend, t.ipc_handle}].push_back(std::move(t));
      else rest.push_back(std::move(t));
    }
    for (auto& [key, ts] : groups) {
      if (live_used.count(vmm_key(key.second))) {
        log(LogLevel::warn, "allocation " + handle_for_log(ts.front()) + " of dead allocator " + ts.front().owner +
                                " is also used by a live process's records: not adopted in place; its " +
                                std::to_string(ts.size()) + " tensor(s) take the copy path");
        rest.insert(rest.end(), ts.begin(), ts.end());
        continue;
      }
      DevicePool* pool = nullptr;
      std::vector<std::optional<PoolBlock>> blocks;
      try {
        int device = ts.front().device;
#if MEMCUDA_HAS_CUDA()
        if (key.first == BackendKind::cuda) device = ordinal_of_uuid(ts.front().device_uuid, device);
#endif
        pool = &alloc_.pool_for(key.first, device);
        blocks = pool->adopt(ts);
      } catch (const InternalError&) {
        throw;
      } catch (const AccessDenied& e) {
        if (denied_logged_.insert(key.second).second)
          log(LogLevel::error, "cannot adopt allocation " + handle_for_log(ts.front()) + " of dead allocator " +
                                   ts.front().owner + ": " + e.what() + "; its " + std::to_string(ts.size()) +
                                   " tensor(s) are left for an allocator of record that can open it");
        denied.insert(denied.end(), ts.begin(), ts.end());
        continue;
      } catch (const std::exception& e) {
        log(LogLevel::warn, "cannot adopt allocation " + handle_for_log(ts.front()) + " of dead allocator " +
                                ts.front().owner + ": " + e.what() + "; its tensors take the copy path");
        rest.insert(rest.end(), ts.begin(), ts.end());
        continue;
      }
      // Blocks not yet handed on (owned, parked) are given back on a throw.
      struct Giveback {
        DevicePool* pool;
        std::vector<std::optional<PoolBlock>>& blocks;
        ~Giveback() {
          for (auto& b : blocks)
            if (b) pool->deallocate(*b);
        }
      } giveback{pool, blocks};
      for (std::size_t i = 0; i < ts.size(); ++i) {
        if (!blocks[i]) {
          log(LogLevel::warn, "'" + ts[i].name + "' of dead allocator " + ts[i].owner + ": its block at offset " +
                                  std::to_string(ts[i].offset) + " of " + handle_for_log(ts[i]) +
                                  " cannot be claimed in place; it takes the copy path");
          rest.push_back(ts[i]);
          continue;
        }
        if (republish_adopted(c, token, ts[i], *pool, blocks[i])) ++adopted;
      }
    }
    return rest;
  }

  static bool adoptable(const TensorInfo& t) noexcept {
    try {
      return backend_for(t).can_adopt(t);
    } catch (...) {
      return false;  // a backend this build lacks: the copy path says why
    }
  }

  // Republishes one adopted tensor: the record now names this process as
  // its owner, a new generation, and the same memory. Returns false when
  // the record went meanwhile (the block is given back). `pb` is reset once
  // handed on (owned, or parked when the reply was lost).
  bool republish_adopted(redis::Connection& c, const std::string& token, const TensorInfo& t, DevicePool& pool,
                         std::optional<PoolBlock>& pb) {
    const Allocation& a = pb->slab->allocation();
    auto [tok, epoch] = lease_.current();
    TensorInfo n = t;
    n.ipc_handle = a.handle;  // host: the adopter's own name of the same object
    n.alloc_id = a.alloc_id;
    n.alloc_kind = a.alloc_kind;
    n.fd_source = a.fd_source;
    n.owner = ctx_.session;
    n.owner_pid = ::getpid();
    n.epoch = epoch;
    n.node = ctx_.node;
    const bool persistent = t.holders.count(std::string(HolderId::kName)) > 0;
    const store::Answer r = migrate_or_park(c, token, t, n, pool, pb, true);
    const std::string& st = r.status;
    if (st == "ok") {
      // A record names this process now: the allocation is ours to unlink
      // when its last block goes (Allocation::adopted_committed).
      a.adopted_committed->store(true);
      if (a.served) a.served->retag(ctx_.session);  // the standby thread publishes its fd source now
      n.generation = reply_u64(r[1]);
      alloc_.adopt(n, &pool, *pb, persistent);
      pb.reset();
      pool.note_adopted(t.bytes);
      log(LogLevel::info, "adopted '" + t.name + "' of dead allocator " + t.owner + " (pid " +
                              std::to_string(t.owner_pid) + ") in place: " + handle_for_log(t) + " at offset " +
                              std::to_string(t.offset) + ", generation " + std::to_string(t.generation) + " -> " +
                              std::to_string(n.generation) + ", 0 bytes copied");
      forget_attempts(t.generation);
      return true;
    }
    if (st == "gone") {
      pool.deallocate(*pb);
      pb.reset();
      return false;
    }
    lease_.fail_status("migrate", st, "adopting '" + t.name + "'");
  }

  // The migrate script moving record `t` to `n` (block `pb`). When its
  // reply is lost the script may have run and the record may point at the
  // block: it is parked (pb reset) for the next round to adopt or free.
  store::Answer migrate_or_park(redis::Connection& c, const std::string& token, const TensorInfo& t,
                                const TensorInfo& n, DevicePool& pool, std::optional<PoolBlock>& pb, bool adopted) {
    try {
      auto r = store::migrate(c, ctx_.keys, token, t, n);
      if (MEMCUDA_FAULT("migration.reply_lost")) throw ConnectionError("fault point migration.reply_lost");
      return r;
    } catch (const IoError&) {
      std::lock_guard lk(mu_);
      parked_.push_back({&pool, *pb, n, t.holders.count(std::string(HolderId::kName)) > 0, adopted});
      pb.reset();
      throw;
    }
  }

  Adopted adopt_one(redis::Connection& c, const std::string& token, const TensorInfo& t) {
    const std::string& session = ctx_.session;
    const std::vector<std::string> live = live_copiers(ctx_, c, t);
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
        TensorInfo n = placed_in(t, *pb, ctx_, epoch);
        if (h == session) copy_for_migration(t, n);
        else ask_holder_to_copy(ctx_, ++seq_, h, t, n);
        const store::Answer r = migrate_or_park(c, token, t, n, *pool, pb, false);
        const std::string& st = r.status;
        if (st == "ok") {
          n.generation = reply_u64(r[1]);
          alloc_.adopt(n, pool, *pb, t.holders.count(std::string(HolderId::kName)) > 0);
          pool->note_copied(t.bytes);
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
    const std::string st = store::mark_lost(c, ctx_.keys, token, t, kLostMarkerTtlMs, force).status;
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

  // Blocks of migrations whose script reply was lost: adopted when the
  // record now points at them (the script ran), else given back.
  struct Parked {
    DevicePool* pool;
    PoolBlock pb;
    TensorInfo info;  // the record as the script would have written it
    bool persistent;
    bool adopted;  // adopted in place (counted as adopted, not copied, once resolved)
  };
  // Whether a record may have a dead owner, without reading any record: the
  // first round of this registry (records of an older version name owners
  // memcuda:owners lacks), work left from an earlier round, or a dead
  // session among memcuda:owners and the cuda_vmm_fd allocations' owners.
  // Fills `owners` with memcuda:owners.
  bool orphans_possible(redis::Connection& c, std::vector<std::string>& owners) {
    auto m = store::owner_members(c, ctx_.keys);
    for (std::size_t i = 0; i < m.size(); ++i) owners.emplace_back(m[i].str());
    bool pending;
    {
      std::lock_guard lk(mu_);
      pending = !parked_.empty();
    }
    if (!scanned_ || pending || !sweep_next_.empty()) return true;
    std::set<std::string> all(owners.begin(), owners.end());
    for (auto& o : allocation_owners(c, ctx_.keys)) all.insert(std::move(o));
    for (const auto& o : all)
      if (o != ctx_.session && !owner_alive(ctx_, c, o, 0)) return true;
    return false;
  }

  void resolve_parked(redis::Connection& c) {
    std::vector<Parked> todo;
    {
      std::lock_guard lk(mu_);
      todo.swap(parked_);
    }
    for (std::size_t i = 0; i < todo.size(); ++i) {
      auto& p = todo[i];
      try {
        namespace f = store::field;
        auto r = store::read_fields(c, ctx_.keys.tensor(p.info.name), f::owner, f::ipc_handle, f::offset, f::generation);
        const bool ours = !r[0].is_nil() && !r[1].is_nil() && !r[2].is_nil() && !r[3].is_nil() &&
                          r[0].str() == ctx_.session && r[1].str() == p.info.ipc_handle &&
                          r[2].str() == std::to_string(p.info.offset);
        if (ours) {
          p.info.generation = std::stoull(std::string(r[3].str()));
          alloc_.adopt(p.info, p.pool, p.pb, p.persistent);
          if (p.adopted) {
            p.pb.slab->allocation().adopted_committed->store(true);
            if (auto& sv = p.pb.slab->allocation().served) sv->retag(ctx_.session);
            p.pool->note_adopted(p.info.bytes);
          }
          else p.pool->note_copied(p.info.bytes);
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

  Context& ctx_;
  Lease& lease_;
  Allocator& alloc_;
  std::mutex mu_;  // leaf: guards running_, attempts_, parked_; never held across Redis
  std::condition_variable idle_;
  bool running_ = false;
  std::map<std::uint64_t, int> attempts_;  // failed rounds per generation
  std::vector<Parked> parked_;             // guarded by mu_
  bool scanned_ = false;                   // a full scan ran (only the round touches it)
  std::set<std::string> sweep_next_;  // dead owners to sweep next round (the round's own)
  std::set<std::string> denied_logged_;  // handles whose AccessDenied was logged once (only the round touches it)
  std::atomic<std::uint64_t> seq_{0};
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
