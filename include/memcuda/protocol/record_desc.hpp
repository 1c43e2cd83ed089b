// The "desc" field of a tensor Hash (docs/protocol.md, "The desc field"):
// one compact, versioned string holding every field of the record that does
// not change while the record lives, so that a batch get reads a record with
// one HMGET of 8 small fields instead of an HGETALL of ~23. It is a
// redundant cache: the individual fields stay the truth, and a reader uses
// desc only when it names the record's current epoch and generation.
//
// A desc is decoded by RecordReader (record.hpp), the decoder of every
// record, with decode_record's rules and messages.
#pragma once

#include "memcuda/config.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memcuda/protocol/record.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace protocol {

namespace record_field {
// The compact copy of the fields that do not change (record_desc.hpp).
inline constexpr std::string_view desc = "desc";
}  // namespace record_field

// Layout, version 1 (every element is `<decimal length>:<bytes>`):
//   "M1"
//   the 17 kDescFields values in this order (an empty element: field absent)
//   the number of extra pairs n, then n elements key, value: every other
//     field encode_record wrote that does not change (fields added after
//     version 1, such as fd_source of a cuda_vmm_fd allocation)
//   epoch, then generation (appended by the create_many script, which is
//     the one that knows it)
// A reader of version 1 that meets another version does not use the desc
// (the acquire_many script checks the two bytes and reads the fields).
inline constexpr std::string_view kDescVersion = "M1";
inline constexpr std::size_t kDescMaxExtras = 64;

inline constexpr std::array<std::string_view, 17> kDescFields = {
    record_field::name,        record_field::dtype,     record_field::shape,       record_field::ctime,
    record_field::node,        record_field::device,    record_field::device_uuid, record_field::bytes,
    record_field::backend,     record_field::ipc_handle, record_field::offset,     record_field::alloc_bytes,
    record_field::alloc_id,    record_field::alloc_kind, record_field::owner,      record_field::owner_pid,
    record_field::create_id};

// Fields that change while a record lives (or are the record's identity,
// checked apart): never in a desc's body or extras.
inline bool desc_excluded(std::string_view k) noexcept {
  namespace f = record_field;
  return k == f::state || k == f::refcount || k == f::generation || k == f::epoch || k == f::event_handle ||
         k == f::event_version || k == f::desc || k == f::copied_version || k == f::replica_path ||
         k.starts_with(f::holder_prefix);
}

namespace detail {
inline void desc_element(std::string& out, std::string_view v) {
  out += std::to_string(v.size());
  out += ':';
  out += v;
}
}  // namespace detail

// The desc of a record up to (not including) its generation element, from
// the fields encode_record wrote: what the allocator hands the create_many
// script, which appends the generation it assigns. A field added to the
// record later travels in the extras without a change here.
inline std::string encode_desc_body(const Fields& fields) {
  std::array<std::string_view, kDescFields.size()> pos{};
  std::vector<const std::pair<std::string, std::string>*> extras;
  std::string_view epoch;
  std::size_t size = 64;
  for (const auto& kv : fields) {
    size += kv.second.size() + 8;
    if (kv.first == record_field::epoch) epoch = kv.second;
    if (desc_excluded(kv.first)) continue;
    bool placed = false;
    for (std::size_t i = 0; i < kDescFields.size() && !placed; ++i)
      if (kv.first == kDescFields[i]) {
        pos[i] = kv.second;
        placed = true;
      }
    if (!placed) extras.push_back(&kv);
  }
  std::string out(kDescVersion);
  out.reserve(size);
  for (auto v : pos) detail::desc_element(out, v);
  detail::desc_element(out, std::to_string(extras.size()));
  for (const auto* kv : extras) {
    detail::desc_element(out, kv->first);
    detail::desc_element(out, kv->second);
  }
  detail::desc_element(out, epoch);
  return out;
}

inline std::string encode_desc_body(const TensorInfo& t) { return encode_desc_body(encode_record(t)); }

// The whole desc of `t` (as the create_many script stores it).
inline std::string encode_desc(const TensorInfo& t) {
  std::string out = encode_desc_body(t);
  detail::desc_element(out, std::to_string(t.generation));
  return out;
}

// A parsed desc: views into the string it was parsed from.
struct DescView {
  std::array<std::string_view, kDescFields.size()> fields{};  // "" = absent
  std::vector<std::pair<std::string_view, std::string_view>> extras;
  std::string_view epoch;
  std::string_view generation;
};

