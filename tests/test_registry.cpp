// TensorRegistry and SharedTensor against a real redis-server, host backend
// (the cuda backend runs the same paths in test_gpu.cpp).
#include <catch2/catch.hpp>

#include <cstdio>
#include <thread>

#include "memcuda/memcuda.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

RegistryOptions host_opts(const test::RedisServer& srv, bool control = true) {
  auto o = test::host_options(srv, control);
  o.lease_ttl = 300ms;
  o.request_timeout = 3s;
  return o;
}

using test::persistent;

}  // namespace

TEST_CASE("the first registry becomes allocator of record and creates directly", "[redis][registry]") {
  test::RedisServer srv;
  TensorRegistry reg(host_opts(srv));
  REQUIRE(reg.is_leader());
  auto t = reg.create<float>("a/b:c.d-1", {2, 3});
  CHECK(t.name() == "a/b:c.d-1");
  CHECK(t.dtype() == DType::f32);
  CHECK(t.shape() == Shape{2, 3});
  CHECK(t.strides() == Shape{3, 1});
  CHECK(t.bytes() == 24);
  CHECK(t.size() == 6);
  CHECK(t.backend() == BackendKind::host);
  CHECK(t.device() == -1);
  CHECK(t.generation() > 0);
  CHECK(t.valid());
  REQUIRE(t.data() != nullptr);

  auto info = reg.info("a/b:c.d-1");
  CHECK(info.refcount == 1);
  CHECK(info.state == TensorState::ready);
  CHECK(info.holders.size() == 1);
  CHECK(info.holders.begin()->first == reg.session_id());
  CHECK(info.owner == reg.session_id());
  CHECK(info.owner_pid == ::getpid());
  CHECK(info.node == reg.node_id());
  auto st = reg.stats();
  CHECK(st.leader.present);
  CHECK(st.leader.is_self);
  CHECK(st.leader.epoch >= 1);
  CHECK(st.tensors == 1);
  CHECK(st.bytes == 24);
  REQUIRE(st.per_device.size() == 1);
  CHECK(st.per_device[0].backend == BackendKind::host);
  CHECK(st.process.owned_allocations == 1);
}

TEST_CASE("data written through one handle is read through another", "[redis][registry]") {
  test::RedisServer srv;
  TensorRegistry leader(host_opts(srv));
  TensorRegistry other(host_opts(srv, false));
  auto w = leader.create<std::int32_t>("ints", {1000});
  std::vector<std::int32_t> v(1000);
  for (int i = 0; i < 1000; ++i) v[static_cast<std::size_t>(i)] = i * 7;
  w.copy_from_host(v);
  auto r = other.get<std::int32_t>("ints");
  std::vector<std::int32_t> back(1000);
  r.copy_to_host(back);
  CHECK(back == v);
  CHECK(leader.info("ints").refcount == 2);
  // bounds are checked on both directions
  std::vector<std::int32_t> big(1001);
  CHECK_THROWS_AS(r.copy_to_host(big), InvalidArgument);
  CHECK_THROWS_AS(r.copy_from_host(std::span<const std::int32_t>(v.data(), 10), 995), InvalidArgument);
  CHECK_NOTHROW(r.copy_from_host(std::span<const std::int32_t>(v.data(), 10), 990));
}

TEST_CASE("refcounts follow handles, and copies share one reference", "[redis][registry]") {
  test::RedisServer srv;
  auto o = host_opts(srv);
  o.share_references = false;  // one reference per get; sharing: test_ref_cache.cpp
  TensorRegistry reg(o);
  auto t = reg.create<double>("x", {4});
  {
    auto g1 = reg.get<double>("x");
    auto g2 = reg.get<double>("x");
    CHECK(reg.info("x").refcount == 3);
    auto copy = g1;  // shares g1's reference
    CHECK(reg.info("x").refcount == 3);
    g1.release();
    CHECK(reg.info("x").refcount == 3);  // copy still holds it
    CHECK(g1.empty());
    CHECK_THROWS_AS(g1.name(), InvalidArgument);
    auto moved = std::move(g2);
    CHECK(g2.empty());
    CHECK(reg.info("x").refcount == 3);
  }
  CHECK(reg.info("x").refcount == 1);
  t.release();
  // the last reference frees the tensor and unlinks the name (seed: delete at 0)
  CHECK_THROWS_AS(reg.info("x"), NotFound);
  CHECK(reg.stats().process.owned_allocations == 0);
}

