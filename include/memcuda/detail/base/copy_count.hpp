// Copies made in place of zero copy, where a caller opted in (Python's
// allow_copy=True; the C ABI's memcuda_note_copy). Process-wide: stats()
// reports them (ProcessStats::copies / copied_bytes), and each (call site,
// tensor) pair logs one warning, so a copy is never silent and a loop that
// copies does not flood the log.
#pragma once

#include "memcuda/config.hpp"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_set>

#include "memcuda/detail/base/log.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class CopyCount {
 public:
  // One copy of `bytes` of tensor `name` at `site` (what made it, e.g.
  // "Tensor.numpy(allow_copy=True)"), `why` zero copy could not be had.
  void note(std::string_view site, std::string_view name, std::uint64_t bytes, std::string_view why) noexcept {
    copies_.fetch_add(1, std::memory_order_relaxed);
    bytes_.fetch_add(bytes, std::memory_order_relaxed);
    bool first = false;
    try {
      std::lock_guard lk(m_);
      // Bounded: past the cap every copy is still counted, only not logged.
      if (warned_.size() < kMaxWarned) first = warned_.insert(std::string(site) + '\n' + std::string(name)).second;
    } catch (...) {
    }
    if (!first) return;
    try {
      log(LogLevel::warn, "copied " + std::to_string(bytes) + " bytes of tensor '" + std::string(name) + "' (" +
                              std::string(site) + "): " + std::string(why) +
                              "; counted in stats copies/copied_bytes, logged once per call site and tensor");
    } catch (...) {
    }
  }

  std::uint64_t copies() const noexcept { return copies_.load(std::memory_order_relaxed); }
  std::uint64_t bytes() const noexcept { return bytes_.load(std::memory_order_relaxed); }

 private:
  static constexpr std::size_t kMaxWarned = 4096;
  std::atomic<std::uint64_t> copies_{0};
  std::atomic<std::uint64_t> bytes_{0};
  std::mutex m_;
  std::unordered_set<std::string> warned_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
