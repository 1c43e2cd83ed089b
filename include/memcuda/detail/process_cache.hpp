// The one piece of process-wide state: which exported allocations this
// process owns and which foreign ones it has mapped. Every registry of the
// process resolves tensors through it, because a process may not open its
// own CUDA IPC handle, and because mapping an allocation once per process
// (not once per tensor) is what makes a warm get cheap.
//
// Entries are keyed by (owner session, allocation id): session ids are
// random per registry, so a key is never reused, and an address recycled
// after a free can never be mistaken for a live mapping.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "memcuda/detail/backend/backend.hpp"

namespace memcuda::detail {

// An allocation this process exported. Freed when the last reference drops:
// the owner's table holds one, and so does every handle of this process
// that points into it.
class ExportedBlock {
 public:
  ExportedBlock(Backend& b, Allocation a) : backend_(&b), a_(std::move(a)) {}
  ~ExportedBlock() { backend_->deallocate(a_); }
  ExportedBlock(const ExportedBlock&) = delete;
  ExportedBlock& operator=(const ExportedBlock&) = delete;
  const Allocation& allocation() const noexcept { return a_; }
  void* base() const noexcept { return a_.base; }

 private:
  Backend* backend_;
  Allocation a_;
};

class ProcessCache {
 public:
  static ProcessCache& instance() {
    static ProcessCache c;  // process-wide by design (see above)
    return c;
  }

  static std::string key(const std::string& owner, std::uint64_t alloc_id) {
    return owner + "#" + std::to_string(alloc_id);
  }

  void add_export(const std::string& owner, const std::shared_ptr<ExportedBlock>& b) {
    std::lock_guard lk(m_);
    exported_[key(owner, b->allocation().alloc_id)] = b;
  }

  // The base pointer of an allocation, and what keeps it alive: our own
  // export when we own it, else a (shared) import made with `open`.
  std::pair<void*, std::shared_ptr<void>> resolve(const std::string& owner, std::uint64_t alloc_id,
                                                  const std::function<std::unique_ptr<Mapping>()>& open) {
    auto k = key(owner, alloc_id);
    std::unique_lock lk(m_);
    if (auto it = exported_.find(k); it != exported_.end()) {
      if (auto b = it->second.lock()) return {b->base(), b};
      exported_.erase(it);
    }
    if (auto it = imported_.find(k); it != imported_.end()) {
      if (auto m = it->second.lock()) {
        ++hits_;
        return {m->base(), m};
      }
      imported_.erase(it);
    }
    // Opening costs 60-170 us; holding the lock makes concurrent first
    // opens of one allocation share a single mapping.
    std::shared_ptr<Mapping> m(open());
    ++opens_;
    imported_[k] = m;
    if (imported_.size() > 2 * live_hint_ + 64) sweep();
    return {m->base(), m};
  }

  std::uint64_t opens() const {
    std::lock_guard lk(m_);
    return opens_;
  }
  std::uint64_t hits() const {
    std::lock_guard lk(m_);
    return hits_;
  }
  // Mappings currently alive in this process.
  std::size_t live_imports() const {
    std::lock_guard lk(m_);
    std::size_t n = 0;
    for (auto& [k, w] : imported_) n += !w.expired();
    return n;
  }

 private:
  void sweep() {
    std::size_t live = 0;
    for (auto it = imported_.begin(); it != imported_.end();) {
      if (it->second.expired()) it = imported_.erase(it);
      else { ++live; ++it; }
    }
    for (auto it = exported_.begin(); it != exported_.end();) {
      if (it->second.expired()) it = exported_.erase(it);
      else ++it;
    }
    live_hint_ = live;
  }

  mutable std::mutex m_;
  std::unordered_map<std::string, std::weak_ptr<ExportedBlock>> exported_;
  std::unordered_map<std::string, std::weak_ptr<Mapping>> imported_;
  std::size_t live_hint_ = 0;
  std::uint64_t opens_ = 0;
  std::uint64_t hits_ = 0;
};

}  // namespace memcuda::detail
