// Free-range bookkeeping for the slab pool of the allocator of record, which
// publishes a tensor as (slab id, offset): which byte ranges of which slabs
// are free. It makes no CUDA calls, touches no memory and does no I/O, so it
// is exact and testable without a GPU.
//
// Layout: every slab is tiled by an ordered map offset -> Range, each range
// either live (one allocated block) or free, with no two free ranges adjacent
// (freeing coalesces at once). All free ranges of all slabs also sit in one
// std::set ordered by (size, slab id, offset); best fit is one lower_bound, and
// the largest free range is the set's last element. A free Range keeps the
// iterator of its set entry, so coalescing never searches the set, and set
// nodes are re-keyed through extract()/insert() so that the hot path allocates
// at most one node per call.
//
// Why not size classes: the pool's blocks are tensors whose sizes are arbitrary
// and mostly large; classes would either waste up to a class width per tensor
// or need a best-fit structure inside each class anyway, and they make
// "largest free contiguous range" and exact coalescing harder to state.
#pragma once

#include "memcuda/config.hpp"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "memcuda/detail/pool/block_types.hpp"
#include "memcuda/error.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// Best-fit suballocator over a set of slabs.
//
// Not thread-safe: the owner (the pool of the allocator of record) serialises
// every call, including the const ones, under its own lock.
//
// Move-only: the internal indexes point into each other, so a member-wise copy
// would alias the source. A moved-from allocator is empty (no slabs, zero
// counters) and keeps its alignment.
//
// Errors: calls with arguments that do not describe this allocator's state
// (unknown slab, double free, a block it never returned...) throw
// InvalidArgument and change nothing. InternalError means the bookkeeping
// itself is inconsistent, which is a bug.
class BlockAllocator {
 public:
  // Throws InvalidArgument unless options.alignment is a power of two >= 256.
  explicit BlockAllocator(BlockAllocatorOptions options = {}) : alignment_(options.alignment) {
    MEMCUDA_EXPECTS(options.alignment >= 256 && std::has_single_bit(options.alignment),
                    InvalidArgument,
                    "BlockAllocator: alignment " + std::to_string(options.alignment) +
                        " is not a power of two >= 256: use 256 or a larger power of two");
  }

  BlockAllocator(const BlockAllocator&) = delete;
  BlockAllocator& operator=(const BlockAllocator&) = delete;

  BlockAllocator(BlockAllocator&& other) noexcept
      : alignment_(other.alignment_),
        slabs_(std::move(other.slabs_)),
        free_(std::move(other.free_)),
        counters_(std::exchange(other.counters_, {})) {
    other.slabs_.clear();
    other.free_.clear();
  }

  BlockAllocator& operator=(BlockAllocator&& other) noexcept {
    if (this != &other) {
      free_ = std::move(other.free_);
      slabs_ = std::move(other.slabs_);
      alignment_ = other.alignment_;
      counters_ = std::exchange(other.counters_, {});
      other.free_.clear();
      other.slabs_.clear();
    }
    return *this;
  }

  ~BlockAllocator() = default;

  // Adds a slab of `size` bytes, entirely free. The id is the caller's (the
  // pool publishes it with every tensor); the allocator never invents one.
  // Throws InvalidArgument if the id is already present, if size is zero or
  // not a multiple of the alignment (the pool sizes its slabs, so a ragged
  // tail would be a pool bug), or if reserved bytes would overflow.
  void add_slab(std::uint64_t slab_id, std::uint64_t size) {
    MEMCUDA_EXPECTS(!slabs_.contains(slab_id), InvalidArgument,
                    "add_slab(" + std::to_string(slab_id) + ", " + std::to_string(size) +
                        "): slab " + std::to_string(slab_id) +
                        " is already in this pool: use a fresh id");
    MEMCUDA_EXPECTS(size != 0 && size % alignment_ == 0, InvalidArgument,
                    "add_slab(" + std::to_string(slab_id) + ", " + std::to_string(size) +
                        "): size must be a non-zero multiple of the alignment " +
                        std::to_string(alignment_) + ": round the slab size up");
    MEMCUDA_EXPECTS(size <= std::numeric_limits<std::uint64_t>::max() - counters_.reserved,
                    InvalidArgument,
                    "add_slab(" + std::to_string(slab_id) + ", " + std::to_string(size) +
                        "): total reserved bytes would overflow 64 bits");

    auto sit = slabs_.try_emplace(slab_id).first;
    Slab& slab = sit->second;
    try {
      slab.id = slab_id;
      slab.size = size;
      auto rit = slab.ranges.emplace(0, Range{size, 0, {}, false}).first;
      rit->second.free_it = free_.insert(FreeKey{size, slab_id, 0, &slab}).first;
    } catch (...) {
      slabs_.erase(sit);  // a failed add leaves no half-made slab behind
      throw;
    }
    counters_.reserved += size;
    ++counters_.slabs;
  }

