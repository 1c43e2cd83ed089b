// CUDA backend tests. Tagged [gpu]: skipped with a visible reason where no
// CUDA device is usable (CTest reports the group as skipped); [multi-gpu]
// cases need two devices and run as their own group (gpu_multi_tests).
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "support/gpu.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/skip.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {
[[maybe_unused]] RegistryOptions cuda_opts(const test::RedisServer& srv, bool control = true) {
  RegistryOptions o;
  o.redis = srv.options();
  o.control_thread = control;
  o.lease_ttl = 400ms;
  o.default_backend = BackendKind::cuda;
  return o;
}
}  // namespace

#if MEMCUDA_HAS_CUDA()

TEST_CASE("cuda: create, fill, get in the same process resolves to the exporter's own pointer", "[gpu]") {
  MEMCUDA_REQUIRE_GPU();
  test::RedisServer srv;
  TensorRegistry leader(cuda_opts(srv));
  TensorRegistry reader(cuda_opts(srv, false));  // same process: may not open its own IPC handle
  auto t = leader.create<float>("gpu/x", {1 << 20});
  CHECK(t.backend() == BackendKind::cuda);
  CHECK(t.device() == 0);
  CHECK(t.device_uuid().rfind("GPU-", 0) == 0);
  cudaPointerAttributes attr{};
  REQUIRE(cudaPointerGetAttributes(&attr, t.data()) == cudaSuccess);
  CHECK(attr.type == cudaMemoryTypeDevice);
  std::vector<float> v(t.size());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 977);
  t.copy_from_host(v);
  auto r = reader.get<float>("gpu/x");
  CHECK(r.data() == t.data());
  std::vector<float> back(v.size());
  r.copy_to_host(back);
  CHECK(back == v);
  auto info = leader.info("gpu/x");
  CHECK(info.ipc_handle.size() == 64);
  CHECK(info.refcount == 2);
  CHECK(leader.stats().per_device.at(0).backend == BackendKind::cuda);
}

TEST_CASE("cuda: a device that does not exist is a clear error and leaves nothing behind", "[gpu]") {
  MEMCUDA_REQUIRE_GPU();
  test::RedisServer srv;
  TensorRegistry reg(cuda_opts(srv));
  CreateOptions o;
  o.device = 999;
  CHECK_THROWS_AS(reg.create<float>("nodev", {4}, o), InvalidArgument);
  CHECK(reg.list().empty());
  CHECK(reg.stats().process.owned_allocations == 0);
}

TEST_CASE("cuda: memory freed by the last release goes back to the driver", "[gpu]") {
  MEMCUDA_REQUIRE_GPU();
  test::RedisServer srv;
  TensorRegistry reg(cuda_opts(srv));
  std::size_t free0 = 0, free1 = 0, free2 = 0, total = 0;
  cudaDeviceSynchronize();
  cudaMemGetInfo(&free0, &total);
  {
    auto t = reg.create<std::uint8_t>("gpu/big", {256LL << 20});  // dedicated: over half a slab
    auto small = reg.create<float>("gpu/small", {1000});           // in a 256 MiB slab
    cudaMemGetInfo(&free1, &total);
    CHECK(free0 - free1 >= (512u << 20));
  }
  CHECK(reg.stats().process.owned_allocations == 0);
  CHECK(reg.stats().pools.at(0).in_use == 0);
  reg.trim();  // the control thread would do this on its own
  cudaMemGetInfo(&free2, &total);
  CHECK(free2 + (4u << 20) >= free0);  // back to within the driver's granularity
  CHECK(reg.stats().pools.at(0).reserved == 0);
}

TEST_CASE("cuda: a tensor whose exporter was killed cannot be opened anew: Lost", "[gpu]") {
  MEMCUDA_REQUIRE_GPU();
  test::RedisServer srv;
  test::Child w({test::sibling_program("memcuda_test_worker"), "--url", srv.unix_url(), "--backend", "cuda"});
  auto l = w.read_line(20s);
  REQUIRE(l);
  REQUIRE(l->find("leader=1") != std::string::npos);
  REQUIRE(w.ask("create orphaned 1024 1", 20s).rfind("OK", 0) == 0);
  w.kill(SIGKILL);
  w.wait();
  TensorRegistry reg(cuda_opts(srv, false));
  CHECK_THROWS_AS(reg.get<float>("orphaned"), Lost);
  CHECK(reg.info("orphaned").refcount == 1);  // the failed get gave its reference back
}

