// The client side of the batch operations (TensorRegistry::get_many,
// get_prefix, get_matching, create_many, remove_many, remove_prefix): one
// script (or, for a create served by another process, one command and one
// reply) per batch. Each name's refusal is reported on its own, and no
// path leaks a reference: every reference a batch took is either in a
// handle it returns or given back before it returns or throws.
#pragma once

#include "memcuda/config.hpp"

#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "memcuda/batch.hpp"
#include "memcuda/detail/backend/record_fd_batch.hpp"
#include "memcuda/detail/registry/core.hpp"
#include "memcuda/detail/registry/ops/shared_get.hpp"
#include "memcuda/detail/store/selection.hpp"
#include "memcuda/detail/registry/create/batch_allocator.hpp"
#include "memcuda/detail/store/reply.hpp"
#include "memcuda/detail/store/scripts.hpp"
#include "memcuda/protocol/record_desc.hpp"
#include "memcuda/shared_tensor.hpp"
#include "memcuda/detail/store/records.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {


class BatchClient {
 public:
  explicit BatchClient(std::shared_ptr<Core> core) : core_(std::move(core)), c_(*core_), ctx_(core_->ctx) {}

  // Takes a reference to every selected name in one script; each refused
  // name gets its error (dtype, when given, is checked for every name).
  BatchGetResult get(const Selection& sel, std::optional<DType> dtype) {
    const std::string dt = dtype ? std::string(to_string(*dtype)) : std::string();
    const auto r = store::acquire_many(*ctx_.pool.acquire(), ctx_.keys, sel, ctx_.session, ctx_.node, "", dt);
    BatchGetResult out;
    // Records first, then the maps: the fds of the allocations to open are
    // fetched a chunk at a time, one request per owner (record_fd_batch.hpp).
    std::vector<TensorInfo> taken;
    std::vector<std::string> remote;  // a fleet's: tensors of other nodes, read through this node's replicas
    for (std::size_t i = 0; i < r.size(); ++i) {
      redis::ReplyView e = r[i];
      std::string name(e[0].str());
      const std::string st(e[1].str());
      if (st == "node" && ctx_.opts.fleet) {
        remote.push_back(std::move(name));
        continue;
      }
      if (st != "ok" && st != "desc") {
        out.errors.emplace(name, refusal(e, name, dtype));
        continue;
      }
      // The reference is taken: from here it ends in a handle or is given back.
      // Any failure stays this name's: the other names' references must
      // still end in handles (bad_alloc included).
      std::uint64_t gen = 0;
      try {
        taken.push_back(store::decode_taken(e, st, gen));
      } catch (const std::exception& ex) {
        c_.client.release_now(name, gen);  // a corrupt record: give the reference back
        out.errors.emplace(name, current_error(ex));
      }
    }
    for (std::size_t i = 0; i < taken.size(); ++i) {
      if (i % kPrefetchChunk == 0) prefetch_chunk(taken, i);
      std::string name = taken[i].name;
      try {
        out.tensors.emplace(name, SharedTensor<void>(adopt(std::move(taken[i]))));  // adopt gives it back on failure
      } catch (const std::exception& ex) {
        out.errors.emplace(name, current_error(ex));
      }
    }
    if (!remote.empty()) get_remote(remote, dtype, out);
    return out;
  }

  // Another node's tensors of a fleet's batch: this node pulls them (one
  // command per chunk of names), then each is taken as a get takes it,
  // through the node's replica; keyed by the name asked for.
  void get_remote(const std::vector<std::string>& names, std::optional<DType> dtype, BatchGetResult& out) {
    const auto unanswered = c_.client.pull_many(names);
    for (const auto& name : names) {
      try {
        if (auto it = unanswered.find(name); it != unanswered.end()) std::rethrow_exception(it->second);
        out.tensors.emplace(name, SharedTensor<void>(handle_of(core_, c_.client.acquire(name, dtype, nullptr))));
      } catch (const IoError&) {
        throw;
      } catch (const std::exception& ex) {
        out.errors.emplace(name, current_error(ex));
      }
    }
  }

