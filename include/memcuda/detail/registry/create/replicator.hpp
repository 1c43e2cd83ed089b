// The allocator of record's replicate: one copy of a tensor (or of every
// tensor under a prefix) per device, each an ordinary persistent record under
// the reserved name `.memcuda-rep/<device uuid>/<name>` (replica_scripts.hpp),
// held by its name only. This process allocates them from its pools and
// copies into them itself: it owns every pool block and maps every source,
// so nothing is imported for the copy. The copies go along a chain of
// devices (detail/cuda/broadcast.hpp) and are enqueued, not waited for by
// readers: each replica's record names an interprocess event of its device,
// recorded after its copy, on which its readers' streams wait. Many sources
// go in growing parts, so that the copies of one part overlap the Redis
// scripts of the next.
#pragma once

#include "memcuda/config.hpp"

#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "memcuda/detail/backend/process_cache.hpp"
#include "memcuda/detail/backend/select.hpp"
#include "memcuda/detail/process/process.hpp"
#include "memcuda/detail/registry/acquire_outcome.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/create/allocator.hpp"
#include "memcuda/detail/registry/create/batch_allocator.hpp"
#include "memcuda/detail/registry/lease/lease.hpp"
#include "memcuda/detail/store/batch_scripts.hpp"
#include "memcuda/detail/store/name_index.hpp"
#include "memcuda/detail/store/records.hpp"
#include "memcuda/detail/store/replica_scripts.hpp"
#include "memcuda/detail/store/scripts.hpp"
#include "memcuda/protocol/batch.hpp"
#include "memcuda/protocol/command.hpp"
#include "memcuda/detail/base/holder_id.hpp"
#include "memcuda/detail/registry/create/replica_copies.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// One per registry (the core's); run() is safe from any thread: the
// broadcast engine it shares serialises only its enqueues.
class Replicator {
 public:
  Replicator(Context& ctx, Lease& lease, Allocator& alloc) : ctx_(ctx), lease_(lease), alloc_(alloc) {}
  Replicator(const Replicator&) = delete;
  Replicator& operator=(const Replicator&) = delete;
  // Where a call's references go once its copies are done (the core's
  // release queue; set before any call). False: given back here.
  using ReleaseLater = std::function<bool(const std::vector<std::pair<std::string, std::uint64_t>>&)>;
  void set_release_later(ReleaseLater f) { release_later_ = std::move(f); }
  // Replicates `cmd.name` (every name under it when cmd.prefix) to the
  // devices `cmd.devices` (UUIDs); the source's own device is skipped: the
  // source serves it. -> one entry per replica, made or already current.
  // The names under `prefix` but replicas (a prefix such as "." has them),
  // at most kMaxReplicas + 1: the reserved range is stepped over at once.
  std::vector<std::string> sources_under(redis::Connection& c, const std::string& prefix) {
    constexpr std::size_t want = protocol::kMaxReplicas + 1;
    std::vector<std::string> out;
    std::string after;
    while (out.size() < want) {
      auto page = names_page(c, ctx_.keys, prefix, after, want);
      for (auto& n : page)
        if (!n.starts_with(kReplicaPrefix)) out.push_back(std::move(n));
      if (page.size() < want) break;
      after = page.back();
      if (after.starts_with(kReplicaPrefix)) after = std::string(kReplicaPrefix) + '\xff';
    }
    return out;
  }

