// The parts of the batch commands (docs/protocol.md, "Batch commands"): the
// entries of a `create_many` command and the per-tensor results of its
// reply. command.hpp and reply.hpp embed them; their decoders are as strict
// as decode_command (every rejection a ProtocolError naming the field, with
// the entry's index).
#pragma once

#include "memcuda/config.hpp"

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "memcuda/dtype.hpp"
#include "memcuda/error.hpp"
#include "memcuda/protocol/json_util.hpp"
#include "memcuda/protocol/limits.hpp"
#include "memcuda/shape.hpp"
#include "memcuda/tensor_info.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace protocol {

// At most this many tensors in one create_many (the 64 KiB command limit
// usually binds first).
inline constexpr std::size_t kMaxBatchEntries = 2048;

// One tensor of a create_many command. The optional fields default to the
// command's own `device`, `device_uuid`, `backend` and `persistent`
// (decode_command fills them in).
struct CreateEntry {
  std::string name;
  DType dtype = DType::u8;
  Shape shape;
  std::optional<int> device;
  std::optional<std::string> device_uuid;
  std::optional<BackendKind> backend;
  std::optional<bool> persistent;
  // A replica's fields (TensorInfo), set by the allocator of record's
  // replicate only: never on the wire.
  std::string replica_of;
  std::uint64_t source_generation = 0;
  std::int64_t idle_ms = 0;

  friend bool operator==(const CreateEntry&, const CreateEntry&) = default;
};

// One tensor of a create_many reply: what a create reply says of one.
struct ReplyTensor {
  std::string name;
  std::uint64_t generation = 0;
  std::int64_t refcount = 0;

  friend bool operator==(const ReplyTensor&, const ReplyTensor&) = default;
};

namespace detail {

inline bool is_entry_field(std::string_view k) noexcept {
  static constexpr std::string_view kFields[] = {"name",        "dtype",   "shape",     "device",
                                                 "device_uuid", "backend", "persistent"};
  for (std::string_view f : kFields)
    if (k == f) return true;
  return false;
}

inline std::string entry_field(std::size_t i, std::string_view f) {
  return "tensors[" + std::to_string(i) + "]." + std::string(f);
}

inline std::optional<BackendKind> get_backend(const boost::json::value& v, const std::string& field) {
  std::string_view b = get_string(v, field);
  auto k = backend_from_string(b);
  if (!k)
    fail(ProtocolErrc::bad_value, "field \"" + field + "\": \"" + memcuda::detail::rules::printable(b) +
                                      "\" is not a backend; expected \"cuda\" or \"host\"");
  return k;
}

// The placement fields a create, a create_many and each of its entries may
// give; `field(name)` is the name errors quote.
template <class T, class FieldName>
void decode_placement(const boost::json::object& o, T& t, FieldName field) {
  if (const auto* x = find(o, "device")) t.device = static_cast<int>(get_int(*x, field("device"), 0, kMaxDevice));
  if (const auto* x = find(o, "device_uuid")) t.device_uuid = get_token(*x, field("device_uuid"), kMaxDeviceUuidBytes);
  if (const auto* x = find(o, "backend")) t.backend = get_backend(*x, field("backend"));
  if (const auto* x = find(o, "persistent")) t.persistent = get_bool(*x, field("persistent"));
}

// A create's dtype and shape (both required), the shape's byte size checked.
template <class FieldName>
std::pair<DType, Shape> decode_dtype_shape(const boost::json::object& o, const std::string& at, FieldName field) {
  std::string_view dt = get_string(require(o, "dtype", at), field("dtype"));
  auto d = dtype_from_string(dt);
  if (!d)
    fail(ProtocolErrc::unknown_dtype, "field \"" + field("dtype") + "\": unknown dtype \"" +
                                          memcuda::detail::rules::printable(dt) +
                                          "\"; expected one of bool u8 i8 i16 i32 i64 u16 u32 u64 f16 bf16 f32 f64");
  Shape shape = memcuda::detail::rules::shape_from_json(require(o, "shape", at), "field \"" + field("shape") + "\"");
  try {
    (void)byte_size(*d, shape);
  } catch (const ProtocolError& err) {
    fail(err.errc(), "field \"" + field("shape") + "\": " + err.what());
  }
  return {*d, std::move(shape)};
}

inline CreateEntry decode_create_entry(const boost::json::value& v, std::size_t i) {
  namespace json = boost::json;
  const json::object* o = v.if_object();
  const std::string at = "tensors[" + std::to_string(i) + "]";
  if (!o) wrong_type(at, "an object", v);
  for (const auto& kv : *o) {
    std::string_view k(kv.key().data(), kv.key().size());
    if (!is_entry_field(k))
      fail(ProtocolErrc::unknown_field, at + ": unknown field \"" + memcuda::detail::rules::printable(k) +
                                            "\"; the fields are name, dtype, shape, device, device_uuid, "
                                            "backend, persistent");
  }
  const auto field = [i](std::string_view f) { return entry_field(i, f); };
  CreateEntry e;
  std::string_view name = get_string(require(*o, "name", at), field("name"));
  memcuda::detail::rules::validate_name(name, "field \"" + field("name") + "\"");
  e.name = std::string(name);
  std::tie(e.dtype, e.shape) = decode_dtype_shape(*o, at, field);
  decode_placement(*o, e, field);
  return e;
}

inline boost::json::object encode_create_entry(const CreateEntry& e) {
  namespace json = boost::json;
  json::object o;
  o["name"] = sv(e.name);
  o["dtype"] = sv(to_string(e.dtype));
  json::array a;
  for (std::int64_t d : e.shape) a.emplace_back(d);
  o["shape"] = std::move(a);
  if (e.device) o["device"] = *e.device;
  if (e.device_uuid) o["device_uuid"] = sv(*e.device_uuid);
  if (e.backend) o["backend"] = sv(to_string(*e.backend));
  if (e.persistent) o["persistent"] = *e.persistent;
  return o;
}

inline std::vector<ReplyTensor> decode_reply_tensors(const boost::json::value& v) {
  namespace json = boost::json;
  const json::array* a = v.if_array();
  if (!a) wrong_type("tensors", "an array", v);
  if (a->size() > kMaxBatchEntries)
    fail(ProtocolErrc::bad_value, "field \"tensors\": " + std::to_string(a->size()) + " entries, at most " +
                                      std::to_string(kMaxBatchEntries));
  std::vector<ReplyTensor> out;
  out.reserve(a->size());
  for (std::size_t i = 0; i < a->size(); ++i) {
    const std::string at = "tensors[" + std::to_string(i) + "]";
    const json::object* o = (*a)[i].if_object();
    if (!o) wrong_type(at, "an object", (*a)[i]);
    ReplyTensor t;
    t.name = std::string(get_string(require(*o, "name", at), entry_field(i, "name")));
    t.generation = get_uint(require(*o, "generation", at), entry_field(i, "generation"));
    t.refcount = get_int(require(*o, "refcount", at), entry_field(i, "refcount"),
                         std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max());
    out.push_back(std::move(t));
  }
  return out;
}

inline boost::json::array encode_reply_tensors(const std::vector<ReplyTensor>& ts) {
  namespace json = boost::json;
  json::array a;
  for (const auto& t : ts) a.emplace_back(json::object{{"name", sv(t.name)}, {"generation", t.generation}, {"refcount", t.refcount}});
  return a;
}

}  // namespace detail
}  MEMCUDA_NAMESPACE_END  // namespace memcuda::protocol
