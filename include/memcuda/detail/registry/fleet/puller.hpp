// A fleet node's pulls (docs/scale-out.md, section 2): a get of another
// node's tensor copies it, once, into a replica on this node
// (`.memcuda-rep/<node scope>/<name>`, an ordinary record of this node's
// memory, shared zero-copy by every process here), which later gets take
// while it is current (replica_scripts.hpp). The bytes come through the
// node's mover from a node that has them, the source's or a peer's current
// replica; device memory through that node's staging ring.
//
// Threads: pull() runs on the control thread (the pull command), and pulls
// the names of one command on up to kLanes threads at once, each with its
// own Redis connection and staged reader: one tensor's fixed costs (its
// records, the staging pipeline's start and end) overlap another's bytes.
#pragma once

#include "memcuda/config.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
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
#include "memcuda/detail/registry/fleet/pull_claim.hpp"
#include "memcuda/detail/registry/fleet/staged_read.hpp"
#include "memcuda/detail/store/records.hpp"
#include "memcuda/detail/store/replica_scripts.hpp"
#include "memcuda/detail/store/scripts.hpp"
#include "memcuda/detail/transfer/mover.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class StagedReader;  // staged_read.hpp: defined where CUDA is

class Puller {
 public:
  static constexpr std::size_t kLanes = 4;

  Puller(Context& ctx, Lease& lease, Allocator& alloc) : ctx_(ctx), lease_(lease), alloc_(alloc) {}
  Puller(const Puller&) = delete;
  Puller& operator=(const Puller&) = delete;

  // Pulls into this node's replicas, and their bytes.
  std::uint64_t pulls() const noexcept { return pulls_.load(std::memory_order_relaxed); }
  std::uint64_t pulled_bytes() const noexcept { return pulled_.load(std::memory_order_relaxed); }
  // Whether a pull runs, and when it last moved (a chunk landed, a piece of
  // a get, a node tried, a tensor done or failed). The control loop's stall
  // watch gives a running pull the longest of its waits (wait_bound()) from
  // its last move, not serve_stall_timeout from the last pass: a version of
  // many gigabytes, or a node that stops answering, does not cost this node
  // its lease (docs/operations.md, "Fleets").
  bool running() const noexcept { return running_.load() > 0; }
  std::chrono::steady_clock::time_point last_progress() const noexcept { return progress_.load(); }
  // Every wait of a pull ends by then: the source's copy gets the request
  // timeout to start and a minute more (fetch()); a peer less.
  std::chrono::milliseconds wait_bound() const noexcept { return ctx_.opts.request_timeout + std::chrono::seconds(61); }
  // A pull's span for the stall watch (they nest): pull() holds one, and
  // the node's steps before it (the process's first CUDA use among them:
  // seconds, a minute under compute-sanitizer) hold their own.
  class Running {
   public:
    explicit Running(Puller& p) : p_(p) {
      p_.moved();
      p_.running_.fetch_add(1);
    }
    ~Running() { p_.running_.fetch_sub(1); }
    Running(const Running&) = delete;
    Running& operator=(const Running&) = delete;

   private:
    Puller& p_;
  };

