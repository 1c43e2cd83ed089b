// The host half of the broadcast engine (detail/cuda/broadcast_plan.hpp):
// merging segments, cutting chunks, and the route from given peer and rank
// matrices. Addresses are plain offsets: nothing here touches a GPU.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "memcuda/detail/cuda/broadcast_plan.hpp"
#if MEMCUDA_HAS_CUDA()
#include "memcuda/detail/cuda/broadcast.hpp"  // Broadcaster checks its options before any CUDA call
#endif

#include "support/text.hpp"

using namespace memcuda;
using namespace memcuda::detail;

namespace {

constexpr std::uint64_t MiB = std::uint64_t{1} << 20;

PeerMatrix all_peers(int n, int rank = 0) {
  PeerMatrix m;
  m.devices = n;
  m.can_access.assign(static_cast<std::size_t>(n * n), 1);
  m.rank.assign(static_cast<std::size_t>(n * n), rank);
  return m;
}

void set(PeerMatrix& m, int i, int j, bool access, int rank = 0) {
  m.can_access[static_cast<std::size_t>(i * m.devices + j)] = access ? 1 : 0;
  m.rank[static_cast<std::size_t>(i * m.devices + j)] = rank;
}

// "from->to:path" per hop, to compare whole routes at once.
std::vector<std::string> describe(const std::vector<BroadcastHop>& hops) {
  std::vector<std::string> out;
  for (const auto& h : hops)
    out.push_back(std::to_string(h.from) + "->" + std::to_string(h.to) + ":" + to_string(h.path));
  return out;
}

std::vector<int> order(const std::vector<BroadcastHop>& hops) {
  std::vector<int> out;
  for (const auto& h : hops) out.push_back(h.to_device);
  return out;
}

}  // namespace

TEST_CASE("broadcast plan: neighbours contiguous in the source and in every destination merge", "[broadcast]") {
  // Three packed tensors, laid out the same way at both targets: one copy.
  std::vector<BroadcastSegment> packed{{0, {1000, 5000}, 100}, {100, {1100, 5100}, 50}, {150, {1150, 5150}, 7}};
  auto m = merge_segments(packed, 2);
  REQUIRE(m.size() == 1);
  CHECK(m[0].src == 0);
  CHECK(m[0].dst == std::vector<std::uint64_t>{1000, 5000});
  CHECK(m[0].bytes == 157);

  // Contiguous in the source and the first target but not the second: two.
  std::vector<BroadcastSegment> gap{{0, {1000, 5000}, 100}, {100, {1100, 5200}, 50}};
  CHECK(merge_segments(gap, 2).size() == 2);
  // A gap in the source: two.
  std::vector<BroadcastSegment> src_gap{{0, {1000}, 100}, {101, {1100}, 50}};
  CHECK(merge_segments(src_gap, 1).size() == 2);
  // Out of order (the second one ends where the first starts): not merged.
  std::vector<BroadcastSegment> reversed{{100, {1100}, 50}, {0, {1000}, 100}};
  CHECK(merge_segments(reversed, 1).size() == 2);
}

TEST_CASE("broadcast plan: zero-byte segments are dropped and do not break a merge", "[broadcast]") {
  std::vector<BroadcastSegment> s{{0, {1000}, 0}, {0, {1000}, 64}, {64, {9999}, 0}, {64, {1064}, 64}, {500, {7}, 0}};
  auto m = merge_segments(s, 1);
  REQUIRE(m.size() == 1);
  CHECK(m[0].bytes == 128);
  CHECK(merge_segments({{0, {1}, 0}}, 1).empty());
  CHECK(cut_chunks(merge_segments({{0, {1}, 0}}, 1), 2 * MiB).empty());
}

TEST_CASE("broadcast plan: segments are cut into chunks, the last one holding the rest", "[broadcast]") {
  std::vector<BroadcastSegment> s{{0, {0}, 5 * MiB + 3}, {100 * MiB, {100 * MiB}, 2 * MiB}, {300 * MiB, {1}, 1}};
  auto c = cut_chunks(s, 2 * MiB);
  REQUIRE(c.size() == 5);
  CHECK((c[0].segment == 0 && c[0].offset == 0 && c[0].bytes == 2 * MiB));
  CHECK((c[1].segment == 0 && c[1].offset == 2 * MiB && c[1].bytes == 2 * MiB));
  CHECK((c[2].segment == 0 && c[2].offset == 4 * MiB && c[2].bytes == MiB + 3));
  CHECK((c[3].segment == 1 && c[3].offset == 0 && c[3].bytes == 2 * MiB));  // an exact multiple: no empty tail
  CHECK((c[4].segment == 2 && c[4].offset == 0 && c[4].bytes == 1));
  std::uint64_t sum = 0;
  for (const auto& x : cut_chunks(s, 4 * MiB)) sum += x.bytes;
  CHECK(sum == 7 * MiB + 4);
  CHECK(cut_chunks(s, 256 * MiB).size() == 3);
}

