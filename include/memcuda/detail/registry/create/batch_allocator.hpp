// The allocator of record's create_many: every block of the batch taken in
// one pass over the pools, then one script publishes them all, or none
// (the script refuses the whole batch when one name is taken, and every
// block goes back to its pool). Same safety rules as Allocator::create:
// a batch whose script reply was lost parks its blocks by create_id (the
// batch id, ':', the entry's index) so that the retry replays it.
#pragma once

#include "memcuda/config.hpp"

#include <unistd.h>

#include <algorithm>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "memcuda/detail/registry/create/allocator.hpp"
#include "memcuda/detail/store/batch_scripts.hpp"
#include "memcuda/detail/store/reply.hpp"
#include "memcuda/protocol/record_desc.hpp"
#include "memcuda/detail/store/records.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class BatchAllocator {
 public:
  // The create_id of entry `i` of a batch whose command id is `id`.
  static std::string entry_create_id(const std::optional<std::string>& id, std::size_t i) {
    return id ? *id + ":" + std::to_string(i) : std::string();
  }

  // Runs after the blocks are taken and zeroed, before the script
  // publishes them: a replicate enqueues its copies into them there, so
  // that they overlap the script. `dst[i]` is entry i's memory. settle()
  // waits for what run() enqueued: called before any block it wrote goes
  // back to its pool (a refused batch, an entry answered by a replay).
  // `covers_all`: run() writes every byte of every entry (a replica's copy,
  // a pull), so the blocks are not zeroed first.
  struct BeforePublish {
    std::function<void(const std::vector<void*>& dst)> run;
    std::function<void()> settle;
    bool covers_all = false;
  };

  // Allocates, exports and publishes every tensor of `cmd` (op
  // create_many); returns them in the command's order (a Created whose
  // block has no slab is a replay answered before). Throws AlreadyExists
  // (naming the first taken name; nothing created), NotLeader,
  // InvalidArgument, BudgetExceeded, CudaError, InternalError.
  static std::vector<Allocator::Created> create_many(Allocator& A, redis::Connection& c,
                                                     const protocol::Command& cmd,
                                                     const BeforePublish* before = nullptr) {
    check_entries(cmd);
    auto [token, epoch] = A.lease_.current();
    if (!A.lease_.held()) throw NotLeader("this process is not the allocator of record");
    // One pass over the pools: every block, or (on BudgetExceeded, a CUDA
    // error) none: Slots' destructor gives back what is not published.
    Slots slots{&A};
    slots.v.resize(cmd.tensors.size());
    const Plan plan = sort_into_pools(A, cmd, epoch, slots);
    take_blocks(A, cmd, epoch, plan, slots);
    if (A.new_slab_) {
      const ExportedBlock* last = nullptr;  // blocks of one pool pass share slabs: each once
      for (auto& x : slots.v) {
        if (x.pb.slab.get() == last) continue;
        last = x.pb.slab.get();
        A.new_slab_(c, *x.pb.slab);
      }
    }
    // Every new tensor reads as zeros before the script publishes it (one
    // pass per pool; parked blocks were zeroed by their first attempt).
    for (const auto& [pool, idx] : plan.groups) {
      if (before && before->covers_all) break;
      std::vector<std::pair<const PoolBlock*, std::uint64_t>> blocks;
      for (auto i : idx) blocks.emplace_back(&slots.v[i].pb, plan.bytes[i]);
      pool->zero(blocks);
    }
    // Destroyed before `slots`: blocks written by `before` go back only
    // once its writes are done.
    struct Settle {
      const Slots& slots;
      const BeforePublish* before = nullptr;
      ~Settle() {
        if (before && std::any_of(slots.v.begin(), slots.v.end(), [](const Slot& x) { return x.give_back; }))
          before->settle();
      }
    } settle{slots};
    if (before) {
      std::vector<void*> dst;
      dst.reserve(slots.v.size());
      for (const auto& x : slots.v) dst.push_back(static_cast<char*>(x.pb.slab->base()) + x.pb.block.offset);
      settle.before = before;
      before->run(dst);
    }
    const std::string holder = holder_of(cmd);
    const store::Answer r = publish(A, c, token, holder, slots);
    const std::string& st = r.status;
    if (st == "ok" || st == "replay") return take_ownership(A, c, r, st == "replay", holder, slots);
    refused(A, c, r, st, slots);
  }

 private:
  struct Slot {
    DevicePool* pool = nullptr;
    PoolBlock pb;
    TensorInfo info;
    bool persistent = false;
    bool parked = false;     // came from a lost attempt
    bool give_back = false;  // holds a block not published (yet): back to its pool when the batch ends
  };
  // A block not published goes back to its pool, except one a lost
  // attempt may have published (parked): that one is parked again.
  struct Slots {
    Allocator* a;
    std::vector<Slot> v;
    explicit Slots(Allocator* owner) : a(owner) {}
    Slots(const Slots&) = delete;
    Slots& operator=(const Slots&) = delete;
    ~Slots() {
      for (auto& s : v) {
        if (!s.give_back) continue;
        if (s.parked) a->park(s.info.create_id, Allocator::Owned{s.pool, s.pb, s.info, s.persistent});
        else s.pool->deallocate(s.pb);
      }
    }
  };

  static void check_entries(const protocol::Command& cmd) {
    if (cmd.tensors.empty()) throw InvalidArgument("create_many needs at least one tensor");
    if (cmd.tensors.size() > protocol::kMaxBatchEntries)
      throw InvalidArgument("create_many of " + std::to_string(cmd.tensors.size()) + " tensors: at most " +
                            std::to_string(protocol::kMaxBatchEntries) + " in one batch");
    std::set<std::string_view> seen;
    for (const auto& e : cmd.tensors) {
      ::memcuda::validate_name(e.name);
      if (!seen.insert(e.name).second) throw InvalidArgument("create_many names '" + e.name + "' twice");
    }
  }

  // The entries to allocate, sorted into their pools (first-seen order).
  struct Plan {
    std::vector<std::uint64_t> bytes;
    std::vector<BackendKind> kinds;
    std::vector<std::pair<DevicePool*, std::vector<std::size_t>>> groups;  // pool -> entries
  };

  // A block parked by a lost attempt under an entry's create_id fills its
  // slot at once; the others go into the plan.
  static Plan sort_into_pools(Allocator& A, const protocol::Command& cmd, std::uint64_t epoch, Slots& slots) {
    Context& ctx = A.ctx_;
    Plan plan{std::vector<std::uint64_t>(cmd.tensors.size(), 0),
              std::vector<BackendKind>(cmd.tensors.size(), BackendKind::host), {}};
    for (std::size_t i = 0; i < cmd.tensors.size(); ++i) {
      const auto& e = cmd.tensors[i];
      if (auto parked = A.unpark(entry_create_id(cmd.id, i))) {
        parked->info.epoch = epoch;
        slots.v[i] = {parked->pool, parked->pb, parked->info, parked->persistent, true, true};
        continue;
      }
      plan.bytes[i] = byte_size(e.dtype, e.shape);
      plan.kinds[i] = e.backend.value_or(ctx.default_backend());
      DevicePool* pool = &A.pool_for(plan.kinds[i], device_for(plan.kinds[i], e.device, e.device_uuid, ctx));
      auto g = std::find_if(plan.groups.begin(), plan.groups.end(), [&](const auto& x) { return x.first == pool; });
      if (g == plan.groups.end()) g = plan.groups.insert(plan.groups.end(), {pool, {}});
      g->second.push_back(i);
    }
    return plan;
  }

  // A pool's share of the batch goes into one allocation of its own when it
  // is large enough (DevicePool::allocate_packed,
  // PoolOptions::pack_batches_min_bytes), else tensor by tensor.
  static void take_blocks(Allocator& A, const protocol::Command& cmd, std::uint64_t epoch, const Plan& plan,
                          Slots& slots) {
    auto place = [&](std::size_t i, DevicePool* pool, const PoolBlock& pb) {
      const auto& e = cmd.tensors[i];
      slots.v[i] = {pool, pb,
                    new_record(e.name, e.dtype, e.shape, plan.bytes[i], plan.kinds[i], pb, A.ctx_, epoch,
                               entry_create_id(cmd.id, i)),
                    e.persistent.value_or(false), false, true};
      slots.v[i].info.replica_of = e.replica_of;
      slots.v[i].info.source_generation = e.source_generation;
      slots.v[i].info.idle_ms = e.idle_ms;
    };
    for (const auto& [pool, idx] : plan.groups) {
      std::vector<std::uint64_t> sizes;
      sizes.reserve(idx.size());
      for (auto i : idx) sizes.push_back(plan.bytes[i]);
      if (auto packed = pool->allocate_packed(sizes)) {
        for (std::size_t j = 0; j < idx.size(); ++j) {
          // Owned by the slot from here; a throw in new_record leaves the
          // rest of the batch to be returned one block at a time.
          try {
            place(idx[j], pool, (*packed)[j]);
          } catch (...) {
            for (std::size_t r = j; r < idx.size(); ++r)
              if (!slots.v[idx[r]].give_back) pool->deallocate((*packed)[r]);
            throw;
          }
        }
        continue;
      }
      for (auto i : idx) {
        PoolBlock pb = pool->allocate(plan.bytes[i]);
        try {
          place(i, pool, pb);
        } catch (...) {
          pool->deallocate(pb);
          throw;
        }
      }
    }
  }

  // Runs the create_many script over every slot. When the link fails the
  // script may have run: every block stays out of the pool, parked by its
  // create_id, until a retry learns the outcome.
  static store::Answer publish(Allocator& A, redis::Connection& c, const std::string& token,
                              const std::string& holder, Slots& slots) {
    std::vector<std::pair<const TensorInfo*, bool>> records;
    for (const auto& s : slots.v) records.emplace_back(&s.info, s.persistent);
    try {
      auto r = store::create_many(c, A.ctx_.keys, token, holder, records);
      if (MEMCUDA_FAULT("allocator.create_reply_lost")) throw ConnectionError("fault point allocator.create_reply_lost");
      return r;
    } catch (const IoError&) {
      for (auto& s : slots.v) {
        s.give_back = false;
        A.park(s.info.create_id, Allocator::Owned{s.pool, s.pb, s.info, s.persistent});
      }
      throw;
    }
  }

  // Published (or replayed): each new block becomes an owned allocation.
  static std::vector<Allocator::Created> take_ownership(Allocator& A, redis::Connection& c, const store::Answer& r,
                                                        bool replay, const std::string& holder, Slots& slots) {
    std::vector<Allocator::Created> out;
    for (std::size_t i = 0; i < slots.v.size(); ++i) {
      auto& s = slots.v[i];
      const std::uint64_t gen = reply_u64(r[1 + 2 * i]);
      const std::int64_t rc = reply_int(r[2 + 2 * i]);
      if (replay && !s.parked) {
        out.push_back({gen, rc, {}, {}});  // answered before: its block is owned already
        continue;
      }
      s.info.generation = gen;
      s.info.refcount = rc;
      s.info.holders[holder] = 1;
      if (s.persistent) s.info.holders[std::string(HolderId::kName)] = 1;
      s.give_back = false;
      {
        std::lock_guard lk(A.owned_mu_);
        A.owned_[gen] = Allocator::Owned{s.pool, s.pb, s.info, s.persistent};
        A.owned_bytes_ += s.pb.block.size;
      }
      ++A.creates_;
      out.push_back({gen, rc, s.info, s.pb});
    }
    if (A.after_create_) A.after_create_(c);  // new allocations held by the standbys before the answer
    return out;
  }

  // Refused: nothing was written by this script. A parked block may
  // still be what a lost attempt published: adopt those, give back the rest.
  [[noreturn]] static void refused(Allocator& A, redis::Connection& c, const store::Answer& r, const std::string& st,
                                   Slots& slots) {
    const auto& k = A.ctx_.keys;
    const std::size_t stray = st == "stray" ? static_cast<std::size_t>(reply_int(r[1])) - 1 : slots.v.size();
    for (std::size_t i = 0; i < slots.v.size(); ++i) {
      auto& s = slots.v[i];
      if (!s.parked) continue;
      s.parked = false;  // not the record's: back to the pool
      if (i == stray) continue;  // not a Hash of ours: nothing of a lost attempt there
      if (A.adopt_published(c, k.tensor(s.info.name), Allocator::Owned{s.pool, s.pb, s.info, s.persistent}))
        s.give_back = false;
    }
    if (st == "exists") {
      const std::size_t i = static_cast<std::size_t>(reply_int(r[1])) - 1;
      const std::string name = i < slots.v.size() ? slots.v[i].info.name : "?";
      throw AlreadyExists("tensor '" + name + "' already exists (generation " + std::string(r[2].str()) +
                          "): create_many created none of its " + std::to_string(slots.v.size()) + " tensors");
    }
    if (st == "stray") {
      const std::string name = stray < slots.v.size() ? slots.v[stray].info.name : "?";
      throw AlreadyExists("cannot create '" + name + "': " + stray_record(k.tensor(name), r[2].str()) +
                          " (create_many created none of its " + std::to_string(slots.v.size()) + " tensors)");
    }
    A.lease_.fail_status("create_many", st, "creating " + std::to_string(slots.v.size()) + " tensors",
                         st == "notleader" ? r[1].str() : "");
  }
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