  // Reserves the smallest free range that holds `bytes` rounded up to the
  // alignment (bytes == 0 takes one alignment unit), from its start. Ties go to
  // the lowest slab id, then the lowest offset, which keeps high-id slabs
  // emptier and so more often returnable through empty_slabs(). Returns
  // nullopt, changing nothing, when no free range is large enough; the pool
  // then adds a slab. Only std::bad_alloc can escape (strong guarantee).
  std::optional<Block> allocate(std::uint64_t bytes) {
    const std::uint64_t mask = alignment_ - 1;
    if (bytes > std::numeric_limits<std::uint64_t>::max() - mask) return std::nullopt;
    const std::uint64_t want = bytes == 0 ? alignment_ : (bytes + mask) & ~mask;

    auto fit = free_.lower_bound(FreeKey{want, 0, 0, nullptr});
    if (fit == free_.end()) return std::nullopt;
    return take(fit, want, bytes);
  }

  // Like allocate(), but only from slab `slab_id` (its first free range
  // that fits): the pool reuses an empty dedicated slab this way. nullopt
  // when the slab is unknown or has no room.
  std::optional<Block> allocate_in(std::uint64_t slab_id, std::uint64_t bytes) {
    const std::uint64_t mask = alignment_ - 1;
    if (bytes > std::numeric_limits<std::uint64_t>::max() - mask) return std::nullopt;
    const std::uint64_t want = bytes == 0 ? alignment_ : (bytes + mask) & ~mask;
    auto sit = slabs_.find(slab_id);
    if (sit == slabs_.end()) return std::nullopt;
    for (auto& [off, r] : sit->second.ranges)
      if (!r.live && r.size >= want) return take(r.free_it, want, bytes);
    return std::nullopt;
  }

  // Reserves exactly [offset, offset + rounded bytes) of slab `slab_id`: the
  // pool adopts a dead exporter's slab this way, claiming the blocks its
  // records already use. nullopt, changing nothing, when the slab is unknown,
  // `offset` is not aligned or the range is not entirely free.
  std::optional<Block> allocate_at(std::uint64_t slab_id, std::uint64_t offset, std::uint64_t bytes) {
    const std::uint64_t mask = alignment_ - 1;
    if (bytes > std::numeric_limits<std::uint64_t>::max() - mask || (offset & mask) != 0) return std::nullopt;
    const std::uint64_t want = bytes == 0 ? alignment_ : (bytes + mask) & ~mask;
    auto sit = slabs_.find(slab_id);
    if (sit == slabs_.end()) return std::nullopt;
    Slab& slab = sit->second;
    if (offset >= slab.size || want > slab.size - offset) return std::nullopt;
    auto rit = std::prev(slab.ranges.upper_bound(offset));  // offset < size: exists
    const std::uint64_t start = rit->first, have = rit->second.size;
    if (rit->second.live || offset + want > start + have) return std::nullopt;
    if (start == offset) return take(rit->second.free_it, want, bytes);
    // Split off the head [start, offset), which stays free; the rest becomes
    // a free range of its own that take() carves from its start. The map
    // node is made first, so a bad_alloc changes nothing.
    auto mid = slab.ranges.emplace_hint(std::next(rit), offset, Range{start + have - offset, 0, {}, false});
    FreeSet::node_type node;
    try {
      mid->second.free_it = free_.insert(FreeKey{start + have - offset, slab.id, offset, &slab}).first;
    } catch (...) {
      slab.ranges.erase(mid);
      throw;
    }
    node = free_.extract(rit->second.free_it);
    node.value().size = offset - start;
    rit->second.size = offset - start;
    rit->second.free_it = free_.insert(std::move(node)).position;
    return take(mid->second.free_it, want, bytes);
  }