  std::vector<protocol::ReplyTensor> run(redis::Connection& c, const protocol::Command& cmd) {
    const auto token = lease_.current().first;
    if (cmd.name.starts_with(kReplicaPrefix))
      throw InvalidArgument("'" + cmd.name + "' is a replica: replicate its source instead");
    if (cmd.devices.empty()) throw InvalidArgument("replicate '" + cmd.name + "': no devices given");
    std::vector<std::string> names{cmd.name};
    if (cmd.replicate_prefix) {
      if (cmd.name.empty()) throw InvalidArgument("replicate of the empty prefix: name one");
      names = sources_under(c, cmd.name);
      if (names.empty()) throw NotFound("no tensor under the prefix '" + cmd.name + "'");
    }
    std::size_t reply_bytes = 0;  // the reply lists every replica: it must fit one
    for (const auto& n : names) reply_bytes += cmd.devices.size() * (kReplicaPrefix.size() + 64 + n.size());
    if (reply_bytes > protocol::kMaxReplyBytes - 4096)
      throw InvalidArgument("replicate of '" + cmd.name + "': the replicas' names would not fit one reply (" +
                            std::to_string(reply_bytes) + " bytes): replicate to fewer devices at once");
    if (names.size() * cmd.devices.size() > protocol::kMaxReplicas)
      throw InvalidArgument("replicate of '" + cmd.name + "': " + std::to_string(names.size()) + " tensor(s) to " +
                            std::to_string(cmd.devices.size()) + " device(s) is more than " +
                            std::to_string(protocol::kMaxReplicas) + " replicas in one command");
    // The sources, the replicas made or refreshed, and the references the
    // call took (to what this process does not own): blocks it owns are
    // marked in use until the copies are done instead (InUse).
    std::vector<TensorInfo> src;
    Refs made, refs;
    std::size_t done = 0;  // made[0, done): replicas of parts copied and marked, kept when a later part fails
    Phases ph;
    try {
#if MEMCUDA_HAS_CUDA()
      std::vector<protocol::ReplyTensor> out;
      {
        Allocator::InUse keep(alloc_);  // outlives the copies: no block they touch is reused meanwhile
        ReplicaCopies copies;           // waited for before any reference goes
        // In growing parts (8, 16, 32... names), each taken, made and marked
        // before the next: the copies of a part run while the scripts of
        // the next do, and the first start after a few sources' scripts,
        // not after all of them.
        std::size_t part = kFirstPart;
        for (std::size_t at = 0; at < names.size(); at += part, part *= 2) {
          const std::vector<std::string> some(names.begin() + static_cast<std::ptrdiff_t>(at),
                                              names.begin() + static_cast<std::ptrdiff_t>(std::min(names.size(), at + part)));
          std::vector<TensorInfo> taken;
          const bool go = take(c, cmd, token, some, src, taken, refs, keep);
          ph.mark("acquire");
          if (!go) {  // a publish's refresh of a source gone or of host memory: nothing more to do
            copies.settle();  // the parts before it: copied before their sources' references go
            give_back(c, refs, made, false);
            return out;
          }
          auto o = copy_all(c, cmd, token, taken, copies, made, refs, keep, ph, at);
          out.insert(out.end(), o.begin(), o.end());
          done = made.size();
        }
      }
      ph.mark("copies");
      give_back(c, refs, made, false);  // queued: sent beside what the caller does next
      ph.mark("give back");
      if (log_level() >= LogLevel::debug)
        log(LogLevel::debug, "replicate '" + cmd.name + "': " + std::to_string(src.size()) + " source(s), " +
                                 std::to_string(out.size()) + " replica(s):" + ph.text);
      return out;
#else
      std::vector<TensorInfo> taken;
      Allocator::InUse keep(alloc_);
      if (!take(c, cmd, token, names, src, taken, refs, keep)) {
        give_back(c, refs, made, false);
        return {};
      }
      throw Unavailable("replicate: mem-cuda was built without CUDA");
#endif
    } catch (...) {
      give_back(c, refs, made, true, done);
      throw;
    }
  }

 private:
  using Refs = std::vector<std::pair<std::string, std::uint64_t>>;

