// The Lua scripts of the batch operations (get many, create many, remove
// many). Each is one atomic script, so a batch is one Redis round trip and
// no other client sees it half done. They follow the rules of scripts.hpp:
// expected outcomes are {status, ...} tables, names are KEYS/ARGV, and a
// script the allocator of record runs to create is fenced by its token.
#pragma once

#include "memcuda/config.hpp"

#include <string>
#include <utility>
#include <vector>

#include "memcuda/detail/store/dict_scripts.hpp"
#include "memcuda/detail/store/generation_fn.hpp"
#include "memcuda/detail/store/index_fn.hpp"
#include "memcuda/detail/store/node_fn.hpp"
#include "memcuda/detail/store/keys.hpp"
#include "memcuda/detail/store/records.hpp"
#include "memcuda/detail/store/script_call.hpp"
#include "memcuda/detail/store/selection.hpp"
#include "memcuda/protocol/record_desc.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {
namespace lua {

// Prepended to the scripts that find a key under a tensor's name:
// record_generation(key) -> generation, key type. The generation is false
// when the key is not a record of ours (not a Hash, or a Hash without a
// generation, e.g. written by hand): such a stray key is reported, never
// overwritten or renamed.
inline constexpr char kStrayFn[] = R"lua(
local function record_generation(k)
  local ty = redis.call('TYPE', k)['ok']
  if ty ~= 'hash' then return false, ty end
  return redis.call('HGET', k, 'generation'), ty
end
)lua";

// refusal(HMGET of state, dtype, node, generation, refcount, lost marker key,
// dtype ('' = any), node): why the acquire scripts take no reference; nil: they may.
inline constexpr char kRefusalFn[] = R"lua(
local function refusal(f, lkey, dtype, node)
  if not f[1] then
    if redis.call('EXISTS', lkey) == 1 then return {'lost', redis.call('HGETALL', lkey)} end
    return {'notfound'}
  end
  if f[1] ~= 'ready' then return {'state', f[1]} end
  if dtype ~= '' and f[2] ~= dtype then return {'dtype', f[2]} end
  if not same_node(f[3], node) then return {'node', f[3]} end
  local n = tonumber(f[5])
  if not tonumber(f[4]) or (f[5] and (not n or n < 0)) then
    return {'corrupt', 'generation ' .. tostring(f[4]) .. ', refcount ' .. tostring(f[5])}
  end
end
-- A single get's checks: the fence ('' token: none), then the record's
-- fields (state, dtype, node, generation, refcount, event_version) and
-- their refusal. -> fields, refusal or nil
local function get_checks(tkey, leader, lkey, token, dtype, node)
  if token ~= '' and redis.call('GET', leader) ~= token then
    return nil, {'notleader', tostring(redis.call('GET', leader))}
  end
  local f = redis.call('HMGET', tkey, 'state', 'dtype', 'node', 'generation', 'refcount', 'event_version')
  return f, refusal(f, lkey, dtype, node)
end
)lua";

// remove_one(key prefix, names, usage, record key, caller session): unlinks
// the record's name now (a new create may reuse it) and drops the name's own
// reference of a persistent tensor; the memory goes with the last holder.
// -> {'ok', generation, refcount} | {'free', generation} (the caller owns it:
//    record deleted, free now) | {'queued', generation} (another owner frees
//    it: the caller sends the free) | {'notfound'} | {'stray', key type}
inline constexpr auto kRemoveFn = join(kOwnerListFn, R"lua(
local function remove_one(p, names, usage, tkey, caller)
  if redis.call('EXISTS', tkey) == 0 then return {'notfound'} end
  local rg, ty = record_generation(tkey)
  if not rg then return {'stray', ty} end
  local f = redis.call('HMGET', tkey, 'generation', 'name', 'owner', 'dict', 'node')
  unlink_dict(p, f[4])
  local rkey = p .. 'memcuda:removed:' .. f[1]
  local pc = tonumber(redis.call('HGET', tkey, 'holder:@name') or '0')
  if pc > 0 then
    redis.call('HDEL', tkey, 'holder:@name')
    redis.call('HINCRBY', tkey, 'refcount', -pc)
  end
  count_usage_in(usage, tkey, -1)
  redis.call('RENAME', tkey, rkey)
  name_rem(names, f[2])
  local rc = tonumber(redis.call('HGET', rkey, 'refcount'))
  if rc > 0 then return {'ok', f[1], rc} end
  local mf = redis.call('HGET', rkey, 'migrated_from')
  if mf then
    for g in string.gmatch(mf, '%d+') do redis.call('DEL', p .. 'memcuda:moved:' .. g) end
  end
  if f[3] == caller then
    redis.call('DEL', rkey)
    return {'free', f[1]}
  end
  return {'queued', f[1], f[2], f[5]}
end
)lua");

