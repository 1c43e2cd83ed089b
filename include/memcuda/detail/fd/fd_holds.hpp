// FdHolds: the fds a standby holds without importing them (docs/design.md,
// "Standby holding"; detail/registry/process/standby.hpp fills it). Holding an
// allocation's fd keeps its device memory alive (measured: no CUDA context,
// no import and no mapping needed), so when the allocator of record dies,
// the process that takes over already holds everything it must adopt.
//
// Process-wide, by allocation key (the allocations Hash field, "vmm:<creator
// session>:<alloc id>"), because the backend that adopts is process-wide
// too; each key is counted per holding registry (two registries of one
// process may both be standbys of one namespace), and its fd is closed when
// the last of them lets go.
#pragma once

#include "memcuda/config.hpp"

#include <map>
#include <mutex>
#include <set>
#include <string>

#include "memcuda/detail/fd/unique_fd.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class FdHolds {
 public:
  static FdHolds& instance() {
    static FdHolds h;  // process-wide by design (see above)
    return h;
  }

  // `holder` (a session id) holds `key` with `fd` (taken). A key already
  // held keeps its first fd (same memory): the new one is closed.
  void hold(const std::string& holder, const std::string& key, UniqueFd fd) {
    std::lock_guard lk(mu_);
    auto& e = held_[key];
    if (!e.fd) e.fd = std::move(fd);
    e.holders.insert(holder);
  }

  // `holder` lets go of `key`; the fd closes when no registry holds it.
  void drop(const std::string& holder, const std::string& key) {
    UniqueFd doomed;
    std::lock_guard lk(mu_);
    auto it = held_.find(key);
    if (it == held_.end()) return;
    it->second.holders.erase(holder);
    if (it->second.holders.empty()) {
      doomed = std::move(it->second.fd);
      held_.erase(it);
    }
  }

  bool holds(const std::string& holder, const std::string& key) const {
    std::lock_guard lk(mu_);
    auto it = held_.find(key);
    return it != held_.end() && it->second.holders.count(holder);
  }
  // Whether any registry of this process holds `key`.
  bool held(const std::string& key) const {
    std::lock_guard lk(mu_);
    return held_.count(key) != 0;
  }
  // A close-on-exec duplicate of the held fd (empty when not held, or out
  // of fds: errno says which).
  UniqueFd dup(const std::string& key) const {
    std::lock_guard lk(mu_);
    auto it = held_.find(key);
    if (it == held_.end()) {
      errno = ENOENT;
      return {};
    }
    return it->second.fd.dup();
  }
  // The keys `holder` holds.
  std::set<std::string> keys(const std::string& holder) const {
    std::lock_guard lk(mu_);
    std::set<std::string> out;
    for (const auto& [k, e] : held_)
      if (e.holders.count(holder)) out.insert(k);
    return out;
  }
  std::size_t size() const {
    std::lock_guard lk(mu_);
    return held_.size();
  }

 private:
  struct Held {
    UniqueFd fd;
    std::set<std::string> holders;
  };
  mutable std::mutex mu_;  // leaf; close() of a dropped fd runs after it is released
  std::map<std::string, Held> held_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
