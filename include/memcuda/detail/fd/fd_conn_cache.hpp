// FdConnCache: the connections to other processes' fd servers that this
// process keeps for its next fetch from the same owner, so that a reader
// that cannot use pidfd_getfd pays a connect per owner, not per allocation
// (docs/fd-transfer.md, "Bytes on the wire").
//
// Process-wide by nature (an fd server serves the process, not a registry).
// A connection is taken out while in use, so one request runs on it at a
// time; the lock is never held across I/O. A forked child closes what it
// inherited, unused: its parent may be mid-request on the same socket.
#pragma once

#include "memcuda/config.hpp"

#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <list>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "memcuda/detail/fd/unique_fd.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class FdConnCache {
 public:
  // Idle connections kept in all, and per owner (concurrent fetches from one
  // owner each hold one while in use).
  static constexpr std::size_t kMaxIdle = 64;
  static constexpr std::size_t kMaxIdlePerAddress = 4;

  // An idle connection to `address`, or an empty fd.
  UniqueFd take(std::string_view address) {
    std::lock_guard lk(mu_);
    forget_inherited();
    for (auto it = idle_.begin(); it != idle_.end(); ++it) {
      if (it->first != address) continue;
      UniqueFd fd = std::move(it->second);
      idle_.erase(it);
      return fd;
    }
    return {};
  }

  // Gives back a connection whose last answer was read in full. The least
  // recently given goes when a limit is reached; connections whose server
  // hung up are dropped on the way (at most once a second).
  void give(std::string_view address, UniqueFd fd) {
    std::unique_lock lk(mu_);
    forget_inherited();
    std::size_t same = 0;
    for (const auto& e : idle_) same += e.first == address;
    if (same >= kMaxIdlePerAddress) return;  // fd closes on return
    idle_.emplace_back(std::string(address), std::move(fd));
    const auto now = std::chrono::steady_clock::now();
    if (now - last_prune_ > std::chrono::seconds(1)) {
      last_prune_ = now;
      for (auto it = idle_.begin(); it != idle_.end();) {
        pollfd p{it->second.get(), POLLIN, 0};
        // Readable or hung up while idle: the server closed it (an owner
        // that exited, or one that dropped it for a newer peer).
        if (::poll(&p, 1, 0) > 0) it = idle_.erase(it);
        else ++it;
      }
    }
    while (idle_.size() > kMaxIdle) idle_.pop_front();
  }

  std::size_t idle() const {
    std::lock_guard lk(mu_);
    return idle_.size();
  }

 private:
  void forget_inherited() {
    const pid_t me = ::getpid();
    if (me == pid_) return;
    idle_.clear();  // copies of the parent's connections: closing ours leaves its open
    pid_ = me;
  }

  mutable std::mutex mu_;  // leaf
  std::list<std::pair<std::string, UniqueFd>> idle_;
  pid_t pid_ = ::getpid();
  std::chrono::steady_clock::time_point last_prune_{};
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
