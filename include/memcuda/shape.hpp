// Shapes, sizes and tensor names: the limits every tensor in the registry
// obeys, checked in one place so that the client API, the lifecycle command
// decoder and the record decoder agree (docs/protocol.md, "Shape rules" and
// "Name rules").
//
// Everything here throws ProtocolError (an InvalidArgument) with the specific
// ProtocolErrc; nothing here touches a device or Redis.
#pragma once

#include "memcuda/config.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/dtype.hpp"
#include "memcuda/error.hpp"

MEMCUDA_NAMESPACE_BEGIN

// Most dimensions a tensor may have.
inline constexpr std::size_t kMaxRank = 8;
// Largest single dimension (2^40): keeps products of a few dims far from
// int64 overflow and rejects nonsense early.
inline constexpr std::int64_t kMaxDim = std::int64_t{1} << 40;
// Largest tensor, in bytes (64 TiB).
inline constexpr std::uint64_t kMaxTensorBytes = std::uint64_t{1} << 46;
// Longest tensor name, in bytes.
inline constexpr std::size_t kMaxNameBytes = 255;

// Dimensions, outermost first. Rank 0 (empty) is a scalar of one element.
using Shape = std::vector<std::int64_t>;

// Nested so that code in memcuda::detail calling validate_name(name) etc.
// unqualified still finds the public functions below.
namespace detail::rules {

// Renders untrusted bytes for an error message: printable ASCII as is,
// everything else as \xNN, cut after `max` input bytes.
inline std::string printable(std::string_view s, std::size_t max = 64) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  std::size_t n = s.size() < max ? s.size() : max;
  out.reserve(n + 8);
  for (std::size_t i = 0; i < n; ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '"') {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    }
  }
  if (n < s.size()) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out;
}

// `where` prefixes the messages: "shape" or `field "shape"`.
inline void validate_rank(std::size_t rank, std::string_view where) {
  if (rank > kMaxRank)
    throw ProtocolError(ProtocolErrc::bad_shape,
                        std::string(where) + ": rank " + std::to_string(rank) +
                            " exceeds the maximum of " + std::to_string(kMaxRank));
}

inline void validate_dim(std::int64_t d, std::size_t i, std::string_view where) {
  if (d < 0)
    throw ProtocolError(ProtocolErrc::bad_dim, std::string(where) + "[" + std::to_string(i) +
                                                   "]: dimension " + std::to_string(d) +
                                                   " is negative");
  if (d > kMaxDim)
    throw ProtocolError(ProtocolErrc::bad_dim, std::string(where) + "[" + std::to_string(i) +
                                                   "]: dimension " + std::to_string(d) +
                                                   " exceeds the maximum of 2^40 (" +
                                                   std::to_string(kMaxDim) + ")");
}

inline void validate_shape(std::span<const std::int64_t> shape, std::string_view where) {
  validate_rank(shape.size(), where);
  for (std::size_t i = 0; i < shape.size(); ++i) validate_dim(shape[i], i, where);
}

inline std::string shape_text(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);
  }
  s += ']';
  return s;
}

// Product of already validated dims; size_overflow past 2^64 - 1.
inline std::uint64_t checked_product(std::span<const std::int64_t> shape) {
  std::uint64_t n = 1;
  for (std::int64_t d : shape)
    if (d == 0) return 0;
  for (std::int64_t d : shape) {
    auto u = static_cast<std::uint64_t>(d);
    if (n > std::numeric_limits<std::uint64_t>::max() / u)
      throw ProtocolError(ProtocolErrc::size_overflow,
                          "shape " + shape_text(shape) + ": element count overflows 64 bits");
    n *= u;
  }
  return n;
}

// A JSON value that must be a shape: an array of at most kMaxRank integers in
// [0, kMaxDim]. Wrong JSON types (float, string, bool, null...) are
// wrong_type. A NaN double is how the protocol parser marks an integer
// literal that does not fit 64 bits (JSON text cannot spell NaN): bad_dim.
// A template over the JSON value type (boost::json::value in protocol/) so
// that this header need not include Boost.JSON: what the umbrella header
// pulls in stays cheap to compile (docs/design.md, "Compile cost"). The
// kind's name comes from boost::json::to_string, found by argument-dependent
// lookup.
template <class JsonValue>
Shape shape_from_json(const JsonValue& v, std::string_view where) {
  const auto* a = v.if_array();
  if (!a)
    throw ProtocolError(ProtocolErrc::wrong_type,
                        std::string(where) + ": expected an array of integers");
  validate_rank(a->size(), where);
  Shape shape;
  shape.reserve(a->size());
  for (std::size_t i = 0; i < a->size(); ++i) {
    const JsonValue& e = (*a)[i];
    std::string at = std::string(where) + "[" + std::to_string(i) + "]";
    if (e.is_int64()) {
      validate_dim(e.get_int64(), i, where);
      shape.push_back(e.get_int64());
    } else if (e.is_uint64()) {  // only values above INT64_MAX land here
      throw ProtocolError(ProtocolErrc::bad_dim,
                          at + ": dimension " + std::to_string(e.get_uint64()) +
                              " exceeds the maximum of 2^40 (" + std::to_string(kMaxDim) + ")");
    } else if (e.is_double() && std::isnan(e.get_double())) {
      throw ProtocolError(ProtocolErrc::bad_dim,
                          at + ": dimension does not fit in 64 bits (maximum 2^40)");
    } else if (e.is_double()) {
      throw ProtocolError(ProtocolErrc::wrong_type,
                          at + ": expected an integer dimension, got a number with a fraction "
                               "or exponent");
    } else {
      throw ProtocolError(ProtocolErrc::wrong_type,
                          at + ": expected an integer dimension, got " + std::string(to_string(e.kind())));
    }
  }
  return shape;
}

