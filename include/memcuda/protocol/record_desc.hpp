// The "desc" field of a tensor Hash (docs/protocol.md, "The desc field"):
// one compact, versioned string holding every field of the record that does
// not change while the record lives, so that a batch get reads a record with
// one HMGET of 8 small fields instead of an HGETALL of ~23 (the Redis side of
// a 291-tensor get_many was dominated by HGETALL and its nested reply).
//
// It is a redundant cache: the individual fields stay the truth, any Redis
// client reads them, and a reader uses desc only when it names the record's
// current epoch and generation (a record republished under a new generation
// by migration keeps a desc of the old one only if a script forgot to
// delete it; the comparison makes that harmless).
//
// Also here: RecordReader, which decodes Hash fields given one at a time as
// views (from a desc, or straight from an HGETALL reply) into a TensorInfo
// without building a map per record. It accepts and rejects exactly what
// decode_record does (fuzz/fuzz_desc.cpp checks that against decode_record);
// a field it does not know is handed, with the rest, to decode_record.
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
         k == f::event_version || k == f::desc || k.starts_with(f::holder_prefix);
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

// Decodes Hash fields given one at a time (views that must outlive
// finish()) into a TensorInfo, with decode_record's rules and messages.
// Unknown fields (other than desc) make finish() hand everything to
// decode_record, so a field added to the record later is decoded as
// decode_record decodes it.
class RecordReader {
 public:
  void add(std::string_view k, std::string_view v) {
    namespace f = record_field;
    if (k.starts_with(f::holder_prefix)) {
      holders_.emplace_back(k, v);
      return;
    }
    const int i = index_of(k);
    if (i < 0) {
      // desc, and the id of a state dict linked over the record (read by
      // scripts only), are not TensorInfo's
      if (k != f::desc && k != "dict") unknown_.emplace_back(k, v);
      return;
    }
    set(i, v);
  }

  // Adds the fields of a parsed desc (its epoch and generation included).
  void add(const DescView& d) {
    // kDescFields are kNames' first 14, then owner, owner_pid, create_id
    static constexpr std::array<int, kDescFields.size()> at = {
        kName, kDtype, kShape, kCtime, kNode, kDevice, kDeviceUuid, kBytes, kBackend, kIpcHandle, kOffset,
        kAllocBytes, kAllocId, kAllocKind, kOwner, kOwnerPid, kCreateId};
    for (std::size_t i = 0; i < kDescFields.size(); ++i)
      if (!d.fields[i].empty()) set(at[i], d.fields[i]);
    for (const auto& [k, v] : d.extras) add(k, v);
    set(kEpoch, d.epoch);
    set(kGeneration, d.generation);
  }

  // The fields added, as decode_record takes them (desc left out).
  Fields fields() const {
    Fields out;
    for (int i = 0; i < kCount; ++i)
      if (seen_ & (1u << i)) out.emplace_back(std::string(kNames[i]), std::string(v_[i]));
    if (!dup_.empty()) out.emplace_back(std::string(dup_), std::string());
    for (const auto& [k, v] : holders_) out.emplace_back(std::string(k), std::string(v));
    for (const auto& [k, v] : unknown_) out.emplace_back(std::string(k), std::string(v));
    return out;
  }

  TensorInfo finish() const {
    if (!unknown_.empty()) return decode_record(fields());
    namespace f = record_field;
    TensorInfo t;
    for (const auto& [k, v] : holders_) {
      std::string id(k.substr(f::holder_prefix.size()));
      if (id.empty()) bad(k, "names no holder");
      auto n = detail::parse_decimal<std::int64_t>(v);
      if (!n || *n < 0) bad(k, "is \"" + memcuda::detail::rules::printable(v) + "\", expected an integer >= 0");
      if (!t.holders.emplace(std::move(id), *n).second) bad(k, "appears twice");
    }
    if (!dup_.empty()) bad(dup_, "appears twice");
    finish_identity(t);
    finish_placement(t);
    finish_optional(t);
    return t;
  }

