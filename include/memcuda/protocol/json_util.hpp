// The strict JSON reading that every JSON wire format shares (commands,
// replies, inbox messages, the session value, pool statistics): one document
// of bounded size and depth, no duplicate keys, no trailing bytes, integers
// that must fit 64 bits, and field readers that say which field was wrong
// and how. Everything fails with ProtocolError and a specific ProtocolErrc.
//
// The only header under include/memcuda/protocol/ that reads JSON through
// Boost.JSON directly; the codecs include it.
#pragma once

#include "memcuda/config.hpp"

#include <boost/json/basic_parser_impl.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse_options.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>
#include <boost/json/value_stack.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memcuda/error.hpp"
#include "memcuda/protocol/limits.hpp"
#include "memcuda/shape.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace protocol::detail {

namespace json = boost::json;

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
  if (ec) {
    // Name the two faults a hand-written sender makes most: a raw control
    // byte (a line break pasted into a string) and bytes that are not UTF-8.
    std::string why = ec.message();
    if (ec == json::error::syntax && n < text.size()) {
      static constexpr char kHex[] = "0123456789abcdef";
      const auto b = static_cast<unsigned char>(text[n]);
      const std::string hex = std::string("0x") + kHex[b >> 4] + kHex[b & 15];
      if (b < 0x20) why = "raw control byte " + hex + " (a string must escape control characters, e.g. \\n)";
      else if (b >= 0x80) why = "invalid UTF-8 (byte " + hex + ")";
    }
    fail(ProtocolErrc::bad_json, std::string(what) + ": invalid JSON at byte " + std::to_string(n) + " (" + why + ")");
  }
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

inline json::value id_to_json(const std::string& id, bool is_number) {
  if (!is_number) return json::value(json::string_view(id.data(), id.size()));
  auto u = canonical_uint(id);
  if (!u)
    fail(ProtocolErrc::bad_value, "field \"id\": id_is_number is set but \"" +
                                      memcuda::detail::rules::printable(id) +
                                      "\" is not a decimal integer in 0..2^64-1");
  return json::value(*u);
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

// Parses `text` (limit bytes at most) and returns its top-level object;
// not_object when the document is anything else. The returned value owns the
// object: keep it alive while using the reference.
inline json::value parse_object(std::string_view text, std::string_view what,
                                std::size_t limit = kMaxCommandBytes) {
  json::value doc = parse_document(text, what, limit);
  if (!doc.is_object())
    fail(ProtocolErrc::not_object, std::string(what) + ": expected a JSON object at the top level, got " + describe(doc));
  return doc;
}

inline bool get_bool(const json::value& v, std::string_view field) {
  if (!v.is_bool()) wrong_type(field, "a boolean", v);
  return v.get_bool();
}

// device_uuid-like tokens that may also be empty ("" for the host backend).
inline std::string get_token_or_empty(const json::value& v, std::string_view field,
                                      std::size_t max) {
  if (v.is_string() && v.get_string().empty()) return {};
  return get_token(v, field, max);
}

inline json::string_view sv(std::string_view s) { return json::string_view(s.data(), s.size()); }

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::protocol::detail
