// The wire formats of the control plane (docs/protocol.md):
//  - lifecycle commands, JSON documents LPUSHed on the List `tensor_lifecycle`
//    (decode_command / encode_command);
//  - replies, JSON documents LPUSHed on the List named by a command's
//    reply_to (decode_reply / encode_reply / make_error_reply);
//  - tensor records, the fields of a tensor's Redis Hash
//    (decode_record / encode_record).
//
// Decoders face untrusted bytes: they are strict, bounded (size and nesting)
// and report every rejection as ProtocolError with a specific ProtocolErrc and
// a message naming the field and what was expected. They never crash and have
// no undefined behaviour on any input; the only other exception they may let
// through is std::bad_alloc. All JSON goes through Boost.JSON.
#pragma once

#include <boost/json/basic_parser_impl.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse_options.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>
#include <boost/json/value_stack.hpp>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memcuda/dtype.hpp"
#include "memcuda/error.hpp"
#include "memcuda/shape.hpp"
#include "memcuda/tensor_info.hpp"

namespace memcuda::protocol {

// Largest command or reply document, in bytes; longer input is rejected
// (too_large) before any parsing.
inline constexpr std::size_t kMaxCommandBytes = 64 * 1024;
// How large a rejected command may be for its reply_to to be read (so that
// even an oversized command is answered with its error).
inline constexpr std::size_t kMaxPeekBytes = 1024 * 1024;
// Deepest nesting of arrays/objects a document may have. A valid command
// needs 2 (the object and "shape"), a reply 2 ("error").
inline constexpr std::size_t kMaxJsonDepth = 16;
// Limits of the command fields (docs/protocol.md, "Lifecycle commands").
inline constexpr std::size_t kMaxIdBytes = 128;
inline constexpr std::size_t kMaxReplyToBytes = 255;
inline constexpr std::size_t kMaxNodeBytes = 255;
inline constexpr std::size_t kMaxHolderBytes = 255;
inline constexpr std::size_t kMaxDeviceUuidBytes = 128;
inline constexpr int kMaxDevice = 1023;
inline constexpr std::int64_t kMaxPid = std::numeric_limits<std::int32_t>::max();
// make_error_reply cuts longer messages so that a reply always fits.
inline constexpr std::size_t kMaxErrorMessageBytes = 4096;

// Lifecycle operations. `free` is internal: a process whose release dropped a
// tensor's refcount to 0 sends it so that the allocator of record frees the
// memory.
enum class Op : std::uint8_t { create, get, del, free };

// Wire names: "create", "get", "delete", "free".
constexpr std::string_view to_string(Op op) noexcept {
  switch (op) {
    case Op::create: return "create";
    case Op::get: return "get";
    case Op::del: return "delete";
    case Op::free: return "free";
  }
  return "";
}

inline std::optional<Op> op_from_string(std::string_view s) noexcept {
  if (s == "create") return Op::create;
  if (s == "get") return Op::get;
  if (s == "delete") return Op::del;
  if (s == "free") return Op::free;
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
  std::optional<bool> persistent;           // create: also held by its name until deleted
  std::optional<std::string> device_uuid;   // create: names the device across processes
  std::optional<std::int64_t> pid;          // all ops
  std::optional<std::string> node;          // all ops
  std::optional<std::string> id;            // all ops; echoed in the reply
  bool id_is_number = false;                // id was a JSON integer (id holds its decimal text)
  std::optional<std::string> reply_to;      // all ops; List that receives the reply
  std::optional<std::uint64_t> generation;  // get, delete (optional), free (required)
  std::optional<std::string> holder;        // all ops

  friend bool operator==(const Command&, const Command&) = default;
};

struct ReplyErrorInfo {
  std::string code;     // memcuda::Error::code() of the failure, e.g. "not_found"
  std::string message;  // human-readable; for protocol errors starts with the ProtocolErrc

  friend bool operator==(const ReplyErrorInfo&, const ReplyErrorInfo&) = default;
};

// The answer to a command. ok == true: the optional result fields describe
// the tensor; ok == false: error is set.
struct Reply {
  std::optional<std::string> id;
  bool id_is_number = false;
  bool ok = true;
  std::optional<ReplyErrorInfo> error;
  std::optional<std::string> name;
  std::optional<std::uint64_t> generation;
  std::optional<std::int64_t> refcount;
  std::optional<std::string> op;

