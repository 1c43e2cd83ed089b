// Lifecycle commands: the JSON documents LPUSHed on the List
// `tensor_lifecycle` (docs/protocol.md, "Lifecycle commands"), and where to
// answer a command that could not be decoded (peek_reply_route).
//
// decode_command faces untrusted bytes: strict, bounded, and every rejection
// is a ProtocolError with a specific ProtocolErrc naming the field.
#pragma once

#include "memcuda/config.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/dtype.hpp"
#include "memcuda/error.hpp"
#include "memcuda/protocol/batch.hpp"
#include "memcuda/protocol/json_util.hpp"
#include "memcuda/protocol/limits.hpp"
#include "memcuda/protocol/reply_route.hpp"
#include "memcuda/shape.hpp"
#include "memcuda/tensor_info.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace protocol {

// Lifecycle operations. `release` drops one reference of the holder (it
// removes nothing by itself). `free` is internal: a process whose release
// dropped a tensor's refcount to 0 sends it so that the allocator of record
// frees the memory. `create_many` creates several tensors, all or nothing
// (docs/protocol.md, "Batch commands"). `replicate` copies a tensor (or
// every tensor under a prefix) to other devices (replicas.hpp). `pull`
// (a fleet's: RegistryOptions::fleet) makes the node's replica of another
// node's tensor (or of each of several: "names") current (docs/scale-out.md).
enum class Op : std::uint8_t { create, get, release, free, create_many, replicate, pull };

// Wire names: "create", "get", "release", "free", "create_many", "replicate", "pull". "delete" is
// accepted as an alias of "release" (the seed's name; op_from_string).
constexpr std::string_view to_string(Op op) noexcept {
  switch (op) {
    case Op::create: return "create";
    case Op::get: return "get";
    case Op::release: return "release";
    case Op::free: return "free";
    case Op::create_many: return "create_many";
    case Op::replicate: return "replicate";
    case Op::pull: return "pull";
  }
  return "";
}

inline std::optional<Op> op_from_string(std::string_view s) noexcept {
  if (s == "create") return Op::create;
  if (s == "get") return Op::get;
  if (s == "release" || s == "delete") return Op::release;
  if (s == "free") return Op::free;
  if (s == "create_many") return Op::create_many;
  if (s == "replicate") return Op::replicate;
  if (s == "pull") return Op::pull;
  return std::nullopt;
}

// One lifecycle command. Which fields each op uses, and their limits, are in
// docs/protocol.md; a field the op does not use is ignored by decode_command
// and not written by encode_command.
struct Command {
  Op op = Op::get;
  std::string name;
  std::optional<DType> dtype;               // create (required)
  std::optional<Shape> shape;               // create (required)
  std::optional<int> device;                // create
  std::optional<BackendKind> backend;       // create
  std::optional<bool> persistent;           // create: also held by its name until removed
  std::optional<std::string> device_uuid;   // create: names the device across processes
  std::optional<std::int64_t> pid;          // all ops
  // all ops: the inode of the pid namespace `pid` is of ("pidns":
  // "pid:[<inode>]", what /proc/self/ns/pid reads); tags the pid holder
  std::optional<std::uint64_t> pid_ns;
  std::optional<std::string> node;          // all ops
  std::optional<std::string> id;            // all ops; echoed in the reply
  bool id_is_number = false;                // id was a JSON integer (id holds its decimal text)
  std::optional<std::string> reply_to;      // all ops; List that receives the reply
  std::optional<std::uint64_t> generation;  // get, release (optional), free (this or generations)
  // free of many (1..kMaxBatchEntries) unlinked tensors at once, sent by a
  // batch remove; `name` is then optional (and unused).
  std::vector<std::uint64_t> generations;
  std::optional<std::string> holder;        // all ops
  // create_many (required, 1..kMaxBatchEntries): the tensors, each with
  // the command's device, device_uuid, backend and persistent unless it
  // gives its own. `name` is optional for create_many (and unused).
  std::vector<CreateEntry> tensors;
  // The op came as "delete" (the alias of release): the reply echoes that
  // spelling, so a client matching replies by op sees what it sent.
  bool op_spelled_delete = false;
  // replicate: the target devices' UUIDs (required, 1..kMaxReplicaDevices),
  // whether `name` is a prefix ("prefix"), the idle time ("idle_ms", >= 0),
  // and whether only replicas there are refreshed in place ("refresh": what
  // a publish of a replicated tensor sends; none is made).
  std::vector<std::string> devices;
  bool replicate_prefix = false;
  bool replicate_refresh = false;
  std::optional<std::int64_t> idle_ms;
  // pull of many (1..kMaxBatchEntries) names at once ("names": what a
  // fleet node's batch get sends); `name` is then optional (and unused).
  std::vector<std::string> names;

