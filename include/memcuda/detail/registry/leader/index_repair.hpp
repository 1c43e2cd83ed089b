// Index keys of the wrong Redis type. The keys the scripts keep beside the
// records (memcuda:names, memcuda:usage, memcuda:holders, memcuda:owners,
// memcuda:refs:<holder>) and those every registry rewrites
// (memcuda:sessions, memcuda:quarantined) are derived from the records or
// refreshed by their writers. Another Redis client writing one of them with
// another type (`SET memcuda:usage x`) would fail every command that reads
// it: the scripts skip such a key (index_fn.hpp), and the allocator of
// record, when it takes the lease and at each garbage collection round (one
// pipelined TYPE of the fixed keys), moves it aside as quarantine.hpp moves
// a record (to `memcuda:quarantine:<suffix>`, noted in memcuda:quarantined,
// listed and cleared by `memcuda quarantine`), logs it, and rebuilds it:
//
//   names        from the records (SCAN of memcuda:tensor:*)
//   usage        counted from the records, in the script that moves it
//   owners       the live sessions that may lead (a superset: the orphan
//                scan drops those that own nothing once they die)
//   holders      the sweep of GC writes each record's holders back
//   refs:<h>     the same sweep; found where a write to it fails (the
//                sweep's) or where GC reads it (a dead holder's)
//   sessions     each registry's heartbeat adds its session again
//   quarantined  starts anew, naming the old one
#pragma once

#include "memcuda/config.hpp"

#include <algorithm>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/detail/base/log.hpp"
#include "memcuda/detail/base/node.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/liveness.hpp"
#include "memcuda/detail/store/keys.hpp"
#include "memcuda/detail/store/name_index.hpp"
#include "memcuda/protocol/session.hpp"
#include "memcuda/redis/connection.hpp"
#include "memcuda/redis/script.hpp"
#include "memcuda/detail/store/indexes.hpp"
#include "memcuda/detail/store/records.hpp"
#include "memcuda/detail/store/sessions.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::index_repair {

// Moves a key aside when it still has the type seen, and notes it; for
// memcuda:usage, counts the new counters in the same script.
// KEYS: key, quarantine key, quarantined Hash, names, usage
// ARGV: type seen, id, reason, now ms, key prefix, '1' to count usage
// -> -1 (changed since: left alone) | records counted (0 when not counting)
inline const redis::Script& move_script() {
  static const redis::Script s{std::string(kRecountUsageFn) + R"lua(
if redis.call('TYPE', KEYS[1])['ok'] ~= ARGV[1] then return -1 end
redis.call('DEL', KEYS[2])
redis.call('RENAME', KEYS[1], KEYS[2])
redis.pcall('HSET', KEYS[3], ARGV[2], ARGV[4] .. ' ' .. ARGV[3])
if ARGV[6] == '1' and redis.call('TYPE', KEYS[4])['ok'] == 'zset' then
  return recount_usage(KEYS[4], KEYS[5], ARGV[5])
end
return 0
)lua"};
  return s;
}

// Adds to the name index the names of the given record keys whose record
// is one (a Hash with a generation whose name field names that key): a
// record removed since the SCAN that found it is not added back.
// KEYS: names   ARGV: tensor key prefix, record keys...  -> names added
inline const redis::Script& add_names_script() {
  static const redis::Script s{R"lua(
local n = 0
for i = 2, #ARGV do
  local f = redis.pcall('HMGET', ARGV[i], 'name', 'generation')
  if not f.err and f[1] and f[2] and ARGV[i] == ARGV[1] .. f[1] then
    n = n + redis.call('ZADD', KEYS[1], 0, f[1])
  end
end
return n
)lua"};
  return s;
}

