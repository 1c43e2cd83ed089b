// A/B model versions on the cuda backend (runs on a GPU host): 8 consumer
// processes pinned on version N; the producer writes N+1 with a slow kernel
// and commits right after the launch (no synchronisation); each consumer
// advances on its own stream and its sum kernel there reads N+1.
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "memcuda/model_ab.hpp"
#include "support/gpu.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/skip.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

#if defined(MEMCUDA_TEST_KERNELS)
extern "C" cudaError_t memcuda_test_slow_fill(float* p, std::size_t n, float v, unsigned spin_ms, cudaStream_t s);

namespace {
std::string sum_of(std::size_t n, float v) { return std::to_string(static_cast<long long>(n * v)); }
}  // namespace

TEST_CASE("A/B versions (cuda): 8 pinned consumers advance on their streams and read N+1", "[gpu][model_ab][multiprocess]") {
  MEMCUDA_REQUIRE_GPU();
  test::RedisServer srv;
  RegistryOptions ro;
  ro.redis = srv.options();
  ro.control_thread = true;
  ro.lease_ttl = 2000ms;
  ro.default_backend = BackendKind::cuda;
  TensorRegistry reg(ro);
  const std::size_t n = 1 << 20;
  std::vector<float> ones(n, 1.f);
  ModelVersionOptions o;
  o.backend = BackendKind::cuda;
  REQUIRE(publish_model(reg, "g/", {{"w", DType::f32, {static_cast<std::int64_t>(n)}, ones.data()}}, o) == 1);
  std::vector<std::unique_ptr<test::Child>> cs;
  for (int i = 0; i < 8; ++i) {
    cs.push_back(std::make_unique<test::Child>(std::vector<std::string>{test::sibling_program("memcuda_test_worker"),
                                                                        "--url", srv.unix_url(), "--backend", "cuda",
                                                                        "--no-control", "--timeout", "30000"}));
    auto l = cs.back()->read_line(30s);
    REQUIRE(l);
    REQUIRE(l->rfind("READY", 0) == 0);
    REQUIRE(cs.back()->ask("openmodel g/", 30s) == "OK version=1 sum=" + sum_of(n, 1.f));
    REQUIRE(cs.back()->ask("advance-gpu g/", 30s) == "OK moved=0 version=1 sum=" + sum_of(n, 1.f));  // warm
  }
  cudaStream_t s{};
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  auto w = begin_model_version(reg, "g/", {{"w", DType::f32, {static_cast<std::int64_t>(n)}, nullptr}}, o);
  auto t = w.tensors().at("w");
  // N+1's writes: 2 s of spinning, then 2.0 everywhere; committed right after the launch
  REQUIRE(memcuda_test_slow_fill(static_cast<float*>(t.data()), n, 2.f, 2000, s) == cudaSuccess);
  t = {};
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(w.commit(s) == 2);
  // N's buffers are untouched: a pinned consumer still reads N
  CHECK(cs[0]->ask("sumpinned g/", 30s) == "OK version=1 sum=" + sum_of(n, 1.f));
  for (auto& c : cs) c->send("advance-gpu g/");
  for (auto& c : cs) CHECK(c->read_line(30s).value_or("") == "OK moved=1 version=2 sum=" + sum_of(n, 2.f));
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  WARN("commit until 8 consumers' advance + sum returned (includes the producer's 2 s kernel): " << ms.count() << " ms");
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  cudaStreamDestroy(s);
  // the flip alone, seen by 8 (no slow writes): commit until every advance returned
  std::vector<float> threes(n, 3.f);
  o.max_versions = 3;
  auto w3 = begin_model_version(reg, "g/", {{"w", DType::f32, {static_cast<std::int64_t>(n)}, threes.data()}}, o);
  const auto t1 = std::chrono::steady_clock::now();
  REQUIRE(w3.commit() == 3);
  for (auto& c : cs) c->send("advance-nosum g/");
  for (auto& c : cs) CHECK(c->read_line(30s).value_or("") == "OK moved=1 version=3");
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t1);
  WARN("A/B flip seen by 8 consumers (commit until every advance returned, cuda): " << us.count() << " us");
  for (auto& c : cs) CHECK(c->ask("exit", 30s) == "OK");
}
#else
TEST_CASE("A/B versions (cuda): 8 pinned consumers advance on their streams and read N+1", "[gpu][model_ab][multiprocess]") {
  MEMCUDA_SKIP("needs the test kernels (tests/kernels.cu): this build had no CUDA compiler");
}
#endif
