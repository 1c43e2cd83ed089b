#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "memcuda/detail/pool/block_allocator.hpp"
#include "memcuda/memory_resource.hpp"

using memcuda::InvalidArgument;
using memcuda::detail::Block;
using memcuda::detail::BlockAllocator;
using memcuda::detail::BlockAllocatorOptions;
using memcuda::detail::FreeRange;
using memcuda::detail::PoolCounters;

namespace {

constexpr std::uint64_t KiB = 1024;
constexpr std::uint64_t MiB = 1024 * KiB;
using Sizes = std::initializer_list<std::uint64_t>;

Block must_allocate(BlockAllocator& a, std::uint64_t bytes) {
  auto b = a.allocate(bytes);
  REQUIRE(b.has_value());
  return *b;
}

// Reference model: live blocks per slab in an ordered map; free space is what
// lies between them, so it is coalesced by construction. Best fit is found by
// walking every gap of every slab.
class Model {
 public:
  struct Live {
    std::uint64_t size;
    std::uint64_t requested;
  };
  struct Slab {
    std::uint64_t size;
    std::map<std::uint64_t, Live> live;
  };

  explicit Model(std::uint64_t alignment) : alignment_(alignment) {}

  void add_slab(std::uint64_t id, std::uint64_t size) {
    slabs_[id] = Slab{size, {}};
    c_.reserved += size;
    ++c_.slabs;
  }

  std::uint64_t round(std::uint64_t bytes) const {
    return bytes == 0 ? alignment_ : (bytes + alignment_ - 1) / alignment_ * alignment_;
  }

  std::vector<FreeRange> gaps(std::uint64_t id) const {
    std::vector<FreeRange> out;
    const Slab& s = slabs_.at(id);
    std::uint64_t at = 0;
    for (const auto& [off, l] : s.live) {
      if (off > at) out.push_back(FreeRange{at, off - at});
      at = off + l.size;
    }
    if (at < s.size) out.push_back(FreeRange{at, s.size - at});
    return out;
  }

  // The block best fit must return, or nullopt.
  std::optional<Block> predict(std::uint64_t bytes) const {
    const std::uint64_t want = round(bytes);
    std::optional<Block> best;
    std::uint64_t best_gap = 0;
    for (const auto& [id, s] : slabs_)
      for (const FreeRange& g : gaps(id))
        if (g.size >= want && (!best || g.size < best_gap)) {
          best = Block{id, g.offset, want};
          best_gap = g.size;
        }
    return best;
  }

  // Records an allocation; checks it lies inside its slab and overlaps nothing.
  void allocate(const Block& b, std::uint64_t requested) {
    Slab& s = slabs_.at(b.slab_id);
    REQUIRE(b.offset % alignment_ == 0);
    REQUIRE(b.size % alignment_ == 0);
    REQUIRE(b.size >= requested);
    REQUIRE(b.offset < s.size);
    REQUIRE(b.size <= s.size - b.offset);
    auto next = s.live.lower_bound(b.offset);
    if (next != s.live.end()) REQUIRE(b.offset + b.size <= next->first);
    if (next != s.live.begin()) {
      auto prev = std::prev(next);
      REQUIRE(prev->first + prev->second.size <= b.offset);
    }
    s.live.emplace(b.offset, Live{b.size, requested});
    c_.in_use += b.size;
    c_.requested += requested;
    c_.peak_in_use = std::max(c_.peak_in_use, c_.in_use);
    ++c_.allocations;
  }

  bool is_live(const Block& b) const {
    auto sit = slabs_.find(b.slab_id);
    if (sit == slabs_.end()) return false;
    auto it = sit->second.live.find(b.offset);
    return it != sit->second.live.end() && it->second.size == b.size;
  }

  void deallocate(const Block& b) {
    auto& live = slabs_.at(b.slab_id).live;
    auto it = live.find(b.offset);
    REQUIRE(it != live.end());
    c_.in_use -= it->second.size;
    c_.requested -= it->second.requested;
    ++c_.frees;
    live.erase(it);
  }