#if defined(MEMCUDA_TEST_KERNELS)
extern "C" cudaError_t memcuda_test_slow_fill(float* p, std::size_t n, float v, unsigned spin_ms, cudaStream_t s);
extern "C" cudaError_t memcuda_test_sum(const float* p, std::size_t n, double* out, cudaStream_t s);

namespace {
std::uint64_t pool_used_bytes(cudaMemPool_t pool) {
  std::uint64_t used = 0;
  REQUIRE(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used) == cudaSuccess);
  return used;
}
bool all_equal(const std::vector<float>& v, float x) {
  for (float e : v)
    if (e != x) return false;
  return true;
}
}  // namespace

// LocalTensor promises stream-ordered allocation and free (cudaMallocAsync /
// cudaFreeAsync). Each check below fails for an allocator that does not keep
// that promise:
//  - plain cudaMalloc/cudaFree: the memory is not from the stream-ordered pool
//    (its used bytes do not move) and cudaFree blocks until the slow kernel
//    that still writes the tensor has finished (the stream is idle after it);
//  - a pool that hands a freed block to the next allocation at once, without
//    ordering it after the work still using it: the slow kernel's late
//    writes land in the new tensor, which then no longer holds what was
//    written to it.
TEST_CASE("cuda: local tensors are stream-ordered: the free does not wait, the reuse does not race", "[gpu]") {
  MEMCUDA_REQUIRE_GPU();
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  cudaStream_t s{}, s2{};
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess);
  cudaMemPool_t pool{};
  REQUIRE(cudaDeviceGetMemPool(&pool, 0) == cudaSuccess);
  const std::size_t n = 1 << 20;
  const unsigned spin_ms = 3000;  // far longer than a preempted host thread takes from launch to query
  LocalOptions on_s, on_s2;
  on_s.stream = s;
  on_s2.stream = s2;
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const std::uint64_t used0 = pool_used_bytes(pool);

  LocalTensor<float> a({static_cast<std::int64_t>(n)}, on_s);
  REQUIRE(a.data() != nullptr);
  const void* a_ptr = a.data();
  const std::uint64_t bytes = a.bytes();
  CHECK(pool_used_bytes(pool) >= used0 + bytes);  // from the stream-ordered pool, not cudaMalloc
  // The kernel spins, then writes 2.0 everywhere: a tensor freed while it
  // runs is still being written.
  REQUIRE(memcuda_test_slow_fill(a.data(), n, 2.f, spin_ms, s) == cudaSuccess);
  const auto t0 = std::chrono::steady_clock::now();
  a.reset();  // enqueued on s behind the kernel
  const auto free_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  // The order is the check: the kernel still runs after the free returned,
  // so the free did not wait for it. The time is only printed.
  CHECK(cudaStreamQuery(s) == cudaErrorNotReady);
  cudaGetLastError();  // "not ready" is a status, keep it out of later checks
  std::printf("timing: free of a tensor behind a %u ms kernel returned after %lld ms\n", spin_ms,
              static_cast<long long>(free_ms));

  // A new tensor on another stream while the old block's free is pending.
  // The pool may give it the same block only after making s2 wait for s.
  LocalTensor<float> b({static_cast<std::int64_t>(n)}, on_s2);
  REQUIRE(b.data() != nullptr);
  INFO("new tensor reuses the freed block: " << (static_cast<const void*>(b.data()) == a_ptr));
  REQUIRE(cudaMemsetAsync(b.data(), 0, b.bytes(), s2) == cudaSuccess);
  std::vector<float> h1(n, -1.f), h2(n, -1.f);
  REQUIRE(cudaMemcpyAsync(h1.data(), b.data(), b.bytes(), cudaMemcpyDeviceToHost, s2) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s2) == cudaSuccess);
  CHECK(all_equal(h1, 0.f));
  // Let the slow kernel finish: had b been handed a's block without
  // ordering, its late writes of 2.0 are now in b.
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(h2.data(), b.data(), b.bytes(), cudaMemcpyDeviceToHost, s2) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s2) == cudaSuccess);
  CHECK(all_equal(h2, 0.f));

  // And on one stream, freed memory goes back to the pool in stream order.
  b.reset();
  REQUIRE(cudaStreamSynchronize(s2) == cudaSuccess);
  CHECK(pool_used_bytes(pool) == used0);
  cudaStreamDestroy(s);
  cudaStreamDestroy(s2);
}

