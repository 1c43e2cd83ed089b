// The allocator of record's memory: its pools (one per backend and
// device), the allocations it owns (by generation), and the operations
// that create and free them. Only the process holding the lease creates;
// any process frees what it owns when the last reference goes.
//
// Every Redis call runs on the connection its caller passes: the lease of
// the client call or the registry thread's own connection that invoked it.
#pragma once

#include "memcuda/config.hpp"

#include <unistd.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "memcuda/detail/backend/select.hpp"
#include "memcuda/detail/pool/device_pool.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/lease/lease.hpp"
#include "memcuda/detail/registry/create/blocks_in_use.hpp"
#include "memcuda/detail/registry/create/held_frees.hpp"
#include "memcuda/detail/registry/create/placement.hpp"
#include "memcuda/detail/registry/inbox.hpp"
#include "memcuda/detail/registry/liveness.hpp"
#include "memcuda/detail/registry/own_allocator.hpp"
#include "memcuda/detail/store/reply.hpp"
#include "memcuda/protocol/pool_stats.hpp"
#include "memcuda/stats.hpp"
#include "memcuda/detail/store/lease.hpp"
#include "memcuda/detail/store/records.hpp"
#include "memcuda/detail/store/release_scripts.hpp"
#include "memcuda/detail/store/scripts.hpp"
#include "memcuda/detail/store/sessions.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class BatchAllocator;  // batch_allocator.hpp: create_many, one pool pass and one script

class Allocator final : public OwnAllocator {
  friend class BatchAllocator;

 public:
  Allocator(Context& ctx, Lease& lease)
      : ctx_(ctx), lease_(lease), held_(ctx.opts.redis.replicated(), ctx.opts.heartbeat_period()) {}
  // Runs after a create published, before it returns (Core::secure_new_allocations); set before threads start.
  void set_after_create(std::function<void(redis::Connection&)> f) { after_create_ = std::move(f); }
  // Runs for each block of a create before its script publishes it (a
  // fleet's: the node service exposes a new slab there); set before threads start.
  void set_new_slab(std::function<void(redis::Connection&, ExportedBlock&)> f) { new_slab_ = std::move(f); }
  // Drops the keep-alive of a buffer this process shared (get/borrowed.hpp); set before threads start.
  void set_borrowed_free(std::function<bool(std::uint64_t)> f) { borrowed_free_ = std::move(f); }

  using Owned = OwnedBlock;