  friend bool operator==(const Reply&, const Reply&) = default;
};

// Where to send the error reply for a command that could not be decoded.
struct ReplyRoute {
  std::string reply_to;
  std::optional<std::string> id;
  bool id_is_number = false;
};

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
inline constexpr std::string_view refcount = "refcount";
inline constexpr std::string_view state = "state";
inline constexpr std::string_view generation = "generation";
inline constexpr std::string_view epoch = "epoch";
inline constexpr std::string_view owner = "owner";
inline constexpr std::string_view owner_pid = "owner_pid";
inline constexpr std::string_view create_id = "create_id";
inline constexpr std::string_view event_handle = "event_handle";
inline constexpr std::string_view event_version = "event_version";
// A holder's count is stored in the field kHolderPrefix + holder id.
inline constexpr std::string_view holder_prefix = "holder:";
}  // namespace record_field

// Hash fields in HSET order, values binary-safe.
using Fields = std::vector<std::pair<std::string, std::string>>;

namespace detail {

namespace json = boost::json;

[[noreturn]] inline void fail(ProtocolErrc e, std::string msg) { throw ProtocolError(e, msg); }

// Boost.JSON SAX handler that builds a json::value like json::parser does, and
// in addition
//  - rejects duplicate object keys (json::object would silently keep the last
//    one, so {"op":"get","op":"delete"} would mean whatever the parser chose);
//  - replaces an integer literal that does not fit 64 bits (Boost.JSON parses
//    it as a double) by a quiet NaN. JSON text cannot spell NaN, so field
//    readers can tell "integer out of range" (bad_value) from "1.5" or "1e3"
//    (wrong_type).
class StrictHandler {
 public:
  static constexpr std::size_t max_object_size = json::object::max_size();
  static constexpr std::size_t max_array_size = json::array::max_size();
  static constexpr std::size_t max_key_size = json::string::max_size();
  static constexpr std::size_t max_string_size = json::string::max_size();

  json::value_stack st;
  std::optional<std::string> duplicate_key;

  bool on_document_begin(json::error_code&) { return true; }
  bool on_document_end(json::error_code&) { return true; }
  bool on_object_begin(json::error_code&) {
    keys_.emplace_back();
    return true;
  }
  bool on_object_end(std::size_t n, json::error_code&) {
    keys_.pop_back();
    st.push_object(n);
    return true;
  }
  bool on_array_begin(json::error_code&) { return true; }
  bool on_array_end(std::size_t n, json::error_code&) {
    st.push_array(n);
    return true;
  }
  bool on_key_part(json::string_view s, std::size_t, json::error_code&) {
    key_.append(s.data(), s.size());
    st.push_chars(s);
    return true;
  }
  bool on_key(json::string_view s, std::size_t, json::error_code& ec) {
    key_.append(s.data(), s.size());
    if (!keys_.back().insert(key_).second) {
      duplicate_key = std::move(key_);
      key_.clear();
      ec = json::error::syntax;
      return false;
    }
    key_.clear();
    st.push_key(s);
    return true;
  }
  bool on_string_part(json::string_view s, std::size_t, json::error_code&) {
    st.push_chars(s);
    return true;
  }
  bool on_string(json::string_view s, std::size_t, json::error_code&) {
    st.push_string(s);
    return true;
  }
  bool on_number_part(json::string_view s, json::error_code&) {
    number_.append(s.data(), s.size());
    return true;
  }
  bool on_int64(std::int64_t i, json::string_view, json::error_code&) {
    number_.clear();
    st.push_int64(i);
    return true;
  }
  bool on_uint64(std::uint64_t u, json::string_view, json::error_code&) {
    number_.clear();
    st.push_uint64(u);
    return true;
  }
  bool on_double(double d, json::string_view s, json::error_code&) {
    number_.append(s.data(), s.size());
    bool integral = number_.find_first_of(".eE") == std::string::npos;
    number_.clear();
    st.push_double(integral ? std::numeric_limits<double>::quiet_NaN() : d);
    return true;
  }
  bool on_bool(bool b, json::error_code&) {
    st.push_bool(b);
    return true;
  }
  bool on_null(json::error_code&) {
    st.push_null();
    return true;
  }
  bool on_comment_part(json::string_view, json::error_code&) { return true; }
  bool on_comment(json::string_view, json::error_code&) { return true; }

