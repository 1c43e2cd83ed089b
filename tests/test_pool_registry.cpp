// The allocator of record's pool through the registry, host backend: slab
// suballocation, one import per slab per process, dedicated allocations,
// budgets, trim, statistics, poisoning, and publish versions.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <set>
#include <thread>

#include "memcuda/memcuda.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {
RegistryOptions pool_opts(const test::RedisServer& srv, bool control = true) {
  auto o = test::host_options(srv, control);
  o.lease_ttl = 300ms;
  o.pool.host_slab_bytes = 1 << 20;  // 1 MiB slabs, dedicated from 512 KiB
  return o;
}
}  // namespace

TEST_CASE("small tensors share a slab at aligned offsets, and big ones get their own", "[redis][pool]") {
  test::RedisServer srv;
  TensorRegistry reg(pool_opts(srv));
  std::vector<SharedTensor<float>> ts;
  for (int i = 0; i < 10; ++i) ts.push_back(reg.create<float>("t" + std::to_string(i), {100}));
  std::set<std::uint64_t> offsets;
  for (auto& t : ts) {
    CHECK(t.info().alloc_id == ts[0].info().alloc_id);
    CHECK(t.info().offset % 256 == 0);
    CHECK(t.info().alloc_bytes == (1u << 20));
    offsets.insert(t.info().offset);
  }
  CHECK(offsets.size() == 10);
  auto big = reg.create<std::uint8_t>("big", {600 << 10});
  CHECK(big.info().alloc_id != ts[0].info().alloc_id);
  CHECK(big.info().alloc_bytes == (600u << 10));
  CHECK(big.info().offset == 0);
  auto st = reg.stats();
  REQUIRE(st.pools.size() == 1);
  CHECK(st.pools[0].slabs == 2);
  CHECK(st.pools[0].reserved == (1u << 20) + (600u << 10));
  CHECK(st.pools[0].in_use == 10 * 512 + (600u << 10));
  CHECK(st.pools[0].allocations == 11);

  // writes through neighbours never overlap
  for (std::size_t i = 0; i < ts.size(); ++i) {
    std::vector<float> v(100, static_cast<float>(i));
    ts[i].copy_from_host(v);
  }
  for (std::size_t i = 0; i < ts.size(); ++i) {
    std::vector<float> v(100);
    ts[i].copy_to_host(v);
    CHECK(v.front() == static_cast<float>(i));
    CHECK(v.back() == static_cast<float>(i));
  }
}

TEST_CASE("a process maps a slab once for all the tensors in it", "[redis][pool][multiprocess]") {
  test::RedisServer srv;
  TensorRegistry reg(pool_opts(srv));
  std::vector<SharedTensor<float>> ts;
  for (int i = 0; i < 10; ++i) ts.push_back(reg.create<float>("s" + std::to_string(i), {64}));
  test::Child w({test::sibling_program("memcuda_test_worker"), "--url", srv.unix_url(), "--backend", "host",
                 "--no-control"});
  REQUIRE(w.read_line(10s));
  for (int i = 0; i < 10; ++i) CHECK(w.ask("get s" + std::to_string(i)).rfind("OK", 0) == 0);
  auto r = w.ask("stats");
  INFO(r);
  CHECK(r.find("import_opens=1 ") != std::string::npos);
  CHECK(r.find("live_imports=1 ") != std::string::npos);
  for (int i = 0; i < 10; ++i) CHECK(w.ask("release s" + std::to_string(i)) == "OK");
  r = w.ask("stats");
  CHECK(r.find("live_imports=1 ") != std::string::npos);  // idle, kept for the next get
  CHECK(w.ask("get s3").rfind("OK", 0) == 0);
  CHECK(w.ask("stats").find("import_opens=1 ") != std::string::npos);  // no second open
  // the leader publishes its pool statistics every ttl/3 for every process
  for (int i = 0; i < 100 && r.find("pools=1") == std::string::npos; ++i) {
    std::this_thread::sleep_for(20ms);
    r = w.ask("stats");
  }
  INFO("last stats: " << r);
  CHECK(r.find("pools=1 in_use=2560 reserved=1048576") != std::string::npos);  // 10 x 256 B blocks
}

