// FdTable: the allocation fds this process keeps without mapping them, in
// one table under one leaf lock (Process::fds()), never held across I/O:
//  * held (hold/drop), by allocation key, counted per holder (a standby's
//    session, a host mapping): what a takeover adopts (docs/design.md,
//    "Standby holding"); the fd closes when the last holder lets go;
//  * parked (park/take), by (server address, served id): fds an owner's
//    server sent along, kept for the open likely to follow until used, the
//    owner's notice (drop_allocation, drop_owner), window() or kMaxParked
//    (docs/fd-transfer.md, "Batches and prefetch"). A forked child closes
//    the parked fds it inherited.
#pragma once

#include "memcuda/config.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "memcuda/detail/fd/unique_fd.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class FdTable {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::size_t kMaxParked = 256;
  static constexpr int kDefaultOffer = 64;
  // The first request to a server asks for this many (or offer(), if
  // less); the next asks for twice as many while at least half of the last
  // ones were used, and for half (not below this) when none was.
  static constexpr int kFirstOffer = 8;
  static constexpr std::chrono::milliseconds kDefaultWindow{1500};

  // --- held fds

  // `holder` (a session id) holds `key` with `fd` (taken). A key already
  // held keeps its first fd (same memory): the new one is closed.
  void hold(const std::string& holder, const std::string& key, UniqueFd fd) {
    UniqueFd doomed;
    std::lock_guard lk(mu_);
    auto& e = held_[key];
    if (!e.fd) e.fd = std::move(fd);
    else doomed = std::move(fd);
    e.holders.insert(holder);
  }
  // `holder` lets go of `key`; the fd closes when no holder is left.
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
  // Whether any holder of this process holds `key`.
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

  // --- parked fds

  // Fds an owner may send along with each answer (0: none, and nothing is
  // parked but what a batched open asked for), and how long an unused one
  // is kept (ProcessOptions::fd_prefetch, fd_park_window).
  void configure(int offer, std::chrono::milliseconds window) {
    offer_.store(offer < 0 ? 0 : offer > 253 ? 253 : offer);
    window_ms_.store(window.count() < 0 ? 0 : window.count());
    expire();
  }
  int offer() const noexcept { return window_ms_.load() > 0 ? offer_.load() : 0; }
  std::chrono::milliseconds window() const noexcept { return std::chrono::milliseconds(window_ms_.load()); }

  // How many fds to take along from the server at `address` now: sending
  // them costs the owner a dup and the reader an fd install each (about
  // 2 us), so a reader that opens one tensor of a large owner should not
  // pay for 64, while one that opens a model gets 64 per request soon.
  int offer_for(std::string_view address) {
    const int most = offer();
    if (most <= 0) return 0;
    std::lock_guard lk(mu_);
    Level& l = level(address);
    if (l.offered > 0 && 2 * l.used >= l.offered) l.want = std::min(2 * l.want, most);
    else if (l.offered > 0 && l.used == 0) l.want = std::max(l.want / 2, kFirstOffer);
    l.offered = l.used = 0;
    return std::min(l.want, most);
  }
  // `sent` fds came along from `address` (parked).
  void note_offered(std::string_view address, std::size_t sent) {
    std::lock_guard lk(mu_);
    level(address).offered = sent;
  }

  // The parked fd of `id` at `address`, or an empty one.
  UniqueFd take(std::string_view address, std::uint64_t id) {
    std::vector<UniqueFd> doomed;
    UniqueFd out;
    std::lock_guard lk(mu_);
    expire_locked(Clock::now(), &doomed);
    for (auto it = parked_.begin(); it != parked_.end(); ++it)
      if (it->id == id && it->address == address) {
        out = std::move(it->fd);
        parked_.erase(it);
        ++hits_;
        ++level(address).used;
        break;
      }
    return out;
  }

  // Parks `fd`; `key` is its allocation's ("host:<session>:<id>" or
  // "vmm:..."), empty when unknown (then only the window drops it).
  void park(std::string address, std::uint64_t id, std::string key, UniqueFd fd) {
    std::vector<UniqueFd> doomed;
    std::lock_guard lk(mu_);
    const auto now = Clock::now();
    expire_locked(now, &doomed);
    if (window_ms_.load() <= 0) {
      doomed.push_back(std::move(fd));
      return;
    }
    for (auto it = parked_.begin(); it != parked_.end(); ++it)
      if (it->id == id && it->address == address) {
        doomed.push_back(std::move(it->fd));
        parked_.erase(it);
        break;
      }
    parked_.push_back({std::move(address), id, std::move(key), std::move(fd), now});
    while (parked_.size() > kMaxParked) drop_front(&doomed);
  }

  // The owner session `owner` freed allocation `alloc_id` / ended.
  void drop_allocation(const std::string& owner, std::uint64_t alloc_id) {
    drop_keys_with(":" + owner + ":" + std::to_string(alloc_id), true);
  }
  void drop_owner(const std::string& owner) { drop_keys_with(":" + owner + ":", false); }

  // Drops what waited longer than window().
  void expire() {
    std::vector<UniqueFd> doomed;
    std::lock_guard lk(mu_);
    expire_locked(Clock::now(), &doomed);
  }

  std::size_t parked() const {
    std::lock_guard lk(mu_);
    return parked_.size();
  }
  // Opens served by a parked fd; parked fds dropped unused.
  std::uint64_t hits() const {
    std::lock_guard lk(mu_);
    return hits_;
  }
  std::uint64_t dropped() const {
    std::lock_guard lk(mu_);
    return dropped_;
  }
  // Requests this process sent to fd servers.
  void note_request() noexcept { requests_.fetch_add(1, std::memory_order_relaxed); }
  std::uint64_t requests() const noexcept { return requests_.load(std::memory_order_relaxed); }

 private:
  struct Held {
    UniqueFd fd;
    std::set<std::string> holders;
  };
  struct Parked {
    std::string address;
    std::uint64_t id;
    std::string key;
    UniqueFd fd;
    Clock::time_point at;
  };
  // Per server: the offer it gets next, and how the last one was used.
  struct Level {
    int want = kFirstOffer;
    std::size_t offered = 0, used = 0;
  };

  Level& level(std::string_view address) {
    if (levels_.size() > 1024) levels_.clear();  // bounded: a forgotten server starts over
    auto it = levels_.find(std::string(address));
    if (it == levels_.end()) it = levels_.emplace(std::string(address), Level{}).first;
    return it->second;
  }

  void drop_front(std::vector<UniqueFd>* doomed) {
    doomed->push_back(std::move(parked_.front().fd));
    parked_.pop_front();
    ++dropped_;
  }

  void expire_locked(Clock::time_point now, std::vector<UniqueFd>* doomed) {
    if (const pid_t me = ::getpid(); me != pid_) {
      parked_.clear();  // the parent's, copied by fork: closing ours leaves its own
      pid_ = me;
    }
    const auto window = std::chrono::milliseconds(window_ms_.load());
    while (!parked_.empty() && now - parked_.front().at >= window) drop_front(doomed);
  }

  void drop_keys_with(const std::string& part, bool suffix) {
    std::vector<UniqueFd> doomed;
    std::lock_guard lk(mu_);
    expire_locked(Clock::now(), &doomed);
    for (auto it = parked_.begin(); it != parked_.end();) {
      const std::string& k = it->key;
      const bool match = suffix ? k.ends_with(part) : k.find(part) != std::string::npos;
      if (!match) {
        ++it;
        continue;
      }
      doomed.push_back(std::move(it->fd));
      it = parked_.erase(it);
      ++dropped_;
    }
  }

  mutable std::mutex mu_;  // leaf: each call's `doomed` is declared before its lock, so closes after it
  std::map<std::string, Held> held_;
  std::list<Parked> parked_;  // oldest first
  std::unordered_map<std::string, Level> levels_;
  std::uint64_t hits_ = 0, dropped_ = 0;
  std::atomic<std::uint64_t> requests_{0};
  std::atomic<int> offer_{kDefaultOffer};
  std::atomic<std::int64_t> window_ms_{kDefaultWindow.count()};
  pid_t pid_ = ::getpid();
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
