// The references this process holds, (name, generation) -> count, kept so
// they can be registered again after Redis lost its data (recovery.hpp).
#pragma once

#include "memcuda/config.hpp"

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class Holds {
 public:
  using Key = std::pair<std::string, std::uint64_t>;

  void note(const std::string& name, std::uint64_t gen, int delta) noexcept {
    try {
      std::lock_guard lk(mu_);
      auto& n = held_[{name, gen}];
      n += delta;
      if (n <= 0) held_.erase({name, gen});
    } catch (...) {
    }
  }

  std::vector<std::pair<Key, std::int64_t>> snapshot() const {
    std::lock_guard lk(mu_);
    return {held_.begin(), held_.end()};
  }

 private:
  mutable std::mutex mu_;  // leaf
  std::map<Key, std::int64_t> held_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
