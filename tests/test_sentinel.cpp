// The registry on Redis Sentinel, against real servers (support/
// redis_sentinel.hpp: a primary, two replicas, three sentinels on loopback):
//  * a connection asks the sentinels for the primary and checks ROLE; a
//    sentinel that is down, answers wrong or does not know the service is
//    skipped, and when none helps the error names each one's answer;
//  * a connection made before a failover leaves the old primary, still up
//    and still a primary, once the watch heard of the new one;
//  * a SENTINEL FAILOVER while a thread creates, gets and releases in a
//    loop: afterwards every persistent tensor reads back byte for byte, no
//    reference is left behind, and creates work again;
//  * kill -9 of the primary with the replica wait on loses no persistent
//    tensor;
//  * a create no replica acknowledges in time succeeds and is counted.
// The time each failover took until a create worked again is printed, not
// asserted.
#include <catch2/catch.hpp>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "memcuda/redis/connection.hpp"
#include "support/redis_sentinel.hpp"
#include "support/registry_options.hpp"
#include "support/redis_server.hpp"
#include "support/skip.hpp"
#include "support/timing.hpp"

using namespace memcuda;
using namespace std::chrono_literals;
using test::SentinelTopology;

namespace {

// Why this redis-server cannot run a sentinel, or nothing.
std::optional<std::string> no_sentinel_support() {
  try {
    test::RedisServer s(test::RedisServerOptions{.requirepass = {},
        .config_lines = {"sentinel monitor probe 127.0.0.1 " + std::to_string(test::free_tcp_port()) + " 1"},
        .sentinel = true});
    s.connect().command({"SENTINEL", "masters"});
    return std::nullopt;
  } catch (const std::exception& e) {
    return std::string("redis-server cannot run as a Redis Sentinel: ") + e.what();
  }
}

RegistryOptions sentinel_options(const SentinelTopology& topo, bool control = true) {
  RegistryOptions o;
  o.control_thread = control;
  o.redis = redis::parse_url(topo.url());
  o.redis.reconnect_timeout = 5s;  // a call waits this long for a new primary
  o.default_backend = BackendKind::host;
  o.share_references = true;
  o.release_linger = std::chrono::microseconds(0);
  return o;
}

std::vector<float> filled(int n, float v) { return std::vector<float>(n, v); }

// Creates persistent p0..p<n-1>, p<i> holding 64 floats of value i.
void create_persistent(TensorRegistry& reg, int n) {
  for (int i = 0; i < n; ++i)
    reg.create<float>("p" + std::to_string(i), {64}, test::persistent()).copy_from_host(filled(64, float(i)));
}

// Every p<i> reads back byte for byte, and after the handles are gone (the
// client's session ended: a release cut off by the switch is dropped with
// it) each is held by its name alone and no other name is left.
void check_persistent(TensorRegistry& reg, SentinelTopology& topo, int n) {
  for (int i = 0; i < n; ++i) {
    const std::string name = "p" + std::to_string(i);
    INFO(name);
    auto t = reg.get<float>(name);
    std::vector<float> back(64);
    t.copy_to_host(back);
    CHECK(back == filled(64, float(i)));
  }
  reg.flush();
  auto c = topo.primary().connect();
  auto held_by_name_alone = [&] {
    if (c.command({"ZCARD", "memcuda:names"}).integer() != n) return false;
    for (int i = 0; i < n; ++i)
      if (test::hget(c, "memcuda:tensor:p" + std::to_string(i), "refcount") != "1") return false;
    return true;
  };
  const bool settled = test::eventually(held_by_name_alone, 10s);  // the GC drops what ended sessions held
  INFO("names left: " << c.command({"ZCARD", "memcuda:names"}).integer());
  for (int i = 0; i < n && !settled; ++i) {
    const std::string key = "memcuda:tensor:p" + std::to_string(i);
    INFO(key);
    CHECK(test::hget(c, key, "refcount") == "1");
  }
  CHECK(settled);
}

// Retries a create until one works; the milliseconds from `t0` until then.
long long until_create_works(TensorRegistry& reg, test::Clock::time_point t0) {
  for (int i = 0;; ++i) {
    try {
      reg.create<float>("after" + std::to_string(i), {4});
      return test::ms_since(t0);
    } catch (const Error&) {  // RedisError, or a create request nobody served in time
      if (test::ms_since(t0) > 60000) throw;
    }
  }
}

}  // namespace

