// Replicas on CUDA devices (replicas.hpp): made and copied by the allocator
// of record, shared by every process of a device, copied again in place
// after a publish, gone with their source or when idle. Cases
// that copy need two GPUs ([multi-gpu]); on one GPU the source serves its
// own device and nothing is made.
#include <catch2/catch.hpp>

#include <chrono>
#include <numeric>
#include <vector>

#include "memcuda/detail/base/fault.hpp"
#include "memcuda/memcuda.hpp"
#include "memcuda/model_ab.hpp"
#include "support/gpu.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/skip.hpp"
#include "support/timing.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

#if MEMCUDA_HAS_CUDA()

namespace {

RegistryOptions cuda_opts(const test::RedisServer& srv) {
  RegistryOptions o;
  o.redis = srv.options();
  o.lease_ttl = 400ms;
  o.gc_interval = 100ms;
  o.default_backend = BackendKind::cuda;
  return o;
}

SharedTensor<float> filled(TensorRegistry& reg, const std::string& name, std::size_t n, float first, int device = 0) {
  CreateOptions o;
  o.persistent = true;
  o.device = device;
  auto t = reg.create<float>(name, {static_cast<std::int64_t>(n)}, o);
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), first);
  t.copy_from_host(v);
  return t;
}

std::vector<float> read(const SharedTensor<float>& t) {
  std::vector<float> v(t.size());
  t.copy_to_host(v);
  return v;
}

ReplicateOptions to(std::vector<int> devices, std::chrono::milliseconds idle = 0ms, bool prefix = false) {
  ReplicateOptions o;
  o.devices = std::move(devices);
  o.idle = idle;
  o.prefix = prefix;
  return o;
}

GetOptions local(int device, cudaStream_t s) {
  GetOptions o;
  o.replica = LocalReplica::use;
  o.reader_device = device;
  o.stream = s;
  return o;
}

}  // namespace

TEST_CASE("replicas on one GPU: the source serves its own device, nothing is made", "[gpu][replica]") {
  MEMCUDA_REQUIRE_GPU();
  test::RedisServer srv;
  TensorRegistry reg(cuda_opts(srv));
  auto t = filled(reg, "m/w", 1024, 1.0f);
  CHECK(replicate(reg, "m/w", to({0})).empty());
  CHECK(reg.list_page(".memcuda-rep/", "", 10).tensors.empty());
  auto g = reg.get<float>("m/w", local(0, nullptr));
  CHECK(g.name() == "m/w");
  CHECK(g.generation() == t.generation());
  CHECK(drop_replicas(reg, "m/w") == 0);
  CHECK(drop_replicas(reg, "m/", {.prefix = true}) == 0);
  CHECK_THROWS_AS(drop_replicas(reg, "", {.prefix = true}), InvalidArgument);
  CHECK_THROWS_AS(replicate(reg, "m/w", to({7})), InvalidArgument);  // no such device
}

TEST_CASE("every step of a copy on one GPU (a replica beside its source): made, waited for, read, refreshed, freed",
          "[gpu][replica]") {
  MEMCUDA_REQUIRE_GPU();
  test::RedisServer srv;
  TensorRegistry reg(cuda_opts(srv));
  detail::fault::arm("replicate.same_device", -1);
  struct Disarm {
    ~Disarm() { detail::fault::disarm("replicate.same_device"); }
  } disarm;
  const std::size_t n = (48u << 20) / sizeof(float) + 7;  // several chunks and a ragged end
  auto src = filled(reg, "m/w", n, 3.0f);
  auto made = replicate(reg, "m/w", to({0}));
  REQUIRE(made.size() == 1);
  const std::string rep = ".memcuda-rep/" + detail::device_uuid(0) + "/m/w";
  CHECK(made[0].name == rep);
  cudaStream_t s{};
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  auto r = reg.get<float>("m/w", local(0, s));
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(r.name() == rep);
  CHECK(r.data() != src.data());
  CHECK(read(r) == read(src));
  CHECK(r.info().replica_path == "peer");
  // a second replicate finds it current; a publish has the allocator of
  // record copy the source into it again, in place
  CHECK(replicate(reg, "m/w", to({0}))[0].generation == made[0].generation);
  std::vector<float> twos(n, 2.0f);
  src.copy_from_host(twos);
  (void)src.publish();
  CHECK(test::eventually([&] { return reg.get<float>("m/w", local(0, s)).name() == rep; }, 10s));
  auto r2 = reg.get<float>("m/w", local(0, s));  // its stream waits for the refresh's copy
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(r2.generation() == made[0].generation);
  CHECK(r2.data() == r.data());
  CHECK(read(r2) == twos);
  CHECK(read(r) == twos);  // the first reader sees the new bytes where it reads
  CHECK(replicate(reg, "m/w", to({0}))[0].generation == made[0].generation);  // current
  auto in_use = [&] {
    std::uint64_t b = 0;
    for (const auto& p : reg.stats().pools) b += p.in_use;
    return b;
  };
  const auto before = in_use();
  // the source removed: its replica goes too (one block: refreshed in
  // place), its memory with its last reader
  r.release();
  r2.release();
  src.release();
  reg.remove("m/w");
  CHECK(test::eventually([&] { return reg.list_page(".memcuda-rep/*", "", 10).tensors.empty(); }, 10s));
  CHECK(test::eventually([&] { return in_use() + 2 * n * sizeof(float) <= before; }, 10s));
  cudaStreamDestroy(s);
}