inline bool name_byte_ok(unsigned char c) noexcept {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == ':' || c == '/' || c == '-';
}

inline void validate_name(std::string_view name, std::string_view where) {
  if (name.empty())
    throw ProtocolError(ProtocolErrc::bad_name, std::string(where) +
                                                    ": tensor name is empty; use 1.." +
                                                    std::to_string(kMaxNameBytes) + " bytes");
  if (name.size() > kMaxNameBytes)
    throw ProtocolError(ProtocolErrc::bad_name,
                        std::string(where) + ": tensor name \"" + printable(name) + "\" is " +
                            std::to_string(name.size()) + " bytes long; the maximum is " +
                            std::to_string(kMaxNameBytes));
  for (std::size_t i = 0; i < name.size(); ++i) {
    auto c = static_cast<unsigned char>(name[i]);
    if (!name_byte_ok(c)) {
      static constexpr char kHex[] = "0123456789abcdef";
      std::string byte = "0x";
      byte.push_back(kHex[c >> 4]);
      byte.push_back(kHex[c & 0xf]);
      throw ProtocolError(ProtocolErrc::bad_name,
                          std::string(where) + ": tensor name \"" + printable(name) + "\": byte " +
                              byte + " at offset " + std::to_string(i) +
                              " is not allowed; names use only A-Z a-z 0-9 . _ : / -");
    }
  }
}

}  // namespace detail::rules

// Throws ProtocolError: bad_shape when the rank exceeds kMaxRank, bad_dim for
// a dimension < 0 or > kMaxDim. Rank 0 and zero dimensions are valid.
inline void validate_shape(std::span<const std::int64_t> shape) {
  detail::rules::validate_shape(shape, "shape");
}

// Number of elements (1 for rank 0, 0 when any dim is 0). Validates the shape
// first; size_overflow when the product does not fit 64 bits.
inline std::uint64_t element_count(std::span<const std::int64_t> shape) {
  detail::rules::validate_shape(shape, "shape");
  return detail::rules::checked_product(shape);
}

// itemsize(dtype) * element_count(shape). Validates the shape; size_overflow
// when the result exceeds kMaxTensorBytes (or 64 bits); bad_value for a DType
// outside the enum.
inline Shape contiguous_strides(std::span<const std::int64_t> shape);

inline std::uint64_t byte_size(DType dtype, std::span<const std::int64_t> shape) {
  std::uint64_t n = element_count(shape);
  // An empty tensor's strides treat zero dims as 1 and may not fit int64
  // ([2,0,2^40,2^40]): refuse it here rather than when strides are asked for.
  if (n == 0) (void)contiguous_strides(shape);
  std::uint64_t item = itemsize(dtype);
  if (item == 0)
    throw ProtocolError(
        ProtocolErrc::bad_value,
        "dtype value " + std::to_string(static_cast<int>(dtype)) + " is not a DType");
  if (n > kMaxTensorBytes / item)
    throw ProtocolError(ProtocolErrc::size_overflow,
                        "shape " + detail::rules::shape_text(shape) + " of " +
                            std::string(to_string(dtype)) + " needs more than the maximum of " +
                            std::to_string(kMaxTensorBytes) + " bytes (64 TiB)");
  return n * item;
}

// Row-major (C order) strides in elements: the last dim has stride 1. A zero
// dim counts as 1 for the strides of the dims before it (NumPy and PyTorch do
// the same), so strides never collapse to 0. Validates; size_overflow when a
// stride does not fit int64.
inline Shape contiguous_strides(std::span<const std::int64_t> shape) {
  detail::rules::validate_shape(shape, "shape");
  Shape strides(shape.size());
  std::int64_t s = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    if (i == 0) break;  // the outermost dimension scales no stride
    std::int64_t d = shape[i] > 0 ? shape[i] : 1;
    if (s > std::numeric_limits<std::int64_t>::max() / d)
      throw ProtocolError(ProtocolErrc::size_overflow,
                          "shape " + detail::rules::shape_text(shape) + ": strides overflow int64");
    s *= d;
  }
  return strides;
}

// "[2,3,4]", "[]" for rank 0; no spaces. Does not validate.
inline std::string shape_to_string(std::span<const std::int64_t> shape) {
  return detail::rules::shape_text(shape);
}

// Parses a JSON array of integers (what shape_to_string writes; JSON
// whitespace is tolerated) and validates it. ProtocolError: bad_json or
// trailing_garbage for text that is not exactly one JSON document, wrong_type
// for anything but an array of integers, and validate_shape's errors.
// Defined in the implementation unit (memcuda/impl/shape.ipp, see
// memcuda/implementation.hpp): it needs Boost.JSON's parser.
Shape shape_from_string(std::string_view text);

// Throws ProtocolError(bad_name) unless `name` is 1..kMaxNameBytes bytes of
// [A-Za-z0-9._:/-]; the message gives the offending byte and its offset.
inline void validate_name(std::string_view name) { detail::rules::validate_name(name, "name"); }

inline bool is_valid_name(std::string_view name) noexcept {
  if (name.empty() || name.size() > kMaxNameBytes) return false;
  for (char c : name)
    if (!detail::rules::name_byte_ok(static_cast<unsigned char>(c))) return false;
  return true;
}

MEMCUDA_NAMESPACE_END  // namespace memcuda
