// Sliced reads: a range of one dimension of a named tensor, as a view that
// shares the handle's reference (no Redis call, no copy). Records stay
// contiguous; a view is shape, element strides and a byte offset kept by the
// SharedTensor (docs/design.md, "Sliced reads").
//
//   auto w = reg.get_slice<float>("m/qkv", memcuda::SliceSpec::tp(0, rank, 4));   // rank's quarter of rows
//   auto cols = w.slice({.dim = 1, .start = 128, .length = 64});                    // composes
#pragma once

#include "memcuda/config.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

#include "memcuda/detail/base/checked.hpp"
#include "memcuda/detail/base/view.hpp"
#include "memcuda/error.hpp"
#include "memcuda/shape.hpp"

MEMCUDA_NAMESPACE_BEGIN

// Elements [start, start + length) of dimension `dim`.
struct SliceSpec {
  int dim = 0;
  std::int64_t start = 0;
  std::int64_t length = -1;  // -1: to the end of the dimension
  // Set by tp(): start and length follow from the dimension's size when sliced.
  bool by_rank = false;
  unsigned tp_rank = 0, tp_world = 0;

  // Tensor-parallel shard `rank` of `world` along `dim`: start rank*n/world,
  // length n/world. InvalidArgument where n is not divisible by world: uneven
  // splits are left to the caller (two plain slices).
  static SliceSpec tp(int dim, unsigned rank, unsigned world) {
    SliceSpec s;
    s.dim = dim;
    s.by_rank = true;
    s.tp_rank = rank;
    s.tp_world = world;
    return s;
  }
};

namespace detail {

// `base` narrowed by `s`; `name` and the messages name the tensor.
inline View slice_view(const std::string& name, const View& base, std::size_t itemsize, const SliceSpec& s) {
  const std::string of = "slice of '" + name + "' (shape " + shape_to_string(base.shape) + ")";
  if (base.shape.empty()) throw InvalidArgument(of + ": a rank-0 tensor has no dimension to slice");
  if (s.dim < 0 || static_cast<std::size_t>(s.dim) >= base.shape.size())
    throw InvalidArgument(of + ": dimension " + std::to_string(s.dim) + " is out of range for rank " +
                          std::to_string(base.shape.size()));
  const auto d = static_cast<std::size_t>(s.dim);
  const std::int64_t n = base.shape[d];
  std::int64_t start = s.start, length = s.length;
  if (s.by_rank) {
    if (s.tp_world == 0) throw InvalidArgument(of + ": world is 0");
    if (s.tp_rank >= s.tp_world)
      throw InvalidArgument(of + ": rank " + std::to_string(s.tp_rank) + " is not below world " +
                            std::to_string(s.tp_world));
    if (n % s.tp_world != 0)
      throw InvalidArgument("dimension " + std::to_string(d) + " of '" + name + "' is " + std::to_string(n) +
                            ", not divisible by world " + std::to_string(s.tp_world) + " (shape " +
                            shape_to_string(base.shape) + ")");
    length = n / s.tp_world;
    start = checked_mul<std::int64_t>(s.tp_rank, length, of);
  }
  if (start < 0 || start > n)
    throw InvalidArgument(of + ": start " + std::to_string(start) + " is outside dimension " + std::to_string(d) +
                          " (" + std::to_string(n) + " elements)");
  if (length == -1) length = n - start;
  if (length < 0 || checked_add(start, length, of) > n)
    throw InvalidArgument(of + ": start " + std::to_string(start) + " + length " + std::to_string(length) +
                          " does not fit dimension " + std::to_string(d) + " (" + std::to_string(n) + " elements)");
  View v = base;
  v.shape[d] = length;
  const auto step = checked_mul<std::uint64_t>(static_cast<std::uint64_t>(base.strides[d]), itemsize, of);
  v.offset = checked_add(base.offset, checked_mul<std::uint64_t>(static_cast<std::uint64_t>(start), step, of), of);
  return v;
}

}  // namespace detail

MEMCUDA_NAMESPACE_END  // namespace memcuda