 private:
  // Carves `want` bytes from the start of the free range `fit`.
  template <class FreeIt>  // FreeSet::iterator (declared below)
  Block take(FreeIt fit, std::uint64_t want, std::uint64_t bytes) {
    Slab& slab = *fit->slab;
    const std::uint64_t offset = fit->offset;
    const std::uint64_t have = fit->size;
    auto rit = slab.ranges.find(offset);
    if (rit == slab.ranges.end() || rit->second.live || rit->second.size != have ||
        rit->second.free_it != fit)
      throw InternalError("BlockAllocator::allocate: free index entry (slab " +
                          std::to_string(slab.id) + ", offset " + std::to_string(offset) +
                          ", size " + std::to_string(have) +
                          ") has no matching free range in its slab");

    if (have > want) {
      // Split: the tail stays free. The map node is the only allocation, made
      // before anything changes; the set node is re-keyed in place.
      auto tail = slab.ranges.emplace_hint(std::next(rit), offset + want,
                                           Range{have - want, 0, {}, false});
      auto node = free_.extract(fit);
      node.value().size = have - want;
      node.value().offset = offset + want;
      tail->second.free_it = free_.insert(std::move(node)).position;
    } else {
      free_.erase(fit);
    }
    Range& r = rit->second;
    r.size = want;
    r.requested = bytes;
    r.live = true;
    r.free_it = {};
    ++slab.live_blocks;

    counters_.in_use += want;
    counters_.requested += bytes;
    counters_.peak_in_use = std::max(counters_.peak_in_use, counters_.in_use);
    ++counters_.allocations;
    return Block{slab.id, offset, want};
  }

 public:

  // Returns a block from allocate() and merges it with free neighbours.
  // Throws InvalidArgument, changing nothing, when the block is not a live
  // block of this allocator: unknown slab, offset outside the slab or not at
  // a block start, already free (double free), or a size other than the one
  // allocate() returned. A stale Block whose range was since handed out again
  // with the same offset and size cannot be told from the new one; the pool
  // must free each block once (it keys them by tensor record).
  void deallocate(const Block& b) {
    auto [sp, rit] = live_block(b);
    Slab& slab = *sp;
    Range& r = rit->second;
    const std::uint64_t freed = r.size;
    const std::uint64_t freed_requested = r.requested;
    auto next = std::next(rit);
    const bool merge_next = next != slab.ranges.end() && !next->second.live;
    const bool merge_prev = rit != slab.ranges.begin() && !std::prev(rit)->second.live;

    if (!merge_next && !merge_prev) {
      // The one case that needs a new set node; take it before changing state.
      auto [pos, inserted] = free_.insert(FreeKey{freed, slab.id, rit->first, &slab});
      if (!inserted)
        throw InternalError("BlockAllocator::deallocate: free index already holds " +
                            describe_range(rit->first, freed) + " of slab " +
                            std::to_string(slab.id));
      r.live = false;
      r.requested = 0;
      r.free_it = pos;
    } else {
      // Reuse a neighbour's set node for the merged range.
      auto survivor = merge_prev ? std::prev(rit) : rit;
      std::uint64_t merged = freed;
      FreeSet::node_type node;
      if (merge_prev) {
        merged += survivor->second.size;
        node = free_.extract(survivor->second.free_it);
      }
      if (merge_next) {
        merged += next->second.size;
        if (node.empty())
          node = free_.extract(next->second.free_it);
        else
          free_.erase(next->second.free_it);
        slab.ranges.erase(next);
      }
      if (merge_prev) slab.ranges.erase(rit);
      Range& s = survivor->second;
      s.size = merged;
      s.requested = 0;
      s.live = false;
      node.value().size = merged;
      node.value().offset = survivor->first;
      s.free_it = free_.insert(std::move(node)).position;
    }
    --slab.live_blocks;

    counters_.in_use -= freed;
    counters_.requested -= freed_requested;
    ++counters_.frees;
  }

