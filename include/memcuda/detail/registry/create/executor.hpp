// The allocator of record's side of the lifecycle list: executes one
// command (create, get, del, free, create_many, replicate, pull) for a JSON client or another registry
// and builds the reply. The registry's thread calls it, on its own
// connection, while this process holds the lease.
#pragma once

#include "memcuda/config.hpp"

#include <functional>
#include <vector>
#include <string>

#include "memcuda/detail/registry/acquire_outcome.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/create/allocator.hpp"
#include "memcuda/detail/registry/create/batch_allocator.hpp"
#include "memcuda/detail/registry/create/replicator.hpp"
#include "memcuda/detail/registry/index_repair.hpp"
#include "memcuda/detail/registry/lease/lease.hpp"
#include "memcuda/detail/store/records.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class Executor {
 public:
  Executor(Context& ctx, Lease& lease, Allocator& alloc, Replicator& replicator)
      : ctx_(ctx), lease_(lease), alloc_(alloc), replicator_(replicator) {}

  // Whether running `op` again after a failure whose outcome is unknown
  // (the link broke mid-call) is safe: a create carries its create_id and
  // the script replays it (a create_many: one per entry, from its id; a
  // replicate finds its replicas current or makes them again); the others
  // take or drop a reference.
  static bool idempotent(protocol::Op op) {
    return op == protocol::Op::create || op == protocol::Op::create_many || op == protocol::Op::replicate ||
           op == protocol::Op::pull;
  }

  // A command that failed on a key of the wrong type or format (schema.hpp)
  // runs again once the keys are repaired; failing again, it says so.
  // A fleet node's pull (fleet/node_service.hpp; set before any command).
  using Pull = std::function<std::vector<protocol::ReplyTensor>(redis::Connection&, const std::vector<std::string>&)>;
  void set_pull(Pull p) { pull_ = std::move(p); }

  protocol::Reply execute(redis::Connection& c, const protocol::Command& cmd) {
    try {
      return execute_once(c, cmd);
    } catch (const ReplyError& e) {
      if (!schema::is_fault(e)) throw;
      index_repair::check(c, ctx_, lease_.current().first);
    }
    try {
      return execute_once(c, cmd);
    } catch (const ReplyError& e) {
      if (!schema::is_fault(e)) throw;
      throw schema::explain(e, std::string(to_string(cmd.op)) + " '" + cmd.name + "'");
    }
  }

  protocol::Reply execute_once(redis::Connection& c, const protocol::Command& cmd) {
    if (MEMCUDA_FAULT("executor.execute")) throw ConnectionError("fault point executor.execute");
    protocol::Reply rep;
    rep.id = cmd.id;
    rep.id_is_number = cmd.id_is_number;
    rep.op = cmd.op_spelled_delete ? "delete" : std::string(to_string(cmd.op));
    if (cmd.op != protocol::Op::create_many || !cmd.name.empty()) rep.name = cmd.name;
    auto [token, epoch] = lease_.current();
    const auto& k = ctx_.keys;
    switch (cmd.op) {
      case protocol::Op::create: {
        auto cr = alloc_.create(c, cmd);
        rep.generation = cr.generation;
        rep.refcount = cr.refcount;
        break;
      }
      case protocol::Op::get: {
        refuse_session_holder(cmd);
        const std::string holder = holder_of(cmd);
        auto r = store::acquire(c, k, cmd.name, holder, "", ctx_.node, token);
        auto t = acquired(ctx_, lease_, alloc_, r, cmd.name, std::nullopt, holder_of(cmd));
        rep.generation = t.generation;
        rep.refcount = t.refcount;
        break;
      }
      case protocol::Op::release: {
        refuse_session_holder(cmd);
        std::uint64_t gen = cmd.generation.value_or(0);
        if (!gen) {
          auto g = store::read_generation(c, k, cmd.name);
          if (g.is_nil()) throw NotFound("no tensor named '" + cmd.name + "'");
          gen = std::stoull(std::string(g.str()));
        }
        rep.refcount = alloc_.release(c, cmd.name, gen, holder_of(cmd), token);
        rep.generation = gen;
        break;
      }
      case protocol::Op::create_many: {
        auto made = BatchAllocator::create_many(alloc_, c, cmd);
        rep.tensors.emplace();
        for (std::size_t i = 0; i < made.size(); ++i)
          rep.tensors->push_back({cmd.tensors[i].name, made[i].generation, made[i].refcount});
        break;
      }
      case protocol::Op::replicate:
        rep.tensors = replicator_.run(c, cmd);
        break;
      case protocol::Op::pull:
        if (!pull_) throw InvalidArgument("pull: this registry is not in a fleet (RegistryOptions::fleet)");
        rep.tensors = pull_(c, cmd.names.empty() ? std::vector<std::string>{cmd.name} : cmd.names);
        break;
      case protocol::Op::free: {
        // Sent by the release that dropped a tensor's last reference, which
        // left its record unlinked with refcount 0. Anything else (a live
        // tensor's generation) would free memory in use: refused.
        if (!cmd.generations.empty()) {
          free_many(c, cmd.generations);
          break;
        }
        const std::uint64_t gen = cmd.generation.value_or(0);
        auto rc = store::read_unlinked_refcount(c, k, gen);
        if (rc.is_nil() || rc.str() != "0")
          throw InvalidArgument("free of generation " + std::to_string(gen) +
                                ": no unlinked tensor of that generation without references (free is sent by "
                                "the release that dropped a tensor's last reference; use delete to release)");
        alloc_.free_unlinked(c, gen);
        rep.generation = cmd.generation;
        break;
      }
    }
    if (MEMCUDA_FAULT("executor.after_execute")) throw ConnectionError("fault point executor.after_execute");
    return rep;
  }

 private:
  // A batch remove's frees: each generation as a single free, but read in
  // one pipeline; one that is not an unlinked record without references is
  // skipped (logged), never freed.
  void free_many(redis::Connection& c, const std::vector<std::uint64_t>& gens) {
    std::vector<redis::Command> rcs;
    for (auto g : gens) rcs.push_back(store::read_unlinked_refcount_cmd(ctx_.keys, g));
    std::vector<std::exception_ptr> errs;
    auto rc = c.pipeline(rcs, &errs);
    std::uint64_t refused = 0;
    std::vector<redis::Command> dels;  // the records of what this process owned: one pipeline
    for (std::size_t i = 0; i < gens.size(); ++i) {
      if (rc[i].is_error() || rc[i].is_nil() || rc[i].str() != "0") {
        ++refused;
        continue;
      }
      if (alloc_.owns(gens[i])) {
        alloc_.free_unlinked(c, gens[i], true);
        dels.push_back(store::delete_record_cmd(ctx_.keys.removed(gens[i])));
      } else {
        alloc_.free_unlinked(c, gens[i]);
      }
    }
    if (!dels.empty()) c.pipeline(dels, &errs);
    if (refused)
      log(LogLevel::warn, "free: skipped " + std::to_string(refused) + " of " + std::to_string(gens.size()) +
                              " generation(s) that are not unlinked tensors without references");
  }

  // A registry session's references belong to its process: only it drops
  // them (its release queue), and it takes them with its own scripts, never
  // through this list. A JSON command naming a session as its holder could
  // drop a live process's reference and free memory it still uses.
  static void refuse_session_holder(const protocol::Command& cmd) {
    if (cmd.holder && HolderId::is_session_id(*cmd.holder))
      throw InvalidArgument("holder '" + *cmd.holder + "' is a registry session: a JSON " +
                            std::string(to_string(cmd.op)) +
                            " cannot take or drop a registry's references (use your own holder: your pid, "
                            "\"pid\": N, or a name of your own)");
  }

  Context& ctx_;
  Lease& lease_;
  Allocator& alloc_;
  Replicator& replicator_;
  Pull pull_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
