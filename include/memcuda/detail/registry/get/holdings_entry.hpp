// One name's row of a registry's holdings table (holdings.hpp): the
// references held in Redis by generation, the record last read, and the
// shared handle. Plain data; the table's mutex guards it.
#pragma once

#include "memcuda/config.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "memcuda/dtype.hpp"
#include "memcuda/tensor_info.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class TensorHandle;  // shared_tensor.hpp

// The handle a get of the name shares.
struct HoldingsShare {
  std::weak_ptr<TensorHandle> handle;  // the copies handed out (a wrapper's, when lingering is on)
  std::uint64_t gen = 0;
  DType dtype{};
  std::shared_ptr<TensorHandle> lingering;  // the real handle, between its last copy and `until`
  std::chrono::steady_clock::time_point until{};
};

struct HoldingsEntry {
  std::optional<HoldingsShare> share;
  std::shared_ptr<const TensorInfo> record;
  std::vector<std::pair<std::uint64_t, std::int64_t>> refs;  // (generation, count): usually one

  bool empty() const noexcept { return !share && !record && refs.empty(); }

  // A reference to generation `gen` taken (+1) or given back (-1).
  void add_ref(std::uint64_t gen, int delta) {
    auto r = std::find_if(refs.begin(), refs.end(), [&](const auto& p) { return p.first == gen; });
    if (r == refs.end()) {
      if (delta <= 0) return;
      refs.emplace_back(gen, 0);
      r = std::prev(refs.end());
    }
    r->second += delta;
    if (r->second <= 0) refs.erase(r);
  }
};

// Transparent lookups by string_view (no allocation on the hit path).
struct NameHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
