// The references this process holds to state-dict records (one per open of
// a linked dict, shared by that open's handles), kept so they can be
// registered again after this session's key expired (recovery.hpp) and
// released as one (state_dicts.hpp).
#pragma once

#include "memcuda/config.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// One reference to the record `id`, and the members it stands for.
struct DictRef {
  std::uint64_t id = 0;
  std::vector<std::pair<std::string, std::uint64_t>> members;  // name, generation
  // Set by recovery when the record was gone: the reference was registered
  // again as one per member, and is released that way.
  std::atomic<bool> per_name{false};
};

class DictHolds {
 public:
  void add(const std::shared_ptr<DictRef>& r) {
    std::lock_guard lk(mu_);
    std::erase_if(refs_, [](const std::weak_ptr<DictRef>& w) { return w.expired(); });
    refs_.push_back(r);
  }

  std::vector<std::shared_ptr<DictRef>> live() const {
    std::lock_guard lk(mu_);
    std::vector<std::shared_ptr<DictRef>> out;
    for (const auto& w : refs_)
      if (auto r = w.lock()) out.push_back(std::move(r));
    return out;
  }

 private:
  mutable std::mutex mu_;  // leaf
  std::vector<std::weak_ptr<DictRef>> refs_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
