// Element types of shared tensors.
//
// A DType is what the registry stores in a tensor's "dtype" field and what a
// SharedTensor<T> checks its T against when it opens a tensor: dtype_of<T>
// maps a C++ element type to its DType at compile time. The names and sizes
// are part of the wire protocol (docs/protocol.md): do not reorder or rename.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

#include "memcuda/config.hpp"

// The CUDA half types map to f16/bf16 when the toolkit headers are reachable.
// cuda_fp16.h and cuda_bf16.h compile with a plain host compiler, so this
// needs no nvcc; a build without the toolkit simply lacks the mapping.
#if MEMCUDA_HAS_CUDA() && defined(__has_include)
#if __has_include(<cuda_fp16.h>)
#include <cuda_fp16.h>
#define MEMCUDA_HAS_CUDA_FP16() 1
#endif
#if __has_include(<cuda_bf16.h>)
#include <cuda_bf16.h>
#define MEMCUDA_HAS_CUDA_BF16() 1
#endif
#endif
#if !defined(MEMCUDA_HAS_CUDA_FP16)
#define MEMCUDA_HAS_CUDA_FP16() 0
#endif
#if !defined(MEMCUDA_HAS_CUDA_BF16)
#define MEMCUDA_HAS_CUDA_BF16() 0
#endif

MEMCUDA_NAMESPACE_BEGIN

// The values are stable: they may be stored in binary form by consumers.
// clang-format off
enum class DType : std::uint8_t { bool_, u8, i8, i16, i32, i64, u16, u32, u64, f16, bf16, f32, f64 };
// clang-format on

// Every DType, in enum order (for tables and tests).
inline constexpr std::array<DType, 13> kAllDTypes = {
    DType::bool_, DType::u8,  DType::i8,  DType::i16,  DType::i32, DType::i64, DType::u16,
    DType::u32,   DType::u64, DType::f16, DType::bf16, DType::f32, DType::f64};

// Size in bytes of one element. An out-of-range enum value (only reachable by
// a cast) gives 0, which every size computation then rejects.
constexpr std::size_t itemsize(DType t) noexcept {
  switch (t) {
    case DType::bool_: return 1;
    case DType::u8: return 1;
    case DType::i8: return 1;
    case DType::i16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u16: return 2;
    case DType::u32: return 4;
    case DType::u64: return 8;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::f32: return 4;
    case DType::f64: return 8;
  }
  return 0;
}

// Canonical wire name ("bool", "u8", ..., "f64"); "" for an out-of-range value.
constexpr std::string_view to_string(DType t) noexcept {
  switch (t) {
    case DType::bool_: return "bool";
    case DType::u8: return "u8";
    case DType::i8: return "i8";
    case DType::i16: return "i16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u16: return "u16";
    case DType::u32: return "u32";
    case DType::u64: return "u64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f32: return "f32";
    case DType::f64: return "f64";
  }
  return "";
}

// Parses a canonical name, or one of the NumPy/PyTorch-style aliases
// float16 float32 float64 bfloat16 int8 int16 int32 int64 uint8 uint16 uint32
// uint64 (case-sensitive, no whitespace). nullopt for anything else. Writers
// (encode_command, encode_record) always use the canonical name.
inline std::optional<DType> dtype_from_string(std::string_view s) noexcept {
  for (DType t : kAllDTypes)
    if (s == to_string(t)) return t;
  struct Alias {
    std::string_view name;
    DType type;
  };
  static constexpr Alias kAliases[] = {
      {"float16", DType::f16},   {"float32", DType::f32}, {"float64", DType::f64},
      {"bfloat16", DType::bf16}, {"int8", DType::i8},     {"int16", DType::i16},
      {"int32", DType::i32},     {"int64", DType::i64},   {"uint8", DType::u8},
      {"uint16", DType::u16},    {"uint32", DType::u32},  {"uint64", DType::u64},
  };
  for (const Alias& a : kAliases)
    if (s == a.name) return a.type;
  return std::nullopt;
}

// IEEE 754 binary16 storage: the bits only, no arithmetic. Lets host code
// without the CUDA Toolkit name f16 tensors; layout-compatible with __half.
struct half {
  std::uint16_t bits;
};
// bfloat16 storage (the high 16 bits of an IEEE binary32); see half.
struct bfloat16 {
  std::uint16_t bits;
};
static_assert(sizeof(half) == 2 && std::is_trivially_copyable_v<half>);
static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16>);

