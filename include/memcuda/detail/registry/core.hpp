// The state a TensorRegistry shares with its tensors and its thread, as a
// composition of one object per job (docs/design.md, "The code, by role",
// draws it). Here, and only here, the concrete Lease and Allocator are
// handed to the jobs; the others see them as a LeaseView and an
// OwnAllocator (lease_view.hpp, own_allocator.hpp).
//
// A `redis::Connection&` parameter is always the one the calling entry
// point holds for that call (borrowed from Context::pool or
// Context::waits). LOCK ORDER: docs/design.md, "Lock order".
#pragma once

#include "memcuda/config.hpp"

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/detail/backend/process_cache.hpp"
#include "memcuda/detail/backend/select.hpp"
#include "memcuda/detail/base/copy_count.hpp"
#include "memcuda/detail/process/process.hpp"
#include "memcuda/detail/registry/get/client.hpp"
#include "memcuda/detail/registry/get/dict_holds.hpp"
#include "memcuda/detail/registry/get/holdings.hpp"
#include "memcuda/detail/registry/get/invalidation.hpp"
#include "memcuda/detail/registry/get/recovery.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/inbox.hpp"
#include "memcuda/detail/registry/create/allocator.hpp"
#include "memcuda/detail/registry/create/executor.hpp"
#include "memcuda/detail/registry/fleet/node_service.hpp"
#include "memcuda/detail/registry/lease/lease.hpp"
#include "memcuda/detail/registry/takeover/migration.hpp"
#include "memcuda/detail/registry/gc/sessions.hpp"
#include "memcuda/detail/registry/get/borrowed.hpp"
#include "memcuda/detail/registry/takeover/standby.hpp"
#include "memcuda/detail/registry/release_queue.hpp"
#include "memcuda/detail/store/lease.hpp"
#include "memcuda/detail/store/lists.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class Core : public std::enable_shared_from_this<Core> {
 public:
  static std::shared_ptr<Core> make(RegistryOptions o) { return std::make_shared<Core>(std::move(o)); }
  // Constructs the release queue first, so that it outlives every
  // registry, static ones included (statics go in reverse order).
  // The standby thread runs where this registry hosts the control thread
  // (host memfds and cuMem allocations are both shared by fd).
  explicit Core(RegistryOptions o) : ctx(std::move(o)) {
    (void)Process::get().releases();
    alloc.set_borrowed_free([this](std::uint64_t g) { return borrowed.drop(g); });
    client.set_replicator([this](redis::Connection& c, const protocol::Command& cmd) { return replicator.run(c, cmd); });
    replicator.set_release_later([this](const std::vector<std::pair<std::string, std::uint64_t>>& refs) {
      auto self = weak_from_this().lock();
      if (!self) return false;  // not owned by a shared_ptr (being destroyed): the caller gives them back
      for (const auto& [name, gen] : refs) Process::get().releases().push(self, ctx, alloc, name, gen);
      return true;
    });
    if (ctx.opts.fleet) {
      executor.set_pull([this](redis::Connection& c, const std::vector<std::string>& names) { return node.pull(c, names); });
      alloc.set_new_slab([this](redis::Connection& c, ExportedBlock& s) { node.expose_new(c, s); });
    }
    if (ctx.opts.control_thread) {
      standby.start();
      alloc.set_after_create([this](redis::Connection& c) { secure_new_allocations(c); });
    }
  }

  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  Context ctx;
  Borrowed borrowed;  // buffers this registry shared without a copy (TensorRegistry::share)
  Lease lease{ctx};
  Allocator alloc{ctx, lease};
  Holdings holdings{ctx.keys.prefix()};
  DictHolds dicts;
  Client client{ctx, lease, alloc, holdings};
  Replicator replicator{ctx, lease, alloc};
  Executor executor{ctx, lease, alloc, replicator};
  NodeService node{ctx, lease, alloc};  // a fleet's: this node's memory to others, others' to this node
  Sessions sessions{ctx, alloc};
  Migration migration{ctx, lease, alloc};
  Recovery recovery{ctx, alloc, borrowed, holdings, dicts};
  Invalidation invalidation{ctx, holdings};
  // Last: its thread stops (~Standby) before the members it uses go.
  Standby standby{ctx, lease};

 private:
  std::atomic<std::uint64_t> secured_version_{0};  // FdService version all standbys held at
  std::atomic<std::uint64_t> secure_timeouts_{0};

 public:

  bool is_leader() const noexcept { return lease.held(); }

  // After a create of the allocator of record, before it is answered: when
  // FdService's version moved (a new allocation), publishes it, wakes the
  // standbys and waits, at most kSecureWait, until each one holds its fd,
  // so that a kill -9 right after the answer loses nothing (docs/design.md,
  // "The fd server and standby holding").
  void secure_new_allocations(redis::Connection& c) {
    auto svc = FdService::existing();
    if (!svc) return;
    const std::uint64_t v = svc->version();
    if (v == secured_version_.load()) return;
    try {
      const auto ids = waited_standbys(c);  // caught up with what was published before this create
      standby.publish_now(c);
      if (!ids.empty()) {
        store::wake_standbys(c, ctx.keys, ids);
        const auto deadline = std::chrono::steady_clock::now() + kSecureWait;
        for (auto behind = store::standbys_behind(c, ctx.keys, ids); !behind.empty();
             behind = store::standbys_behind(c, ctx.keys, ids)) {
          if (std::chrono::steady_clock::now() >= deadline) {
            {
              std::lock_guard lk(lagging_mu_);
              lagging_.insert(behind.begin(), behind.end());
            }
            if (++secure_timeouts_ <= 3 || secure_timeouts_ % 100 == 0)
              log(LogLevel::warn, "create answered before every standby holds the fd of its new allocation (waited " +
                                      std::to_string(kSecureWait.count()) + " ms; " +
                                      std::to_string(secure_timeouts_.load()) +
                                      " time(s)): a kill -9 of this process now may lose it");
            return;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
      secured_version_.store(v);
    } catch (const std::exception& e) {
      // Redis trouble: the create stands; the standby threads catch up.
      log(LogLevel::warn, std::string("create: could not make sure the standbys hold the new allocation: ") + e.what());
    }
  }
  static constexpr auto kSecureWait = std::chrono::milliseconds(1000);
  // How many creates were answered after kSecureWait without every standby.
  std::uint64_t secure_timeouts() const noexcept { return secure_timeouts_.load(); }

 private:
  // The live standbys a create waits for: not one that let an earlier
  // create time out and has not caught up since, so that one such standby
  // costs one wait, not one per create.
  std::vector<std::string> waited_standbys(redis::Connection& c) {
    auto ids = sessions.standby_sessions(c);
    std::set<std::string> lagging;
    {
      std::lock_guard lk(lagging_mu_);
      lagging = lagging_;
    }
    if (lagging.empty()) return ids;
    const std::vector<std::string> was(lagging.begin(), lagging.end());
    const auto behind = store::standbys_behind(c, ctx.keys, was);
    const std::set<std::string> still(behind.begin(), behind.end());
    {
      std::lock_guard lk(lagging_mu_);
      for (const auto& id : was)
        if (!still.count(id)) lagging_.erase(id);
    }
    std::erase_if(ids, [&](const std::string& id) { return still.count(id) != 0; });
    return ids;
  }
  std::mutex lagging_mu_;  // leaf: guards lagging_; never held across Redis
  std::set<std::string> lagging_;

 public:

  // A SharedTensor's last copy, or a DLPack deleter: no I/O here. The
  // queued release keeps the core alive until it is sent.
  static void release_later(std::shared_ptr<Core> self, std::string name, std::uint64_t gen) noexcept {
    Core& c = *self;
    c.holdings.note(name, gen, -1);
    Process::get().releases().push(std::move(self), c.ctx, c.alloc, std::move(name), gen);
  }

  // Waits until the releases this process queued so far are in Redis.
  static void flush(std::chrono::milliseconds timeout) {
    Holdings::end_lingering_everywhere();  // flush() means "released now": no window outlives it
    if (!Process::get().releases().flush(timeout))
      throw TimeoutError("queued releases did not reach Redis within " + std::to_string(timeout.count()) + " ms");
  }
  // Before a call that talks to Redis: this process's earlier releases
  // first, sent by this thread when still queued (no hand-off); no
  // exception: the call itself reports an unreachable Redis. Nothing
  // queued: two atomic loads.
  void see_own_releases() { (void)Process::get().releases().flush(ctx.opts.request_timeout); }

  GcReport collect_garbage_now() {
    auto c = ctx.pool.acquire();
    auto [token, epoch] = lease.current();
    const bool lead = is_leader();
    GcReport rep = sessions.collect(*c, lead ? token : "");
    if (lead) {
      auto [m, l] = migration.round(*c, token);
      rep.tensors_migrated = m;
      rep.tensors_lost = l;
    }
    return rep;
  }

  std::uint64_t trim_now() {
    auto c = ctx.pool.acquire();
    auto n = alloc.trim_and_announce(*c, true);
    // The returned slabs' fields go now, so standbys close their fds (and
    // the memory is freed) without waiting for a tick.
    if (ctx.opts.control_thread) standby.withdraw_stale(*c);
    return n;
  }

  // Reads counters the scripts keep (memcuda:usage, the name index's
  // size), never the records: the same few round trips at any size.
  RegistryStats stats() {
    RegistryStats s;
    {
      auto c = ctx.pool.acquire();
      // A key another client wrote with the wrong type reads as absent until
      // the allocator of record moves it aside (index_repair.hpp): the
      // tensors then count from the counters, or the counters stay empty.
      std::vector<std::exception_ptr> errs;
      auto u = store::read_counters(*c, ctx.keys, &errs);
      if (!u[1].is_error()) s.per_device = decode_usage(u[1].view());
      for (const auto& d : s.per_device) {
        s.bytes += d.bytes;
        if (u[0].is_error()) s.tensors += d.tensors;
      }
      if (!u[0].is_error()) s.tensors = static_cast<std::uint64_t>(u[0].integer());
      s.leader = client.read_leader(*c);
      if (!u[2].is_error()) s.queue_length = static_cast<std::uint64_t>(u[2].integer());
      if (!u[3].is_error()) s.quarantined = static_cast<std::uint64_t>(u[3].integer());
      s.sessions = sessions.live(*c);
      if (is_leader()) {
        s.pools = alloc.pool_stats();
      } else if (auto ps = store::read_pool_stats(*c, ctx.keys); !ps.is_nil()) {
        s.pools = Allocator::decode_pool_stats(ps.str());
      }
    }
    alloc.fill_process_stats(s.process);
    auto& pc = Process::get().cache();
    s.process.live_imports = pc.live_imports();
    s.process.import_opens = pc.opens();
    s.process.import_hits = pc.hits();
    s.process.copies = Process::get().copies().copies();
    s.process.copied_bytes = Process::get().copies().bytes();
    auto& fp = Process::get().fds();
    s.process.fd_requests = fp.requests();
    s.process.fd_parked = fp.parked();
    s.process.fd_parked_hits = fp.hits();
    s.process.fd_parked_dropped = fp.dropped();
    s.process.replica_wait_misses = store::replica_wait_misses().load(std::memory_order_relaxed);
    s.process.pulls = node.pulls();
    s.process.pulled_bytes = node.pulled_bytes();
    return s;
  }

  // memcuda:usage: "tensors:<backend>:<device>:<uuid>" and "bytes:..." per
  // device (index_fn.hpp). A field that does not parse is skipped.
  static std::vector<DeviceUsage> decode_usage(redis::ReplyView r) {
    std::map<std::string, DeviceUsage> per;
    for (std::size_t i = 0; i + 1 < r.size(); i += 2) {
      const std::string_view f = r[i].str();
      const bool count = f.starts_with("tensors:");
      if (!count && !f.starts_with("bytes:")) continue;
      const std::string_view d = f.substr(f.find(':') + 1);
      const auto c1 = d.find(':'), c2 = d.find(':', c1 == d.npos ? c1 : c1 + 1);
      if (c2 == d.npos) continue;
      auto backend = backend_from_string(d.substr(0, c1));
      auto device = protocol::detail::parse_decimal<std::int64_t>(d.substr(c1 + 1, c2 - c1 - 1));
      auto value = protocol::detail::parse_decimal<std::int64_t>(r[i + 1].str());
      if (!backend || !device || !value) continue;
      auto& u = per[std::string(d)];
      u.backend = *backend;
      u.device = static_cast<int>(*device);
      u.device_uuid = std::string(d.substr(c2 + 1));
      (count ? u.tensors : u.bytes) = static_cast<std::uint64_t>(std::max<std::int64_t>(*value, 0));
    }
    std::vector<DeviceUsage> out;
    for (auto& [k, u] : per)
      if (u.tensors) out.push_back(std::move(u));
    return out;
  }

  // A leader's inbox, without waiting: messages sent before it led, or by
  // an ex-leader that has not seen its lease go yet, would wait there forever.
  void drain_inbox(redis::Connection& c) {
    for (int i = 0; i < 64; ++i) {
      auto r = store::inbox_take(c, ctx.keys, ctx.session);
      if (r.is_nil()) return;
      handle_inbox(c, std::string(r.str()), true);
    }
  }

  // As the leader (draining), a copy request is not executed: it was sent
  // to this process before it led, by a round whose wait has ended, and its
  // target may be another tensor's memory by now.
  void handle_inbox(redis::Connection& c, const std::string& raw, bool leading = false) {
    inbox::Message msg;
    try {
      msg = inbox::decode(raw, ctx.node);
    } catch (const std::exception& e) {
      log(LogLevel::warn, std::string("ignoring an unreadable inbox message: ") + e.what());
      return;
    }
    try {
      if (auto* f = std::get_if<inbox::Forget>(&msg)) {
        Process::get().cache().forget_owner(f->owner);
      } else if (auto* u = std::get_if<inbox::Unmap>(&msg)) {
        for (auto id : u->alloc_ids) Process::get().cache().forget_allocation(u->owner, id);
      } else if (auto* fr = std::get_if<inbox::Free>(&msg)) {
        alloc.free_unlinked(c, fr->generation);
      } else if (auto* m = std::get_if<inbox::Migrate>(&msg)) {
        if (leading) {
          log(LogLevel::info, "dropping a stale copy request for '" + m->to.name + "' sent before this process led");
          return;
        }
        if (!m->reply_to.starts_with(ctx.keys.reply(""))) throw InvalidArgument("migrate reply_to is not a reply list");
        inbox::MigrateAnswer ans{m->id, true, {}};
        try {
          const TensorInfo& to = m->to;
          if (to.offset > to.alloc_bytes || to.bytes > to.alloc_bytes - to.offset)
            throw InvalidArgument("migration target out of bounds");
          copy_for_migration(m->from, to);
          log(LogLevel::info, "copied '" + to.name + "' (" + std::to_string(to.bytes) +
                                  " bytes) for the allocator of record: its exporter died");
        } catch (const std::exception& e) {
          ans.ok = false;
          ans.error = e.what();
        }
        store::push_expiring(c, m->reply_to, inbox::encode_answer(ans));
      } else {
        log(LogLevel::warn, "ignoring an inbox message with op '" + std::get<inbox::Unknown>(msg).op + "'");
      }
    } catch (const ConnectionError&) {
      throw;
    } catch (const TimeoutError&) {
      throw;
    } catch (const std::exception& e) {
      log(LogLevel::warn, std::string("inbox message failed: ") + e.what());
    }
  }

};


}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
