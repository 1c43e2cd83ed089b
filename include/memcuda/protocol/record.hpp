// The tensor record: the fields of a tensor's Redis Hash (docs/protocol.md,
// "The tensor Hash"), written with HSET and read with HGETALL.
//
// Not JSON: the fields are binary-safe strings, integers in decimal text. This
// header includes no Boost.JSON header of its own; the one JSON value in a
// record, "shape", is read by shape.hpp's shape_from_string.
#pragma once

#include "memcuda/config.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memcuda/dtype.hpp"
#include "memcuda/error.hpp"
#include "memcuda/protocol/limits.hpp"
#include "memcuda/shape.hpp"
#include "memcuda/tensor_info.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace protocol {

// Field names of the tensor Hash (docs/protocol.md, "The tensor Hash"), for
// code that reads or updates single fields (HGET, HINCRBY, Lua scripts).
namespace record_field {
inline constexpr std::string_view name = "name";
inline constexpr std::string_view dtype = "dtype";
inline constexpr std::string_view shape = "shape";
inline constexpr std::string_view ctime = "ctime";
inline constexpr std::string_view node = "node";
inline constexpr std::string_view device = "device";
inline constexpr std::string_view device_uuid = "device_uuid";
inline constexpr std::string_view bytes = "bytes";
inline constexpr std::string_view backend = "backend";
inline constexpr std::string_view ipc_handle = "ipc_handle";
inline constexpr std::string_view offset = "offset";
inline constexpr std::string_view alloc_bytes = "alloc_bytes";
inline constexpr std::string_view alloc_id = "alloc_id";
inline constexpr std::string_view alloc_kind = "alloc_kind";
inline constexpr std::string_view fd_source = "fd_source";
inline constexpr std::string_view refcount = "refcount";
inline constexpr std::string_view state = "state";
inline constexpr std::string_view generation = "generation";
inline constexpr std::string_view epoch = "epoch";
inline constexpr std::string_view owner = "owner";
inline constexpr std::string_view owner_pid = "owner_pid";
inline constexpr std::string_view create_id = "create_id";
inline constexpr std::string_view event_handle = "event_handle";
inline constexpr std::string_view event_version = "event_version";
// Written by the scripts only: when a record was republished after Redis
// lost its data (ms), the generations it was migrated from, the state
// dict it is linked under (desc is record_desc.hpp's).
inline constexpr std::string_view republished = "republished";
inline constexpr std::string_view migrated_from = "migrated_from";
inline constexpr std::string_view dict = "dict";
// "1" on a tensor whose memory is its owner's own buffer (TensorRegistry::share).
inline constexpr std::string_view borrowed = "borrowed";
// A holder's count is stored in the field kHolderPrefix + holder id.
inline constexpr std::string_view holder_prefix = "holder:";
}  // namespace record_field

// Hash fields in HSET order, values binary-safe.
using Fields = std::vector<std::pair<std::string, std::string>>;

