// The Lua scripts of one tensor's life (create, get, remove, publish) and
// their typed calls. Each script runs atomically in Redis,
// so refcounts, holders and the name index never disagree. Scripts run by
// the allocator of record take its lease token and refuse to write when the
// lease is no longer theirs (fencing: a paused ex-leader cannot corrupt
// state). Expected outcomes come back as {status, ...} tables, not errors.
// Names and other data are always KEYS/ARGV, never spliced into the source;
// a script's KEYS and ARGV are what its typed call (end of its file) builds.
#pragma once

#include "memcuda/config.hpp"

#include <cstdint>
#include <exception>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/detail/store/batch_scripts.hpp"
#include "memcuda/detail/store/dict_scripts.hpp"
#include "memcuda/detail/store/generation_fn.hpp"
#include "memcuda/detail/store/index_fn.hpp"
#include "memcuda/detail/store/keys.hpp"
#include "memcuda/detail/store/records.hpp"
#include "memcuda/detail/store/script_call.hpp"
#include "memcuda/dtype.hpp"
#include "memcuda/protocol/record.hpp"
#include "memcuda/redis/connection.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {
namespace lua {

// publish_new(key prefix, name, ready channel, holder, persistent, first
// field's ARGV index): writes the record of a new name (KEYS of kCreate and
// kShare: 1 tensor, 2 names, 4 generation counter, 5 waiters, 6 lost
// marker, 7 usage, 8 the holder's index, 9 holders, 10 linked dict
// prefixes) -> {'ok', generation, refcount}. The first generation of a fresh
// Redis is its clock in microseconds, so generations stay unique across a
// restart that lost its data (records republished keep theirs).
inline constexpr char kPublishNewFn[] = R"lua(
local function publish_new(p, name, channel, holder, persistent, first)
  -- a new name under a linked state dict: the dict no longer says get_prefix's names
  unlink_dicts_over_in(p, KEYS[10], name)
  local gen = take_generations(KEYS[4], 1)
  redis.call('DEL', KEYS[6])
  -- The whole record in one HSET (unpack last, so it expands fully): every
  -- redis.call costs argument conversion and a command dispatch, and Redis
  -- runs nothing else meanwhile. The caller never sends the fields set here.
  local rc = 1
  if persistent then
    rc = 2
    redis.call('HSET', KEYS[1], 'generation', gen, 'state', 'ready', 'refcount', rc, 'holder:' .. holder, 1,
               'holder:@name', 1, unpack(ARGV, first))
  else
    redis.call('HSET', KEYS[1], 'generation', gen, 'state', 'ready', 'refcount', rc, 'holder:' .. holder, 1,
               unpack(ARGV, first))
  end
  name_add(KEYS[2], name)
  hold_in(KEYS[8], KEYS[9], holder, gen, name)
  count_usage_in(KEYS[7], KEYS[1], 1)
  redis.call('PUBLISH', channel, gen)
  wake_waiters(p, KEYS[5], gen)
  return {'ok', gen, rc}
end
)lua";

// Publishes a tensor the leader has just allocated (publish_new).
// -> {'ok', generation, refcount} | {'replay', generation, refcount} (same create_id
//    already done) | {'exists', generation} | {'stray', key type} (the key is
//    not a record of ours: no generation field, or not a Hash; left as it is)
//    | {'notleader', current token}
inline constexpr auto kCreate = join(kUnlinkDictFn, kStrayFn, kIndexFn, kGenerationFn, kPublishNewFn, R"lua(
local lead = redis.call('GET', KEYS[3])
if lead ~= ARGV[1] then return {'notleader', tostring(lead)} end
if redis.call('EXISTS', KEYS[1]) == 1 then
  local g, ty = record_generation(KEYS[1])
  if not g then return {'stray', ty} end
  if ARGV[3] ~= '' and redis.call('HGET', KEYS[1], 'create_id') == ARGV[3] then
    return {'replay', g, redis.call('HGET', KEYS[1], 'refcount')}
  end
  return {'exists', g}
end
return publish_new(ARGV[7], ARGV[2], ARGV[4], ARGV[5], ARGV[6] == '1', 8)
)lua");

