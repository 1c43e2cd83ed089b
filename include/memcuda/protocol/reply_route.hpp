// Where to answer a lifecycle command whose JSON the strict parser refused
// (duplicate key, trailing bytes, a raw control byte or invalid UTF-8 in a
// string, nesting too deep, too large, cut short): a lenient, bounded scan
// for the top-level "reply_to" and "id", so the sender gets its error reply
// instead of waiting for its timeout (docs/protocol.md, "Malformed commands").
//
// The input is untrusted: one pass over at most kMaxPeekBytes bytes, a depth
// counter instead of a stack, and only reply_to and id are ever copied (each
// bounded). Their values are read by the strict parser, so what this returns
// is exactly what decode_command would accept for those two fields.
#pragma once

#include "memcuda/config.hpp"

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "memcuda/protocol/json_util.hpp"
#include "memcuda/protocol/limits.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace protocol {

// Where to send the error reply for a command that could not be decoded.
struct ReplyRoute {
  std::string reply_to;
  std::optional<std::string> id;
  bool id_is_number = false;
};

namespace detail {

// A JSON string's contents (between the quotes) decoded by the strict
// parser: escapes resolved, raw control bytes and invalid UTF-8 refused.
inline std::optional<std::string> strict_string(std::string_view raw, std::size_t max_raw) {
  if (raw.size() > max_raw) return std::nullopt;
  std::string quoted;
  quoted.reserve(raw.size() + 2);
  quoted.append(1, '"').append(raw).append(1, '"');
  try {
    json::value v = parse_document(quoted, "string");
    return std::string(v.get_string().data(), v.get_string().size());
  } catch (const ProtocolError&) {
    return std::nullopt;
  }
}

// One field (reply_to or id) as seen so far: every occurrence must be valid
// and agree, since a sender whose document repeats it is not to be guessed.
struct ScannedField {
  std::optional<json::value> value;
  bool bad = false;
  void see(std::optional<json::value> v) {
    if (!v || (value && *value != *v)) bad = true;
    else value = std::move(v);
  }
};

// Where the scan is in the top-level object, and what it saw there.
struct RouteScan {
  // Escaped, a byte takes at most 6 ("\u00XX"): longer raw text cannot hold a valid value.
  static constexpr std::size_t kMaxRawReplyTo = 6 * kMaxReplyToBytes, kMaxRawId = 6 * kMaxIdBytes, kMaxRawKey = 64;
  enum class At { key, colon, value, after } at = At::key;
  enum class Field { none, reply_to, id } field = Field::none;
  ScannedField reply_to, id;

  void take(std::optional<json::value> v) {
    if (field == Field::reply_to) reply_to.see(std::move(v));
    if (field == Field::id) id.see(std::move(v));
    field = Field::none;
    at = At::after;
  }
  void skip() {
    field = Field::none;
    at = At::after;
  }

  // A string of the top-level object (its text between the quotes).
  void string_token(std::string_view raw) {
    if (at == At::key) {
      std::optional<std::string> k;
      if (raw.find('\\') == std::string_view::npos) k = std::string(raw);
      else k = strict_string(raw, kMaxRawKey);
      field = !k ? Field::none : *k == "reply_to" ? Field::reply_to : *k == "id" ? Field::id : Field::none;
      at = At::colon;
    } else if (at == At::value) {
      auto s = strict_string(raw, field == Field::id ? kMaxRawId : kMaxRawReplyTo);
      take(s ? std::optional<json::value>(json::string(*s)) : std::nullopt);
    } else {
      skip();
    }
  }

  // A ':' or ',' of the top-level object.
  void separator(char c) {
    const bool to_value = c == ':' && at == At::colon;
    field = to_value ? field : Field::none;
    at = to_value ? At::value : c == ',' ? At::key : At::after;
  }

  // A scalar token (number, literal) or garbage of the top-level object.
  void scalar_token(std::string_view tok) {
    if (at != At::value) return skip();
    std::optional<json::value> v;
    if (field == Field::id && tok.size() <= 32) {
      try {
        v = parse_document(tok, "id");
      } catch (const ProtocolError&) {
      }
    }
    take(std::move(v));
  }

  std::optional<ReplyRoute> route() const {
    if (reply_to.bad || !reply_to.value) return std::nullopt;
    ReplyRoute r;
    r.reply_to = get_bounded_text(*reply_to.value, "reply_to", kMaxReplyToBytes);
    if (!id.bad && id.value) {
      try {
        r.id = get_id(*id.value, r.id_is_number);
      } catch (const ProtocolError&) {
        r.id.reset();
        r.id_is_number = false;
      }
    }
    return r;
  }
};

// Lenient scan of a document's top-level object; nullopt when it names no
// usable reply_to. Never throws.
inline std::optional<ReplyRoute> scan_reply_route(std::string_view text) noexcept try {
  text = text.substr(0, kMaxPeekBytes);
  const std::size_t n = text.size();
  auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  std::size_t i = 0;
  while (i < n && ws(text[i])) ++i;
  if (i == n || text[i] != '{') return std::nullopt;
  ++i;
  RouteScan scan;
  std::size_t depth = 1;
  while (i < n && depth > 0) {
    const char c = text[i];
    if (c == '"') {
      const std::size_t start = ++i;
      while (i < n && text[i] != '"') i += text[i] == '\\' ? 2 : 1;
      if (i >= n) break;  // cut short inside a string
      const std::string_view raw = text.substr(start, i - start);
      ++i;
      if (depth == 1) scan.string_token(raw);
      continue;
    }
    if (ws(c)) {
      ++i;
      continue;
    }
    if (c == '{' || c == '[' || c == '}' || c == ']' || c == ':' || c == ',') {
      ++i;
      // A field whose value is a container, or missing: not usable.
      if (depth == 1 && scan.at == RouteScan::At::value) scan.take(std::nullopt);
      if (c == '{' || c == '[') {
        ++depth;
      } else if (c == '}' || c == ']') {
        --depth;
      } else if (depth == 1) {
        scan.separator(c);
      }
      continue;
    }
    // A scalar token (number, literal) or garbage, up to the next delimiter.
    const std::size_t start = i;
    while (i < n && !ws(text[i]) && text[i] != '"' && text[i] != ',' && text[i] != ':' && text[i] != '{' &&
           text[i] != '}' && text[i] != '[' && text[i] != ']')
      ++i;
    if (depth == 1) scan.scalar_token(text.substr(start, i - start));
  }
  return scan.route();
} catch (...) {
  return std::nullopt;
}

}  // namespace detail
}  MEMCUDA_NAMESPACE_END  // namespace memcuda::protocol
