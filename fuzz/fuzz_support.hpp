// What the fuzz targets share: a check that aborts (so that libFuzzer records
// the input as a crash, with the stack), the report for an exception a
// decoder must not let through, and the list of known issues.
//
// A check that fails prints "memcuda fuzz: <file>:<line>: <what>" and the
// details, then aborts. ASan/UBSan findings abort on their own
// (-fno-sanitize-recover=all).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "memcuda/error.hpp"
#include "memcuda/shape.hpp"

namespace memcuda_fuzz {

// Untrusted bytes for a report: printable ASCII as is, the rest as \xNN.
inline std::string shown(std::string_view s) { return memcuda::detail::rules::printable(s, 512); }

[[noreturn]] inline void fail(const char* file, int line, std::string_view what,
                              std::string_view detail = {}) {
  std::fprintf(stderr, "\nmemcuda fuzz: %s:%d: %.*s\n", file, line, static_cast<int>(what.size()),
               what.data());
  if (!detail.empty())
    std::fprintf(stderr, "  %.*s\n", static_cast<int>(detail.size()), detail.data());
  std::abort();
}

// Call from a catch (...) block: names the exception that escaped `call`.
[[noreturn]] inline void unexpected_exception(const char* file, int line, std::string_view call) {
  std::string what = std::string(call) + " threw an exception it must not throw";
  try {
    throw;
  } catch (const std::exception& e) {
    fail(file, line, what, std::string("std::exception: ") + e.what());
  } catch (...) {
    fail(file, line, what, "not a std::exception");
  }
}

inline std::string_view as_text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// ---- known issues ----------------------------------------------------------
// Findings reported but not fixed yet in include/ (docs/fuzzing.md, "Known
// issues"). The targets step around exactly these inputs, and nothing more,
// so that the fuzz tests keep looking for new problems instead of stopping at
// the same one. MEMCUDA_FUZZ_STRICT=1 steps around nothing; the fuzz_known_*
// tests run each committed reproducer that way to see that the issue is still
// there. Whoever fixes one deletes its predicate here and its test.

inline bool strict() {
  static const bool on = [] {
    const char* s = std::getenv("MEMCUDA_FUZZ_STRICT");
    return s != nullptr && *s != '\0' && std::string_view(s) != "0";
  }();
  return on;
}

// None open: the four found on 2026-11-21 (strides-overflow,
// url-scheme-echo, url-user-echo, record-alloc-bytes-absent) are fixed, and
// their reproducers stay in the corpora as fixed-* seeds, replayed strictly.

// ---- shared checks ---------------------------------------------------------

// What TensorInfo::strides() does with the shape of an accepted command or
// record: ProtocolError(size_overflow) is allowed only when a dimension is 0
// (without one, byte_size has bounded the product already).
inline void check_strides(std::span<const std::int64_t> shape, const char* file, int line) {
  try {
    memcuda::Shape strides = memcuda::contiguous_strides(shape);
    if (strides.size() != shape.size()) fail(file, line, "contiguous_strides: wrong rank");
  } catch (const memcuda::ProtocolError& e) {
    bool has_zero = false;
    for (std::int64_t d : shape) has_zero = has_zero || d == 0;
    if (e.errc() != memcuda::ProtocolErrc::size_overflow || !has_zero)
      fail(file, line, "contiguous_strides of an accepted shape threw", e.what());
  } catch (...) {
    unexpected_exception(file, line, "contiguous_strides");
  }
}

// ---- the decode / re-encode pattern every target follows -------------------

// Decodes untrusted text. A ProtocolError is the decoder refusing it, which
// is fine (it must say why: its message is not empty): nullopt. Any other
// exception escaping `decode` aborts, naming `call`.
template <class Decode>
auto decode_or_refuse(Decode&& decode, std::string_view text, const char* call, const char* file, int line)
    -> std::optional<decltype(decode(text))> {
  try {
    return decode(text);
  } catch (const memcuda::ProtocolError& e) {
    if (*e.what() == '\0') fail(file, line, "empty ProtocolError message", call);
    return std::nullopt;
  } catch (...) {
    unexpected_exception(file, line, call);
  }
}

// What a decoded value must survive: `encode` accepts it, `decode` gives
// back an equal value, and encoding that again gives the same text (a
// fixed point). Returns the encoded text.
template <class T, class Encode, class Decode>
std::string check_round_trip(const T& value, Encode&& encode, Decode&& decode, const char* enc, const char* dec,
                             const char* file, int line) {
  std::string encoded;
  try {
    encoded = encode(value);
  } catch (...) {
    unexpected_exception(file, line, std::string(enc) + " of a decoded value");
  }
  std::optional<T> back;
  try {
    back.emplace(decode(std::string_view(encoded)));
  } catch (...) {
    unexpected_exception(file, line, std::string(dec) + " of " + enc + "'s output");
  }
  if (!(*back == value)) fail(file, line, "round trip changed the value", "encoded: " + shown(encoded));
  std::string again;
  try {
    again = encode(*back);
  } catch (...) {
    unexpected_exception(file, line, std::string(enc) + " of a round-tripped value");
  }
  if (again != encoded) fail(file, line, "encoding is not a fixed point", shown(encoded) + " / " + shown(again));
  return encoded;
}

}  // namespace memcuda_fuzz

// `auto v = MEMCUDA_FUZZ_DECODE(p::decode_reply, text); if (!v) return;`
#define MEMCUDA_FUZZ_DECODE(decode, text)                                                                   \
  ::memcuda_fuzz::decode_or_refuse([](std::string_view t_) { return decode(t_); }, text, #decode, __FILE__, \
                                   __LINE__)

// MEMCUDA_FUZZ_ROUND_TRIP(*v, p::encode_reply, p::decode_reply): see check_round_trip.
#define MEMCUDA_FUZZ_ROUND_TRIP(value, encode, decode)                                                          \
  ::memcuda_fuzz::check_round_trip(                                                                            \
      value, [](const auto& v_) { return encode(v_); }, [](std::string_view t_) { return decode(t_); }, #encode, \
      #decode, __FILE__, __LINE__)

#define MEMCUDA_FUZZ_CHECK(cond, ...)                                            \
  do {                                                                           \
    if (!(cond)) ::memcuda_fuzz::fail(__FILE__, __LINE__, #cond, ##__VA_ARGS__); \
  } while (0)

#define MEMCUDA_FUZZ_UNEXPECTED(call) ::memcuda_fuzz::unexpected_exception(__FILE__, __LINE__, call)

#define MEMCUDA_FUZZ_CHECK_STRIDES(shape) ::memcuda_fuzz::check_strides(shape, __FILE__, __LINE__)