TEST_CASE("a connection through sentinels reaches the primary, and bad sentinels are skipped", "[redis][sentinel]") {
  if (auto why = no_sentinel_support()) MEMCUDA_SKIP(*why);
  SentinelTopology topo;
  const std::string first = std::to_string(topo.sentinel(0).port());

  redis::Connection c(redis::parse_url(topo.url()));
  CHECK(c.command({"ROLE"})[0].str() == "master");
  CHECK(c.command({"CONFIG", "GET", "port"})[1].str() == std::to_string(topo.server(0).port()));

  // a plain Redis (answers SENTINEL with an error) and a dead port come first
  test::RedisServer plain;
  const std::string skip = "redis+sentinel://127.0.0.1:" + std::to_string(plain.port()) + ",127.0.0.1:" +
                           std::to_string(test::free_tcp_port()) + ",127.0.0.1:" + first + "/memcuda";
  redis::Connection d(redis::parse_url(skip));
  CHECK(d.command({"ROLE"})[0].str() == "master");

  // a service nobody monitors: every sentinel's answer is in the error
  auto none = redis::parse_url("redis+sentinel://127.0.0.1:" + first + ",127.0.0.1:" +
                               std::to_string(plain.port()) + "/nosuch");
  try {
    redis::Connection bad(none);
    FAIL("connected to a service nobody monitors");
  } catch (const ConnectionError& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find("'nosuch'") != std::string::npos);
    CHECK(m.find("127.0.0.1:" + first + " does not monitor 'nosuch'") != std::string::npos);
    CHECK(m.find("127.0.0.1:" + std::to_string(plain.port())) != std::string::npos);
  }

  // one sentinel down: the others answer, for a plain connection and a registry
  topo.sentinel(0).kill();
  redis::Connection e(redis::parse_url(topo.url()));
  CHECK(e.command({"ROLE"})[0].str() == "master");
  TensorRegistry reg(sentinel_options(topo));
  auto x = reg.create<float>("x", {4});
  x.copy_from_host(filled(4, 3.0f));
  std::vector<float> back(4);
  reg.get<float>("x").copy_to_host(back);
  CHECK(back == filled(4, 3.0f));
}

// After SENTINEL FAILOVER the old primary stays a primary until the
// sentinels reconfigure it (some 10 s): a connection still on it would
// write where nobody reads. The watch's next poll moves it.
TEST_CASE("a connection made before a failover leaves the old primary once the watch hears of the new one",
          "[redis][sentinel]") {
  if (auto why = no_sentinel_support()) MEMCUDA_SKIP(*why);
  SentinelTopology topo;
  const auto opts = redis::parse_url(topo.url());
  redis::SentinelWatch watch(opts);
  watch.poll();
  redis::Connection c(opts);
  const int old = topo.primary_port();
  CHECK(c.command({"CONFIG", "GET", "port"})[1].str() == std::to_string(old));
  topo.sentinel(0).connect().command({"SENTINEL", "FAILOVER", SentinelTopology::kService});
  SentinelTopology::wait_until("the sentinels name a new primary", 30s, [&] { return topo.primary_port() != old; });
  watch.poll();
  const auto now = std::to_string(topo.primary_port());
  CHECK(c.command({"CONFIG", "GET", "port"})[1].str() == now);
  CHECK(c.command({"ROLE"})[0].str() == "master");
  INFO("the old primary says ROLE " << topo.server(0).connect().command({"ROLE"})[0].str());
  CHECK(c.command({"SET", "after-failover", "1"}).str() == "OK");
}

