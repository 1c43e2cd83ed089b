// The Lua scripts that drop references (scripts.hpp says how scripts are
// written) and their typed calls: one holder's reference to one generation,
// also as pipelined commands the release queue sends a batch of in one round
// trip (detail/registry/release_queue.hpp), every reference of a dead holder
// (the garbage collector), and a reference to a state-dict record.
#pragma once

#include "memcuda/config.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/detail/store/dict_scripts.hpp"
#include "memcuda/detail/store/index_fn.hpp"
#include "memcuda/detail/store/keys.hpp"
#include "memcuda/detail/store/node_fn.hpp"
#include "memcuda/detail/store/script_call.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {
namespace lua {

// release_one(p, names, tkey, gen, name, holder, all, caller, refs, usage): drops one
// reference (all = every reference) of a holder to one generation of a
// tensor, wherever its Hash is (still named, or unlinked by remove). A
// generation that was migrated to a new allocator of record is followed
// through its memcuda:moved:<gen> forward. The last reference unlinks the
// name at once, so nobody can take memory about to be freed; the owner frees
// it, or the allocator of record through a "free" command. `refs` is the
// holder's reference index, `usage` the usage counters; the unlinked and
// forwarding keys of a generation are derived from the key prefix p (the
// generation is only known once the forwards were followed).
// -> {'ok', refcount} | {'free', generation} (caller owns it: record deleted,
//    free now) | {'queued', generation, name, node} (the caller sends the
//    free to owner_list(lifecycle, node))
//    | {'notfound'} | {'notholder'}; and the references dropped
inline constexpr auto kReleaseFn = join(kIndexFn, kOwnerListFn, R"lua(
local function release_one(p, names, tkey, gen0, name, holder, all, caller, refs, usage)
  local gen = gen0
  local key, linked, held
  local h = 'holder:' .. holder
  for _ = 1, 64 do
    -- the named record's generation and the holder's count in one call
    -- (each redis.call costs about as much as the command it runs)
    local f = redis.call('HMGET', tkey, 'generation', h)
    if f[1] == gen then key = tkey; linked = true; held = f[2]; break end
    local r = p .. 'memcuda:removed:' .. gen
    if redis.call('EXISTS', r) == 1 then key = r; linked = false; break end
    gen = redis.call('GET', p .. 'memcuda:moved:' .. gen)
    if not gen then break end
  end
  if not key then
    unhold_in(refs, holder, gen0, name)
    return {'notfound'}, 0
  end
  if not linked then held = redis.call('HGET', key, h) end
  local c = tonumber(held or '0')
  if c <= 0 then
    unhold_in(refs, holder, gen0, name)
    return {'notholder'}, 0
  end
  local drop = 1
  if all then drop = c end
  if c == drop then
    redis.call('HDEL', key, h)
    unhold_in(refs, holder, gen0, name)
  else
    redis.call('HINCRBY', key, h, -drop)
  end
  local rc = redis.call('HINCRBY', key, 'refcount', -drop)
  if rc > 0 then return {'ok', rc}, drop end
  local f = redis.call('HMGET', key, 'name', 'owner', 'migrated_from', 'node')
  if f[3] then
    for g in string.gmatch(f[3], '%d+') do redis.call('DEL', p .. 'memcuda:moved:' .. g) end
  end
  if linked then
    count_usage_in(usage, key, -1)
    name_rem(names, f[1])
  end
  if f[2] == caller then
    redis.call('DEL', key)  -- the caller owns the memory and frees it now
    return {'free', gen}, drop
  end
  if linked then redis.call('RENAME', key, p .. 'memcuda:removed:' .. gen) end
  return {'queued', gen, f[1], f[4]}, drop
end
)lua");

// Drops one reference of a holder to one generation of a tensor
// (release_one above).
// -> {'ok', refcount} | {'free', generation} (caller owns it: record deleted, free now)
//    | {'queued', generation} | {'notfound'} | {'notholder'} | {'notleader', t}
inline constexpr auto kRelease = join(kReleaseFn, R"lua(
if ARGV[5] ~= '' and redis.call('GET', KEYS[4]) ~= ARGV[5] then
  return {'notleader', tostring(redis.call('GET', KEYS[4]))}
end
local r = release_one(ARGV[3], KEYS[2], KEYS[1], ARGV[1], ARGV[7] or '', ARGV[2], ARGV[6] == 'all', ARGV[4], KEYS[5],
                      KEYS[6])
if r[1] == 'queued' then
  -- generations pass 2^47: written as digits, not through cjson's 14-digit numbers
  redis.call('LPUSH', owner_list(KEYS[3], r[4]),
             '{"op":"free","name":' .. cjson.encode(r[3]) .. ',"generation":' .. r[2] .. '}')
  return {'queued', r[2]}
end
return r
)lua");

// Drops every reference of one dead holder to the records its index names
// (the garbage collector; fenced). Each member goes from the index as it is
// handled; the holder leaves memcuda:holders with its last member. What the
// caller owns comes back to be freed; what another owner has goes to the
// allocator of record in one "free" command of many generations.
// -> {'ok', references dropped, tensors unlinked, generation to free, ...}
//    | {'notleader', t}
inline constexpr auto kReleaseHolder = join(kReleaseFn, R"lua(
if ARGV[1] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[1] then
  return {'notleader', tostring(redis.call('GET', KEYS[3]))}
end
local p = ARGV[3]
local out = {'ok', 0, 0}
local queued = {}  -- by lifecycle list
for i = 5, #ARGV do
  local m = ARGV[i]
  local c = string.find(m, ':', 1, true)
  if c then
    local gen, name = string.sub(m, 1, c - 1), string.sub(m, c + 1)
    local r, dropped = release_one(p, KEYS[1], KEYS[2 + i], gen, name, ARGV[2], true, ARGV[4], KEYS[4], KEYS[6])
    out[2] = out[2] + dropped
    if r[1] == 'free' then
      out[3] = out[3] + 1
      out[#out + 1] = r[2]
    elseif r[1] == 'queued' then
      out[3] = out[3] + 1
      frees_add(queued, KEYS[2], r[4], r[2])
    end
  end
  redis.pcall('SREM', KEYS[4], m)  -- an index of the wrong type: GC moves it aside
end
frees_send(queued)
if redis.call('EXISTS', KEYS[4]) == 0 then redis.pcall('SREM', KEYS[5], ARGV[2]) end
return out
)lua");

}  // namespace lua

namespace store {

// kRelease of `holder`'s reference (every one with `all`), for `session`.
inline Answer release(redis::Connection& c, const Keys& k, const std::string& name, std::uint64_t gen,
                      const std::string& holder, const std::string& session, const std::string& token, bool all) {
  return answer(eval<lua::kRelease>(c, {k.tensor(name), k.names(), k.lifecycle(), k.leader(), k.refs(holder),
                                        k.usage()},
                                    {gen, holder, k.prefix(), session, token, all ? "all" : "", name}));
}

// kReleaseHolder of the dead `holder`'s index `members` ('<generation>:<name>').
inline Answer release_holder(redis::Connection& c, const Keys& k, const std::string& holder,
                             const std::vector<std::string>& members, const std::string& session,
                             const std::string& token) {
  std::vector<redis::Arg> keys{k.names(), k.lifecycle(), k.leader(), k.refs(holder), k.holders(), k.usage()};
  std::vector<redis::Arg> args{token, holder, k.prefix(), session};
  for (const auto& m : members) {
    const auto colon = m.find(':');  // the member's record key ("" name for a member without one)
    keys.emplace_back(k.tensor(colon == std::string::npos ? std::string_view()
                                                          : std::string_view(m).substr(colon + 1)));
    args.emplace_back(m);
  }
  return answer(eval<lua::kReleaseHolder>(c, keys, args));
}

// kDictRelease of `holder`'s reference (every one with `all`) to record `id`.
inline Answer release_dict(redis::Connection& c, const Keys& k, std::string_view id, const std::string& holder,
                           bool all) {
  return answer(eval<lua::kDictRelease>(c, {k.dict(id), k.dict_ids()}, {holder, all ? "all" : "", id}));
}

// The keys every release of one session's batch shares, built once per batch.
struct ReleaseBatch {
  ReleaseBatch(const Keys& k, std::string_view session)
      : keys(k), names(k.names()), lifecycle(k.lifecycle()), leader(k.leader()), refs(k.refs(session)),
        usage(k.usage()), dict_ids(k.dict_ids()), prefix(k.prefix()) {}
  const Keys& keys;
  std::string names, lifecycle, leader, refs, usage, dict_ids, prefix;
};

// release() and release_dict() of one reference of the batch's `session`, by
// itself, unfenced, as commands of a pipeline (EVALSHA: NOSCRIPT means not run).
inline redis::Command release_cmd(const ReleaseBatch& b, const std::string& session, std::string_view name,
                                  std::uint64_t gen) {
  return {"EVALSHA", script<lua::kRelease>().sha(), "6", b.keys.tensor(name), b.names, b.lifecycle, b.leader, b.refs,
          b.usage, std::to_string(gen), session, b.prefix, session, "", "", std::string(name)};
}
inline redis::Command dict_release_cmd(const ReleaseBatch& b, const std::string& session, std::uint64_t dict_id) {
  return {"EVALSHA", script<lua::kDictRelease>().sha(), "2", b.keys.dict(dict_id), b.dict_ids, session, "",
          std::to_string(dict_id)};
}

}  // namespace store
}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