  PoolCounters counters() const {
    PoolCounters c = c_;
    c.largest_free = 0;
    for (const auto& [id, s] : slabs_)
      for (const FreeRange& g : gaps(id)) c.largest_free = std::max(c.largest_free, g.size);
    return c;
  }

  std::size_t gap_count() const {
    std::size_t n = 0;
    for (const auto& [id, s] : slabs_) n += gaps(id).size();
    return n;
  }

  const std::map<std::uint64_t, Slab>& slabs() const { return slabs_; }

 private:
  std::uint64_t alignment_;
  std::map<std::uint64_t, Slab> slabs_;
  PoolCounters c_;
};

// Sizes from 1 B to 4 MiB: half log-uniform (many small tensors), half
// uniform (mostly large ones), a few exact multiples and zeros.
std::uint64_t random_size(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> kind(0, 99);
  const int k = kind(rng);
  if (k < 2) return 0;
  if (k < 7) return std::uniform_int_distribution<std::uint64_t>(1, 16 * KiB)(rng) * 256;
  if (k < 53) {
    const int bits = std::uniform_int_distribution<int>(0, 21)(rng);
    return std::uniform_int_distribution<std::uint64_t>(std::uint64_t{1} << bits,
                                                        std::uint64_t{1} << (bits + 1))(rng);
  }
  return std::uniform_int_distribution<std::uint64_t>(1, 4 * MiB)(rng);
}

class CountingResource : public memcuda::DeviceMemoryResource {
 public:
  int allocs = 0, frees = 0;
  std::size_t last_bytes = 0;
  int last_device = -1;
  void* last_ptr = nullptr;
  alignas(256) unsigned char arena[512];

 private:
  void* do_allocate(std::size_t bytes, int device) override {
    ++allocs;
    last_bytes = bytes;
    last_device = device;
    return arena;
  }
  void do_deallocate(void* p, std::size_t bytes, int device) noexcept override {
    ++frees;
    last_ptr = p;
    last_bytes = bytes;
    last_device = device;
  }
};

}  // namespace

TEST_CASE("block allocator rejects bad options and bad slabs", "[pool]") {
  for (std::size_t bad : {std::size_t{0}, std::size_t{1}, std::size_t{128}, std::size_t{300},
                          std::size_t{768}})
    CHECK_THROWS_AS(BlockAllocator(BlockAllocatorOptions{bad}), InvalidArgument);
  CHECK(BlockAllocator(BlockAllocatorOptions{4096}).alignment() == 4096);

  BlockAllocator a;
  CHECK_THROWS_AS(a.add_slab(1, 0), InvalidArgument);
  CHECK_THROWS_AS(a.add_slab(1, 1000), InvalidArgument);
  a.add_slab(1, 1 * MiB);
  CHECK_THROWS_AS(a.add_slab(1, 2 * MiB), InvalidArgument);
  CHECK_THROWS_AS(a.add_slab(2, std::numeric_limits<std::uint64_t>::max() / 256 * 256),
                  InvalidArgument);
  CHECK_FALSE(a.has_slab(2));
  CHECK(a.counters().slabs == 1);
  CHECK(a.counters().reserved == 1 * MiB);
  CHECK(a.slab_size(1) == 1 * MiB);
  CHECK_THROWS_AS(a.slab_size(9), InvalidArgument);
  CHECK_THROWS_AS(a.slab_empty(9), InvalidArgument);
  CHECK_THROWS_AS(a.free_ranges(9), InvalidArgument);
  a.validate();
}

