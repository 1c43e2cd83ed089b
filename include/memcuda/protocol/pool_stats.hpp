// Pool statistics: the JSON array the allocator of record SETs (PX 3 x lease
// ttl) under `memcuda:pool_stats` at every lease renewal, one object per pool,
// so that every process can report them (docs/protocol.md, "Pool
// statistics"). Any client can write the key, so decode_pool_stats is
// strict like decode_command; fields of an entry it does not know are ignored.
#pragma once

#include "memcuda/config.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/error.hpp"
#include "memcuda/protocol/json_util.hpp"
#include "memcuda/protocol/limits.hpp"
#include "memcuda/stats.hpp"
#include "memcuda/tensor_info.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace protocol {

namespace detail {

// The counters of one entry, in wire order, with the member each fills.
inline constexpr std::pair<std::string_view, std::uint64_t PoolStats::*> kPoolCounters[] = {
    {"in_use", &PoolStats::in_use},           {"reserved", &PoolStats::reserved},
    {"peak_in_use", &PoolStats::peak_in_use}, {"budget", &PoolStats::budget},
    {"slabs", &PoolStats::slabs},             {"allocations", &PoolStats::allocations},
    {"frees", &PoolStats::frees},             {"largest_free", &PoolStats::largest_free},
};

// Counters added later: optional on the wire (0 when absent; written only
// when not 0), so the statistics of a leader of an older version decode.
inline constexpr std::pair<std::string_view, std::uint64_t PoolStats::*> kPoolOptionalCounters[] = {
    {"adopted_bytes", &PoolStats::adopted_bytes},
    {"copied_bytes", &PoolStats::copied_bytes},
};

}  // namespace detail

// Throws ProtocolError: too_large, bad_json, trailing_garbage; wrong_type
// when the document is not an array or an entry not an object (the message
// names the entry, "pool_stats[2]"); in an entry, missing_field for any of
// backend, device, device_uuid and the eight counters, wrong_type, and
// bad_value for an unknown backend, a device outside -1..1023 (-1 exactly
// for host), a device_uuid that is not printable ASCII without spaces (it may
// be empty), or a negative counter.
inline std::vector<PoolStats> decode_pool_stats(std::string_view text) {
  namespace json = boost::json;
  using detail::fail;
  json::value doc = detail::parse_document(text, "pool_stats");
  const json::array* a = doc.if_array();
  if (!a) detail::wrong_type("pool_stats", "an array of pool objects", doc);
  std::vector<PoolStats> out;
  out.reserve(a->size());
  for (std::size_t i = 0; i < a->size(); ++i) {
    const std::string at = "pool_stats[" + std::to_string(i) + "]";
    const json::object* o = (*a)[i].if_object();
    if (!o) detail::wrong_type(at, "an object", (*a)[i]);
    auto field = [&](std::string_view f) { return at + "." + std::string(f); };
    PoolStats p;
    std::string_view b = detail::get_string(detail::require(*o, "backend", at), field("backend"));
    auto backend = backend_from_string(b);
    if (!backend)
      fail(ProtocolErrc::bad_value, detail::field_ref(field("backend")) + ": \"" +
                                        memcuda::detail::rules::printable(b) +
                                        "\" is not a backend; expected \"cuda\" or \"host\"");
    p.backend = *backend;
    std::int64_t lo = p.backend == BackendKind::host ? -1 : 0;
    std::int64_t hi = p.backend == BackendKind::host ? -1 : kMaxDevice;
    p.device = static_cast<int>(
        detail::get_int(detail::require(*o, "device", at), field("device"), lo, hi));
    p.device_uuid = detail::get_token_or_empty(detail::require(*o, "device_uuid", at),
                                               field("device_uuid"), kMaxDeviceUuidBytes);
    for (const auto& [name, member] : detail::kPoolCounters)
      p.*member = detail::get_uint(detail::require(*o, name, at), field(name));
    for (const auto& [name, member] : detail::kPoolOptionalCounters)
      if (const json::value* v = o->if_contains(name)) p.*member = detail::get_uint(*v, field(name));
    out.push_back(std::move(p));
  }
  return out;
}

// Compact JSON array, one object per pool, fields in the order above.
// Checked with decode_pool_stats: pools it would reject (a bad device, a
// document over kMaxCommandBytes) throw that ProtocolError.
inline std::string encode_pool_stats(const std::vector<PoolStats>& pools) {
  namespace json = boost::json;
  json::array a;
  a.reserve(pools.size());
  for (const PoolStats& p : pools) {
    json::object o;
    o["backend"] = detail::sv(to_string(p.backend));
    o["device"] = p.device;
    o["device_uuid"] = detail::sv(p.device_uuid);
    for (const auto& [name, member] : detail::kPoolCounters) o[detail::sv(name)] = p.*member;
    for (const auto& [name, member] : detail::kPoolOptionalCounters)
      if (p.*member) o[detail::sv(name)] = p.*member;  // omitted while 0: what older readers saw stays
    a.emplace_back(std::move(o));
  }
  std::string out = json::serialize(a);
  (void)decode_pool_stats(out);
  return out;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::protocol