TEST_CASE("a replica on GPU 1: a local get reads it, another process shares it, a publish makes it stale",
          "[gpu][multi-gpu][replica]") {
  MEMCUDA_REQUIRE_GPUS(2);
  test::RedisServer srv;
  TensorRegistry reg(cuda_opts(srv));
  const std::size_t n = 1 << 20;
  auto src = filled(reg, "m/w", n, 0.0f);
  auto made = replicate(reg, "m/w", to({1}));
  REQUIRE(made.size() == 1);
  const std::string rep = ".memcuda-rep/" + detail::device_uuid(1) + "/m/w";
  CHECK(made[0].name == rep);
  const auto info = reg.info(rep);
  CHECK(info.replica_of == "m/w");
  CHECK(info.source_generation == src.generation());
  CHECK(info.device_uuid == detail::device_uuid(1));
  CHECK(info.copied_version == std::optional<std::uint64_t>(src.info().event_version));
  // its name's once the call's own reference went (through the release queue)
  CHECK(test::eventually([&] { return reg.info(rep).refcount == 1; }, 5s));

  cudaStream_t s{};
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  auto r = reg.get<float>("m/w", local(1, s));
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(r.name() == rep);
  CHECK(r.device() == 1);
  CHECK(r.data() != src.data());
  CHECK(read(r) == read(src));
  // GPU 1 is ordinal 0 of a process that sees only it: it gets the same replica
  test::Child w({"/usr/bin/env", "CUDA_VISIBLE_DEVICES=1", test::sibling_program("memcuda_test_worker"), "--url",
                 srv.unix_url(), "--backend", "cuda", "--no-control"});
  REQUIRE(w.read_line(20s));
  const std::uint64_t sum = std::uint64_t(n) * (n - 1) / 2;  // the worker prints it without decimals
  CHECK(w.ask("getlocal m/w", 30s) ==
        "OK gen=" + std::to_string(made[0].generation) + " name=" + rep + " device=0 sum=" + std::to_string(sum));
  // replicated again: found current, not made anew
  auto again = replicate(reg, "m/w", to({1}));
  REQUIRE(again.size() == 1);
  CHECK(again[0].generation == made[0].generation);

  // the source written in place and published: the replica follows, in
  // place, for this process and the other
  std::vector<float> ones(n, 1.0f);
  src.copy_from_host(ones);
  (void)src.publish();
  CHECK(test::eventually([&] { return reg.get<float>("m/w", local(1, s)).name() == rep; }, 10s));
  auto r2 = reg.get<float>("m/w", local(1, s));
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(r2.generation() == made[0].generation);
  CHECK(read(r2) == ones);
  CHECK(read(r) == ones);  // the first reader sees the new bytes where it reads
  CHECK(w.ask("getlocal m/w", 30s) ==
        "OK gen=" + std::to_string(made[0].generation) + " name=" + rep + " device=0 sum=" + std::to_string(n));
  // replicated again after another publish: refreshed in place too (or found refreshed)
  src.copy_from_host(std::vector<float>(n, 0.5f));
  (void)src.publish();
  auto fresh = replicate(reg, "m/w", to({1}));
  REQUIRE(fresh.size() == 1);
  CHECK(fresh[0].generation == made[0].generation);
  auto r3 = reg.get<float>("m/w", local(1, s));
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(r3.name() == rep);
  CHECK(read(r3) == std::vector<float>(n, 0.5f));
  cudaStreamDestroy(s);
}