TEST_CASE("a fresh slab returns to one free range after alloc and free", "[pool]") {
  BlockAllocator a;
  a.add_slab(7, 64 * MiB);
  CHECK(a.counters().largest_free == 64 * MiB);
  CHECK(a.slab_empty(7));

  std::vector<Block> blocks;
  for (std::uint64_t bytes : Sizes{1, 1000, 3 * MiB + 5, 256, 0, 17 * KiB})
    blocks.push_back(must_allocate(a, bytes));
  CHECK_FALSE(a.slab_empty(7));
  CHECK(a.counters().largest_free < 64 * MiB);
  a.validate();

  // Free in an order that exercises every kind of merge.
  for (std::size_t i : {3u, 0u, 5u, 1u, 4u, 2u}) a.deallocate(blocks[i]);
  a.validate();
  CHECK(a.slab_empty(7));
  CHECK(a.free_ranges(7) == std::vector<FreeRange>{{0, 64 * MiB}});
  CHECK(a.free_range_count() == 1);
  const PoolCounters c = a.counters();
  CHECK(c.largest_free == 64 * MiB);
  CHECK(c.in_use == 0);
  CHECK(c.requested == 0);
}

TEST_CASE("every offset and size is a multiple of the alignment", "[pool]") {
  for (std::uint64_t align : Sizes{256, 4096, 2 * MiB}) {
    CAPTURE(align);
    BlockAllocator a(BlockAllocatorOptions{align});
    a.add_slab(0, 64 * MiB);
    std::vector<std::pair<std::uint64_t, Block>> got;
    for (std::uint64_t bytes : Sizes{0, 1, 255, 256, 257, 4095, 4096, 4097, MiB + 1, 2 * MiB})
      got.emplace_back(bytes, must_allocate(a, bytes));
    for (const auto& [bytes, b] : got) {
      CAPTURE(bytes, b.offset, b.size);
      CHECK(b.offset % align == 0);
      CHECK(b.size % align == 0);
      CHECK(b.size == (bytes == 0 ? align : (bytes + align - 1) / align * align));
    }
    a.validate();
  }

  BlockAllocator a;
  a.add_slab(0, 4 * KiB);
  const Block zero = must_allocate(a, 0);
  CHECK(zero == Block{0, 0, 256});
  CHECK(a.counters().in_use == 256);
  CHECK(a.counters().requested == 0);
}

TEST_CASE("freeing coalesces with the left, right and both neighbours", "[pool]") {
  BlockAllocator a;
  a.add_slab(0, 4 * KiB);
  // Four one-unit blocks at 0, 256, 512, 768; [1024, 4096) stays free.
  const Block b0 = must_allocate(a, 256), b1 = must_allocate(a, 256),
              b2 = must_allocate(a, 256), b3 = must_allocate(a, 256);
  REQUIRE(b0.offset == 0);
  REQUIRE(b1.offset == 256);
  REQUIRE(b2.offset == 512);
  REQUIRE(b3.offset == 768);
  REQUIRE(a.free_ranges(0) == std::vector<FreeRange>{{1024, 3072}});

  SECTION("left: the freed block joins the free range before it") {
    a.deallocate(b0);
    a.deallocate(b1);
    CHECK(a.free_ranges(0) == std::vector<FreeRange>{{0, 512}, {1024, 3072}});
  }
  SECTION("right: the freed block joins the free range after it") {
    a.deallocate(b2);
    a.deallocate(b1);
    CHECK(a.free_ranges(0) == std::vector<FreeRange>{{256, 512}, {1024, 3072}});
    a.deallocate(b3);  // joins [256,768) on the left and [1024,4096) on the right
    CHECK(a.free_ranges(0) == std::vector<FreeRange>{{256, 3840}});
  }
  SECTION("both: the freed block bridges two free ranges") {
    a.deallocate(b0);
    a.deallocate(b2);
    CHECK(a.free_ranges(0) == std::vector<FreeRange>{{0, 256}, {512, 256}, {1024, 3072}});
    a.deallocate(b1);
    CHECK(a.free_ranges(0) == std::vector<FreeRange>{{0, 768}, {1024, 3072}});
    CHECK(a.counters().largest_free == 3072);
  }
  SECTION("merged ranges are allocatable as one") {
    a.deallocate(b1);
    a.deallocate(b2);
    CHECK(must_allocate(a, 512) == Block{0, 256, 512});
  }
  a.validate();
  CHECK(a.free_range_count() == a.free_ranges(0).size());
}