 private:
  // name, dtype, shape and bytes, which must agree.
  void finish_identity(TensorInfo& t) const {
    namespace f = record_field;
    std::string_view name = required(kName);
    if (!is_valid_name(name)) bad(f::name, "is " + shown_text(name) + ", not a valid tensor name");
    t.name = std::string(name);

    std::string_view dt = required(kDtype);
    auto dtype = dtype_from_string(dt);
    if (!dtype) bad(f::dtype, "is " + shown_text(dt) + ", not a dtype");
    t.dtype = *dtype;

    std::string_view sh = required(kShape);
    try {
      t.shape = shape_from_string(sh);
    } catch (const ProtocolError& e) {
      bad(f::shape, "is " + shown_text(sh) + ": " + e.what());
    }

    t.bytes = as_u64(f::bytes, required(kBytes));
    std::uint64_t expected = 0;
    try {
      expected = byte_size(t.dtype, t.shape);
    } catch (const ProtocolError& e) {
      bad(f::shape, std::string("does not give a valid size: ") + e.what());
    }
    if (t.bytes != expected)
      bad(f::bytes, "is " + std::to_string(t.bytes) + " but " + std::string(to_string(t.dtype)) + " " +
                        shape_to_string(t.shape) + " needs " + std::to_string(expected));
  }

  // backend, state, generation, refcount, device and ipc_handle.
  void finish_placement(TensorInfo& t) const {
    namespace f = record_field;
    std::string_view be = required(kBackend);
    auto backend = backend_from_string(be);
    if (!backend) bad(f::backend, "is " + shown_text(be) + ", expected \"cuda\" or \"host\"");
    t.backend = *backend;

    std::string_view st = required(kState);
    auto state = state_from_string(st);
    if (!state) bad(f::state, "is " + shown_text(st) + ", expected \"pending\", \"ready\" or \"lost\"");
    t.state = *state;

    t.generation = as_u64(f::generation, required(kGeneration));
    t.refcount = as_i64(f::refcount, required(kRefcount));
    if (t.refcount < 0) bad(f::refcount, "is " + std::to_string(t.refcount) + ", expected >= 0");

    std::int64_t device = as_i64(f::device, required(kDevice));
    if (t.backend == BackendKind::host && device != -1)
      bad(f::device, "is " + std::to_string(device) + ", expected -1 for a host tensor");
    if (t.backend == BackendKind::cuda && (device < 0 || device > protocol::kMaxDevice))
      bad(f::device, "is " + std::to_string(device) + ", expected 0..1023 for a cuda tensor");
    t.device = static_cast<int>(device);

    t.ipc_handle = std::string(required(kIpcHandle));
    if (t.state != TensorState::pending) {
      if (t.backend == BackendKind::cuda && t.ipc_handle.size() != kIpcHandleBytes)
        bad(f::ipc_handle, "is " + std::to_string(t.ipc_handle.size()) + " bytes, expected 64 for a cuda tensor");
      if (t.backend == BackendKind::host && t.ipc_handle.empty())
        bad(f::ipc_handle, "is empty, expected the allocation key (or an older version's shm object name) of a host tensor");
    }
  }

  // The optional fields: absent ones keep TensorInfo's defaults.
  void finish_optional(TensorInfo& t) const {
    namespace f = record_field;
    if (has(kCtime)) t.ctime_ms = as_i64(f::ctime, v_[kCtime]);
    if (has(kNode)) t.node = std::string(v_[kNode]);
    if (has(kDeviceUuid)) t.device_uuid = std::string(v_[kDeviceUuid]);
    if (has(kOffset)) t.offset = as_u64(f::offset, v_[kOffset]);
    if (t.state != TensorState::pending || has(kAllocBytes)) {
      t.alloc_bytes = as_u64(f::alloc_bytes, required(kAllocBytes));
      if (t.state != TensorState::pending && (t.offset > t.alloc_bytes || t.bytes > t.alloc_bytes - t.offset))
        bad(f::alloc_bytes, "is " + std::to_string(t.alloc_bytes) + ", too small for offset " +
                                std::to_string(t.offset) + " + bytes " + std::to_string(t.bytes));
    }
    if (has(kAllocId)) t.alloc_id = as_u64(f::alloc_id, v_[kAllocId]);
    if (has(kEpoch)) t.epoch = as_u64(f::epoch, v_[kEpoch]);
    if (has(kOwner)) t.owner = std::string(v_[kOwner]);
    if (has(kOwnerPid)) t.owner_pid = as_i64(f::owner_pid, v_[kOwnerPid]);
    if (has(kCreateId)) t.create_id = std::string(v_[kCreateId]);
    if (has(kEventHandle)) {
      t.event_handle = std::string(v_[kEventHandle]);
      if (!t.event_handle.empty() && t.event_handle.size() != kIpcHandleBytes)
        bad(f::event_handle, "is " + std::to_string(t.event_handle.size()) + " bytes, expected 0 or 64");
    }
    if (has(kEventVersion)) t.event_version = as_u64(f::event_version, v_[kEventVersion]);
    if (has(kAllocKind)) {
      std::string_view v = v_[kAllocKind];
      if (v.empty() || v.size() > 64 || !std::all_of(v.begin(), v.end(), [](char c) {
            return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
          }))
        bad(f::alloc_kind, "is " + shown_text(v) + ", expected a kind such as \"host_shm\" or \"cuda_ipc\"");
      t.alloc_kind = std::string(v);
    }
    if (has(kFdSource)) {
      std::string_view v = v_[kFdSource];
      if (v.size() > 512 || !std::all_of(v.begin(), v.end(), [](char c) { return c >= 0x20 && c < 0x7f; }))
        bad(f::fd_source, "is " + shown_text(v) + ", expected printable text of at most 512 bytes");
      t.fd_source = std::string(v);
    }
  }