namespace detail::dtypes {

// dtype_traits<T>::known is true exactly for element types; value is then
// the DType. Integers are listed by their fundamental types so that every
// std::intN_t alias (long or long long, depending on the platform) is covered.
template <class T>
struct dtype_traits {
  static constexpr bool known = false;
};

template <class T>
struct integer_dtype {
  static constexpr bool known = true;
  static constexpr DType value = std::is_signed_v<T> ? (sizeof(T) == 1   ? DType::i8
                                                        : sizeof(T) == 2 ? DType::i16
                                                        : sizeof(T) == 4 ? DType::i32
                                                                         : DType::i64)
                                                     : (sizeof(T) == 1   ? DType::u8
                                                        : sizeof(T) == 2 ? DType::u16
                                                        : sizeof(T) == 4 ? DType::u32
                                                                         : DType::u64);
  static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8);
};

template <DType D>
struct fixed_dtype {
  static constexpr bool known = true;
  static constexpr DType value = D;
};

// Plain char (signedness varies), wchar_t and the charN_t types are text, not
// numbers, and are deliberately absent.
template <>
struct dtype_traits<signed char> : integer_dtype<signed char> {};
template <>
struct dtype_traits<short> : integer_dtype<short> {};
template <>
struct dtype_traits<int> : integer_dtype<int> {};
template <>
struct dtype_traits<long> : integer_dtype<long> {};
template <>
struct dtype_traits<long long> : integer_dtype<long long> {};
template <>
struct dtype_traits<unsigned char> : integer_dtype<unsigned char> {};
template <>
struct dtype_traits<unsigned short> : integer_dtype<unsigned short> {};
template <>
struct dtype_traits<unsigned int> : integer_dtype<unsigned int> {};
template <>
struct dtype_traits<unsigned long> : integer_dtype<unsigned long> {};
template <>
struct dtype_traits<unsigned long long> : integer_dtype<unsigned long long> {};
template <>
struct dtype_traits<bool> : fixed_dtype<DType::bool_> {};
template <>
struct dtype_traits<float> : fixed_dtype<DType::f32> {};
template <>
struct dtype_traits<double> : fixed_dtype<DType::f64> {};
template <>
struct dtype_traits<memcuda::half> : fixed_dtype<DType::f16> {};
template <>
struct dtype_traits<memcuda::bfloat16> : fixed_dtype<DType::bf16> {};
#if MEMCUDA_HAS_CUDA_FP16()
template <>
struct dtype_traits<__half> : fixed_dtype<DType::f16> {};
#endif
#if MEMCUDA_HAS_CUDA_BF16()
template <>
struct dtype_traits<__nv_bfloat16> : fixed_dtype<DType::bf16> {};
#endif

static_assert(sizeof(float) == 4 && sizeof(double) == 8 && sizeof(bool) == 1,
              "mem-cuda needs 4-byte float, 8-byte double and 1-byte bool");

template <class T>
inline constexpr bool always_false = false;

template <class T>
constexpr DType dtype_of_impl() noexcept {
  if constexpr (dtype_traits<T>::known) {
    return dtype_traits<T>::value;
  } else {
    static_assert(always_false<T>,
                  "memcuda::dtype_of<T>: T is not a tensor element type. Use bool, "
                  "std::int8_t..std::int64_t, std::uint8_t..std::uint64_t, float, double, "
                  "memcuda::half, memcuda::bfloat16 (or __half/__nv_bfloat16 with CUDA)");
    return DType::u8;
  }
}

}  // namespace detail::dtypes

// True exactly for the C++ types that have a DType (cv-qualifiers ignored).
template <class T>
concept TensorElement = detail::dtypes::dtype_traits<std::remove_cv_t<T>>::known;

// The DType of element type T; cv-qualifiers are ignored. Any other T is a
// compile error that lists the supported types.
template <class T>
inline constexpr DType dtype_of = detail::dtypes::dtype_of_impl<std::remove_cv_t<T>>();

MEMCUDA_NAMESPACE_END  // namespace memcuda