TEST_CASE("best fit chooses the smallest fitting range", "[pool]") {
  BlockAllocator a;
  a.add_slab(0, 1 * MiB);
  // Holes of 3, 1 and 2 units separated by live blocks, then the large tail.
  std::vector<Block> keep, holes;
  for (std::uint64_t units : {3u, 1u, 2u}) {
    holes.push_back(must_allocate(a, units * 256));
    keep.push_back(must_allocate(a, 256));
  }
  for (const Block& h : holes) a.deallocate(h);
  REQUIRE(a.free_ranges(0) ==
          std::vector<FreeRange>{{0, 768}, {1024, 256}, {1536, 512}, {2304, 1 * MiB - 2304}});

  CHECK(must_allocate(a, 300) == Block{0, 1536, 512});  // the 2-unit hole, exactly
  CHECK(must_allocate(a, 1) == Block{0, 1024, 256});    // the 1-unit hole
  CHECK(must_allocate(a, 257) == Block{0, 0, 512});     // 3-unit hole is now the smallest
  CHECK(a.free_ranges(0) == std::vector<FreeRange>{{512, 256}, {2304, 1 * MiB - 2304}});
  CHECK(must_allocate(a, 200) == Block{0, 512, 256});
  a.validate();

  SECTION("across slabs the smaller fitting range wins") {
    BlockAllocator m;
    m.add_slab(1, 8 * MiB);
    m.add_slab(2, 1 * MiB);
    m.add_slab(3, 4 * MiB);
    CHECK(must_allocate(m, 1).slab_id == 2);
    CHECK(must_allocate(m, 2 * MiB).slab_id == 3);
    CHECK(must_allocate(m, 2 * MiB).slab_id == 3);
    CHECK(must_allocate(m, 1 * MiB).slab_id == 1);
    m.validate();
  }
  SECTION("ties go to the lowest slab id, then the lowest offset") {
    BlockAllocator m;
    m.add_slab(5, 4 * KiB);
    m.add_slab(2, 4 * KiB);
    CHECK(must_allocate(m, 1) == Block{2, 0, 256});
    // Slab 2's [256, 4096) is now smaller than slab 5's whole 4096: an exact
    // fit goes there, and the next block to the only range left.
    CHECK(must_allocate(m, 3840) == Block{2, 256, 3840});
    CHECK(must_allocate(m, 1) == Block{5, 0, 256});

    BlockAllocator s;
    s.add_slab(0, 4 * KiB);
    std::vector<Block> b;
    for (int i = 0; i < 16; ++i) b.push_back(must_allocate(s, 256));
    s.deallocate(b[12]);
    s.deallocate(b[3]);
    s.deallocate(b[8]);
    CHECK(must_allocate(s, 1) == Block{0, 3 * 256, 256});
    CHECK(must_allocate(s, 1) == Block{0, 8 * 256, 256});
  }
}

TEST_CASE("exhaustion returns nullopt and changes nothing", "[pool]") {
  BlockAllocator a;
  CHECK_FALSE(a.allocate(1).has_value());  // no slab at all

  a.add_slab(0, 1 * KiB);
  for (int i = 0; i < 4; ++i) must_allocate(a, 1);
  const PoolCounters full = a.counters();
  CHECK(full.largest_free == 0);
  CHECK_FALSE(a.allocate(0).has_value());
  CHECK_FALSE(a.allocate(1).has_value());
  CHECK(a.counters() == full);

  BlockAllocator b;
  b.add_slab(0, 1 * MiB);
  const PoolCounters empty = b.counters();
  CHECK_FALSE(b.allocate(1 * MiB + 1).has_value());
  CHECK_FALSE(b.allocate(std::numeric_limits<std::uint64_t>::max()).has_value());
  CHECK_FALSE(b.allocate(std::numeric_limits<std::uint64_t>::max() - 255).has_value());
  CHECK(b.counters() == empty);
  CHECK(must_allocate(b, 1 * MiB) == Block{0, 0, 1 * MiB});
  CHECK_FALSE(b.allocate(0).has_value());
  b.validate();
}

