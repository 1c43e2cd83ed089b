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

// "strides-overflow": contiguous_strides multiplies the running stride by the
// first dimension without the check the other dimensions get (shape.hpp),
// signed overflow (UB) whenever the product of all dimensions, a 0 counting
// as 1, exceeds INT64_MAX. Such a shape can be a valid tensor:
// [2,0,1099511627776,4194304] has 0 elements and 0 bytes.
inline bool known_strides_overflow(std::span<const std::int64_t> shape) {
  if (strict()) return false;
  std::int64_t s = 1;
  for (std::int64_t d : shape)
    if (__builtin_mul_overflow(s, d > 0 ? d : 1, &s)) return true;
  return false;
}

// "url-scheme-echo": for an unknown scheme parse_url's message quotes the
// scheme, the bytes before "://", unescaped (options.hpp), and it does so
// before it rejects control bytes: "\n://x" gives a message with a raw
// newline. (The rest of the URL is shown through redact_url, which escapes.)
inline bool known_url_scheme_echo(std::string_view url, std::string_view message) {
  if (strict()) return false;
  std::size_t sep = url.find("://");
  if (sep == std::string_view::npos || message.find("unknown scheme '") == std::string_view::npos)
    return false;
  for (char c : url.substr(0, sep))
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return true;
  return false;
}

// "url-user-echo": parse_userinfo's "user '<user>' given without a password"
// quotes the %-decoded user name unescaped, so "redis://%0a:@host" puts a raw
// newline (any byte, %1b for a terminal escape) into the message, and a %00
// cuts what() short there.
inline bool known_url_user_echo(std::string_view message) {
  return !strict() && message.find("': user '") != std::string_view::npos;
}

// "record-alloc-bytes-absent": decode_record accepts a record that is not
// pending and has no alloc_bytes field (TensorInfo's default 0, and the
// offset + bytes <= alloc_bytes check skipped), but encode_record always
// writes alloc_bytes, so unless offset and bytes are 0 the Hash it writes for
// that TensorInfo is one decode_record rejects (protocol.hpp). `has_field`
// tells whether the decoded Hash had alloc_bytes.
inline bool known_record_alloc_bytes_absent(bool has_field, bool pending, std::uint64_t offset,
                                            std::uint64_t bytes) {
  return !strict() && !has_field && !pending && (offset > 0 || bytes > 0);
}

// ---- shared checks ---------------------------------------------------------

// What TensorInfo::strides() does with the shape of an accepted command or
// record: ProtocolError(size_overflow) is allowed only when a dimension is 0
// (without one, byte_size has bounded the product already).
inline void check_strides(std::span<const std::int64_t> shape, const char* file, int line) {
  if (known_strides_overflow(shape)) return;
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

}  // namespace memcuda_fuzz

#define MEMCUDA_FUZZ_CHECK(cond, ...)                                            \
  do {                                                                           \
    if (!(cond)) ::memcuda_fuzz::fail(__FILE__, __LINE__, #cond, ##__VA_ARGS__); \
  } while (0)

#define MEMCUDA_FUZZ_UNEXPECTED(call) ::memcuda_fuzz::unexpected_exception(__FILE__, __LINE__, call)

#define MEMCUDA_FUZZ_CHECK_STRIDES(shape) ::memcuda_fuzz::check_strides(shape, __FILE__, __LINE__)
