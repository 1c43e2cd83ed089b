// The client operations of a registry (any process, any thread): get,
// create, remove, info, list, wait, publish. Each call borrows a
// connection from the context's pools for its own duration, so no call
// waits behind another thread's; the only state shared between calls is
// the registry's holdings table (holdings.hpp: a leaf lock held for a map
// operation, never across Redis).
#pragma once

#include "memcuda/config.hpp"

#include <fnmatch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "memcuda/detail/backend/process_cache.hpp"
#include "memcuda/detail/process/process.hpp"
#include "memcuda/detail/registry/acquire_outcome.hpp"
#include "memcuda/detail/store/replica_scripts.hpp"
#include "memcuda/detail/registry/get/holdings.hpp"
#include "memcuda/detail/registry/get/silent_leader.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/liveness.hpp"
#include "memcuda/detail/store/lease.hpp"
#include "memcuda/detail/store/lists.hpp"
#include "memcuda/detail/store/records.hpp"
#include "memcuda/detail/store/scripts.hpp"
#include "memcuda/detail/store/name_index.hpp"
#include "memcuda/detail/store/record_pages.hpp"
#include "memcuda/detail/store/reply.hpp"
#include "memcuda/protocol/record_desc.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// A reference this process has taken, mapped: the record, the pointer and
// what keeps the mapping open.
struct Opened {
  TensorInfo info;
  void* data = nullptr;
  std::shared_ptr<void> keep;
};

class Client {
 public:
  Client(Context& ctx, LeaseView& lease, OwnAllocator& alloc, Holdings& holdings)
      : ctx_(ctx), lease_(lease), alloc_(alloc), holdings_(holdings) {}

  // The get fast path: one script checks state, dtype and node and takes
  // the reference atomically; then the memory is mapped (once per process).
  // A record never changes after creation except refcount, holders and
  // the event: when `cached` (the record last read, from the holdings
  // table's find) has the current generation and event version, the
  // script skips sending the whole Hash.
  Opened acquire(std::string_view name, std::optional<DType> dtype, Holdings::Record cached) {
    ::memcuda::validate_name(name);
    if (ctx_.opts.fleet) return acquire_in_fleet(name, dtype);
    std::string cgen, cver;
    if (cached) {
      cgen = std::to_string(cached->generation);
      cver = std::to_string(cached->event_version);
    }
    const auto r = store::acquire(*ctx_.pool.acquire(), ctx_.keys, name, ctx_.session,
                                  dtype ? to_string(*dtype) : std::string_view(), ctx_.node, "", cgen, cver);
    return opened(r, std::string(name), dtype, std::move(cached));
  }

  // create() of the API: directly when we are the allocator of record,
  // else through the lifecycle list and a reply.
  Opened create(protocol::Command cmd) {
    cmd.holder = ctx_.session;
    cmd.pid = ::getpid();
    cmd.node = ctx_.node;
    if (!cmd.backend) cmd.backend = ctx_.default_backend();
    if (lease_.held()) {
      // A create_id, so that a retry of a create whose reply was lost is a
      // replay (the allocator keeps its block parked by this id).
      if (!cmd.id) {
        cmd.id = ctx_.session + ":" + std::to_string(++seq_);
        cmd.id_is_number = false;
      }
      try {
        auto c = ctx_.pool.acquire();
        auto cr = alloc_.create(*c, cmd);
        if (cr.block.slab) {
          void* p = static_cast<char*>(cr.block.slab->base()) + cr.info.offset;
          holdings_.took(cr.info);
          return {std::move(cr.info), p, std::move(cr.block.slab)};
        }
      } catch (const NotLeader&) {
        // lost the lease meanwhile: the new leader serves it below
      } catch (const IoError&) {
        // The link failed: the script may or may not have run. The request
        // below carries the same create_id, so whoever executes it replays
        // it (and this allocator adopts its parked block) or creates anew.
      }
    }
    std::uint64_t gen = request(cmd);
    // From here the leader has registered this process's reference to
    // `gen`: every way out that returns no handle must give it back.
    TensorInfo t;
    try {
      auto c = ctx_.pool.acquire();
      auto r = store::read_record(*c, ctx_.keys.tensor(cmd.name));
      if (r.size() == 0) throw NotFound("tensor '" + cmd.name + "' vanished right after its creation");
      t = protocol::decode_record(fields_from_reply(r.view()));
      if (t.generation != gen) throw StaleHandle("tensor '" + cmd.name + "' was replaced right after its creation");
    } catch (const ConnectionError&) {
      throw;  // Redis away: GC drops the reference if this process dies
    } catch (...) {
      release_now(cmd.name, gen);
      throw;
    }
    return adopt_reference(std::move(t));
  }