TEST_CASE("replicas go with their source, when idle, or when dropped", "[gpu][multi-gpu][replica]") {
  MEMCUDA_REQUIRE_GPUS(2);
  test::RedisServer srv;
  TensorRegistry reg(cuda_opts(srv));
  const std::string uuid = detail::device_uuid(1);
  auto gone = [&](const std::string& name) {
    return test::eventually([&] {
      try {
        (void)reg.info(".memcuda-rep/" + uuid + "/" + name);
        return false;
      } catch (const NotFound&) {
        return true;
      }
    }, 10s);
  };
  {
    auto a = filled(reg, "g/a", 4096, 1.0f);
    REQUIRE(replicate(reg, "g/a", to({1})).size() == 1);
  }
  reg.remove("g/a");
  CHECK(gone("g/a"));

  auto b = filled(reg, "g/b", 4096, 1.0f);
  REQUIRE(replicate(reg, "g/b", to({1}, 300ms)).size() == 1);
  CHECK(gone("g/b"));
  CHECK(b.generation() == reg.info("g/b").generation);  // the source stays

  auto c = filled(reg, "g/c", 4096, 1.0f);
  REQUIRE(replicate(reg, "g/c", to({1})).size() == 1);
  CHECK(drop_replicas(reg, "g/c", {.devices = {1}}) == 1);
  CHECK(gone("g/c"));
  CHECK(drop_replicas(reg, "g/c") == 0);

  // a prefix: every tensor under it, one replica each
  auto d0 = filled(reg, "p/0", 1024, 0.0f);
  auto d1 = filled(reg, "p/1", 2048, 5.0f);
  auto made = replicate(reg, "p/", to({1}, 0ms, true));
  CHECK(made.size() == 2);
  auto r1 = reg.get<float>("p/1", local(1, nullptr));
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(r1.device() == 1);
  CHECK(read(r1) == read(d1));
  r1.release();
  CHECK(drop_replicas(reg, "p/", {.devices = {1}, .prefix = true}) == 2);
  CHECK(gone("p/0"));
  CHECK(gone("p/1"));
  CHECK(drop_replicas(reg, "p/", {.prefix = true}) == 0);
}

// A/B versions with replicas: each version is copied to the asked device
// before commit makes it current; a reader that opens with `local` reads
// its device's copy and keeps it while the next version arrives. One GPU:
// the fault point puts the copy beside its source; two: on GPU 1.
TEST_CASE("A/B versions reach the asked device before they are current, readers keep their copies",
          "[gpu][replica][model_ab]") {
  MEMCUDA_REQUIRE_GPU();
  test::RedisServer srv;
  TensorRegistry reg(cuda_opts(srv));
  const int dev = test::gpu_count() >= 2 ? 1 : 0;
  if (dev == 0) detail::fault::arm("replicate.same_device", -1);
  struct Disarm {
    ~Disarm() { detail::fault::disarm("replicate.same_device"); }
  } disarm;
  const std::size_t n = (20u << 20) / sizeof(float) + 3;  // two chunks and a ragged end
  const Shape shape{static_cast<std::int64_t>(n)};
  std::vector<float> ones(n, 1.f), twos(n, 2.f);
  ModelVersionOptions o;
  o.backend = BackendKind::cuda;
  o.replicas = {dev};
  REQUIRE(publish_model(reg, "ab/", {{"w", DType::f32, shape, ones.data()}}, o) == 1);
  cudaStream_t s{};
  REQUIRE(cudaSetDevice(dev) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  auto m = open_model(reg, "ab/", s, {.local = true, .reader_device = dev});
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  SharedTensor<float> w1(m.tensors().at("w").handle());
  CHECK(w1.name().starts_with(".memcuda-rep/" + detail::device_uuid(dev) + "/"));
  CHECK(w1.device() == dev);
  CHECK(read(w1) == ones);
  auto plain = open_model(reg, "ab/");  // without `local`: the version's own tensor
  CHECK_FALSE(plain.tensors().at("w").name().starts_with(".memcuda-rep/"));
  plain.close();

  REQUIRE(publish_model(reg, "ab/", {{"w", DType::f32, shape, twos.data()}}, o) == 2);
  CHECK(read(w1) == ones);  // pinned: version 1's copy is not written
  REQUIRE(m.advance(s));
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  SharedTensor<float> w2(m.tensors().at("w").handle());
  CHECK(w2.name().starts_with(".memcuda-rep/"));
  CHECK(w2.generation() != w1.generation());
  CHECK(read(w2) == twos);
  CHECK(read(w1) == ones);
  ModelVersionOptions h;
  h.backend = BackendKind::host;
  h.replicas = {0};
  CHECK_THROWS_AS(begin_model_version(reg, "abh/", {{"w", DType::f32, {4}, nullptr}}, h), InvalidArgument);
  cudaStreamDestroy(s);
}

#endif  // MEMCUDA_HAS_CUDA()