// Takes one reference of a holder to each of many tensors, atomically. Each
// name is checked like kAcquire (state, dtype, node); a refused name takes
// nothing, the others are taken. The names are given, or every linked name
// starting with a prefix, or matching an anchored Lua pattern (the caller
// translates a glob and gives its literal prefix: only names under it are
// read), sorted. Holder '' takes no reference and only describes (the
// allocator of record's replicate, for blocks it owns and keeps out of its
// pools meanwhile: Allocator::InUse).
// -> {'notleader', token} | {{name, status, ...}, ...} where each entry is
//    {name, 'desc', desc, generation, epoch, refcount, event_handle | nil,
//    event_version | nil} (the record's desc field, record_desc.hpp, is of a
//    version this script knows and ends with the record's own epoch and
//    generation)
//    | {name, 'ok', HGETALL...} (no usable desc: a record of a
//    single create, or republished) | {name, 'notfound'} | {name, 'lost',
//    HGETALL of the marker} | {name, 'state', s} | {name, 'dtype', d}
//    | {name, 'node', n} | {name, 'corrupt', what} (no reference taken)
// One HMGET of 8 small fields instead of an HGETALL of ~23 per name: the
// HGETALL and its nested reply were most of a 291-name batch's time in
// Redis (docs/protocol.md, "The desc field").
inline constexpr auto kAcquireMany = join(kNodeFn, kIndexFn, kDescMatchesFn, kRefusalFn, R"lua(
if ARGV[3] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[3] then
  return {'notleader', tostring(redis.call('GET', KEYS[1]))}
end
local function take(name, tkey, lkey, dtype)
  local f = redis.call('HMGET', tkey, 'state', 'dtype', 'node', 'generation', 'refcount', 'desc', 'epoch',
                      'event_handle', 'event_version')
  local no = refusal(f, lkey, dtype, ARGV[2])
  if no then return {name, unpack(no)} end
  local rc = tonumber(f[5]) or 0
  if ARGV[1] ~= '' then
    rc = redis.call('HINCRBY', tkey, 'refcount', 1)
    -- only the holder's first reference adds its index member (as kAcquire)
    if redis.call('HINCRBY', tkey, 'holder:' .. ARGV[1], 1) == 1 then hold_in(KEYS[3], KEYS[4], ARGV[1], f[4], name) end
  end
  -- the desc, when current (the client checks it exactly again)
  if desc_matches(f[6], f[4], f[7]) then return {name, 'desc', f[6], f[4], f[7], rc, f[8] or false, f[9] or false} end
  return {name, 'ok', redis.call('HGETALL', tkey)}
end
local out = {}
if ARGV[5] == 'names' then
  local n = (#KEYS - 4) / 2
  for i = 1, n do
    out[i] = take(ARGV[5 + 2 * i], KEYS[3 + 2 * i], KEYS[4 + 2 * i], ARGV[6 + 2 * i])
  end
  return out
end
local pre = ARGV[6]
if ARGV[5] == 'pattern' then pre = ARGV[7] or '' end
for _, n in ipairs(names_under(KEYS[2], pre)) do
  if ARGV[5] == 'prefix' or string.match(n, ARGV[6]) ~= nil then
    out[#out + 1] = take(n, ARGV[4] .. 'memcuda:tensor:' .. n, ARGV[4] .. 'memcuda:lost:' .. n, '')
  end
end
return out
)lua");

// Publishes many tensors the leader has just allocated, all or nothing:
// when one name is taken, nothing is written. A retried batch (every name
// already holds its entry's create_id) is answered as a replay. The
// generations are consecutive.
// -> {'ok', gen1, rc1, gen2, rc2, ...} | {'replay', gen1, rc1, ...}
//    | {'exists', entry index (1-based), generation} | {'stray', entry index,
//    key type} (its key is not a record of ours; left as it is) | {'notleader', token}
inline constexpr auto kCreateMany = join(kUnlinkDictFn, kStrayFn, kIndexFn, kGenerationFn, R"lua(
local lead = redis.call('GET', KEYS[2])
if lead ~= ARGV[1] then return {'notleader', tostring(lead)} end
local n = tonumber(ARGV[2])
local at = {}
local p = 3
for i = 1, n do
  at[i] = p
  p = p + 7 + 2 * tonumber(ARGV[p + 6])
end
local replays = 0
for i = 1, n do
  local t = KEYS[5 + 3 * i]
  if redis.call('EXISTS', t) == 1 then
    local rg, ty = record_generation(t)
    if not rg then return {'stray', i, ty} end
    local cid = ARGV[at[i] + 1]
    if cid ~= '' and redis.call('HGET', t, 'create_id') == cid then
      replays = replays + 1
    else
      return {'exists', i, rg}
    end
  end
end
if replays > 0 then
  if replays < n then  -- a replay some of whose tensors were removed since
    for i = 1, n do
      if redis.call('EXISTS', KEYS[5 + 3 * i]) == 0 then return {'exists', i, '0'} end
    end
  end
  local out = {'replay'}
  for i = 1, n do
    local t = KEYS[5 + 3 * i]
    out[#out + 1] = redis.call('HGET', t, 'generation')
    out[#out + 1] = redis.call('HGET', t, 'refcount')
  end
  return out
end
local base = take_generations(KEYS[3], n)
-- new names under a linked state dict: the dict no longer says get_prefix's names
local kp = ARGV[#ARGV]
if redis.call('SCARD', KEYS[4]) > 0 then
  for i = 1, n do unlink_dicts_over_in(kp, KEYS[4], ARGV[at[i]]) end
end
local out = {'ok'}
for i = 1, n do
  local a = at[i]
  local gen = string.format('%.0f', base + i - 1)
  local t = KEYS[5 + 3 * i]
  redis.call('DEL', KEYS[7 + 3 * i])
  local k = tonumber(ARGV[a + 6])
  local desc = ARGV[a + 5] .. #gen .. ':' .. gen
  -- the whole record in one HSET (as create: each redis.call costs a
  -- dispatch), unpack last so that it expands fully
  local rc = 1
  -- persistent; held by its name only when that is the creator (a replica)
  if ARGV[a + 4] == '1' and ARGV[a + 3] ~= '@name' then
    rc = 2
    redis.call('HSET', t, 'generation', gen, 'state', 'ready', 'refcount', rc, 'holder:' .. ARGV[a + 3], 1,
               'holder:@name', 1, 'desc', desc, unpack(ARGV, a + 7, a + 6 + 2 * k))
  else
    redis.call('HSET', t, 'generation', gen, 'state', 'ready', 'refcount', rc, 'holder:' .. ARGV[a + 3], 1,
               'desc', desc, unpack(ARGV, a + 7, a + 6 + 2 * k))
  end
  name_add(KEYS[1], ARGV[a])
  hold_in(KEYS[5], KEYS[6], ARGV[a + 3], gen, ARGV[a])
  count_usage_in(KEYS[7], t, 1)
  redis.call('PUBLISH', ARGV[a + 2], gen)
  wake_waiters(kp, KEYS[6 + 3 * i], gen)
  out[#out + 1] = gen
  out[#out + 1] = rc
end
return out
)lua");

// Unlinks many names at once, each as kRemove does (the name's own
// reference of a persistent tensor is dropped; the memory goes with the
// last holder). The names are given, or selected like kAcquireMany. What
// another owner must free goes to the allocator of record as one "free"
// command of many generations.
// -> {{name, 'ok', generation, refcount} | {name, 'free', generation}
//     | {name, 'queued', generation} | {name, 'notfound'}
//     | {name, 'stray', key type} (not a record of ours: left as it is), ...}
inline constexpr auto kRemoveMany = join(kUnlinkDictFn, kStrayFn, kIndexFn, kRemoveFn, R"lua(
local queued = {}  -- by lifecycle list
local function rm(name, tkey)
  local r = remove_one(ARGV[1], KEYS[1], KEYS[3], tkey, ARGV[2])
  if r[1] == 'queued' then
    frees_add(queued, KEYS[2], r[4], r[2])
    r[4] = nil
  end
  table.insert(r, 1, name)
  return r
end
local function send_frees() frees_send(queued) end
local out = {}
if ARGV[3] == 'names' then
  for i = 4, #KEYS do out[#out + 1] = rm(ARGV[1 + i], KEYS[i]) end
  send_frees()
  return out
end
local pre = ARGV[4]
if ARGV[3] == 'pattern' then pre = ARGV[5] or '' end
for _, n in ipairs(names_under(KEYS[1], pre)) do
  if ARGV[3] == 'prefix' or string.match(n, ARGV[4]) ~= nil then out[#out + 1] = rm(n, ARGV[1] .. 'memcuda:tensor:' .. n) end
end
send_frees()
return out
)lua");

}  // namespace lua

namespace store {

// kAcquireMany for `holder` ('' token: unfenced; dtype '' = any; '' holder: no reference, a description).
inline redis::Reply acquire_many(redis::Connection& c, const Keys& k, const Selection& sel, const std::string& holder,
                                 const std::string& node, const std::string& token, const std::string& dtype) {
  std::vector<redis::Arg> keys{k.leader(), k.names(), k.refs(holder), k.holders()};
  std::vector<redis::Arg> args{holder, node, token, k.prefix(), sel.mode, sel.arg};
  if (sel.mode == "pattern") args.emplace_back(sel.literal);
  for (const auto& n : sel.names) {
    keys.emplace_back(k.tensor(n));
    keys.emplace_back(k.lost(n));
    args.emplace_back(n);
    args.emplace_back(dtype);
  }
  return eval<lua::kAcquireMany>(c, keys, args);
}

// A record from its HGETALL reply, read in place (`gen`, when given, is
// set from the generation field before anything can throw on decoding).
inline TensorInfo decode_hash(redis::ReplyView h, std::uint64_t* gen = nullptr) {
  protocol::RecordReader rr;
  for (std::size_t j = 0; j + 1 < h.size(); j += 2) {
    const std::string_view k = h[j].str(), v = h[j + 1].str();
    if (gen && k == protocol::record_field::generation)
      *gen = protocol::detail::parse_decimal<std::uint64_t>(v).value_or(0);
    rr.add(k, v);
  }
  return rr.finish();
}

// Decodes the record of a name the acquire script took, straight from the
// reply (no copy of the fields, no map): its desc and the fields that
// change, or its HGETALL. Sets `gen` first, so that a record that does
// not decode can still be given back.
inline TensorInfo decode_taken(redis::ReplyView e, std::string_view st, std::uint64_t& gen) {
  if (st == "desc") {
    protocol::LiveFields live;
    live.generation = e[3].str();
    gen = protocol::detail::parse_decimal<std::uint64_t>(live.generation).value_or(0);
    live.epoch = e[4].str();
    live.refcount = e[5].integer();
    if (!e[6].is_nil()) live.event_handle = e[6].str();
    if (!e[7].is_nil()) live.event_version = e[7].str();
    return protocol::decode_desc(e[2].str(), live);
  }
  return decode_hash(e[2], &gen);
}

inline redis::Reply remove_many(redis::Connection& c, const Keys& k, const Selection& sel, const std::string& session) {
  std::vector<redis::Arg> keys{k.names(), k.lifecycle(), k.usage()};
  std::vector<redis::Arg> args{k.prefix(), session, sel.mode, sel.arg};
  if (sel.mode == "pattern") args.emplace_back(sel.literal);
  for (const auto& n : sel.names) {
    keys.emplace_back(k.tensor(n));
    args.emplace_back(n);
  }
  return eval<lua::kRemoveMany>(c, keys, args);
}

// kCreateMany of `records` (each with whether it is persistent), held by `holder`.
inline Answer create_many(redis::Connection& c, const Keys& k, const std::string& token, const std::string& holder,
                          const std::vector<std::pair<const TensorInfo*, bool>>& records) {
  std::vector<redis::Arg> keys{k.names(),       k.leader(),  k.generation(), k.dicts(),
                               k.refs(holder), k.holders(), k.usage()};
  std::vector<redis::Arg> args{token, records.size()};
  for (const auto& [t, persistent] : records) {
    keys.emplace_back(k.tensor(t->name));
    keys.emplace_back(k.waiters(t->name));
    keys.emplace_back(k.lost(t->name));
    const protocol::Fields fields = protocol::encode_record(*t);
    std::vector<redis::Arg> fv;
    for (const auto& [f, v] : fields)
      if (f != field::generation && f != field::state && f != field::refcount && !is_holder_field(f)) {
        fv.emplace_back(std::string(f));
        fv.emplace_back(std::string(v));
      }
    // desc: the fields that do not change, in one string a batch get
    // reads with one HMGET (record_desc.hpp).
    for (redis::Arg a : {redis::Arg(t->name), redis::Arg(t->create_id), redis::Arg(k.ready_channel(t->name)),
                         redis::Arg(holder), redis::Arg(persistent ? "1" : "0"),
                         redis::Arg(protocol::encode_desc_body(fields)), redis::Arg(fv.size() / 2)})
      args.push_back(std::move(a));
    for (auto& a : fv) args.push_back(std::move(a));
  }
  args.emplace_back(k.prefix());  // last: the key prefix the script derives state-dict keys from
  Answer a = answer(eval<lua::kCreateMany>(c, keys, args));
  replicate(c);
  return a;
}

}  // namespace store
}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