// Takes a reference (the get fast path; also the leader's JSON get).
// -> {'ok', HGETALL...} | {'same', refcount} (the cached record is current:
//    same generation and event version, nothing else changes after creation)
//    | {'notfound'} | {'lost', HGETALL of the marker} | {'state', s} | {'dtype', d}
//    | {'node', n} | {'notleader', token} | {'corrupt', what} (no reference
//    taken: the generation or refcount field does not parse, or is negative)
inline constexpr auto kAcquire = join(kNodeFn, kIndexFn, kRefusalFn, R"lua(
local f, no = get_checks(KEYS[1], KEYS[2], KEYS[3], ARGV[4], ARGV[2], ARGV[3])
if no then return no end
local rc = redis.call('HINCRBY', KEYS[1], 'refcount', 1)
-- the index has one member per record a holder has references to: only
-- its first reference adds it (a release removes it with the last)
if redis.call('HINCRBY', KEYS[1], 'holder:' .. ARGV[1], 1) == 1 then hold_in(KEYS[4], KEYS[5], ARGV[1], f[4], ARGV[7]) end
if ARGV[5] ~= '' and f[4] == ARGV[5] and f[6] == ARGV[6] then return {'same', rc} end
return {'ok', redis.call('HGETALL', KEYS[1])}
)lua");

// Unlinks a name (remove_one) -> as remove_one.
inline constexpr auto kRemove = join(kUnlinkDictFn, kStrayFn, kIndexFn, kRemoveFn, R"lua(
local r = remove_one(ARGV[1], KEYS[2], KEYS[4], KEYS[1], ARGV[2])
if r[1] ~= 'queued' then return r end
redis.call('LPUSH', owner_list(KEYS[3], r[4]),
           '{"op":"free","name":' .. cjson.encode(r[3]) .. ',"generation":' .. r[2] .. '}')
return {'queued', r[2]}
)lua");

// Publishes a producer's interprocess event for one generation.
// A state dict linked over the tensor is unlinked: its record carries the
// events of its link time. A tensor with replicas asks the allocator of
// record to copy it into them again, in place (a "refresh" replicate on
// the lifecycle list): until then they are stale, and a local get takes
// the source. KEYS: record, lifecycle.
// -> new event_version, or -1 when the name no longer has that generation
inline constexpr auto kPublish = join(kUnlinkDictFn, R"lua(
if redis.call('HGET', KEYS[1], 'generation') ~= ARGV[1] then return -1 end
unlink_dict(ARGV[3], redis.call('HGET', KEYS[1], 'dict'))
redis.call('HSET', KEYS[1], 'event_handle', ARGV[2])
local reps = redis.call('HGET', KEYS[1], 'replicas')
if reps and reps ~= '' then
  local devs = {}
  for u in string.gmatch(reps, '%S+') do devs[#devs + 1] = u end
  redis.call('LPUSH', KEYS[2], cjson.encode({op = 'replicate', name = redis.call('HGET', KEYS[1], 'name'),
                                             devices = devs, refresh = true}))
end
return redis.call('HINCRBY', KEYS[1], 'event_version', 1)
)lua");

}  // namespace lua