  // Allocates, exports and publishes a tensor. Throws AlreadyExists (also
  // for a stray key under the name that is not a record of ours),
  // NotLeader (lease lost), InvalidArgument, CudaError, BudgetExceeded,
  // InternalError (a script status this version does not know).
  Created create(redis::Connection& c, const protocol::Command& cmd) override {
    if (!cmd.dtype || !cmd.shape) throw InvalidArgument("create needs a dtype and a shape");
    ::memcuda::validate_name(cmd.name);
    const std::uint64_t bytes = byte_size(*cmd.dtype, *cmd.shape);
    const BackendKind kind = cmd.backend.value_or(ctx_.default_backend());
    const int device = device_for(kind, cmd.device, cmd.device_uuid, ctx_);
    auto [token, epoch] = lease_.current();
    if (!lease_.held()) throw NotLeader("this process is not the allocator of record");

    const std::string create_id = cmd.id.value_or("");
    // A block parked by an attempt whose reply was lost (see below) is the
    // one the record may already point at: this attempt reuses it.
    std::optional<Owned> parked = unpark(create_id);
    DevicePool& pool = parked ? *parked->pool : pool_for(kind, device);
    PoolBlock pb = parked ? parked->pb : pool.allocate(bytes);
    Giveback giveback{&pool, &pb};  // until the script has published it, the block is ours to give back
    if (!parked) pool.zero({{&pb, bytes}});  // a new tensor reads as zeros (a parked one was zeroed before)
    if (new_slab_) new_slab_(c, *pb.slab);

    TensorInfo t = parked ? parked->info  // exactly what the lost attempt sent
                          : new_record(cmd.name, *cmd.dtype, *cmd.shape, bytes, kind, pb, ctx_, epoch, create_id);
    if (parked) t.epoch = epoch;

    const bool persistent = cmd.persistent.value_or(false);
    store::Answer r;
    try {
      r = store::create(c, ctx_.keys, t, cmd.name, holder_of(cmd), token, persistent);
      if (MEMCUDA_FAULT("allocator.create_reply_lost")) throw ConnectionError("fault point allocator.create_reply_lost");
    } catch (const IoError&) {
      // The script may have run: Redis may hold a ready record pointing at
      // this block. Giving it back would hand the same memory to the next
      // create. Keep it, parked by create_id, until a retry learns the
      // outcome (replay: ours; exists/error: give back). Without a
      // create_id nothing can tell: the block stays out of the pool.
      giveback.pool = nullptr;
      park(create_id, Owned{&pool, pb, t, persistent});
      throw;
    }
    const std::string& st = r.status;
    const std::string tkey = ctx_.keys.tensor(cmd.name);
    // t is done with once kept: the script's arguments are sent.
    auto keep = [&](std::uint64_t gen) { return keep_created(std::move(t), gen, r, holder_of(cmd), persistent, giveback); };
    if (st == "ok") return after_create(c, keep(reply_u64(r[1])));
    if (st == "replay") {
      // The lost attempt published our parked block: adopt it, so the
      // creator gets its memory like a fresh create. No parked block: the
      // attempt that ran was answered and its block is in owned_ already.
      if (parked) return after_create(c, keep(reply_u64(r[1])));
      return after_create(c, {reply_u64(r[1]), reply_int(r[2]), {}, {}});
    }
    if (parked && st != "exists" && st != "stray") {
      // Answered with an error (e.g. the lease moved): the record may still
      // be the lost attempt's. Ours then, freed with its last reference.
      if (!create_id.empty() && adopt_published(c, tkey, Owned{&pool, pb, t, persistent})) giveback.pool = nullptr;
    }
    if (st == "exists")
      throw AlreadyExists("tensor '" + cmd.name + "' already exists (generation " + std::to_string(reply_u64(r[1])) +
                          "); remove it first or get() it");
    if (st == "stray") throw AlreadyExists("cannot create '" + cmd.name + "': " + stray_record(tkey, r[1].str()));
    lease_.fail_status("create", st, "creating '" + cmd.name + "'", st == "notleader" ? r[1].str() : "");
  }

  // Until the script has published it, a create's block is its to give back.
  struct Giveback {
    DevicePool* pool;
    const PoolBlock* pb;
    ~Giveback() {
      if (pool) pool->deallocate(*pb);
    }
  };

  // A published create's block (`r`: the script's answer), owned from now on.
  Created keep_created(TensorInfo t, std::uint64_t gen, const store::Answer& r, const std::string& holder,
                       bool persistent, Giveback& giveback) {
    t.generation = gen;
    t.refcount = reply_int(r[2]);
    t.holders[holder] = 1;
    if (persistent) t.holders[std::string(HolderId::kName)] = 1;
    DevicePool* pool = std::exchange(giveback.pool, nullptr);
    const PoolBlock& pb = *giveback.pb;
    {
      std::lock_guard lk(owned_mu_);
      owned_.insert_or_assign(t.generation, Owned{pool, pb, t, persistent});
      owned_bytes_ += pb.block.size;
    }
    ++creates_;
    const std::uint64_t g = t.generation;
    const std::int64_t rc = t.refcount;
    return Created{g, rc, std::move(t), pb};
  }

  // After a refused create or create many whose earlier attempt's reply was
  // lost: when the record under `tkey` is that attempt's (its create_id),
  // the parked block `o` is the record's memory, owned from now on.
  bool adopt_published(redis::Connection& c, const std::string& tkey, Owned o) {
    auto cur = store::read_create_id(c, tkey);
    if (cur.size() != 2 || cur[0].is_nil() || cur[0].str() != o.info.create_id || cur[1].is_nil()) return false;
    o.info.generation = std::stoull(std::string(cur[1].str()));
    std::lock_guard lk(owned_mu_);
    owned_bytes_ += o.pb.block.size;
    owned_[o.info.generation] = std::move(o);
    return true;
  }

  // Drops `holder`'s reference (all of them with `all`); returns the
  // remaining refcount. Frees the memory when it was the last and it is
  // ours. `token` is the lease token when the leader acts for a holder.
  std::int64_t release(redis::Connection& c, const std::string& name, std::uint64_t gen, const std::string& holder,
                       const std::string& token, bool all = false) override {
    return release_outcome(c, store::release(c, ctx_.keys, name, gen, holder, ctx_.session, token, all), name, gen,
                           holder);
  }

