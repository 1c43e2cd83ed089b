// Sessions and garbage collection. Every registry keeps a session key
// alive (refresh(), from its heartbeat thread); the allocator of record
// drops the references of dead holders (expired sessions, JSON clients
// whose pid is gone), frees what that releases and prunes the session index.
#pragma once

#include "memcuda/config.hpp"

#include <unistd.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "memcuda/detail/backend/process_cache.hpp"
#include "memcuda/detail/process/process.hpp"
#include "memcuda/detail/registry/gc/replica_sweep.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/create/allocator.hpp"
#include "memcuda/detail/registry/index_repair.hpp"
#include "memcuda/detail/registry/liveness.hpp"
#include "memcuda/detail/registry/inbox.hpp"
#include "memcuda/detail/store/name_index.hpp"
#include "memcuda/detail/store/allocations.hpp"
#include "memcuda/detail/store/indexes.hpp"
#include "memcuda/detail/store/quarantine.hpp"
#include "memcuda/detail/store/records.hpp"
#include "memcuda/detail/store/release_scripts.hpp"
#include "memcuda/detail/store/scripts.hpp"
#include "memcuda/detail/store/sessions.hpp"
#include "memcuda/detail/store/reply.hpp"
#include "memcuda/detail/store/schema_repair.hpp"
#include "memcuda/protocol/session.hpp"
#include "memcuda/stats.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// Every record key: the named tensors and the unlinked-but-held ones. Reads
// everything: only for events (a dead allocator of record), never a period.
inline std::vector<std::string> record_keys(redis::Connection& c, const Keys& keys) {
  std::vector<std::string> out;
  std::string after;
  for (;;) {
    auto page = names_page(c, keys, "", after, 10000);
    for (const auto& n : page) out.emplace_back(keys.tensor(n));
    if (page.size() < 10000) break;
    after = page.back();
  }
  std::string cursor = "0";
  do {
    auto r = store::scan_unlinked(c, keys, cursor, 1000);
    cursor = std::string(r[0].str());
    for (std::size_t i = 0; i < r[1].size(); ++i) out.emplace_back(r[1][i].str());
  } while (cursor != "0");
  return out;
}

class Sessions {
 public:
  // How long holders may take to re-register after Redis lost its data
  // (the registry's thread retries that long) before unclaimed records are freed.
  static constexpr std::int64_t kRepublishGraceMs = 30000;

  Sessions(Context& ctx, Allocator& alloc) : ctx_(ctx), alloc_(alloc) {}

  // The session value (protocol/session.hpp).
  std::string session_value() const {
    std::lock_guard lk(registered_mu_);
    return protocol::encode_session({::getpid(), ctx_.node, ctx_.started_ms, ctx_.opts.control_thread,
                                     pid_namespace_id(), ctx_.live ? ctx_.live->field() : std::string(),
                                     registered_});
  }

  // The Redis server on which this process has registered what it holds
  // (its first beat's; after a switch, the new one once Recovery ran there):
  // the next refresh says so, and the owner's held frees wait for it.
  void registered_on(const std::string& server) {
    std::lock_guard lk(registered_mu_);
    registered_ = server;
  }
  void registered_first(const std::string& server) {
    std::lock_guard lk(registered_mu_);
    if (registered_.empty()) registered_ = server;
  }

  // Announces (and refreshes) this registry's session: a key that expires
  // session_ttl after the last refresh, so a killed process's session ends.
  // Returns false when the key was gone before this refresh (Redis lost
  // its data, or this process was stopped past its TTL): the caller then
  // re-registers what this process owns and holds (Recovery).
  bool refresh(redis::Connection& c, bool repaired = false) {
    std::vector<std::exception_ptr> errs;  // an index of the wrong type: the leader's check moves it aside
    auto r = store::refresh_session(c, ctx_.keys, ctx_.session, session_value(), ctx_.opts.session_ttl, &errs);
    const std::string own = ctx_.keys.session(ctx_.session);  // of the wrong type: moved aside, written again
    if (errs[0] && !repaired && schema::wrong_type(errs[0]) && schema::repair_own(c, ctx_.keys, own, "string"))
      return refresh(c, true);  // false: the caller re-registers what this process holds
    if (errs[0]) std::rethrow_exception(errs[0]);
    return !r[0].is_nil();
  }

