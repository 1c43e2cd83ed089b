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
// Races with a get that goes to Redis are closed with a token: begin()
// returns the sequence number of the last invalidation event (0 while not
// live); insert() stores the new handle only if no event since that token
// concerned its name or generation (a bounded log of recent events says),
// so a message that overtook the get's reply never leaves a stale entry.
//
// Thread safety: any thread. mu_ is held for map operations only
// (never across Redis, never while a handle is destroyed: expired weak
// references are dropped under it, but a weak_ptr never runs a destructor
// of the handle). The one nesting: the process-wide Directory::mu is
// taken before a cache's mu_ (forget_name_everywhere), never the reverse.
#pragma once

#include "memcuda/config.hpp"

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <algorithm>
#include <utility>
#include <vector>

#include "memcuda/dtype.hpp"
#include "memcuda/error.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class TensorHandle;  // shared_tensor.hpp

class RefCache {
 public:
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
    auto& d = directory();
    std::lock_guard lk(d.mu);  // then each cache's mu_: the one nesting (docs/design.md)
    for (RefCache* c : d.caches)
      if (c->prefix_ == prefix_) c->forget_name(name);
  }

  struct Stats {
    std::uint64_t hits = 0, misses = 0, invalidations = 0, flushes = 0;
  };

  // A held handle for `name` (nullptr when none is held or the cache is not
  // live). Throws TypeMismatch when one is held but `want` is not its dtype
  // (dtypes of a generation never change, so Redis would say the same).
  std::shared_ptr<TensorHandle> find(std::string_view name, std::optional<DType> want) {
    std::shared_ptr<TensorHandle> h;  // declared before the lock: never destroyed under it
    std::unique_lock lk(mu_);
    if (!live_) return nullptr;
    auto it = by_name_.find(name);
    if (it == by_name_.end()) {
      ++stats_.misses;
      return nullptr;
    }
    h = it->second.handle.lock();
    if (!h) {  // the last local copy went: its release is queued, ask Redis again
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
    return h;
  }

  // The generation of the handle held for `name`, if any (for a fresh get).
  std::optional<std::uint64_t> held_generation(std::string_view name) {
    std::lock_guard lk(mu_);
    auto it = by_name_.find(name);
    if (it == by_name_.end() || it->second.handle.expired()) return std::nullopt;
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
  // live one already held for the same generation wins (so the process
  // keeps one reference; the caller drops `h`, whose release is queued).
  std::shared_ptr<TensorHandle> insert(const std::string& name, std::uint64_t gen, DType dtype,
                                       std::shared_ptr<TensorHandle> h, std::uint64_t token) {
    std::shared_ptr<TensorHandle> old;  // declared before the lock: never destroyed under it
    std::lock_guard lk(mu_);
    if (!live_ || token == 0 || stale_since(token, name, gen)) return h;
    auto it = by_name_.find(name);
    if (it != by_name_.end()) {
      if ((old = it->second.handle.lock())) {
        if (it->second.gen == gen) return old;
        if (it->second.gen > gen) return h;  // generations only grow: ours is the older read
      }
      by_gen_.erase(it->second.gen);
      it->second = Entry{h, gen, dtype};
    } else {
      if (by_name_.size() >= next_sweep_) sweep();
      by_name_.emplace(name, Entry{h, gen, dtype});
    }
    by_gen_[gen] = name;
    return h;
  }

  // The name stopped meaning its generation (this process removed it).
  void forget_name(std::string_view name) {
    std::lock_guard lk(mu_);
    log_event(Event{++seq_, Event::name, 0, std::string(name)});
    if (auto it = by_name_.find(name); it != by_name_.end()) {
      by_gen_.erase(it->second.gen);
      by_name_.erase(it);
    }
  }

  // A message said generation `gen` is no longer what its name means.
  void forget_generation(std::uint64_t gen) {
    std::lock_guard lk(mu_);
    log_event(Event{++seq_, Event::generation, gen, {}});
    ++stats_.invalidations;
    if (auto it = by_gen_.find(gen); it != by_gen_.end()) {
      by_name_.erase(it->second);
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
    std::lock_guard lk(mu_);
    flush_locked();
  }

  // The invalidation connection is subscribed (true) or gone (false). Both
  // flush: entries read while nobody listened may be stale.
  void set_live(bool live) {
    std::lock_guard lk(mu_);
    flush_locked();
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
    std::weak_ptr<TensorHandle> handle;
    std::uint64_t gen = 0;
    DType dtype{};
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

  void flush_locked() {
    log_event(Event{++seq_, Event::all, 0, {}});
    ++stats_.flushes;
    by_name_.clear();
    by_gen_.clear();
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

  // Drops entries whose handles are gone; bounds the map by what is held.
  void sweep() {
    for (auto it = by_name_.begin(); it != by_name_.end();) {
      if (it->second.handle.expired()) {
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
  std::uint64_t seq_ = 1;
  std::unordered_map<std::string, Entry, Hash, std::equal_to<>> by_name_;
  std::unordered_map<std::uint64_t, std::string> by_gen_;
  std::deque<Event> events_;
  std::size_t next_sweep_ = kMinSweep;
  Stats stats_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
