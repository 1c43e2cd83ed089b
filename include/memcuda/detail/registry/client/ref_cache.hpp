// In-process reference sharing: the handles this registry holds, by name,
// so that a second get() of a name returns the handle already held (no
// Redis round trip, no second Redis reference) instead of taking another.
//
// The cache holds weak references: it never keeps a tensor alive, and the
// last local copy's release goes through the ReleaseQueue as always. An
// entry is only served while the invalidation connection (invalidation.hpp)
// is subscribed ("live"); it is dropped when a message says its name stopped
// meaning its generation (remove, migration, loss), when this process
// removes the name itself, and all of them when the connection drops or
// Redis flushes its data. How stale a name can be: one invalidation message
// delivery (docs/design.md, "In-process reference sharing").
//
// Lingering (RegistryOptions::release_linger > 0): the handles a cached
// entry hands out are copies of a wrapper whose deleter gives the real
// handle back to the cache instead of dropping it; the real handle (and so
// the process's Redis reference) then lingers for the window, and a get of
// the name within it takes it back with no round trip. When the window
// passes, the release queue's thread drops it (expire_all): its release is
// queued and sent in a batch as any other. Everything that drops an entry
// (an invalidation, a remove, a flush, the connection dropping) drops its
// lingering handle too, and flush() of any registry ends every window of
// the process first (end_lingering_everywhere), so "release, flush, read the
// refcount" still reads the baseline. A killed process's lingering
// references are its session's: the garbage collector drops them as any.
//
// Races with a get that goes to Redis are closed with a token: begin()
// returns the sequence number of the last invalidation event (0 while not
// live); insert() stores the new handle only if no event since that token
// concerned its name or generation (a bounded log of recent events says),
// so a message that overtook the get's reply never leaves a stale entry.
//
// Thread safety: any thread. mu_ is held for map operations only (never
// across Redis, never while a handle is destroyed: handles dropped out of
// the maps are destroyed after it is released). The one nesting: the
// process-wide Directory::mu is taken before a cache's mu_
// (forget_name_everywhere, expire_all), never the reverse.
#pragma once

#include "memcuda/config.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "memcuda/detail/registry/process/release_queue.hpp"
#include "memcuda/dtype.hpp"
#include "memcuda/error.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class TensorHandle;  // shared_tensor.hpp

class RefCache {
 public:
  using Clock = std::chrono::steady_clock;
  using Handles = std::vector<std::shared_ptr<TensorHandle>>;  // dropped after the locks

  // Every cache of the process registers itself, so that a remove by one
  // registry is seen at once by the gets of every other registry of the
  // process under the same key prefix (read your own removes, as releases
  // are read across the registries of a process).
  explicit RefCache(std::string key_prefix = {}) : prefix_(std::move(key_prefix)) {
    auto& d = directory();
    std::lock_guard lk(d.mu);
    d.caches.push_back(this);
  }
  ~RefCache() {
    auto& d = directory();
    std::lock_guard lk(d.mu);
    std::erase(d.caches, this);
  }
  RefCache(const RefCache&) = delete;
  RefCache& operator=(const RefCache&) = delete;

  // forget_name() in every cache of the process with this cache's prefix.
  void forget_name_everywhere(std::string_view name) {
    Handles doomed;  // declared before the locks: destroyed after them
    auto& d = directory();
    std::lock_guard lk(d.mu);  // then each cache's mu_: the one nesting (docs/design.md)
    for (RefCache* c : d.caches)
      if (c->prefix_ == prefix_) {
        std::lock_guard clk(c->mu_);
        c->forget_name_locked(name, doomed);
      }
  }

  // Ends every lingering window of the process (flush()): the handles go,
  // their releases are queued.
  static void end_lingering_everywhere() noexcept {
    Handles doomed;
    try {
      auto& d = directory();
      std::lock_guard lk(d.mu);
      for (RefCache* c : d.caches) {
        std::lock_guard clk(c->mu_);
        c->end_lingering_locked(doomed);
      }
    } catch (const std::exception&) {  // bad_alloc: what is left lingers until its window passes
    }
  }

  // The release queue's thread, once a window may have passed: drops the
  // lingering handles whose window has; returns the next deadline.
  static Clock::time_point expire_all(Clock::time_point now) noexcept {
    Handles doomed;
    auto next = Clock::time_point::max();
    try {
      auto& d = directory();
      std::lock_guard lk(d.mu);
      for (RefCache* c : d.caches) {
        std::lock_guard clk(c->mu_);
        next = std::min(next, c->expire_locked(now, doomed));
      }
    } catch (const std::exception&) {
      next = now + std::chrono::milliseconds(1);  // bad_alloc: try again soon
    }
    return next;
  }

