// Checked arithmetic for lengths, offsets and counts that come from outside
// (an Arrow producer's array, a DLPack tensor, a wire header, a caller's
// batch): an overflow is bad input, InvalidArgument naming `what`, never a
// wrapped value that silently points at other memory.
#pragma once

#include "memcuda/config.hpp"

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

#include "memcuda/error.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

template <class T>
[[noreturn]] void checked_fail(std::string_view what, T a, char op, T b) {
  throw InvalidArgument(std::string(what) + ": " + std::to_string(a) + ' ' + op + ' ' + std::to_string(b) +
                        " overflows " + (std::is_signed_v<T> ? "int" : "uint") +
                        std::to_string(std::numeric_limits<T>::digits + std::is_signed_v<T>));
}

template <class T>
T checked_mul(T a, T b, std::string_view what) {
  T r;
  if (__builtin_mul_overflow(a, b, &r)) checked_fail(what, a, '*', b);
  return r;
}

template <class T>
T checked_add(T a, T b, std::string_view what) {
  T r;
  if (__builtin_add_overflow(a, b, &r)) checked_fail(what, a, '+', b);
  return r;
}

// `p` advanced by `bytes`; InvalidArgument where the address would wrap.
inline const char* checked_advance(const void* p, std::uint64_t bytes, std::string_view what) {
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  if (bytes > std::numeric_limits<std::uintptr_t>::max() - at)
    throw InvalidArgument(std::string(what) + ": " + std::to_string(bytes) + " bytes past the buffer's address " +
                          "leave the address space");
  return static_cast<const char*>(p) + bytes;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