  // What a release script's answer means (also for pipelined releases).
  std::int64_t release_outcome(redis::Connection& c, const store::Answer& r, const std::string& name,
                               std::uint64_t gen, const std::string& holder) override {
    const std::string& st = r.status;
    if (st == "ok") return reply_int(r[1]);
    if (st == "free") {
      free_unlinked(c, reply_u64(r[1]), true);  // the generation it had last (a migration renews it)
      return 0;
    }
    if (st == "queued") return 0;
    if (st == "notfound") throw NotFound("no tensor '" + name + "' of generation " + std::to_string(gen));
    if (st == "notholder") throw InvalidArgument("'" + holder + "' holds no reference to '" + name + "'");
    lease_.fail_status("release", st, "releasing '" + name + "'");
  }

  // Whether this process owns the allocation of that generation.
  bool owns(std::uint64_t generation) override {
    std::lock_guard lk(owned_mu_);
    return owned_.count(generation) != 0;
  }

  // Frees an unlinked tensor whose last reference is gone. Ours: drop the
  // allocation. Another (dead) owner's: reclaim what the backend can.
  void free_unlinked(redis::Connection& c, std::uint64_t generation, bool record_gone = false) override {
    const std::string rkey = ctx_.keys.removed(generation);
    std::optional<Owned> mine;
    {
      std::lock_guard lk(owned_mu_);
      if (auto it = owned_.find(generation); it != owned_.end()) {
        mine = std::move(it->second);
        owned_.erase(it);
        owned_bytes_ -= mine->pb.block.size;
      }
    }
    if (mine) {
      ++frees_;
      if (!held_.on()) {
        if (!deferred(*mine)) mine->pool->deallocate(mine->pb);  // back to the pool; no cudaFree here
        if (!record_gone) store::delete_record(c, rkey);
        return;
      }
      try {
        if (!record_gone) store::delete_record(c, rkey);
      } catch (...) {
        // the record may stay: settle finds it and keeps the block
        if (!deferred(*mine)) held_.hold_as(std::move(*mine), false);
        throw;
      }
      if (!deferred(*mine)) held_.hold(c, std::move(*mine));  // until no failover can undo it
      return;
    }
    if (borrowed_free_ && borrowed_free_(generation)) {
      if (!record_gone) store::delete_record(c, rkey);
      return;
    }
    if (record_gone) return;
    auto r = store::read_record(c, rkey);
    if (r.size() == 0) return;  // already freed
    TensorInfo t = protocol::decode_record(fields_from_reply(r.view()));
    if (t.refcount > 0) {
      log(LogLevel::warn, "ignoring free of '" + t.name + "': still " + std::to_string(t.refcount) + " reference(s)");
      return;
    }
    if (t.owner != ctx_.session && owner_alive(ctx_, c, t.owner, t.owner_pid)) {
      // An ex-allocator of record that is still alive owns it: only it can
      // free it (it keeps the record until then).
      inbox::send(c, ctx_.keys, t.owner, inbox::Free{generation});
      return;
    }
    store::delete_record(c, rkey);
    ++frees_;
  }

  // The blocks of its own a replicate copies from or into (blocks_in_use.hpp),
  // for as long as it lives. No Redis call at its end: a held free is
  // probed by the loop's tick.
  class InUse {
   public:
    explicit InUse(Allocator& a) : a_(a) {}
    ~InUse() { a_.release_unused(a_.in_use_.remove(blocks_)); }
    InUse(const InUse&) = delete;
    InUse& operator=(const InUse&) = delete;
    // Generation `gen`'s block, when this process owns it and still does
    // once it is marked (a free in between went on: false).
    bool own(std::uint64_t gen) {
      const void* b = a_.block_of(gen);
      if (!b) return false;
      add(b);
      if (a_.block_of(gen) == b) return true;
      a_.release_unused(a_.in_use_.remove({b}));
      blocks_.pop_back();
      return false;
    }
    // A block not published yet (a new replica's, before its create script).
    void add(const void* block) {
      a_.in_use_.add(block);
      blocks_.push_back(block);
    }

   private:
    Allocator& a_;
    std::vector<const void*> blocks_;
  };