// Moves `key` aside when it still is of type `seen` (where a `right` key
// belongs), logs it with `rebuilt` (what puts it back). Returns the script's
// answer: -1 when it changed meanwhile, else what it counted.
inline long long move_aside(redis::Connection& c, const Keys& k, const std::string& key, const std::string& seen,
                            std::string_view right, const std::string& rebuilt, bool count_usage = false) {
  const std::string own = k.own_prefix();
  const std::string id = key.starts_with(own) ? key.substr(own.size()) : key;
  const std::string qkey = k.quarantine(key), index = k.quarantined(), names = k.names(), usage = k.usage();
  const std::string reason = "a " + seen + " where the index key (a " + std::string(right) + ") belongs";
  const std::string now = std::to_string(now_ms()), pfx = k.prefix(), count = count_usage ? "1" : "0";
  redis::Arg keys[] = {key, qkey, index, names, usage};
  redis::Arg args[] = {seen, id, reason, now, pfx, count};
  auto r = move_script().eval(c, std::span<const redis::Arg>(keys), std::span<const redis::Arg>(args));
  const long long n = r.integer();
  if (n < 0) return n;
  log(LogLevel::warn, "index key " + key + " was a " + seen + ", not a " + std::string(right) +
                          " (written by another Redis client?): moved aside to " + qkey +
                          " (`memcuda quarantine` lists and clears it); " +
                          (count_usage ? "counted again from the records: " + std::to_string(n) + " tensor(s)"
                                       : rebuilt));
  return n;
}

// The name index from the records: SCAN of the record keys, their names
// added a page at a time. Returns how many names it added.
inline std::uint64_t rebuild_names(redis::Connection& c, const Keys& k) {
  const std::string names = k.names(), tp = k.tensor_prefix();
  std::uint64_t added = 0;
  std::string cursor = "0";
  do {
    auto r = store::scan_named(c, k, cursor, 1000);
    cursor = std::string(r[0].str());
    if (r[1].size() == 0) continue;
    std::vector<redis::Arg> args{tp};
    for (std::size_t i = 0; i < r[1].size(); ++i) args.emplace_back(r[1][i].str());
    redis::Arg keys[] = {names};
    auto n = add_names_script().eval(c, std::span<const redis::Arg>(keys), std::span<const redis::Arg>(args));
    added += static_cast<std::uint64_t>(n.integer());
  } while (cursor != "0");
  return added;
}

// memcuda:owners again: every live session that may lead (it may own
// records) and the lease holder's. Returns how many it wrote.
inline std::size_t rebuild_owners(redis::Connection& c, const Keys& k, const std::string& node) {
  std::vector<std::string> ids;
  std::vector<std::exception_ptr> errs;
  auto base = store::sessions_and_leader(c, k, &errs);
  if (!base[0].is_error())
    for (std::size_t i = 0; i < base[0].size(); ++i) ids.emplace_back(base[0][i].str());
  std::vector<redis::Command> add;
  if (!base[1].is_error() && !base[1].is_nil()) {
    const std::string token(base[1].str());
    if (auto sp = token.find(' '); sp != std::string::npos) add.push_back(store::add_owner_cmd(k, token.substr(sp + 1)));
  }
  if (!ids.empty()) {
    std::vector<redis::Command> get;
    for (const auto& id : ids) get.push_back(store::read_session_cmd(k, id));
    auto v = c.pipeline(get, &errs);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (v[i].is_error() || v[i].is_nil() || session_proves_death(v[i].str(), node)) continue;
      try {
        if (protocol::decode_session(v[i].str()).allocator_capable) add.push_back(store::add_owner_cmd(k, ids[i]));
      } catch (const std::exception&) {  // unreadable: not a session that leads
      }
    }
  }
  if (!add.empty()) c.pipeline(add, &errs);
  return add.size();
}