TEST_CASE("allocations spread over several slabs", "[pool]") {
  BlockAllocator a;
  a.add_slab(10, 1 * MiB);
  a.add_slab(20, 1 * MiB);
  a.add_slab(30, 1 * MiB);
  std::map<std::uint64_t, int> per_slab;
  std::vector<Block> blocks;
  for (int i = 0; i < 12; ++i) {
    blocks.push_back(must_allocate(a, 256 * KiB));
    ++per_slab[blocks.back().slab_id];
  }
  CHECK(per_slab == std::map<std::uint64_t, int>{{10, 4}, {20, 4}, {30, 4}});
  CHECK_FALSE(a.allocate(1).has_value());
  CHECK(a.counters().in_use == 3 * MiB);
  CHECK(a.live_blocks(20) == 4);
  for (const Block& b : blocks)
    if (b.slab_id == 20) a.deallocate(b);
  CHECK(a.slab_empty(20));
  CHECK(a.empty_slabs() == std::vector<std::uint64_t>{20});
  CHECK(must_allocate(a, 1 * MiB) == Block{20, 0, 1 * MiB});
  a.validate();
}

TEST_CASE("empty_slabs and remove_slab", "[pool]") {
  BlockAllocator a;
  a.add_slab(3, 1 * MiB);
  a.add_slab(1, 2 * MiB);
  a.add_slab(2, 1 * MiB);
  CHECK(a.empty_slabs() == std::vector<std::uint64_t>{1, 2, 3});

  const Block x = must_allocate(a, 1 * MiB);  // best fit: slab 2 (tie with 3, lower id)
  REQUIRE(x.slab_id == 2);
  CHECK(a.empty_slabs() == std::vector<std::uint64_t>{1, 3});
  const PoolCounters before = a.counters();
  CHECK_THROWS_AS(a.remove_slab(2), InvalidArgument);
  CHECK_THROWS_AS(a.remove_slab(99), InvalidArgument);
  CHECK(a.counters() == before);
  CHECK(a.has_slab(2));

  a.remove_slab(3);
  CHECK_FALSE(a.has_slab(3));
  PoolCounters c = a.counters();
  CHECK(c.slabs == 2);
  CHECK(c.reserved == 3 * MiB);
  CHECK(c.largest_free == 2 * MiB);
  CHECK(a.empty_slabs() == std::vector<std::uint64_t>{1});
  a.validate();

  a.deallocate(x);
  a.remove_slab(2);
  a.remove_slab(1);
  c = a.counters();
  CHECK(c.slabs == 0);
  CHECK(c.reserved == 0);
  CHECK(c.largest_free == 0);
  CHECK(a.empty_slabs().empty());
  CHECK_FALSE(a.allocate(1).has_value());
  CHECK_THROWS_AS(a.deallocate(x), InvalidArgument);  // its slab is gone
  a.validate();

  a.add_slab(3, 4 * KiB);  // an id may come back after removal
  CHECK(must_allocate(a, 1) == Block{3, 0, 256});
}

