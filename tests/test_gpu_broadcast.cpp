// The broadcast engine on real devices (detail/cuda/broadcast.hpp): copies
// that wait for the producer's event, the relay through pinned host memory,
// and real peers. [gpu]: skipped, with the reason, where no CUDA device is
// usable; the peer case needs two ([multi-gpu]).
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "memcuda/config.hpp"
#include "support/gpu.hpp"
#include "support/skip.hpp"

#if MEMCUDA_HAS_CUDA() && defined(MEMCUDA_TEST_KERNELS)
#include "memcuda/detail/base/fault.hpp"
#include "memcuda/detail/cuda/broadcast.hpp"

extern "C" cudaError_t memcuda_test_slow_pattern(std::uint32_t* p, std::size_t n, std::uint32_t seed,
                                                 unsigned spin_ms, cudaStream_t s);

using namespace memcuda;
using namespace memcuda::detail;

namespace {

constexpr std::uint64_t MiB = std::uint64_t{1} << 20;
constexpr unsigned char kUntouched = 0xAB;  // what a destination holds where nothing was copied

// Device memory of one device, filled with kUntouched.
struct DeviceBuffer {
  DeviceBuffer(int device, std::size_t bytes) : device(device), bytes(bytes) {
    DeviceGuard g(device);
    REQUIRE(cudaMalloc(&p, bytes) == cudaSuccess);
    REQUIRE(cudaMemset(p, kUntouched, bytes) == cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // the copies run on non-blocking streams
  }
  ~DeviceBuffer() {
    DeviceGuard g(device, std::nothrow);
    cudaFree(p);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::uint64_t addr() const { return reinterpret_cast<std::uint64_t>(p); }
  std::vector<unsigned char> read() const {
    std::vector<unsigned char> h(bytes);
    REQUIRE(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDefault) == cudaSuccess);
    return h;
  }
  int device;
  std::size_t bytes;
  void* p = nullptr;
};

// A cuMem mapping on `device` that grants only that device: a peer reads
// it only after the broadcaster granted access (grant_mappings).
struct VmmBuffer {
  VmmBuffer(int device, std::size_t want) : device(device) {
    const auto& d = cu_driver_or_throw();
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    std::size_t gran = 0;
    REQUIRE(d.MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS);
    bytes = (want + gran - 1) / gran * gran;
    REQUIRE(d.MemCreate(&handle, bytes, &prop, 0) == CUDA_SUCCESS);
    REQUIRE(d.MemAddressReserve(&va, bytes, 0, 0, 0) == CUDA_SUCCESS);
    REQUIRE(d.MemMap(va, bytes, 0, handle, 0) == CUDA_SUCCESS);
    CUmemAccessDesc a{};
    a.location = prop.location;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    REQUIRE(d.MemSetAccess(va, bytes, &a, 1) == CUDA_SUCCESS);
  }
  ~VmmBuffer() {
    const auto& d = cu_driver();
    d.MemUnmap(va, bytes);
    d.MemAddressFree(va, bytes);
    d.MemRelease(handle);
  }
  VmmBuffer(const VmmBuffer&) = delete;
  VmmBuffer& operator=(const VmmBuffer&) = delete;
  int device;
  std::size_t bytes = 0;
  CUmemGenericAllocationHandle handle{};
  CUdeviceptr va = 0;
};

// (source offset, destination offset, bytes): the same destination offsets in every target.
struct Piece {
  std::uint64_t src, dst, bytes;
};

std::vector<BroadcastSegment> segments(const DeviceBuffer& src, const std::vector<const DeviceBuffer*>& dst,
                                       const std::vector<Piece>& pieces) {
  std::vector<BroadcastSegment> out;
  for (const auto& pc : pieces) {
    BroadcastSegment s;
    s.src = src.addr() + pc.src;
    for (const auto* d : dst) s.dst.push_back(d->addr() + pc.dst);
    s.bytes = pc.bytes;
    out.push_back(s);
  }
  return out;
}

// Every piece's bytes are the source's; every other byte is untouched.
void check_copied(const std::vector<unsigned char>& src, const DeviceBuffer& dst, const std::vector<Piece>& pieces) {
  std::vector<unsigned char> want(dst.bytes, kUntouched);
  for (const auto& pc : pieces) std::memcpy(want.data() + pc.dst, src.data() + pc.src, pc.bytes);
  const auto got = dst.read();
  REQUIRE(got.size() == want.size());
  std::size_t first_bad = got.size();
  for (std::size_t i = 0; i < got.size() && first_bad == got.size(); ++i)
    if (got[i] != want[i]) first_bad = i;
  INFO("destination on device " << dst.device << ", first wrong byte at " << first_bad);
  CHECK(first_bad == got.size());
}

// Starts a producer on `src`'s device: spins `spin_ms`, then writes the
// pattern of `seed`; returns its event (the consumer's wait_event).
cudaEvent_t produce(const DeviceBuffer& src, std::uint32_t seed, unsigned spin_ms, cudaStream_t s, cudaEvent_t e) {
  REQUIRE(memcuda_test_slow_pattern(static_cast<std::uint32_t*>(src.p), src.bytes / 4, seed, spin_ms, s) ==
          cudaSuccess);
  REQUIRE(cudaEventRecord(e, s) == cudaSuccess);
  return e;
}

// One stream and one event of device 0, for the producer.
struct Producer {
  Producer() : stream(0), event(0) {}
  UniqueStream stream;
  UniqueEvent event;
};

}  // namespace

TEST_CASE("broadcast: three buffers on one GPU get the producer's bytes, after its event", "[gpu][broadcast]") {
  MEMCUDA_REQUIRE_GPU();
  DeviceGuard g(0);
  const std::size_t n = 12 * MiB;
  DeviceBuffer src(0, n), a(0, n), b(0, n), c(0, n);
  REQUIRE(cudaMemset(src.p, 0, n) == cudaSuccess);  // stale bytes: what a copy that did not wait would take
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  // The first two merge (contiguous in the source and every destination);
  // sizes off the 2 MiB chunk; one segment empty.
  const std::vector<Piece> pieces{{0, 0, 5 * MiB + 12}, {5 * MiB + 12, 5 * MiB + 12, 3 * MiB + 1},
                                  {9 * MiB, 10 * MiB, MiB + 7}, {11 * MiB, 9 * MiB, 0}};
  BroadcastOptions opt;
  opt.chunk_bytes = 2 * MiB;
  Broadcaster bc(opt);
  const auto plan = bc.plan(0, {0, 0, 0}, segments(src, {&a, &b, &c}, pieces));
  REQUIRE(plan.segments.size() == 2);
  for (const auto& h : plan.hops) CHECK(h.path == HopPath::device);

  Producer prod;
  cudaEvent_t ready = produce(src, 7, 1500, prod.stream.get(), prod.event.get());
  const auto t0 = std::chrono::steady_clock::now();
  auto done = bc.run(plan, ready);
  const auto enqueue = std::chrono::steady_clock::now() - t0;
  // Nothing was waited for on the host: the producer is still spinning.
  CHECK(enqueue < std::chrono::milliseconds(1000));
  CHECK(cudaEventQuery(done.event(0)) == cudaErrorNotReady);
  CHECK(done.devices() == std::vector<int>{0});
  CHECK_THROWS_AS(done.event(1), InvalidArgument);

  // A consumer stream waits on the returned event, as a reader would.
  UniqueStream consumer(0);
  REQUIRE(cudaStreamWaitEvent(consumer.get(), done.event(0), 0) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(consumer.get()) == cudaSuccess);
  REQUIRE(cudaEventQuery(done.event(0)) == cudaSuccess);
  const auto bytes = src.read();
  for (const auto* d : {&a, &b, &c}) check_copied(bytes, *d, pieces);
  const std::uint64_t each = 5 * MiB + 12 + 3 * MiB + 1 + MiB + 7;
  CHECK(plan.bytes == each);
  const auto k = bc.counters();
  CHECK(k.device_bytes == 3 * each);
  CHECK(k.peer_bytes == 0);
  CHECK(k.host_bytes == 0);
  CHECK(k.runs == 1);
  CHECK(bc.relay_bytes() == 0);
}

TEST_CASE("broadcast: more chunks than the event ring, run twice on the same streams", "[gpu][broadcast]") {
  MEMCUDA_REQUIRE_GPU();
  DeviceGuard g(0);
  const std::size_t n = 150 * MiB + 20;  // 76 chunks of 2 MiB: the ring of 64 arrival events wraps
  DeviceBuffer src(0, n), a(0, n), b(0, n);
  const std::vector<Piece> pieces{{3, 5, n - 8}};
  BroadcastOptions opt;
  opt.chunk_bytes = 2 * MiB;
  opt.streams_per_hop = 3;
  Broadcaster bc(opt);
  const auto plan = bc.plan(0, {0, 0}, segments(src, {&a, &b}, pieces));
  REQUIRE(plan.chunks.size() > Broadcaster::kEventRing);
  Producer prod;
  for (std::uint32_t seed : {11u, 12u}) {
    auto done = bc.run(plan, produce(src, seed, 200, prod.stream.get(), prod.event.get()));
    REQUIRE(cudaEventSynchronize(done.event(0)) == cudaSuccess);
    const auto bytes = src.read();
    for (const auto* d : {&a, &b}) check_copied(bytes, *d, pieces);
  }
  CHECK(bc.counters().device_bytes == 2 * 2 * (n - 8));
}

TEST_CASE("broadcast: without a peer path the bytes go through pinned host memory", "[gpu][broadcast]") {
  MEMCUDA_REQUIRE_GPU();
  DeviceGuard g(0);
  const std::size_t n = 16 * MiB;
  DeviceBuffer src(0, n), a(0, n), b(0, n);
  // 11 MiB + 5 in 2 MiB chunks: 7 chunks per hop, 14 relayed through a ring of 4 slots.
  const std::vector<Piece> pieces{{0, MiB, 7 * MiB}, {8 * MiB, 11 * MiB, 4 * MiB + 5}};
  BroadcastOptions opt;
  opt.chunk_bytes = 2 * MiB;
  opt.no_peer = true;
  Broadcaster bc(opt);
  const auto plan = bc.plan(0, {0, 0}, segments(src, {&a, &b}, pieces));
  for (const auto& h : plan.hops) CHECK(h.path == HopPath::host);
  Producer prod;
  auto done = bc.run(plan, produce(src, 21, 300, prod.stream.get(), prod.event.get()));
  CHECK(bc.relay_bytes() == Broadcaster::kRelaySlots * 2 * MiB);
  REQUIRE(cudaEventSynchronize(done.event(0)) == cudaSuccess);
  const auto bytes = src.read();
  for (const auto* d : {&a, &b}) check_copied(bytes, *d, pieces);
  const auto k = bc.counters();
  CHECK(k.host_bytes == 2 * (11 * MiB + 5));
  CHECK(k.peer_bytes == 0);
  CHECK(k.device_bytes == 0);
  bc.trim();
  CHECK(bc.relay_bytes() == 0);

  // The fault point forces the relay on a broadcaster that would copy on the device.
  Broadcaster plain(BroadcastOptions{});
  fault::arm("broadcast.no_peer", 1);
  const auto forced = plain.plan(0, {0}, segments(src, {&a}, pieces));
  CHECK(forced.hops[0].path == HopPath::host);
  CHECK(plain.plan(0, {0}, segments(src, {&a}, pieces)).hops[0].path == HopPath::device);
  REQUIRE(cudaMemset(a.p, kUntouched, n) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  auto again = plain.run(forced, produce(src, 22, 100, prod.stream.get(), prod.event.get()));
  REQUIRE(cudaEventSynchronize(again.event(0)) == cudaSuccess);
  check_copied(src.read(), a, pieces);
  CHECK(plain.counters().host_bytes == 11 * MiB + 5);
}

TEST_CASE("broadcast: a plan that does not follow its targets is refused", "[gpu][broadcast]") {
  MEMCUDA_REQUIRE_GPU();
  Broadcaster bc;
  BroadcastPlan p = bc.plan(0, {0}, {});
  p.hops.clear();
  CHECK_THROWS_WITH(bc.run(p), "broadcast plan has 0 hop(s) for 1 target(s)");
  p = bc.plan(0, {0, 0}, {});
  p.hops[1].from = 1;
  CHECK_THROWS_WITH(bc.run(p), "broadcast plan hop 1 -> 1 does not follow its targets");
  CHECK(bc.counters().runs == 0);
}

TEST_CASE("broadcast: 0 -> 1 and 0 -> 1 -> 2 between real devices", "[gpu][broadcast][multi-gpu]") {
  MEMCUDA_REQUIRE_GPUS(2);
  const int gpus = test::gpu_count();
  const std::size_t n = 40 * MiB + 3;
  DeviceBuffer src(0, n), on1(1, n), on2(gpus > 2 ? 2 : 1, n);
  const std::vector<Piece> pieces{{0, 0, 20 * MiB + 1}, {20 * MiB + 1, 20 * MiB + 1, 20 * MiB + 2}};
  BroadcastOptions opt;
  opt.chunk_bytes = 4 * MiB;
  Broadcaster bc(opt);
  Producer prod;
  // Expected counters from the route the plan took (peer where the devices reach each other).
  auto tally = [](const BroadcastPlan& p, HopPath path) {
    std::uint64_t sum = 0;
    for (const auto& h : p.hops) sum += h.path == path ? p.bytes : 0;
    return sum;
  };

  const auto one = bc.plan(0, {1}, segments(src, {&on1}, pieces));
  auto done = bc.run(one, produce(src, 31, 300, prod.stream.get(), prod.event.get()));
  REQUIRE(cudaEventSynchronize(done.event(1)) == cudaSuccess);
  check_copied(src.read(), on1, pieces);
  CHECK(bc.counters().peer_bytes == tally(one, HopPath::peer));
  CHECK(bc.counters().host_bytes == tally(one, HopPath::host));

  const std::vector<int> targets = gpus > 2 ? std::vector<int>{1, 2} : std::vector<int>{1, 1};
  const auto chain = bc.plan(0, targets, segments(src, {&on1, &on2}, pieces));
  CHECK(chain.hops[0].to_device == 1);
  done = bc.run(chain, produce(src, 32, 300, prod.stream.get(), prod.event.get()));
  for (int d : chain.devices()) REQUIRE(cudaEventSynchronize(done.event(d)) == cudaSuccess);
  const auto bytes = src.read();
  check_copied(bytes, on1, pieces);
  check_copied(bytes, on2, pieces);
  const auto k = bc.counters();
  CHECK(k.peer_bytes == tally(one, HopPath::peer) + tally(chain, HopPath::peer));
  CHECK(k.host_bytes == tally(one, HopPath::host) + tally(chain, HopPath::host));
  CHECK(k.device_bytes == tally(chain, HopPath::device));
  CHECK(k.runs == 2);
}

TEST_CASE("broadcast: a peer hop from a cuMem mapping grants the receiver access first",
          "[gpu][broadcast][multi-gpu]") {
  MEMCUDA_REQUIRE_GPUS(2);
  int can = 0;
  REQUIRE(cudaDeviceCanAccessPeer(&can, 1, 0) == cudaSuccess);
  if (!can) MEMCUDA_SKIP("device 1 cannot access device 0 as a peer: the hop would be a relay");
  if (!vmm_fd_supported(0)) MEMCUDA_SKIP("device 0 has no cuMem allocations");
  DeviceGuard g(0);
  VmmBuffer vsrc(0, 9 * MiB);
  const std::size_t n = vsrc.bytes;
  DeviceBuffer staged(0, n), on1(1, n);
  Producer prod;
  produce(staged, 41, 0, prod.stream.get(), prod.event.get());
  REQUIRE(cudaMemcpyAsync(reinterpret_cast<void*>(vsrc.va), staged.p, n, cudaMemcpyDefault, prod.stream.get()) ==
          cudaSuccess);
  REQUIRE(cudaEventRecord(prod.event.get(), prod.stream.get()) == cudaSuccess);
  const std::vector<Piece> pieces{{0, 0, n}};
  BroadcastOptions opt;
  opt.chunk_bytes = 2 * MiB;
  Broadcaster bc(opt);
  BroadcastSegment seg;
  seg.src = vsrc.va;
  seg.dst = {on1.addr()};
  seg.bytes = n;
  const auto plan = bc.plan(0, {1}, {seg});
  REQUIRE(plan.hops[0].path == HopPath::peer);
  auto done = bc.run(plan, prod.event.get());
  REQUIRE(cudaEventSynchronize(done.event(1)) == cudaSuccess);
  check_copied(staged.read(), on1, pieces);
  CUmemLocation loc{CU_MEM_LOCATION_TYPE_DEVICE, 1};
  unsigned long long flags = 0;
  REQUIRE(cu_driver().MemGetAccess(&flags, &loc, vsrc.va) == CUDA_SUCCESS);
  CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  CHECK(bc.counters().peer_bytes == n);
}

#else
TEST_CASE("broadcast: the engine on real devices", "[gpu][broadcast]") {
  MEMCUDA_SKIP("needs the CUDA backend and the test kernels (tests/kernels.cu): this build had no CUDA compiler");
}
#endif
