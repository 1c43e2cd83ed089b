// The state a TensorRegistry shares with its tensors and its control thread:
// the client connection, the allocator-of-record role (lease token, epoch,
// the allocations it owns) and the operations both the API and the control
// thread run. TensorRegistry and SharedTensor are thin layers over it.
#pragma once

#include <fnmatch.h>
#include <signal.h>
#include <unistd.h>

#include <boost/json.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <chrono>
#include <exception>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "memcuda/detail/backend/backend.hpp"
#include "memcuda/detail/backend/cuda_backend.hpp"
#include "memcuda/detail/backend/host_backend.hpp"
#include "memcuda/detail/control/keys.hpp"
#include "memcuda/detail/control/scripts.hpp"
#include "memcuda/detail/log.hpp"
#include "memcuda/detail/node.hpp"
#include "memcuda/detail/pool/device_pool.hpp"
#include "memcuda/detail/process_cache.hpp"
#include "memcuda/error.hpp"
#include "memcuda/options.hpp"
#include "memcuda/protocol.hpp"
#include "memcuda/redis/connection.hpp"
#include "memcuda/stats.hpp"

namespace memcuda::detail {

inline Backend& backend_for(BackendKind k) {
  static HostBackend host;  // stateless; process-wide so blocks never outlive it
  if (k == BackendKind::host) return host;
#if MEMCUDA_HAS_CUDA()
  static CudaBackend cuda;
  return cuda;
#else
  throw Unavailable("the cuda backend is not available: mem-cuda was built without the CUDA toolkit");
#endif
}

inline bool cuda_usable() {
#if MEMCUDA_HAS_CUDA()
  return device_count() > 0;
#else
  return false;
#endif
}

// A number from a script's table: Lua numbers arrive as integers, Hash
// values (HGET) as strings.
inline std::int64_t reply_int(redis::ReplyView v) {
  if (v.is_integer()) return v.integer();
  std::string s(v.str());
  try {
    return std::stoll(s);
  } catch (const std::exception&) {
    throw InternalError("expected a number from Redis, got '" + s + "'");
  }
}
inline std::uint64_t reply_u64(redis::ReplyView v) { return static_cast<std::uint64_t>(reply_int(v)); }

inline protocol::Fields fields_from_reply(redis::ReplyView r) {
  protocol::Fields f;
  f.reserve(r.size() / 2);
  for (std::size_t i = 0; i + 1 < r.size(); i += 2)
    f.emplace_back(std::string(r[i].str()), std::string(r[i + 1].str()));
  return f;
}

// Holder id for a lifecycle command: the explicit holder, else the pid, else
// "anonymous" (a plain redis-cli client).
inline std::string holder_of(const protocol::Command& c) {
  if (c.holder) return *c.holder;
  if (c.pid) return "pid:" + std::to_string(*c.pid);
  return "anonymous";
}

class RegistryCore : public std::enable_shared_from_this<RegistryCore> {
 public:
  explicit RegistryCore(RegistryOptions o)
      : opts(std::move(o)),
        keys(opts.name_space),
        session(new_session_id()),
        node(node_id()),
        client_(opts.redis) {
    if (opts.lease_ttl < std::chrono::milliseconds(30))
      throw InvalidArgument("lease_ttl must be at least 30 ms");
  }

  RegistryCore(const RegistryCore&) = delete;
  RegistryCore& operator=(const RegistryCore&) = delete;

  const RegistryOptions opts;
  const Keys keys;
  const std::string session;
  const std::string node;

  // ---- leadership -------------------------------------------------------

  bool is_leader() const noexcept { return leader_.load(std::memory_order_acquire); }

  std::pair<std::string, std::uint64_t> lease() const {
    std::lock_guard lk(lease_mu_);
    return {token_, epoch_};
  }

  // Campaigns once. On success this process is the allocator of record and
  // commands left by dead leaders are queued again.
  bool try_acquire_lease(redis::Connection& c, lua::Scripts& s) {
    auto r = s.lease_acquire.eval(c, {keys.leader(), keys.epoch()},
                                  {session, opts.lease_ttl.count()});
    if (r[0].integer() != 1) return false;
    std::string token(r[1].str());
    std::uint64_t epoch = std::stoull(token.substr(0, token.find(' ')));
    {
      std::lock_guard lk(lease_mu_);
      token_ = token;
      epoch_ = epoch;
    }
    auto n = s.requeue.eval(c, {keys.lifecycle(), keys.processing_lists()}, {keys.processing(epoch)});
    leader_.store(true, std::memory_order_release);
    log(LogLevel::info, "became allocator of record, epoch " + std::to_string(epoch) +
                            (n.integer() ? ", re-queued " + std::to_string(n.integer()) + " command(s)" : ""));
    return true;
  }

  bool renew_lease(redis::Connection& c, lua::Scripts& s) {
    auto [token, epoch] = lease();
    if (s.lease_renew.eval(c, {keys.leader()}, {token, opts.lease_ttl.count()}).integer() == 1) return true;
    lose_leadership("lease expired before renewal");
    return false;
  }

  void release_lease(redis::Connection& c, lua::Scripts& s) {
    if (!is_leader()) return;
    auto [token, epoch] = lease();
    leader_.store(false, std::memory_order_release);
    s.lease_release.eval(c, {keys.leader()}, {token});
    log(LogLevel::info, "released the allocator-of-record lease (epoch " + std::to_string(epoch) + ")");
  }

  void lose_leadership(const std::string& why) {
    if (leader_.exchange(false)) log(LogLevel::warn, "no longer allocator of record: " + why);
  }

  // ---- allocator-of-record operations (run by the leader) ---------------

  struct Created {
    std::uint64_t generation;
    std::int64_t refcount;
    TensorInfo info;
    PoolBlock block;  // slab null on a replay
  };

