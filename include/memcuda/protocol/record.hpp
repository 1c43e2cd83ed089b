// The tensor record: the fields of a tensor's Redis Hash (docs/protocol.md,
// "The tensor Hash"), written with HSET and read with HGETALL.
//
// Not JSON: the fields are binary-safe strings, integers in decimal text. This
// header includes no Boost.JSON header of its own; the one JSON value in a
// record, "shape", is read by shape.hpp's shape_from_string.
#pragma once

#include "memcuda/config.hpp"

#include <algorithm>
#include <array>
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
// A replica's (TensorInfo, replicas.hpp); the sweep's clock, "idle_since",
// is written by the scripts only.
inline constexpr std::string_view replica_of = "replica_of";
inline constexpr std::string_view source_generation = "source_generation";
inline constexpr std::string_view copied_version = "copied_version";
inline constexpr std::string_view replica_path = "replica_path";
inline constexpr std::string_view idle_ms = "idle_ms";
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
  if (!t.replica_of.empty()) {
    put(f::replica_of, std::string_view(t.replica_of));
    put(f::source_generation, std::to_string(t.source_generation));
    if (t.idle_ms) put(f::idle_ms, std::to_string(t.idle_ms));
  }
  if (t.copied_version) put(f::copied_version, std::to_string(*t.copied_version));
  if (!t.replica_path.empty()) put(f::replica_path, std::string_view(t.replica_path));
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

struct DescView;  // record_desc.hpp

// Decodes Hash fields given one at a time (views that must outlive
// finish()) into a TensorInfo: from a Fields (decode_record), straight from
// an HGETALL reply, or from a desc (record_desc.hpp), without building a map
// per record. Unknown fields (desc, dict, ...) are ignored; "holder:<id>"
// fields fill holders. finish() throws ProtocolError(bad_record), naming
// the field, when a required field (name, dtype, shape, bytes, backend,
// state, generation, refcount, device, ipc_handle, and alloc_bytes once not
// pending) is missing, a field appears twice, or a value does not parse or
// is inconsistent: bytes must equal byte_size(dtype, shape); device is -1
// for host and 0..1023 for cuda; once the tensor is not pending, ipc_handle
// is 64 bytes for cuda and non-empty for host, and offset + bytes <=
// alloc_bytes; event_handle is empty or 64 bytes; refcount and holder
// counts are >= 0. Optional fields that are absent keep TensorInfo's
// default values.
class RecordReader {
 public:
  void add(std::string_view k, std::string_view v) {
    if (k.starts_with(record_field::holder_prefix)) {
      holders_.emplace_back(k, v);
      return;
    }
    if (const int i = index_of(k); i >= 0) set(i, v);
  }
  // Adds the fields of a parsed desc, its epoch and generation included
  // (defined in record_desc.hpp).
  void add(const DescView& d);

  TensorInfo finish() const {
    TensorInfo t;
    finish_holders(t);
    finish_identity(t);
    finish_placement(t);
    finish_optional(t);
    finish_texts(t);
    return t;
  }

 private:
  [[noreturn]] void bad(std::string_view field, const std::string& why) const {
    std::string who = "tensor record";  // made only on failure: it costs an allocation
    if (has(kName) && memcuda::is_valid_name(v_[kName])) who += " \"" + std::string(v_[kName]) + "\"";
    detail::fail(ProtocolErrc::bad_record, who + ": field \"" + memcuda::detail::rules::printable(field) + "\" " + why);
  }
  std::string_view required(int i) const {
    if (!has(i)) bad(kNames[i], "is missing");
    return v_[i];
  }
  static std::string shown(std::string_view v) { return "\"" + memcuda::detail::rules::printable(v) + "\""; }
  std::int64_t as_i64(std::string_view field, std::string_view v) const {
    auto n = detail::parse_decimal<std::int64_t>(v);
    if (!n) bad(field, "is " + shown(v) + ", expected a decimal int64");
    return *n;
  }
  std::uint64_t as_u64(std::string_view field, std::string_view v) const {
    auto n = detail::parse_decimal<std::uint64_t>(v);
    if (!n) bad(field, "is " + shown(v) + ", expected a decimal uint64");
    return *n;
  }

  void finish_holders(TensorInfo& t) const {
    namespace f = record_field;
    for (const auto& [k, v] : holders_) {
      std::string id(k.substr(f::holder_prefix.size()));
      if (id.empty()) bad(k, "names no holder");
      auto n = detail::parse_decimal<std::int64_t>(v);
      if (!n || *n < 0) bad(k, "is \"" + memcuda::detail::rules::printable(v) + "\", expected an integer >= 0");
      if (!t.holders.emplace(std::move(id), *n).second) bad(k, "appears twice");
    }
    if (!dup_.empty()) bad(dup_, "appears twice");
  }