// The periodic check: one pipelined TYPE of the fixed index keys; each of
// a wrong type is moved aside and rebuilt (see the top of this file). An
// older version's name index (a Set) is converted instead. Returns how
// many keys it moved.
inline std::size_t check(redis::Connection& c, const Keys& k, const std::string& node) {
  struct Fixed {
    std::string key;
    std::string_view type;
  };
  // The index of moved keys first: each move below notes itself there; the
  // names before the counters, which are counted from them.
  const Fixed fixed[] = {{k.quarantined(), "hash"}, {k.names(), "zset"},  {k.usage(), "hash"},
                         {k.holders(), "set"},      {k.owners(), "set"},  {k.sessions(), "set"}};
  std::vector<redis::Command> cmds;
  for (const auto& f : fixed) cmds.push_back(store::key_type_cmd(f.key));
  auto types = c.pipeline(cmds);
  std::size_t moved = 0;
  for (std::size_t i = 0; i < std::size(fixed); ++i) {
    const std::string type(types[i].str());
    const auto& f = fixed[i];
    if (type == "none" || type == f.type) continue;
    if (f.key == k.names() && type == "set") {  // an older version's index
      upgrade_name_index(c, k);
      continue;
    }
    std::string rebuilt;
    if (f.key == k.holders()) rebuilt = "the garbage collector's sweep writes the holders of the records back";
    else if (f.key == k.sessions()) rebuilt = "each registry's heartbeat adds its session back";
    else if (f.key == k.quarantined()) rebuilt = "it starts anew";
    else if (f.key == k.owners()) rebuilt = "written again with the live sessions that may lead";
    else if (f.key == k.names()) rebuilt = "rebuilt from the records";
    if (move_aside(c, k, f.key, type, f.type, rebuilt, f.key == k.usage()) < 0) continue;
    ++moved;
    if (f.key == k.names()) {
      const auto n = rebuild_names(c, k);
      log(LogLevel::info, "name index " + f.key + " rebuilt from the records: " + std::to_string(n) + " name(s)");
    } else if (f.key == k.owners()) {
      rebuild_owners(c, k, node);
    }
  }
  return moved;
}

// Up to `n` members of a holder's reference index. An index of the wrong
// type is moved aside (the sweep writes the references back from the
// records) and reads as empty.
inline std::vector<std::string> refs_page(redis::Connection& c, const Keys& k, const std::string& holder,
                                          std::size_t n) {
  std::vector<std::exception_ptr> errs;
  const std::string key = k.refs(holder);
  auto r = store::sample_refs(c, k, holder, n, &errs);
  std::vector<std::string> out;
  if (r.is_error()) {
    const std::string type = store::key_type(c, key);
    if (type != "set" && type != "none")
      move_aside(c, k, key, type, "set", "the garbage collector's sweep writes the references back from the records");
    return out;
  }
  for (std::size_t i = 0; i < r.size(); ++i) out.emplace_back(r[i].str());
  return out;
}

// After a pipeline of index writes (SADD to refs:<h> and holders): each key
// whose write failed for its type is moved aside and its writes sent again.
inline void redo_failed(redis::Connection& c, const Keys& k, const std::vector<redis::Command>& writes,
                        const std::vector<std::exception_ptr>& errs) {
  std::vector<std::string> bad;
  for (std::size_t i = 0; i < writes.size() && i < errs.size(); ++i) {
    if (!errs[i] || writes[i].size() < 2) continue;
    const std::string key(writes[i][1]);
    if (std::find(bad.begin(), bad.end(), key) == bad.end()) bad.push_back(key);
  }
  if (bad.empty()) return;
  std::vector<redis::Command> again;
  for (const auto& key : bad) {
    const std::string type = store::key_type(c, key);
    if (type == "set" || type == "none") continue;  // changed meanwhile, or not a type fault
    if (move_aside(c, k, key, type, "set", "written again from the records now") < 0) continue;
    for (const auto& w : writes)
      if (w.size() >= 2 && std::string_view(w[1]) == key) again.push_back(w);
  }
  std::vector<std::exception_ptr> e2;
  if (!again.empty()) c.pipeline(again, &e2);
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::index_repair