TEST_CASE("double free and foreign blocks throw and change nothing", "[pool]") {
  BlockAllocator a;
  a.add_slab(0, 64 * KiB);
  a.add_slab(1, 64 * KiB);
  const Block b = must_allocate(a, 1000);        // slab 0 [0, 1024)
  const Block c = must_allocate(a, 4 * KiB);     // slab 0 [1024, 5120)
  const Block d = must_allocate(a, 60 * KiB);    // slab 1 [0, 61440)
  REQUIRE(b == Block{0, 0, 1024});
  REQUIRE(c == Block{0, 1024, 4096});
  REQUIRE(d == Block{1, 0, 60 * KiB});
  a.deallocate(b);
  const PoolCounters before = a.counters();
  const auto ranges0 = a.free_ranges(0), ranges1 = a.free_ranges(1);

  auto expect_rejected = [&](const Block& bad, const std::string& needle) {
    CAPTURE(bad.slab_id, bad.offset, bad.size);
    try {
      a.deallocate(bad);
      FAIL("deallocate accepted a block it does not own");
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      CAPTURE(what);
      CHECK(what.find(needle) != std::string::npos);
      CHECK(what.find("slab " + std::to_string(bad.slab_id)) != std::string::npos);
    }
    CHECK(a.counters() == before);
    CHECK(a.free_ranges(0) == ranges0);
    CHECK(a.free_ranges(1) == ranges1);
    a.validate();
  };

  expect_rejected(b, "double free");                           // at a free range start
  expect_rejected(Block{0, 256, 256}, "double free");          // inside a free range
  expect_rejected(Block{0, 2048, 256}, "live block [1024, 5120)");  // inside a live block
  expect_rejected(Block{0, 1024, 256}, "size 4096");           // wrong size
  expect_rejected(Block{0, 1024 + 1, 4096}, "live block");     // misaligned
  expect_rejected(Block{0, 64 * KiB, 256}, "past the end");    // outside the slab
  expect_rejected(Block{0, std::numeric_limits<std::uint64_t>::max(), 256}, "past the end");
  expect_rejected(Block{42, 0, 1024}, "no slab 42");           // unknown slab
  expect_rejected(Block{1, 0, 1024}, "size 61440");            // right offset, other slab's size
  expect_rejected(Block{1, 60 * KiB, 4 * KiB}, "double free"); // slab 1's free tail

  // Double free after the range was coalesced with its neighbour.
  a.deallocate(c);
  CHECK(a.free_ranges(0) == std::vector<FreeRange>{{0, 64 * KiB}});
  const PoolCounters after = a.counters();
  CHECK_THROWS_AS(a.deallocate(c), InvalidArgument);
  CHECK(a.counters() == after);
  a.validate();
}

TEST_CASE("counters are exact after a sequence of operations", "[pool]") {
  BlockAllocator a;
  CHECK(a.counters() == PoolCounters{});
  a.add_slab(0, 1 * MiB);
  a.add_slab(1, 2 * MiB);
  PoolCounters want;
  want.reserved = 3 * MiB;
  want.slabs = 2;
  want.largest_free = 2 * MiB;
  CHECK(a.counters() == want);

  const Block x = must_allocate(a, 1000);         // 1024 in slab 0
  const Block y = must_allocate(a, 1 * MiB);      // slab 0 has too little left
  const Block z = must_allocate(a, 0);            // 256
  REQUIRE(x == Block{0, 0, 1024});
  REQUIRE(y == Block{1, 0, 1 * MiB});
  REQUIRE(z == Block{0, 1024, 256});
  want.in_use = 1024 + 1 * MiB + 256;
  want.requested = 1000 + 1 * MiB + 0;
  want.peak_in_use = want.in_use;
  want.allocations = 3;
  want.largest_free = 1 * MiB;  // slab 1's tail; slab 0 has 1 MiB - 1280
  CHECK(a.counters() == want);

  a.deallocate(y);
  want.in_use -= 1 * MiB;
  want.requested -= 1 * MiB;
  want.frees = 1;
  want.largest_free = 2 * MiB;
  CHECK(a.counters() == want);  // peak stays at its high-water mark

  a.reset_peak();
  want.peak_in_use = want.in_use;
  CHECK(a.counters() == want);

  CHECK_FALSE(a.allocate(3 * MiB).has_value());  // a miss counts nothing
  CHECK(a.counters() == want);

  const Block w = must_allocate(a, 300);
  REQUIRE(w == Block{0, 1280, 512});
  want.in_use += 512;
  want.requested += 300;
  want.peak_in_use = want.in_use;
  want.allocations = 4;
  CHECK(a.counters() == want);

  for (const Block& b : {x, z, w}) a.deallocate(b);
  want.in_use = 0;
  want.requested = 0;
  want.frees = 4;
  CHECK(a.counters() == want);
  a.reset_peak();
  CHECK(a.counters().peak_in_use == 0);
  a.validate();
}

