// The scripts of per-device replicas (docs/protocol.md, "Replicas"). A
// replica is an ordinary tensor record under the reserved name
// `.memcuda-rep/<device uuid>/<source name>`, with the source's name and
// generation in `replica_of`/`source_generation`; it is ready when its
// `copied_version` equals the source's `event_version` and its source
// generation is the source's current one. Every key is in KEYS.
#pragma once

#include "memcuda/config.hpp"

#include <cstdint>
#include <exception>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/detail/store/batch_scripts.hpp"
#include "memcuda/detail/store/index_fn.hpp"
#include "memcuda/detail/store/keys.hpp"
#include "memcuda/detail/store/script_call.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// The reserved prefix of replica names, and a replica's name.
inline constexpr std::string_view kReplicaPrefix = ".memcuda-rep/";
inline std::string replica_name(std::string_view device_uuid, std::string_view source) {
  std::string n(kReplicaPrefix);
  n.append(device_uuid).append("/").append(source);
  return n;
}

namespace lua {

// Ready when the replica copied the source's current generation and event
// version; a replica never copied has no copied_version.
inline constexpr char kReplicaReadyFn[] = R"lua(
local function replica_current(r, src_name, sgen, sver)
  return r[1] == 'ready' and r[2] == src_name and r[3] == sgen and r[4] == (sver or '0')
end
)lua";

// Takes a reference on the reader's device's replica of a tensor when it is
// current, else (no replica, or one of an older source) on the source as
// kAcquire does; a replica of the current generation still being copied
// takes nothing.
// With ARGV[10] = '1' (a fleet node's get), a source of another node is
// served by this node's current replica (KEYS[2] is then the node's) and
// refused with 'node' otherwise.
// -> {'replica', HGETALL replica} | {'same', refcount} (the replica, cached)
//    | {'copying', generation} | {'noreplica', HGETALL source}
//    | kAcquire's refusals, of the source
inline constexpr auto kAcquireLocal = join(kNodeFn, kIndexFn, kRefusalFn, kReplicaReadyFn, R"lua(
local f, no = get_checks(KEYS[1], KEYS[3], KEYS[4], ARGV[4], ARGV[2], ARGV[3])
local remote = no and no[1] == 'node' and ARGV[10] == '1'
if no and not remote then return no end
local ok, r = pcall(redis.call, 'HMGET', KEYS[2], 'state', 'replica_of', 'source_generation', 'copied_version',
                    'generation', 'event_version', 'refcount')
if not ok then r = {} end  -- a key of another type: no replica
local key, g, name = KEYS[1], f[4], ARGV[7]
local current = replica_current(r, ARGV[7], f[4], f[6])
if remote and not (current and tonumber(r[5]) and tonumber(r[7] or '0')) then return no end
if current and tonumber(r[5]) and tonumber(r[7] or '0') then
  key, g, name = KEYS[2], r[5], ARGV[8]
  redis.call('HDEL', key, 'idle_since')
elseif not current and r[1] == 'ready' and r[2] == ARGV[7] and r[3] == f[4] and ARGV[9] == '1' then
  return {'copying', r[5]}
end
local rc = redis.call('HINCRBY', key, 'refcount', 1)
if redis.call('HINCRBY', key, 'holder:' .. ARGV[1], 1) == 1 then hold_in(KEYS[5], KEYS[6], ARGV[1], g, name) end
if key == KEYS[2] then
  if ARGV[5] ~= '' and r[5] == ARGV[5] and r[6] == ARGV[6] then return {'same', rc} end
  return {'replica', redis.call('HGETALL', key)}
end
return {'noreplica', redis.call('HGETALL', key)}
)lua");

