// The orphan scan of a migration round (migration.hpp): which owners of
// records and of fd-shared allocations are dead, and which of their records
// are orphans to adopt, copy or give up; and the sweep of a settled dead
// owner's allocations Hash fields. The round decides what to do with what
// the scan found.
#pragma once

#include "memcuda/config.hpp"

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "memcuda/detail/fd/fd_source.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/gc/give_up.hpp"
#include "memcuda/detail/registry/lease/lease.hpp"
#include "memcuda/detail/registry/gc/sessions.hpp"
#include "memcuda/detail/registry/liveness.hpp"
#include "memcuda/detail/store/allocations.hpp"
#include "memcuda/detail/store/records.hpp"
#include "memcuda/detail/store/reply.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// Deletes the allocations Hash fields owned by the dead session `owner`
// except those whose key is one of `keep` (ipc handles of records, padded
// or not). Returns how many it deleted. The leader's migration round calls
// it for a dead owner all of whose records are settled.
inline std::size_t forget_allocations_of(redis::Connection& c, const Keys& k, const std::string& owner,
                                         const std::set<std::string>& keep) {
  std::set<std::string> kept;
  for (const auto& h : keep) kept.insert(vmm_key(h));
  std::vector<std::string> ops;
  for (const auto& [key, value] : store::read_allocations(c, k)) {
    auto e = store::decode_allocation(value);
    if (!e || e->owner != owner || kept.count(key)) continue;
    ops.insert(ops.end(), {"D", key});
  }
  if (ops.empty()) return 0;
  store::apply_allocations(c, k, ops);
  return ops.size() / 2;
}

// The owners named in the allocations Hash (the leader checks which died).
inline std::set<std::string> allocation_owners(redis::Connection& c, const Keys& k) {
  std::set<std::string> out;
  for (const auto& [key, value] : store::read_allocations(c, k))
    if (auto e = store::decode_allocation(value)) out.insert(e->owner);
  return out;
}

// What one round's scan found.
struct OrphanScan {
  std::set<std::string> still_used;  // ipc handles of dead owners that records still use
  std::set<std::string> seen;        // the ipc handle of every record scanned
  // Ipc handles that records of another live owner use (one that adopted
  // that allocation earlier and lives on): never adopted in place again.
  std::set<std::string> live_used;
  std::map<std::string, bool> dead;  // owner -> dead
  std::set<std::string> unsettled;   // dead owners with a record left for a later round
  std::vector<TensorInfo> orphans;
  // Unlinked records of dead owners without references: frees their owner
  // never ran (the free command may still wait in the lifecycle list).
  std::vector<std::uint64_t> frees;
  std::uint64_t migrated = 0, lost = 0;
};

// Whether a record's owner is dead, from its fields {owner, owner_pid,
// node, state, ipc_handle, fd_source}.
inline bool owner_dead(Context& ctx, redis::Connection& c, const std::string& owner, const redis::Reply& fields) {
  std::int64_t pid = 0;
  std::string foreign;  // the owner's fd server in another pid namespace: its pid means nothing here
  try {
    if (!fields[1].is_nil()) pid = reply_int(fields[1]);
    if (!fields[5].is_nil()) foreign = decode_fd_source(fields[5].str()).source.address;
    if (owner_pid_is_ours(foreign)) foreign.clear();
  } catch (const std::exception&) {  // unreadable: judged by the session alone
    pid = 0;
  }
  return !owner_alive(ctx, c, owner, foreign.empty() ? pid : 0, foreign);
}

// Reads every record's owner; a dead owner's ready records are orphans.
inline void scan_records(Context& ctx, Lease& lease, redis::Connection& c, const std::string& token,
                         OrphanScan& scan) {
  auto rkeys = record_keys(c, ctx.keys);
  if (rkeys.empty()) return;
  std::vector<redis::Command> cmds;
  namespace f = store::field;
  for (const auto& k : rkeys)
    cmds.push_back(store::read_fields_cmd(k, {f::owner, f::owner_pid, f::node, f::state, f::ipc_handle, f::fd_source}));
  std::vector<std::exception_ptr> errs;  // a key of the wrong type is GC's to quarantine, not the round's end
  auto rs = c.pipeline(cmds, &errs);
  for (std::size_t i = 0; i < rkeys.size(); ++i) {
    if (rs[i].is_error()) continue;
    if (!rs[i][4].is_nil()) scan.seen.insert(std::string(rs[i][4].str()));
    if (rs[i][0].is_nil() || rs[i][2].is_nil() || rs[i][3].is_nil()) continue;
    std::string owner(rs[i][0].str());
    if (owner == ctx.session || !same_node(rs[i][2].str(), ctx.node)) continue;
    if (!scan.dead.count(owner)) scan.dead[owner] = owner_dead(ctx, c, owner, rs[i]);
    if (!scan.dead[owner]) {
      if (!rs[i][4].is_nil()) scan.live_used.insert(vmm_key(rs[i][4].str()));
      continue;
    }
    if (rs[i][3].str() != to_string(TensorState::ready)) {
      scan.unsettled.insert(owner);  // not ours to judge: keep its memory
      continue;
    }
    auto r = store::read_record(c, rkeys[i]);
    if (r.size() == 0) continue;
    TensorInfo t;
    try {
      t = protocol::decode_record(fields_from_reply(r.view()));
    } catch (const ProtocolError& e) {
      log(LogLevel::warn, std::string("orphan scan: skipping a corrupt record: ") + e.what());
      scan.unsettled.insert(owner);
      continue;
    }
    if (t.refcount <= 0 && rkeys[i] == ctx.keys.removed(t.generation)) {
      scan.frees.push_back(t.generation);  // nothing to adopt: its block is free wherever its allocation went
      continue;
    }
    if (t.borrowed) {  // its owner's own buffer: lost with it, never adopted or copied
      if (give_up_borrowed(ctx, lease, c, token, t)) ++scan.lost;
      continue;
    }
    scan.orphans.push_back(std::move(t));
  }
}

// Owners of cuda_vmm_fd allocations that no record names any more (empty
// slabs of a dead leader): their fields go in the sweep, so that standbys
// close those fds. And dead owners of no record at all: their sweep takes
// them off memcuda:owners.
inline void judge_other_owners(Context& ctx, redis::Connection& c, std::vector<std::string>& owners,
                               OrphanScan& scan) {
  for (const auto& owner : allocation_owners(c, ctx.keys)) owners.push_back(owner);
  for (const auto& owner : owners) {
    if (owner == ctx.session || scan.dead.count(owner)) continue;
    scan.dead[owner] = !owner_alive(ctx, c, owner, 0);
  }
  // An owner seen in a record that memcuda:owners lacks (a record of an
  // older version) is written there, so that its death triggers a scan.
  if (scan.dead.empty()) return;
  std::vector<redis::Command> add;
  for (const auto& [owner, is_dead] : scan.dead) add.push_back(store::add_owner_cmd(ctx.keys, owner));
  std::vector<std::exception_ptr> errs;
  c.pipeline(add, &errs);
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