TEST_CASE("moving an allocator moves its state and empties the source", "[pool]") {
  BlockAllocator a(BlockAllocatorOptions{512});
  a.add_slab(1, 1 * MiB);
  const Block b = must_allocate(a, 10);
  const PoolCounters c = a.counters();

  BlockAllocator m(std::move(a));
  CHECK(m.counters() == c);
  CHECK(a.counters() == PoolCounters{});  // NOLINT(bugprone-use-after-move)
  CHECK_FALSE(a.has_slab(1));
  CHECK(a.alignment() == 512);
  m.validate();
  a.validate();
  m.deallocate(b);
  CHECK(m.free_ranges(1) == std::vector<FreeRange>{{0, 1 * MiB}});

  BlockAllocator n;
  n.add_slab(9, 4 * KiB);
  n = std::move(m);
  CHECK_FALSE(n.has_slab(9));
  CHECK(n.alignment() == 512);
  CHECK(must_allocate(n, 1) == Block{1, 0, 512});
  n.validate();
  m.validate();
  CHECK(m.counters() == PoolCounters{});
}

TEST_CASE("randomized alloc/free agrees with a reference model", "[pool]") {
  constexpr std::uint64_t kSlab = 64 * MiB;
  constexpr int kOps = 20000;
  BlockAllocator a;
  Model model(256);
  for (std::uint64_t id : {11u, 3u, 7u, 5u}) {
    a.add_slab(id, kSlab);
    model.add_slab(id, kSlab);
  }

  std::mt19937_64 rng(20240607);
  std::vector<Block> live;
  std::vector<Block> freed;  // for double-free attempts
  std::uniform_int_distribution<int> pct(0, 99);
  int misses = 0, rejected = 0, max_live = 0;

  for (int op = 0; op < kOps; ++op) {
    CAPTURE(op);
    // Phases of 1500 ops alternate between filling and draining, so the run
    // reaches exhaustion and comes back to nearly empty more than once.
    const int alloc_pct = (op / 1500) % 2 == 0 ? 70 : 35;
    const int roll = pct(rng);
    if (roll < 3 && !freed.empty()) {
      Block bad = freed[std::uniform_int_distribution<std::size_t>(0, freed.size() - 1)(rng)];
      if (roll == 1) bad.offset += 256 * std::uniform_int_distribution<std::uint64_t>(0, 3)(rng);
      if (roll == 2) bad.size += 256;
      if (model.is_live(bad)) continue;  // the same range was handed out again
      const PoolCounters before = a.counters();
      CHECK_THROWS_AS(a.deallocate(bad), InvalidArgument);
      REQUIRE(a.counters() == before);
      ++rejected;
    } else if (live.empty() || pct(rng) < alloc_pct) {
      const std::uint64_t bytes = random_size(rng);
      CAPTURE(bytes);
      const std::optional<Block> want = model.predict(bytes);
      const std::optional<Block> got = a.allocate(bytes);
      REQUIRE(got.has_value() == want.has_value());
      if (!got) {
        ++misses;
      } else {
        CAPTURE(got->slab_id, got->offset, got->size);
        REQUIRE(*got == *want);
        model.allocate(*got, bytes);
        live.push_back(*got);
      }
    } else {
      const std::size_t i = std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng);
      const Block b = live[i];
      live[i] = live.back();
      live.pop_back();
      a.deallocate(b);
      model.deallocate(b);
      freed.push_back(b);
    }
    max_live = std::max<int>(max_live, static_cast<int>(live.size()));
    REQUIRE(a.counters() == model.counters());
    if (op % 250 == 0) {
      a.validate();
      REQUIRE(a.free_range_count() == model.gap_count());
      for (const auto& [id, s] : model.slabs()) {
        REQUIRE(a.free_ranges(id) == model.gaps(id));
        REQUIRE(a.live_blocks(id) == s.live.size());
      }
    }
  }
  INFO("misses " << misses << ", rejected frees " << rejected << ", max live " << max_live);
  CHECK(misses > 0);    // the run did reach exhaustion
  CHECK(rejected > 0);  // and did try bad frees
  CHECK(max_live > 300);

  for (const Block& b : live) {
    a.deallocate(b);
    model.deallocate(b);
  }
  a.validate();
  CHECK(a.counters() == model.counters());
  CHECK(a.counters().in_use == 0);
  CHECK(a.counters().largest_free == kSlab);
  CHECK(a.free_range_count() == 4);
  CHECK(a.empty_slabs() == std::vector<std::uint64_t>{3, 5, 7, 11});
}