  // Allocates, exports and publishes a tensor. Throws AlreadyExists,
  // NotLeader (lease lost), InvalidArgument, CudaError, BudgetExceeded.
  Created leader_create(redis::Connection& c, lua::Scripts& s, const protocol::Command& cmd) {
    if (!cmd.dtype || !cmd.shape) throw InvalidArgument("create needs a dtype and a shape");
    ::memcuda::validate_name(cmd.name);
    const std::uint64_t bytes = byte_size(*cmd.dtype, *cmd.shape);
    const BackendKind kind = cmd.backend.value_or(default_backend());
    int device = -1;
    if (kind == BackendKind::cuda) {
      device = cmd.device.value_or(opts.default_device);
#if MEMCUDA_HAS_CUDA()
      // Ordinals differ between processes with different CUDA_VISIBLE_DEVICES;
      // the UUID, when the sender gave it, is what names the device.
      if (cmd.device_uuid) device = ordinal_of_uuid(*cmd.device_uuid, device);
#endif
    }
    auto [token, epoch] = lease();
    if (!is_leader()) throw NotLeader("this process is not the allocator of record");

    DevicePool& pool = pool_for(kind, device);
    PoolBlock pb = pool.allocate(bytes);
    const Allocation& a = pb.slab->allocation();
    // Until the script has published it, the block is ours to give back.
    struct Giveback {
      DevicePool* pool;
      const PoolBlock* pb;
      ~Giveback() {
        if (pool) pool->deallocate(*pb);
      }
    } giveback{&pool, &pb};

    TensorInfo t;
    t.name = cmd.name;
    t.dtype = *cmd.dtype;
    t.shape = *cmd.shape;
    t.ctime_ms = now_ms();
    t.node = node;
    t.device = a.device;
    t.device_uuid = a.device_uuid;
    t.bytes = bytes;
    t.backend = kind;
    t.ipc_handle = a.handle;
    t.offset = pb.block.offset;
    t.alloc_bytes = a.size;
    t.alloc_id = a.alloc_id;
    t.state = TensorState::ready;
    t.epoch = epoch;
    t.owner = session;
    t.owner_pid = ::getpid();
    t.create_id = cmd.id.value_or("");

    std::vector<redis::Arg> args{token, cmd.name, t.create_id, keys.ready_channel(cmd.name), holder_of(cmd),
                                 (cmd.persistent.value_or(false) ? "1" : "0")};
    protocol::Fields fields = protocol::encode_record(t);
    for (const auto& [k, v] : fields) {
      // The script sets these itself, atomically with the existence check.
      if (k == "generation" || k == "state" || k == "refcount" || k.starts_with("holder:")) continue;
      args.emplace_back(k);
      args.emplace_back(v);
    }
    const std::string tkey = keys.tensor(cmd.name);
    const std::string lkey = keys.leader();
    const std::string nkey = keys.names();
    const std::string gkey = keys.generation();
    const std::string wkey = waiters_key(cmd.name);
    const std::string lost_key = keys.lost(cmd.name);
    redis::Arg kv[] = {tkey, nkey, lkey, gkey, wkey, lost_key};
    auto r = s.create.eval(c, std::span<const redis::Arg>(kv), std::span<const redis::Arg>(args));
    std::string_view st = r[0].str();
    if (st == "ok") {
      t.generation = reply_u64(r[1]);
      t.refcount = reply_int(r[2]);
      t.holders[holder_of(cmd)] = 1;
      if (cmd.persistent.value_or(false)) t.holders["@name"] = 1;
      giveback.pool = nullptr;
      {
        std::lock_guard lk(owned_mu_);
        owned_[t.generation] = Owned{&pool, pb, t, cmd.persistent.value_or(false)};
        owned_bytes_ += pb.block.size;
      }
      ++stats_.creates;
      return {t.generation, t.refcount, std::move(t), std::move(pb)};
    }
    if (st == "replay") {
      return {reply_u64(r[1]), reply_int(r[2]), {}, {}};
    }
    if (st == "exists")
      throw AlreadyExists("tensor '" + cmd.name + "' already exists (generation " + std::to_string(reply_u64(r[1])) +
                          "); remove it first or get() it");
    lose_leadership("lease taken over (now " + std::string(r[1].str()) + ")");
    throw NotLeader("lost the allocator-of-record lease while creating '" + cmd.name + "'");
  }

  // Frees an unlinked tensor whose last reference is gone. Ours: drop the
  // allocation. Another (dead) owner's: reclaim what the backend can.
  void free_unlinked(redis::Connection& c, std::uint64_t generation, bool record_gone = false) {
    const std::string rkey = keys.removed(generation);
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
      mine->pool->deallocate(mine->pb);  // back to the pool; no cudaFree here
      if (!record_gone) c.command({"DEL", rkey});
      ++stats_.frees;
      return;
    }
    if (record_gone) return;
    auto r = c.command({"HGETALL", rkey});
    if (r.size() == 0) return;  // already freed
    TensorInfo t = protocol::decode_record(fields_from_reply(r.view()));
    if (t.refcount > 0) {
      log(LogLevel::warn, "ignoring free of '" + t.name + "': still " + std::to_string(t.refcount) + " reference(s)");
      return;
    }
    if (t.owner != session) {
      if (owner_alive(c, t.owner, t.owner_pid)) {
        // An ex-allocator of record that is still alive owns it: only it can
        // free it (it keeps the record until then).
        send_inbox(c, t.owner, boost::json::object{{"op", "free"}, {"generation", generation}});
        return;
      }
      // A dead owner's host memory outlives it; its object may hold other
      // tensors too, so it is unlinked once no record uses it.
      std::lock_guard lk(owned_mu_);
      pending_reclaim_.emplace(t.ipc_handle, t);
    }
    c.command({"DEL", rkey});
    ++stats_.frees;
  }

  // Executes one lifecycle command as the allocator of record and returns
  // the reply to send (when the command names reply_to).
  protocol::Reply execute(redis::Connection& c, lua::Scripts& s, const protocol::Command& cmd) {
    protocol::Reply rep;
    rep.id = cmd.id;
    rep.id_is_number = cmd.id_is_number;
    rep.op = std::string(to_string(cmd.op));
    rep.name = cmd.name;
    auto [token, epoch] = lease();
    switch (cmd.op) {
      case protocol::Op::create: {
        auto cr = leader_create(c, s, cmd);
        rep.generation = cr.generation;
        rep.refcount = cr.refcount;
        break;
      }
      case protocol::Op::get: {
        auto r = s.acquire.eval(c, {keys.tensor(cmd.name), keys.leader(), keys.lost(cmd.name)},
                                {holder_of(cmd), "", node, token, "", ""});
        auto t = check_acquire(r, cmd.name, std::nullopt);
        rep.generation = t.generation;
        rep.refcount = t.refcount;
        break;
      }
      case protocol::Op::del: {
        std::uint64_t gen = cmd.generation.value_or(0);
        if (!gen) {
          auto g = c.command({"HGET", keys.tensor(cmd.name), "generation"});
          if (g.is_nil()) throw NotFound("no tensor named '" + cmd.name + "'");
          gen = std::stoull(std::string(g.str()));
        }
        auto rc = release_ref(c, s, cmd.name, gen, holder_of(cmd), token);
        rep.generation = gen;
        rep.refcount = rc;
        break;
      }
      case protocol::Op::free:
        free_unlinked(c, cmd.generation.value_or(0));
        rep.generation = cmd.generation;
        break;
    }
    return rep;
  }

  // ---- client operations (any process) -----------------------------------

  // The get fast path: one script checks state, dtype and node and takes
  // the reference atomically; then the memory is mapped (once per process).
  std::pair<TensorInfo, std::pair<void*, std::shared_ptr<void>>> acquire(
      std::string_view name, std::optional<DType> dtype) {
    check_fatal();
    ::memcuda::validate_name(name);
    TensorInfo t;
    {
      std::lock_guard lk(client_mu_);
      // A record never changes after creation except refcount, holders and
      // the event: when our cached copy has the current generation and
      // event version, the script skips sending the whole Hash.
      auto cached = record_cache_.find(std::string(name));
      std::string cgen, cver;
      if (cached != record_cache_.end()) {
        cgen = std::to_string(cached->second.generation);
        cver = std::to_string(cached->second.event_version);
      }
      auto r = scripts_.acquire.eval(
          client_, {keys.tensor(name), keys.leader(), keys.lost(name)},
          {session, dtype ? std::string_view(to_string(*dtype)) : std::string_view(), node, "", cgen, cver});
      if (r[0].str() == "same" && cached != record_cache_.end()) {
        t = cached->second;
        t.refcount = reply_int(r[1]);
      } else {
        t = check_acquire(r, std::string(name), dtype);
        if (record_cache_.size() >= 4096) record_cache_.clear();
        TensorInfo keep = t;
        keep.holders.clear();  // changes all the time; reg.info() has the truth
        record_cache_.insert_or_assign(std::string(name), std::move(keep));
      }
    }
    return adopt_reference(std::move(t));
  }

  // Maps a tensor whose reference this process has just taken and records
  // the reference; gives it back when the mapping fails.
  std::pair<TensorInfo, std::pair<void*, std::shared_ptr<void>>> adopt_reference(TensorInfo t) {
    try {
      auto m = map(t);
      note_hold(t.name, t.generation, +1);
      return {std::move(t), std::move(m)};
    } catch (...) {
      release_noexcept(t.name, t.generation, false);
      throw;
    }
  }