  friend bool operator==(const Command&, const Command&) = default;
};

namespace detail {

inline bool is_command_field(std::string_view k) noexcept {
  static constexpr std::string_view kFields[] = {
      "op",  "name", "dtype",    "shape",      "device", "backend",     "persistent",
      "pid", "pidns", "node", "reply_to", "generation", "holder", "device_uuid", "id", "tensors", "generations",
      "devices", "prefix", "idle_ms", "refresh", "names"};
  for (std::string_view f : kFields)
    if (k == f) return true;
  return false;
}

// A create's own fields.
inline void decode_create_fields(const boost::json::object& o, Command& c) {
  const auto field = [](std::string_view f) { return std::string(f); };
  std::tie(c.dtype, c.shape) = decode_dtype_shape(o, "command \"create\"", field);
  decode_placement(o, c, field);
}

// A free of several generations ("generations").
inline void decode_free_many(const boost::json::object& o, Command& c) {
  namespace json = boost::json;
  if (find(o, "generation"))
    fail(ProtocolErrc::bad_value, "command \"free\": give \"generation\" or \"generations\", not both");
  const json::value& gv = *find(o, "generations");
  const json::array* a = gv.if_array();
  if (!a) wrong_type("generations", "an array", gv);
  if (a->empty() || a->size() > kMaxBatchEntries)
    fail(ProtocolErrc::bad_value, "field \"generations\": " + std::to_string(a->size()) +
                                      " entries; a free holds 1.." + std::to_string(kMaxBatchEntries));
  c.generations.reserve(a->size());
  for (const auto& g : *a) c.generations.push_back(get_uint(g, "generations"));
}

// A replicate's devices, prefix flag and idle time.
inline void decode_replicate(const boost::json::object& o, Command& c) {
  namespace json = boost::json;
  const json::value& dv = require(o, "devices", "command \"replicate\"");
  const json::array* a = dv.if_array();
  if (!a) wrong_type("devices", "an array", dv);
  if (a->empty() || a->size() > kMaxReplicaDevices)
    fail(ProtocolErrc::bad_value, "field \"devices\": " + std::to_string(a->size()) + " entries; a replicate names 1.." +
                                      std::to_string(kMaxReplicaDevices) + " device UUIDs");
  for (const auto& d : *a) {
    std::string u = get_token(d, "devices", kMaxDeviceUuidBytes);
    if (std::find(c.devices.begin(), c.devices.end(), u) != c.devices.end())
      fail(ProtocolErrc::bad_value, "field \"devices\": \"" + u + "\" appears twice");
    c.devices.push_back(std::move(u));
  }
  if (const json::value* v = find(o, "prefix")) c.replicate_prefix = get_bool(*v, "prefix");
  if (const json::value* v = find(o, "refresh")) c.replicate_refresh = get_bool(*v, "refresh");
  if (const json::value* v = find(o, "idle_ms")) c.idle_ms = get_int(*v, "idle_ms", 0, kMaxIdleMs);
}

// A pull of several names ("names").
inline void decode_pull_names(const boost::json::object& o, Command& c) {
  namespace json = boost::json;
  if (find(o, "name")) fail(ProtocolErrc::bad_value, "command \"pull\": give \"name\" or \"names\", not both");
  const json::value& nv = *find(o, "names");
  const json::array* a = nv.if_array();
  if (!a) wrong_type("names", "an array", nv);
  if (a->empty() || a->size() > kMaxBatchEntries)
    fail(ProtocolErrc::bad_value, "field \"names\": " + std::to_string(a->size()) + " entries; a pull names 1.." +
                                      std::to_string(kMaxBatchEntries));
  c.names.reserve(a->size());
  for (const auto& v : *a) {
    if (!v.is_string()) wrong_type("names", "an array of strings", v);
    std::string_view n(v.get_string().data(), v.get_string().size());
    memcuda::detail::rules::validate_name(n, "field \"names\"");
    c.names.emplace_back(n);
  }
}

// A create_many's defaults and entries.
inline void decode_create_many(const boost::json::object& o, Command& c) {
  namespace json = boost::json;
  // The defaults of the entries, checked like a create's own fields.
  decode_placement(o, c, [](std::string_view f) { return std::string(f); });
  const json::value& tv = require(o, "tensors", "command \"create_many\"");
  const json::array* a = tv.if_array();
  if (!a) wrong_type("tensors", "an array", tv);
  if (a->empty() || a->size() > kMaxBatchEntries)
    fail(ProtocolErrc::bad_value, "field \"tensors\": " + std::to_string(a->size()) +
                                      " entries; a create_many holds 1.." +
                                      std::to_string(kMaxBatchEntries));
  c.tensors.reserve(a->size());
  for (std::size_t i = 0; i < a->size(); ++i) {
    CreateEntry e = decode_create_entry((*a)[i], i);
    for (std::size_t j = 0; j < i; ++j)
      if (c.tensors[j].name == e.name)
        fail(ProtocolErrc::bad_value, "field \"tensors\": the name \"" + e.name + "\" appears twice (entries " +
                                          std::to_string(j) + " and " + std::to_string(i) + ")");
    if (!e.device) e.device = c.device;
    if (!e.device_uuid) e.device_uuid = c.device_uuid;
    if (!e.backend) e.backend = c.backend;
    if (!e.persistent) e.persistent = c.persistent;
    c.tensors.push_back(std::move(e));
  }
}

}  // namespace detail