TEST_CASE("fragmentation of a growing pool after a mixed-size run", "[pool]") {
  constexpr std::uint64_t kSlab = 64 * MiB;
  BlockAllocator a;
  std::uint64_t next_id = 0;
  std::mt19937_64 rng(7);
  std::vector<Block> live;
  std::uint64_t live_bytes = 0;
  std::uniform_int_distribution<int> pct(0, 99);

  for (int op = 0; op < 20000; ++op) {
    if (live.empty() || pct(rng) < 60) {
      const std::uint64_t bytes = random_size(rng);
      std::optional<Block> b = a.allocate(bytes);
      if (!b) {
        // The pool grows only when no free range fits.
        REQUIRE(a.counters().largest_free < std::max<std::uint64_t>(bytes, 1));
        a.add_slab(next_id++, kSlab);
        b = a.allocate(bytes);
        REQUIRE(b.has_value());
      }
      live.push_back(*b);
      live_bytes += b->size;
    } else {
      const std::size_t i = std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng);
      a.deallocate(live[i]);
      live_bytes -= live[i].size;
      live[i] = live.back();
      live.pop_back();
    }
  }
  a.validate();
  const PoolCounters c = a.counters();
  REQUIRE(c.in_use == live_bytes);
  REQUIRE(c.reserved == next_id * kSlab);
  REQUIRE(c.reserved >= c.in_use);
  const double ratio = static_cast<double>(c.reserved) / static_cast<double>(c.in_use);
  INFO("reserved/in_use " << ratio << " reserved " << c.reserved << " in_use " << c.in_use
                          << " requested " << c.requested << " slabs " << c.slabs
                          << " live " << live.size() << " free ranges " << a.free_range_count()
                          << " largest_free " << c.largest_free);
  CHECK(c.in_use >= c.requested);
  CHECK(c.peak_in_use >= c.in_use);

  for (const Block& b : live) a.deallocate(b);
  CHECK(a.empty_slabs().size() == next_id);
  for (std::uint64_t id = 0; id < next_id; ++id) a.remove_slab(id);
  CHECK(a.counters().reserved == 0);
  a.validate();
}

TEST_CASE("DeviceMemoryResource forwards to its private virtuals", "[pool]") {
  CountingResource r;
  memcuda::DeviceMemoryResource& mr = r;
  void* p = mr.allocate(300, 1);
  CHECK(p == static_cast<void*>(r.arena));
  CHECK(r.allocs == 1);
  CHECK(r.last_bytes == 300);
  CHECK(r.last_device == 1);
  mr.deallocate(p, 300, 2);
  CHECK(r.frees == 1);
  CHECK(r.last_ptr == p);
  CHECK(r.last_device == 2);
  static_assert(noexcept(mr.deallocate(p, 1, 0)));
}

TEST_CASE("allocate_in takes room from the named slab only", "[pool]") {
  memcuda::detail::BlockAllocator a;
  a.add_slab(1, 4096);
  a.add_slab(2, 8192);
  auto b = a.allocate_in(2, 1000);
  REQUIRE(b);
  CHECK(b->slab_id == 2);
  CHECK(b->offset == 0);
  CHECK(b->size == 1024);
  CHECK_FALSE(a.allocate_in(1, 5000));  // does not fit there
  CHECK_FALSE(a.allocate_in(9, 1));     // unknown slab
  CHECK(a.counters().in_use == 1024);
  a.deallocate(*b);
  CHECK(a.slab_empty(2));
  a.validate();
}