  // Sends a command to the allocator of record and waits for its reply, on
  // a connection of the waiting pool and a reply list of its own: other
  // threads' calls go on meanwhile.
  std::uint64_t request(protocol::Command cmd) { return exchange(std::move(cmd)).generation.value_or(0); }
  protocol::Reply exchange(protocol::Command cmd, std::string reply_key = {}) {
    const std::uint64_t seq = ++seq_;
    if (reply_key.empty()) reply_key = ctx_.keys.request_reply(ctx_.session, seq);
    // A create keeps the id a direct attempt gave it (its create_id).
    const std::string id = cmd.id ? *cmd.id : ctx_.session + ":" + std::to_string(seq);
    cmd.id = id;
    cmd.id_is_number = false;
    cmd.reply_to = reply_key;
    const std::string payload = protocol::encode_command(cmd);
    const auto timeout = ctx_.opts.request_timeout;
    auto c = ctx_.waits.acquire();
    store::push_command(*c, ctx_.keys, payload);
    auto deadline = std::chrono::steady_clock::now() + timeout;
    bool retracted_tried = false;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        if (!retracted_tried) {
          retracted_tried = true;
          // Take the command back if no leader has picked it up; otherwise it
          // is being executed: wait once more for its outcome.
          if (store::retract_command(*c, ctx_.keys, payload))
            throw NotLeader("no allocator of record answered '" + std::string(to_string(cmd.op)) + " " + cmd.name +
                            "' within " + std::to_string(timeout.count()) +
                            " ms (the command was taken back): " + silent_leader_reason(*c, ctx_.keys));
          deadline = std::chrono::steady_clock::now() + timeout;
          continue;
        }
        throw NotLeader("the allocator of record took '" + std::string(to_string(cmd.op)) + " " + cmd.name +
                        "' but did not reply within " + std::to_string(2 * timeout.count()) +
                        " ms: " + silent_leader_reason(*c, ctx_.keys));
      }
      auto wait = std::min(left, std::chrono::milliseconds(1000));
      auto r = store::pop_wait(*c, reply_key, wait);
      if (r.is_nil()) continue;
      protocol::Reply rep = protocol::decode_reply(r[1].str());
      if (rep.id != id) continue;  // not ours (a hostile or stray writer)
      if (!rep.ok) {
        // With its detail: a remote CudaError keeps its status and API.
        protocol::throw_reply_error(rep.error.value_or(protocol::ReplyErrorInfo{"error", "unknown error"}));
      }
      store::replicate(*c);  // BLPOP wrote after the leader's script: a replica having it has both
      return rep;
    }
  }

  // replicate() of the API: in this process when it is the allocator of
  // record, else through the lifecycle list.
  std::vector<protocol::ReplyTensor> replicate(protocol::Command cmd) {
    cmd.holder = ctx_.session;
    cmd.pid = ::getpid();
    cmd.node = ctx_.node;
    if (lease_.held()) {
      try {
        auto c = ctx_.waits.acquire();  // held through the copies: not a short call's
        if (replicator_) return replicator_(*c, cmd);
      } catch (const NotLeader&) {
        // lost the lease meanwhile: the new leader serves it below
      }
    }
    return exchange(std::move(cmd)).tensors.value_or(std::vector<protocol::ReplyTensor>{});
  }
  using Replicate = std::function<std::vector<protocol::ReplyTensor>(redis::Connection&, const protocol::Command&)>;
  // The allocator of record's replicate (the core's; set before any call).
  void set_replicator(Replicate r) { replicator_ = std::move(r); }

  // acquire() of the reader's device's replica of `name` (device
  // `device_uuid`) when it is current, else of `name` itself (one script).
  Opened acquire_local(std::string_view name, std::optional<DType> dtype, const std::string& device_uuid,
                       Holdings::Record cached) {
    ::memcuda::validate_name(name);
    std::string cgen, cver;
    if (cached) {
      cgen = std::to_string(cached->generation);
      cver = std::to_string(cached->event_version);
    }
    auto r = store::acquire_local(*ctx_.pool.acquire(), ctx_.keys, name, device_uuid, ctx_.session,
                                  dtype ? to_string(*dtype) : std::string_view(), ctx_.node, "", false, cgen, cver);
    const std::string taken = r.is("replica") ? replica_name(device_uuid, name) : std::string(name);
    if (r.is("replica") || r.is("noreplica")) r.status = "ok";
    return opened(r, taken, dtype, std::move(cached));
  }

  // A fleet node's get: the tensor itself when it is on this node, else
  // this node's replica of it when current, else the node's allocator of
  // record pulls it first (fleet/node_service.hpp) and the get runs again.
  Opened acquire_in_fleet(std::string_view name, std::optional<DType> dtype) {
    const std::string want = dtype ? std::string(to_string(*dtype)) : std::string();
    const std::string scope = node_scope(ctx_.node);  // the node's replica: the machine's, not the container's
    auto once = [&] {
      return store::acquire_local(*ctx_.pool.acquire(), ctx_.keys, name, scope, ctx_.session, want, ctx_.node, "",
                                  false, {}, {}, true);
    };
    auto r = once();
    for (int tries = 0; r.is("node") && tries < 2; ++tries) {  // a publish between pull and get: once more
      protocol::Command cmd;
      cmd.op = protocol::Op::pull;
      cmd.name = std::string(name);
      cmd.holder = ctx_.session;
      cmd.node = ctx_.node;
      exchange(std::move(cmd));
      r = once();
    }
    const std::string taken = r.is("replica") ? replica_name(scope, name) : std::string(name);
    if (r.is("replica") || r.is("noreplica")) r.status = "ok";
    return opened(r, taken, dtype, nullptr);
  }

  // A fleet node's batch get: its allocator of record pulls every name of
  // another node's (in commands of at most kPullChunk names, so that none
  // holds the control loop long). A name's refusal is not thrown: the get of
  // each name that follows pulls what is still missing again, and says why.
  // -> the names of the commands nobody answered (NotLeader), with that
  // error: pulling them one by one would wait as long again for each.
  std::map<std::string, std::exception_ptr> pull_many(const std::vector<std::string>& names) {
    std::map<std::string, std::exception_ptr> unanswered;
    for (std::size_t at = 0; at < names.size(); at += kPullChunk) {
      protocol::Command cmd;
      cmd.op = protocol::Op::pull;
      cmd.names.assign(names.begin() + static_cast<std::ptrdiff_t>(at),
                       names.begin() + static_cast<std::ptrdiff_t>(std::min(names.size(), at + kPullChunk)));
      cmd.holder = ctx_.session;
      cmd.node = ctx_.node;
      const std::vector<std::string> asked = cmd.names;
      try {
        exchange(std::move(cmd));
      } catch (const IoError&) {
        throw;
      } catch (const NotLeader&) {
        for (const auto& n : asked) unanswered.emplace(n, std::current_exception());
      } catch (const Error&) {
        // each name's get below
      }
    }
    return unanswered;
  }

  // The record an acquire script answered (the cached one for 'same'),
  // its reference adopted; a refusal throws.
  Opened opened(const store::Answer& r, const std::string& name, std::optional<DType> dtype,
                Holdings::Record cached) {
    TensorInfo t;
    Holdings::Record read;
    if (cached && r.is("same")) {
      t = *cached;
      t.refcount = reply_int(r[1]);
    } else {
      t = acquired(ctx_, lease_, alloc_, r, name, dtype, ctx_.session);
      auto keep = std::make_shared<TensorInfo>(t);
      keep->holders.clear();  // changes all the time; reg.info() has the truth
      read = std::move(keep);
    }
    return adopt_reference(std::move(t), std::move(read));
  }

  void remove(std::string_view name) {
    ::memcuda::validate_name(name);
    const auto& k = ctx_.keys;
    auto c = ctx_.pool.acquire();
    auto r = store::remove(*c, k, name, ctx_.session);
    const std::string& st = r.status;
    if (st == "notfound") throw NotFound("no tensor named '" + std::string(name) + "'");
    if (st == "stray") throw NotFound("no tensor named '" + std::string(name) + "': " + stray_record(k.tensor(name), r[1].str()));
    if (st == "free") alloc_.free_unlinked(*c, reply_u64(r[1]), true);
    else if (st != "ok" && st != "queued") unexpected_status("remove", st);
  }

  // Drops this session's reference now, on the caller's thread (a client
  // call that failed after taking it; destructors use the ReleaseQueue).
  void release_now(const std::string& name, std::uint64_t gen) noexcept {
    try {
      auto c = ctx_.pool.acquire();
      alloc_.release(*c, name, gen, ctx_.session, "");
    } catch (const std::exception& e) {
      log(LogLevel::warn, "release of '" + name + "': " + e.what());
    }
  }

  // Stores a producer's event handle for this generation; returns the new
  // event version. Throws StaleHandle when the name moved on.
  std::uint64_t publish_event(const std::string& name, std::uint64_t gen, const std::string& handle) {
    auto c = ctx_.pool.acquire();
    auto v = store::publish_event(*c, ctx_.keys, name, gen, handle);
    if (v < 0)
      throw StaleHandle("cannot publish '" + name + "' generation " + std::to_string(gen) +
                        ": the name was removed or re-created");
    return static_cast<std::uint64_t>(v);
  }

  // The event handle last published for this generation ("" when none).
  std::string published_event(const std::string& name, std::uint64_t gen) {
    auto c = ctx_.pool.acquire();
    auto r = store::read_fields(*c, ctx_.keys.tensor(name), store::field::generation, store::field::event_handle);
    if (r[0].is_nil() || reply_u64(r[0]) != gen)
      throw StaleHandle("'" + name + "' generation " + std::to_string(gen) + " is no longer registered");
    return r[1].is_nil() ? std::string() : std::string(r[1].str());
  }

  std::optional<std::uint64_t> current_generation(std::string_view name) {
    auto c = ctx_.pool.acquire();
    auto r = store::read_generation(*c, ctx_.keys, name);
    if (r.is_nil()) return std::nullopt;
    return std::stoull(std::string(r.str()));
  }

  std::optional<TensorInfo> info(std::string_view name) {
    ::memcuda::validate_name(name);
    auto c = ctx_.pool.acquire();
    auto r = store::read_record(*c, ctx_.keys.tensor(name));
    if (r.size() == 0) return std::nullopt;
    return protocol::decode_record(fields_from_reply(r.view()));
  }

  // `unreadable`, when given, counts the records skipped as unreadable.
  std::vector<TensorInfo> list(std::string_view pattern, std::uint64_t* unreadable = nullptr) {
    std::vector<TensorInfo> out;
    std::string after;
    do {
      auto page = list_page(pattern, after, kListPage, unreadable);
      for (auto& t : page.tensors) out.push_back(std::move(t));
      after = std::move(page.next);
    } while (!after.empty());
    return out;
  }

  // One page of a listing: the records of up to `limit` names under the
  // glob's literal prefix that sort after `after`, those the glob matches,
  // in name order; `next` is where the next page starts ("" at the end).
  // Memory and time are those of one page, whatever the registry holds.
  static constexpr std::size_t kListPage = 1000;
  ListPage list_page(std::string_view pattern, std::string_view after, std::size_t limit,
                     std::uint64_t* unreadable = nullptr) {
    if (limit == 0) throw InvalidArgument("list: a page of 0 names");
    const std::string pat(pattern.empty() ? "*" : pattern);
    auto c = ctx_.pool.acquire();
    auto names = names_page(*c, ctx_.keys, glob_literal_prefix(pat), after, limit);
    ListPage page;
    if (names.size() == limit) page.next = names.back();
    std::vector<std::string> selected;
    for (auto& n : names)
      if (::fnmatch(pat.c_str(), n.c_str(), 0) == 0) selected.push_back(std::move(n));
    if (!selected.empty()) read_records(ctx_.pool, *c, ctx_.keys, selected, page.tensors, unreadable);
    return page;
  }

  // Blocks until `name` is ready or the timeout passes, without polling:
  // the waiter registers a private list in the name's waiter set, and the
  // create script pushes the generation to every registered list.
  bool wait(std::string_view name, std::chrono::milliseconds timeout) {
    ::memcuda::validate_name(name);
    auto c = ctx_.waits.acquire();
    const std::string wl = ctx_.keys.wait_list(ctx_.session, ++seq_);
    const std::string ws = ctx_.keys.waiters(name);
    store::add_waiter(*c, ws, wl, std::to_string(timeout.count() + 60000));
    auto st = store::read_state(*c, ctx_.keys, name);
    bool ready = !st.is_nil() && st.str() == to_string(TensorState::ready);
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!ready) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      auto r = store::pop_wait(*c, wl, left);
      if (r.is_nil()) continue;
      auto s2 = store::read_state(*c, ctx_.keys, name);
      ready = !s2.is_nil() && s2.str() == to_string(TensorState::ready);
    }
    store::remove_waiter(*c, ws, wl);
    return ready;
  }

  LeaderInfo leader_info() {
    auto c = ctx_.pool.acquire();
    return read_leader(*c);
  }

  LeaderInfo read_leader(redis::Connection& c) {
    LeaderInfo l;
    auto rs = store::read_lease(c, ctx_.keys);
    if (rs[0].is_nil()) return l;
    std::string tok(rs[0].str());
    l.present = true;
    l.epoch = std::stoull(tok.substr(0, tok.find(' ')));
    l.session = tok.substr(tok.find(' ') + 1);
    l.ttl_ms = rs[1].integer();
    l.is_self = l.session == ctx_.session;
    return l;
  }

  // Maps a tensor's allocation into this process (or finds our own): the
  // tensor's address and what keeps the mapping. Unavailable on another node.
  std::pair<void*, std::shared_ptr<void>> map(const TensorInfo& t) {
    if (!same_node(t.node, ctx_.node))
      throw Unavailable("tensor '" + t.name + "' lives on node " + t.node + ", this is " + ctx_.node);
    auto [base, keep] = Process::get().cache().resolve(t.owner, t.alloc_id, [&] {
      try {
        // By the record's kind, whatever this registry allocates with.
        return backend_for(t).open(t);
      } catch (const Error& e) {
        // A legacy IPC handle of a live owner in another pid namespace fails
        // as a dead owner's does (Lost), or with another CUDA error: say
        // which it is.
        const bool ipc_failure = dynamic_cast<const Lost*>(&e) || dynamic_cast<const CudaError*>(&e);
        if (record_kind(t) != alloc_kind::cuda_ipc || !ipc_failure) throw;
        auto c = ctx_.pool.acquire();
        if (auto ns = foreign_pid_namespace(ctx_, *c, t.owner))
          throw Unavailable("tensor '" + t.name + "' is a legacy CUDA IPC allocation of a process in another pid "
                            "namespace (" + *ns + ", this is " + pid_namespace_id() +
                            "): legacy CUDA IPC opens only within one pid namespace; allocate with "
                            "cuda_allocation=vmm (MEMCUDA_CUDA_ALLOCATION=vmm) to share across containers, or "
                            "run both processes in one pid namespace");
        throw;
      }
    });
    return {static_cast<char*>(base) + t.offset, std::move(keep)};
  }

 private:
  // Maps a tensor whose reference this process has just taken and records
  // the reference; gives it back when the mapping fails.
  // `read`: the record the script just sent, kept for the next get.
  Opened adopt_reference(TensorInfo t, Holdings::Record read = nullptr) {
    try {
      auto [p, keep] = map(t);
      holdings_.took(t, std::move(read));
      return {std::move(t), p, std::move(keep)};
    } catch (...) {
      release_now(t.name, t.generation);
      throw;
    }
  }

  Context& ctx_;
  LeaseView& lease_;
  OwnAllocator& alloc_;
  Holdings& holdings_;
  std::atomic<std::uint64_t> seq_{0};  // request and wait ids of this session
  // Names per pull command: 64 tensors of a 7B model are some 3 GB, a few
  // seconds of the control loop on a fast link.
  static constexpr std::size_t kPullChunk = 64;
  Replicate replicator_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
