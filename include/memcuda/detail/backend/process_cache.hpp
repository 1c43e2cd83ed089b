// Part of the process object (Process::cache()): which exported allocations this
// process owns and which foreign ones it has mapped. Every registry of the
// process resolves tensors through it, because a process may not open its
// own CUDA IPC handle, and because mapping an allocation once per process
// (not once per tensor) is what makes a warm get cheap.
//
// Entries are keyed by (owner session, allocation id): session ids are
// random per registry, so a key is never reused, and an address recycled
// after a free can never be mistaken for a live mapping.
//
// A mapping stays open while any tensor of this process uses it, and the
// most recently used idle ones too (RegistryOptions::import_cache), until
// the inbox says their memory was returned ("unmap") or their exporter's
// session ended ("forget"): docs/design.md, "Fewer opens".
#pragma once

#include "memcuda/config.hpp"

#include <functional>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "memcuda/detail/backend/backend.hpp"
#include "memcuda/detail/cuda/runtime.hpp"  // note_process_exit
#include "memcuda/detail/fd/fd_table.hpp"
#include "memcuda/detail/process/process.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// An allocation this process exported. Freed when the last reference drops:
// the owner's table holds one, and so does every handle of this process
// that points into it.
class ExportedBlock {
 public:
  ExportedBlock(Backend& b, Allocation a) : backend_(&b), a_(std::move(a)) {}
  // The exposure to other nodes goes first: no peer may read memory being freed.
  ~ExportedBlock() {
    exposure_.reset();
    backend_->deallocate(a_);
  }
  ExportedBlock(const ExportedBlock&) = delete;
  ExportedBlock& operator=(const ExportedBlock&) = delete;
  const Allocation& allocation() const noexcept { return a_; }
  void* base() const noexcept { return a_.base; }
  // The registration that exposes it to other nodes' byte movers (a fleet's
  // node service makes it once, on whichever thread needs it first: the
  // create that made the slab or the control loop's tick).
  std::shared_ptr<void> exposure() const {
    std::lock_guard lk(exposure_mu_);
    return exposure_;
  }
  // The exposure, made by `make` unless there is one; -> it, and whether
  // this call made it. `make` runs under a leaf lock: local work only.
  template <class F>
  std::pair<std::shared_ptr<void>, bool> expose_once(F&& make) {
    std::lock_guard lk(exposure_mu_);
    if (exposure_) return {exposure_, false};
    exposure_ = make();
    return {exposure_, true};
  }

 private:
  Backend* backend_;
  Allocation a_;
  mutable std::mutex exposure_mu_;  // leaf: guards exposure_
  std::shared_ptr<void> exposure_;
};

class ProcessCache {
 public:
  // Runs only at exit (the process object's destruction), before the
  // members close the mappings they keep: CUDA may already be unloaded, and
  // that is no error. The fd table outlives the cache (process.hpp): a
  // host mapping the cache still keeps at exit gives its fd back there.
  ~ProcessCache() { note_process_exit(); }
  ProcessCache() = default;
  ProcessCache(const ProcessCache&) = delete;
  ProcessCache& operator=(const ProcessCache&) = delete;

  static std::string key(const std::string& owner, std::uint64_t alloc_id) {
    return owner + "#" + std::to_string(alloc_id);
  }

  // How many idle mappings to keep (RegistryOptions::import_cache): a
  // registry sets it as it is made. Lowering it closes the least recently
  // used ones beyond it now, after the lock is let go.
  void set_idle_limit(std::size_t n) {
    std::list<std::pair<std::string, std::shared_ptr<Mapping>>> gone;
    std::lock_guard lk(m_);
    keep_idle_ = n;
    while (recent_.size() > keep_idle_) gone.splice(gone.begin(), recent_, std::prev(recent_.end()));
  }

  void add_export(const std::string& owner, const std::shared_ptr<ExportedBlock>& b) {
    std::lock_guard lk(m_);
    exported_[key(owner, b->allocation().alloc_id)] = b;
  }

  // The base pointer of an allocation, and what keeps it alive: our own
  // export when we own it, else a (shared) import made with `open`.
  // Opening costs 60-170 us, and for a cuMem fd it may wait on another
  // process (the fd fetch, up to its timeout): so it runs without the lock,
  // once per allocation. Concurrent first opens of one allocation wait for
  // that one open (a shared future) and share its mapping or its error;
  // every other allocation, and every cache hit, goes on meanwhile.
  std::pair<void*, std::shared_ptr<void>> resolve(const std::string& owner, std::uint64_t alloc_id,
                                                  const std::function<std::unique_ptr<Mapping>()>& open) {
    auto k = key(owner, alloc_id);
    std::promise<std::shared_ptr<Mapping>> mine;
    {
      std::unique_lock lk(m_);
      if (auto it = exported_.find(k); it != exported_.end()) {
        if (auto b = it->second.lock()) return {b->base(), b};
        exported_.erase(it);
      }
      if (auto it = imported_.find(k); it != imported_.end()) {
        if (auto m = it->second.lock()) {
          ++hits_;
          keep_recent(k, m);
          return {m->base(), m};
        }
        imported_.erase(it);
      }
      if (auto it = opening_.find(k); it != opening_.end()) {
        auto pending = it->second;
        lk.unlock();
        std::shared_ptr<Mapping> m = pending.get();  // rethrows the open's error
        return {m->base(), m};
      }
      opening_.emplace(k, mine.get_future().share());
    }
    std::shared_ptr<Mapping> m;
    try {
      m = std::shared_ptr<Mapping>(open());
    } catch (...) {
      {
        std::lock_guard lk(m_);
        opening_.erase(k);
      }
      mine.set_exception(std::current_exception());
      throw;
    }
    {
      std::lock_guard lk(m_);
      ++opens_;
      imported_[k] = m;
      keep_recent(k, m);
      opening_.erase(k);
      if (imported_.size() > 2 * live_hint_ + 64) sweep();
    }
    mine.set_value(m);
    return {m->base(), m};
  }