  // Frees held while a failover could undo them (held_frees.hpp): the
  // loop's tick settles those due; the heartbeat notes a primary switch.
  void settle_held_frees(redis::Connection& c) {
    held_.settle(
        c, ctx_.keys, ctx_.keys.freed_ack(ctx_.session),
        [this](Owned o) {
          std::lock_guard lk(owned_mu_);
          owned_bytes_ += o.pb.block.size;
          const auto gen = o.info.generation;
          owned_[gen] = std::move(o);
        },
        [&] { return sessions_registered_elsewhere(ctx_, c, c.server()); });
  }
  void note_primary_switch() { held_.note_switch(); }

  // Records a tensor this process now owns (a migration's new home).
  void adopt(const TensorInfo& t, DevicePool* pool, const PoolBlock& pb, bool persistent) {
    std::lock_guard lk(owned_mu_);
    owned_bytes_ += pb.block.size;
    owned_[t.generation] = Owned{pool, pb, t, persistent};
  }

  // The records of what this process owns (for recovery).
  std::vector<std::pair<TensorInfo, bool>> owned_records() const override {
    std::lock_guard lk(owned_mu_);
    std::vector<std::pair<TensorInfo, bool>> v;
    for (const auto& [g, o] : owned_) v.emplace_back(o.info, o.persistent);
    return v;
  }

  // ---- the pools ----

  DevicePool& pool_for(BackendKind kind, int device) {
    // A device this process cannot use gets no pool: a pool once made lives
    // as long as the allocator, and its statistics are read every tick.
    check_device(kind, device);
    std::lock_guard lk(pools_mu_);
    auto& p = pools_[{kind, device}];
    if (!p) p = std::make_unique<DevicePool>(ctx_.backend(kind), device, ctx_.session, ctx_.opts.pool, next_alloc_id_);
    return *p;
  }

  // The pools, copied under pools_mu_: their calls (cudaFree in trim, the
  // device UUID in stats) run outside it, under each pool's own mutex. A
  // pool lives as long as the allocator (pools_ never erases).
  std::vector<DevicePool*> pools() {
    std::lock_guard lk(pools_mu_);
    std::vector<DevicePool*> v;
    for (auto& [k, p] : pools_) v.push_back(p.get());
    return v;
  }

  // One pool whose statistics cannot be read (its device went away) is
  // left out and logged; the others are still reported.
  std::vector<PoolStats> pool_stats() {
    std::vector<PoolStats> v;
    for (DevicePool* p : pools()) {
      try {
        v.push_back(p->stats());
      } catch (const std::exception& e) {
        log_limited(stats_failures_, std::string("pool statistics: ") + e.what());
      }
    }
    return v;
  }

  // A graceful stop with a standby: every allocation is kept for it to
  // adopt (see DevicePool::retain_for_handover). Returns the count.
  std::size_t retain_for_handover() {
    std::size_t n = 0;
    for (DevicePool* p : pools()) n += p->retain_for_handover();
    return n;
  }

  // What this process owns now: tensors, of them persistent, and by backend
  // kind whether their memory can outlive it (memfd, cuMem) or not.
  struct OwnedSummary {
    std::size_t tensors = 0, persistent = 0, legacy_ipc = 0;
  };
  OwnedSummary owned_summary() const {
    OwnedSummary s;
    std::lock_guard lk(owned_mu_);
    for (const auto& [g, o] : owned_) {
      ++s.tensors;
      s.persistent += o.persistent;
      s.legacy_ipc += o.info.alloc_kind == alloc_kind::cuda_ipc;
    }
    return s;
  }

  void reset_peaks() {
    for (DevicePool* p : pools()) p->reset_peak();
  }

  // Returns empty slabs to the driver (the registry's thread calls it each
  // tick, so no cudaFree runs on a create or release path), then tells
  // every other live session to close its idle mappings of what was
  // returned: an importer's open mapping keeps freed device memory
  // allocated (see process_cache.hpp).
  std::uint64_t trim_and_announce(redis::Connection& c, bool all) {
    std::vector<std::uint64_t> ids;
    std::uint64_t n = 0;
    for (DevicePool* p : pools()) n += p->trim(all, &ids);
    if (ids.empty()) return n;
    auto members = store::session_members(c, ctx_.keys);
    for (std::size_t i = 0; i < members.size(); ++i) {
      std::string sid(members[i].str());
      if (sid != ctx_.session) inbox::send(c, ctx_.keys, sid, inbox::Unmap{ctx_.session, ids});
    }
    return n;
  }

