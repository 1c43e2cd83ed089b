// What one registry holds, by name, in one table behind one lock: the
// references it holds in Redis (registered again after Redis lost its data,
// recovery.hpp), the record last read (so the acquire script can answer
// "same" instead of the whole Hash), and the handle a second get() shares,
// held weakly and served only while the invalidation connection is live.
// docs/design.md, "In-process reference sharing", says how invalidation,
// the insert token and lingering releases work.
//
// Thread safety: any thread. mu_ is held for map operations only (never
// across Redis, never while a handle is destroyed). The one nesting: the
// process-wide Directory::mu is taken before a table's mu_, never the reverse.
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

#include "memcuda/detail/registry/get/holdings_entry.hpp"
#include "memcuda/detail/registry/get/invalidation_log.hpp"
#include "memcuda/detail/registry/release_queue.hpp"
#include "memcuda/dtype.hpp"
#include "memcuda/error.hpp"
#include "memcuda/tensor_info.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class TensorHandle;  // shared_tensor.hpp

class Holdings {
 public:
  using Clock = std::chrono::steady_clock;
  using Handles = std::vector<std::shared_ptr<TensorHandle>>;  // dropped after the locks
  using Record = std::shared_ptr<const TensorInfo>;
  using Key = std::pair<std::string, std::uint64_t>;  // (name, generation)

  // Every table of the process registers itself, so that a remove by one
  // registry is seen at once by the gets of every other registry of the
  // process under the same key prefix (read your own removes, as releases
  // are read across the registries of a process).
  explicit Holdings(std::string key_prefix = {}) : prefix_(std::move(key_prefix)) {
    auto& d = directory();
    std::lock_guard lk(d.mu);
    d.tables.push_back(this);
  }
  ~Holdings() {
    auto& d = directory();
    std::lock_guard lk(d.mu);
    std::erase(d.tables, this);
  }
  Holdings(const Holdings&) = delete;
  Holdings& operator=(const Holdings&) = delete;

  struct Stats {
    std::uint64_t hits = 0, misses = 0, invalidations = 0, flushes = 0;
    std::uint64_t revived = 0;  // hits that took back a lingering handle
  };

  // ---- a get -------------------------------------------------------------

  struct Found {
    std::shared_ptr<TensorHandle> handle;  // shared: use it (no Redis)
    std::uint64_t token = 0;               // else: for insert() (0: not live, nothing will be kept)
    Record record;                         // the record last read for the name, if any
  };

  // What a get of `name` finds: a shared handle (sharing on and live), or
  // the token and the record to go to Redis with. Throws TypeMismatch when
  // a handle is shared but `want` is not its dtype (dtypes of a generation
  // never change, so Redis would say the same).
  Found find(std::string_view name, std::optional<DType> want, bool share) {
    Found out;
    std::shared_ptr<TensorHandle> real;  // declared before the lock: never destroyed under it
    std::uint64_t gen = 0;
    {
      std::unique_lock lk(mu_);
      auto it = by_name_.find(name);
      if (it != by_name_.end()) out.record = it->second.record;
      if (!share || !live_) return out;
      out.token = log_.last();
      if (it == by_name_.end() || !it->second.share) {
        ++stats_.misses;
        return out;
      }
      Share& s = *it->second.share;
      out.handle = s.handle.lock();
      if (!out.handle && !s.lingering) {  // the last local copy went: its
                                          // release is queued, ask Redis again
        Handles none;
        drop_share(it, none);
        ++stats_.misses;
        return out;
      }
      if (want && *want != s.dtype) {
        const DType held = s.dtype;
        lk.unlock();
        out.handle.reset();
        throw TypeMismatch("tensor '" + std::string(name) + "' holds " + std::string(to_string(held)) + ", not " +
                           std::string(to_string(*want)));
      }
      ++stats_.hits;
      if (out.handle) return out;
      ++stats_.revived;  // lingering: take it back
      real = std::move(s.lingering);
      gen = s.gen;
    }
    out.handle = hand_out(std::move(real), std::string(name), gen);
    return out;
  }

