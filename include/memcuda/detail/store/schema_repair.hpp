// The repair of the fixed keys of the schema (schema.hpp says which, when
// they are checked and how each is rebuilt): each of the wrong type is
// moved aside as quarantine.hpp moves a record, a warning names it, and it
// is rebuilt from what the registry still knows.
#pragma once

#include "memcuda/config.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/detail/base/log.hpp"
#include "memcuda/detail/base/node.hpp"
#include "memcuda/detail/store/allocations.hpp"
#include "memcuda/detail/store/keys.hpp"
#include "memcuda/detail/store/name_index.hpp"
#include "memcuda/detail/store/records.hpp"
#include "memcuda/detail/store/schema.hpp"
#include "memcuda/error.hpp"
#include "memcuda/redis/connection.hpp"
#include "memcuda/redis/script.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::schema {

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

// Moves `key` aside when it still is of type `seen` (where a `right` key
// belongs; `what`: why else it is moved, "" for its type), logs it with
// `rebuilt`. Returns -1 when it changed meanwhile, else what it counted.
inline long long move_aside(redis::Connection& c, const Keys& k, const std::string& key, const std::string& seen,
                            std::string_view right, const std::string& rebuilt, bool count_usage = false,
                            const std::string& what = {}) {
  const std::string own = k.own_prefix();
  const std::string id = key.starts_with(own) ? key.substr(own.size()) : key;
  const std::string qkey = k.quarantine(key);
  const std::string reason =
      what.empty() ? "a " + seen + " where the key (a " + std::string(right) + ") belongs" : what;
  const long long n = move_script()
                          .eval(c, {key, qkey, k.quarantined(), k.names(), k.usage()},
                                {seen, id, reason, now_ms(), k.prefix(), count_usage ? "1" : "0"})
                          .integer();
  if (n < 0) return n;
  log(LogLevel::warn, "key " + key + " was " + (what.empty() ? "a " + seen + ", not a " + std::string(right) : what) +
                          " (written by another Redis client?): moved aside to " + qkey +
                          " (`memcuda quarantine` lists and clears it); " +
                          (count_usage ? "counted again from the records: " + std::to_string(n) + " tensor(s)"
                                       : rebuilt));
  return n;
}

