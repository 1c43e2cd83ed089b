// What every wire codec shares and that needs no JSON: the size limits of
// docs/protocol.md, the one way decoders fail (ProtocolError with a specific
// ProtocolErrc), and the text helpers used both by the JSON codecs and by the
// tensor Hash codec (decimal integers, UTF-8 repair).
//
// Kept free of Boost.JSON so that protocol/record.hpp, which reads Hash fields
// rather than JSON, does not need it.
#pragma once

#include "memcuda/config.hpp"

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include "memcuda/error.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace protocol {

// Largest command, reply or other JSON document (inbox message, session
// value, pool statistics), in bytes; longer input is rejected (too_large)
// before any parsing.
inline constexpr std::size_t kMaxCommandBytes = 64 * 1024;
// Largest reply: a create_many reply lists every tensor of a command of up
// to kMaxCommandBytes with its generation and refcount, so it may be larger.
inline constexpr std::size_t kMaxReplyBytes = 256 * 1024;
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
// A replicate names at most this many devices, makes at most kMaxReplicas
// replicas (its reply lists each: it must fit kMaxReplyBytes), and keeps an
// unused replica at most kMaxIdleMs (30 days).
inline constexpr std::size_t kMaxReplicaDevices = 64;
inline constexpr std::size_t kMaxReplicas = 1024;
inline constexpr std::int64_t kMaxIdleMs = 30LL * 24 * 3600 * 1000;
// Longest CUDA API name an error reply carries (make_error_reply cuts).
inline constexpr std::size_t kMaxCudaApiBytes = 128;
// make_error_reply cuts longer messages so that a reply always fits.
inline constexpr std::size_t kMaxErrorMessageBytes = 4096;

namespace detail {

[[noreturn]] inline void fail(ProtocolErrc e, std::string msg) { throw ProtocolError(e, msg); }

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

// Decimal text of a uint64 exactly as std::to_string writes it.
inline std::optional<std::uint64_t> canonical_uint(std::string_view s) noexcept {
  std::uint64_t u = 0;
  if (s.empty() || s.size() > 20 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), u);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return u;
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

}  // namespace detail
}  MEMCUDA_NAMESPACE_END  // namespace memcuda::protocol