  // Maps a tensor's allocation into this process (or finds our own).
  std::pair<void*, std::shared_ptr<void>> map(const TensorInfo& t) {
    if (t.node != node)
      throw Unavailable("tensor '" + t.name + "' lives on node " + t.node + ", this is " + node);
    auto [base, keep] = ProcessCache::instance().resolve(
        t.owner, t.alloc_id, [&] { return backend_for(t.backend).open(t); });
    return {static_cast<char*>(base) + t.offset, std::move(keep)};
  }

  // create() of the API: directly when we are the allocator of record,
  // else through the lifecycle list and a reply.
  std::pair<TensorInfo, std::pair<void*, std::shared_ptr<void>>> create(protocol::Command cmd) {
    check_fatal();
    cmd.holder = session;
    cmd.pid = ::getpid();
    cmd.node = node;
    if (!cmd.backend) cmd.backend = default_backend();
    if (is_leader()) {
      try {
        std::lock_guard lk(client_mu_);
        auto cr = leader_create(client_, scripts_, cmd);
        if (cr.block.slab) {
          void* p = static_cast<char*>(cr.block.slab->base()) + cr.info.offset;
          note_hold(cr.info.name, cr.info.generation, +1);
          return {std::move(cr.info), {p, std::move(cr.block.slab)}};
        }
      } catch (const NotLeader&) {
        // lost the lease meanwhile: the new leader serves it below
      }
    }
    std::uint64_t gen = request(cmd);
    // From here the leader has registered this process's reference to
    // `gen`: every way out that returns no handle must give it back.
    TensorInfo t;
    try {
      std::lock_guard lk(client_mu_);
      auto r = client_.command({"HGETALL", keys.tensor(cmd.name)});
      if (r.size() == 0) throw NotFound("tensor '" + cmd.name + "' vanished right after its creation");
      t = protocol::decode_record(fields_from_reply(r.view()));
      if (t.generation != gen)
        throw StaleHandle("tensor '" + cmd.name + "' was replaced right after its creation");
    } catch (const ConnectionError&) {
      throw;  // Redis away: GC drops the reference if this process dies
    } catch (...) {
      release_noexcept(cmd.name, gen, false);
      throw;
    }
    return adopt_reference(std::move(t));
  }