  // True when the slab holds no live block. Throws InvalidArgument for an
  // unknown id.
  bool slab_empty(std::uint64_t slab_id) const { return find_slab(slab_id, "slab_empty").live_blocks == 0; }

  // Ids of the slabs with no live block, ascending: the ones the pool may
  // give back to its upstream resource.
  std::vector<std::uint64_t> empty_slabs() const {
    std::vector<std::uint64_t> ids;
    for (const auto& [id, slab] : slabs_)
      if (slab.live_blocks == 0) ids.push_back(id);
    return ids;
  }

  // Forgets an empty slab, so the pool can release its memory. Throws
  // InvalidArgument, changing nothing, for an unknown id or a slab that still
  // holds live blocks (freeing its memory would pull it from under tensors).
  void remove_slab(std::uint64_t slab_id) {
    auto sit = slabs_.find(slab_id);
    MEMCUDA_EXPECTS(sit != slabs_.end(), InvalidArgument,
                    "remove_slab(" + std::to_string(slab_id) + "): no such slab in this pool");
    Slab& slab = sit->second;
    MEMCUDA_EXPECTS(slab.live_blocks == 0, InvalidArgument,
                    "remove_slab(" + std::to_string(slab_id) + "): slab still holds " +
                        std::to_string(slab.live_blocks) +
                        " live block(s): free them first (see empty_slabs())");
    if (slab.ranges.size() != 1 || slab.ranges.begin()->second.live ||
        slab.ranges.begin()->second.size != slab.size)
      throw InternalError("BlockAllocator::remove_slab(" + std::to_string(slab_id) +
                          "): slab has no live block but is not one free range");
    free_.erase(slab.ranges.begin()->second.free_it);
    counters_.reserved -= slab.size;
    --counters_.slabs;
    slabs_.erase(sit);
  }

  // O(1).
  PoolCounters counters() const noexcept {
    PoolCounters c = counters_;
    c.largest_free = free_.empty() ? 0 : free_.rbegin()->size;
    return c;
  }

  // Starts a new peak window: peak_in_use := in_use.
  void reset_peak() noexcept { counters_.peak_in_use = counters_.in_use; }

  // Size given to add_slab(). Throws InvalidArgument for an unknown id.
  std::uint64_t slab_size(std::uint64_t slab_id) const { return find_slab(slab_id, "slab_size").size; }

  // --- additions to the pool's API ---

  bool has_slab(std::uint64_t slab_id) const noexcept { return slabs_.contains(slab_id); }

  std::uint64_t alignment() const noexcept { return alignment_; }

  // Number of free ranges over all slabs (1 per empty slab when nothing is
  // fragmented); with counters() it gives the pool's fragmentation figure.
  std::size_t free_range_count() const noexcept { return free_.size(); }

  // Number of live blocks in one slab. Throws InvalidArgument for an unknown id.
  std::uint64_t live_blocks(std::uint64_t slab_id) const {
    return find_slab(slab_id, "live_blocks").live_blocks;
  }

  // The free ranges of one slab by ascending offset (never two adjacent ones).
  // O(ranges in the slab); for tests and diagnostics. Throws InvalidArgument
  // for an unknown id.
  std::vector<FreeRange> free_ranges(std::uint64_t slab_id) const {
    std::vector<FreeRange> out;
    for (const auto& [off, r] : find_slab(slab_id, "free_ranges").ranges)
      if (!r.live) out.push_back(FreeRange{off, r.size});
    return out;
  }

  // Checks every invariant of the bookkeeping in O(n): each slab exactly tiled
  // by aligned ranges, free ranges fully coalesced and indexed once, counters
  // equal to what the ranges say. Throws InternalError naming the first
  // violation. For tests and diagnostics, not the hot path; defined in
  // block_allocator_invariants.hpp.
  void validate() const;