  // Whether this process has the allocation mapped now (its own, or open):
  // a batched open fetches fds only for the others.
  bool mapped(const std::string& owner, std::uint64_t alloc_id) const {
    const auto k = key(owner, alloc_id);
    std::lock_guard lk(m_);
    if (auto it = exported_.find(k); it != exported_.end() && !it->second.expired()) return true;
    if (auto it = imported_.find(k); it != imported_.end() && !it->second.expired()) return true;
    return opening_.count(k) != 0;
  }

  // First opens running now (for tests and statistics).
  std::size_t opening() const {
    std::lock_guard lk(m_);
    return opening_.size();
  }

  // The mapping of an allocation if this process has it (owned or
  // imported), without opening anything: a dead exporter's memory can only
  // be read through a mapping made while it lived.
  std::pair<void*, std::shared_ptr<void>> find(const std::string& owner, std::uint64_t alloc_id) {
    auto k = key(owner, alloc_id);
    std::lock_guard lk(m_);
    if (auto it = exported_.find(k); it != exported_.end())
      if (auto b = it->second.lock()) return {b->base(), b};
    if (auto it = imported_.find(k); it != imported_.end())
      if (auto m = it->second.lock()) return {m->base(), m};
    return {nullptr, nullptr};
  }

  // The exporter `owner` is dead and its tensors have moved: stop keeping
  // its idle mappings, so its memory goes back to the driver as soon as no
  // handle of this process uses it.
  void forget_owner(const std::string& owner) {
    Process::get().fds().drop_owner(owner);  // fds sent along unasked pin memory too
    std::list<std::pair<std::string, std::shared_ptr<Mapping>>> gone;
    {
      std::lock_guard lk(m_);
      const std::string pre = owner + "#";
      for (auto it = recent_.begin(); it != recent_.end();) {
        auto next = std::next(it);
        if (it->first.starts_with(pre)) gone.splice(gone.end(), recent_, it);
        it = next;
      }
      dead_owners_.insert(owner);
    }
  }

  // The exporter returned this allocation to the driver: stop keeping an
  // idle mapping of it (which would keep the memory allocated).
  void forget_allocation(const std::string& owner, std::uint64_t alloc_id) {
    Process::get().fds().drop_allocation(owner, alloc_id);
    std::list<std::pair<std::string, std::shared_ptr<Mapping>>> gone;
    std::lock_guard lk(m_);
    const std::string k = key(owner, alloc_id);
    for (auto it = recent_.begin(); it != recent_.end(); ++it)
      if (it->first == k) {
        gone.splice(gone.end(), recent_, it);
        break;
      }
  }

  std::uint64_t opens() const {
    std::lock_guard lk(m_);
    return opens_;
  }
  std::uint64_t hits() const {
    std::lock_guard lk(m_);
    return hits_;
  }
  // Foreign allocations mapped in this process now (in use or kept idle).
  std::size_t live_imports() const {
    std::lock_guard lk(m_);
    std::size_t n = 0;
    for (auto& [k, w] : imported_) n += !w.expired();
    return n;
  }
  // Of those, the ones no tensor of this process uses (kept for reuse).
  std::size_t idle_imports() const {
    std::lock_guard lk(m_);
    std::size_t n = 0;
    for (auto& [k, m] : recent_) n += m.use_count() == 1;
    return n;
  }
  // Closes every idle mapping now.
  void drop_idle() {
    std::list<std::pair<std::string, std::shared_ptr<Mapping>>> gone;
    {
      std::lock_guard lk(m_);
      gone.swap(recent_);
    }
  }

 private:
  void keep_recent(const std::string& k, const std::shared_ptr<Mapping>& m) {
    for (auto it = recent_.begin(); it != recent_.end(); ++it)
      if (it->first == k) {
        recent_.splice(recent_.begin(), recent_, it);
        return;
      }
    if (keep_idle_ == 0 || dead_owners_.count(k.substr(0, k.rfind('#')))) return;
    recent_.emplace_front(k, m);
    if (recent_.size() > keep_idle_) recent_.pop_back();  // closes it if unused (lock held: close is quick)
  }

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
  std::list<std::pair<std::string, std::shared_ptr<Mapping>>> recent_;  // MRU first
  std::unordered_set<std::string> dead_owners_;  // forget_owner: never kept idle
  // First opens in flight, by key: later callers for the key wait on it.
  std::unordered_map<std::string, std::shared_future<std::shared_ptr<Mapping>>> opening_;
  std::size_t keep_idle_ = 16;  // set_idle_limit
  std::size_t live_hint_ = 0;
  std::uint64_t opens_ = 0;
  std::uint64_t hits_ = 0;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