  // This process took a reference to `t` (mapped, about to become a handle);
  // `read`, when given, is the record just read (kept for the next get).
  void took(const TensorInfo& t, Record read = nullptr) {
    std::lock_guard lk(mu_);
    auto it = by_name_.find(t.name);
    if (it == by_name_.end()) it = by_name_.emplace(t.name, Entry{}).first;
    it->second.add_ref(t.generation, +1);
    if (read) keep_record(it, std::move(read));
  }

  // ---- references held (recovery) ----------------------------------------

  // A reference taken (+1) or given back (-1) for (name, generation). From
  // destructors too: no throw, no I/O.
  void note(std::string_view name, std::uint64_t gen, int delta) noexcept {
    try {
      std::lock_guard lk(mu_);
      auto it = by_name_.find(name);
      if (it == by_name_.end()) {
        if (delta <= 0) return;
        it = by_name_.emplace(std::string(name), Entry{}).first;
      }
      it->second.add_ref(gen, delta);
      if (it->second.empty()) by_name_.erase(it);
    } catch (...) {  // bad_alloc: recovery misses this reference (GC collects
                     // it with the session)
    }
  }

  std::vector<std::pair<Key, std::int64_t>> snapshot() const {
    std::lock_guard lk(mu_);
    std::vector<std::pair<Key, std::int64_t>> out;
    for (const auto& [name, e] : by_name_)
      for (const auto& [gen, n] : e.refs) out.push_back({{name, gen}, n});
    return out;
  }

  // ---- sharing -----------------------------------------------------------

  // How long a handle lingers after its last copy went (0: not at all).
  void set_linger(std::chrono::microseconds l) {
    std::lock_guard lk(mu_);
    linger_ = std::max(l, std::chrono::microseconds(0));
  }

  // The generation of the handle shared for `name`, if any (for a fresh
  // get); a lingering handle is held (its reference is).
  std::optional<std::uint64_t> held_generation(std::string_view name) const {
    std::lock_guard lk(mu_);
    auto it = by_name_.find(name);
    if (it == by_name_.end() || !it->second.share) return std::nullopt;
    const Share& s = *it->second.share;
    if (s.handle.expired() && !s.lingering) return std::nullopt;
    return s.gen;
  }

  // The token of a lookup whose result may be inserted: 0 while not live.
  std::uint64_t begin() const {
    std::lock_guard lk(mu_);
    return live_ ? log_.last() : 0;
  }

  // Shares `h` (generation `gen` of `name`) unless an invalidation event
  // since `token` concerns it. Returns the handle the caller should use: a
  // live (or lingering) one already shared for the same generation wins (so
  // the process keeps one reference; the caller drops `h`, whose release is
  // queued).
  std::shared_ptr<TensorHandle> insert(const std::string& name, std::uint64_t gen, DType dtype,
                                       std::shared_ptr<TensorHandle> h, std::uint64_t token) {
    std::shared_ptr<TensorHandle> old,
        real;  // declared before the lock: never destroyed under it
    Handles doomed;
    {
      std::lock_guard lk(mu_);
      if (!live_ || token == 0 || log_.stale_since(token, name, gen)) return h;
      auto it = by_name_.find(name);
      if (it == by_name_.end()) {
        if (by_name_.size() >= next_sweep_) sweep();
        it = by_name_.emplace(name, Entry{}).first;
      }
      Entry& e = it->second;
      if (e.share) {
        Share& s = *e.share;
        if ((old = s.handle.lock())) {
          if (s.gen == gen) return old;
          if (s.gen > gen) return h;  // generations only grow: ours is the older read
        } else if (s.lingering && s.gen >= gen) {
          if (s.gen > gen) return h;
          real = std::move(s.lingering);  // ours is a second reference: the caller drops it
          ++stats_.revived;
        }
        if (!real) clear_share(e, doomed);
      }
      if (!e.share) {
        e.share.emplace(Share{{}, gen, dtype, {}, {}});
        by_gen_[gen] = name;
      }
      if (!real && linger_.count() == 0) {
        e.share->handle = h;
        return h;
      }
    }
    return hand_out(real ? std::move(real) : std::move(h), name, gen);
  }

