// Malformed records, moved aside: a key of the wrong Redis type under a
// listed name, or a record Hash whose fields do not parse, would otherwise
// fail every pass that reads it. The allocator of record's GC moves such a
// key, unchanged, to `quarantine:<id>`, unlinks the name and notes why in
// the `quarantined` Hash (docs/operations.md, "Quarantined records"). Memory
// a corrupt record pointed at is not freed: only its owner could tell what
// it was, and a leak beats freeing memory someone may use.
//
// The move is one script that re-checks what the caller saw (the key's
// type, or the Hash's generation field), so a record rewritten meanwhile
// is left alone.
#pragma once

#include "memcuda/config.hpp"

#include <string>
#include <vector>

#include "memcuda/detail/base/log.hpp"
#include "memcuda/detail/base/node.hpp"
#include "memcuda/detail/store/keys.hpp"
#include "memcuda/redis/connection.hpp"
#include "memcuda/redis/script.hpp"
#include "memcuda/stats.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::quarantine {

// KEYS: record key, names index, quarantine key, index Hash, usage Hash.
// ARGV: name ('' for an unlinked record), id, reason, now ms, what was
//       seen: 'type:<t>' (a key of Redis type t, not a hash) or
//       'gen:<g>' (a hash whose generation field read g; 'gen:' for none).
// -> 'ok' | 'changed' (rewritten since: left alone) | 'gone'
inline const redis::Script& script() {
  static const redis::Script s{R"lua(
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then return 'gone' end
local seen = ARGV[5]
if string.sub(seen, 1, 5) == 'type:' then
  if t ~= string.sub(seen, 6) then return 'changed' end
else
  if t ~= 'hash' then return 'changed' end
  local g = redis.call('HGET', KEYS[1], 'generation') or ''
  if g ~= string.sub(seen, 5) then return 'changed' end
end
if t == 'hash' and ARGV[1] ~= '' then  -- a named record counts in memcuda:usage: no more
  local f = redis.call('HMGET', KEYS[1], 'backend', 'device', 'device_uuid', 'bytes')
  local b = tonumber(f[4])
  if f[1] and b then
    local d = f[1] .. ':' .. (f[2] or '') .. ':' .. (f[3] or '')
    redis.pcall('HINCRBY', KEYS[5], 'tensors:' .. d, -1)
    if b ~= 0 then redis.pcall('HINCRBY', KEYS[5], 'bytes:' .. d, string.format('%.0f', -b)) end
  end
end
redis.call('DEL', KEYS[3])
redis.call('RENAME', KEYS[1], KEYS[3])
-- the indexes as the scripts write them (index_fn.hpp): one of the wrong type is skipped
if ARGV[1] ~= '' then redis.pcall('ZREM', KEYS[2], ARGV[1]) end
redis.pcall('HSET', KEYS[4], ARGV[2], ARGV[4] .. ' ' .. ARGV[3])
return 'ok'
)lua"};
  return s;
}

// The id of a record key: its suffix after "<ns>memcuda:" ("tensor:X").
inline std::string id_of(const Keys& k, std::string_view record_key) {
  const std::string own = k.own_prefix();
  if (record_key.starts_with(own)) record_key.remove_prefix(own.size());
  return std::string(record_key);
}

// Moves `record_key` aside when it is still as seen. `name` is the listed
// name it is the record of ("" for an unlinked one). Returns whether it
// moved; logs what it did.
inline bool move(redis::Connection& c, const Keys& k, const std::string& record_key, const std::string& name,
                 const std::string& seen, const std::string& reason) {
  const std::string qkey = k.quarantine(record_key);
  auto r = script().eval(c, {record_key, k.names(), qkey, k.quarantined(), k.usage()},
                         {name, id_of(k, record_key), reason, now_ms(), seen});
  if (r.str() != "ok") return false;
  log(LogLevel::warn, "quarantined the malformed record " + record_key + " (" + reason + "): its data is kept as " +
                          qkey + "; `memcuda quarantine` lists and clears it");
  return true;
}

inline std::vector<QuarantinedRecord> list(redis::Connection& c, const Keys& k) {
  std::vector<QuarantinedRecord> out;
  auto r = c.command({"HGETALL", k.quarantined()});
  for (std::size_t i = 0; i + 1 < r.size(); i += 2) {
    QuarantinedRecord q;
    q.id = std::string(r[i].str());
    q.key = k.quarantine_of_id(q.id);
    std::string v(r[i + 1].str());
    auto sp = v.find(' ');
    try {
      q.since_ms = std::stoll(v.substr(0, sp));
    } catch (const std::exception&) {
    }
    q.reason = sp == std::string::npos ? v : v.substr(sp + 1);
    out.push_back(std::move(q));
  }
  return out;
}

// Deletes a quarantined record's data and its index entry. False when no
// record of that id is quarantined.
inline bool clear(redis::Connection& c, const Keys& k, std::string_view id) {
  auto r = c.pipeline({{"HDEL", k.quarantined(), std::string(id)}, {"DEL", k.quarantine_of_id(id)}});
  return r[0].integer() == 1 || r[1].integer() == 1;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::quarantine