// Calls put(field, value) for each Hash field of a record, in a fixed order
// (name, dtype, shape, ctime, node, device, device_uuid, bytes, backend,
// ipc_handle, offset, alloc_bytes, alloc_id, refcount, state, generation,
// epoch, owner, owner_pid, create_id, event_handle, event_version,
// alloc_kind and fd_source when not empty, then "holder:<id>" per holder). `field` and
// `value` are each a std::string_view (a literal, or text `t` already holds:
// valid while `t` lives) or an owned std::string (a holder's field, a
// number as decimal text). Integers are decimal text;
// ipc_handle and event_handle are copied byte for byte. The one encoder:
// encode_record collects it, and the create path appends it straight to its
// script arguments (no vector of pairs, no copies of strings `t` holds).
template <class Put>
void for_each_record_field(const TensorInfo& t, Put&& put) {
  namespace f = record_field;
  put(f::name, std::string_view(t.name));
  put(f::dtype, to_string(t.dtype));
  put(f::shape, shape_to_string(t.shape));
  put(f::ctime, std::to_string(t.ctime_ms));
  put(f::node, std::string_view(t.node));
  put(f::device, std::to_string(t.device));
  put(f::device_uuid, std::string_view(t.device_uuid));
  put(f::bytes, std::to_string(t.bytes));
  put(f::backend, to_string(t.backend));
  put(f::ipc_handle, std::string_view(t.ipc_handle));
  put(f::offset, std::to_string(t.offset));
  put(f::alloc_bytes, std::to_string(t.alloc_bytes));
  put(f::alloc_id, std::to_string(t.alloc_id));
  put(f::refcount, std::to_string(t.refcount));
  put(f::state, to_string(t.state));
  put(f::generation, std::to_string(t.generation));
  put(f::epoch, std::to_string(t.epoch));
  put(f::owner, std::string_view(t.owner));
  put(f::owner_pid, std::to_string(t.owner_pid));
  put(f::create_id, std::string_view(t.create_id));
  put(f::event_handle, std::string_view(t.event_handle));
  put(f::event_version, std::to_string(t.event_version));
  // Omitted when empty, so a record written back by an older reader's
  // codec round-trips unchanged.
  if (!t.alloc_kind.empty()) put(f::alloc_kind, std::string_view(t.alloc_kind));
  if (!t.fd_source.empty()) put(f::fd_source, std::string_view(t.fd_source));
  if (t.borrowed) put(f::borrowed, std::string_view("1"));
  for (const auto& [holder, count] : t.holders)
    put(std::string(f::holder_prefix) + holder, std::to_string(count));
}

// The Hash fields of a record (for_each_record_field's order and text).
inline Fields encode_record(const TensorInfo& t) {
  Fields out;
  out.reserve(23 + t.holders.size());
  for_each_record_field(t, [&](auto&& k, auto&& v) {
    out.emplace_back(std::string(std::forward<decltype(k)>(k)), std::string(std::forward<decltype(v)>(v)));
  });
  return out;
}

namespace detail {

// decode_record's reading of one record: its fields by name (holders apart),
// and how a bad one is reported, naming the record and the field.
class RecordDecoder {
 public:
  explicit RecordDecoder(const Fields& fields) {
    namespace f = record_field;
    for (const auto& [k, v] : fields)
      if (k == f::name && memcuda::is_valid_name(v)) who_ = "tensor record \"" + v + "\"";
    for (const auto& [k, v] : fields) {
      std::string_view key = k;
      if (key.starts_with(f::holder_prefix)) {
        std::string id(key.substr(f::holder_prefix.size()));
        if (id.empty()) bad(key, "names no holder");
        auto n = parse_decimal<std::int64_t>(v);
        if (!n || *n < 0) bad(key, "is " + shown(v) + ", expected an integer >= 0");
        if (!t.holders.emplace(std::move(id), *n).second) bad(key, "appears twice");
        continue;
      }
      if (!by_name_.emplace(key, v).second) bad(key, "appears twice");
    }
  }

  [[noreturn]] void bad(std::string_view field, const std::string& why) const {
    fail(ProtocolErrc::bad_record, who_ + ": field \"" + memcuda::detail::rules::printable(field) + "\" " + why);
  }
  std::string_view required(std::string_view field) const {
    auto it = by_name_.find(field);
    if (it == by_name_.end()) bad(field, "is missing");
    return it->second;
  }
  std::optional<std::string_view> optional_field(std::string_view field) const {
    auto it = by_name_.find(field);
    if (it == by_name_.end()) return std::nullopt;
    return it->second;
  }
  static std::string shown(std::string_view v) { return "\"" + memcuda::detail::rules::printable(v) + "\""; }
  std::int64_t as_i64(std::string_view field, std::string_view v) const {
    auto n = parse_decimal<std::int64_t>(v);
    if (!n) bad(field, "is " + shown(v) + ", expected a decimal int64");
    return *n;
  }
  std::uint64_t as_u64(std::string_view field, std::string_view v) const {
    auto n = parse_decimal<std::uint64_t>(v);
    if (!n) bad(field, "is " + shown(v) + ", expected a decimal uint64");
    return *n;
  }

  TensorInfo t;  // what is decoded so far

