// Borrowed device memory (TensorRegistry::share of a cudaMalloc buffer):
// shared with legacy CUDA IPC on the allocation base plus the tensor's
// offset, read by another process. Tagged [gpu]: skipped where no CUDA
// device is usable.
#include <catch2/catch.hpp>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "memcuda/detail/backend/cuda_vmm_backend.hpp"
#include "memcuda/memcuda.hpp"
#include "support/gpu.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/skip.hpp"
#include "support/text.hpp"
#include "support/timing.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

#if MEMCUDA_HAS_CUDA()
TEST_CASE("cuda borrow: a cudaMalloc buffer shared at an offset is read by a second process", "[gpu][borrow]") {
  MEMCUDA_REQUIRE_GPU();
  test::RedisServer srv;
  auto c = srv.connect();
  RegistryOptions o;
  o.redis = srv.options();
  o.default_backend = BackendKind::cuda;
  TensorRegistry owner(o);
  constexpr std::size_t kOffset = 1 << 20, kCount = 1024;
  void* base = nullptr;
  REQUIRE(cudaMalloc(&base, 4 << 20) == cudaSuccess);
  float* p = reinterpret_cast<float*>(static_cast<char*>(base) + kOffset);
  std::vector<float> v(kCount, 3.0f);
  REQUIRE(cudaMemcpy(p, v.data(), kCount * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  // Set on the thread that drops the keep-alive: `entered` before cudaFree,
  // `freed` after it (tells a free that never came from one that blocked).
  auto entered = std::make_shared<std::atomic<bool>>(false);
  auto freed = std::make_shared<std::atomic<bool>>(false);
  ShareOptions so;
  so.keep_alive = std::shared_ptr<void>(base, [entered, freed](void* q) {
    entered->store(true);
    cudaFree(q);
    freed->store(true);
  });
  std::uint64_t gen = 0;
  {
    // Moved in: a copy left in `so` would keep the buffer alive past the last release.
    auto h = owner.share("gb", p, DType::f32, {static_cast<std::int64_t>(kCount)}, std::move(so));
    CHECK(h.data() == p);
    gen = h.generation();
    auto info = owner.info("gb");
    CHECK(info.borrowed);
    CHECK(info.alloc_kind == "cuda_ipc");
    CHECK(info.offset == kOffset);
    CHECK(info.alloc_bytes >= (4u << 20));
    test::Child w({test::sibling_program("memcuda_test_worker"), "--url", srv.unix_url(), "--backend", "cuda",
                   "--no-control"});
    REQUIRE(w.read_line(30s));
    auto r = w.ask("get gb", 30s);
    INFO(r);
    CHECK(test::field(r, "sum") == "3072");
    CHECK(w.ask("release gb") == "OK");
    CHECK(w.ask("exit") == "OK");
  }
  owner.flush();
  // The last release reaches the owner through its release thread and the
  // free path, asynchronously: its keep-alive (here cudaFree) runs soon after.
  const bool done = test::eventually([&] { return freed->load(); }, 20s);
  INFO("deleter entered: " << entered->load() << "; record: " << c.command({"EXISTS", "memcuda:tensor:gb"}).integer()
                           << "; unlinked record: "
                           << c.command({"EXISTS", "memcuda:removed:" + std::to_string(gen)}).integer());
  CHECK(done);
}

namespace {
// cuMem memory as a framework's cuMem allocator makes it: physical
// allocations of `pages` granules mapped back to back in one reservation,
// exportable as POSIX fds unless `exportable` is false.
struct CuMemRange {
  CUdeviceptr p = 0;
  std::uint64_t size = 0;
  explicit CuMemRange(int pages, bool exportable = true) {
    const auto& d = detail::cu_driver_or_throw();
    const std::uint64_t g = detail::vmm::granularity(0);
    size = g * pages;
    REQUIRE(d.MemAddressReserve(&p, size, g, 0, 0) == CUDA_SUCCESS);
    for (int i = 0; i < pages; ++i) {
      CUmemAllocationProp prop = detail::vmm::prop_for(0);
      if (!exportable) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
      CUmemGenericAllocationHandle h{};
      REQUIRE(d.MemCreate(&h, g, &prop, 0) == CUDA_SUCCESS);
      REQUIRE(d.MemMap(p + i * g, g, 0, h, 0) == CUDA_SUCCESS);
      d.MemRelease(h);  // the mapping keeps it
    }
    CUmemAccessDesc acc{};
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = 0;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    REQUIRE(d.MemSetAccess(p, size, &acc, 1) == CUDA_SUCCESS);
  }
  ~CuMemRange() {
    const auto& d = detail::cu_driver();
    d.MemUnmap(p, size);
    d.MemAddressFree(p, size);
  }
  float* at(std::uint64_t off) const { return reinterpret_cast<float*>(p + off); }
};
}  // namespace

TEST_CASE("cuda borrow: cuMem memory (an expandable segment's kind) is shared by its fd at an offset",
          "[gpu][borrow]") {
  MEMCUDA_REQUIRE_GPU();
  test::RedisServer srv;
  RegistryOptions o;
  o.redis = srv.options();
  o.default_backend = BackendKind::cuda;
  TensorRegistry owner(o);
  CuMemRange mem(2);
  const std::uint64_t g = mem.size / 2, off = g + (1u << 16);  // in the second physical allocation
  constexpr std::size_t kCount = 1024;
  std::vector<float> v(kCount, 3.0f);
  REQUIRE(cudaMemcpy(mem.at(off), v.data(), kCount * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  {
    auto h = owner.share("vb", mem.at(off), DType::f32, {static_cast<std::int64_t>(kCount)});
    CHECK(static_cast<void*>(h.data()) == mem.at(off));
    auto info = owner.info("vb");
    CHECK(info.borrowed);
    CHECK(info.alloc_kind == "cuda_vmm_fd");
    CHECK(info.offset == (1u << 16));  // from the base of its own physical allocation
    CHECK(info.alloc_bytes == g);
    test::Child w({test::sibling_program("memcuda_test_worker"), "--url", srv.unix_url(), "--backend", "cuda",
                   "--no-control"});
    REQUIRE(w.read_line(30s));
    auto r = w.ask("get vb", 30s);
    INFO(r);
    CHECK(test::field(r, "sum") == "3072");
    CHECK(w.ask("release vb") == "OK");
    CHECK(w.ask("exit") == "OK");
  }
  // A tensor across the two physical allocations: no one fd maps it.
  CHECK_THROWS_WITH(owner.share("across", mem.at(g - 1024), DType::f32, {1024}),
                    Catch::Contains("spans two physical allocations"));
  CuMemRange closed(1, false);
  CHECK_THROWS_WITH(owner.share("closed", closed.at(0), DType::f32, {1024}),
                    Catch::Contains("POSIX fd handle type"));
  CHECK_THROWS_AS(owner.info("across"), NotFound);
  CHECK_THROWS_AS(owner.info("closed"), NotFound);
  owner.flush();
}
#endif
