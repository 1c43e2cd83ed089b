// The buffers this registry shared without a copy (TensorRegistry::share),
// by generation: each entry is the ExportedBlock that stands for the
// owner's buffer and carries its keep-alive. An entry goes when the last
// reference of its record goes (the free the release route brings here:
// docs/design.md, "Borrowed tensors") or with the registry. The entry keeps
// the record as shared, so that the owner writes it back after Redis lost
// its data (Recovery), as it does its registry memory.
#pragma once

#include "memcuda/config.hpp"

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "memcuda/detail/backend/borrow.hpp"
#include "memcuda/detail/backend/process_cache.hpp"
#include "memcuda/tensor_info.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class Borrowed {
 public:
  std::uint64_t next_alloc_id() noexcept { return kBorrowedAllocIdBase + next_++; }

  void add(const TensorInfo& record, bool persistent, std::shared_ptr<ExportedBlock> b) {
    std::lock_guard lk(mu_);
    table_[record.generation] = Entry{std::move(b), record, persistent};
  }
  // Drops the registry's keep-alive of that generation; false when it is
  // not a buffer this registry shared. The block is released outside the lock.
  bool drop(std::uint64_t generation) {
    std::shared_ptr<ExportedBlock> gone;
    {
      std::lock_guard lk(mu_);
      auto it = table_.find(generation);
      if (it == table_.end()) return false;
      gone = std::move(it->second.block);
      table_.erase(it);
    }
    return true;
  }
  std::size_t size() const {
    std::lock_guard lk(mu_);
    return table_.size();
  }
  // The records of what this registry shares, and whether each was shared
  // persistent (Recovery's republish).
  std::vector<std::pair<TensorInfo, bool>> records() const {
    std::lock_guard lk(mu_);
    std::vector<std::pair<TensorInfo, bool>> v;
    for (const auto& [g, e] : table_) v.emplace_back(e.record, e.persistent);
    return v;
  }

 private:
  struct Entry {
    std::shared_ptr<ExportedBlock> block;
    TensorInfo record;
    bool persistent = false;
  };
  mutable std::mutex mu_;  // leaf: the table only
  std::map<std::uint64_t, Entry> table_;
  std::atomic<std::uint64_t> next_{1};
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