TEST_CASE("broadcast plan: chunk sizes outside 2 MiB..256 MiB or not a multiple of 2 MiB are refused", "[broadcast]") {
  for (std::uint64_t ok : {2 * MiB, 16 * MiB, 256 * MiB}) CHECK_NOTHROW(check_chunk_bytes(ok));
  for (std::uint64_t bad : {std::uint64_t{0}, MiB, 3 * MiB, 258 * MiB, 512 * MiB, 2 * MiB + 1}) {
    CHECK_THROWS_AS(check_chunk_bytes(bad), InvalidArgument);
    CHECK_THROWS_AS(cut_chunks({{0, {0}, 1}}, bad), InvalidArgument);
    CHECK_THROWS_AS(make_broadcast_plan(0, {0}, {{0, {0}, 1}}, all_peers(1), bad), InvalidArgument);
  }
  CHECK(test::invalid_argument_of([] { check_chunk_bytes(3 * MiB); }) ==
        "broadcast chunk_bytes 3145728: want a multiple of 2 MiB (2097152) from 2 MiB to 256 MiB");
}

TEST_CASE("broadcast plan: all-equal peers (NVSwitch) give the chain 0->1->2->3", "[broadcast]") {
  auto hops = plan_route(0, {1, 2, 3}, all_peers(4));
  CHECK(describe(hops) == std::vector<std::string>{"-1->0:peer", "0->1:peer", "1->2:peer"});
  CHECK(order(hops) == std::vector<int>{1, 2, 3});
  // Target order does not matter when every link ranks the same: lowest index first.
  CHECK(order(plan_route(0, {3, 1, 2}, all_peers(4))) == std::vector<int>{3, 1, 2});
  CHECK(order(plan_route(2, {0, 1, 3}, all_peers(4))) == std::vector<int>{0, 1, 3});
}

TEST_CASE("broadcast plan: the chain follows the best rank from its end", "[broadcast]") {
  // 0-2 and 2-1 fast (NVLink pairs), 0-1, 0-3 slow, 1-3 fast.
  auto m = all_peers(4, 5);
  for (auto [a, b] : {std::pair{0, 2}, std::pair{2, 1}, std::pair{1, 3}}) {
    set(m, a, b, true, 0);
    set(m, b, a, true, 0);
  }
  CHECK(order(plan_route(0, {1, 2, 3}, m)) == std::vector<int>{2, 1, 3});
}

TEST_CASE("broadcast plan: a target no chain link can reach as a peer is a relay hop through the host",
          "[broadcast]") {
  // 0<->1 peers; 2 reaches nobody and nobody reaches it.
  auto m = all_peers(3);
  for (int i = 0; i < 3; ++i) {
    set(m, 2, i, i == 2);
    set(m, i, 2, i == 2);
  }
  auto hops = plan_route(0, {1, 2}, m);
  CHECK(describe(hops) == std::vector<std::string>{"-1->0:peer", "0->1:host"});
  CHECK((hops[1].from_device == 1 && hops[1].to_device == 2));
  // Relayed first when it is the only target, then peers follow from it.
  auto m4 = all_peers(4);
  for (int i = 1; i < 4; ++i) {
    set(m4, 0, i, false);
    set(m4, i, 0, false);
  }
  CHECK(describe(plan_route(0, {1, 2, 3}, m4)) ==
        std::vector<std::string>{"-1->0:host", "0->1:peer", "1->2:peer"});
}

TEST_CASE("broadcast plan: the receiver must reach the sender, and an earlier link serves when the end cannot",
          "[broadcast]") {
  auto m = all_peers(3);
  // 1 can read 0 but 0 cannot read 1: 0 -> 1 is a peer hop, 1 -> 0 would not be.
  set(m, 0, 1, false);
  CHECK(describe(plan_route(0, {1}, m)) == std::vector<std::string>{"-1->0:peer"});
  CHECK(describe(plan_route(1, {0}, m)) == std::vector<std::string>{"-1->0:host"});
  // 0 -> 1 -> 2 is cut (2 cannot read 1), but 2 can read 0: it hangs off the source.
  auto n = all_peers(3);
  set(n, 2, 1, false);
  set(n, 1, 2, false);
  CHECK(describe(plan_route(0, {1, 2}, n)) == std::vector<std::string>{"-1->0:peer", "-1->1:peer"});
}