  // Sends a command to the allocator of record and waits for its reply.
  std::uint64_t request(protocol::Command cmd) {
    const std::string reply_key = keys.reply(session);
    std::string id = session + ":" + std::to_string(++request_seq_);
    cmd.id = id;
    cmd.id_is_number = false;
    cmd.reply_to = reply_key;
    const std::string payload = protocol::encode_command(cmd);
    std::lock_guard lk(client_mu_);
    client_.command({"LPUSH", keys.lifecycle(), payload});
    auto deadline = std::chrono::steady_clock::now() + opts.request_timeout;
    bool retracted_tried = false;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        if (!retracted_tried) {
          retracted_tried = true;
          // Take the command back if no leader has picked it up; otherwise it
          // is being executed: wait once more for its outcome.
          if (client_.command({"LREM", keys.lifecycle(), 1, payload}).integer() == 1)
            throw NotLeader("no allocator of record answered '" + std::string(to_string(cmd.op)) + " " + cmd.name +
                            "' within " + std::to_string(opts.request_timeout.count()) +
                            " ms: no process hosts the control thread (start one, e.g. `memcuda serve`)");
          deadline = std::chrono::steady_clock::now() + opts.request_timeout;
          continue;
        }
        throw NotLeader("the allocator of record took '" + std::string(to_string(cmd.op)) + " " + cmd.name +
                        "' but did not reply within " + std::to_string(2 * opts.request_timeout.count()) + " ms");
      }
      auto wait = std::min(left, std::chrono::milliseconds(1000));
      auto r = client_.blocking(wait, {"BLPOP", reply_key, seconds_arg(wait)});
      if (r.is_nil()) continue;
      protocol::Reply rep = protocol::decode_reply(r[1].str());
      if (rep.id != id) continue;  // a late reply to an earlier, abandoned request
      if (!rep.ok) {
        auto e = rep.error.value_or(protocol::ReplyErrorInfo{"error", "unknown error"});
        throw_for_code(e.code, e.message);
      }
      return rep.generation.value_or(0);
    }
  }

  void remove(std::string_view name) {
    check_fatal();
    ::memcuda::validate_name(name);
    std::lock_guard lk(client_mu_);
    auto r = scripts_.remove.eval(client_, {keys.tensor(name), keys.names(), keys.lifecycle()},
                                  {keys.prefix(), session});
    std::string_view st = r[0].str();
    if (st == "notfound") throw NotFound("no tensor named '" + std::string(name) + "'");
    if (st == "free") free_unlinked(client_, reply_u64(r[1]), true);
  }

  // Drops one of our references; returns the remaining refcount. Frees the
  // memory when it was the last and it is ours.
  std::int64_t release_ref(redis::Connection& c, lua::Scripts& s, const std::string& name, std::uint64_t gen,
                           const std::string& holder, const std::string& token, bool all = false) {
    auto r = s.release.eval(c, {keys.tensor(name), keys.names(), keys.lifecycle(), keys.leader()},
                            {gen, holder, keys.prefix(), session, token, all ? "all" : ""});
    std::string_view st = r[0].str();
    if (st == "ok") return reply_int(r[1]);
    if (st == "free") {
      free_unlinked(c, reply_u64(r[1]), true);  // the generation it had last (a migration renews it)
      return 0;
    }
    if (st == "queued") return 0;
    if (st == "notfound") throw NotFound("no tensor '" + name + "' of generation " + std::to_string(gen));
    if (st == "notholder") throw InvalidArgument("'" + holder + "' holds no reference to '" + name + "'");
    lose_leadership("lease taken over");
    throw NotLeader("lost the allocator-of-record lease");
  }

  void release_noexcept(const std::string& name, std::uint64_t gen, bool held = true) noexcept {
    if (held) note_hold(name, gen, -1);
    try {
      std::lock_guard lk(client_mu_);
      release_ref(client_, scripts_, name, gen, session, "");
    } catch (const std::exception& e) {
      log(LogLevel::warn, "release of '" + name + "': " + e.what());
    }
  }

  // Stores a producer's event handle for this generation; returns the new
  // event version. Throws StaleHandle when the name moved on.
  std::uint64_t publish_event(const std::string& name, std::uint64_t gen, const std::string& handle) {
    std::lock_guard lk(client_mu_);
    auto v = scripts_.publish.eval(client_, {keys.tensor(name)}, {gen, handle}).integer();
    if (v < 0)
      throw StaleHandle("cannot publish '" + name + "' generation " + std::to_string(gen) +
                        ": the name was removed or re-created");
    return static_cast<std::uint64_t>(v);
  }

  // The event handle last published for this generation ("" when none).
  std::string published_event(const std::string& name, std::uint64_t gen) {
    std::lock_guard lk(client_mu_);
    auto r = client_.command({"HMGET", keys.tensor(name), "generation", "event_handle"});
    if (r[0].is_nil() || reply_u64(r[0]) != gen)
      throw StaleHandle("'" + name + "' generation " + std::to_string(gen) + " is no longer registered");
    return r[1].is_nil() ? std::string() : std::string(r[1].str());
  }

  std::optional<std::uint64_t> current_generation(std::string_view name) {
    std::lock_guard lk(client_mu_);
    auto r = client_.command({"HGET", keys.tensor(name), "generation"});
    if (r.is_nil()) return std::nullopt;
    return std::stoull(std::string(r.str()));
  }

  std::optional<TensorInfo> info(std::string_view name) {
    check_fatal();
    ::memcuda::validate_name(name);
    std::lock_guard lk(client_mu_);
    auto r = client_.command({"HGETALL", keys.tensor(name)});
    if (r.size() == 0) return std::nullopt;
    return protocol::decode_record(fields_from_reply(r.view()));
  }

  std::vector<TensorInfo> list(std::string_view pattern) {
    check_fatal();
    std::lock_guard lk(client_mu_);
    auto names = client_.command({"SMEMBERS", keys.names()});
    std::vector<std::string> selected;
    const std::string pat(pattern.empty() ? "*" : pattern);
    for (std::size_t i = 0; i < names.size(); ++i) {
      std::string n(names[i].str());
      if (::fnmatch(pat.c_str(), n.c_str(), 0) == 0) selected.push_back(std::move(n));
    }
    std::vector<redis::Command> cmds;
    for (const auto& n : selected) cmds.push_back({"HGETALL", keys.tensor(n)});
    std::vector<TensorInfo> out;
    if (cmds.empty()) return out;
    auto replies = client_.pipeline(cmds);
    for (auto& r : replies) {
      if (r.size() == 0) continue;  // removed meanwhile
      try {
        out.push_back(protocol::decode_record(fields_from_reply(r.view())));
      } catch (const ProtocolError& e) {
        log(LogLevel::warn, std::string("skipping a corrupt record: ") + e.what());
      }
    }
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    return out;
  }

  // Blocks until `name` is ready or the timeout passes, without polling:
  // the waiter registers a private list in the name's waiter set, and the
  // create script pushes the generation to every registered list.
  bool wait(std::string_view name, std::chrono::milliseconds timeout) {
    check_fatal();
    ::memcuda::validate_name(name);
    redis::Connection c(opts.redis);  // a blocked wait must not hold the shared connection
    const std::string wl = keys.reply(session) + ":wait:" + std::to_string(++request_seq_);
    const std::string ws = waiters_key(name);
    c.pipeline({{"SADD", ws, wl}, {"PEXPIRE", ws, std::to_string(timeout.count() + 60000)}});
    auto st = c.command({"HGET", keys.tensor(name), "state"});
    bool ready = !st.is_nil() && st.str() == "ready";
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!ready) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      auto r = c.blocking(left, {"BLPOP", wl, seconds_arg(left)});
      if (r.is_nil()) continue;
      auto s2 = c.command({"HGET", keys.tensor(name), "state"});
      ready = !s2.is_nil() && s2.str() == "ready";
    }
    c.pipeline({{"SREM", ws, wl}, {"DEL", wl}});
    return ready;
  }

  LeaderInfo leader_info() {
    check_fatal();
    std::lock_guard lk(client_mu_);
    return read_leader(client_);
  }

  LeaderInfo read_leader(redis::Connection& c) {
    LeaderInfo l;
    auto rs = c.pipeline({{"GET", keys.leader()}, {"PTTL", keys.leader()}});
    if (rs[0].is_nil()) return l;
    std::string tok(rs[0].str());
    l.present = true;
    l.epoch = std::stoull(tok.substr(0, tok.find(' ')));
    l.session = tok.substr(tok.find(' ') + 1);
    l.ttl_ms = rs[1].integer();
    l.is_self = l.session == session;
    return l;
  }

  RegistryStats stats() {
    check_fatal();
    RegistryStats s;
    auto all = list("*");
    std::map<std::pair<int, int>, DeviceUsage> per;
    for (const auto& t : all) {
      ++s.tensors;
      s.bytes += t.bytes;
      auto& d = per[{static_cast<int>(t.backend), t.device}];
      d.backend = t.backend;
      d.device = t.device;
      d.device_uuid = t.device_uuid;
      ++d.tensors;
      d.bytes += t.bytes;
    }
    for (auto& [k, v] : per) s.per_device.push_back(v);
    std::lock_guard lk(client_mu_);
    s.leader = read_leader(client_);
    s.queue_length = static_cast<std::uint64_t>(client_.command({"LLEN", keys.lifecycle()}).integer());
    s.sessions = live_sessions(client_);
    if (is_leader()) {
      s.pools = pool_stats();
    } else if (auto ps = client_.command({"GET", keys.prefix() + "memcuda:pool_stats"}); !ps.is_nil()) {
      s.pools = decode_pool_stats(ps.str());
    }
    {
      std::lock_guard ol(owned_mu_);
      s.process.owned_allocations = owned_.size();
      s.process.owned_bytes = owned_bytes_;
    }
    s.process.creates = stats_.creates.load();
    s.process.frees = stats_.frees.load();
    auto& pc = ProcessCache::instance();
    s.process.live_imports = pc.live_imports();
    s.process.import_opens = pc.opens();
    s.process.import_hits = pc.hits();
    return s;
  }

  // ---- sessions and garbage collection ------------------------------------

  // Announces (and refreshes) this registry's session: a key that expires
  // session_ttl after the last refresh, so a killed process's session ends.
  // Returns false when the key was gone before this refresh (Redis lost
  // its data, or this process was stopped past its TTL): the caller then
  // re-registers what this process owns and holds (recover()).
  bool refresh_session(redis::Connection& c) {
    boost::json::object o{{"pid", ::getpid()}, {"node", node}, {"started", started_ms_},
                          {"allocator_capable", opts.control_thread}};
    auto r = c.pipeline({{"SET", keys.session(session), boost::json::serialize(o), "PX",
                          std::to_string(opts.session_ttl.count()), "GET"},
                         {"SADD", keys.sessions(), session}});
    return !r[0].is_nil();
  }

  // One garbage collection round of the allocator of record: references of
  // dead processes, then tensors of dead allocators.
  void gc_round(redis::Connection& c, lua::Scripts& s) {
    auto token = lease().first;
    collect_garbage(c, s, token);
    std::lock_guard ml(migrate_mu_);
    adopt_orphans(c, s, token);
  }

  void end_session(redis::Connection& c) { c.pipeline({{"DEL", keys.session(session)}, {"SREM", keys.sessions(), session}}); }

  // "<pid>-<16 hex digits>": the holder id of a registry session.
  static bool is_session_id(std::string_view h) {
    auto dash = h.find('-');
    if (dash == 0 || dash == std::string_view::npos || h.size() - dash - 1 != 16) return false;
    for (std::size_t i = 0; i < dash; ++i)
      if (!std::isdigit(static_cast<unsigned char>(h[i]))) return false;
    for (std::size_t i = dash + 1; i < h.size(); ++i)
      if (!std::isxdigit(static_cast<unsigned char>(h[i]))) return false;
    return true;
  }

  // Drops every reference held by a dead session ("<pid>-<hex>") or a dead
  // JSON client ("pid:<n>", a process of this node), frees what that
  // releases, and prunes the session index. Safe from any process (the
  // scripts are atomic); the allocator of record runs it every gc_interval
  // with its lease token, so a deposed leader cannot act on stale views.
  GcReport collect_garbage(redis::Connection& c, lua::Scripts& s, const std::string& token) {
    GcReport rep;
    // every record: the named ones and the unlinked-but-held ones
    std::vector<std::string> names = record_keys(c);
    if (!names.empty()) {
      std::vector<redis::Command> cmds;
      for (const auto& k : names) cmds.push_back({"HMGET", k, "name", "generation", "refcount", "republished"});
      std::vector<redis::Command> hk;
      for (const auto& k : names) hk.push_back({"HKEYS", k});
      auto ids = c.pipeline(cmds);
      auto fields = c.pipeline(hk);
      struct Ref {
        std::string name;
        std::uint64_t gen;
        std::string holder;
      };
      std::vector<Ref> refs;
      std::map<std::string, bool> alive;
      for (std::size_t i = 0; i < names.size(); ++i) {
        if (ids[i][0].is_nil() || ids[i][1].is_nil()) continue;
        // A record republished after Redis lost its data that no holder
        // re-registered (they died meanwhile) has no reference to release:
        // once the holders' re-registration window has passed, free it.
        if (!ids[i][3].is_nil() && !ids[i][2].is_nil() && reply_int(ids[i][2]) == 0 &&
            now_ms() - reply_int(ids[i][3]) > kRepublishGraceMs + opts.session_ttl.count()) {
          std::string name(ids[i][0].str());
          std::uint64_t gen = reply_u64(ids[i][1]);
          try {
            if (names[i] == keys.tensor(name)) {
              auto r = s.remove.eval(c, {keys.tensor(name), keys.names(), keys.lifecycle()}, {keys.prefix(), session});
              if (r[0].str() == "free") free_unlinked(c, reply_u64(r[1]), true);
            } else {
              free_unlinked(c, gen);
            }
            ++rep.tensors_freed;
            log(LogLevel::info, "gc: freed '" + name + "': republished after a Redis restart, nobody re-registered");
          } catch (const std::exception& e) {
            log(LogLevel::warn, "gc: freeing unclaimed '" + name + "': " + e.what());
          }
          continue;
        }
        for (std::size_t j = 0; j < fields[i].size(); ++j) {
          std::string f(fields[i][j].str());
          if (!f.starts_with("holder:")) continue;
          std::string h = f.substr(7);
          refs.push_back({std::string(ids[i][0].str()), reply_u64(ids[i][1]), h});
          alive.emplace(h, true);
        }
      }
      std::vector<std::string> sess;
      for (auto& [h, a] : alive) {
        if (is_session_id(h)) sess.push_back(h);
        else if (h.starts_with("pid:")) a = pid_alive(h.substr(4));
      }
      if (!sess.empty()) {
        std::vector<redis::Command> ex;
        for (const auto& h : sess) ex.push_back({"EXISTS", keys.session(h)});
        auto r = c.pipeline(ex);
        for (std::size_t i = 0; i < sess.size(); ++i) alive[sess[i]] = r[i].integer() == 1;
      }
      std::set<std::string> dead;
      for (const auto& ref : refs) {
        if (alive[ref.holder]) continue;
        dead.insert(ref.holder);
        auto cnt = c.command({"HGET", removed_or_named(ref.name, ref.gen, c), "holder:" + ref.holder});
        std::int64_t n = cnt.is_nil() ? 0 : reply_int(cnt.view());
        try {
          if (release_ref(c, s, ref.name, ref.gen, ref.holder, token, true) == 0) ++rep.tensors_freed;
          rep.references_dropped += static_cast<std::uint64_t>(n);
          log(LogLevel::info, "gc: dropped " + std::to_string(n) + " reference(s) of dead holder " + ref.holder +
                                  " to '" + ref.name + "'");
        } catch (const NotFound&) {
        } catch (const InvalidArgument&) {  // released meanwhile
        }
      }
      rep.dead_holders = dead.size();
    }
    auto members = c.command({"SMEMBERS", keys.sessions()});
    std::vector<std::string> all;
    for (std::size_t i = 0; i < members.size(); ++i) all.emplace_back(members[i].str());
    if (!all.empty()) {
      std::vector<redis::Command> ex;
      for (const auto& m : all) ex.push_back({"EXISTS", keys.session(m)});
      auto r = c.pipeline(ex);
      std::vector<std::string> gone, live;
      for (std::size_t i = 0; i < all.size(); ++i) (r[i].integer() == 0 ? gone : live).push_back(all[i]);
      for (const auto& g : gone) {
        c.command({"SREM", keys.sessions(), g});
        ++rep.sessions_pruned;
        // Processes that mapped its memory stop keeping idle mappings of it,
        // so a dead exporter's device memory is released by the driver.
        ProcessCache::instance().forget_owner(g);
        for (const auto& l : live)
          if (l != session) send_inbox(c, l, boost::json::object{{"op", "forget"}, {"owner", g}});
      }
    }
    return rep;
  }

  GcReport collect_garbage_now() {
    check_fatal();
    std::lock_guard lk(client_mu_);
    auto [token, epoch] = lease();
    bool lead = is_leader();
    GcReport rep = collect_garbage(client_, scripts_, lead ? token : "");
    if (lead) {
      std::lock_guard ml(migrate_mu_);
      auto [m, l] = adopt_orphans(client_, scripts_, token);
      rep.tensors_migrated = m;
      rep.tensors_lost = l;
    }
    return rep;
  }

  std::uint64_t live_sessions(redis::Connection& c) {
    auto members = c.command({"SMEMBERS", keys.sessions()});
    if (members.size() == 0) return 0;
    std::vector<redis::Command> ex;
    for (std::size_t i = 0; i < members.size(); ++i) ex.push_back({"EXISTS", keys.session(members[i].str())});
    std::uint64_t n = 0;
    for (auto& r : c.pipeline(ex)) n += r.integer() == 1;
    return n;
  }

  // ---- references this process holds (for re-registration) ---------------

  void note_hold(const std::string& name, std::uint64_t gen, int delta) noexcept {
    try {
      std::lock_guard lk(held_mu_);
      auto& n = held_[{name, gen}];
      n += delta;
      if (n <= 0) held_.erase({name, gen});
    } catch (...) {
    }
  }

  // ---- messages to one session (allocator of record -> holder / owner) ----

  void send_inbox(redis::Connection& c, const std::string& sid, const boost::json::object& msg) {
    const std::string k = keys.inbox(sid);
    c.pipeline({{"LPUSH", k, boost::json::serialize(msg)}, {"PEXPIRE", k, "60000"}});
  }

  bool owner_alive(redis::Connection& c, const std::string& owner, std::int64_t pid) {
    if (owner.empty()) return false;
    if (c.command({"EXISTS", keys.session(owner)}).integer() == 1) return true;
    // No session key: dead, unless the process still runs (paused past its
    // TTL, or Redis lost the key): its memory is then still good.
    return pid > 0 && pid_alive(std::to_string(pid));
  }

  static std::string to_hex(std::string_view b) {
    static const char* d = "0123456789abcdef";
    std::string out;
    out.reserve(2 * b.size());
    for (unsigned char ch : b) {
      out.push_back(d[ch >> 4]);
      out.push_back(d[ch & 15]);
    }
    return out;
  }
  static std::string from_hex(std::string_view h) {
    auto v = [](char ch) -> int {
      if (ch >= '0' && ch <= '9') return ch - '0';
      if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
      throw ProtocolError(ProtocolErrc::bad_value, "bad hex digit in an inbox message");
    };
    if (h.size() % 2) throw ProtocolError(ProtocolErrc::bad_value, "odd hex length in an inbox message");
    std::string out;
    for (std::size_t i = 0; i < h.size(); i += 2) out.push_back(static_cast<char>(v(h[i]) * 16 + v(h[i + 1])));
    return out;
  }

  // Copies a tensor of a dead exporter, through this process's existing
  // mapping of it, into its replacement. Throws when this process no longer
  // maps the old memory.
  void copy_for_migration(const TensorInfo& from, const TensorInfo& to) {
    auto [src, keep_src] = ProcessCache::instance().find(from.owner, from.alloc_id);
    if (!src)
      throw Unavailable("this process does not map the memory of '" + from.name + "' (owner " + from.owner + ")");
    auto [dst, keep_dst] = ProcessCache::instance().resolve(to.owner, to.alloc_id,
                                                            [&] { return backend_for(to.backend).open(to); });
    int dev = -1;
#if MEMCUDA_HAS_CUDA()
    if (to.backend == BackendKind::cuda) dev = ordinal_of_uuid(to.device_uuid, to.device);
#endif
    backend_for(to.backend).copy(static_cast<char*>(dst) + to.offset, static_cast<const char*>(src) + from.offset,
                                 from.bytes, dev);
  }

  // Executes one inbox message (the control thread of a non-leader calls it).
  void handle_inbox(redis::Connection& c, const std::string& raw) {
    boost::json::object m;
    try {
      if (raw.size() > protocol::kMaxCommandBytes) throw ProtocolError(ProtocolErrc::too_large, "inbox message too large");
      m = boost::json::parse(raw).as_object();
    } catch (const std::exception& e) {
      log(LogLevel::warn, std::string("ignoring an unreadable inbox message: ") + e.what());
      return;
    }
    auto str = [&](const char* k) { return std::string(m.at(k).as_string()); };
    auto u64 = [&](const char* k) { return m.at(k).to_number<std::uint64_t>(); };
    try {
      const std::string op = str("op");
      if (op == "forget") {
        ProcessCache::instance().forget_owner(str("owner"));
      } else if (op == "unmap") {
        for (const auto& id : m.at("alloc_ids").as_array())
          ProcessCache::instance().forget_allocation(str("owner"), id.to_number<std::uint64_t>());
      } else if (op == "free") {
        free_unlinked(c, u64("generation"));
      } else if (op == "migrate") {
        const std::string reply_to = str("reply_to");
        if (!reply_to.starts_with(keys.reply(""))) throw InvalidArgument("migrate reply_to is not a reply list");
        boost::json::object rep{{"id", m.at("id")}, {"ok", true}};
        try {
          TensorInfo from, to;
          from.name = to.name = str("name");
          from.backend = to.backend = backend_from_string(str("backend")).value();
          from.owner = str("from_owner");
          from.alloc_id = u64("from_alloc_id");
          from.offset = u64("from_offset");
          from.bytes = to.bytes = u64("bytes");
          to.owner = str("to_owner");
          to.owner_pid = m.at("to_owner_pid").to_number<std::int64_t>();
          to.alloc_id = u64("to_alloc_id");
          to.offset = u64("to_offset");
          to.alloc_bytes = u64("to_alloc_bytes");
          to.ipc_handle = from_hex(str("to_handle"));
          to.device = static_cast<int>(m.at("to_device").to_number<std::int64_t>());
          to.device_uuid = str("to_device_uuid");
          to.node = node;
          if (to.offset > to.alloc_bytes || to.bytes > to.alloc_bytes - to.offset)
            throw InvalidArgument("migration target out of bounds");
          copy_for_migration(from, to);
          log(LogLevel::info, "copied '" + to.name + "' (" + std::to_string(to.bytes) +
                                  " bytes) for the allocator of record: its exporter died");
        } catch (const std::exception& e) {
          rep["ok"] = false;
          rep["error"] = e.what();
        }
        c.pipeline({{"LPUSH", reply_to, boost::json::serialize(rep)}, {"PEXPIRE", reply_to, "60000"}});
      } else {
        log(LogLevel::warn, "ignoring an inbox message with op '" + op + "'");
      }
    } catch (const ConnectionError&) {
      throw;
    } catch (const TimeoutError&) {
      throw;
    } catch (const std::exception& e) {
      log(LogLevel::warn, std::string("inbox message failed: ") + e.what());
    }
  }

  // ---- a dead allocator of record's tensors (run by the leader) -----------

  // Every record key: the named tensors and the unlinked-but-held ones.
  std::vector<std::string> record_keys(redis::Connection& c) {
    std::vector<std::string> out;
    auto m = c.command({"SMEMBERS", keys.names()});
    for (std::size_t i = 0; i < m.size(); ++i) out.emplace_back(keys.tensor(m[i].str()));
    std::string cursor = "0";
    do {
      auto r = c.command({"SCAN", cursor, "MATCH", keys.prefix() + "memcuda:removed:*", "COUNT", "1000"});
      cursor = std::string(r[0].str());
      for (std::size_t i = 0; i < r[1].size(); ++i) out.emplace_back(r[1][i].str());
    } while (cursor != "0");
    return out;
  }

  enum class Adopted { migrated, lost, gone, retry };

  // Gives every tensor whose allocator of record died a new home: a live
  // holder copies it into memory this leader allocates (the dead exporter's
  // handle cannot be opened anew, but existing mappings still read it), the
  // record is republished under a new generation; with no live holder it is
  // marked lost. Host memory of dead owners is unlinked once no record uses
  // it. Returns {migrated, lost}.
  std::pair<std::uint64_t, std::uint64_t> adopt_orphans(redis::Connection& c, lua::Scripts& s,
                                                        const std::string& token) {
    std::uint64_t migrated = 0, lost = 0;
    auto rkeys = record_keys(c);
    std::set<std::string> still_used;  // ipc handles of dead owners that records still use
    if (!rkeys.empty()) {
      std::vector<redis::Command> cmds;
      for (const auto& k : rkeys) cmds.push_back({"HMGET", k, "owner", "owner_pid", "node", "state"});
      auto rs = c.pipeline(cmds);
      std::map<std::string, bool> dead;  // owner -> dead
      for (std::size_t i = 0; i < rkeys.size(); ++i) {
        if (rs[i][0].is_nil() || rs[i][2].is_nil() || rs[i][3].is_nil()) continue;
        std::string owner(rs[i][0].str());
        if (owner == session || rs[i][2].str() != node || rs[i][3].str() != "ready") continue;
        if (!dead.count(owner)) {
          std::int64_t pid = rs[i][1].is_nil() ? 0 : reply_int(rs[i][1]);
          dead[owner] = !owner_alive(c, owner, pid);
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
        Adopted a = adopt_one(c, s, token, t);
        if (a == Adopted::migrated) ++migrated;
        if (a == Adopted::lost) ++lost;
        if (a == Adopted::retry) {
          still_used.insert(t.ipc_handle);
        } else {
          std::lock_guard lk(owned_mu_);
          pending_reclaim_.emplace(t.ipc_handle, t);
        }
      }
    }
    // Unlink what dead owners left once nothing refers to it any more.
    std::vector<TensorInfo> reclaim;
    {
      std::lock_guard lk(owned_mu_);
      for (auto it = pending_reclaim_.begin(); it != pending_reclaim_.end();) {
        if (still_used.count(it->first)) {
          ++it;
          continue;
        }
        reclaim.push_back(std::move(it->second));
        it = pending_reclaim_.erase(it);
      }
    }
    for (const auto& t : reclaim) backend_for(t.backend).reclaim_orphan(t);
    return {migrated, lost};
  }

  Adopted adopt_one(redis::Connection& c, lua::Scripts& s, const std::string& token, const TensorInfo& t) {
    // Live registry sessions that hold it, this process first.
    std::vector<std::string> live;
    for (const auto& [h, n] : t.holders)
      if (n > 0 && is_session_id(h) && (h == session || c.command({"EXISTS", keys.session(h)}).integer() == 1))
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
        auto [tok, epoch] = lease();
        pool = &pool_for(t.backend, device);
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
        n.node = node;
        if (h == session) copy_for_migration(t, n);
        else ask_holder_to_copy(c, h, t, n);
        std::vector<redis::Arg> args{token, t.generation, dead_owner, keys.prefix()};
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
        const std::string tk = keys.tensor(t.name), lk = keys.leader(), gk = keys.generation();
        redis::Arg kv[] = {tk, lk, gk};
        auto r = s.migrate.eval(c, std::span<const redis::Arg>(kv), std::span<const redis::Arg>(args));
        std::string_view st = r[0].str();
        if (st == "ok") {
          n.generation = reply_u64(r[1]);
          {
            std::lock_guard lk2(owned_mu_);
            owned_bytes_ += pb->block.size;
            owned_[n.generation] = Owned{pool, *pb, n, t.holders.count("@name") > 0};
          }
          log(LogLevel::info, "migrated '" + t.name + "' of dead allocator " + dead_owner + " (pid " +
                                  std::to_string(t.owner_pid) + "): generation " + std::to_string(t.generation) +
                                  " -> " + std::to_string(n.generation) + ", copied by " +
                                  (h == session ? std::string("this process") : h));
          migrate_attempts_.erase(t.generation);
          return Adopted::migrated;
        }
        pool->deallocate(*pb);
        if (st == "gone") return Adopted::gone;
        lose_leadership("lease taken over");
        throw NotLeader("lost the allocator-of-record lease while migrating '" + t.name + "'");
      } catch (const NotLeader&) {
        throw;
      } catch (const ConnectionError&) {
        if (pb && pool) pool->deallocate(*pb);
        throw;
      } catch (const std::exception& e) {
        if (pb && pool) pool->deallocate(*pb);
        log(LogLevel::warn, "migrating '" + t.name + "' through holder " + h + " failed: " + e.what());
      }
    }
    // Nobody alive can copy it (or every holder failed, several times).
    bool force = false;
    if (!live.empty()) {
      if (++migrate_attempts_[t.generation] < kMigrateAttempts) return Adopted::retry;
      force = true;
    }
    const std::string tk = keys.tensor(t.name), nk = keys.names(), lk = keys.leader(), mk = keys.lost(t.name);
    redis::Arg kv[] = {tk, lk, nk, mk};
    std::vector<redis::Arg> args{token, t.generation, dead_owner, keys.prefix(), kLostMarkerTtlMs, now_ms(),
                                 force ? "1" : "0"};
    auto r = s.mark_lost.eval(c, std::span<const redis::Arg>(kv), std::span<const redis::Arg>(args));
    std::string_view st = r[0].str();
    if (st == "lost") {
      migrate_attempts_.erase(t.generation);
      log(LogLevel::warn, "'" + t.name + "' (generation " + std::to_string(t.generation) +
                              ") is lost: its allocator of record " + dead_owner + " (pid " +
                              std::to_string(t.owner_pid) + ") died and no live process could copy it");
      return Adopted::lost;
    }
    if (st == "held") return Adopted::retry;  // a holder appeared meanwhile: next round
    if (st == "gone") return Adopted::gone;
    lose_leadership("lease taken over");
    throw NotLeader("lost the allocator-of-record lease while giving up '" + t.name + "'");
  }

  // Sends a holder the old and new places of a tensor and waits for it to
  // copy (its control thread runs handle_inbox).
  void ask_holder_to_copy(redis::Connection& c, const std::string& holder, const TensorInfo& from,
                          const TensorInfo& to) {
    const std::string rk = keys.reply(session) + ":migrate";
    const std::uint64_t id = ++migrate_seq_;
    boost::json::object m{{"op", "migrate"},
                          {"id", id},
                          {"reply_to", rk},
                          {"name", from.name},
                          {"backend", std::string(to_string(from.backend))},
                          {"bytes", from.bytes},
                          {"from_owner", from.owner},
                          {"from_alloc_id", from.alloc_id},
                          {"from_offset", from.offset},
                          {"to_owner", to.owner},
                          {"to_owner_pid", to.owner_pid},
                          {"to_alloc_id", to.alloc_id},
                          {"to_offset", to.offset},
                          {"to_alloc_bytes", to.alloc_bytes},
                          {"to_handle", to_hex(to.ipc_handle)},
                          {"to_device", to.device},
                          {"to_device_uuid", to.device_uuid}};
    send_inbox(c, holder, m);
    auto deadline = std::chrono::steady_clock::now() + opts.request_timeout;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0)
        throw TimeoutError("holder " + holder + " did not copy '" + from.name + "' within " +
                           std::to_string(opts.request_timeout.count()) + " ms");
      auto r = c.blocking(left, {"BLPOP", rk, seconds_arg(left)});
      if (r.is_nil()) continue;
      boost::json::object rep = boost::json::parse(r[1].str()).as_object();
      if (rep.at("id").to_number<std::uint64_t>() != id) continue;  // a late answer to an earlier ask
      if (!rep.at("ok").as_bool()) throw Unavailable(std::string(rep.at("error").as_string()));
      return;
    }
  }

  // ---- after Redis lost its data (or this session's key expired) ----------

  // Writes back the records of what this process owns and sets this
  // session's references to what it holds. Returns true when every
  // reference found its record (false: some owner has not republished yet;
  // call again).
  bool recover(redis::Connection& c, lua::Scripts& s) {
    std::vector<std::pair<TensorInfo, bool>> mine;
    {
      std::lock_guard lk(owned_mu_);
      for (const auto& [g, o] : owned_) mine.emplace_back(o.info, o.persistent);
    }
    std::uint64_t republished = 0;
    for (auto& [t, persistent] : mine) {
      TensorInfo r = t;
      r.holders.clear();
      std::vector<redis::Arg> args{t.generation, keys.prefix(), persistent ? "1" : "0", t.name, now_ms()};
      const protocol::Fields fields = protocol::encode_record(r);  // args point into it
      for (const auto& [k, v] : fields) {
        if (k == "generation" || k == "state" || k == "refcount" || k == "event_handle" || k == "event_version")
          continue;
        args.emplace_back(k);
        args.emplace_back(v);
      }
      const std::string tk = keys.tensor(t.name), nk = keys.names(), gk = keys.generation();
      redis::Arg kv[] = {tk, nk, gk};
      auto res = s.republish.eval(c, std::span<const redis::Arg>(kv), std::span<const redis::Arg>(args));
      if (res[0].str() != "present") ++republished;
    }
    std::vector<std::pair<std::pair<std::string, std::uint64_t>, std::int64_t>> held;
    {
      std::lock_guard lk(held_mu_);
      held.assign(held_.begin(), held_.end());
    }
    bool all = true;
    for (const auto& [k, n] : held) {
      auto res = s.reregister.eval(c, {keys.tensor(k.first)}, {k.second, session, n, keys.prefix()});
      if (res[0].str() == "absent") all = false;
    }
    if (republished)
      log(LogLevel::warn, "Redis had lost the records of " + std::to_string(republished) +
                              " tensor(s) this process owns: republished them");
    return all;
  }

  // ---- the pools (allocator of record) -----------------------------------

  DevicePool& pool_for(BackendKind kind, int device) {
    std::lock_guard lk(pools_mu_);
    auto& p = pools_[{kind, device}];
    if (!p) p = std::make_unique<DevicePool>(backend_for(kind), device, session, opts.pool, next_alloc_id_);
    return *p;
  }

  std::vector<PoolStats> pool_stats() {
    std::lock_guard lk(pools_mu_);
    std::vector<PoolStats> v;
    for (auto& [k, p] : pools_) v.push_back(p->stats());
    return v;
  }

  // Returns empty slabs to the driver (the control thread calls it each
  // tick, so no cudaFree runs on a create or release path).
  std::uint64_t trim_pools(bool all = false, std::vector<std::uint64_t>* ids = nullptr) {
    std::lock_guard lk(pools_mu_);
    std::uint64_t n = 0;
    for (auto& [k, p] : pools_) n += p->trim(all, ids);
    return n;
  }

  // Trims, then tells every other live session to close its idle mappings
  // of what was returned: an importer's open mapping keeps freed device
  // memory allocated (see process_cache.hpp).
  std::uint64_t trim_and_announce(redis::Connection& c, bool all) {
    std::vector<std::uint64_t> ids;
    auto n = trim_pools(all, &ids);
    if (ids.empty()) return n;
    boost::json::array a;
    for (auto id : ids) a.push_back(id);
    auto members = c.command({"SMEMBERS", keys.sessions()});
    for (std::size_t i = 0; i < members.size(); ++i) {
      std::string sid(members[i].str());
      if (sid != session) send_inbox(c, sid, boost::json::object{{"op", "unmap"}, {"owner", session}, {"alloc_ids", a}});
    }
    return n;
  }

  std::uint64_t trim_now() {
    check_fatal();
    std::lock_guard lk(client_mu_);
    return trim_and_announce(client_, true);
  }

  void reset_pool_peaks() {
    std::lock_guard lk(pools_mu_);
    for (auto& [k, p] : pools_) p->reset_peak();
  }

  // The leader publishes its pool statistics so any process can read them.
  void publish_pool_stats(redis::Connection& c) {
    boost::json::array a;
    for (const auto& p : pool_stats())
      a.push_back({{"backend", std::string(to_string(p.backend))}, {"device", p.device},
                   {"device_uuid", p.device_uuid}, {"in_use", p.in_use}, {"reserved", p.reserved},
                   {"peak_in_use", p.peak_in_use}, {"budget", p.budget}, {"slabs", p.slabs},
                   {"allocations", p.allocations}, {"frees", p.frees}, {"largest_free", p.largest_free}});
    c.command({"SET", keys.prefix() + "memcuda:pool_stats", boost::json::serialize(a), "PX",
               std::to_string(3 * opts.lease_ttl.count())});
  }

  static std::vector<PoolStats> decode_pool_stats(std::string_view json) {
    std::vector<PoolStats> out;
    try {
      auto v = boost::json::parse(json);
      for (const auto& e : v.as_array()) {
        const auto& o = e.as_object();
        PoolStats p;
        p.backend = backend_from_string(std::string(o.at("backend").as_string())).value_or(BackendKind::host);
        p.device = static_cast<int>(o.at("device").to_number<std::int64_t>());
        p.device_uuid = std::string(o.at("device_uuid").as_string());
        auto u = [&](const char* k) { return o.at(k).to_number<std::uint64_t>(); };
        p.in_use = u("in_use");
        p.reserved = u("reserved");
        p.peak_in_use = u("peak_in_use");
        p.budget = u("budget");
        p.slabs = u("slabs");
        p.allocations = u("allocations");
        p.frees = u("frees");
        p.largest_free = u("largest_free");
        out.push_back(std::move(p));
      }
    } catch (const std::exception& e) {
      log(LogLevel::warn, std::string("unreadable pool statistics in Redis: ") + e.what());
    }
    return out;
  }

  // ---- error hand-off from the control thread ----------------------------

  void set_fatal(std::exception_ptr e) {
    std::lock_guard lk(fatal_mu_);
    if (!fatal_) fatal_ = e;
  }
  void check_fatal() {
    std::lock_guard lk(fatal_mu_);
    if (fatal_) std::rethrow_exception(std::exchange(fatal_, nullptr));
  }

  BackendKind default_backend() const {
    if (opts.default_backend) return *opts.default_backend;
    return cuda_usable() ? BackendKind::cuda : BackendKind::host;
  }

  std::string waiters_key(std::string_view name) const { return keys.prefix() + "memcuda:waiters:" + std::string(name); }

  static bool pid_alive(const std::string& pid_text) {
    try {
      long long pid = std::stoll(pid_text);
      if (pid <= 0 || pid > 0x7fffffff) return true;  // not a pid we can judge: keep it
      return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
    } catch (const std::exception&) {
      return true;
    }
  }

  std::string removed_or_named(const std::string& name, std::uint64_t gen, redis::Connection& c) {
    auto g = c.command({"HGET", keys.tensor(name), "generation"});
    if (!g.is_nil() && reply_u64(g.view()) == gen) return keys.tensor(name);
    return keys.removed(gen);
  }

  static std::string seconds_arg(std::chrono::milliseconds ms) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", std::max<double>(ms.count(), 1.0) / 1000.0);
    return buf;
  }

 private:
  TensorInfo check_acquire(const redis::Reply& r, const std::string& name, std::optional<DType> dtype) {
    std::string_view st = r[0].str();
    if (st == "ok") return protocol::decode_record(fields_from_reply(r[1]));
    if (st == "notfound") throw NotFound("no tensor named '" + name + "'");
    if (st == "dtype")
      throw TypeMismatch("tensor '" + name + "' holds " + std::string(r[1].str()) + ", not " +
                         std::string(dtype ? to_string(*dtype) : "?"));
    if (st == "node")
      throw Unavailable("tensor '" + name + "' lives on node " + std::string(r[1].str()) + ", this is " + node);
    if (st == "lost") {
      std::map<std::string, std::string> m;
      for (auto& [k, v] : fields_from_reply(r[1])) m[k] = v;
      throw Lost("tensor '" + name + "' (generation " + m["generation"] + ") was lost: its allocator of record " +
                 "(pid " + m["owner_pid"] + ", session " + m["owner"] + ", epoch " + m["epoch"] +
                 ") died and no live process held a copy; the name is free to create again");
    }
    if (st == "state") {
      if (r[1].str() == "lost")
        throw Lost("tensor '" + name + "' was lost: its allocator of record died and nobody held it");
      throw NotFound("tensor '" + name + "' is not ready (state " + std::string(r[1].str()) + ")");
    }
    lose_leadership("lease taken over");
    throw NotLeader("lost the allocator-of-record lease");
  }

  const std::int64_t started_ms_ = now_ms();
  redis::Connection client_;
  lua::Scripts scripts_;
  std::unordered_map<std::string, TensorInfo> record_cache_;  // by name, under client_mu_
  std::mutex client_mu_;
  std::uint64_t request_seq_ = 0;

  std::atomic<bool> leader_{false};
  mutable std::mutex lease_mu_;
  std::string token_;
  std::uint64_t epoch_ = 0;

  struct Owned {
    DevicePool* pool;
    PoolBlock pb;
    TensorInfo info;  // its record as published (republished if Redis loses it)
    bool persistent = false;
  };
  std::mutex pools_mu_;
  std::map<std::pair<BackendKind, int>, std::unique_ptr<DevicePool>> pools_;  // declared before owned_
  std::mutex owned_mu_;
  std::unordered_map<std::uint64_t, Owned> owned_;  // by generation
  std::uint64_t owned_bytes_ = 0;
  std::atomic<std::uint64_t> next_alloc_id_{1};
  // Host objects of dead owners, unlinked once no record uses them (under owned_mu_).
  std::multimap<std::string, TensorInfo> pending_reclaim_;
  // Failed migration rounds per generation (control thread only).
  std::map<std::uint64_t, int> migrate_attempts_;
  std::mutex migrate_mu_;  // one adopt_orphans at a time (control thread, collect_garbage_now)
  std::uint64_t migrate_seq_ = 0;
  static constexpr int kMigrateAttempts = 5;
 public:
  // How long holders may take to re-register after Redis lost its data
  // (the control loop retries that long) before unclaimed records are freed.
  static constexpr std::int64_t kRepublishGraceMs = 30000;
 private:
  static constexpr std::int64_t kLostMarkerTtlMs = 24 * 3600 * 1000;
  // The references this process holds: (name, generation) -> count.
  std::mutex held_mu_;
  std::map<std::pair<std::string, std::uint64_t>, std::int64_t> held_;
  struct {
    std::atomic<std::uint64_t> creates{0}, frees{0};
  } stats_;

  std::mutex fatal_mu_;
  std::exception_ptr fatal_;
};

}  // namespace memcuda::detail
