// Lingering releases of the holdings table (holdings.hpp, "Lingering"):
// the wrapper handles a share hands out, the window a last copy opens, and
// the release queue's thread closing passed windows. Included at the end
// of holdings.hpp; a file of its own so that each stays short.
#pragma once

#include "memcuda/config.hpp"

#include "memcuda/detail/process/process.hpp"
#include "memcuda/detail/registry/get/holdings.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

inline void Holdings::end_lingering_everywhere() noexcept {
  Handles doomed;
  try {
    auto& d = directory();
    std::lock_guard lk(d.mu);
    for (Holdings* t : d.tables) {
      std::lock_guard tlk(t->mu_);
      t->end_lingering_locked(doomed);
    }
  } catch (const std::exception&) {  // bad_alloc: what is left lingers until its window passes
  }
}

inline Holdings::Clock::time_point Holdings::expire_all(Clock::time_point now) noexcept {
  Handles doomed;
  auto next = Clock::time_point::max();
  try {
    auto& d = directory();
    std::lock_guard lk(d.mu);
    for (Holdings* t : d.tables) {
      std::lock_guard tlk(t->mu_);
      next = std::min(next, t->expire_locked(now, doomed));
    }
  } catch (const std::exception&) {
    next = now + std::chrono::milliseconds(1);  // bad_alloc: try again soon
  }
  return next;
}

inline std::shared_ptr<TensorHandle> Holdings::hand_out(std::shared_ptr<TensorHandle> real, const std::string& name,
                                                        std::uint64_t gen) {
  TensorHandle* p = real.get();
  std::shared_ptr<TensorHandle> w(p, LastCopy{this, std::move(real), gen});
  std::lock_guard lk(mu_);
  auto it = by_name_.find(name);
  // Another thread may have dropped or replaced the share meanwhile: then
  // this handle is not shared (its last copy drops it, as without sharing).
  if (it != by_name_.end() && it->second.share) {
    Share& s = *it->second.share;
    if (s.gen == gen && s.handle.expired() && !s.lingering) s.handle = w;
  }
  return w;
}

inline void Holdings::on_last_copy(std::shared_ptr<TensorHandle> real, std::uint64_t gen) noexcept {
  std::shared_ptr<TensorHandle> drop;  // declared before the lock: destroyed after it
  std::optional<Clock::time_point> until;
  {
    std::lock_guard lk(mu_);
    Share* s = share_of(gen);
    if (live_ && linger_.count() > 0 && s && !s->lingering && s->handle.expired()) {
      try {
        const auto end = Clock::now() + linger_;
        expiry_.emplace_back(end, gen);
        s->lingering = std::move(real);
        s->until = end;
        until = end;
      } catch (const std::exception&) {  // bad_alloc: no window, released now
      }
    }
    if (!until) drop = std::move(real);
  }
  if (until) Process::get().releases().call_at(*until, &Holdings::expire_all);
}

inline void Holdings::end_lingering_locked(Handles& doomed) {
  for (auto it = by_name_.begin(); it != by_name_.end();) {
    if (it->second.share && it->second.share->lingering) clear_share(it->second, doomed);
    it = it->second.empty() ? by_name_.erase(it) : std::next(it);
  }
  expiry_.clear();
}

inline Holdings::Clock::time_point Holdings::expire_locked(Clock::time_point now, Handles& doomed) {
  while (!expiry_.empty() && expiry_.front().first <= now) {
    const std::uint64_t gen = expiry_.front().second;
    expiry_.pop_front();
    auto g = by_gen_.find(gen);
    if (g == by_gen_.end()) continue;
    auto it = by_name_.find(g->second);
    if (it == by_name_.end() || !it->second.share || !it->second.share->lingering || it->second.share->until > now)
      continue;
    drop_share(it, doomed);
  }
  return expiry_.empty() ? Clock::time_point::max() : expiry_.front().first;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