namespace store {

// kCreate of the record `t` under `name`. Its fields go straight in: text
// as views (`t` must outlive the call), only numbers as owned strings. This
// runs for every create.
inline Answer create(redis::Connection& c, const Keys& k, const TensorInfo& t, const std::string& name,
                     const std::string& holder, const std::string& token, bool persistent) {
  std::vector<redis::Arg> args{token, name, t.create_id, k.ready_channel(name), holder, persistent ? "1" : "0",
                               k.prefix()};
  args.reserve(7 + 2 * 24);
  protocol::for_each_record_field(t, [&](auto&& f, auto&& v) {
    namespace rf = protocol::record_field;
    const std::string_view fname(f);
    // The script sets these itself, atomically with the existence check.
    if (fname == rf::generation || fname == rf::state || fname == rf::refcount || fname.starts_with(rf::holder_prefix))
      return;
    // Empty optional text (device_uuid on host, event_handle until a
    // publish) is left out: a reader decodes an absent field as empty,
    // and each field costs the script's HSET a listpack search.
    if ((fname == rf::device_uuid || fname == rf::event_handle) && std::string_view(v).empty()) return;
    args.emplace_back(std::forward<decltype(f)>(f));
    args.emplace_back(std::forward<decltype(v)>(v));
  });
  Answer a = answer(eval<lua::kCreate>(c, {k.tensor(name), k.names(), k.leader(), k.generation(), k.waiters(name),
                                       k.lost(name), k.usage(), k.refs(holder), k.holders(), k.dicts()}, args));
  replicate(c);
  return a;
}

// kAcquire for `holder` ('' token: unfenced; dtype '' = any), with the
// generation and event version of a cached record ('' = none).
inline Answer acquire(redis::Connection& c, const Keys& k, std::string_view name, const std::string& holder,
                      std::string_view dtype, const std::string& node, const std::string& token,
                      const std::string& cached_gen = {}, const std::string& cached_version = {}) {
  return answer(eval<lua::kAcquire>(c, {k.tensor(name), k.leader(), k.lost(name), k.refs(holder), k.holders()},
                                    {holder, dtype, node, token, cached_gen, cached_version, name}));
}

// acquire() of each name (no dtype, no cached record) in one round trip;
// `errors` as Script::eval_each (an error reply's Answer is empty).
inline std::vector<Answer> acquire_each(redis::Connection& c, const Keys& k, const std::vector<std::string>& names,
                                        const std::string& holder, const std::string& node, const std::string& token,
                                        std::vector<std::exception_ptr>& errors) {
  const auto& script = store::script<lua::kAcquire>(c);
  std::vector<redis::Command> cmds;
  cmds.reserve(names.size());
  for (const auto& n : names) {
    const redis::Arg keys[] = {k.tensor(n), k.leader(), k.lost(n), k.refs(holder), k.holders()};
    const redis::Arg args[] = {holder, "", node, token, "", "", n};
    cmds.push_back(script.command(keys, args));
  }
  std::vector<Answer> out;
  out.reserve(names.size());
  auto replies = script.eval_each(c, cmds, &errors);
  for (std::size_t i = 0; i < replies.size(); ++i)
    out.push_back(errors[i] ? Answer{} : answer(std::move(replies[i])));
  return out;
}

// The error of a name an acquire script (kAcquire, kAcquireMany) refused
// with status `st` and its detail `d`; a status this version does not know
// is an InternalError.
[[noreturn]] inline void throw_refused(std::string_view script, std::string_view st, redis::ReplyView d,
                                       const std::string& name, std::optional<DType> dtype, std::string_view node) {
  if (st == "corrupt") throw corrupt_record(name, d.str());
  if (st == "notfound") throw NotFound("no tensor named '" + name + "'");
  if (st == "dtype")
    throw TypeMismatch("tensor '" + name + "' holds " + std::string(d.str()) + ", not " +
                       std::string(dtype ? to_string(*dtype) : "?"));
  if (st == "node")
    throw Unavailable("tensor '" + name + "' lives on node " + std::string(d.str()) + ", this is " + std::string(node));
  if (st == "lost") {
    std::map<std::string, std::string> m;
    for (auto& [f, v] : fields_from_reply(d)) m[f] = v;
    throw Lost("tensor '" + name + "' (generation " + m[std::string(field::generation)] +
               ") was lost: its allocator of record (pid " + m[std::string(field::owner_pid)] + ", session " +
               m[std::string(field::owner)] + ", epoch " + m[std::string(field::epoch)] +
               ") died and no live process held a copy; the name is free to create again");
  }
  if (st == "state") {
    if (d.str() == "lost")
      throw Lost("tensor '" + name + "' was lost: its allocator of record died and nobody held it");
    throw NotFound("tensor '" + name + "' is not ready (state " + std::string(d.str()) + ")");
  }
  unexpected_status(script, st);
}

inline Answer remove(redis::Connection& c, const Keys& k, std::string_view name, const std::string& session) {
  return answer(eval<lua::kRemove>(c, {k.tensor(name), k.names(), k.lifecycle(), k.usage()}, {k.prefix(), session}));
}

inline std::int64_t publish_event(redis::Connection& c, const Keys& k, const std::string& name, std::uint64_t gen,
                                  const std::string& handle) {
  return eval<lua::kPublish>(c, {k.tensor(name), k.lifecycle()}, {gen, handle, k.prefix()}).integer();
}

}  // namespace store
}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
