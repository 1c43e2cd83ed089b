// The Lua scripts of state-dict records and their typed calls: a record
// pins its members so that a consumer's ONE reference keeps them all alive,
// and its link names it while it says exactly what get_prefix(prefix)
// would (docs/protocol.md, "State-dict records"; docs/design.md, "One
// reference per model").
#pragma once

#include "memcuda/config.hpp"

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "memcuda/detail/store/generation_fn.hpp"
#include "memcuda/detail/store/index_fn.hpp"
#include "memcuda/detail/store/keys.hpp"
#include "memcuda/detail/store/node_fn.hpp"
#include "memcuda/detail/store/script_call.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {
namespace lua {

// Script text joined at compile time. The scripts are constants, never
// dynamically initialised: a registry may be a static of another
// translation unit, constructed before any dynamic initialiser here ran.
template <std::size_t N>
struct LuaText {
  char text[N]{};
  operator std::string() const { return std::string(text, N - 1); }  // redis::Script's source
};

template <class T>
struct text_size;
template <std::size_t N>
struct text_size<char[N]> {
  static constexpr std::size_t value = N - 1;
};
template <std::size_t N>
struct text_size<LuaText<N>> {
  static constexpr std::size_t value = N - 1;
};

template <class... P>
consteval auto join(const P&... parts) {
  LuaText<(text_size<P>::value + ...) + 1> out;
  std::size_t at = 0;
  auto put = [&](const auto& part) {
    using T = std::remove_cvref_t<decltype(part)>;
    for (std::size_t i = 0; i < text_size<T>::value; ++i) {
      if constexpr (requires { part.text; }) out.text[at++] = part.text[i];
      else out.text[at++] = part[i];
    }
  };
  (put(parts), ...);
  return out;
}

// desc_matches(desc, generation, epoch): whether a member's desc is in the
// current format ("M1") and its tail names this record's epoch and
// generation, so a record never carries a desc written before a change.
inline constexpr char kDescMatchesFn[] = R"lua(
local function desc_matches(d, gen, e)
  if not (d and e and string.byte(d, 1) == 77 and string.byte(d, 2) == 49) then return false end
  local gs = #d - #gen + 1
  local es = gs - 1 - #tostring(#gen) - #e
  return es > 3 and string.byte(d, gs - 1) == 58 and string.find(d, gen, gs, true) == gs
         and string.byte(d, es - 1) == 58 and string.find(d, e, es, true) == es
end
)lua";

// Lua functions prepended to every script that changes a member or creates
// a name: unlink_dict(key prefix, id) unlinks one record (id may be nil or
// false: nothing); unlink_dicts_over_in(key prefix, the linked prefixes'
// set, name) every linked record whose prefix starts `name` (a new name
// under a published dict). The records and links themselves are derived
// from the prefix: they are named by data only Redis has.
inline constexpr char kUnlinkDictFn[] = R"lua(
local function unlink_dict(p, id)
  if not id then return end
  local rk = p .. 'memcuda:dict:' .. id
  local f = redis.call('HMGET', rk, 'prefix', 'state', 'refcount')
  if f[2] ~= 'linked' then return end
  local lk = p .. 'memcuda:dictlink:' .. f[1]
  if redis.call('GET', lk) == id then
    redis.call('DEL', lk)
    redis.call('SREM', p .. 'memcuda:dicts', f[1])
  end
  if tonumber(f[3] or '0') <= 0 then
    redis.call('DEL', rk)
    redis.call('SREM', p .. 'memcuda:dict_ids', id)
  else
    redis.call('HSET', rk, 'state', 'unlinked')
  end
end
local function unlink_dicts_over_in(p, dicts, name)
  local linked = redis.pcall('SMEMBERS', dicts)
  if linked.err then  -- before anything is written
    error({err = 'WRONGTYPE the index of linked state dicts ' .. dicts .. ' is a ' .. redis.call('TYPE', dicts)['ok'] ..
                 ', not a set: the allocator of record moves it aside and rebuilds it from the links; retry'})
  end
  for _, pre in ipairs(linked) do
    if string.sub(name, 1, #pre) == pre then unlink_dict(p, redis.call('GET', p .. 'memcuda:dictlink:' .. pre)) end
  end
end
)lua";