TEST_CASE("cuda: a consumer's stream waits for the producer's published event", "[gpu]") {
  MEMCUDA_REQUIRE_GPU();
  test::RedisServer srv;
  TensorRegistry reg(cuda_opts(srv));
  const std::size_t n = 1 << 20;
  auto t = reg.create<float>("ordered", {static_cast<std::int64_t>(n)});
  std::vector<float> ones(n, 1.f);
  t.copy_from_host(ones);
  test::Child w({test::sibling_program("memcuda_test_worker"), "--url", srv.unix_url(), "--backend", "cuda",
                 "--no-control"});
  REQUIRE(w.read_line(20s));
  REQUIRE(w.ask("getsum-nowait ordered", 30s) == "OK sum=" + std::to_string(n));  // warm: context, mapping

  cudaStream_t s{};
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(memcuda_test_slow_fill(t.data(), n, 2.f, 2000, s) == cudaSuccess);  // 2 s, then writes 2.0
  CHECK(t.publish(s) == 1);
  // Control: a consumer that does not wait reads the old values while the producer still runs.
  CHECK(w.ask("getsum-nowait ordered", 30s) == "OK sum=" + std::to_string(n));
  // A consumer that gets with its stream waits on the event: it sees the new values.
  CHECK(w.ask("getsum ordered", 30s) == "OK sum=" + std::to_string(2 * n));
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  cudaStreamDestroy(s);
}

// The driver faults when a stream waits on an interprocess event of another
// device: mem-cuda opens imports in the waiting stream's device and bridges
// its own events (detail/cuda/ipc_event.hpp).
TEST_CASE("cuda: a stream of GPU 1 waits for an event recorded on GPU 0, in this process and another",
          "[gpu][multi-gpu]") {
  MEMCUDA_REQUIRE_GPUS(2);
  test::RedisServer srv;
  TensorRegistry reg(cuda_opts(srv));
  const std::size_t n = 1 << 20;
  auto t = reg.create<float>("ordered", {static_cast<std::int64_t>(n)});
  REQUIRE(t.device() == 0);
  std::vector<float> ones(n, 1.f);
  t.copy_from_host(ones);
  // The worker's device 0 is GPU 1 (and its device 1 is GPU 0, where the tensor is).
  test::Child w({"/usr/bin/env", "CUDA_VISIBLE_DEVICES=1,0", test::sibling_program("memcuda_test_worker"), "--url",
                 srv.unix_url(), "--backend", "cuda", "--no-control"});
  REQUIRE(w.read_line(20s));
  REQUIRE(w.ask("getsum-nowait ordered", 30s) == "OK sum=" + std::to_string(n));  // warm: context, mapping

  cudaStream_t s{}, s1{};
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess);
  double* d = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(double)) == cudaSuccess);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  t.check_device(1);  // peer access for the sum below
  REQUIRE(memcuda_test_slow_fill(t.data(), n, 2.f, 2000, s) == cudaSuccess);  // 2 s, then writes 2.0
  CHECK(t.publish(s) == 1);
  // this process: its own event, waited for by a stream of GPU 1
  auto mine = reg.get<float>("ordered", s1);
  CHECK(cudaStreamQuery(s1) == cudaErrorNotReady);  // still behind the 2 s kernel
  REQUIRE(memcuda_test_sum(mine.data(), n, d, s1) == cudaSuccess);
  double h = 0;
  REQUIRE(cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, s1) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s1) == cudaSuccess);
  CHECK(h == double(2 * n));
  // another process: the imported event, waited for by a stream of its GPU 1
  REQUIRE(memcuda_test_slow_fill(t.data(), n, 3.f, 2000, s) == cudaSuccess);
  CHECK(t.publish(s) == 2);
  CHECK(w.ask("getsum ordered", 30s) == "OK sum=" + std::to_string(3 * n));
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  cudaFree(d);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s);
}
#else
TEST_CASE("cuda: the stream-ordering tests (local tensors, published events)", "[gpu]") {
  MEMCUDA_SKIP("needs the test kernels (tests/kernels.cu): this build had no CUDA compiler");
}
#endif