 private:
  std::vector<std::set<std::string, std::less<>>> keys_;  // one per open object
  std::string key_;
  std::string number_;
};

// Parses exactly one JSON document of at most kMaxCommandBytes bytes and at
// most kMaxJsonDepth levels. `what` ("command", "reply") starts the messages.
inline json::value parse_document(std::string_view text, std::string_view what,
                                  std::size_t limit = kMaxCommandBytes) {
  if (text.size() > limit)
    fail(ProtocolErrc::too_large, std::string(what) + ": " + std::to_string(text.size()) +
                                      " bytes exceeds the limit of " + std::to_string(limit) + " bytes");
  json::parse_options opt;
  opt.max_depth = kMaxJsonDepth;
  json::basic_parser<StrictHandler> p(opt);
  p.handler().st.reset();
  json::error_code ec;
  std::size_t n = p.write_some(false, text.data(), text.size(), ec);
  if (p.handler().duplicate_key)
    fail(ProtocolErrc::bad_json, std::string(what) + ": duplicate key \"" +
                                     memcuda::detail::rules::printable(*p.handler().duplicate_key) +
                                     "\"");
  if (ec == json::error::too_deep)
    fail(ProtocolErrc::bad_json,
         std::string(what) + ": nesting deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  if (ec)
    fail(ProtocolErrc::bad_json, std::string(what) + ": invalid JSON at byte " + std::to_string(n) +
                                     " (" + ec.message() + ")");
  for (std::size_t i = n; i < text.size(); ++i) {
    char c = text[i];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
      fail(ProtocolErrc::trailing_garbage, std::string(what) + ": unexpected byte at offset " +
                                               std::to_string(i) +
                                               " after the end of the JSON document");
  }
  return p.handler().st.release();
}

inline std::string describe(const json::value& v) {
  switch (v.kind()) {
    case json::kind::null: return "null";
    case json::kind::bool_: return "a boolean";
    case json::kind::int64:
    case json::kind::uint64: return "an integer";
    case json::kind::double_:
      return std::isnan(v.get_double()) ? "an integer that does not fit 64 bits"
                                        : "a number with a fraction or exponent";
    case json::kind::string: return "a string";
    case json::kind::array: return "an array";
    case json::kind::object: return "an object";
  }
  return "an unknown JSON value";
}

inline std::string field_ref(std::string_view field) {
  return "field \"" + std::string(field) + "\"";
}

[[noreturn]] inline void wrong_type(std::string_view field, std::string_view expected,
                                    const json::value& v) {
  fail(ProtocolErrc::wrong_type,
       field_ref(field) + ": expected " + std::string(expected) + ", got " + describe(v));
}

inline std::string_view get_string(const json::value& v, std::string_view field) {
  if (!v.is_string()) wrong_type(field, "a string", v);
  const json::string& s = v.get_string();
  return {s.data(), s.size()};
}

// An integer in [lo, hi]; wrong_type for non-integers, bad_value outside.
inline std::int64_t get_int(const json::value& v, std::string_view field, std::int64_t lo,
                            std::int64_t hi) {
  auto out_of_range = [&](const std::string& shown) -> std::int64_t {
    fail(ProtocolErrc::bad_value, field_ref(field) + ": " + shown + " is out of range [" +
                                      std::to_string(lo) + ", " + std::to_string(hi) + "]");
  };
  if (v.is_int64()) {
    std::int64_t i = v.get_int64();
    if (i < lo || i > hi) return out_of_range(std::to_string(i));
    return i;
  }
  if (v.is_uint64()) return out_of_range(std::to_string(v.get_uint64()));
  if (v.is_double() && std::isnan(v.get_double()))
    return out_of_range("an integer that does not fit 64 bits");
  wrong_type(field, "an integer", v);
}

// A non-negative integer up to 2^64 - 1.
inline std::uint64_t get_uint(const json::value& v, std::string_view field) {
  if (v.is_uint64()) return v.get_uint64();
  if (v.is_int64()) {
    if (v.get_int64() < 0)
      fail(ProtocolErrc::bad_value, field_ref(field) + ": " + std::to_string(v.get_int64()) +
                                        " is negative; expected an integer >= 0");
    return static_cast<std::uint64_t>(v.get_int64());
  }
  if (v.is_double() && std::isnan(v.get_double()))
    fail(ProtocolErrc::bad_value,
         field_ref(field) + ": integer does not fit 64 bits; expected 0..2^64-1");
  wrong_type(field, "a non-negative integer", v);
}

inline void check_length(std::string_view s, std::string_view field, std::size_t max) {
  if (s.empty() || s.size() > max)
    fail(ProtocolErrc::bad_value, field_ref(field) + ": length " + std::to_string(s.size()) +
                                      " is outside 1.." + std::to_string(max) + " bytes");
}

// No ASCII control characters (0x00-0x1f, 0x7f); other bytes (UTF-8) are fine.
inline void check_no_controls(std::string_view s, std::string_view field) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f)
      fail(ProtocolErrc::bad_value, field_ref(field) + ": control character 0x" +
                                        std::string(1, "0123456789abcdef"[c >> 4]) +
                                        std::string(1, "0123456789abcdef"[c & 0xf]) +
                                        " at offset " + std::to_string(i));
  }
}

inline std::string get_bounded_text(const json::value& v, std::string_view field, std::size_t max) {
  std::string_view s = get_string(v, field);
  check_length(s, field, max);
  check_no_controls(s, field);
  return std::string(s);
}