// Decodes one lifecycle command. Throws ProtocolError (see the errc table in
// docs/protocol.md); duplicate keys are bad_json.
inline Command decode_command(std::string_view text) {
  namespace json = boost::json;
  using detail::fail;
  json::value doc = detail::parse_object(text, "command");
  const json::object* o = &doc.get_object();
  for (const auto& kv : *o) {
    std::string_view k(kv.key().data(), kv.key().size());
    if (!detail::is_command_field(k))
      fail(ProtocolErrc::unknown_field,
           "command: unknown field \"" + memcuda::detail::rules::printable(k) +
               "\"; the fields are op, name, dtype, shape, device, device_uuid, backend, "
               "persistent, pid, pidns, node, holder, generation, generations, id, reply_to, tensors, devices, "
               "prefix, idle_ms, refresh, names");
  }

  Command c;
  std::string_view op = detail::get_string(detail::require(*o, "op", "command"), "op");
  auto parsed_op = op_from_string(op);
  if (!parsed_op)
    fail(ProtocolErrc::unknown_op, "field \"op\": unknown operation \"" +
                                       memcuda::detail::rules::printable(op) +
                                       "\"; expected create, get, release (or its alias delete), free, create_many, replicate or pull");
  c.op = *parsed_op;
  c.op_spelled_delete = op == "delete";

  // A free of "generations", a pull of "names" and a create_many need no name.
  const char* list = c.op == Op::free ? "generations" : c.op == Op::pull ? "names" : nullptr;
  const bool many = list && detail::find(*o, list);
  if ((c.op != Op::create_many && !many) || detail::find(*o, "name")) {
    std::string_view name = detail::get_string(detail::require(*o, "name", "command"), "name");
    memcuda::detail::rules::validate_name(name, "field \"name\"");
    c.name = std::string(name);
  }

  if (const json::value* v = detail::find(*o, "id")) c.id = detail::get_id(*v, c.id_is_number);
  if (const json::value* v = detail::find(*o, "reply_to"))
    c.reply_to = detail::get_bounded_text(*v, "reply_to", kMaxReplyToBytes);
  if (const json::value* v = detail::find(*o, "pid"))
    c.pid = detail::get_int(*v, "pid", 1, kMaxPid);
  if (const json::value* v = detail::find(*o, "pidns")) {
    const std::string t = detail::get_token(*v, "pidns", 32);
    std::uint64_t ino = 0;
    const bool framed = t.size() > 6 && t.starts_with("pid:[") && t.ends_with("]");
    const auto digits = framed ? std::string_view(t).substr(5, t.size() - 6) : std::string_view();
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), ino);
    if (!framed || ec != std::errc() || end != digits.data() + digits.size() || ino == 0)
      fail(ProtocolErrc::bad_value, "field \"pidns\": \"" + memcuda::detail::rules::printable(t) +
                                        "\" is not a pid namespace as /proc/self/ns/pid names it (pid:[4026531836])");
    c.pid_ns = ino;
  }
  if (const json::value* v = detail::find(*o, "node")) c.node = detail::get_token(*v, "node", kMaxNodeBytes);
  if (const json::value* v = detail::find(*o, "holder"))
    c.holder = detail::get_bounded_text(*v, "holder", kMaxHolderBytes);

  switch (c.op) {
    case Op::create:
      detail::decode_create_fields(*o, c);
      break;
    case Op::get:
    case Op::release:
      if (const json::value* v = detail::find(*o, "generation"))
        c.generation = detail::get_uint(*v, "generation");
      break;
    case Op::free:
      if (many) detail::decode_free_many(*o, c);
      else c.generation = detail::get_uint(detail::require(*o, "generation", "command \"free\""), "generation");
      break;
    case Op::create_many:
      detail::decode_create_many(*o, c);
      break;
    case Op::replicate:
      detail::decode_replicate(*o, c);
      break;
    case Op::pull:
      if (many) detail::decode_pull_names(*o, c);
      break;
  }
  return c;
}