// Splits a desc into its elements. Throws ProtocolError(bad_record) naming
// what is wrong: another version, an element that is cut or not
// `<length>:`, too many extras, an extra naming a field a desc must not
// carry, bytes after the generation.
inline DescView parse_desc(std::string_view d, std::string_view who = "tensor record") {
  auto bad = [&](const std::string& why) {
    detail::fail(ProtocolErrc::bad_record, std::string(who) + ": field \"desc\" " + why);
  };
  if (!d.starts_with(kDescVersion))
    bad("is not a version " + std::string(kDescVersion) + " desc (starts \"" +
        memcuda::detail::rules::printable(d.substr(0, 2)) + "\")");
  std::size_t at = kDescVersion.size();
  auto next = [&]() -> std::string_view {
    std::size_t len = 0, digits = 0;
    while (at < d.size() && d[at] >= '0' && d[at] <= '9') {
      if (++digits > 7) bad("has an element length over 7 digits at offset " + std::to_string(at));
      len = len * 10 + static_cast<std::size_t>(d[at] - '0');
      ++at;
    }
    if (digits == 0 || at >= d.size() || d[at] != ':')
      bad("has no element `<length>:` at offset " + std::to_string(at));
    ++at;
    if (len > d.size() - at)
      bad("has an element of " + std::to_string(len) + " bytes at offset " + std::to_string(at) + ", only " +
          std::to_string(d.size() - at) + " left");
    std::string_view v = d.substr(at, len);
    at += len;
    return v;
  };
  DescView out;
  for (auto& v : out.fields) v = next();
  const std::string_view n = next();
  auto count = detail::parse_decimal<std::uint32_t>(n);
  if (!count || *count > kDescMaxExtras)
    bad("gives " + std::string("\"") + memcuda::detail::rules::printable(n) + "\" extra fields, expected 0.." +
        std::to_string(kDescMaxExtras));
  out.extras.reserve(*count);
  for (std::uint32_t i = 0; i < *count; ++i) {
    std::string_view k = next();
    std::string_view v = next();
    if (k.empty() || desc_excluded(k))
      bad("carries the field \"" + memcuda::detail::rules::printable(k) + "\", which changes or is checked apart");
    for (auto known : kDescFields)
      if (k == known) bad("carries \"" + std::string(k) + "\" twice");
    out.extras.emplace_back(k, v);
  }
  out.epoch = next();
  out.generation = next();
  if (at != d.size()) bad("has " + std::to_string(d.size() - at) + " bytes after its last element");
  return out;
}

// RecordReader's fields from a desc: kDescFields are its first 14, then
// owner, owner_pid, create_id; the extras by name.
inline void RecordReader::add(const DescView& d) {
  static constexpr std::array<int, kDescFields.size()> at = {
      kName, kDtype, kShape, kCtime, kNode, kDevice, kDeviceUuid, kBytes, kBackend, kIpcHandle, kOffset,
      kAllocBytes, kAllocId, kAllocKind, kOwner, kOwnerPid, kCreateId};
  for (std::size_t i = 0; i < kDescFields.size(); ++i)
    if (!d.fields[i].empty()) set(at[i], d.fields[i]);
  for (const auto& [k, v] : d.extras) add(k, v);
  set(kEpoch, d.epoch);
  set(kGeneration, d.generation);
}

// What a batch get read next to the desc (the fields that change), for
// decode_desc.
struct LiveFields {
  std::string_view state = "ready";
  std::int64_t refcount = 0;
  std::optional<std::string_view> event_handle;   // nullopt: field absent
  std::optional<std::string_view> event_version;  // nullopt: field absent
  std::string_view generation;                    // the record's own fields, compared with the desc's
  std::string_view epoch;
};

// Decodes a record from its desc and the fields that change. Throws
// ProtocolError(bad_record) when the desc is malformed or describes another
// generation or epoch than the record's (a stale desc), or when the fields
// break decode_record's rules.
inline TensorInfo decode_desc(std::string_view desc, const LiveFields& live) {
  const DescView d = parse_desc(desc);
  if (d.generation != live.generation || d.epoch != live.epoch)
    detail::fail(ProtocolErrc::bad_record,
                 "tensor record: field \"desc\" describes generation " +
                     memcuda::detail::rules::printable(d.generation) + " epoch " +
                     memcuda::detail::rules::printable(d.epoch) + ", the record is generation " +
                     memcuda::detail::rules::printable(live.generation) + " epoch " +
                     memcuda::detail::rules::printable(live.epoch));
  RecordReader r;
  r.add(d);
  r.add(record_field::state, live.state);
  const std::string rc = std::to_string(live.refcount);
  r.add(record_field::refcount, rc);
  if (live.event_handle) r.add(record_field::event_handle, *live.event_handle);
  if (live.event_version) r.add(record_field::event_version, *live.event_version);
  try {
    return r.finish();
  } catch (const ProtocolError& e) {
    detail::fail(e.errc(), std::string(e.what()) + " (read from its desc)");
  }
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::protocol