  // Where a call's time goes, for the debug log.
  struct Phases {
    std::chrono::steady_clock::time_point t = std::chrono::steady_clock::now();
    std::string text;
    void mark(const char* what) {
      const auto now = std::chrono::steady_clock::now();
      text += std::string(" ") + what + " " +
              std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(now - t).count() / 1000.0) + " ms";
      t = now;
    }
  };

  static constexpr std::size_t kFirstPart = 8;

  // Each of `names` described in one script (the batch acquire: each record's short desc, not its
  // whole Hash), into `all` and `taken`. A source whose block this process owns needs no reference
  // (`keep` marks it in use); the others are taken again with one, into `refs` (given back by the
  // caller). The first refusal is thrown after the rest went in. False: a publish's refresh whose
  // source is gone or host memory (other nodes pulled it: their next get pulls again).
  bool take(redis::Connection& c, const protocol::Command& cmd, const std::string& token,
            const std::vector<std::string>& names, std::vector<TensorInfo>& all, std::vector<TensorInfo>& taken,
            Refs& refs, Allocator::InUse& keep) {
    std::vector<std::string> others;
    std::exception_ptr refused = describe(c, cmd, token, names, "", all, taken, refs, keep, &others);
    if (!others.empty()) {
      auto again = describe(c, cmd, token, others, ctx_.session, all, taken, refs, keep, nullptr);
      if (!refused) refused = again;
    }
    if (refused) {
      if (cmd.replicate_refresh && gone(refused)) return false;
      std::rethrow_exception(refused);
    }
    for (const auto& s : taken)
      if (s.backend != BackendKind::cuda) {
        if (cmd.replicate_refresh) return false;
        throw InvalidArgument("tensor '" + s.name + "' is host memory: replicas are per CUDA device");
      }
    return true;
  }

  // One batch acquire of `names` by `holder` ('': descriptions only, and a
  // source this process does not own goes to `others`). -> the first refusal
  std::exception_ptr describe(redis::Connection& c, const protocol::Command& cmd, const std::string& token,
                              const std::vector<std::string>& names, const std::string& holder,
                              std::vector<TensorInfo>& all, std::vector<TensorInfo>& taken, Refs& refs,
                              Allocator::InUse& keep, std::vector<std::string>* others) {
    const redis::Reply r = store::acquire_many(c, ctx_.keys, Selection::of(names), holder, ctx_.node, token, "");
    if (r.size() > 0 && !r[0].is_array())  // {'notleader', holder}
      lease_.fail_status("acquire_many", r[0].str(), "replicating '" + cmd.name + "'",
                         r.size() > 1 ? r[1].str() : std::string_view());
    std::exception_ptr refused;
    for (std::size_t i = 0; i < r.size(); ++i) {
      const redis::ReplyView e = r[i];
      const std::string name(e[0].str()), st(e[1].str());
      std::uint64_t gen = 0;
      try {
        if (st != "ok" && st != "desc")
          store::throw_refused("acquire_many", st, e.size() > 2 ? e[2] : e[1], name, std::nullopt, ctx_.node);
        TensorInfo s = store::decode_taken(e, st, gen);
        if (holder.empty() && !keep.own(s.generation)) {
          others->push_back(name);
          continue;
        }
        if (!holder.empty()) refs.emplace_back(s.name, s.generation);
        all.push_back(s);
        taken.push_back(std::move(s));
      } catch (const ProtocolError&) {
        if (gen && !holder.empty()) alloc_.release(c, name, gen, ctx_.session, "");  // taken, but no record of ours
        if (!refused) refused = std::current_exception();
      } catch (...) {
        if (!refused) refused = std::current_exception();
      }
    }
    return refused;
  }

  static bool gone(const std::exception_ptr& e) {
    try {
      std::rethrow_exception(e);
    } catch (const NotFound&) {
      return true;
    } catch (const Lost&) {
      return true;
    } catch (...) {
      return false;
    }
  }

  // Drops the references the call took (its own session's: no fence, so that they go after a lost
  // lease too): after a success through the release queue, unless it cannot take them (a core being
  // destroyed); after a failure here, so that the error leaves nothing held. Callers have waited for
  // the copies. A failed call first unlinks what it made or refreshed past `done` (the parts before the
  // failing one are copied and marked: they stay): not copied, those would hold their memory until
  // the source goes.
  void give_back(redis::Connection& c, const Refs& refs, const Refs& made, bool failed,
                 std::size_t done = 0) noexcept {
    if (failed) {
      for (std::size_t i = done; i < made.size(); ++i) {
        const auto& [name, gen] = made[i];
        try {
          auto g = store::read_generation(c, ctx_.keys, name);
          if (!g.is_nil() && g.str() == std::to_string(gen)) unlink(c, name);
        } catch (const std::exception& e) {
          log(LogLevel::warn, "replicate: unlinking the replica '" + name + "' it failed to copy: " + e.what());
        }
      }
    }
    try {
      if (refs.empty()) return;
      if (!failed && release_later_ && release_later_(refs)) return;  // a refusal leaves nothing behind it
      for (const auto& [name, gen] : refs) {
        try {
          alloc_.release(c, name, gen, ctx_.session, "");
        } catch (const std::exception& e) {
          log(LogLevel::warn, "replicate: giving back the reference to '" + name + "': " + e.what());
        }
      }
    } catch (const std::exception& e) {
      log(LogLevel::warn, std::string("replicate: giving back its references: ") + e.what());
    }
  }

  // Unlinks a stale replica; its memory goes with its last reader.
  void unlink(redis::Connection& c, const std::string& rep) {
    auto r = store::remove(c, ctx_.keys, rep, ctx_.session);
    if (r.is("free")) alloc_.free_unlinked(c, reply_u64(r[1]), true);
  }