// Encodes a command as compact JSON, writing only the fields its op uses (in
// a fixed order). The result is checked with decode_command, so an invalid
// command throws the ProtocolError that decoding it would, and whatever this
// returns decodes back to the same command minus the unused fields.
inline std::string encode_command(const Command& c) {
  namespace json = boost::json;
  json::object o;
  const std::string_view op = c.op_spelled_delete ? std::string_view("delete") : to_string(c.op);
  o["op"] = detail::sv(op);
  const bool nameless = c.op == Op::create_many || (c.op == Op::free && !c.generations.empty()) ||
                        (c.op == Op::pull && !c.names.empty());
  if (!nameless || !c.name.empty()) o["name"] = detail::sv(c.name);
  if (c.op == Op::create || c.op == Op::create_many) {
    if (c.op == Op::create && c.dtype) o["dtype"] = detail::sv(to_string(*c.dtype));
    if (c.op == Op::create && c.shape) {
      json::array a;
      for (std::int64_t d : *c.shape) a.emplace_back(d);
      o["shape"] = std::move(a);
    }
    if (c.device) o["device"] = *c.device;
    if (c.device_uuid) o["device_uuid"] = detail::sv(*c.device_uuid);
    if (c.backend) o["backend"] = detail::sv(to_string(*c.backend));
    if (c.persistent) o["persistent"] = *c.persistent;
  }
  if (c.op == Op::create_many) {
    json::array a;
    for (const auto& e : c.tensors) a.emplace_back(detail::encode_create_entry(e));
    o["tensors"] = std::move(a);
  }
  if (c.op == Op::replicate) {
    json::array a;
    for (const auto& d : c.devices) a.emplace_back(detail::sv(d));
    o["devices"] = std::move(a);
    if (c.replicate_prefix) o["prefix"] = true;
    if (c.replicate_refresh) o["refresh"] = true;
    if (c.idle_ms) o["idle_ms"] = *c.idle_ms;
  }
  if (c.op == Op::pull && !c.names.empty()) {
    json::array a;
    for (const auto& n : c.names) a.emplace_back(detail::sv(n));
    o["names"] = std::move(a);
  }
  if (c.pid) o["pid"] = *c.pid;
  if (c.pid_ns) o["pidns"] = "pid:[" + std::to_string(*c.pid_ns) + "]";
  if (c.node) o["node"] = detail::sv(*c.node);
  if (c.holder) o["holder"] = detail::sv(*c.holder);
  if (c.op != Op::create && c.generation) o["generation"] = *c.generation;
  if (c.op == Op::free && !c.generations.empty()) {
    json::array a;
    for (auto g : c.generations) a.emplace_back(g);
    o["generations"] = std::move(a);
  }
  if (c.id) o["id"] = detail::id_to_json(*c.id, c.id_is_number);
  if (c.reply_to) o["reply_to"] = detail::sv(*c.reply_to);
  std::string out = json::serialize(o);
  (void)decode_command(out);
  return out;
}

// Best effort for a command that decode_command rejected: if `text` is a JSON
// object with a valid "reply_to", returns it (and "id" when that is valid
// too) so the error reply can still reach the sender. A document the strict
// parser refuses (duplicate key, trailing bytes, raw control byte, invalid
// UTF-8, too deep, too large, cut short) is scanned leniently for the two
// fields (reply_route.hpp). Never throws.
inline std::optional<ReplyRoute> peek_reply_route(std::string_view text) noexcept {
  namespace json = boost::json;
  try {
    json::value doc;
    try {
      doc = detail::parse_document(text, "command", kMaxPeekBytes);
    } catch (const ProtocolError&) {
      return detail::scan_reply_route(text);
    }
    const json::object* o = doc.if_object();
    if (!o) return std::nullopt;
    const json::value* rt = detail::find(*o, "reply_to");
    if (!rt) return std::nullopt;
    ReplyRoute r;
    r.reply_to = detail::get_bounded_text(*rt, "reply_to", kMaxReplyToBytes);
    if (const json::value* v = detail::find(*o, "id")) {
      try {
        r.id = detail::get_id(*v, r.id_is_number);
      } catch (const ProtocolError&) {
        r.id.reset();
        r.id_is_number = false;
      }
    }
    return r;
  } catch (...) {
    return std::nullopt;
  }
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::protocol