// Links the state dict published under a prefix: its members must be
// exactly the names under the prefix (each once), each ready, persistent (held by its
// name), of the generation given and with a usable desc; then a new record
// gets their descs (and the events published so far), each member one pin,
// and the prefix's link (an older record of the prefix is unlinked).
// -> {'ok', id} | {'changed', name} | {'notpersistent', name} | {'nodesc', name}
//    | {'mismatch', names under the prefix}
inline constexpr auto kDictLink = join(kUnlinkDictFn, kIndexFn, kDescMatchesFn, kGenerationFn, R"lua(
local p, pre = ARGV[1], ARGV[2]
local n = #KEYS - 5
local under = redis.call('ZLEXCOUNT', KEYS[3], '[' .. pre, '(' .. pre .. '\255')
if under ~= n then return {'mismatch', under} end
local parts, olds, seen = {}, {}, {}
local function put(s) parts[#parts + 1] = #s .. ':' .. s end
for i = 1, n do
  local name, gen = ARGV[2 + 2 * i], ARGV[3 + 2 * i]
  if string.sub(name, 1, #pre) ~= pre or seen[name] then return {'mismatch', under} end
  seen[name] = true
  local f = redis.call('HMGET', KEYS[5 + i], 'state', 'generation', 'desc', 'epoch', 'event_handle', 'event_version',
                      'holder:@name', 'dict')
  if f[1] ~= 'ready' or f[2] ~= gen then return {'changed', name} end
  if not f[7] then return {'notpersistent', name} end
  local d, e = f[3], f[4]
  if not desc_matches(d, gen, e) then return {'nodesc', name} end
  put(name) put(d) put(gen) put(e) put(f[5] or '') put(f[6] or '')
  if f[8] then olds[#olds + 1] = f[8] end
end
unlink_dict(p, redis.call('GET', KEYS[1]))
for _, o in ipairs(olds) do unlink_dict(p, o) end
local id = string.format('%.0f', take_generations(KEYS[2], 1))
local rk = p .. 'memcuda:dict:' .. id
redis.call('HSET', rk, 'prefix', pre, 'state', 'linked', 'refcount', 0, 'node', ARGV[3], 'count', n,
           'blob', table.concat(parts))
local pin = 'holder:@dict:' .. id
for i = 1, n do
  redis.call('HSET', KEYS[5 + i], 'dict', id)
  redis.call('HINCRBY', KEYS[5 + i], pin, 1)
  redis.call('HINCRBY', KEYS[5 + i], 'refcount', 1)
  hold(p, '@dict:' .. id, ARGV[3 + 2 * i], ARGV[2 + 2 * i])
end
redis.call('SET', KEYS[1], id)
redis.call('SADD', KEYS[4], pre)
redis.call('SADD', KEYS[5], id)
return {'ok', id}
)lua");

// Takes one reference of a holder to the record linked at a prefix: O(1),
// whatever the member count.
// -> {'ok', id, blob} | {'none'} (no linked record, or of another node:
//    the caller opens per name, which reports what it finds)
inline constexpr auto kDictAcquire = join(kNodeFn, R"lua(
local id = redis.call('GET', KEYS[1])
if not id then return {'none'} end
local rk = ARGV[1] .. 'memcuda:dict:' .. id
local f = redis.call('HMGET', rk, 'state', 'node', 'blob')
if f[1] ~= 'linked' or not same_node(f[2], ARGV[3]) then return {'none'} end
redis.call('HINCRBY', rk, 'refcount', 1)
redis.call('HINCRBY', rk, 'holder:' .. ARGV[2], 1)
return {'ok', id, f[3]}
)lua");

// Drops one reference (or, 'all', every reference) of a holder to a
// record. The last reference to an unlinked record deletes it; the
// garbage collector then drops its pins on the members.
// -> {'ok', refcount} | {'notholder'}
inline constexpr char kDictRelease[] = R"lua(
local h = 'holder:' .. ARGV[1]
local c = tonumber(redis.call('HGET', KEYS[1], h) or '0')
if c <= 0 then return {'notholder'} end
local drop = 1
if ARGV[2] == 'all' then drop = c end
if c == drop then redis.call('HDEL', KEYS[1], h) else redis.call('HINCRBY', KEYS[1], h, -drop) end
local rc = redis.call('HINCRBY', KEYS[1], 'refcount', -drop)
if rc <= 0 and redis.call('HGET', KEYS[1], 'state') ~= 'linked' then
  redis.call('DEL', KEYS[1])
  redis.call('SREM', KEYS[2], ARGV[3])
end
return {'ok', rc}
)lua";

// Sets a holder's reference count on a record to what it knows it holds
// (after its session key expired and the garbage collector dropped them).
// -> {'ok'} | {'gone'}
inline constexpr char kDictReregister[] = R"lua(
if redis.call('EXISTS', KEYS[1]) == 0 then return {'gone'} end
local h = 'holder:' .. ARGV[1]
local old = tonumber(redis.call('HGET', KEYS[1], h) or '0')
local n = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], h, n)
redis.call('HINCRBY', KEYS[1], 'refcount', n - old)
return {'ok'}
)lua";

}  // namespace lua

namespace store {

// kDictLink of the state dict `members` (full names, generations) published under `prefix`.
inline Answer link_dict(redis::Connection& c, const Keys& k, std::string_view prefix, const std::string& node,
                        const std::vector<std::pair<std::string, std::uint64_t>>& members) {
  std::vector<redis::Arg> keys{k.dict_link(prefix), k.generation(), k.names(), k.dicts(), k.dict_ids()};
  std::vector<redis::Arg> args{k.prefix(), prefix, node};
  for (const auto& [name, gen] : members) {
    keys.emplace_back(k.tensor(name));
    args.emplace_back(name);
    args.emplace_back(gen);
  }
  return answer(eval<lua::kDictLink>(c, keys, args));
}

inline Answer acquire_dict(redis::Connection& c, const Keys& k, std::string_view prefix, const std::string& holder,
                           const std::string& node) {
  return answer(eval<lua::kDictAcquire>(c, {k.dict_link(prefix)}, {k.prefix(), holder, node}));
}

// kDictReregister: `holder` holds `n` references to record `id` (false: it is gone).
inline bool reregister_dict(redis::Connection& c, const Keys& k, std::uint64_t id, const std::string& holder,
                            std::size_t n) {
  return answer(eval<lua::kDictReregister>(c, {k.dict(id)}, {holder, n})).is("ok");
}

}  // namespace store
}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