  struct Stats {
    std::uint64_t hits = 0, misses = 0, invalidations = 0, flushes = 0;
    std::uint64_t revived = 0;  // hits that took back a lingering handle
  };

  // How long a handle lingers after its last copy went (0: not at all).
  void set_linger(std::chrono::microseconds l) {
    std::lock_guard lk(mu_);
    linger_ = std::max(l, std::chrono::microseconds(0));
  }

  // A held handle for `name` (nullptr when none is held or the cache is not
  // live). Throws TypeMismatch when one is held but `want` is not its dtype
  // (dtypes of a generation never change, so Redis would say the same).
  std::shared_ptr<TensorHandle> find(std::string_view name, std::optional<DType> want) {
    std::shared_ptr<TensorHandle> h, real;  // declared before the lock: never destroyed under it
    std::uint64_t gen = 0;
    {
      std::unique_lock lk(mu_);
      if (!live_) return nullptr;
      auto it = by_name_.find(name);
      if (it == by_name_.end()) {
        ++stats_.misses;
        return nullptr;
      }
      h = it->second.handle.lock();
      if (!h && !it->second.lingering) {  // the last local copy went: its release is queued, ask Redis again
        by_gen_.erase(it->second.gen);
        by_name_.erase(it);
        ++stats_.misses;
        return nullptr;
      }
      if (want && *want != it->second.dtype) {
        const DType held = it->second.dtype;
        lk.unlock();
        h.reset();
        throw TypeMismatch("tensor '" + std::string(name) + "' holds " + std::string(to_string(held)) + ", not " +
                           std::string(to_string(*want)));
      }
      ++stats_.hits;
      if (h) return h;
      ++stats_.revived;  // lingering: take it back
      real = std::move(it->second.lingering);
      gen = it->second.gen;
    }
    return hand_out(std::move(real), std::string(name), gen);
  }

  // The generation of the handle held for `name`, if any (for a fresh get);
  // a lingering handle is held (its reference is).
  std::optional<std::uint64_t> held_generation(std::string_view name) {
    std::lock_guard lk(mu_);
    auto it = by_name_.find(name);
    if (it == by_name_.end() || (it->second.handle.expired() && !it->second.lingering)) return std::nullopt;
    return it->second.gen;
  }

  // Before a lookup in Redis whose result may be inserted: 0 while the
  // cache is not live (nothing will be inserted).
  std::uint64_t begin() {
    std::lock_guard lk(mu_);
    return live_ ? seq_ : 0;
  }

  // Remembers `h` (generation `gen` of `name`) unless an invalidation event
  // since `token` concerns it. Returns the handle the caller should use: a
  // live (or lingering) one already held for the same generation wins (so
  // the process keeps one reference; the caller drops `h`, whose release is
  // queued).
  std::shared_ptr<TensorHandle> insert(const std::string& name, std::uint64_t gen, DType dtype,
                                       std::shared_ptr<TensorHandle> h, std::uint64_t token) {
    std::shared_ptr<TensorHandle> old, real;  // declared before the lock: never destroyed under it
    Handles doomed;
    {
      std::lock_guard lk(mu_);
      if (!live_ || token == 0 || stale_since(token, name, gen)) return h;
      auto it = by_name_.find(name);
      if (it != by_name_.end()) {
        if ((old = it->second.handle.lock())) {
          if (it->second.gen == gen) return old;
          if (it->second.gen > gen) return h;  // generations only grow: ours is the older read
        } else if (it->second.lingering) {
          if (it->second.gen == gen) {
            real = std::move(it->second.lingering);  // ours is a second reference: the caller drops it
            ++stats_.revived;
          } else if (it->second.gen > gen) {
            return h;
          }
        }
        if (!real) {
          if (it->second.lingering) doomed.push_back(std::move(it->second.lingering));
          by_gen_.erase(it->second.gen);
          it->second = Entry{{}, gen, dtype, {}, {}};
        }
      } else {
        if (by_name_.size() >= next_sweep_) sweep();
        it = by_name_.emplace(name, Entry{{}, gen, dtype, {}, {}}).first;
      }
      by_gen_[gen] = name;
      if (!real && linger_.count() == 0) {
        it->second.handle = h;
        return h;
      }
    }
    return hand_out(real ? std::move(real) : std::move(h), name, gen);
  }