  // The fds of records [from, from + kPrefetchChunk), fetched ahead; never throws.
  static void prefetch_chunk(const std::vector<TensorInfo>& ts, std::size_t from) noexcept {
    try {
      std::vector<const TensorInfo*> chunk;
      for (std::size_t j = from; j < ts.size() && j < from + kPrefetchChunk; ++j) chunk.push_back(&ts[j]);
      prefetch_record_fds(chunk);
    } catch (...) {
      // the opens report their own failures
    }
  }

  // Creates every tensor of `specs`, all or nothing (docs/protocol.md,
  // "Batch operations"): in the allocator of record one pool pass and one
  // script, elsewhere one create_many command and one reply, then one
  // pipeline reading the records.
  std::map<std::string, SharedTensor<void>> create(const std::vector<TensorSpec>& specs) {
    std::map<std::string, SharedTensor<void>> out;
    if (specs.empty()) return out;
    protocol::Command cmd = command_for(specs);
    if (c_.lease.held()) {
      try {
        auto c = ctx_.pool.acquire();
        auto made = BatchAllocator::create_many(c_.alloc, *c, cmd);
        bool fresh = true;
        for (const auto& m : made) fresh = fresh && m.block.slab;
        if (fresh) {
          std::vector<std::pair<TensorInfo, void*>> ts;
          std::vector<std::shared_ptr<void>> keeps;
          for (auto& m : made) {
            c_.holdings.note(m.info.name, m.info.generation, +1);
            ts.emplace_back(m.info, static_cast<char*>(m.block.slab->base()) + m.info.offset);
            keeps.push_back(m.block.slab);
          }
          return handles(ts, keeps);
        }
        // A replay answered before (cannot happen on a fresh id): read the records below.
        std::vector<std::uint64_t> gens;
        for (const auto& m : made) gens.push_back(m.generation);
        return read_and_map(cmd, gens);
      } catch (const NotLeader&) {
        // lost the lease meanwhile: the new leader serves it below
      } catch (const IoError&) {
        // The same ids make a retry through the list a replay.
      }
    }
    protocol::Reply rep = request(cmd);
    std::vector<std::uint64_t> gens;
    if (!rep.tensors || rep.tensors->size() != cmd.tensors.size())
      throw InternalError("the create_many reply lists " + std::to_string(rep.tensors ? rep.tensors->size() : 0) +
                          " tensors, the command " + std::to_string(cmd.tensors.size()));
    for (const auto& t : *rep.tensors) gens.push_back(t.generation);
    return read_and_map(cmd, gens);
  }

  // Unlinks every selected name: a prefix a page of names per script (so
  // that Redis never runs one script over 100k names), names and a glob
  // in one script.
  BatchRemoveResult remove(const Selection& sel) {
    if (sel.mode != "prefix") return remove_once(sel);
    BatchRemoveResult out;
    std::string after;
    for (;;) {
      std::vector<std::string> page;
      {
        auto c = ctx_.pool.acquire();
        page = names_page(*c, ctx_.keys, sel.arg, after, kRemovePage);
      }
      if (page.empty()) break;
      after = page.back();
      auto part = remove_once(Selection{"names", "", page, {}});
      for (auto& n : part.removed) out.removed.push_back(std::move(n));
      for (auto& [n, e] : part.errors) out.errors.emplace(n, std::move(e));
      if (page.size() < kRemovePage) break;
    }
    return out;
  }

 private:
  static constexpr std::size_t kRemovePage = 1000;