TEST_CASE("typed access, missing names, duplicates and stale handles give their errors", "[redis][registry]") {
  test::RedisServer srv;
  TensorRegistry reg(host_opts(srv));
  auto t = reg.create<float>("w", {8});

  CHECK_THROWS_AS(reg.get<double>("w"), TypeMismatch);
  CHECK_THROWS_AS(reg.get<std::int8_t>("w"), TypeMismatch);
  CHECK(reg.info("w").refcount == 1);  // a refused get takes no reference
  CHECK_NOTHROW(reg.get<void>("w"));
  CHECK(reg.get<void>("w").dtype() == DType::f32);

  CHECK_THROWS_AS(reg.get<float>("nope"), NotFound);
  CHECK_THROWS_AS(reg.remove("nope"), NotFound);
  CHECK_THROWS_AS(reg.info("nope"), NotFound);
  CHECK_THROWS_AS(reg.create<float>("w", {8}), AlreadyExists);
  CHECK_THROWS_AS(reg.create<float>("bad name", {8}), InvalidArgument);
  CHECK_THROWS_AS(reg.create<float>("", {8}), InvalidArgument);
  CHECK_THROWS_AS(reg.create<float>("neg", {-1}), InvalidArgument);
  CHECK_THROWS_AS(reg.create<float>("huge", {1LL << 40, 1LL << 40}), InvalidArgument);
  CHECK_THROWS_AS(reg.get<float>(std::string(256, 'a')), InvalidArgument);
  CHECK(reg.list().size() == 1);  // failed calls left nothing behind

  auto g = reg.get<float>("w");
  reg.remove("w");
  CHECK_FALSE(g.valid());
  CHECK_THROWS_AS(g.check_valid(), StaleHandle);
  CHECK_THROWS_AS(reg.get<float>("w"), NotFound);
  auto again = reg.create<float>("w", {8});
  CHECK(again.generation() != g.generation());
  CHECK(again.valid());
  CHECK_FALSE(g.valid());
  CHECK_FALSE(t.valid());
}

TEST_CASE("remove while held frees the memory only after the last release", "[redis][registry]") {
  test::RedisServer srv;
  TensorRegistry reg(host_opts(srv));
  auto base = reg.stats().process.owned_allocations;
  auto t = reg.create<float>("held", {256});
  auto g = reg.get<float>("held");
  std::vector<float> ones(256, 1.f);
  t.copy_from_host(ones);
  reg.remove("held");
  CHECK(reg.stats().process.owned_allocations == base + 1);
  CHECK(reg.list().empty());
  t.release();
  CHECK(reg.stats().process.owned_allocations == base + 1);
  std::vector<float> back(256);
  g.copy_to_host(back);  // still mapped and intact
  CHECK(back == ones);
  g.release();
  CHECK(reg.stats().process.owned_allocations == base);
}

TEST_CASE("persistent tensors outlive their handles until removed", "[redis][registry]") {
  test::RedisServer srv;
  TensorRegistry reg(host_opts(srv));
  {
    auto t = reg.create<float>("keep", {4}, persistent());
    CHECK(reg.info("keep").refcount == 2);
  }
  CHECK(reg.info("keep").refcount == 1);
  CHECK(reg.get<float>("keep").size() == 4);
  reg.remove("keep");
  CHECK_THROWS_AS(reg.info("keep"), NotFound);
  CHECK(reg.stats().process.owned_allocations == 0);
}

TEST_CASE("a follower's create goes through the allocator of record", "[redis][registry]") {
  test::RedisServer srv;
  TensorRegistry leader(host_opts(srv));
  TensorRegistry follower(host_opts(srv));
  REQUIRE(leader.is_leader());
  REQUIRE_FALSE(follower.is_leader());
  auto t = follower.create<std::uint8_t>("from-follower", {3, 5});
  CHECK(t.bytes() == 15);
  auto info = leader.info("from-follower");
  CHECK(info.owner == leader.session_id());
  CHECK(info.holders.count(follower.session_id()) == 1);
  CHECK(info.refcount == 1);
  CHECK_THROWS_AS(follower.create<std::uint8_t>("from-follower", {1}), AlreadyExists);
  CHECK(leader.stats().process.owned_allocations == 1);
  t.release();
  // the follower's release queued a free; the leader executes it
  for (int i = 0; i < 200 && leader.stats().process.owned_allocations != 0; ++i) std::this_thread::sleep_for(10ms);
  CHECK(leader.stats().process.owned_allocations == 0);
}

