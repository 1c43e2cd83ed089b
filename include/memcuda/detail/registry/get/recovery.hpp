// After Redis lost its data (or this session's key expired while the
// process was stopped): write back the records of what this process owns
// (registry memory it allocated, buffers it shares without a copy) and set
// this session's references to what it holds.
#pragma once

#include "memcuda/config.hpp"

#include <map>
#include <string>
#include <vector>

#include "memcuda/detail/registry/get/holdings.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/get/borrowed.hpp"
#include "memcuda/detail/registry/get/dict_holds.hpp"
#include "memcuda/detail/registry/own_allocator.hpp"
#include "memcuda/detail/store/dict_scripts.hpp"
#include "memcuda/detail/store/records.hpp"
#include "memcuda/detail/store/recovery_scripts.hpp"
#include "memcuda/detail/store/sessions.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class Recovery {
 public:
  Recovery(Context& ctx, OwnAllocator& alloc, Borrowed& borrowed, Holdings& holdings, DictHolds& dicts)
      : ctx_(ctx), alloc_(alloc), borrowed_(borrowed), holdings_(holdings), dicts_(dicts) {}

  // Returns true when every reference found its record (false: some owner
  // has not republished yet; call again).
  bool run(redis::Connection& c) {
    const Keys& keys = ctx_.keys;
    std::uint64_t republished = 0;
    // Registry memory this process allocated, and buffers it shares
    // without a copy: both are its own to write back.
    // One freed since the snapshot is not written back: that would undo its remove.
    for (const auto& [t, persistent] : alloc_.owned_records())
      if (alloc_.owns(t.generation)) republished += !store::republish(c, keys, t, persistent).is("present");
    const auto shared = borrowed_.records();
    for (const auto& [t, persistent] : shared) republished += !store::republish(c, keys, t, persistent).is("present");
    // as the share script does: migration finds a dead owner's borrowed records through it
    if (!shared.empty()) store::add_owner(c, keys, ctx_.session);
    redeclare_dicts(c);
    bool all = true;
    // After a failover, a record not found may be a free the new primary
    // made on a reference it never saw: the claim keeps the block (create/held_frees.hpp).
    const std::int64_t claim_ms = ctx_.opts.redis.replicated() ? store::kClaimMs : 0;
    for (const auto& [k, n] : holdings_.snapshot())
      if (store::reregister(c, keys, k.first, k.second, ctx_.session, n, claim_ms).is("absent")) all = false;
    if (republished)
      log(LogLevel::warn, "Redis had lost the records of " + std::to_string(republished) +
                              " tensor(s) this process owns: republished them");
    return all;
  }

 private:
  // This session's references to state-dict records: set again where the
  // record still exists; where it is gone (Redis lost it, or the garbage
  // collector deleted it with its pins), each becomes one reference per
  // member, which the per-name pass below registers and which the handles
  // then release one by one (DictRef::per_name).
  void redeclare_dicts(redis::Connection& c) {
    std::map<std::uint64_t, std::vector<std::shared_ptr<DictRef>>> by_id;
    for (auto& r : dicts_.live())
      if (!r->per_name.load()) by_id[r->id].push_back(std::move(r));
    for (auto& [id, refs] : by_id) {
      if (store::reregister_dict(c, ctx_.keys, id, ctx_.session, refs.size())) continue;
      for (auto& r : refs) {
        for (const auto& [name, gen] : r->members) holdings_.note(name, gen, +1);
        r->per_name.store(true);
      }
    }
  }

  Context& ctx_;
  OwnAllocator& alloc_;
  Borrowed& borrowed_;
  Holdings& holdings_;
  DictHolds& dicts_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