TEST_CASE("cuda: tensors share slabs, mapped once per process", "[gpu]") {
  MEMCUDA_REQUIRE_GPU();
  test::RedisServer srv;
  TensorRegistry reg(cuda_opts(srv));
  std::vector<SharedTensor<float>> ts;
  for (int i = 0; i < 16; ++i) ts.push_back(reg.create<float>("slab/" + std::to_string(i), {4096}));
  for (auto& t : ts) CHECK(t.info().alloc_id == ts[0].info().alloc_id);
  test::Child w({test::sibling_program("memcuda_test_worker"), "--url", srv.unix_url(), "--backend", "cuda",
                 "--no-control"});
  REQUIRE(w.read_line(20s));
  for (int i = 0; i < 16; ++i) CHECK(w.ask("get slab/" + std::to_string(i), 30s).rfind("OK", 0) == 0);
  auto r = w.ask("stats");
  INFO(r);
  CHECK(r.find("import_opens=1 ") != std::string::npos);
}

TEST_CASE("cuda: a budget caps the device memory the pool takes", "[gpu]") {
  MEMCUDA_REQUIRE_GPU();
  test::RedisServer srv;
  auto o = cuda_opts(srv);
  o.pool.slab_bytes = 64 << 20;
  o.pool.budget_bytes = 128 << 20;
  TensorRegistry reg(o);
  auto a = reg.create<std::uint8_t>("a", {60LL << 20});                          // dedicated: reserved 60 MiB
  CHECK_THROWS_AS(reg.create<std::uint8_t>("b", {80LL << 20}), BudgetExceeded);  // 140 > 128
  auto c = reg.create<std::uint8_t>("c", {20LL << 20});                          // a 64 MiB slab: 124
  auto p = reg.stats().pools.at(0);
  CHECK(p.reserved == (124u << 20));
  CHECK(p.budget == (128u << 20));
  CHECK(reg.list().size() == 2);
}

TEST_CASE("cuda: a tensor on the second GPU is read by a kernel on the first (peer access)", "[gpu][multi-gpu]") {
  MEMCUDA_REQUIRE_GPUS(2);
  test::RedisServer srv;
  TensorRegistry reg(cuda_opts(srv));
  CreateOptions on1;
  on1.device = 1;
  const std::size_t n = 1 << 20;
  auto t = reg.create<float>("on1", {static_cast<std::int64_t>(n)}, on1);
  CHECK(t.device() == 1);
  CHECK(t.info().device_uuid == detail::device_uuid(1));
  std::vector<float> v(n, 3.f);
  t.copy_from_host(v);
  // the worker's current device is 0: it opens with peer access and sums with a kernel on device 0
  test::Child w({test::sibling_program("memcuda_test_worker"), "--url", srv.unix_url(), "--backend", "cuda",
                 "--no-control"});
  REQUIRE(w.read_line(20s));
#if defined(MEMCUDA_TEST_KERNELS)
  CHECK(w.ask("getsum on1", 30s) == "OK sum=" + std::to_string(3 * n));
#endif
  CHECK(w.ask("get on1", 30s).find("sum=" + std::to_string(3 * n)) != std::string::npos);
  auto st = reg.stats();
  bool dev1 = false;
  for (const auto& p : st.pools) dev1 |= p.device == 1 && p.in_use > 0;
  CHECK(dev1);
}

#endif  // MEMCUDA_HAS_CUDA()