TEST_CASE("without any allocator of record a create fails with NotLeader and leaves nothing queued",
          "[redis][registry]") {
  test::RedisServer srv;
  auto o = host_opts(srv, false);
  o.request_timeout = 200ms;
  TensorRegistry reg(o);
  CHECK_THROWS_AS(reg.create<float>("orphan", {1}), NotLeader);
  auto c = srv.connect();
  CHECK(c.command({"LLEN", "tensor_lifecycle"}).integer() == 0);
}

TEST_CASE("wait blocks until the tensor is created, or times out", "[redis][registry]") {
  test::RedisServer srv;
  TensorRegistry reg(host_opts(srv));
  TensorRegistry waiter(host_opts(srv, false));
  auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(waiter.wait("later", 150ms));
  CHECK(std::chrono::steady_clock::now() - t0 >= 140ms);

  std::thread producer([&] {
    std::this_thread::sleep_for(100ms);
    auto t = reg.create<float>("later", {1}, persistent());
  });
  CHECK(waiter.wait("later", 30s));
  producer.join();
  CHECK(waiter.wait("later", 1ms));  // already there: immediate
  auto c = srv.connect();
  CHECK(c.command({"EXISTS", "memcuda:waiters:later"}).integer() == 0);
}

TEST_CASE("list filters by pattern and stats count per backend", "[redis][registry]") {
  test::RedisServer srv;
  TensorRegistry reg(host_opts(srv));
  std::vector<SharedTensor<float>> ts;
  for (int i = 0; i < 5; ++i) ts.push_back(reg.create<float>("layer" + std::to_string(i) + ".w", {10}));
  ts.push_back(reg.create<float>("other", {1}));
  auto l = reg.list("layer*");
  REQUIRE(l.size() == 5);
  CHECK(l.front().name == "layer0.w");
  CHECK(l.back().name == "layer4.w");
  CHECK(reg.list().size() == 6);
  CHECK(reg.stats().bytes == 5 * 40 + 4);
}

TEST_CASE("namespaces isolate registries on one Redis", "[redis][registry]") {
  test::RedisServer srv;
  auto a = host_opts(srv);
  a.name_space = "teamA";
  auto b = host_opts(srv);
  b.name_space = "teamB";
  TensorRegistry ra(a), rb(b);
  CHECK(ra.is_leader());
  CHECK(rb.is_leader());  // one allocator of record per namespace
  auto t = ra.create<float>("shared", {2});
  CHECK_THROWS_AS(rb.get<float>("shared"), NotFound);
  CHECK_THROWS_AS(rb.remove("shared"), NotFound);
  CHECK(rb.list().empty());
  auto c = srv.connect();
  CHECK(c.command({"EXISTS", "teamA:memcuda:tensor:shared"}).integer() == 1);
  auto bad = host_opts(srv);
  bad.name_space = "has space";
  CHECK_THROWS_AS(TensorRegistry(bad), InvalidArgument);
}

TEST_CASE("a graceful leader shutdown hands the lease over at once", "[redis][registry]") {
  test::RedisServer srv;
  auto o = host_opts(srv);
  o.lease_ttl = 3s;  // takeover must not depend on expiry
  std::optional<TensorRegistry> first(o);
  TensorRegistry second(o);
  REQUIRE(first->is_leader());
  first.reset();
  // Given back, not left to expire: the lease key is gone at once (or
  // already names the standby).
  auto c = srv.connect();
  auto lease = c.command({"GET", "memcuda:leader"});
  CHECK((lease.is_nil() || std::string(lease.str()).find(second.session_id()) != std::string::npos));
  auto t0 = std::chrono::steady_clock::now();
  while (!second.is_leader() && std::chrono::steady_clock::now() - t0 < 30s) std::this_thread::sleep_for(5ms);
  CHECK(second.is_leader());
  std::printf("timing: graceful handover: the standby leads after %lld ms (lease ttl 3 s)\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                         std::chrono::steady_clock::now() - t0).count()));
  CHECK(second.create<float>("after", {1}).valid());
}

TEST_CASE("local tensors are plain process memory", "[registry]") {
  LocalOptions lo;
  lo.backend = BackendKind::host;
  LocalTensor<float> t({16, 16}, lo);
  REQUIRE(t.data() != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(t.data()) % 256 == 0);
  CHECK(t.bytes() == 1024);
  t.data()[255] = 1.f;
  LocalTensor<float> moved = std::move(t);
  CHECK(t.data() == nullptr);
  CHECK(moved.data()[255] == 1.f);
  moved.reset();
  CHECK(moved.data() == nullptr);
}
