// BlockAllocator::validate(): the invariants of the slab pool's free-range
// bookkeeping (block_allocator.hpp), written out as one O(n) check. Kept apart
// from the allocator because it states what every call there must preserve
// and is part of none of them: the tests run it after their steps, and
// nothing on the allocation path does.
//
// Part of block_allocator.hpp, which includes this file; include that one.
#pragma once

#include <cstdint>
#include <string>

#include "memcuda/detail/pool/block_allocator.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

inline void BlockAllocator::validate() const {
  std::uint64_t reserved = 0, in_use = 0, requested = 0, free_count = 0;
  for (const auto& [id, slab] : slabs_) {
    const std::string where = "slab " + std::to_string(id) + ": ";
    if (slab.id != id) broken(where + "stored id " + std::to_string(slab.id));
    if (slab.size == 0 || slab.size % alignment_ != 0) broken(where + "bad size");
    std::uint64_t expect = 0, live = 0;
    bool prev_free = false;
    for (const auto& [off, r] : slab.ranges) {
      const std::string at = where + "range " + describe_range(off, r.size) + ": ";
      if (off != expect) broken(at + "does not start where the previous range ends (" +
                                std::to_string(expect) + ")");
      if (r.size == 0 || r.size % alignment_ != 0 || off % alignment_ != 0)
        broken(at + "not aligned to " + std::to_string(alignment_));
      if (r.size > slab.size - off) broken(at + "runs past the slab end");
      expect = off + r.size;
      if (r.live) {
        ++live;
        in_use += r.size;
        requested += r.requested;
        if (r.requested > r.size) broken(at + "requested exceeds size");
        prev_free = false;
      } else {
        if (prev_free) broken(at + "free range next to a free range (not coalesced)");
        if (r.requested != 0) broken(at + "free range with requested bytes");
        const FreeKey& k = *r.free_it;
        if (k.size != r.size || k.offset != off || k.slab_id != id || k.slab != &slab)
          broken(at + "free index entry does not match");
        ++free_count;
        prev_free = true;
      }
    }
    if (expect != slab.size) broken(where + "ranges end at " + std::to_string(expect));
    if (live != slab.live_blocks) broken(where + "live block count");
    reserved += slab.size;
  }
  if (free_count != free_.size()) broken("free index holds entries of no range");
  if (reserved != counters_.reserved) broken("reserved counter");
  if (in_use != counters_.in_use) broken("in_use counter");
  if (requested != counters_.requested) broken("requested counter");
  if (slabs_.size() != counters_.slabs) broken("slabs counter");
  if (counters_.peak_in_use < counters_.in_use) broken("peak below in_use");
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