 private:
  std::map<std::string_view, std::string_view> by_name_;
  std::string who_ = "tensor record";
};

// name, dtype, shape and bytes, which must agree.
inline void decode_identity(RecordDecoder& d) {
  namespace f = record_field;
  std::string_view name = d.required(f::name);
  if (!is_valid_name(name)) d.bad(f::name, "is " + RecordDecoder::shown(name) + ", not a valid tensor name");
  d.t.name = std::string(name);

  std::string_view dt = d.required(f::dtype);
  auto dtype = dtype_from_string(dt);
  if (!dtype) d.bad(f::dtype, "is " + RecordDecoder::shown(dt) + ", not a dtype");
  d.t.dtype = *dtype;

  std::string_view sh = d.required(f::shape);
  try {
    d.t.shape = shape_from_string(sh);
  } catch (const ProtocolError& e) {
    d.bad(f::shape, "is " + RecordDecoder::shown(sh) + ": " + e.what());
  }

  d.t.bytes = d.as_u64(f::bytes, d.required(f::bytes));
  std::uint64_t expected = 0;
  try {
    expected = byte_size(d.t.dtype, d.t.shape);
  } catch (const ProtocolError& e) {
    d.bad(f::shape, std::string("does not give a valid size: ") + e.what());
  }
  if (d.t.bytes != expected)
    d.bad(f::bytes, "is " + std::to_string(d.t.bytes) + " but " + std::string(to_string(d.t.dtype)) + " " +
                        shape_to_string(d.t.shape) + " needs " + std::to_string(expected));
}

// backend, state, generation, refcount, device and ipc_handle.
inline void decode_placement(RecordDecoder& d) {
  namespace f = record_field;
  std::string_view be = d.required(f::backend);
  auto backend = backend_from_string(be);
  if (!backend) d.bad(f::backend, "is " + RecordDecoder::shown(be) + ", expected \"cuda\" or \"host\"");
  d.t.backend = *backend;

  std::string_view st = d.required(f::state);
  auto state = state_from_string(st);
  if (!state) d.bad(f::state, "is " + RecordDecoder::shown(st) + ", expected \"pending\", \"ready\" or \"lost\"");
  d.t.state = *state;

  d.t.generation = d.as_u64(f::generation, d.required(f::generation));
  d.t.refcount = d.as_i64(f::refcount, d.required(f::refcount));
  if (d.t.refcount < 0) d.bad(f::refcount, "is " + std::to_string(d.t.refcount) + ", expected >= 0");

  std::int64_t device = d.as_i64(f::device, d.required(f::device));
  if (d.t.backend == BackendKind::host && device != -1)
    d.bad(f::device, "is " + std::to_string(device) + ", expected -1 for a host tensor");
  if (d.t.backend == BackendKind::cuda && (device < 0 || device > protocol::kMaxDevice))
    d.bad(f::device, "is " + std::to_string(device) + ", expected 0..1023 for a cuda tensor");
  d.t.device = static_cast<int>(device);

  d.t.ipc_handle = std::string(d.required(f::ipc_handle));
  if (d.t.state != TensorState::pending) {
    if (d.t.backend == BackendKind::cuda && d.t.ipc_handle.size() != kIpcHandleBytes)
      d.bad(f::ipc_handle,
          "is " + std::to_string(d.t.ipc_handle.size()) + " bytes, expected 64 for a cuda tensor");
    if (d.t.backend == BackendKind::host && d.t.ipc_handle.empty())
      d.bad(f::ipc_handle, "is empty, expected the allocation key (or an older version's shm object name) of a host tensor");
  }
}

// The optional fields: absent ones keep TensorInfo's defaults.
inline void decode_optional_fields(RecordDecoder& d) {
  namespace f = record_field;
  if (auto v = d.optional_field(f::ctime)) d.t.ctime_ms = d.as_i64(f::ctime, *v);
  if (auto v = d.optional_field(f::node)) d.t.node = std::string(*v);
  if (auto v = d.optional_field(f::device_uuid)) d.t.device_uuid = std::string(*v);
  if (auto v = d.optional_field(f::offset)) d.t.offset = d.as_u64(f::offset, *v);
  // Once allocated, the mapping's extent is needed to map it and to check
  // offset + bytes: alloc_bytes is required then (a record without it could
  // not be written back either).
  if (auto v = d.t.state == TensorState::pending ? d.optional_field(f::alloc_bytes)
                                               : std::optional<std::string_view>(d.required(f::alloc_bytes))) {
    d.t.alloc_bytes = d.as_u64(f::alloc_bytes, *v);
    if (d.t.state != TensorState::pending &&
        (d.t.offset > d.t.alloc_bytes || d.t.bytes > d.t.alloc_bytes - d.t.offset))
      d.bad(f::alloc_bytes, "is " + std::to_string(d.t.alloc_bytes) + ", too small for offset " +
                              std::to_string(d.t.offset) + " + bytes " + std::to_string(d.t.bytes));
  }
  if (auto v = d.optional_field(f::alloc_id)) d.t.alloc_id = d.as_u64(f::alloc_id, *v);
  if (auto v = d.optional_field(f::epoch)) d.t.epoch = d.as_u64(f::epoch, *v);
  if (auto v = d.optional_field(f::owner)) d.t.owner = std::string(*v);
  if (auto v = d.optional_field(f::owner_pid)) d.t.owner_pid = d.as_i64(f::owner_pid, *v);
  if (auto v = d.optional_field(f::create_id)) d.t.create_id = std::string(*v);
  if (auto v = d.optional_field(f::event_handle)) {
    d.t.event_handle = std::string(*v);
    if (!d.t.event_handle.empty() && d.t.event_handle.size() != kIpcHandleBytes)
      d.bad(f::event_handle,
          "is " + std::to_string(d.t.event_handle.size()) + " bytes, expected 0 or 64");
  }
  if (auto v = d.optional_field(f::event_version)) d.t.event_version = d.as_u64(f::event_version, *v);
  // Any printable token: a kind this version cannot open still decodes (so
  // listings show it); opening it is the backend's clear error.
  if (auto v = d.optional_field(f::alloc_kind)) {
    if (v->empty() || v->size() > 64 ||
        !std::all_of(v->begin(), v->end(), [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; }))
      d.bad(f::alloc_kind, "is " + RecordDecoder::shown(*v) + ", expected a kind such as \"host_shm\" or \"cuda_ipc\"");
    d.t.alloc_kind = std::string(*v);
  }
  // Where a cuda_vmm_fd allocation's fd is had. Its syntax is the fd layer's
  // (detail/fd/fd_source.hpp), checked when it is used; here only that it is
  // short printable text (a record with a stray binary value decodes, its
  // open fails with the parser's message).
  if (auto v = d.optional_field(f::fd_source)) {
    if (v->size() > 512 || !std::all_of(v->begin(), v->end(), [](char c) { return c >= 0x20 && c < 0x7f; }))
      d.bad(f::fd_source, "is " + RecordDecoder::shown(*v) + ", expected printable text of at most 512 bytes");
    d.t.fd_source = std::string(*v);
  }
  if (auto v = d.optional_field(f::borrowed)) {
    if (*v != "1" && *v != "0") d.bad(f::borrowed, "is " + RecordDecoder::shown(*v) + ", expected \"1\" or \"0\"");
    d.t.borrowed = *v == "1";
  }
}

}  // namespace detail

// Rebuilds a TensorInfo from a Hash (HGETALL). Unknown fields are ignored;
// "holder:<id>" fields fill holders. Throws ProtocolError(bad_record), naming
// the field, when a required field (name, dtype, shape, bytes, backend,
// state, generation, refcount, device, ipc_handle, and alloc_bytes once not
// pending) is missing, a field appears
// twice, or a value does not parse or is inconsistent: bytes must equal
// byte_size(dtype, shape); device is -1 for host and 0..1023 for cuda; once
// the tensor is not pending, ipc_handle is 64 bytes for cuda and non-empty for
// host, and offset + bytes <= alloc_bytes when alloc_bytes is stored;
// event_handle is empty or 64 bytes; refcount and holder counts are >= 0.
// Optional fields that are absent keep TensorInfo's default values.
inline TensorInfo decode_record(const Fields& fields) {
  detail::RecordDecoder d(fields);
  detail::decode_identity(d);
  detail::decode_placement(d);
  detail::decode_optional_fields(d);
  return std::move(d.t);
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::protocol