TEST_CASE("a SENTINEL FAILOVER under creates, gets and releases loses nothing and leaks nothing", "[sentinel]") {
  if (auto why = no_sentinel_support()) MEMCUDA_SKIP(*why);
  SentinelTopology topo;
  TensorRegistry reg(sentinel_options(topo));  // the allocator of record
  REQUIRE(reg.is_leader());
  constexpr int kPersistent = 16;
  auto client = std::make_unique<TensorRegistry>(sentinel_options(topo, false));
  create_persistent(*client, kPersistent);

  auto held = client->get<float>("p1");  // held across the switch: no Redis needed to use it

  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, failed{0};
  std::thread loop([&] {
    for (int i = 0; !stop.load(); ++i) {
      try {
        auto t = client->create<float>("t" + std::to_string(i), {256});
        t.copy_from_host(filled(256, 1.0f));
        auto p = client->get<float>("p" + std::to_string(i % kPersistent));
        std::vector<float> back(64);
        p.copy_to_host(back);
        if (back == filled(64, float(i % kPersistent))) ++ok;
        else ++failed;
      } catch (const Error&) {
        ++failed;  // during the switch a call may fail after its timeout; none may leak
      }
    }
  });
  std::this_thread::sleep_for(300ms);
  const int old = topo.primary_port();
  const auto t0 = test::Clock::now();
  topo.sentinel(0).connect().command({"SENTINEL", "FAILOVER", SentinelTopology::kService});
  SentinelTopology::wait_until("the sentinels name a new primary", 30s, [&] { return topo.primary_port() != old; });
  const auto switched = test::ms_since(t0);
  std::vector<float> back(64);
  held.copy_to_host(back);
  CHECK(back == filled(64, 1.0f));
  const auto works = until_create_works(*client, t0);
  const int ok_before = ok.load();
  CHECK(test::eventually([&] { return ok.load() > ok_before + 20; }, 20s));
  stop = true;
  loop.join();
  WARN("SENTINEL FAILOVER: new primary named after " << switched << " ms, creates work again after " << works
                                                      << " ms; loop: " << ok.load() << " ok, " << failed.load()
                                                      << " failed");
  held.release();
  client.reset();
  check_persistent(reg, topo, kPersistent);
}

TEST_CASE("kill -9 of the primary with the replica wait on loses no persistent tensor", "[sentinel]") {
  if (auto why = no_sentinel_support()) MEMCUDA_SKIP(*why);
  SentinelTopology topo;
  auto opts = sentinel_options(topo);
  opts.redis.replica_wait = 1000ms;
  TensorRegistry reg(opts);  // the allocator of record
  REQUIRE(reg.is_leader());
  constexpr int kPersistent = 32;
  auto client = std::make_unique<TensorRegistry>([&] {
    auto o = opts;
    o.control_thread = false;
    return o;
  }());
  create_persistent(*client, kPersistent);  // the last create returned: a replica has it
  CHECK(reg.stats().process.replica_wait_misses == 0);
  const auto t0 = test::Clock::now();
  topo.server(0).kill(SIGKILL);
  const auto works = until_create_works(*client, t0);
  WARN("kill -9 of the primary: creates work again after "
       << works << " ms; creates since that no replica acknowledged in time: "
       << reg.stats().process.replica_wait_misses);
  client.reset();
  check_persistent(reg, topo, kPersistent);
}

TEST_CASE("a create no replica acknowledges within the replica wait succeeds, logged and counted", "[sentinel]") {
  if (auto why = no_sentinel_support()) MEMCUDA_SKIP(*why);
  SentinelTopology topo;
  auto opts = sentinel_options(topo);
  opts.redis.replica_wait = 200ms;
  TensorRegistry reg(opts);
  REQUIRE(reg.is_leader());
  const auto before = reg.stats().process.replica_wait_misses;
  reg.create<float>("acked", {4}, test::persistent());
  CHECK(reg.stats().process.replica_wait_misses == before);

  topo.server(1).pause();  // both replicas stopped: WAIT 1 200 gets no acknowledgement
  topo.server(2).pause();
  const auto t0 = test::Clock::now();
  reg.create<float>("unacked", {4}, test::persistent());
  const auto took = test::ms_since(t0);
  topo.server(1).resume();
  topo.server(2).resume();
  WARN("a create with both replicas stopped took " << took << " ms (replica_wait 200 ms)");
  CHECK(reg.stats().process.replica_wait_misses == before + 1);
  CHECK(reg.info("unacked").refcount == 1);
}