TEST_CASE("freed blocks return to the pool, and trim returns empty slabs", "[redis][pool]") {
  test::RedisServer srv;
  auto o = pool_opts(srv);
  o.pool.retain_empty_slabs = 0;
  TensorRegistry reg(o);
  {
    auto a = reg.create<float>("a", {1000});
    auto b = reg.create<float>("b", {1000});
    CHECK(reg.stats().pools.at(0).in_use == 2 * 4096);
  }
  auto p = reg.stats().pools.at(0);
  CHECK(p.in_use == 0);
  CHECK(p.frees == 2);
  CHECK(p.peak_in_use == 2 * 4096);
  CHECK(p.reserved == (1u << 20));  // not freed on the release path
  CHECK(reg.trim() == (1u << 20));
  CHECK(reg.stats().pools.at(0).reserved == 0);
  reg.reset_peak();
  CHECK(reg.stats().pools.at(0).peak_in_use == 0);
  // the control thread trims too (retain 0): a new slab goes back on its own
  { auto c = reg.create<float>("c", {10}); }
  for (int i = 0; i < 200 && reg.stats().pools.at(0).reserved != 0; ++i) std::this_thread::sleep_for(10ms);
  CHECK(reg.stats().pools.at(0).reserved == 0);
}

TEST_CASE("a budget is enforced with a clear error and leaves the registry consistent", "[redis][pool]") {
  test::RedisServer srv;
  auto o = pool_opts(srv);
  o.pool.budget_bytes = 2 << 20;  // two slabs
  TensorRegistry reg(o);
  TensorRegistry follower(pool_opts(srv));
  auto a = reg.create<std::uint8_t>("a", {900 << 10});
  auto b = reg.create<std::uint8_t>("b", {900 << 10});
  try {
    (void)reg.create<std::uint8_t>("c", {900 << 10});
    FAIL("expected BudgetExceeded");
  } catch (const BudgetExceeded& e) {
    std::string m = e.what();
    CHECK(m.find("budget 2097152") != std::string::npos);
    CHECK(m.find("in use") != std::string::npos);
    CHECK(m.find("921600") != std::string::npos);  // what was asked
  }
  // the same through the lifecycle list, from a follower: same error type
  CHECK_THROWS_AS(follower.create<std::uint8_t>("c", {900 << 10}), BudgetExceeded);
  CHECK_THROWS_AS(reg.info("c"), NotFound);
  CHECK(reg.list().size() == 2);
  a.release();  // frees room: now it fits
  CHECK_NOTHROW(reg.create<std::uint8_t>("c", {900 << 10}));
}

// A new tensor reads as zeros all the same: poison shows in the padding of
// its block and in freed blocks.
TEST_CASE("MEMCUDA_DEBUG_POISON fills freed blocks and block padding with 0xDD", "[redis][pool]") {
  test::RedisServer srv;
  auto o = pool_opts(srv);
  o.pool.poison = true;
  TensorRegistry reg(o);
  auto t = reg.create<std::uint8_t>("p", {1000});
  std::vector<std::uint8_t> v(1000);
  t.copy_to_host(v);
  CHECK(std::all_of(v.begin(), v.end(), [](auto b) { return b == 0; }));
  const auto* pad = static_cast<const std::uint8_t*>(t.data()) + 1000;  // up to the 256-byte alignment
  CHECK(std::all_of(pad, pad + 24, [](auto b) { return b == 0xDD; }));
  std::fill(v.begin(), v.end(), 7);
  t.copy_from_host(v);
  auto* raw = static_cast<std::uint8_t*>(t.data());  // the slab stays mapped by the pool
  t.release();
  reg.flush();  // the release is sent (and the block freed) in the background
  CHECK(std::all_of(raw, raw + 1000, [](auto b) { return b == 0xDD; }));
}

TEST_CASE("publish bumps the event version and refuses stale handles (host backend)", "[redis][pool]") {
  test::RedisServer srv;
  TensorRegistry reg(pool_opts(srv));
  auto t = reg.create<float>("pub", {4});
  CHECK(t.publish() == 1);
  CHECK(t.publish() == 2);
  CHECK(reg.info("pub").event_version == 2);
  CHECK_NOTHROW(t.wait_published(nullptr));
  reg.remove("pub");
  CHECK_THROWS_AS(t.publish(), StaleHandle);
  CHECK_THROWS_AS(t.wait_published(nullptr), StaleHandle);
}

TEST_CASE("an empty dedicated allocation of a fitting size is reused", "[redis][pool]") {
  test::RedisServer srv;
  TensorRegistry reg(pool_opts(srv));
  std::uint64_t first = 0;
  {
    auto a = reg.create<std::uint8_t>("big", {700 << 10});
    first = a.info().alloc_id;
  }
  auto b = reg.create<std::uint8_t>("big2", {650 << 10});  // fits in 700 KiB with < 25% waste
  CHECK(b.info().alloc_id == first);
  auto c = reg.create<std::uint8_t>("big3", {900 << 10});  // nothing fits: a new one
  CHECK(c.info().alloc_id != first);
  CHECK(reg.stats().pools.at(0).slabs == 2);
}