#if MEMCUDA_HAS_CUDA()
  std::vector<protocol::ReplyTensor> copy_all(redis::Connection& c, const protocol::Command& cmd,
                                              const std::string& token, const std::vector<TensorInfo>& src,
                                              ReplicaCopies& cp, Refs& made, Refs& refs, Allocator::InUse& keep,
                                              Phases& ph, std::size_t part) {
    std::vector<protocol::ReplyTensor> out;
    std::vector<ReplicaTarget> todo;
    // Fault point replicate.same_device: a replica beside its source, so
    // that a host with one GPU runs every step of a copy.
    const bool beside = MEMCUDA_FAULT("replicate.same_device");
    for (const auto& uuid : cmd.devices) {
      // Unavailable: this process does not see it. A publish's refresh
      // skips it: a fleet's other nodes (their ids are in `replicas` too)
      // pull again at their next get.
      int dev = -1;
      try {
        dev = ordinal_of_uuid(uuid, -1);
      } catch (const Unavailable&) {
        if (cmd.replicate_refresh) continue;
        throw;
      }
      for (std::size_t i = 0; i < src.size(); ++i)
        if (src[i].device_uuid != uuid || beside) todo.push_back({i, uuid, dev});
    }
    Found found = missing(c, todo, src, out, cmd.replicate_refresh);
    ph.mark("find");
    std::map<int, std::pair<std::string, std::string>> events;  // device -> its event, its path
    std::vector<ReplicaDest> dests = hold_stale(c, found.stale, cp, made, refs);
    ph.mark("hold stale");
    if (!found.make.empty()) {
      events = make_new(c, cmd, src, found.make, dests, cp, made, keep, ph, part);
    } else if (!dests.empty()) {
      events = copier_.enqueue(dests, src, cp);
      ph.mark("enqueue");
    }
    if (dests.empty()) return out;
    mark_ready(c, cmd, token, src, dests, events);
    for (const auto& d : dests) out.push_back({d.name, d.generation, 1});
    ph.mark("ready");
    return out;
  }

  // Makes the missing replicas in one create many, their copies (and those
  // of the stale ones in `dests`, which the new ones join) enqueued before
  // the script publishes them. -> device -> {its event, its path}
  std::map<int, std::pair<std::string, std::string>> make_new(
      redis::Connection& c, const protocol::Command& cmd, const std::vector<TensorInfo>& src,
      const std::vector<ReplicaTarget>& make, std::vector<ReplicaDest>& dests, ReplicaCopies& cp, Refs& mine,
      Allocator::InUse& keep, Phases& ph, std::size_t part) {
    std::map<int, std::pair<std::string, std::string>> events;
    protocol::Command many;
    many.op = protocol::Op::create_many;
    // Held by its name only: until its copy is done, `keep` marks its block in use, so that an
    // unlink meanwhile (a sweep, a drop, another replicate) cannot hand it to a new tensor.
    many.holder = std::string(HolderId::kName);
    // One id per part (the entries' create ids, which park blocks, derive from it).
    many.id = cmd.id ? std::optional<std::string>(*cmd.id + "/replicas/" + std::to_string(part)) : std::nullopt;
    for (const auto& t : make) {
      const auto& s = src[t.src];
      protocol::CreateEntry e;
      e.name = replica_name(t.uuid, s.name);
      e.dtype = s.dtype;
      e.shape = s.shape;
      e.device = t.device;
      e.device_uuid = t.uuid;
      e.backend = BackendKind::cuda;
      e.persistent = true;
      e.replica_of = s.name;
      e.source_generation = s.generation;
      e.idle_ms = cmd.idle_ms.value_or(0);
      many.tensors.push_back(std::move(e));
    }
    // The copies (the stale replicas' too) are enqueued into the new
    // blocks before the script publishes them, so that they run while it
    // does; a replayed entry (a retried command) has its block elsewhere
    // and is copied after.
    BatchAllocator::BeforePublish early{
        [&](const std::vector<void*>& dst) {
          for (const void* d : dst) keep.add(d);
          std::vector<ReplicaDest> all = dests;
          for (std::size_t i = 0; i < dst.size(); ++i) all.push_back({make[i], many.tensors[i].name, 0, dst[i]});
          events = copier_.enqueue(all, src, cp);
          ph.mark("enqueue");
        },
        [&] { cp.settle(); }, /*covers_all=*/true};
    auto made = BatchAllocator::create_many(alloc_, c, many, &early);
    std::vector<ReplicaDest> replayed;
    for (std::size_t i = 0; i < made.size(); ++i) {
      mine.emplace_back(many.tensors[i].name, made[i].generation);
      ReplicaDest d{make[i], many.tensors[i].name, made[i].generation, nullptr};
      if (!made[i].block.slab) {
        d.ptr = target_pointer(c, made[i], many.tensors[i].name, cp);
        replayed.push_back(d);
      }
      dests.push_back(std::move(d));
    }
    if (!replayed.empty()) events = copier_.enqueue(replayed, src, cp);  // recorded after the others: covers them
    ph.mark("create");
    return events;
  }

  // "Replica ready" of every source, each replica marked with its device's
  // event; a refusal throws (a stale source only for an explicit replicate).
  void mark_ready(redis::Connection& c, const protocol::Command& cmd, const std::string& token,
                  const std::vector<TensorInfo>& src, const std::vector<ReplicaDest>& dests,
                  std::map<int, std::pair<std::string, std::string>>& events) {
    // Marked per source: its replicas' records name their device's event.
    std::map<std::size_t, std::vector<store::ReplicaMark>> marks;
    for (const auto& d : dests)
      marks[d.t.src].push_back({d.t.uuid, events[d.t.device].first, events[d.t.device].second, d.generation});
    std::vector<store::ReadySource> ready;
    for (const auto& [i, m] : marks) ready.push_back({src[i].name, src[i].generation, src[i].event_version, &m});
    const auto answers = store::replica_ready(c, ctx_.keys, token, ready);
    for (std::size_t j = 0; j < answers.size(); ++j) {
      const auto& r = answers[j];
      const std::string name(ready[j].name);
      if (r.is("notleader")) lease_.fail_status("replica ready", r.status, "replicating '" + name + "'", r[1].str());
      // A refresh overtaken by another publish leaves its replicas stale:
      // that publish's refresh follows.
      if (r.is("stale") && !cmd.replicate_refresh)
        throw StaleHandle("tensor '" + name + "' was published or re-created while it was replicated; replicate "
                          "it again");
    }
  }

  // What a replicate finds per target: no replica (make one), or one of
  // this source generation copied before its last publish (stale: copied
  // again in place, so that its holders see the new bytes where they are).
  struct Found {
    std::vector<ReplicaTarget> make;
    std::vector<std::pair<ReplicaTarget, TensorInfo>> stale;
  };

  // The targets without a current replica; the current ones go to `out`.
  // A replica never copied, or of an older source, is unlinked, to be made
  // anew. With `refresh_only` (a publish's), none is made.
  Found missing(redis::Connection& c, const std::vector<ReplicaTarget>& todo, const std::vector<TensorInfo>& src,
                std::vector<protocol::ReplyTensor>& out, bool refresh_only) {
    std::vector<redis::Command> reads;
    for (const auto& t : todo) reads.push_back(store::read_record_cmd(ctx_.keys.tensor(replica_name(t.uuid, src[t.src].name))));
    std::vector<std::exception_ptr> errs;
    auto got = reads.empty() ? std::vector<redis::Reply>{} : c.pipeline(reads, &errs);
    Found found;
    for (std::size_t i = 0; i < todo.size(); ++i) {
      const auto& s = src[todo[i].src];
      const std::string rep = replica_name(todo[i].uuid, s.name);
      std::optional<TensorInfo> r;
      if (!got[i].is_error() && got[i].size() > 0) {
        try {
          r = protocol::decode_record(fields_from_reply(got[i].view()));
        } catch (const ProtocolError&) {
          // not a record of ours: the create below names it
        }
      }
      if (r && r->replica_of == s.name) {
        const bool ours = r->state == TensorState::ready && r->source_generation == s.generation &&
                          r->copied_version && r->backend == BackendKind::cuda && r->device_uuid == todo[i].uuid;
        if (ours && *r->copied_version == s.event_version) {
          out.push_back({rep, r->generation, 1});
          continue;
        }
        if (ours) {
          found.stale.emplace_back(todo[i], std::move(*r));
          continue;
        }
        unlink(c, rep);  // of an older source, or never copied
      }
      if (!refresh_only) found.make.push_back(todo[i]);
    }
    return found;
  }

  // References of this process on the stale replicas, so that no unlink
  // frees a block the copy writes: those still of the generation read.
  // -> their destinations
  std::vector<ReplicaDest> hold_stale(redis::Connection& c, const std::vector<std::pair<ReplicaTarget, TensorInfo>>& stale,
                                      ReplicaCopies& cp, Refs& made, Refs& refs) {
    std::vector<ReplicaDest> out;
    if (stale.empty()) return out;
    std::vector<std::string> names;
    for (const auto& [t, r] : stale) names.push_back(r.name);
    std::vector<std::exception_ptr> errs;
    const auto answers = store::acquire_each(c, ctx_.keys, names, ctx_.session, ctx_.node, "", errs);
    for (std::size_t i = 0; i < stale.size(); ++i) {
      if (errs[i]) continue;
      TensorInfo now;
      try {
        now = acquired(ctx_, lease_, alloc_, answers[i], names[i], std::nullopt, ctx_.session);
      } catch (const std::exception&) {
        continue;  // gone meanwhile (the next replicate makes it), or corrupt (given back)
      }
      made.emplace_back(now.name, now.generation);
      refs.emplace_back(now.name, now.generation);
      if (now.generation != stale[i].second.generation) continue;  // re-created meanwhile
      out.push_back({stale[i].first, now.name, now.generation, copier_.pointer_of(now, cp)});
    }
    return out;
  }

  // A new replica's pointer: its block here, or (a replay) its record's
  // allocation through this process's cache.
  void* target_pointer(redis::Connection& c, const OwnAllocator::Created& cr, const std::string& name, ReplicaCopies& cp) {
    if (cr.block.slab) return static_cast<char*>(cr.block.slab->base()) + cr.info.offset;
    return copier_.pointer_of(
        protocol::decode_record(fields_from_reply(store::read_record(c, ctx_.keys.tensor(name)).view())), cp);
  }
#endif

  Context& ctx_;
  Lease& lease_;
  Allocator& alloc_;
  ReleaseLater release_later_;
#if MEMCUDA_HAS_CUDA()
  ReplicaCopier copier_;
#endif
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