// node, device_uuid: printable ASCII without spaces (0x21-0x7e).
inline std::string get_token(const json::value& v, std::string_view field, std::size_t max) {
  std::string_view s = get_string(v, field);
  check_length(s, field, max);
  for (std::size_t i = 0; i < s.size(); ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x21 || c > 0x7e)
      fail(ProtocolErrc::bad_value, field_ref(field) + ": byte at offset " + std::to_string(i) +
                                        " is not printable ASCII (spaces are not allowed)");
  }
  return std::string(s);
}

// id: a string of 1..kMaxIdBytes bytes, or an integer >= 0 (kept as its
// decimal text with is_number = true, so it can be echoed as a number).
inline std::string get_id(const json::value& v, bool& is_number) {
  if (v.is_string()) {
    std::string_view s = get_string(v, "id");
    check_length(s, "id", kMaxIdBytes);
    is_number = false;
    return std::string(s);
  }
  if (v.is_int64() || v.is_uint64() || v.is_double()) {
    std::uint64_t u = get_uint(v, "id");
    is_number = true;
    return std::to_string(u);
  }
  wrong_type("id", "a string or a non-negative integer", v);
}

// Decimal text of a uint64 exactly as std::to_string writes it.
inline std::optional<std::uint64_t> canonical_uint(std::string_view s) noexcept {
  std::uint64_t u = 0;
  if (s.empty() || s.size() > 20 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), u);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return u;
}

inline json::value id_to_json(const std::string& id, bool is_number) {
  if (!is_number) return json::value(json::string_view(id.data(), id.size()));
  auto u = canonical_uint(id);
  if (!u)
    fail(ProtocolErrc::bad_value, "field \"id\": id_is_number is set but \"" +
                                      memcuda::detail::rules::printable(id) +
                                      "\" is not a decimal integer in 0..2^64-1");
  return json::value(*u);
}

inline bool is_command_field(std::string_view k) noexcept {
  static constexpr std::string_view kFields[] = {
      "op",  "name", "dtype",    "shape",      "device", "backend",     "persistent",
      "pid", "node", "reply_to", "generation", "holder", "device_uuid", "id"};
  for (std::string_view f : kFields)
    if (k == f) return true;
  return false;
}

inline const json::value* find(const json::object& o, std::string_view key) {
  return o.if_contains(json::string_view(key.data(), key.size()));
}

inline const json::value& require(const json::object& o, std::string_view key,
                                  std::string_view what) {
  const json::value* v = find(o, key);
  if (!v)
    fail(ProtocolErrc::missing_field,
         std::string(what) + ": missing field \"" + std::string(key) + "\"");
  return *v;
}

inline std::string object_kind_error(std::string_view what, const json::value& v) {
  return std::string(what) + ": expected a JSON object at the top level, got " + describe(v);
}

// Replaces bytes that do not form valid UTF-8 by '?', so that any exception
// text can travel in a JSON string.
inline std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    std::size_t len = c < 0x80           ? 1
                      : (c >> 5) == 0x6  ? 2
                      : (c >> 4) == 0xe  ? 3
                      : (c >> 3) == 0x1e ? 4
                                         : 0;
    bool ok = len != 0 && i + len <= s.size();
    for (std::size_t k = 1; ok && k < len; ++k)
      ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
    if (ok && len > 1) {
      // Reject overlong forms, surrogates and code points above U+10FFFF.
      std::uint32_t cp = c & (0x7f >> len);
      for (std::size_t k = 1; k < len; ++k)
        cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
      static constexpr std::uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
      ok = cp >= kMin[len] && cp <= 0x10ffff && (cp < 0xd800 || cp > 0xdfff);
    }
    if (ok) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out.push_back('?');
      ++i;
    }
  }
  return out;
}

