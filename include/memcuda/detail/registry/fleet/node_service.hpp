// A fleet node's allocator of record across machines (docs/scale-out.md,
// section 2): it exposes its slabs through a byte mover and publishes them,
// with the mover's endpoint, in the node's record (node_endpoint.hpp); and
// it serves its own node's pulls: a get of another node's tensor copies it,
// once, into a replica on this node (`.memcuda-rep/<node scope>/<name>`, an
// ordinary record of this node's memory, shared zero-copy by every process
// here), which later gets take while it is current (replica_scripts.hpp).
//
// Threads: the control loop's (its tick and the pull command it executes),
// except expose_new(), which a create on any thread of the allocator of
// record calls so that a slab it made is readable before its tensor is
// published. The one lock (pub_mu_) is a leaf held for no I/O.
#pragma once

#include "memcuda/config.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "memcuda/detail/backend/select.hpp"
#include "memcuda/detail/base/fault.hpp"
#include "memcuda/detail/process/process.hpp"
#include "memcuda/detail/registry/acquire_outcome.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/create/allocator.hpp"
#include "memcuda/detail/registry/create/batch_allocator.hpp"
#include "memcuda/detail/registry/lease/lease.hpp"
#include "memcuda/detail/registry/liveness.hpp"
#include "memcuda/detail/registry/fleet/node_endpoint.hpp"
#include "memcuda/detail/registry/fleet/staged_read.hpp"
#include "memcuda/detail/registry/fleet/stager.hpp"
#include "memcuda/detail/store/records.hpp"
#include "memcuda/detail/store/replica_scripts.hpp"
#include "memcuda/detail/store/scripts.hpp"
#include "memcuda/detail/transfer/mover.hpp"
#include "memcuda/detail/transfer/mover_plugin.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class NodeService {
 public:
  NodeService(Context& ctx, Lease& lease, Allocator& alloc) : ctx_(ctx), lease_(lease), alloc_(alloc) {}
  NodeService(const NodeService&) = delete;
  NodeService& operator=(const NodeService&) = delete;

  // The control loop's tick. As the allocator of record: the mover made
  // (once), new slabs exposed, gone ones withdrawn, the record published or
  // renewed; otherwise the record withdrawn if it was this process's.
  void tick(redis::Connection& c, bool leader) {
    if (!leader) return withdraw(c);
    serve(c);
  }

  // The mover made, the slabs exposed, the record published or renewed:
  // the tick's, and a pull's first step (what it pulls is served onward
  // from the moment it is marked ready, not from the next tick on).
  void serve(redis::Connection& c) {
    if (!start()) return;
    sync(c);
    if (!published_) {
      pub_->publish(c);
      published_ = true;
      set_incarnation(pub_->record().incarnation);
      log(LogLevel::debug, "fleet: published this node's endpoint (incarnation " + pub_->record().incarnation + ")");
    } else if (pub_->refresh(c)) {
      log(LogLevel::debug, "fleet: this node's endpoint had expired or was replaced: published again");
    }
  }

  // A create's new host slab, exposed and its region field written before
  // the create script publishes a tensor in it: a peer's pull then never
  // waits for the next tick. Any thread; a no-op before the mover exists
  // (the first tick exposes it) or once the slab is exposed.
  void expose_new(redis::Connection& c, ExportedBlock& slab) {
    transfer::Mover* m = live_.load(std::memory_order_acquire);
    if (!m || slab.allocation().kind != BackendKind::host) return;
    auto [e, made] = expose(*m, slab);
    if (!made || !e) return;
    std::string incarnation;
    {
      std::lock_guard lk(pub_mu_);
      incarnation = incarnation_;
    }
    if (incarnation.empty()) return;  // not published yet: the tick's publish carries it
    const auto& a = slab.allocation();
    (void)store::update_node_regions(c, ctx_.keys, ctx_.node, incarnation,
                                     {{store::region_field(a.alloc_id), region_text(*e)}});
  }

  // The lease is gone (or the registry stops): the record goes, and no peer reads through its keys.
  void withdraw(redis::Connection& c) noexcept {
    if (!pub_ || !published_) return stop_stager();
    published_ = false;
    set_incarnation({});
    log(LogLevel::debug, "fleet: withdrawing this node's endpoint");
    try {
      pub_->withdraw(c);
    } catch (const std::exception& e) {
      log(LogLevel::warn, std::string("fleet: withdrawing this node's endpoint: ") + e.what());
    }
    stop_stager();  // after the record: no peer reads the ring once it goes
  }

  // Pulls into this node's replicas, and their bytes.
  std::uint64_t pulls() const noexcept { return pulls_.load(std::memory_order_relaxed); }
  std::uint64_t pulled_bytes() const noexcept { return pulled_.load(std::memory_order_relaxed); }

  // The pull command of one name or many, each pulled as pull_one() does,
  // in an order that starts at a place of the list given by this node: the
  // nodes that pull one set at once take different tensors first, and then
  // read them from each other (a node that has one serves it onward). Every
  // name is tried; the first failure is thrown once all were (what was
  // pulled stays: a get of it finds its replica current).
  std::vector<protocol::ReplyTensor> pull(redis::Connection& c, const std::vector<std::string>& names) {
    std::vector<protocol::ReplyTensor> out(names.size());
    const std::size_t n = names.size(), start = n ? std::hash<std::string>{}(node_scope(ctx_.node)) % n : 0;
    std::exception_ptr first;
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = (start + k) % n;
      try {
        out[i] = pull_one(c, names[i]);
      } catch (const IoError&) {
        throw;  // Redis away: the command is retried whole
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
    return out;
  }

  // Makes this node's replica of `name` (another node's tensor) current,
  // copying it from a node that has it: one whose replica of it is current
  // (in random order), else the source's. -> the replica's name and
  // generation. Throws what the source's acquire throws (NotFound, Lost...),
  // Unavailable (no mover, the source's node publishes no key for it),
  // Lost (the source's node stopped answering mid-pull and no other node
  // has it: nothing published).
  protocol::ReplyTensor pull_one(redis::Connection& c, const std::string& name) {
    if (!published_ && lease_.held()) serve(c);
    if (name.starts_with(kReplicaPrefix)) throw InvalidArgument("'" + name + "' is a replica: pull its source");
    const auto& k = ctx_.keys;
    const std::string rep = replica_name(node_scope(ctx_.node), name);  // the machine's, whichever container asks
    if (!is_valid_name(rep)) throw InvalidArgument("pull of '" + name + "': the name is too long for a replica");
    auto node = store::read_fields(c, k.tensor(name), store::field::node);
    if (node.size() < 1 || node[0].is_nil()) throw NotFound("no tensor named '" + name + "'");
    const std::string src_node(node[0].str());
    if (same_node(src_node, ctx_.node)) return {name, 0, 0};  // ours after all: read in place
    const auto token = lease_.current().first;
    // A reference of this process while the bytes move: the source's
    // memory stays where it is until it is given back.
    TensorInfo src = acquired(ctx_, lease_, alloc_, store::acquire(c, k, name, ctx_.session, "", src_node, token),
                              name, std::nullopt, ctx_.session);
    std::vector<std::pair<std::string, std::uint64_t>> refs{{name, src.generation}};
    try {
      // Fault point pull.after_acquire: this node dies (=die) holding a
      // reference on another node's tensor, and that node's GC collects it;
      // or waits (=wait) while a test kills the nodes it would read from.
      if (MEMCUDA_FAULT("pull.after_acquire")) throw ConnectionError("fault point pull.after_acquire");
      if (src.backend != BackendKind::host && !cuda_usable())
        throw Unavailable("tensor '" + name + "' is device memory on node " + src.node +
                          ", and this node has no usable GPU for its replica");
      protocol::ReplyTensor out = pull_into(c, token, src, rep, refs);
      give_back(c, refs);
      return out;
    } catch (...) {
      give_back(c, refs);
      throw;
    }
  }

 private:
  // The mover, made on the first tick that needs it (ucp_init reads the
  // machine's devices: not in a constructor every registry runs).
  bool start() {
    if (mover_) return true;
    if (failed_) return false;
    try {
      std::string why;
      if (auto make = transfer::mover_factory().load()) mover_ = make();
      else mover_ = transfer::load_mover_plugin(why);
      if (!mover_)
        throw Unavailable("this program links no byte mover (include <memcuda/fleet.hpp> and link memcuda::ucx) "
                          "and loads none (" + why + ")");
      pub_.emplace(ctx_.keys, mover_->kind(), mover_->endpoint(), ctx_.session, kTtl, ctx_.node);
      live_.store(mover_.get(), std::memory_order_release);
      return true;
    } catch (const std::exception& e) {
      failed_ = true;
      log(LogLevel::error, std::string("fleet: no byte mover, this node's tensors cannot be read from others: ") +
                               e.what());
      return false;
    }
  }

  // Exposes every slab not exposed yet (a create may have done it first)
  // and withdraws the fields of those gone.
  void sync(redis::Connection& c) {
    std::map<std::string, std::string> changes;
    std::map<std::uint64_t, std::weak_ptr<ExportedBlock>> now;
    for (DevicePool* p : alloc_.pools()) {
      for (auto& s : p->slabs()) {
        const auto& a = s->allocation();
        if (a.kind != BackendKind::host) {  // device memory: read through the staging ring
          start_stager(changes);
          continue;
        }
        if (exposed_.count(a.alloc_id)) {
          now[a.alloc_id] = s;
          continue;
        }
        if (auto e = expose(*mover_, *s).first) {  // one the engine refused is tried again next tick
          now[a.alloc_id] = s;
          changes[store::region_field(a.alloc_id)] = region_text(*e);
        }
      }
    }
    for (const auto& [id, w] : exposed_)
      if (!now.count(id)) changes[store::region_field(id)] = "";
    exposed_ = std::move(now);
    pub_->set_regions(published_ ? &c : nullptr, changes);
  }

  // A device replica's ordinal: the source's where this node has it, else 0.
  static int local_device([[maybe_unused]] int d) {
#if MEMCUDA_HAS_CUDA()
    if (d >= 0 && d < device_count()) return d;
#endif
    return 0;
  }

  // The staging ring of this node's device memory (stager.hpp), made with
  // its first device slab; its region is the record's "stage" field.
  void start_stager([[maybe_unused]] std::map<std::string, std::string>& changes) {
#if MEMCUDA_HAS_CUDA()
    if (stager_ || stage_failed_) return;
    try {
      stager_ = std::make_unique<Stager>(ctx_, *mover_);
      changes[std::string(kStageField)] = region_text(stager_->region());
      log(LogLevel::debug, "fleet: staging this node's device memory for other nodes");
    } catch (const std::exception& e) {
      stage_failed_ = true;
      changes[std::string(kStageField)] = "none";  // pulls fail at once rather than wait for a ring
      log(LogLevel::error, std::string("fleet: no staging ring, this node's device tensors cannot be read from "
                                       "others: ") + e.what());
    }
#endif
  }
  void stop_stager() noexcept {
#if MEMCUDA_HAS_CUDA()
    if (stager_ && pub_) pub_->set_regions(nullptr, {{std::string(kStageField), ""}});
    stager_.reset();
#endif
  }

  // The slab's exposure, made once: it (null: the engine refused, logged) and whether this call made it.
  static std::pair<std::shared_ptr<transfer::Region>, bool> expose(transfer::Mover& m, ExportedBlock& s) {
    const auto& a = s.allocation();
    try {
      auto [e, made] = s.expose_once([&] {
        return std::static_pointer_cast<void>(
            std::make_shared<transfer::Region>(m.expose(a.base, a.size, transfer::MemoryKind::host)));
      });
      return {std::static_pointer_cast<transfer::Region>(e), made};
    } catch (const std::exception& e) {
      log(LogLevel::warn, "fleet: exposing allocation " + std::to_string(a.alloc_id) + ": " + e.what());
      return {nullptr, false};
    }
  }

  void set_incarnation(std::string i) {
    std::lock_guard lk(pub_mu_);
    incarnation_ = std::move(i);
  }

  // The source's bytes into this node's replica: the current one is kept,
  // a stale one of the same source generation is copied again in place, any
  // other is unlinked and a new one made (its bytes pulled before the
  // create script publishes it).
  protocol::ReplyTensor pull_into(redis::Connection& c, const std::string& token, const TensorInfo& src,
                                  const std::string& rep, std::vector<std::pair<std::string, std::uint64_t>>& refs) {
    const auto& k = ctx_.keys;
    std::optional<TensorInfo> have;
    if (auto r = store::read_record(c, k.tensor(rep)); r.size() > 0) {
      try {
        have = protocol::decode_record(fields_from_reply(r.view()));
      } catch (const ProtocolError&) {
        // not a record of ours: the create below names it
      }
    }
    std::uint64_t gen = 0;
    if (have && have->replica_of == src.name && have->source_generation == src.generation &&
        have->state == TensorState::ready && same_node(have->node, ctx_.node) && have->copied_version) {
      if (*have->copied_version == src.event_version) return {rep, have->generation, have->refcount};
      // Stale: copied again where its readers already are.
      auto a = store::acquire(c, k, rep, ctx_.session, "", ctx_.node, "");
      TensorInfo mine = acquired(ctx_, lease_, alloc_, a, rep, std::nullopt, ctx_.session);
      refs.emplace_back(rep, mine.generation);
      auto [base, keep] = Process::get().cache().resolve(mine.owner, mine.alloc_id,
                                                          [&] { return backend_for(mine).open(mine); });
      fetch_any(c, src, static_cast<char*>(base) + mine.offset, mine.device, refs);
      gen = mine.generation;
    } else {
      if (have) {
        auto r = store::remove(c, k, rep, ctx_.session);
        if (r.is("free")) alloc_.free_unlinked(c, reply_u64(r[1]), true);
      }
      protocol::Command many;
      many.op = protocol::Op::create_many;
      many.holder = ctx_.session;  // held by its name and, until marked, by this process
      protocol::CreateEntry e;
      e.name = rep;
      e.dtype = src.dtype;
      e.shape = src.shape;
      const int dev = src.backend == BackendKind::host ? -1 : local_device(src.device);
      e.device = dev;
      e.backend = src.backend;
      e.persistent = true;
      e.replica_of = src.name;
      e.source_generation = src.generation;
      many.tensors.push_back(std::move(e));
      BatchAllocator::BeforePublish early{[&](const std::vector<void*>& dst) { fetch_any(c, src, dst[0], dev, refs); },
                                          [] {}, true};
      auto made = BatchAllocator::create_many(alloc_, c, many, &early);
      gen = made[0].generation;
      refs.emplace_back(rep, gen);
      if (!made[0].block.slab) {  // a replay: its block is elsewhere, copy there
        TensorInfo t = protocol::decode_record(fields_from_reply(store::read_record(c, k.tensor(rep)).view()));
        auto [base, keep] =
            Process::get().cache().resolve(t.owner, t.alloc_id, [&] { return backend_for(t).open(t); });
        fetch_any(c, src, static_cast<char*>(base) + t.offset, t.device, refs);
      }
    }
    const std::vector<store::ReplicaMark> marks{{node_scope(ctx_.node), "", "node", gen}};
    auto r = store::replica_ready(c, k, token, src.name, src.generation, src.event_version, marks);
    if (r.is("notleader")) lease_.fail_status("replica ready", r.status, "pulling '" + src.name + "'", r[1].str());
    if (r.is("stale"))
      throw StaleHandle("tensor '" + src.name + "' was published or re-created on node " + src.node +
                        " while it was pulled; get it again");
    return {rep, gen, 1};
  }

  // Copies the source's bytes into dst from a node that has them: another
  // node's current replica of it (in random order, so that late nodes
  // spread over those that have it), else the source's node. A node that
  // fails (gone, restarted, stopped mid-copy) is passed over: the next one
  // writes every byte again, and nothing is published before one has. The
  // source's failure is what is thrown when every node failed.
  void fetch_any(redis::Connection& c, const TensorInfo& src, void* dst, int device,
                 std::vector<std::pair<std::string, std::uint64_t>>& refs) {
    if (!start()) throw Unavailable("fleet: this node has no byte mover (see the log): cannot pull '" + src.name + "'");
    for (const std::string& peer : replica_peers(c, ctx_.keys, src.name, src.node, ctx_.node)) {
      std::optional<TensorInfo> from;
      try {
        from = current_replica(c, src, peer, refs);
        if (!from) continue;
        // A peer that stalls is left for the next one: it gets 5 s and what
        // the bytes take at 100 MB/s, the source the whole request timeout.
        fetch(c, *from, src.name, dst, device, std::chrono::seconds(5) + std::chrono::milliseconds(from->bytes / 100000));
        return;
      } catch (const IoError&) {
        throw;
      } catch (const std::exception& e) {
        log(LogLevel::info, "fleet: node " + (from ? from->node : peer) + " did not serve '" + src.name + "' (" +
                                e.what() + "); trying another");
      }
    }
    fetch(c, src, src.name, dst, device, std::nullopt);
  }

  // Node `peer`'s replica of the source when it is current (the same
  // generation and publish, ready, host memory, another node's), with a
  // reference of this process (in `refs`: given back with the others).
  std::optional<TensorInfo> current_replica(redis::Connection& c, const TensorInfo& src, const std::string& peer,
                                            std::vector<std::pair<std::string, std::uint64_t>>& refs) {
    const std::string rep = replica_name(peer, src.name);
    if (!is_valid_name(rep)) return std::nullopt;
    // A device replica (the source's `replicas` lists devices too) or one of
    // this node: not a peer, and no reference taken on it.
    auto node = store::read_fields(c, ctx_.keys.tensor(rep), store::field::node, store::field::replica_path);
    if (node.size() < 2 || node[0].is_nil() || node[1].is_nil() || node[1].str() != "node" ||
        same_node(std::string(node[0].str()), ctx_.node))
      return std::nullopt;
    TensorInfo t = acquired(ctx_, lease_, alloc_,
                            store::acquire(c, ctx_.keys, rep, ctx_.session, "", std::string(node[0].str()), ""), rep,
                            std::nullopt, ctx_.session);
    refs.emplace_back(rep, t.generation);
    const bool current = t.replica_of == src.name && t.source_generation == src.generation && t.copied_version &&
                         *t.copied_version == src.event_version && t.state == TensorState::ready &&
                         t.backend == src.backend && t.bytes == src.bytes;
    if (!current) return std::nullopt;
    return t;
  }

  // Copies the bytes of `from` (the source `name`, or a replica of it) from
  // its node into dst (device `device` when staged), keys served only by
  // their owner. The source's (no `limit`): a field not there yet is waited
  // for while its owner lives, the copy takes the request timeout and a
  // minute at most; a peer's gets `limit`, and no wait.
  void fetch(redis::Connection& c, const TensorInfo& from, const std::string& name, void* dst,
             [[maybe_unused]] int device, std::optional<std::chrono::milliseconds> limit) {
    const bool wait = !limit, staged = from.backend != BackendKind::host;
    const auto deadline = std::chrono::steady_clock::now() + ctx_.opts.request_timeout;
    // The endpoint and the region in one read (one incarnation's): the
    // allocation's, or for device memory the staging ring's.
    const std::string region = staged ? std::string(kStageField) : store::region_field(from.alloc_id);
    redis::Reply r;
    for (;;) {
      r = c.command({"HMGET", ctx_.keys.node(from.node), "session", "mover", "endpoint", region});
      const bool ready = r.size() == 4 && !r[0].is_nil() && r[0].str() == from.owner && !r[3].is_nil();
      if (ready || !wait || std::chrono::steady_clock::now() >= deadline) break;
      if (!owner_alive(ctx_, c, from.owner, 0)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (r.size() != 4 || r[0].is_nil() || r[2].is_nil()) {
      if (!owner_alive(ctx_, c, from.owner, 0))
        throw Lost("tensor '" + name + "': node " + from.node + " is gone (no endpoint, its owner's session ended)");
      throw Unavailable("node '" + from.node + "' publishes no endpoint (not running, or not reachable by transfer)");
    }
    if (r[0].str() != from.owner)
      throw Unavailable("tensor '" + name + "': its owner is not node " + from.node +
                        "'s allocator of record (a takeover there?); get it again");
    if (r[3].is_nil())
      throw Unavailable("node " + from.node + (staged ? " stages no device memory" : " exposes no memory") +
                        " of tensor '" + name + "' (allocation " + std::to_string(from.alloc_id) + ")");
    const std::string mover(r[1].is_nil() ? std::string_view() : r[1].str());
    if (mover != mover_->kind())
      throw Unavailable("node " + from.node + " moves bytes with '" + mover + "', this node with '" +
                        mover_->kind() + "'");
    if (staged && r[3].str() == "none")
      throw Unavailable("node " + from.node + " could not make its staging ring (its log says why): its device "
                        "tensors cannot be read from other nodes");
    transfer::RemoteRegion src = parse_region(r[3].str(), from.node, region);
    src.endpoint = std::string(r[2].str());
    const auto until = limit ? std::chrono::steady_clock::now() + *limit : deadline + std::chrono::seconds(60);
    if (staged) {
#if MEMCUDA_HAS_CUDA()
      staged_.read(c, ctx_.keys, ctx_.session, *mover_, src, from, dst, device, until);
#else
      throw Unavailable("tensor '" + name + "' is device memory: mem-cuda was built without CUDA");
#endif
    } else {
      try {
        mover_->get(src, from.offset, dst, from.bytes, until);
      } catch (const transfer::TransferError& e) {
        throw Lost("tensor '" + name + "': node " + from.node + " stopped serving it mid-pull (" + e.what() +
                   "); nothing of it was published here");
      }
    }
    pulled_.fetch_add(from.bytes, std::memory_order_relaxed);
    pulls_.fetch_add(1, std::memory_order_relaxed);
  }

  // The references a pull took, given back (its own session's: no fence).
  void give_back(redis::Connection& c, const std::vector<std::pair<std::string, std::uint64_t>>& refs) noexcept {
    for (const auto& [n, g] : refs) {
      try {
        alloc_.release(c, n, g, ctx_.session, "");
      } catch (const std::exception& e) {
        log(LogLevel::warn, "fleet: giving back the reference to '" + n + "': " + e.what());
      }
    }
  }

  static constexpr std::chrono::milliseconds kTtl{5000};

  Context& ctx_;
  Lease& lease_;
  Allocator& alloc_;
  std::unique_ptr<transfer::Mover> mover_;
  std::optional<NodePublisher> pub_;
  bool published_ = false;
  bool failed_ = false;
  std::map<std::uint64_t, std::weak_ptr<ExportedBlock>> exposed_;  // those whose field the publisher has
  std::atomic<transfer::Mover*> live_{nullptr};  // mover_, once made: what expose_new reads
  std::mutex pub_mu_;        // leaf: guards incarnation_
  std::string incarnation_;  // the published record's; empty when none is
  std::atomic<std::uint64_t> pulls_{0}, pulled_{0};
#if MEMCUDA_HAS_CUDA()
  std::unique_ptr<Stager> stager_;  // after mover_: stopped before it goes
  bool stage_failed_ = false;
  StagedReader staged_;
#endif
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