 private:
  struct Slab;

  struct FreeKey {
    std::uint64_t size;
    std::uint64_t slab_id;
    std::uint64_t offset;
    Slab* slab;  // not part of the order; slabs_ never moves its nodes
  };
  struct FreeKeyLess {
    bool operator()(const FreeKey& a, const FreeKey& b) const noexcept {
      if (a.size != b.size) return a.size < b.size;
      if (a.slab_id != b.slab_id) return a.slab_id < b.slab_id;
      return a.offset < b.offset;
    }
  };
  using FreeSet = std::set<FreeKey, FreeKeyLess>;

  struct Range {
    std::uint64_t size;
    std::uint64_t requested;    // bytes asked for; 0 when free
    FreeSet::iterator free_it;  // valid only when !live
    bool live;
  };

  struct Slab {
    std::uint64_t id = 0;
    std::uint64_t size = 0;
    std::uint64_t live_blocks = 0;
    std::map<std::uint64_t, Range> ranges;  // offset -> range; tiles [0, size)
  };

  const Slab& find_slab(std::uint64_t slab_id, const char* op) const {
    auto it = slabs_.find(slab_id);
    MEMCUDA_EXPECTS(it != slabs_.end(), InvalidArgument,
                    std::string(op) + "(" + std::to_string(slab_id) +
                        "): no such slab in this pool");
    return it->second;
  }

  static std::string describe_range(std::uint64_t offset, std::uint64_t size) {
    return "[" + std::to_string(offset) + ", " + std::to_string(offset + size) + ")";
  }

  // The slab and range of `b`, a live block of this allocator; bad_free
  // (InvalidArgument, nothing changed) when it is not one.
  std::pair<Slab*, std::map<std::uint64_t, Range>::iterator> live_block(const Block& b) {
    auto sit = slabs_.find(b.slab_id);
    if (sit == slabs_.end())
      bad_free(b, "no slab " + std::to_string(b.slab_id) +
                      " in this pool (never added, or removed): the block is not from this "
                      "allocator");
    Slab& slab = sit->second;
    if (b.offset >= slab.size)
      bad_free(b, "offset is past the end of slab " + std::to_string(slab.id) + " (size " +
                      std::to_string(slab.size) + "): the block is not from this allocator");

    auto rit = slab.ranges.find(b.offset);
    if (rit == slab.ranges.end()) {
      auto in = std::prev(slab.ranges.upper_bound(b.offset));  // offset < size: exists
      bad_free(b, std::string("offset falls inside the ") +
                      (in->second.live ? "live block " : "free range ") +
                      describe_range(in->first, in->second.size) +
                      (in->second.live ? ": not a block start, the block is not from this "
                                         "allocator"
                                       : ": double free, or a block not from this allocator"));
    }
    const Range& r = rit->second;
    if (!r.live)
      bad_free(b, "the range " + describe_range(rit->first, r.size) +
                      " at this offset is already free: double free");
    if (r.size != b.size)
      bad_free(b, "the live block at this offset has size " + std::to_string(r.size) +
                      ": pass the Block that allocate() returned");
    return {&slab, rit};
  }

  [[noreturn]] static void bad_free(const Block& b, const std::string& why) {
    throw InvalidArgument("deallocate(slab " + std::to_string(b.slab_id) + ", offset " +
                          std::to_string(b.offset) + ", size " + std::to_string(b.size) +
                          "): " + why);
  }

  [[noreturn]] static void broken(const std::string& what) {
    throw InternalError("BlockAllocator invariant broken: " + what);
  }

  std::uint64_t alignment_;
  std::map<std::uint64_t, Slab> slabs_;  // ordered: empty_slabs() is sorted
  FreeSet free_;
  PoolCounters counters_;  // largest_free is derived in counters()
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

// validate(), which needs the whole class.
#include "memcuda/detail/pool/block_allocator_invariants.hpp"  // IWYU pragma: export