// Decimal text as written by encode_record; nullopt for anything else
// (sign on unsigned, spaces, "+1", empty, out of range).
template <class Int>
std::optional<Int> parse_decimal(std::string_view s) noexcept {
  Int v{};
  if (s.empty()) return std::nullopt;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace detail

// Decodes one lifecycle command. Throws ProtocolError (see the errc table in
// docs/protocol.md); duplicate keys are bad_json.
inline Command decode_command(std::string_view text) {
  namespace json = boost::json;
  using detail::fail;
  json::value doc = detail::parse_document(text, "command");
  const json::object* o = doc.if_object();
  if (!o) fail(ProtocolErrc::not_object, detail::object_kind_error("command", doc));
  for (const auto& kv : *o) {
    std::string_view k(kv.key().data(), kv.key().size());
    if (!detail::is_command_field(k))
      fail(ProtocolErrc::unknown_field,
           "command: unknown field \"" + memcuda::detail::rules::printable(k) +
               "\"; the fields are op, name, dtype, shape, device, device_uuid, backend, "
               "persistent, pid, node, holder, generation, id, reply_to");
  }

  Command c;
  std::string_view op = detail::get_string(detail::require(*o, "op", "command"), "op");
  auto parsed_op = op_from_string(op);
  if (!parsed_op)
    fail(ProtocolErrc::unknown_op, "field \"op\": unknown operation \"" +
                                       memcuda::detail::rules::printable(op) +
                                       "\"; expected create, get, delete or free");
  c.op = *parsed_op;

  std::string_view name = detail::get_string(detail::require(*o, "name", "command"), "name");
  memcuda::detail::rules::validate_name(name, "field \"name\"");
  c.name = std::string(name);

  if (const json::value* v = detail::find(*o, "id")) c.id = detail::get_id(*v, c.id_is_number);
  if (const json::value* v = detail::find(*o, "reply_to"))
    c.reply_to = detail::get_bounded_text(*v, "reply_to", kMaxReplyToBytes);
  if (const json::value* v = detail::find(*o, "pid"))
    c.pid = detail::get_int(*v, "pid", 1, kMaxPid);
  if (const json::value* v = detail::find(*o, "node"))
    c.node = detail::get_token(*v, "node", kMaxNodeBytes);
  if (const json::value* v = detail::find(*o, "holder"))
    c.holder = detail::get_bounded_text(*v, "holder", kMaxHolderBytes);

  switch (c.op) {
    case Op::create: {
      std::string_view dt =
          detail::get_string(detail::require(*o, "dtype", "command \"create\""), "dtype");
      c.dtype = dtype_from_string(dt);
      if (!c.dtype)
        fail(ProtocolErrc::unknown_dtype,
             "field \"dtype\": unknown dtype \"" + memcuda::detail::rules::printable(dt) +
                 "\"; expected one of bool u8 i8 i16 i32 i64 u16 u32 u64 f16 bf16 f32 f64");
      c.shape = memcuda::detail::rules::shape_from_json(
          detail::require(*o, "shape", "command \"create\""), "field \"shape\"");
      try {
        (void)byte_size(*c.dtype, *c.shape);
      } catch (const ProtocolError& e) {
        fail(e.errc(), std::string("field \"shape\": ") + e.what());
      }
      if (const json::value* v = detail::find(*o, "device"))
        c.device = static_cast<int>(detail::get_int(*v, "device", 0, kMaxDevice));
      if (const json::value* v = detail::find(*o, "device_uuid"))
        c.device_uuid = detail::get_token(*v, "device_uuid", kMaxDeviceUuidBytes);
      if (const json::value* v = detail::find(*o, "persistent")) {
        if (!v->is_bool()) detail::wrong_type("persistent", "a boolean", *v);
        c.persistent = v->get_bool();
      }
      if (const json::value* v = detail::find(*o, "backend")) {
        std::string_view b = detail::get_string(*v, "backend");
        c.backend = backend_from_string(b);
        if (!c.backend)
          fail(ProtocolErrc::bad_value, "field \"backend\": \"" +
                                            memcuda::detail::rules::printable(b) +
                                            "\" is not a backend; expected \"cuda\" or \"host\"");
      }
      break;
    }
    case Op::get:
    case Op::del:
      if (const json::value* v = detail::find(*o, "generation"))
        c.generation = detail::get_uint(*v, "generation");
      break;
    case Op::free:
      c.generation =
          detail::get_uint(detail::require(*o, "generation", "command \"free\""), "generation");
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
  o["op"] = json::string_view(to_string(c.op).data(), to_string(c.op).size());
  o["name"] = json::string_view(c.name.data(), c.name.size());
  if (c.op == Op::create) {
    if (c.dtype)
      o["dtype"] = json::string_view(to_string(*c.dtype).data(), to_string(*c.dtype).size());
    if (c.shape) {
      json::array a;
      for (std::int64_t d : *c.shape) a.emplace_back(d);
      o["shape"] = std::move(a);
    }
    if (c.device) o["device"] = *c.device;
    if (c.device_uuid)
      o["device_uuid"] = json::string_view(c.device_uuid->data(), c.device_uuid->size());
    if (c.backend)
      o["backend"] = json::string_view(to_string(*c.backend).data(), to_string(*c.backend).size());
    if (c.persistent) o["persistent"] = *c.persistent;
  }
  if (c.pid) o["pid"] = *c.pid;
  if (c.node) o["node"] = json::string_view(c.node->data(), c.node->size());
  if (c.holder) o["holder"] = json::string_view(c.holder->data(), c.holder->size());
  if (c.op != Op::create && c.generation) o["generation"] = *c.generation;
  if (c.id) o["id"] = detail::id_to_json(*c.id, c.id_is_number);
  if (c.reply_to) o["reply_to"] = json::string_view(c.reply_to->data(), c.reply_to->size());
  std::string out = json::serialize(o);
  (void)decode_command(out);
  return out;
}

// Best effort for a command that decode_command rejected: if `text` is a JSON
// object with a valid "reply_to", returns it (and "id" when that is valid
// too) so the error reply can still reach the sender. Never throws.
inline std::optional<ReplyRoute> peek_reply_route(std::string_view text) noexcept {
  namespace json = boost::json;
  try {
    // An oversized command still deserves its error reply: read reply_to
    // from documents up to kMaxPeekBytes (depth stays bounded).
    json::value doc = detail::parse_document(text, "command", kMaxPeekBytes);
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

// Decodes a reply. Strict about JSON, types and the fields it knows; fields
// it does not know are ignored so that newer servers can add some. Throws
// ProtocolError; ok == false without "error", or ok == true with one, is
// missing_field / bad_value.
inline Reply decode_reply(std::string_view text) {
  namespace json = boost::json;
  using detail::fail;
  json::value doc = detail::parse_document(text, "reply");
  const json::object* o = doc.if_object();
  if (!o) fail(ProtocolErrc::not_object, detail::object_kind_error("reply", doc));
  Reply r;
  const json::value& ok = detail::require(*o, "ok", "reply");
  if (!ok.is_bool()) detail::wrong_type("ok", "a boolean", ok);
  r.ok = ok.get_bool();
  if (const json::value* v = detail::find(*o, "id")) r.id = detail::get_id(*v, r.id_is_number);
  if (const json::value* v = detail::find(*o, "op"))
    r.op = std::string(detail::get_string(*v, "op"));
  if (const json::value* v = detail::find(*o, "name"))
    r.name = std::string(detail::get_string(*v, "name"));
  if (const json::value* v = detail::find(*o, "generation"))
    r.generation = detail::get_uint(*v, "generation");
  if (const json::value* v = detail::find(*o, "refcount"))
    r.refcount = detail::get_int(*v, "refcount", std::numeric_limits<std::int64_t>::min(),
                                 std::numeric_limits<std::int64_t>::max());
  const json::value* err = detail::find(*o, "error");
  if (r.ok) {
    if (err) fail(ProtocolErrc::bad_value, "field \"error\": present in a reply with \"ok\": true");
  } else {
    if (!err) fail(ProtocolErrc::missing_field, "reply: missing field \"error\" (\"ok\" is false)");
    const json::object* eo = err->if_object();
    if (!eo) detail::wrong_type("error", "an object", *err);
    ReplyErrorInfo info;
    info.code = std::string(
        detail::get_string(detail::require(*eo, "code", "field \"error\""), "error.code"));
    info.message = std::string(
        detail::get_string(detail::require(*eo, "message", "field \"error\""), "error.message"));
    r.error = std::move(info);
  }
  return r;
}

// Encodes a reply as compact JSON: id, ok, op, name, generation, refcount,
// error (absent optionals are left out; a numeric id is written as a JSON
// number). Throws ProtocolError for a reply decode_reply would reject
// (ok == false without error, ok == true with one, a bad numeric id).
inline std::string encode_reply(const Reply& r) {
  namespace json = boost::json;
  auto sv = [](const std::string& s) { return json::string_view(s.data(), s.size()); };
  json::object o;
  if (r.id) o["id"] = detail::id_to_json(*r.id, r.id_is_number);
  o["ok"] = r.ok;
  if (r.op) o["op"] = sv(*r.op);
  if (r.name) o["name"] = sv(*r.name);
  if (r.generation) o["generation"] = *r.generation;
  if (r.refcount) o["refcount"] = *r.refcount;
  if (r.error) {
    json::object e;
    e["code"] = sv(r.error->code);
    e["message"] = sv(r.error->message);
    o["error"] = std::move(e);
  }
  std::string out = json::serialize(o);
  (void)decode_reply(out);
  return out;
}

// The error reply for `cmd` (may be null when the command could not be
// decoded) failing with `e`: code is memcuda::Error::code() ("protocol_error"
// for ProtocolError, whose message then starts with its ProtocolErrc name) or
// "internal" for any other exception; id, op and name are copied from cmd.
// The message is made valid UTF-8 and cut to kMaxErrorMessageBytes, so the
// result always encodes.
inline Reply make_error_reply(const Command* cmd, const std::exception& e) {
  Reply r;
  r.ok = false;
  ReplyErrorInfo info;
  std::string message = e.what();
  if (const auto* me = dynamic_cast<const memcuda::Error*>(&e)) {
    info.code = me->code();
    if (const auto* pe = dynamic_cast<const ProtocolError*>(&e))
      message = std::string(memcuda::to_string(pe->errc())) + ": " + message;
  } else {
    info.code = "internal";
  }
  if (message.size() > kMaxErrorMessageBytes) message.resize(kMaxErrorMessageBytes);
  info.message = detail::sanitize_utf8(message);
  info.code = detail::sanitize_utf8(info.code);
  r.error = std::move(info);
  if (cmd) {
    r.id = cmd->id;
    r.id_is_number = cmd->id_is_number;
    // A hand-built command may carry an id no reply can hold: echo it as a
    // string when it is not a valid number, drop it when its size is wrong.
    if (r.id && r.id_is_number && !detail::canonical_uint(*r.id)) r.id_is_number = false;
    if (r.id) r.id = detail::sanitize_utf8(*r.id);
    if (r.id && (r.id->empty() || r.id->size() > kMaxIdBytes)) {
      r.id.reset();
      r.id_is_number = false;
    }
    r.op = std::string(to_string(cmd->op));
    r.name = detail::sanitize_utf8(cmd->name);
  }
  return r;
}

// The Hash fields of a record, in a fixed order (name, dtype, shape, ctime,
// node, device, device_uuid, bytes, backend, ipc_handle, offset, alloc_bytes,
// alloc_id, refcount, state, generation, epoch, owner, owner_pid, create_id,
// event_handle, event_version, then "holder:<id>" per holder). Integers are
// decimal text; ipc_handle and event_handle are copied byte for byte.
inline Fields encode_record(const TensorInfo& t) {
  namespace f = record_field;
  Fields out;
  out.reserve(22 + t.holders.size());
  auto add = [&](std::string_view k, std::string v) {
    out.emplace_back(std::string(k), std::move(v));
  };
  add(f::name, t.name);
  add(f::dtype, std::string(to_string(t.dtype)));
  add(f::shape, shape_to_string(t.shape));
  add(f::ctime, std::to_string(t.ctime_ms));
  add(f::node, t.node);
  add(f::device, std::to_string(t.device));
  add(f::device_uuid, t.device_uuid);
  add(f::bytes, std::to_string(t.bytes));
  add(f::backend, std::string(to_string(t.backend)));
  add(f::ipc_handle, t.ipc_handle);
  add(f::offset, std::to_string(t.offset));
  add(f::alloc_bytes, std::to_string(t.alloc_bytes));
  add(f::alloc_id, std::to_string(t.alloc_id));
  add(f::refcount, std::to_string(t.refcount));
  add(f::state, std::string(to_string(t.state)));
  add(f::generation, std::to_string(t.generation));
  add(f::epoch, std::to_string(t.epoch));
  add(f::owner, t.owner);
  add(f::owner_pid, std::to_string(t.owner_pid));
  add(f::create_id, t.create_id);
  add(f::event_handle, t.event_handle);
  add(f::event_version, std::to_string(t.event_version));
  for (const auto& [holder, count] : t.holders)
    add(std::string(f::holder_prefix) + holder, std::to_string(count));
  return out;
}

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
  namespace f = record_field;
  std::map<std::string_view, std::string_view> by_name;
  TensorInfo t;
  std::string who = "tensor record";
  for (const auto& [k, v] : fields)
    if (k == f::name && memcuda::is_valid_name(v)) who = "tensor record \"" + v + "\"";
  auto bad = [&](std::string_view field, const std::string& why) {
    detail::fail(ProtocolErrc::bad_record,
                 who + ": field \"" + memcuda::detail::rules::printable(field) + "\" " + why);
  };
  for (const auto& [k, v] : fields) {
    std::string_view key = k;
    if (key.starts_with(f::holder_prefix)) {
      std::string id(key.substr(f::holder_prefix.size()));
      if (id.empty()) bad(key, "names no holder");
      auto n = detail::parse_decimal<std::int64_t>(v);
      if (!n || *n < 0)
        bad(key, "is \"" + memcuda::detail::rules::printable(v) + "\", expected an integer >= 0");
      if (!t.holders.emplace(std::move(id), *n).second) bad(key, "appears twice");
      continue;
    }
    if (!by_name.emplace(key, v).second) bad(key, "appears twice");
  }
  auto required = [&](std::string_view field) -> std::string_view {
    auto it = by_name.find(field);
    if (it == by_name.end()) bad(field, "is missing");
    return it->second;
  };
  auto optional = [&](std::string_view field) -> std::optional<std::string_view> {
    auto it = by_name.find(field);
    if (it == by_name.end()) return std::nullopt;
    return it->second;
  };
  auto shown = [](std::string_view v) {
    return "\"" + memcuda::detail::rules::printable(v) + "\"";
  };
  auto as_i64 = [&](std::string_view field, std::string_view v) {
    auto n = detail::parse_decimal<std::int64_t>(v);
    if (!n) bad(field, "is " + shown(v) + ", expected a decimal int64");
    return *n;
  };
  auto as_u64 = [&](std::string_view field, std::string_view v) {
    auto n = detail::parse_decimal<std::uint64_t>(v);
    if (!n) bad(field, "is " + shown(v) + ", expected a decimal uint64");
    return *n;
  };

  std::string_view name = required(f::name);
  if (!is_valid_name(name)) bad(f::name, "is " + shown(name) + ", not a valid tensor name");
  t.name = std::string(name);

  std::string_view dt = required(f::dtype);
  auto dtype = dtype_from_string(dt);
  if (!dtype) bad(f::dtype, "is " + shown(dt) + ", not a dtype");
  t.dtype = *dtype;

  std::string_view sh = required(f::shape);
  try {
    t.shape = shape_from_string(sh);
  } catch (const ProtocolError& e) {
    bad(f::shape, "is " + shown(sh) + ": " + e.what());
  }

  t.bytes = as_u64(f::bytes, required(f::bytes));
  std::uint64_t expected = 0;
  try {
    expected = byte_size(t.dtype, t.shape);
  } catch (const ProtocolError& e) {
    bad(f::shape, std::string("does not give a valid size: ") + e.what());
  }
  if (t.bytes != expected)
    bad(f::bytes, "is " + std::to_string(t.bytes) + " but " + std::string(to_string(t.dtype)) +
                      " " + shape_to_string(t.shape) + " needs " + std::to_string(expected));

  std::string_view be = required(f::backend);
  auto backend = backend_from_string(be);
  if (!backend) bad(f::backend, "is " + shown(be) + ", expected \"cuda\" or \"host\"");
  t.backend = *backend;

  std::string_view st = required(f::state);
  auto state = state_from_string(st);
  if (!state) bad(f::state, "is " + shown(st) + ", expected \"pending\", \"ready\" or \"lost\"");
  t.state = *state;

  t.generation = as_u64(f::generation, required(f::generation));
  t.refcount = as_i64(f::refcount, required(f::refcount));
  if (t.refcount < 0) bad(f::refcount, "is " + std::to_string(t.refcount) + ", expected >= 0");

  std::int64_t device = as_i64(f::device, required(f::device));
  if (t.backend == BackendKind::host && device != -1)
    bad(f::device, "is " + std::to_string(device) + ", expected -1 for a host tensor");
  if (t.backend == BackendKind::cuda && (device < 0 || device > protocol::kMaxDevice))
    bad(f::device, "is " + std::to_string(device) + ", expected 0..1023 for a cuda tensor");
  t.device = static_cast<int>(device);

  t.ipc_handle = std::string(required(f::ipc_handle));
  if (t.state != TensorState::pending) {
    if (t.backend == BackendKind::cuda && t.ipc_handle.size() != kIpcHandleBytes)
      bad(f::ipc_handle,
          "is " + std::to_string(t.ipc_handle.size()) + " bytes, expected 64 for a cuda tensor");
    if (t.backend == BackendKind::host && t.ipc_handle.empty())
      bad(f::ipc_handle, "is empty, expected the shm object name of a host tensor");
  }

  if (auto v = optional(f::ctime)) t.ctime_ms = as_i64(f::ctime, *v);
  if (auto v = optional(f::node)) t.node = std::string(*v);
  if (auto v = optional(f::device_uuid)) t.device_uuid = std::string(*v);
  if (auto v = optional(f::offset)) t.offset = as_u64(f::offset, *v);
  // Once allocated, the mapping's extent is needed to map it and to check
  // offset + bytes: alloc_bytes is required then (a record without it could
  // not be written back either).
  if (auto v = t.state == TensorState::pending ? optional(f::alloc_bytes)
                                               : std::optional<std::string_view>(required(f::alloc_bytes))) {
    t.alloc_bytes = as_u64(f::alloc_bytes, *v);
    if (t.state != TensorState::pending &&
        (t.offset > t.alloc_bytes || t.bytes > t.alloc_bytes - t.offset))
      bad(f::alloc_bytes, "is " + std::to_string(t.alloc_bytes) + ", too small for offset " +
                              std::to_string(t.offset) + " + bytes " + std::to_string(t.bytes));
  }
  if (auto v = optional(f::alloc_id)) t.alloc_id = as_u64(f::alloc_id, *v);
  if (auto v = optional(f::epoch)) t.epoch = as_u64(f::epoch, *v);
  if (auto v = optional(f::owner)) t.owner = std::string(*v);
  if (auto v = optional(f::owner_pid)) t.owner_pid = as_i64(f::owner_pid, *v);
  if (auto v = optional(f::create_id)) t.create_id = std::string(*v);
  if (auto v = optional(f::event_handle)) {
    t.event_handle = std::string(*v);
    if (!t.event_handle.empty() && t.event_handle.size() != kIpcHandleBytes)
      bad(f::event_handle,
          "is " + std::to_string(t.event_handle.size()) + " bytes, expected 0 or 64");
  }
  if (auto v = optional(f::event_version)) t.event_version = as_u64(f::event_version, *v);
  return t;
}

}  // namespace memcuda::protocol