// The allocator of record's copies into replicas are enqueued: each replica
// of the source's generation ARGV[2] records the copy's event and the
// source event version it reflects, and its waiters are woken.
// KEYS: leader, source, then per replica its record and its waiters set.
// ARGV: token, source generation, source event version ('0': none), key
// prefix, then per replica event handle, path ('peer' | 'host'), device
// uuid, its own generation (a record of that name made by another call is
// not marked with this call's event).
// -> {'ok', n marked} | {'stale', generation, event version} | {'notleader', holder}
inline constexpr auto kReplicaReady = join(kIndexFn, R"lua(
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {'notleader', tostring(redis.call('GET', KEYS[1]))} end
local f = redis.call('HMGET', KEYS[2], 'generation', 'event_version', 'name')
if f[1] ~= ARGV[2] or (f[2] or '0') ~= ARGV[3] then return {'stale', tostring(f[1]), tostring(f[2] or '0')} end
local uuids, n = redis.call('HGET', KEYS[2], 'replicas') or '', 0
for i = 3, #KEYS, 2 do
  local a = 5 + 4 * ((i - 3) / 2)
  local ok, r = pcall(redis.call, 'HMGET', KEYS[i], 'replica_of', 'source_generation', 'generation')
  if ok and r[1] == f[3] and r[2] == ARGV[2] and r[3] == ARGV[a + 3] then
    redis.call('HSET', KEYS[i], 'copied_version', ARGV[3], 'replica_path', ARGV[a + 1], 'event_handle', ARGV[a])
    redis.call('HINCRBY', KEYS[i], 'event_version', 1)
    wake_waiters(ARGV[4], KEYS[i + 1], r[3])
    if not string.find(' ' .. uuids .. ' ', ' ' .. ARGV[a + 2] .. ' ', 1, true) then
      uuids = (uuids == '' and '' or uuids .. ' ') .. ARGV[a + 2]
    end
    n = n + 1
  end
end
redis.call('HSET', KEYS[2], 'replicas', uuids)
return {'ok', n}
)lua");