// Calls `page` with each SCAN page of the keys matching `pattern`.
inline void scan_keys(redis::Connection& c, const std::string& pattern,
                      const std::function<void(std::vector<std::string>&)>& page) {
  std::string cursor = "0";
  do {
    auto r = c.command({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"});
    cursor = std::string(r[0].str());
    std::vector<std::string> keys;
    for (std::size_t i = 0; i < r[1].size(); ++i) keys.emplace_back(r[1][i].str());
    if (!keys.empty()) page(keys);
  } while (cursor != "0");
}

// Runs `s` with KEYS {key} and ARGV {arg0, keys...} per SCAN page of
// `pattern`; returns the sum of its answers.
inline long long per_page(redis::Connection& c, const redis::Script& s, const std::string& key,
                          const std::string& pattern, const std::string& arg0) {
  long long n = 0;
  scan_keys(c, pattern, [&](std::vector<std::string>& keys) {
    std::vector<redis::Arg> args{arg0};
    for (const auto& x : keys) args.emplace_back(x);
    redis::Arg kv[] = {key};
    n += s.eval(c, std::span<const redis::Arg>(kv), std::span<const redis::Arg>(args)).integer();
  });
  return n;
}

// Names from the records: the record keys whose record is one (a Hash with
// a generation whose name field names that key).  ARGV: tensor key prefix, keys...
inline long long rebuild_names(redis::Connection& c, const Keys& k) {
  static const redis::Script s{R"lua(
local n = 0
for i = 2, #ARGV do
  local f = redis.pcall('HMGET', ARGV[i], 'name', 'generation')
  if not f.err and f[1] and f[2] and ARGV[i] == ARGV[1] .. f[1] then n = n + redis.call('ZADD', KEYS[1], 0, f[1]) end
end
return n
)lua"};
  return per_page(c, s, k.names(), k.tensor_pattern(), k.tensor_prefix());
}

// The linked prefixes from the links whose record is linked.  ARGV: link prefix, link keys...
inline long long rebuild_dicts(redis::Connection& c, const Keys& k) {
  static const redis::Script s{R"lua(
local n, p = 0, ARGV[1]
for i = 2, #ARGV do
  local id = redis.pcall('GET', ARGV[i])
  if type(id) == 'string' then
    local st = redis.pcall('HGET', string.sub(p, 1, -10) .. 'dict:' .. id, 'state')
    if st == 'linked' then n = n + redis.call('SADD', KEYS[1], string.sub(ARGV[i], #p + 1)) end
  end
end
return n
)lua"};
  const std::string lp = k.dict_link("");  // "<ns>memcuda:dictlink:"
  return per_page(c, s, k.dicts(), lp + "*", lp);
}

// Every state-dict record's id.  ARGV: record prefix, record keys...
inline long long rebuild_dict_ids(redis::Connection& c, const Keys& k) {
  static const redis::Script s{R"lua(
local n = 0
for i = 2, #ARGV do
  if redis.call('TYPE', ARGV[i])['ok'] == 'hash' then
    n = n + redis.call('SADD', KEYS[1], string.sub(ARGV[i], #ARGV[1] + 1))
  end
end
return n
)lua"};
  const std::string dp = k.dict(std::string_view());
  return per_page(c, s, k.dict_ids(), dp + "*", dp);
}

// The highest number a set of keys carries: each Hash's `generation`
// field ('1' in ARGV[1]) and each key's numeric suffix ('1' in ARGV[2]).
inline const redis::Script& highest_script() {
  static const redis::Script s{R"lua(
local top = 0
for i = 3, #ARGV do
  if ARGV[1] == '1' then
    local g = redis.pcall('HGET', ARGV[i], 'generation')
    g = type(g) == 'string' and tonumber(g)
    if g and g > top and g < 2^53 then top = g end
  end
  if ARGV[2] == '1' then
    local g = tonumber(string.match(ARGV[i], ':(%d+)$'))
    if g and g > top and g < 2^53 then top = g end
  end
end
return string.format('%.0f', top)
)lua"};
  return s;
}
inline std::uint64_t highest_in(redis::Connection& c, const std::string& pattern, bool field, bool suffix) {
  std::uint64_t top = 0;
  scan_keys(c, pattern, [&](std::vector<std::string>& keys) {
    std::vector<redis::Arg> args{field ? "1" : "0", suffix ? "1" : "0"};
    for (const auto& x : keys) args.emplace_back(x);
    auto r = highest_script().eval(c, std::span<const redis::Arg>(), std::span<const redis::Arg>(args));
    top = std::max<std::uint64_t>(top, std::stoull(std::string(r.str())));
  });
  return top;
}
// The highest generation any record carries (named, unlinked, state-dict ids).
inline std::uint64_t highest_generation(redis::Connection& c, const Keys& k) {
  return std::max({highest_in(c, k.tensor_pattern(), true, false), highest_in(c, k.removed_pattern(), true, true),
                   highest_in(c, k.dict(std::string_view()) + "*", false, true)});
}

// Raises a counter to at least `floor` (an absent one too, and one that
// does not parse). KEYS: counter  ARGV: floor  -> 1 raised | 0 | -1 not a string
inline bool raise_counter(redis::Connection& c, const std::string& key, std::uint64_t floor) {
  static const redis::Script s{R"lua(
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'string' and t ~= 'none' then return -1 end
local cur = tonumber(redis.call('GET', KEYS[1]) or '')
if cur and cur >= tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
return 1
)lua"};
  return s.eval(c, {key}, {std::to_string(floor)}).integer() == 1;
}

// The generation counter past every record's generation and the clock.
inline std::uint64_t rebuild_generation(redis::Connection& c, const Keys& k) {
  const std::uint64_t floor = std::max<std::uint64_t>(highest_generation(c, k), static_cast<std::uint64_t>(now_ms()) * 1000);
  raise_counter(c, k.generation(), floor);
  return floor;
}

// The epoch past the lease's and every processing list's.
inline std::uint64_t rebuild_epoch(redis::Connection& c, const Keys& k) {
  std::uint64_t top = highest_in(c, k.processing(0).substr(0, k.processing(0).size() - 1) + "*", false, true);
  std::vector<std::exception_ptr> errs;
  auto lease = c.pipeline({{"GET", k.leader()}}, &errs);
  if (!lease.empty() && !lease[0].is_error() && !lease[0].is_nil()) {
    const std::string t(lease[0].str());
    try {
      top = std::max<std::uint64_t>(top, std::stoull(t.substr(0, t.find(' '))));
    } catch (const std::exception&) {
    }
  }
  raise_counter(c, k.epoch(), top);
  return top;
}

// The processing lists there are, to be re-queued at the next takeover.
inline long long rebuild_processing_lists(redis::Connection& c, const Keys& k) {
  static const redis::Script s{R"lua(
local n = 0
for i = 2, #ARGV do
  if redis.call('TYPE', ARGV[i])['ok'] == 'list' then n = n + redis.call('SADD', KEYS[1], ARGV[i]) end
end
return n
)lua"};
  const std::string p = k.processing(0).substr(0, k.processing(0).size() - 1);
  return per_page(c, s, k.processing_lists(), p + "*", p);
}

// The lease back under its holder's token, when the key is absent (it was
// moved aside: while it was of the wrong type nobody could take it).
inline void restore_lease(redis::Connection& c, const Keys& k, const std::string& token, std::chrono::milliseconds ttl) {
  c.command({"SET", k.leader(), token, "PX", std::to_string(ttl.count()), "NX"});
}

// Whether a counter's value is a decimal number.
inline bool is_number(std::string_view v) {
  return !v.empty() && v.size() < 20 && std::all_of(v.begin(), v.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

// Rebuilds a fixed key moved aside; `leader_part` rebuilds memcuda:owners
// (it judges which sessions live), memcuda:owner_uid and the lease.
inline void rebuild(redis::Connection& c, const Keys& k, const Fixed& f, const std::function<void(Fix)>& leader_part) {
  switch (f.spec->fix) {
    case Fix::none:
    case Fix::drop:
    case Fix::usage: return;
    case Fix::names:
      log(LogLevel::info, "name index " + f.key + " rebuilt from the records: " + std::to_string(rebuild_names(c, k)) +
                              " name(s)");
      return;
    case Fix::owners:
    case Fix::owner_uid:
    case Fix::lease:
      if (leader_part) leader_part(f.spec->fix);
      return;
    case Fix::dicts: rebuild_dicts(c, k); return;
    case Fix::dict_ids: rebuild_dict_ids(c, k); return;
    case Fix::generation:
      log(LogLevel::info, "generation counter " + f.key + " raised to " + std::to_string(rebuild_generation(c, k)));
      return;
    case Fix::epoch: rebuild_epoch(c, k); return;
    case Fix::processing_lists: rebuild_processing_lists(c, k); return;
    case Fix::version_token: store::apply_allocations(c, k, {}); return;
  }
}

// Checks `keys` (fixed keys of the table): one pipeline of their TYPEs
// and of the counters' values. Each of the wrong type, or a counter that
// does not parse, is moved aside and rebuilt. `full` (lease win): the
// generation counter is also raised past the highest generation of every
// record (a SCAN of them). Returns how many keys it moved.
// Whether a failed command met a key of the wrong type.
inline bool wrong_type(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const ReplyError& r) {
    return r.prefix() == "WRONGTYPE";
  } catch (...) {
    return false;
  }
}

// A key that one process alone reads and writes (its session, its inbox,
// the processing list of the lease it holds) of the wrong type would fail
// that process's every pass; no other process repairs it, so the owner
// moves it aside when its command fails with WRONGTYPE, and its next write
// makes the key again. Returns whether it moved the key.
inline bool repair_own(redis::Connection& c, const Keys& k, const std::string& key, std::string_view right) {
  auto r = c.command(store::key_type_cmd(key));
  const std::string type(r.str());
  if (type == "none" || type == right) return false;
  return move_aside(c, k, key, type, right, "its owner writes it again") >= 0;
}

// Runs f, a command on a list only this process uses (its inbox, its
// lease's processing list); met with WRONGTYPE, moves the list aside and
// runs f again, else the process's every pass would fail on it.
template <class F>
auto own_list(redis::Connection& c, const Keys& k, const std::string& key, F&& f) {
  try {
    return f();
  } catch (const ReplyError& e) {
    if (e.prefix() != "WRONGTYPE" || !repair_own(c, k, key, "list")) throw;
  }
  return f();
}

inline std::size_t check(redis::Connection& c, const Keys& k, const std::vector<Fixed>& keys, bool full,
                         const std::function<void(Fix)>& leader_part) {
  std::vector<redis::Command> cmds;
  for (const auto& f : keys) cmds.push_back(store::key_type_cmd(f.key));
  for (const auto& f : keys) cmds.push_back({"GET", f.key});  // the counters' values (others: an error or nil)
  std::vector<std::exception_ptr> errs;
  auto r = c.pipeline(cmds, &errs);
  std::size_t moved = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto& f = keys[i];
    const std::string type(r[i].is_error() ? "" : r[i].str());
    const bool counter = f.spec->fix == Fix::generation || f.spec->fix == Fix::epoch;
    std::string what;
    if (counter && type == "string" && !r[keys.size() + i].is_error() && !r[keys.size() + i].is_nil() &&
        !is_number(r[keys.size() + i].str()))
      what = "'" + std::string(r[keys.size() + i].str().substr(0, 40)) + "', not a number";
    if (type.empty() || type == "none" || (type == f.spec->type && what.empty())) continue;
    if (move_aside(c, k, f.key, type, f.spec->type, std::string(f.spec->rebuilt), f.spec->fix == Fix::usage, what) < 0)
      continue;
    ++moved;
    rebuild(c, k, f, leader_part);
  }
  if (full) {
    const auto top = highest_generation(c, k);
    if (top && raise_counter(c, k.generation(), top))
      log(LogLevel::warn, "generation counter " + k.generation() + " was below the highest generation of a record (" +
                              std::to_string(top) + "): raised past it, so no generation repeats");
  }
  return moved;
}
inline std::size_t check(redis::Connection& c, const Keys& k, bool full, const std::function<void(Fix)>& leader_part) {
  return check(c, k, fixed(k), full, leader_part);
}

// The keys a campaign needs (the lease, its epoch, the owner uid): a
// follower repairs them before campaigning again, since no allocator of
// record can be elected while they are of the wrong type.
inline std::size_t check_lease_keys(redis::Connection& c, const Keys& k) {
  std::vector<Fixed> keys;
  for (auto b : {"leader", "epoch", "owner_uid"}) keys.push_back({fixed_key(k, b), find(b)});
  return check(c, k, keys, false, {});
}

// Whether a Redis error is a key of the wrong type or a counter that does
// not parse: what check() repairs.
inline bool is_fault(const ReplyError& e) {
  const std::string_view w = e.what();
  return e.prefix() == "WRONGTYPE" || w.find("WRONGTYPE") != std::string_view::npos ||
         w.find("not an integer") != std::string_view::npos || w.find("not a number") != std::string_view::npos;
}

// The error a user sees when a command still fails after the repair.
inline ReplyError explain(const ReplyError& e, std::string_view what) {
  return ReplyError(std::string(what) + " failed on a registry key of the wrong type or format (" + e.what() +
                        "); the allocator of record moves such a key aside and rebuilds it at its next garbage "
                        "collection round (docs/operations.md, \"Keys of the wrong type\"): retry then, and see "
                        "`memcuda quarantine`",
                    e.prefix().empty() ? "WRONGTYPE" : e.prefix());
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::schema