  // name, dtype, shape and bytes, which must agree.
  void finish_identity(TensorInfo& t) const {
    namespace f = record_field;
    std::string_view name = required(kName);
    if (!is_valid_name(name)) bad(f::name, "is " + shown(name) + ", not a valid tensor name");
    t.name = std::string(name);

    std::string_view dt = required(kDtype);
    auto dtype = dtype_from_string(dt);
    if (!dtype) bad(f::dtype, "is " + shown(dt) + ", not a dtype");
    t.dtype = *dtype;

    std::string_view sh = required(kShape);
    try {
      t.shape = shape_from_string(sh);
    } catch (const ProtocolError& e) {
      bad(f::shape, "is " + shown(sh) + ": " + e.what());
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
    if (!backend) bad(f::backend, "is " + shown(be) + ", expected \"cuda\" or \"host\"");
    t.backend = *backend;

    std::string_view st = required(kState);
    auto state = state_from_string(st);
    if (!state) bad(f::state, "is " + shown(st) + ", expected \"pending\", \"ready\" or \"lost\"");
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
        bad(f::ipc_handle, "is empty, expected the allocation key of a host tensor");
    }
  }

  // The optional numbers: absent ones keep TensorInfo's defaults.
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
  }

  // The optional texts and flags, checked for their alphabet.
  void finish_texts(TensorInfo& t) const {
    namespace f = record_field;
    if (has(kAllocKind)) {
      std::string_view v = v_[kAllocKind];
      if (v.empty() || v.size() > 64 || !std::all_of(v.begin(), v.end(), [](char c) {
            return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
          }))
        bad(f::alloc_kind, "is " + shown(v) + ", expected a kind such as \"host_memfd\" or \"cuda_vmm_fd\"");
      t.alloc_kind = std::string(v);
    }
    if (has(kFdSource)) {
      std::string_view v = v_[kFdSource];
      if (v.size() > 512 || !std::all_of(v.begin(), v.end(), [](char c) { return c >= 0x20 && c < 0x7f; }))
        bad(f::fd_source, "is " + shown(v) + ", expected printable text of at most 512 bytes");
      t.fd_source = std::string(v);
    }
    if (has(kBorrowed)) {
      std::string_view v = v_[kBorrowed];
      if (v != "1" && v != "0") bad(f::borrowed, "is " + shown(v) + ", expected \"1\" or \"0\"");
      t.borrowed = v == "1";
    }
    if (has(kReplicaOf)) {
      std::string_view v = v_[kReplicaOf];
      if (!memcuda::is_valid_name(v)) bad(f::replica_of, "is " + shown(v) + ", not a tensor name");
      t.replica_of = std::string(v);
      t.source_generation = as_u64(f::source_generation, required(kSourceGeneration));
    }
    if (has(kIdleMs)) t.idle_ms = as_i64(f::idle_ms, v_[kIdleMs]);
    if (t.idle_ms < 0) bad(f::idle_ms, "is " + std::to_string(t.idle_ms) + ", expected >= 0");
    if (has(kCopiedVersion)) t.copied_version = as_u64(f::copied_version, v_[kCopiedVersion]);
    if (has(kReplicaPath)) {
      std::string_view v = v_[kReplicaPath];
      if (v != "peer" && v != "host" && v != "node")
        bad(f::replica_path, "is " + shown(v) + ", expected \"peer\", \"host\" or \"node\"");
      t.replica_path = std::string(v);
    }
  }

  // The fields a record has; index = bit in seen_.
  enum : int {
    kName, kDtype, kShape, kCtime, kNode, kDevice, kDeviceUuid, kBytes, kBackend, kIpcHandle, kOffset,
    kAllocBytes, kAllocId, kAllocKind, kRefcount, kState, kGeneration, kEpoch, kOwner, kOwnerPid, kCreateId,
    kEventHandle, kEventVersion, kFdSource, kBorrowed, kReplicaOf, kSourceGeneration, kCopiedVersion, kReplicaPath,
    kIdleMs, kCount
  };
  static constexpr std::array<std::string_view, kCount> kNames = {
      record_field::name,        record_field::dtype,        record_field::shape,      record_field::ctime,
      record_field::node,        record_field::device,       record_field::device_uuid, record_field::bytes,
      record_field::backend,     record_field::ipc_handle,   record_field::offset,     record_field::alloc_bytes,
      record_field::alloc_id,    record_field::alloc_kind,   record_field::refcount,   record_field::state,
      record_field::generation,  record_field::epoch,        record_field::owner,      record_field::owner_pid,
      record_field::create_id,   record_field::event_handle, record_field::event_version,
      record_field::fd_source,   record_field::borrowed,     record_field::replica_of, record_field::source_generation,
      record_field::copied_version, record_field::replica_path, record_field::idle_ms};

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
  std::string_view dup_;  // a field given twice
  std::vector<std::pair<std::string_view, std::string_view>> holders_;
};

// Rebuilds a TensorInfo from a Hash (HGETALL), with RecordReader's rules.
inline TensorInfo decode_record(const Fields& fields) {
  RecordReader r;
  for (const auto& [k, v] : fields) r.add(k, v);
  return r.finish();
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::protocol