  [[noreturn]] void bad(std::string_view field, const std::string& why) const {
    std::string who = "tensor record";  // made only on failure: it costs an allocation
    if (has(kName) && memcuda::is_valid_name(v_[kName])) who += " \"" + std::string(v_[kName]) + "\"";
    detail::fail(ProtocolErrc::bad_record, who + ": field \"" + memcuda::detail::rules::printable(field) + "\" " + why);
  }
  std::string_view required(int i) const {
    if (!has(i)) bad(kNames[i], "is missing");
    return v_[i];
  }
  static std::string shown_text(std::string_view v) { return "\"" + memcuda::detail::rules::printable(v) + "\""; }
  std::int64_t as_i64(std::string_view field, std::string_view v) const {
    auto n = detail::parse_decimal<std::int64_t>(v);
    if (!n) bad(field, "is " + shown_text(v) + ", expected a decimal int64");
    return *n;
  }
  std::uint64_t as_u64(std::string_view field, std::string_view v) const {
    auto n = detail::parse_decimal<std::uint64_t>(v);
    if (!n) bad(field, "is " + shown_text(v) + ", expected a decimal uint64");
    return *n;
  }

  // The fields decode_record reads (record.hpp); index = bit in seen_.
  enum : int {
    kName, kDtype, kShape, kCtime, kNode, kDevice, kDeviceUuid, kBytes, kBackend, kIpcHandle, kOffset,
    kAllocBytes, kAllocId, kAllocKind, kRefcount, kState, kGeneration, kEpoch, kOwner, kOwnerPid, kCreateId,
    kEventHandle, kEventVersion, kFdSource, kCount
  };
  static constexpr std::array<std::string_view, kCount> kNames = {
      record_field::name,        record_field::dtype,        record_field::shape,      record_field::ctime,
      record_field::node,        record_field::device,       record_field::device_uuid, record_field::bytes,
      record_field::backend,     record_field::ipc_handle,   record_field::offset,     record_field::alloc_bytes,
      record_field::alloc_id,    record_field::alloc_kind,   record_field::refcount,   record_field::state,
      record_field::generation,  record_field::epoch,        record_field::owner,      record_field::owner_pid,
      record_field::create_id,   record_field::event_handle, record_field::event_version,
      record_field::fd_source};

  static int index_of(std::string_view k) noexcept {
    for (int i = 0; i < kCount; ++i)
      if (k == kNames[i]) return i;
    return -1;
  }
  bool has(int i) const noexcept { return (seen_ >> i) & 1u; }
  void set(int i, std::string_view v) noexcept {
    const std::uint32_t bit = 1u << i;
    if (seen_ & bit) dup_ = kNames[i];
    seen_ |= bit;
    v_[i] = v;
  }

  std::array<std::string_view, kCount> v_{};
  std::uint32_t seen_ = 0;
  std::string_view dup_;  // a field given twice (reported as decode_record does)
  std::vector<std::pair<std::string_view, std::string_view>> holders_;
  std::vector<std::pair<std::string_view, std::string_view>> unknown_;
};

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