TEST_CASE("broadcast plan: targets may repeat a device or sit on the source's", "[broadcast]") {
  // One GPU, three buffers on it: device copies along the chain.
  CHECK(describe(plan_route(0, {0, 0, 0}, all_peers(1))) ==
        std::vector<std::string>{"-1->0:device", "0->1:device", "1->2:device"});
  // A second buffer on a device comes from the first one there, not over a link again.
  auto hops = plan_route(0, {1, 2, 1, 0}, all_peers(3));
  CHECK(describe(hops) == std::vector<std::string>{"-1->3:device", "3->0:peer", "0->2:device", "2->1:peer"});
  // Forced through the host, same-device hops too (the relay's one-GPU test).
  RouteOptions relay;
  relay.no_peer = true;
  CHECK(describe(plan_route(0, {0, 0}, all_peers(1), relay)) ==
        std::vector<std::string>{"-1->0:host", "0->1:host"});
}

TEST_CASE("broadcast plan: make_broadcast_plan merges, cuts and routes", "[broadcast]") {
  std::vector<BroadcastSegment> s{{0, {0, 0x100000000}, 3 * MiB}, {3 * MiB, {3 * MiB, 0x100000000 + 3 * MiB}, 3 * MiB},
                                  {64 * MiB, {64 * MiB, 0x200000000}, 1}};
  auto p = make_broadcast_plan(0, {1, 2}, s, all_peers(3), 4 * MiB);
  CHECK(p.source_device == 0);
  CHECK(p.target_devices == std::vector<int>{1, 2});
  CHECK(p.segments.size() == 2);
  CHECK(p.chunks.size() == 3);  // 4 + 2 MiB, then 1 byte
  CHECK(p.bytes == 6 * MiB + 1);
  CHECK(p.chunk_bytes == 4 * MiB);
  CHECK(order(p.hops) == std::vector<int>{1, 2});
  CHECK(make_broadcast_plan(0, {0, 1, 0}, {}, all_peers(2)).devices() == std::vector<int>{0, 1});
}

TEST_CASE("broadcast plan: bad input is refused with a message saying what is wrong", "[broadcast]") {
  auto m = all_peers(2);
  CHECK(test::invalid_argument_of([&] { plan_route(0, {}, m); }) == "broadcast with no target");
  CHECK(test::invalid_argument_of([&] { plan_route(2, {1}, m); }) == "broadcast source device 2 does not exist (2 device(s))");
  CHECK(test::invalid_argument_of([&] { plan_route(0, {1, -1}, m); }) == "broadcast target 1 device -1 does not exist (2 device(s))");
  PeerMatrix bad = m;
  bad.rank.pop_back();
  CHECK(test::invalid_argument_of([&] { plan_route(0, {1}, bad); }) ==
        "broadcast peer matrix for 2 device(s) has 4 access and 3 rank entries, want 4 each");
  CHECK(test::invalid_argument_of([] { merge_segments({{0, {1, 2}, 8}}, 3); }) ==
        "broadcast segment 0 has 2 destination(s) for 3 target(s)");
  CHECK(test::invalid_argument_of([] { merge_segments({{0, {1}, 8}, {~std::uint64_t{0} - 3, {64}, 8}}, 1); }) ==
        "broadcast segment 1: source address + 8 bytes overflows");
  CHECK(test::invalid_argument_of([] { merge_segments({{0, {~std::uint64_t{0}}, 1}}, 1); }) ==
        "broadcast segment 0: destination address + 1 bytes overflows");
  CHECK(test::invalid_argument_of([&] { make_broadcast_plan(0, {1, 1}, {{0, {1}, 8}}, m); }) ==
        "broadcast segment 0 has 1 destination(s) for 2 target(s)");
}

#if MEMCUDA_HAS_CUDA()
TEST_CASE("broadcast engine: options out of range are refused before any CUDA call", "[broadcast]") {
  for (int s : {0, 5}) {
    BroadcastOptions o;
    o.streams_per_hop = s;
    CHECK(test::invalid_argument_of([&] { Broadcaster b(o); }) == "broadcast streams_per_hop " + std::to_string(s) + ": want 1 to 4");
  }
  BroadcastOptions o;
  o.chunk_bytes = 3 * MiB;
  CHECK_THROWS_AS(Broadcaster{o}, InvalidArgument);
}
#endif