  // The name stopped meaning its generation (this process removed it).
  void forget_name(std::string_view name) {
    Handles doomed;
    std::lock_guard lk(mu_);
    forget_name_locked(name, doomed);
  }

  // A message said generation `gen` is no longer what its name means.
  void forget_generation(std::uint64_t gen) {
    Handles doomed;
    std::lock_guard lk(mu_);
    log_event(Event{++seq_, Event::generation, gen, {}});
    ++stats_.invalidations;
    if (auto it = by_gen_.find(gen); it != by_gen_.end()) {
      if (auto n = by_name_.find(it->second); n != by_name_.end()) {
        if (n->second.lingering) doomed.push_back(std::move(n->second.lingering));
        by_name_.erase(n);
      }
      by_gen_.erase(it);
    }
  }

  // A message said the name was given up (its record is gone).
  void forget_lost(std::string_view name) {
    forget_name(name);
    std::lock_guard lk(mu_);
    ++stats_.invalidations;
  }

  // Drops every entry (Redis flushed its data, this session was lost).
  void flush() {
    Handles doomed;
    std::lock_guard lk(mu_);
    flush_locked(doomed);
  }

  // The invalidation connection is subscribed (true) or gone (false). Both
  // flush: entries read while nobody listened may be stale.
  void set_live(bool live) {
    Handles doomed;
    std::lock_guard lk(mu_);
    flush_locked(doomed);
    live_ = live;
  }

  bool live() const {
    std::lock_guard lk(mu_);
    return live_;
  }
  Stats stats() const {
    std::lock_guard lk(mu_);
    return stats_;
  }
  // Handles lingering now (for tests and stats).
  std::size_t lingering() const {
    std::lock_guard lk(mu_);
    return static_cast<std::size_t>(
        std::count_if(by_name_.begin(), by_name_.end(), [](const auto& e) { return bool(e.second.lingering); }));
  }

 private:
  struct Directory {
    std::mutex mu;  // taken before a cache's mu_, never after
    std::vector<RefCache*> caches;
  };
  static Directory& directory() {
    static Directory d;
    return d;
  }