  // The pull command of one name or many, each pulled as pull_one() does,
  // through `mover` (null: this node has none, and pulls fail), on up to
  // kLanes threads. The nodes that pull one set at once spread over it: each
  // starts at a place of the list given by its node, and a name another
  // node is pulling now (its claim, keys.pulling) is left for a second
  // round, which reads it from that node's replica. `between` runs on this
  // thread (with `c`) after each name. Every name is tried; the first
  // failure (in the list's order) is thrown once all were (what was pulled
  // stays: a get of it finds its replica current); Redis failing under any
  // lane is thrown as such (the command is retried whole).
  std::vector<protocol::ReplyTensor> pull(redis::Connection& c, transfer::Mover* mover,
                                          const std::vector<std::string>& names,
                                          const std::function<void(redis::Connection&)>& between = {}) {
    const std::size_t n = names.size(), start = n ? std::hash<std::string>{}(node_scope(ctx_.node)) % n : 0;
    const auto t0 = std::chrono::steady_clock::now();
    const std::uint64_t bytes0 = pulled_bytes(), peers0 = from_peers_.load();
    Running running(*this);
    std::vector<protocol::ReplyTensor> out(n);
    std::vector<std::exception_ptr> failed(n);
    std::vector<char> io(n, 0);  // failed[i] is Redis failing
    std::atomic<bool> redis_failed{false};
    std::mutex mu;                          // leaf: guards later
    std::vector<std::size_t> first(n), later;  // the second round: names another node pulled
    for (std::size_t k = 0; k < n; ++k) first[k] = (start + k) % n;
    auto round = [&](const std::vector<std::size_t>& items, bool may_defer) {
      std::atomic<std::size_t> next{0};
      std::vector<StagedReader*> readers;  // made here: the lanes only use them
      for (std::size_t lane = 0; lane < std::clamp<std::size_t>(items.size(), 1, kLanes); ++lane)
        readers.push_back(reader(lane));
      auto work = [&](redis::Connection& conn, std::size_t lane) {
        Job j{conn, mover, readers[lane]};
        for (std::size_t k; !redis_failed.load() && (k = next.fetch_add(1)) < items.size();) {
          const std::size_t i = items[k];
          try {
            if (auto r = pull_one(j, names[i], may_defer)) {
              out[i] = std::move(*r);
            } else {
              std::lock_guard lk(mu);
              later.push_back(i);
            }
          } catch (const IoError&) {
            failed[i] = std::current_exception();
            io[i] = 1;
            redis_failed.store(true);
          } catch (...) {
            failed[i] = std::current_exception();
          }
          moved();
          if (lane == 0 && between) try {
              between(conn);
            } catch (const IoError&) {
              redis_failed.store(true);  // the command is retried whole
            } catch (const std::exception& e) {
              log(LogLevel::warn, std::string("fleet: between pulls: ") + e.what());
            }
        }
      };
      std::vector<std::jthread> lanes;
      for (std::size_t lane = 1; lane < readers.size(); ++lane)
        lanes.emplace_back([&, lane] {
          try {
            redis::Connection own(ctx_.opts.redis);
            work(own, lane);
          } catch (const std::exception& e) {  // no connection: the other lanes take its names
            log(LogLevel::warn, std::string("fleet: a pull lane could not reach Redis: ") + e.what());
          }
        });
      work(c, 0);
    };  // every lane joined
    round(first, true);
    const std::size_t second = later.size();
    if (second && !redis_failed.load()) round(later, false);
    log(LogLevel::debug, "fleet: pulled " + std::to_string(n) + " name(s), " + std::to_string((pulled_bytes() - bytes0) >> 20) +
                             " MiB in " + std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                            std::chrono::steady_clock::now() - t0).count()) +
                             " ms: " + std::to_string(from_peers_.load() - peers0) + " from other nodes' replicas, " +
                             std::to_string(second) + " in a second round" + staged_times());
    for (std::size_t i = 0; i < n; ++i)
      if (io[i]) std::rethrow_exception(failed[i]);
    for (const auto& e : failed)
      if (e) std::rethrow_exception(e);
    return out;
  }

 private:
  // What a lane pulls with.
  struct Job {
    redis::Connection& c;
    transfer::Mover* mover;
    StagedReader* staged;  // null without CUDA
    std::string prefer = {};  // the node that claimed the name (second round): asked first
  };
  static constexpr std::size_t kPiece = std::size_t{256} << 20;  // a host get's progress step

  void moved() noexcept { progress_.store(std::chrono::steady_clock::now()); }

  // The staged reads' times since the last call, summed over the lanes.
  std::string staged_times() {
#if MEMCUDA_HAS_CUDA()
    StagedReader::Times sum;
    for (auto& r : staged_) sum += r->take_times();
    return sum.describe();
#else
    return {};
#endif
  }

  // Lane `lane`'s staged reader, made once and kept (its landing buffers are
  // pinned memory).
  StagedReader* reader([[maybe_unused]] std::size_t lane) {
#if MEMCUDA_HAS_CUDA()
    while (staged_.size() <= lane) staged_.push_back(std::make_unique<StagedReader>(seq_, progress_));
    return staged_[lane].get();
#else
    return nullptr;
#endif
  }

  // Makes this node's replica of `name` (another node's tensor) current,
  // copying it from a node that has it: one whose replica of it is current
  // (in random order), else the source's. -> the replica's name and
  // generation; nothing when `may_defer` and another node claimed the name
  // (it pulls it now). Throws what the source's acquire throws (NotFound,
  // Lost...), Unavailable (no mover, the source's node publishes no key for
  // it), Lost (the source's node stopped answering mid-pull and no other
  // node has it: nothing published).
  std::optional<protocol::ReplyTensor> pull_one(Job& j, const std::string& name, bool may_defer) {
    redis::Connection& c = j.c;
    if (name.starts_with(kReplicaPrefix)) throw InvalidArgument("'" + name + "' is a replica: pull its source");
    const auto& k = ctx_.keys;
    const std::string rep = replica_name(node_scope(ctx_.node), name);  // the machine's, whichever container asks
    if (!is_valid_name(rep)) throw InvalidArgument("'" + name + "': the name is too long for a replica");
    auto node = store::read_fields(c, k.tensor(name), store::field::node, store::field::bytes);
    if (node.size() < 2 || node[0].is_nil()) throw NotFound("no tensor named '" + name + "'");
    const std::string src_node(node[0].str());
    if (same_node(src_node, ctx_.node)) return protocol::ReplyTensor{name, 0, 0};  // ours after all: read in place
    const auto ttl = claim_ttl(node[1]);
    if (may_defer && !claim_pull(c, k, name, node_scope(ctx_.node), ttl)) return std::nullopt;
    j.prefer = may_defer ? std::string()
                         : wait_for_claim(c, k, name, node_scope(ctx_.node), std::min(ttl, wait_bound()),
                                          [this] { moved(); });
    auto unclaim = [&]() noexcept {
      if (may_defer) unclaim_pull(c, k, name);
    };
    const auto token = lease_.current().first;
    std::vector<std::pair<std::string, std::uint64_t>> refs;
    try {
      // A reference of this process while the bytes move: the source's
      // memory stays where it is until it is given back.
      TensorInfo src = acquired(ctx_, lease_, alloc_, store::acquire(c, k, name, ctx_.session, "", src_node, token),
                                name, std::nullopt, ctx_.session);
      refs.emplace_back(name, src.generation);
      // Fault point pull.after_acquire: this node dies (=die) holding a
      // reference on another node's tensor, and that node's GC collects it;
      // or waits (=wait) while a test kills the nodes it would read from.
      if (MEMCUDA_FAULT("pull.after_acquire")) throw ConnectionError("fault point pull.after_acquire");
      if (src.backend != BackendKind::host && !cuda_usable())
        throw Unavailable("tensor '" + name + "' is device memory on node " + src.node +
                          ", and this node has no usable GPU for its replica");
      protocol::ReplyTensor out = pull_into(j, token, src, rep, refs);
      unclaim();
      give_back(c, refs);
      return out;
    } catch (...) {
      unclaim();
      give_back(c, refs);
      throw;
    }
  }

  // A device replica's ordinal: the source's where this node has it, else 0.
  static int local_device([[maybe_unused]] int d) {
#if MEMCUDA_HAS_CUDA()
    if (d >= 0 && d < device_count()) return d;
#endif
    return 0;
  }

  // The source's bytes into this node's replica: the current one is kept,
  // a stale one of the same source generation is copied again in place, any
  // other is unlinked and a new one made (its bytes pulled before the
  // create script publishes it).
  protocol::ReplyTensor pull_into(Job& j, const std::string& token, const TensorInfo& src,
                                  const std::string& rep, std::vector<std::pair<std::string, std::uint64_t>>& refs) {
    redis::Connection& c = j.c;
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
      fetch_any(j, src, static_cast<char*>(base) + mine.offset, mine.device, refs);
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
      BatchAllocator::BeforePublish early{[&](const std::vector<void*>& dst) { fetch_any(j, src, dst[0], dev, refs); },
                                          [] {}, true};
      auto made = BatchAllocator::create_many(alloc_, c, many, &early);
      gen = made[0].generation;
      refs.emplace_back(rep, gen);
      if (!made[0].block.slab) {  // a replay: its block is elsewhere, copy there
        TensorInfo t = protocol::decode_record(fields_from_reply(store::read_record(c, k.tensor(rep)).view()));
        auto [base, keep] =
            Process::get().cache().resolve(t.owner, t.alloc_id, [&] { return backend_for(t).open(t); });
        fetch_any(j, src, static_cast<char*>(base) + t.offset, t.device, refs);
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

  // Copies the source's bytes into dst from a node that has them: the
  // source's node or another node's current replica of it, in random order,
  // so that the nodes pulling at once spread over every node that has the
  // bytes (one node's staging serves some 12 GB/s: all reading from one is
  // that for all of them together). A node that fails (gone, restarted,
  // stopped mid-copy) is passed over: the next one writes every byte again,
  // and nothing is published before one has. A peer, and the source before
  // the last turn, gets 5 s and what the bytes take at 100 MB/s; the source
  // last of all gets the whole request timeout, and its failure is thrown.
  void fetch_any(Job& j, const TensorInfo& src, void* dst, int device,
                 std::vector<std::pair<std::string, std::uint64_t>>& refs) {
    if (!j.mover) throw Unavailable("fleet: this node has no byte mover (see the log): cannot pull '" + src.name + "'");
    redis::Connection& c = j.c;
    auto peers = replica_peers(c, ctx_.keys, src.name, src.node, ctx_.node);
    // The claimer first (it has served least), then the rest in random order.
    auto mine = std::find(peers.begin(), peers.end(), std::exchange(j.prefer, {}));
    const bool first = mine != peers.end();
    if (first) std::rotate(peers.begin(), mine, mine + 1);
    const std::size_t turn = std::uniform_int_distribution<std::size_t>(first, peers.size())(rng());  // the source's
    for (std::size_t i = 0, p = 0; p < peers.size(); ++i) {
      const bool source = i == turn;
      const std::string& peer = source ? src.node : peers[p++];
      std::optional<TensorInfo> from;
      try {
        if (source) {
          from = src;
          fetch(j, src, src.name, dst, device, serve_limit(src.bytes));
          return;
        }
        from = current_replica(c, src, peer, refs);
        if (!from) continue;
        fetch(j, *from, src.name, dst, device, serve_limit(from->bytes));
        from_peers_.fetch_add(1, std::memory_order_relaxed);
        return;
      } catch (const IoError&) {
        throw;
      } catch (const std::exception& e) {
        log(LogLevel::info, "fleet: node " + (from ? from->node : peer) + " did not serve '" + src.name + "' (" +
                                e.what() + "); trying another");
      }
      moved();
    }
    fetch(j, src, src.name, dst, device, std::nullopt);
  }

  static std::mt19937_64& rng() {
    thread_local std::mt19937_64 r{std::random_device{}()};
    return r;
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
  void fetch(Job& j, const TensorInfo& from, const std::string& name, void* dst, [[maybe_unused]] int device,
             std::optional<std::chrono::milliseconds> limit) {
    redis::Connection& c = j.c;
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
    if (mover != j.mover->kind())
      throw Unavailable("node " + from.node + " moves bytes with '" + mover + "', this node with '" +
                        j.mover->kind() + "'");
    if (staged && r[3].str() == "none")
      throw Unavailable("node " + from.node + " could not make its staging ring (its log says why): its device "
                        "tensors cannot be read from other nodes");
    transfer::RemoteRegion src = parse_region(r[3].str(), from.node, region);
    src.endpoint = std::string(r[2].str());
    const auto until = limit ? std::chrono::steady_clock::now() + *limit : deadline + std::chrono::seconds(60);
    if (staged) {
#if MEMCUDA_HAS_CUDA()
      j.staged->read(c, ctx_.keys, ctx_.session, *j.mover, src, from, dst, device, until);
#else
      throw Unavailable("tensor '" + name + "' is device memory: mem-cuda was built without CUDA");
#endif
    } else {
      try {
        for (std::uint64_t at = 0; at < from.bytes; at += kPiece) {
          j.mover->get(src, from.offset + at, static_cast<char*>(dst) + at, std::min<std::uint64_t>(kPiece, from.bytes - at),
                       until);
          moved();
        }
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

  Context& ctx_;
  Lease& lease_;
  Allocator& alloc_;
  std::atomic<std::uint64_t> pulls_{0}, pulled_{0}, from_peers_{0};
  std::atomic<std::uint64_t> seq_{0};  // the staged asks' reply lists, unique in the session
  std::atomic<std::chrono::steady_clock::time_point> progress_{};
  std::atomic<int> running_{0};
#if MEMCUDA_HAS_CUDA()
  std::vector<std::unique_ptr<StagedReader>> staged_;  // one per lane; pull()'s (the control thread's)
#endif
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
