// After Redis lost its data (or this session's key expired while the
// process was stopped): write back the records of what this process owns
// and set this session's references to what it holds.
#pragma once

#include "memcuda/config.hpp"

#include <map>
#include <span>
#include <string>
#include <vector>

#include "memcuda/detail/registry/client/holdings.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/own_allocator.hpp"
#include "memcuda/detail/registry/client/dict_holds.hpp"
#include "memcuda/detail/store/records.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class Recovery {
 public:
  Recovery(Context& ctx, OwnAllocator& alloc, Holdings& holdings, DictHolds& dicts)
      : ctx_(ctx), alloc_(alloc), holdings_(holdings), dicts_(dicts) {}

  // Returns true when every reference found its record (false: some owner
  // has not republished yet; call again).
  bool run(redis::Connection& c) {
    const Keys& keys = ctx_.keys;
    std::uint64_t republished = 0;
    for (auto& [t, persistent] : alloc_.owned_records()) {
      TensorInfo r = t;
      r.holders.clear();
      std::vector<redis::Arg> args{t.generation, keys.prefix(), persistent ? "1" : "0", t.name, now_ms()};
      const protocol::Fields fields = protocol::encode_record(r);  // args point into it
      for (const auto& [k, v] : fields) {
        namespace f = store::field;
        if (k == f::generation || k == f::state || k == f::refcount || k == f::event_handle || k == f::event_version)
          continue;
        args.emplace_back(k);
        args.emplace_back(v);
      }
      const std::string tk = keys.tensor(t.name), nk = keys.names(), gk = keys.generation();
      redis::Arg kv[] = {tk, nk, gk};
      auto res = ctx_.scripts.republish.eval(c, std::span<const redis::Arg>(kv), std::span<const redis::Arg>(args));
      if (res[0].str() != "present") ++republished;
    }
    redeclare_dicts(c);
    bool all = true;
    for (const auto& [k, n] : holdings_.snapshot()) {
      auto res = ctx_.scripts.reregister.eval(c, {keys.tensor(k.first)}, {k.second, ctx_.session, n, keys.prefix(), k.first});
      if (res[0].str() == "absent") all = false;
    }
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
      const std::string rk = ctx_.keys.dict(id);
      auto res = ctx_.scripts.dict_reregister.eval(c, {rk}, {ctx_.session, std::to_string(refs.size())});
      if (res[0].str() == "ok") continue;
      for (auto& r : refs) {
        for (const auto& [name, gen] : r->members) holdings_.note(name, gen, +1);
        r->per_name.store(true);
      }
    }
  }

  Context& ctx_;
  OwnAllocator& alloc_;
  Holdings& holdings_;
  DictHolds& dicts_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