// The collector's sweep of replicas: each replica whose source is gone, of
// another generation, or unused for longer than its idle_ms is unlinked
// (remove_one: its memory goes with its last reader); a replica in use
// loses its idle clock, an unused one starts it.
// KEYS: leader, names, usage, lifecycle, then per pair replica, source.
// ARGV: token, key prefix, session, now (ms).
// -> {'ok', {removed replica names...}, {generations to free now...}} | {'notleader', holder}
//    (another owner's blocks are sent to it as one "free" command)
inline constexpr auto kReplicaSweep = join(kUnlinkDictFn, kStrayFn, kIndexFn, kRemoveFn, R"lua(
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {'notleader', tostring(redis.call('GET', KEYS[1]))} end
local now, removed, freed, queued = tonumber(ARGV[4]), {}, {}, {}
for i = 5, #KEYS, 2 do
  local ok, r = pcall(redis.call, 'HMGET', KEYS[i], 'replica_of', 'source_generation', 'refcount', 'idle_ms',
                      'idle_since', 'name')
  if ok and r[1] and r[6] then
    local sg = redis.pcall('HGET', KEYS[i + 1], 'generation')
    local gone = type(sg) ~= 'string' or sg ~= r[2]
    local idle_ms, rc = tonumber(r[4] or '0') or 0, tonumber(r[3] or '0') or 0
    if not gone and idle_ms > 0 then
      if rc > 1 then
        redis.call('HDEL', KEYS[i], 'idle_since')
      elseif not r[5] then
        redis.call('HSET', KEYS[i], 'idle_since', ARGV[4])
      elseif now - (tonumber(r[5]) or now) >= idle_ms then
        gone = true
      end
    end
    if gone then
      local out = remove_one(ARGV[2], KEYS[2], KEYS[3], KEYS[i], ARGV[3])
      if out[1] ~= 'notfound' and out[1] ~= 'stray' then removed[#removed + 1] = r[6] end
      if out[1] == 'free' then freed[#freed + 1] = out[2] end
      if out[1] == 'queued' then frees_add(queued, KEYS[4], out[4], out[2]) end
    end
  end
end
frees_send(queued)
return {'ok', removed, freed}
)lua");

}  // namespace lua

namespace store {

// kAcquireLocal of `source` on the device `device_uuid` for `holder`, with a
// cached replica's generation and event version ('' = none); `wait`: a
// replica being copied answers 'copying' (else the source is taken).
// `remote`: a fleet node's get (the replica of `device_uuid`, the node id
// there, serves a source of another node).
inline Answer acquire_local(redis::Connection& c, const Keys& k, std::string_view source, std::string_view device_uuid,
                            const std::string& holder, std::string_view dtype, const std::string& node,
                            const std::string& token, bool wait, const std::string& cached_gen = {},
                            const std::string& cached_version = {}, bool remote = false) {
  const std::string rep = replica_name(device_uuid, source);
  return answer(eval<lua::kAcquireLocal>(
      c, {k.tensor(source), k.tensor(rep), k.leader(), k.lost(source), k.refs(holder), k.holders()},
      {holder, dtype, node, token, cached_gen, cached_version, source, rep, wait ? "1" : "0", remote ? "1" : "0"}));
}

// One replica the copy reached: its device, the copy's event, its path.
struct ReplicaMark {
  std::string device_uuid;
  std::string event_handle;  // 64 raw bytes
  std::string path;          // "peer" | "host"
  std::uint64_t generation;  // the replica's own
};

// One source's replicas that a replicate copied: its record's generation
// and event version then, and a mark per replica.
struct ReadySource {
  std::string_view name;
  std::uint64_t generation, version;
  const std::vector<ReplicaMark>* marks;
};

// kReplicaReady of each source, as EVALSHA commands of the script `sha`
// (the cluster's own on a cluster: script_call.hpp).
inline std::vector<redis::Command> replica_ready_cmds(const Keys& k, std::string_view sha, const std::string& token,
                                                      const std::vector<ReadySource>& srcs) {
  std::vector<redis::Command> out;
  out.reserve(srcs.size());
  for (const auto& s : srcs) {
    redis::Command keys{k.leader(), k.tensor(s.name)};
    redis::Command args{token, std::to_string(s.generation), std::to_string(s.version), k.prefix()};
    for (const auto& m : *s.marks) {
      const std::string rep = replica_name(m.device_uuid, s.name);
      keys.push_back(k.tensor(rep));
      keys.push_back(k.waiters(rep));
      args.insert(args.end(), {m.event_handle, m.path, m.device_uuid, std::to_string(m.generation)});
    }
    redis::Command cmd{"EVALSHA", std::string(sha), std::to_string(keys.size())};
    cmd.insert(cmd.end(), std::make_move_iterator(keys.begin()), std::make_move_iterator(keys.end()));
    cmd.insert(cmd.end(), std::make_move_iterator(args.begin()), std::make_move_iterator(args.end()));
    out.push_back(std::move(cmd));
  }
  return out;
}

// kReplicaReady of every source in one round trip (a replicate of a model's
// hundreds of tensors paid one each; Script::eval_each). An error reply
// throws, after the others ran. -> one Answer per source.
inline std::vector<Answer> replica_ready(redis::Connection& c, const Keys& k, const std::string& token,
                                         const std::vector<ReadySource>& srcs) {
  const auto& script = store::script<lua::kReplicaReady>(c);
  auto replies = script.eval_each(c, replica_ready_cmds(k, script.sha(), token, srcs));
  std::vector<Answer> out;
  out.reserve(replies.size());
  for (auto& r : replies) out.push_back(answer(std::move(r)));
  return out;
}

// replica_ready of one source.
inline Answer replica_ready(redis::Connection& c, const Keys& k, const std::string& token, std::string_view source,
                            std::uint64_t gen, std::uint64_t version, const std::vector<ReplicaMark>& marks) {
  return std::move(replica_ready(c, k, token, {{source, gen, version, &marks}}).front());
}

// kReplicaSweep over `replicas` (names under kReplicaPrefix) and their sources.
inline Answer replica_sweep(redis::Connection& c, const Keys& k, const std::string& token, const std::string& session,
                            const std::vector<std::pair<std::string, std::string>>& replicas, std::int64_t now_ms) {
  std::vector<redis::Arg> keys{k.leader(), k.names(), k.usage(), k.lifecycle()};
  for (const auto& [rep, src] : replicas) {
    keys.emplace_back(k.tensor(rep));
    keys.emplace_back(k.tensor(src));
  }
  const std::vector<redis::Arg> args{token, k.prefix(), session, std::to_string(now_ms)};
  return answer(eval<lua::kReplicaSweep>(c, keys, args));
}

}  // namespace store
}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