  // ---- invalidation: one path for shares and records ---------------------

  // The name stopped meaning its generation (this process removed it): in
  // every table of the process with this table's prefix.
  void forget_name_everywhere(std::string_view name) {
    Handles doomed;  // declared before the locks: destroyed after them
    auto& d = directory();
    std::lock_guard lk(d.mu);  // then each table's mu_: the one nesting (docs/design.md)
    for (Holdings* t : d.tables)
      if (t->prefix_ == prefix_) {
        std::lock_guard tlk(t->mu_);
        t->forget_name_locked(name, doomed);
      }
  }

  // A message said generation `gen` is no longer what its name means.
  void forget_generation(std::uint64_t gen) {
    Handles doomed;
    std::lock_guard lk(mu_);
    log_.generation(gen);
    ++stats_.invalidations;
    auto g = by_gen_.find(gen);
    if (g == by_gen_.end()) return;
    auto it = by_name_.find(g->second);
    if (it == by_name_.end()) {
      by_gen_.erase(g);
      return;
    }
    if (it->second.record && it->second.record->generation == gen) drop_record(it->second);
    drop_share(it, doomed);
  }

  // A message said the name was given up (its record is gone).
  void forget_lost(std::string_view name) {
    Handles doomed;
    std::lock_guard lk(mu_);
    forget_name_locked(name, doomed);
    ++stats_.invalidations;
  }

  // Drops every share and record, keeps the references (Redis flushed its
  // data, this session was lost: recovery registers them again).
  void flush() {
    Handles doomed;
    std::lock_guard lk(mu_);
    flush_locked(doomed);
  }

  // The invalidation connection is subscribed (true) or gone (false). Both
  // flush: what was read while nobody listened may be stale.
  void set_live(bool live) {
    Handles doomed;
    std::lock_guard lk(mu_);
    flush_locked(doomed);
    live_ = live;
  }

  // Ends every lingering window of the process (flush()): the handles go,
  // their releases are queued.
  static void end_lingering_everywhere() noexcept;

