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

}  // namespace memcuda_fuzz

#define MEMCUDA_FUZZ_CHECK(cond, ...)                                            \
  do {                                                                           \
    if (!(cond)) ::memcuda_fuzz::fail(__FILE__, __LINE__, #cond, ##__VA_ARGS__); \
  } while (0)

#define MEMCUDA_FUZZ_UNEXPECTED(call) ::memcuda_fuzz::unexpected_exception(__FILE__, __LINE__, call)

#define MEMCUDA_FUZZ_CHECK_STRIDES(shape) ::memcuda_fuzz::check_strides(shape, __FILE__, __LINE__)
