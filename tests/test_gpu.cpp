// CUDA backend tests. Tagged [gpu]: skipped with a visible reason where no
// CUDA device is usable (CTest reports the group as skipped).
#include <catch2/catch.hpp>

#include <thread>

#include "memcuda/memcuda.hpp"
#include "support/gpu.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {
RegistryOptions cuda_opts(const test::RedisServer& srv, bool control = true) {
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
    auto t = reg.create<std::uint8_t>("gpu/big", {256LL << 20});
    cudaMemGetInfo(&free1, &total);
    CHECK(free0 - free1 >= (256u << 20));
  }
  cudaMemGetInfo(&free2, &total);
  CHECK(free2 + (4u << 20) >= free0);  // back to within the driver's granularity
  CHECK(reg.stats().process.owned_allocations == 0);
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

TEST_CASE("cuda: local tensors are stream-ordered", "[gpu]") {
  MEMCUDA_REQUIRE_GPU();
  cudaStream_t s{};
  REQUIRE(cudaStreamCreate(&s) == cudaSuccess);
  {
    LocalOptions o;
    o.stream = s;
    LocalTensor<float> a({1024}, o);
    REQUIRE(a.data() != nullptr);
    REQUIRE(cudaMemsetAsync(a.data(), 0, a.bytes(), s) == cudaSuccess);
    std::vector<float> h(1024, 1.f);
    REQUIRE(cudaMemcpyAsync(h.data(), a.data(), a.bytes(), cudaMemcpyDeviceToHost, s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(h[1023] == 0.f);
  }  // freed on s
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  cudaStreamDestroy(s);
}

#endif  // MEMCUDA_HAS_CUDA()
