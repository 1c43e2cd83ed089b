// The buffers this registry shared without a copy (TensorRegistry::share),
// by generation: each entry is the ExportedBlock that stands for the
// owner's buffer and carries its keep-alive. An entry goes when the last
// reference of its record goes (the free the release route brings here:
// the owner's own release gets `free` back; anyone else's release pushes a
// free command the allocator of record forwards to this session's inbox),
// or with the registry. The block itself goes with the last local handle.
#pragma once

#include "memcuda/config.hpp"

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "memcuda/detail/backend/borrow.hpp"
#include "memcuda/detail/backend/process_cache.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class Borrowed {
 public:
  std::uint64_t next_alloc_id() noexcept { return kBorrowedAllocIdBase + next_++; }

  void add(std::uint64_t generation, std::shared_ptr<ExportedBlock> b) {
    std::lock_guard lk(mu_);
    table_[generation] = std::move(b);
  }
  // Drops the registry's keep-alive of that generation; false when it is
  // not a buffer this registry shared. The block is released outside the lock.
  bool drop(std::uint64_t generation) {
    std::shared_ptr<ExportedBlock> gone;
    {
      std::lock_guard lk(mu_);
      auto it = table_.find(generation);
      if (it == table_.end()) return false;
      gone = std::move(it->second);
      table_.erase(it);
    }
    return true;
  }
  std::size_t size() const {
    std::lock_guard lk(mu_);
    return table_.size();
  }

 private:
  mutable std::mutex mu_;  // leaf: the table only
  std::map<std::uint64_t, std::shared_ptr<ExportedBlock>> table_;
  std::atomic<std::uint64_t> next_{1};
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