  BatchRemoveResult remove_once(const Selection& sel) {
    const auto& k = ctx_.keys;
    auto c = ctx_.pool.acquire();
    redis::Reply r = store::remove_many(*c, k, sel, ctx_.session);
    BatchRemoveResult out;
    for (std::size_t i = 0; i < r.size(); ++i) {
      redis::ReplyView e = r[i];
      std::string name(e[0].str());
      const std::string st(e[1].str());
      if (st == "notfound" || st == "stray") {
        std::string why = st == "stray" ? ": " + stray_record(k.tensor(name), e[2].str()) : std::string();
        out.errors.emplace(name, error_of(NotFound("no tensor named '" + name + "'" + why)));
        continue;
      }
      if (st == "free") c_.alloc.free_unlinked(*c, reply_u64(e[2]), true);
      else if (st != "ok" && st != "queued") unexpected_status("remove_many", st);
      out.removed.push_back(std::move(name));
    }
    return out;
  }

  template <class E>
  static NameError error_of(const E& e) {
    return NameError{e.code(), e.what(), std::make_exception_ptr(e)};
  }

  // The exception being handled, as a NameError ("internal" when it is not
  // a memcuda::Error).
  static NameError current_error(const std::exception& ex) {
    const auto* me = dynamic_cast<const Error*>(&ex);
    return NameError{me ? me->code() : "internal", ex.what(), std::current_exception()};
  }

  // The error of a name the acquire script refused (as a get's).
  NameError refusal(redis::ReplyView e, const std::string& name, std::optional<DType> dtype) {
    try {
      store::throw_refused("acquire_many", e[1].str(), e.size() > 2 ? e[2] : e[1], name, dtype, ctx_.node);
    } catch (const std::exception& ex) {
      return current_error(ex);
    }
  }

  // Maps a tensor whose reference this process has just taken; gives the
  // reference back when that fails.
  std::shared_ptr<TensorHandle> adopt(TensorInfo t) {
    void* p = nullptr;
    std::shared_ptr<void> keep;
    try {
      std::tie(p, keep) = c_.client.map(t);
    } catch (...) {
      c_.client.release_now(t.name, t.generation);
      throw;
    }
    c_.holdings.note(t.name, t.generation, +1);
    return handle(std::move(t), p, std::move(keep));
  }

  // The handle of a noted reference; one whose constructor throws is given back.
  std::shared_ptr<TensorHandle> handle(TensorInfo t, void* p, std::shared_ptr<void> keep) {
    std::string name = t.name;
    const std::uint64_t gen = t.generation;
    try {
      return std::make_shared<TensorHandle>(core_, std::move(t), p, std::move(keep));
    } catch (...) {
      Core::release_later(core_, std::move(name), gen);
      throw;
    }
  }

  // Handles for noted references; when one fails, the rest are given back
  // too (those already made go with `out`).
  std::map<std::string, SharedTensor<void>> handles(std::vector<std::pair<TensorInfo, void*>>& ts,
                                                    std::vector<std::shared_ptr<void>>& keeps) {
    std::map<std::string, SharedTensor<void>> out;
    std::size_t i = 0;
    try {
      for (; i < ts.size(); ++i) {
        std::string name = ts[i].first.name;
        out.emplace(std::move(name), SharedTensor<void>(handle(std::move(ts[i].first), ts[i].second, keeps[i])));
      }
    } catch (...) {
      for (std::size_t j = i + 1; j < ts.size(); ++j)
        Core::release_later(core_, ts[j].first.name, ts[j].first.generation);
      throw;
    }
    return out;
  }

