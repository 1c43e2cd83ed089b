// FdParking: fds this process received before it asked for them, kept a
// short while for the open that is likely to follow (docs/fd-transfer.md,
// "Batches and prefetch").
//
// A reader that cannot use pidfd_getfd (another pid namespace, or no
// ptrace rights) asks an owner's fd server for each allocation it opens.
// When it asks, the server may send along the fds of the owner's other
// allocations (fd_wire.hpp), and a batched open (get_many, a state
// dict) fetches all of its allocations in one request; both park the fds
// here, keyed by (server address, served id), so that the open of one of
// them is no round trip.
//
// A parked fd keeps its memory allocated (a memfd, a cuMem allocation)
// even after its owner frees it, so none is kept long: an fd leaves when
// it is used, when the owner says it freed the allocation or its session
// ended (drop_allocation, drop_owner: the registry's inbox), and after
// window() unused (checked on every call here and by the registry's
// thread each tick). At most kMaxParked are kept (the oldest go first).
//
// Process-wide, like the connections (fd_conn_cache.hpp). The lock is a
// leaf and never held across I/O; fds are closed outside it. A forked child
// closes what it inherited.
#pragma once

#include "memcuda/config.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <list>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "memcuda/detail/fd/unique_fd.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class FdParking {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::size_t kMaxParked = 256;
  static constexpr int kDefaultOffer = 64;
  // The first request to a server asks for this many (or offer(), if
  // less); the next asks for twice as many while at least half of the last
  // ones were used, and for half (not below this) when none was.
  static constexpr int kFirstOffer = 8;
  static constexpr std::chrono::milliseconds kDefaultWindow{1500};

  static FdParking& instance() {
    static FdParking* p = new FdParking();  // never destroyed: fetches may run during static destruction
    return *p;
  }

  // Fds an owner may send along with each answer (0: none, and nothing is
  // parked but what a batched open asked for), and how long an unused one
  // is kept. Process-wide: the last registry made sets them
  // (TransferOptions::fd_prefetch, fd_park_window).
  void configure(int offer, std::chrono::milliseconds window) {
    offer_.store(offer < 0 ? 0 : offer > 253 ? 253 : offer);
    window_ms_.store(window.count() < 0 ? 0 : window.count());
    expire();
  }
  int offer() const noexcept { return window_ms_.load() > 0 ? offer_.load() : 0; }

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
  std::chrono::milliseconds window() const noexcept { return std::chrono::milliseconds(window_ms_.load()); }

  // The parked fd of `id` at `address`, or an empty one.
  UniqueFd take(std::string_view address, std::uint64_t id) {
    std::vector<UniqueFd> doomed;
    UniqueFd out;
    {
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
  struct Parked {
    std::string address;
    std::uint64_t id;
    std::string key;
    UniqueFd fd;
    Clock::time_point at;
  };

  FdParking() = default;

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

  mutable std::mutex mu_;  // leaf
  std::list<Parked> parked_;  // oldest first
  std::unordered_map<std::string, Level> levels_;
  std::uint64_t hits_ = 0, dropped_ = 0;
  std::atomic<std::uint64_t> requests_{0};
  std::atomic<int> offer_{kDefaultOffer};
  std::atomic<std::int64_t> window_ms_{kDefaultWindow.count()};
  pid_t pid_ = ::getpid();
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