  // The release queue's thread, once a window may have passed: drops the
  // lingering handles whose window has; returns the next deadline.
  static Clock::time_point expire_all(Clock::time_point now) noexcept;

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
    return static_cast<std::size_t>(std::count_if(
        by_name_.begin(), by_name_.end(), [](const auto& e) { return e.second.share && e.second.share->lingering; }));
  }
  // Records kept for the acquire script's shortcut (for tests).
  std::size_t records() const {
    std::lock_guard lk(mu_);
    return records_;
  }

 private:
  struct Directory {
    std::mutex mu;  // taken before a table's mu_, never after
    std::vector<Holdings*> tables;
  };
  static Directory& directory() {
    static Directory d;  // process-wide: a remove drops the name from every registry's table of the process
    return d;
  }

  using Share = HoldingsShare;
  using Entry = HoldingsEntry;
  using Map = std::unordered_map<std::string, Entry, NameHash, std::equal_to<>>;

  // The deleter of a wrapper: its last copy gives the real handle back.
  struct LastCopy {
    Holdings* table;  // alive while `real` is: the handle holds the core that
                      // owns the table
    std::shared_ptr<TensorHandle> real;
    std::uint64_t gen;
    void operator()(TensorHandle*) noexcept { table->on_last_copy(std::move(real), gen); }
  };

  // A wrapper of `real` (its copies are what users hold), remembered as the
  // share's handle when the share still stands for this generation. No
  // lock held: if making the wrapper throws, its deleter runs (on_last_copy).
  std::shared_ptr<TensorHandle> hand_out(std::shared_ptr<TensorHandle> real, const std::string& name,
                                         std::uint64_t gen);

  // The last copy of a wrapper went (any thread, a destructor's: no I/O).
  void on_last_copy(std::shared_ptr<TensorHandle> real, std::uint64_t gen) noexcept;

  Share* share_of(std::uint64_t gen) {
    auto g = by_gen_.find(gen);
    if (g == by_gen_.end()) return nullptr;
    auto it = by_name_.find(g->second);
    if (it == by_name_.end() || !it->second.share || it->second.share->gen != gen) return nullptr;
    return &*it->second.share;
  }

  // Records are few and cheap to read again: past kMaxRecords all go.
  void keep_record(Map::iterator it, Record r) {
    if (!it->second.record && ++records_ > kMaxRecords) {
      for (auto i = by_name_.begin(); i != by_name_.end();) {
        if (i != it) {
          drop_record(i->second);
          if (i->second.empty()) {
            i = by_name_.erase(i);
            continue;
          }
        }
        ++i;
      }
    }
    it->second.record = std::move(r);
  }
  void drop_record(Entry& e) noexcept {
    if (e.record) --records_;
    e.record.reset();
  }

  void clear_share(Entry& e, Handles& doomed) {
    if (!e.share) return;
    if (e.share->lingering) doomed.push_back(std::move(e.share->lingering));
    by_gen_.erase(e.share->gen);
    e.share.reset();
  }
  // Drops the share of `it` and the entry itself when nothing is left.
  void drop_share(Map::iterator it, Handles& doomed) {
    clear_share(it->second, doomed);
    if (it->second.empty()) by_name_.erase(it);
  }

  void forget_name_locked(std::string_view name, Handles& doomed) {
    log_.name(name);
    if (auto it = by_name_.find(name); it != by_name_.end()) {
      drop_record(it->second);
      drop_share(it, doomed);
    }
  }

  void flush_locked(Handles& doomed) {
    log_.all();
    ++stats_.flushes;
    for (auto it = by_name_.begin(); it != by_name_.end();) {
      clear_share(it->second, doomed);
      drop_record(it->second);
      it = it->second.empty() ? by_name_.erase(it) : std::next(it);
    }
    by_gen_.clear();
    expiry_.clear();
  }

  void end_lingering_locked(Handles& doomed);

  // Windows end in the order they began (one linger for all): pops the
  // passed ones; a handle taken back and lingering again has a later entry.
  Clock::time_point expire_locked(Clock::time_point now, Handles& doomed);

  // Drops shares whose handles are gone (not lingering); bounds the table
  // by what is held.
  void sweep() {
    Handles none;  // only expired, not lingering: nothing to drop
    for (auto it = by_name_.begin(); it != by_name_.end();) {
      if (it->second.share && it->second.share->handle.expired() && !it->second.share->lingering)
        clear_share(it->second, none);
      it = it->second.empty() ? by_name_.erase(it) : std::next(it);
    }
    next_sweep_ = std::max<std::size_t>(kMinSweep, 2 * by_name_.size());
  }

  static constexpr std::size_t kMinSweep = 256;
  static constexpr std::size_t kMaxRecords = 4096;

  const std::string prefix_;  // the registry's key prefix (its namespace)
  mutable std::mutex mu_;     // leaf but for Directory::mu (taken first): guards
                              // everything below
  bool live_ = false;
  std::chrono::microseconds linger_{0};
  InvalidationLog log_;
  Map by_name_;
  std::unordered_map<std::uint64_t, std::string> by_gen_;           // a share's generation -> its name
  std::deque<std::pair<Clock::time_point, std::uint64_t>> expiry_;  // (window end, generation), in order
  std::size_t next_sweep_ = kMinSweep;
  std::size_t records_ = 0;
  Stats stats_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

#include "memcuda/detail/registry/get/holdings_linger.hpp"
