// The values that cross BlockAllocator's interface (block_allocator.hpp): its
// options, the Block that allocate() hands out and deallocate() takes back, and
// what it reports (FreeRange, PoolCounters). Plain data, apart from the
// allocator's machinery: DevicePool keeps a Block per tensor and passes the
// counters on to the pool's statistics.
#pragma once

#include "memcuda/config.hpp"

#include <cstddef>
#include <cstdint>

MEMCUDA_NAMESPACE_BEGIN namespace detail {

struct BlockAllocatorOptions {
  // Every offset and every block size is a multiple of this. A power of two,
  // at least 256 (cudaMalloc's own alignment, so a tensor placed at an offset
  // of a slab keeps the alignment it would have had with its own cudaMalloc).
  std::size_t alignment = 256;
};

// One allocated block: `size` is the rounded size that allocate() reserved,
// not the number of bytes asked for. Pass it back to deallocate() unchanged.
struct Block {
  std::uint64_t slab_id = 0;
  std::uint64_t offset = 0;
  std::uint64_t size = 0;

  friend bool operator==(const Block&, const Block&) = default;
};

// A free byte range of one slab, as free_ranges() reports it.
struct FreeRange {
  std::uint64_t offset = 0;
  std::uint64_t size = 0;

  friend bool operator==(const FreeRange&, const FreeRange&) = default;
};

struct PoolCounters {
  std::uint64_t reserved = 0;      // sum of slab sizes
  std::uint64_t in_use = 0;        // sum of allocated (rounded) block sizes
  std::uint64_t requested = 0;     // sum of requested (unrounded) sizes of live blocks
  std::uint64_t peak_in_use = 0;   // highest in_use since construction or reset_peak()
  std::uint64_t slabs = 0;         // slabs currently added
  std::uint64_t allocations = 0;   // total allocate() successes
  std::uint64_t frees = 0;         // total successful deallocate() calls
  std::uint64_t largest_free = 0;  // largest free contiguous range in any slab

  friend bool operator==(const PoolCounters&, const PoolCounters&) = default;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