  void end(redis::Connection& c) {
    store::end_session(c, ctx_.keys, ctx_.session);
  }

  // Live sessions of this node, of other processes, that may become the
  // allocator of record (they run the control thread): the standbys a
  // stopping leader hands over to. Another registry of this same process
  // is none: it would judge this process alive until it exits, and then
  // die with it.
  std::vector<std::string> standby_sessions(redis::Connection& c) {
    auto members = store::session_members(c, ctx_.keys);
    std::vector<std::string> ids;
    std::vector<redis::Command> ex;
    for (std::size_t i = 0; i < members.size(); ++i) {
      std::string id(members[i].str());
      if (id == ctx_.session) continue;
      ex.push_back(store::read_session_cmd(ctx_.keys, id));
      ids.push_back(std::move(id));
    }
    std::vector<std::string> out;
    if (ex.empty()) return out;
    std::vector<std::exception_ptr> errs;
    auto r = c.pipeline(ex, &errs);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (r[i].is_error() || r[i].is_nil() || session_proves_death(r[i].str(), ctx_.node)) continue;
      try {
        auto s = protocol::decode_session(r[i].str());
        const bool same_process = s.pid == ::getpid() && s.pid_ns == pid_namespace_id();
        if (s.allocator_capable && same_node(s.node, ctx_.node) && !same_process) out.push_back(ids[i]);
      } catch (const std::exception&) {  // unreadable: not a standby we can count on
      }
    }
    return out;
  }
  std::size_t standbys(redis::Connection& c) { return standby_sessions(c).size(); }

  // Whether every standby holds the fd of every cuda_vmm_fd allocation:
  // its progress marker names the allocations Hash's current version (no
  // Hash: nothing to hold).
  bool standbys_synced(redis::Connection& c) {
    auto v = store::read_allocations_version(c, ctx_.keys);
    if (v.is_nil()) return true;
    for (const auto& id : standby_sessions(c)) {
      auto m = store::read_standby_synced(c, ctx_.keys, id);
      if (m.is_nil() || m.str() != v.str()) return false;
    }
    return true;
  }

  std::uint64_t live(redis::Connection& c) {
    std::vector<std::exception_ptr> errs;  // an index of the wrong type counts none (index_repair.hpp)
    const auto members = store::session_members_checked(c, ctx_.keys, &errs);
    if (members.is_error() || members.size() == 0) return 0;
    std::vector<redis::Command> ex;
    for (std::size_t i = 0; i < members.size(); ++i) ex.push_back(store::read_session_cmd(ctx_.keys, members[i].str()));
    std::uint64_t n = 0;
    for (auto& r : c.pipeline(ex, &errs)) n += !r.is_error() && !r.is_nil() && !session_proves_death(r.str(), ctx_.node);
    return n;
  }

  // Drops every reference held by a dead session or a dead JSON client,
  // frees what that releases, and prunes the session index. The work is
  // proportional to what changed: the holders are judged (memcuda:holders),
  // a dead one's references are read from its own index, and a bounded
  // slice of the records is swept per round for what no index names
  // (sweep()). Safe from any process (the scripts are atomic); the
  // allocator of record runs it every gc_interval with its lease token.
  GcReport collect(redis::Connection& c, const std::string& token) {
    GcReport rep;
    const Keys& keys = ctx_.keys;
    index_repair::check(c, ctx_, token);  // a key of the wrong type: moved aside, rebuilt
    // State-dict records first: a dead holder's last reference to an
    // unlinked record deletes it, and the holders' pass then drops its pins.
    collect_dicts(c, rep);
    collect_holders(c, token, rep);
    sweep_replicas(c, ctx_, alloc_, token);
    sweep(c, rep);
    auto members = store::session_members(c, keys);
    std::vector<std::string> all;
    for (std::size_t i = 0; i < members.size(); ++i) all.emplace_back(members[i].str());
    if (!all.empty()) {
      std::vector<redis::Command> ex;
      for (const auto& m : all) ex.push_back(store::read_session_cmd(keys, m));
      std::vector<std::exception_ptr> errs;
      auto r = c.pipeline(ex, &errs);
      std::vector<std::string> gone, live;
      for (std::size_t i = 0; i < all.size(); ++i) {
        if (r[i].is_error()) continue;  // not a session value: not ours to judge
        (r[i].is_nil() || session_proves_death(r[i].str(), ctx_.node) ? gone : live).push_back(all[i]);
      }
      for (const auto& g : gone) {
        // A key left by a process proven gone goes now rather than at expiry.
        store::end_session(c, keys, g);
        // Its standby progress marker (standby.hpp) goes with it.
        store::clear_standby_synced(c, keys, g);
        ++rep.sessions_pruned;
        // Processes that mapped its memory stop keeping idle mappings of it,
        // so a dead exporter's device memory is released by the driver.
        Process::get().cache().forget_owner(g);
        for (const auto& l : live)
          if (l != ctx_.session) inbox::send(c, keys, l, inbox::Forget{g});
      }
    }
    return rep;
  }

 private:
  // Judges every holder that has an index of references and drops all the
  // references of the dead ones, a page of their index at a time (one
  // script per 1000 references).
  void collect_holders(redis::Connection& c, const std::string& token, GcReport& rep) {
    const Keys& keys = ctx_.keys;
    // Registry sessions are not listed in memcuda:holders (one call less per
    // get): memcuda:sessions names them.
    std::vector<std::exception_ptr> herrs;  // a set of the wrong type reads as empty (index_repair.hpp)
    auto hs = store::holders_and_sessions(c, keys, &herrs);
    std::map<std::string, bool> alive;
    for (const auto& set : hs)
      if (!set.is_error())
        for (std::size_t i = 0; i < set.size(); ++i) alive.emplace(std::string(set[i].str()), true);
    if (alive.empty()) return;
    judge(c, alive);
    for (const auto& [h, a] : alive) {
      if (a) continue;
      std::uint64_t dropped = 0, unlinked = 0;
      for (;;) {
        auto page = index_repair::refs_page(c, keys, h, kHolderPage);
        auto r = store::release_holder(c, keys, h, page, ctx_.session, token);
        if (!r.is("ok")) lease_fail(r);
        dropped += static_cast<std::uint64_t>(reply_int(r[1]));
        unlinked += static_cast<std::uint64_t>(reply_int(r[2]));
        for (std::size_t i = 3; i < r.size(); ++i) alloc_.free_unlinked(c, reply_u64(r[i]), true);
        if (page.size() < kHolderPage) break;
      }
      if (dropped) ++rep.dead_holders;  // a holder that held something (dead sessions count in sessions_pruned)
      rep.references_dropped += dropped;
      rep.tensors_freed += unlinked;
      if (dropped)
        log(LogLevel::info, "gc: dropped " + std::to_string(dropped) + " reference(s) of dead holder " + h + " (" +
                                std::to_string(unlinked) + " tensor(s) freed)");
    }
  }

  [[noreturn]] static void lease_fail(const store::Answer& r) {
    throw NotLeader("gc: the lease changed hands (now " + std::string(r.size() > 1 ? r[1].str() : "") + ")");
  }

  // A bounded slice of the records per round (kSweepPage names, then
  // unlinked records by SCAN): quarantines a key of the wrong type or a
  // record whose fields do not parse, frees a record republished after a
  // Redis restart that no holder claimed, and writes any holder's reference
  // its index lacks (a record of an older version). A whole pass over N
  // records takes N / kSweepPage rounds.
  void sweep(redis::Connection& c, GcReport& rep) {
    const Keys& keys = ctx_.keys;
    SweepAt at;
    {
      std::lock_guard lk(sweep_mu_);
      at = sweep_at_;
    }
    std::vector<std::string> names;
    if (!at.unlinked) {
      for (auto& n : names_page(c, keys, "", at.after, kSweepPage)) names.push_back(keys.tensor(n));
      if (names.size() < kSweepPage) at = SweepAt{{}, true, "0"};
      else at.after = keys.name_of(names.back());
    } else {
      auto r = store::scan_unlinked(c, keys, at.cursor, kSweepPage);
      at.cursor = std::string(r[0].str());
      for (std::size_t i = 0; i < r[1].size(); ++i) names.emplace_back(r[1][i].str());
      if (at.cursor == "0") at = SweepAt{};
    }
    {
      std::lock_guard lk(sweep_mu_);
      sweep_at_ = at;
    }
    if (names.empty()) return;
    std::vector<redis::Command> cmds, hk;
    for (const auto& k : names)
      cmds.push_back(store::read_fields_cmd(k, {store::field::name, store::field::generation, store::field::refcount,
                                                store::field::republished}));
    for (const auto& k : names) hk.push_back(store::field_names_cmd(k));
    // One bad key must not fail the round for all: an error reply (a key
    // of the wrong type) is that record's alone.
    std::vector<std::exception_ptr> e1, e2;
    auto ids = c.pipeline(cmds, &e1);
    auto fields = c.pipeline(hk, &e2);
    std::vector<redis::Command> index;
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (ids[i].is_error() || fields[i].is_error()) {
        quarantine_wrong_type(c, names[i], rep);
        continue;
      }
      if (ids[i][0].is_nil() || ids[i][1].is_nil()) continue;
      try {
        (void)reply_u64(ids[i][1]);
        if (!ids[i][2].is_nil() && reply_int(ids[i][2]) < 0) throw InvalidArgument("negative refcount");
        if (!ids[i][3].is_nil()) (void)reply_int(ids[i][3]);
      } catch (const std::exception& e) {
        if (quarantine::move(c, keys, names[i], name_of(names[i]), "gen:" + std::string(ids[i][1].str()),
                             std::string("unreadable record fields: ") + e.what()))
          ++rep.records_quarantined;
        continue;
      }
      const std::string name(ids[i][0].str()), gen(ids[i][1].str());
      if (free_unclaimed(c, names[i], name, gen, ids[i][2], ids[i][3], rep)) continue;
      for (std::size_t j = 0; j < fields[i].size(); ++j) {
        const std::string_view f = fields[i][j].str();
        if (!store::is_holder_field(f) || store::holder_of_field(f) == HolderId::kName) continue;
        const std::string h(store::holder_of_field(f));
        index.push_back(store::add_ref_cmd(keys, h, store::ref_member(gen, name)));
        // a session no longer in memcuda:sessions is listed here, so it is judged
        index.push_back(store::add_holder_cmd(keys, h));
      }
    }
    if (!index.empty()) {
      std::vector<std::exception_ptr> errs;
      c.pipeline(index, &errs);
      index_repair::redo_failed(c, keys, index, errs);  // an index of the wrong type: moved aside, written again
    }
  }

  // A record republished after Redis lost its data that no holder
  // re-registered (they died meanwhile) has no reference to release: once
  // the holders' re-registration window has passed, it is freed. True when
  // the record was such a one.
  bool free_unclaimed(redis::Connection& c, const std::string& record_key, const std::string& name,
                      const std::string& gen_text, redis::ReplyView refcount, redis::ReplyView republished,
                      GcReport& rep) {
    if (republished.is_nil() || refcount.is_nil() || reply_int(refcount) != 0 ||
        now_ms() - reply_int(republished) <= kRepublishGraceMs + ctx_.opts.session_ttl.count())
      return false;
    const Keys& keys = ctx_.keys;
    try {
      if (record_key == keys.tensor(name)) {
        auto r = store::remove(c, keys, name, ctx_.session);
        if (r.is("free")) alloc_.free_unlinked(c, reply_u64(r[1]), true);
      } else {
        alloc_.free_unlinked(c, std::stoull(gen_text));
      }
      ++rep.tensors_freed;
      log(LogLevel::info, "gc: freed '" + name + "': republished after a Redis restart, nobody re-registered");
    } catch (const ConnectionError&) {
      throw;
    } catch (const std::exception& e) {
      log(LogLevel::warn, "gc: freeing unclaimed '" + name + "': " + e.what());
    }
    return true;
  }

  // Sets alive[h] for every holder h of `alive` (all true on entry): a
  // registry session is alive while its key exists and does not prove its
  // process gone (a killed process of this node is dead before its key
  // expires); "pid:<n>" while process n exists ("pid:<n>@<ns>" of another
  // pid namespace than ours: always, its pid means nothing here); a state dict's pin
  // "@dict:<id>" while its record exists; other holders ("@name") always.
  void judge(redis::Connection& c, std::map<std::string, bool>& alive) {
    const Keys& keys = ctx_.keys;
    std::vector<std::string> sess, dicts;
    for (auto& [h, a] : alive) {
      HolderId id(h);
      if (id.is_session()) sess.push_back(h);
      else if (id.kind() == HolderId::Kind::pid) a = HolderId::pid_holder_alive(h, pid_namespace_inode());
      else if (h.starts_with(Keys::kDictHolder)) dicts.push_back(h);
    }
    std::vector<redis::Command> ex;
    for (const auto& h : sess) ex.push_back(store::read_session_cmd(keys, h));
    for (const auto& h : dicts) ex.push_back(store::exists_cmd(keys.dict_of_holder(h)));
    if (ex.empty()) return;
    std::vector<std::exception_ptr> errs;
    auto r = c.pipeline(ex, &errs);
    // A key that cannot be read (wrong type) proves nothing: alive.
    for (std::size_t i = 0; i < sess.size(); ++i)
      alive[sess[i]] = r[i].is_error() || (!r[i].is_nil() && !session_proves_death(r[i].str(), ctx_.node));
    for (std::size_t i = 0; i < dicts.size(); ++i)
      alive[dicts[i]] = r[sess.size() + i].is_error() || r[sess.size() + i].integer() == 1;
  }

  // Drops the references dead holders have to state-dict records, and
  // forgets the ids of records that are gone.
  void collect_dicts(redis::Connection& c, GcReport& rep) {
    const Keys& keys = ctx_.keys;
    auto ids = store::dict_ids(c, keys);
    if (ids.size() == 0) return;
    std::vector<std::string> rks, idv;
    std::vector<redis::Command> hk;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      idv.emplace_back(ids[i].str());
      rks.push_back(keys.dict(std::string_view(idv.back())));
      hk.push_back(store::field_names_cmd(rks.back()));
    }
    std::vector<std::exception_ptr> errs;
    auto fields = c.pipeline(hk, &errs);
    std::map<std::string, bool> alive;
    std::vector<std::pair<std::size_t, std::string>> refs;  // record index, holder
    for (std::size_t i = 0; i < rks.size(); ++i) {
      if (fields[i].is_error()) continue;  // not a dict record: left alone
      if (fields[i].size() == 0) {
        store::forget_dict_id(c, keys, idv[i]);
        continue;
      }
      for (std::size_t j = 0; j < fields[i].size(); ++j) {
        const std::string_view f = fields[i][j].str();
        if (!store::is_holder_field(f)) continue;
        const std::string h(store::holder_of_field(f));
        refs.emplace_back(i, h);
        alive.emplace(h, true);
      }
    }
    judge(c, alive);
    for (const auto& [i, h] : refs) {
      if (alive[h]) continue;
      if (store::release_dict(c, keys, idv[i], h, true).is("ok")) {
        ++rep.references_dropped;
        log(LogLevel::info, "gc: dropped the references of dead holder " + h + " to state dict record " + idv[i]);
      }
    }
  }

  // The name a record key is listed under ("" for an unlinked record).
  std::string name_of(const std::string& record_key) const { return ctx_.keys.name_of(record_key); }

  void quarantine_wrong_type(redis::Connection& c, const std::string& record_key, GcReport& rep) {
    const std::string type = store::key_type(c, record_key);
    if (type == "hash" || type == "none") return;  // changed meanwhile
    if (quarantine::move(c, ctx_.keys, record_key, name_of(record_key), "type:" + type,
                         "a " + type + " where a tensor record (a hash) belongs"))
      ++rep.records_quarantined;
  }

  static constexpr std::size_t kHolderPage = 1000;
  static constexpr std::size_t kSweepPage = 256;
  struct SweepAt {
    std::string after;      // the last name swept
    bool unlinked = false;  // sweeping the unlinked records (by SCAN) now
    std::string cursor = "0";
  };

  Context& ctx_;
  Allocator& alloc_;
  mutable std::mutex registered_mu_;  // leaf: guards registered_ only
  std::string registered_;
  std::mutex sweep_mu_;  // guards sweep_at_ only, never held across a Redis call
  SweepAt sweep_at_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
