// A SharedTensor's view of its tensor (memcuda/slice.hpp makes them): shape,
// element strides and byte offset, and the rows one 2D copy of it moves.
#pragma once

#include "memcuda/config.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

#include "memcuda/error.hpp"
#include "memcuda/shape.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// A SharedTensor's window on its tensor: element strides, byte offset from the start.
struct View {
  Shape shape;
  Shape strides;
  std::uint64_t offset = 0;
};

// Whether a view's elements are dense in row-major order.
inline bool dense(const View& v) {
  std::int64_t want = 1;
  for (std::size_t i = v.shape.size(); i-- > 0;) {
    if (v.shape[i] == 0) return true;
    if (v.shape[i] == 1) continue;
    if (v.strides[i] != want) return false;
    want *= v.shape[i];
  }
  return true;
}

// A view as `height` rows of `width` bytes, `pitch` bytes apart: what one
// cudaMemcpy2D (or a memcpy per row) copies. InvalidArgument for a view that
// is not one such copy (sliced in 2+ dimensions that do not merge).
struct Rows {
  std::uint64_t width = 0, pitch = 0, height = 0;
};

inline Rows rows_of(const std::string& name, const View& v, std::size_t itemsize) {
  // Dimensions of one element drop out; a dimension whose stride steps over
  // the whole next one merges with it.
  std::int64_t n[kMaxRank + 1], st[kMaxRank + 1];
  std::size_t k = 0;
  for (std::size_t i = 0; i < v.shape.size(); ++i) {
    if (v.shape[i] == 0) return {};
    if (v.shape[i] == 1) continue;
    if (k > 0 && st[k - 1] == v.strides[i] * v.shape[i]) {
      n[k - 1] *= v.shape[i];
      st[k - 1] = v.strides[i];
      continue;
    }
    n[k] = v.shape[i];
    st[k++] = v.strides[i];
  }
  const auto is = static_cast<std::uint64_t>(itemsize);
  if (k == 0) return {is, is, 1};
  if (st[k - 1] != 1) {  // the innermost dimension narrowed to one element: rows of one element
    n[k] = 1;
    st[k++] = 1;
  }
  if (k <= 2) {
    const std::uint64_t width = static_cast<std::uint64_t>(n[k - 1]) * is;
    if (k == 1) return {width, width, 1};
    return {width, static_cast<std::uint64_t>(st[0]) * is, static_cast<std::uint64_t>(n[0])};
  }
  throw InvalidArgument("view of '" + name + "' (shape " + shape_to_string(v.shape) + ", strides " +
                        shape_to_string(v.strides) + ") is sliced in 2 or more dimensions: not one 2D copy");
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