  struct Entry {
    std::weak_ptr<TensorHandle> handle;  // the copies handed out (a wrapper's, when lingering is on)
    std::uint64_t gen = 0;
    DType dtype{};
    std::shared_ptr<TensorHandle> lingering;  // the real handle, between its last copy and `until`
    Clock::time_point until{};
  };
  struct Event {
    enum Kind { all, generation, name } kind;
    std::uint64_t seq;
    std::uint64_t gen;
    std::string name_;
    Event(std::uint64_t s, Kind k, std::uint64_t g, std::string n)
        : kind(k), seq(s), gen(g), name_(std::move(n)) {}
  };
  // Transparent lookups by string_view (no allocation on the hit path).
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };

  // The deleter of a wrapper: its last copy gives the real handle back.
  struct LastCopy {
    RefCache* cache;  // alive while `real` is: the handle holds the core that owns the cache
    std::shared_ptr<TensorHandle> real;
    std::uint64_t gen;
    void operator()(TensorHandle*) noexcept { cache->on_last_copy(std::move(real), gen); }
  };

  // A wrapper of `real` (its copies are what users hold), remembered as the
  // entry's handle when the entry still stands for this generation. No
  // lock held: if making the wrapper throws, its deleter runs (on_last_copy).
  std::shared_ptr<TensorHandle> hand_out(std::shared_ptr<TensorHandle> real, const std::string& name,
                                         std::uint64_t gen) {
    TensorHandle* p = real.get();
    std::shared_ptr<TensorHandle> w(p, LastCopy{this, std::move(real), gen});
    std::lock_guard lk(mu_);
    auto it = by_name_.find(name);
    // Another thread may have dropped or replaced the entry meanwhile: then
    // this handle is not shared (its last copy drops it, as without a cache).
    if (it != by_name_.end() && it->second.gen == gen && it->second.handle.expired() && !it->second.lingering)
      it->second.handle = w;
    return w;
  }

  // The last copy of a wrapper went (any thread, a destructor's: no I/O).
  void on_last_copy(std::shared_ptr<TensorHandle> real, std::uint64_t gen) noexcept {
    std::shared_ptr<TensorHandle> drop;  // declared before the lock: destroyed after it
    std::optional<Clock::time_point> until;
    {
      std::lock_guard lk(mu_);
      auto g = by_gen_.find(gen);
      auto it = g == by_gen_.end() ? by_name_.end() : by_name_.find(g->second);
      if (live_ && linger_.count() > 0 && it != by_name_.end() && it->second.gen == gen &&
          !it->second.lingering && it->second.handle.expired()) {
        try {
          const auto end = Clock::now() + linger_;
          expiry_.emplace_back(end, gen);
          it->second.lingering = std::move(real);
          it->second.until = end;
          until = end;
        } catch (const std::exception&) {  // bad_alloc: no window, released now
        }
      }
      if (!until) drop = std::move(real);
    }
    if (until) ReleaseQueue::instance().call_at(*until, &RefCache::expire_all);
  }

  void forget_name_locked(std::string_view name, Handles& doomed) {
    log_event(Event{++seq_, Event::name, 0, std::string(name)});
    if (auto it = by_name_.find(name); it != by_name_.end()) {
      if (it->second.lingering) doomed.push_back(std::move(it->second.lingering));
      by_gen_.erase(it->second.gen);
      by_name_.erase(it);
    }
  }

  void flush_locked(Handles& doomed) {
    log_event(Event{++seq_, Event::all, 0, {}});
    ++stats_.flushes;
    end_lingering_locked(doomed);
    by_name_.clear();
    by_gen_.clear();
  }

  void end_lingering_locked(Handles& doomed) {
    for (auto it = by_name_.begin(); it != by_name_.end();) {
      if (it->second.lingering) {
        doomed.push_back(std::move(it->second.lingering));
        by_gen_.erase(it->second.gen);
        it = by_name_.erase(it);
      } else {
        ++it;
      }
    }
    expiry_.clear();
  }

  // Windows end in the order they began (one linger for all): pops the
  // passed ones; a handle taken back and lingering again has a later entry.
  Clock::time_point expire_locked(Clock::time_point now, Handles& doomed) {
    while (!expiry_.empty() && expiry_.front().first <= now) {
      const std::uint64_t gen = expiry_.front().second;
      expiry_.pop_front();
      auto g = by_gen_.find(gen);
      if (g == by_gen_.end()) continue;
      auto it = by_name_.find(g->second);
      if (it == by_name_.end() || !it->second.lingering || it->second.until > now) continue;
      doomed.push_back(std::move(it->second.lingering));
      by_name_.erase(it);
      by_gen_.erase(g);
    }
    return expiry_.empty() ? Clock::time_point::max() : expiry_.front().first;
  }

  void log_event(Event e) {
    events_.push_back(std::move(e));
    if (events_.size() > kEventLog) events_.pop_front();
  }

  // Whether an event after `token` concerns (name, gen); true when the log
  // no longer reaches back that far.
  bool stale_since(std::uint64_t token, const std::string& name, std::uint64_t gen) const {
    if (token == seq_) return false;
    if (events_.empty() || events_.front().seq > token + 1) return true;
    for (auto it = events_.rbegin(); it != events_.rend() && it->seq > token; ++it) {
      if (it->kind == Event::all) return true;
      if (it->kind == Event::generation && it->gen == gen) return true;
      if (it->kind == Event::name && it->name_ == name) return true;
    }
    return false;
  }

  // Drops entries whose handles are gone (not lingering); bounds the map by
  // what is held.
  void sweep() {
    for (auto it = by_name_.begin(); it != by_name_.end();) {
      if (it->second.handle.expired() && !it->second.lingering) {
        by_gen_.erase(it->second.gen);
        it = by_name_.erase(it);
      } else {
        ++it;
      }
    }
    next_sweep_ = std::max<std::size_t>(kMinSweep, 2 * by_name_.size());
  }

  static constexpr std::size_t kEventLog = 1024;
  static constexpr std::size_t kMinSweep = 256;

  const std::string prefix_;  // the registry's key prefix (its namespace)
  mutable std::mutex mu_;     // leaf but for Directory::mu (taken first): guards everything below
  bool live_ = false;
  std::chrono::microseconds linger_{0};
  std::uint64_t seq_ = 1;
  std::unordered_map<std::string, Entry, Hash, std::equal_to<>> by_name_;
  std::unordered_map<std::uint64_t, std::string> by_gen_;
  std::deque<std::pair<Clock::time_point, std::uint64_t>> expiry_;  // (window end, generation), in order
  std::deque<Event> events_;
  std::size_t next_sweep_ = kMinSweep;
  Stats stats_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