  // The leader publishes its pool statistics so any process can read them.
  void publish_pool_stats(redis::Connection& c) {
    store::write_pool_stats(c, ctx_.keys, protocol::encode_pool_stats(pool_stats()), 3 * ctx_.opts.lease_ttl);
  }

  // Unreadable statistics are logged and read as none (they are advisory).
  static std::vector<PoolStats> decode_pool_stats(std::string_view json) {
    try {
      return protocol::decode_pool_stats(json);
    } catch (const std::exception& e) {
      log(LogLevel::warn, std::string("unreadable pool statistics in Redis: ") + e.what());
      return {};
    }
  }

  // This process's share of RegistryStats.
  void fill_process_stats(ProcessStats& s) const {
    {
      std::lock_guard lk(owned_mu_);
      s.owned_allocations = owned_.size();
      s.owned_bytes = owned_bytes_;
    }
    s.creates = creates_.load();
    s.frees = frees_.load();
    s.frees_held = held_.size();
    s.frees_undone = held_.undone();
  }

 private:
  // Throws before a pool is made for a device this process cannot use:
  // Unavailable for the cuda backend without CUDA, InvalidArgument for an
  // ordinal it does not see.
  static void check_device(BackendKind kind, int device) {
    if (kind != BackendKind::cuda) return;
#if MEMCUDA_HAS_CUDA()
    (void)device_uuid(device);
#else
    (void)device;
    throw Unavailable("the cuda backend is not available: mem-cuda was built without the CUDA toolkit");
#endif
  }

  Created after_create(redis::Connection& c, Created cr) {
    if (after_create_) after_create_(c);
    return cr;
  }
  static void log_limited(std::atomic<std::uint64_t>& n, const std::string& what) {
    const auto k = ++n;
    if (k <= 3 || k % 100 == 0) log(LogLevel::warn, what + (k > 3 ? " (" + std::to_string(k) + " times)" : ""));
  }

  bool deferred(Owned& o) { return in_use_.defer(o); }  // a freed block a copy still uses waits there
  const void* block_of(std::uint64_t gen) {
    std::lock_guard lk(owned_mu_);
    auto it = owned_.find(gen);
    return it == owned_.end() ? nullptr : BlocksInUse::base_of(it->second);
  }
  void release_unused(std::vector<Owned> go) {
    for (auto& o : go) {
      if (held_.on()) held_.hold_as(std::move(o), false);  // settle reads the record again first
      else o.pool->deallocate(o.pb);
    }
  }

  void park(const std::string& create_id, Owned o) {
    std::lock_guard lk(owned_mu_);
    if (create_id.empty()) {
      unresolved_.push_back(std::move(o));  // never reused: its fate is unknown
      return;
    }
    parked_.insert_or_assign(create_id, std::move(o));
  }
  std::optional<Owned> unpark(const std::string& create_id) {
    if (create_id.empty()) return std::nullopt;
    std::lock_guard lk(owned_mu_);
    auto it = parked_.find(create_id);
    if (it == parked_.end()) return std::nullopt;
    Owned o = std::move(it->second);
    parked_.erase(it);
    return o;
  }

  Context& ctx_;
  Lease& lease_;
  std::mutex pools_mu_;  // leaf: guards pools_ only; never held across a pool's call (a DevicePool locks itself)
  std::map<std::pair<BackendKind, int>, std::unique_ptr<DevicePool>> pools_;  // declared before owned_
  mutable std::mutex owned_mu_;  // leaf: guards owned_, owned_bytes_, parked_
  std::unordered_map<std::uint64_t, Owned> owned_;  // by generation
  std::uint64_t owned_bytes_ = 0;
  // Blocks of creates whose script reply was lost, by create_id: out of the pool until a
  // retry resolves them (never retried: a leak, not a double use).
  std::unordered_map<std::string, Owned> parked_;
  std::vector<Owned> unresolved_;
  BlocksInUse in_use_;  // after pools_: its blocks go back to them
  std::atomic<std::uint64_t> next_alloc_id_{1};
  std::function<bool(std::uint64_t)> borrowed_free_;
  HeldFrees held_;  // after pools_: its blocks go back to them
  std::atomic<std::uint64_t> creates_{0}, frees_{0};
  std::atomic<std::uint64_t> stats_failures_{0};
  std::function<void(redis::Connection&)> after_create_;
  std::function<void(redis::Connection&, ExportedBlock&)> new_slab_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