  // After the allocator of record created the batch for us: one pipeline
  // reads the records, each is mapped. Any failure gives back every
  // reference of the batch (the tensors stay, held by nobody but their
  // name when persistent) and throws.
  std::map<std::string, SharedTensor<void>> read_and_map(const protocol::Command& cmd,
                                                         const std::vector<std::uint64_t>& gens) {
    const std::size_t n = cmd.tensors.size();
    std::vector<redis::Command> reads;
    for (const auto& e : cmd.tensors) reads.push_back(store::read_record_cmd(ctx_.keys.tensor(e.name)));
    std::map<std::string, SharedTensor<void>> out;
    std::size_t i = 0;
    bool i_taken_over = false;
    try {
      std::vector<redis::Reply> rs;
      {
        auto c = ctx_.pool.acquire();
        rs = c->pipeline(reads);
      }
      for (; i < n; ++i) {
        i_taken_over = false;
        const std::string& name = cmd.tensors[i].name;
        if (rs[i].size() == 0) throw NotFound("tensor '" + name + "' vanished right after its creation");
        TensorInfo t = store::decode_hash(rs[i].view());
        if (t.generation != gens[i]) throw StaleHandle("tensor '" + name + "' was replaced right after its creation");
        i_taken_over = true;  // adopt(), then its handle, gives the reference back if anything throws
        out.emplace(name, SharedTensor<void>(adopt(std::move(t))));
      }
    } catch (const ConnectionError&) {
      throw;  // Redis away: GC drops the references if this process dies
    } catch (...) {
      // adopt() gave back entry i's reference when it threw after taking it
      // over; a failed read or check did not: give back i (then) and the
      // rest. (Giving i back twice would fail as "notholder".)
      for (std::size_t j = i + (i_taken_over ? 1 : 0); j < n; ++j)
        if (!out.count(cmd.tensors[j].name)) c_.client.release_now(cmd.tensors[j].name, gens[j]);
      throw;
    }
    return out;
  }

  protocol::Command command_for(const std::vector<TensorSpec>& specs) {
    protocol::Command cmd;
    cmd.op = protocol::Op::create_many;
    cmd.holder = ctx_.session;
    cmd.pid = ::getpid();
    cmd.node = ctx_.node;
    static std::atomic<std::uint64_t> seq{0};
    cmd.id = ctx_.session + ":b" + std::to_string(++seq);
    std::set<std::string_view> seen;
    for (const auto& s : specs) {
      ::memcuda::validate_name(s.name);
      ::memcuda::validate_shape(s.shape);
      (void)byte_size(s.dtype, s.shape);
      if (!seen.insert(s.name).second) throw InvalidArgument("create_many names '" + s.name + "' twice");
      protocol::CreateEntry e;
      e.name = s.name;
      e.dtype = s.dtype;
      e.shape = s.shape;
      e.backend = s.options.backend.value_or(ctx_.default_backend());
      if (*e.backend == BackendKind::cuda) {
        e.device = s.options.device.value_or(ctx_.opts.default_device);
#if MEMCUDA_HAS_CUDA()
        e.device_uuid = device_uuid(*e.device);
#else
        throw Unavailable("the cuda backend is not available: mem-cuda was built without the CUDA toolkit");
#endif
      }
      if (s.options.persistent) e.persistent = true;
      cmd.tensors.push_back(std::move(e));
    }
    // What every entry shares is said once, on the command (the 64 KiB
    // limit of a command then holds more tensors).
    auto hoist = [&](auto member, auto& top) {
      const auto& first = cmd.tensors.front().*member;
      for (const auto& e : cmd.tensors)
        if (e.*member != first) return;
      top = first;
      for (auto& e : cmd.tensors) (e.*member).reset();
    };
    hoist(&protocol::CreateEntry::backend, cmd.backend);
    hoist(&protocol::CreateEntry::device, cmd.device);
    hoist(&protocol::CreateEntry::device_uuid, cmd.device_uuid);
    return cmd;
  }

  // One create_many command on the lifecycle list and its one reply, on a
  // connection of the waiting pool and a reply list of its own.
  protocol::Reply request(protocol::Command cmd) {
    static std::atomic<std::uint64_t> seq{0};
    try {
      (void)protocol::encode_command(cmd);  // only the command's size is caught here, not the reply's
    } catch (const ProtocolError& e) {
      if (e.errc() != ProtocolErrc::too_large) throw;
      throw InvalidArgument("create_many of " + std::to_string(cmd.tensors.size()) +
                            " tensors does not fit one command (64 KiB of JSON) and is not served by this "
                            "process: split the batch, or create it in the allocator of record");
    }
    return c_.client.exchange(std::move(cmd), ctx_.keys.batch_reply(ctx_.session, ++seq));
  }

  std::shared_ptr<Core> core_;
  Core& c_;
  Context& ctx_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
