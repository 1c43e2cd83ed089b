// The registry on Redis Sentinel, against real servers (support/
// redis_sentinel.hpp: a primary, two replicas, three sentinels on loopback):
//  * a connection asks the sentinels for the primary and checks ROLE; a
//    sentinel that is down, answers wrong or does not know the service is
//    skipped, and when none helps the error names each one's answer;
//  * a connection made before a failover leaves the old primary, still up
//    and still a primary, once the watch heard of the new one;
//  * a create no replica acknowledges in time succeeds and is counted;
//  * faults under load from real processes ([load], support/redis_load.hpp):
//    kill -9 of the primary, SENTINEL FAILOVER, a sentinel down, the
//    primary's writes paused (CLIENT PAUSE) and the primary stalled (DEBUG
//    SLEEP). After each, every persistent tensor reads back byte for byte,
//    no reference is leaked, the allocator of record serves, and the time
//    until creates worked again is printed (WARN), not asserted.
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
#include "memcuda/protocol/session.hpp"
#include "memcuda/redis/connection.hpp"
#include "support/redis_load.hpp"
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
  // right after a miss, writes do not wait (a primary without replicas
  // would make each one wait it out): counted as not acknowledged
  const auto t1 = test::Clock::now();
  reg.create<float>("unacked-too", {4}, test::persistent());
  const auto took_next = test::ms_since(t1);
  topo.server(1).resume();
  topo.server(2).resume();
  WARN("a create with both replicas stopped took " << took << " ms, the next one " << took_next
                                                   << " ms (replica_wait 200 ms)");
  CHECK(reg.stats().process.replica_wait_misses == before + 2);
  CHECK(reg.info("unacked").refcount == 1);
}

namespace {

// The allocator of record, and a client without the control thread, with
// the replica wait on (as the load's processes).
struct SentinelRegistries {
  explicit SentinelRegistries(const SentinelTopology& topo)
      : leader(options(topo, true)), client(options(topo, false)) {}
  static RegistryOptions options(const SentinelTopology& topo, bool control) {
    auto o = sentinel_options(topo, control);
    o.redis.replica_wait = 1000ms;
    return o;
  }
  TensorRegistry leader, client;
};

}  // namespace

// What a failover that lost a holder's reference leaves on the new primary
// (its count gone, the record's refcount one lower), made directly: then
// the owner's release reaches zero and frees a block still held. A real
// SENTINEL FAILOVER follows; the holder re-registers, finds no record and
// claims it, and the owner keeps the block (held_frees.hpp).
TEST_CASE("a free on a reference the failover lost is undone: the holder's bytes survive", "[sentinel]") {
  if (auto why = no_sentinel_support()) MEMCUDA_SKIP(*why);
  SentinelTopology topo;
  SentinelRegistries regs(topo);
  REQUIRE(regs.leader.is_leader());
  auto t = regs.leader.create<float>("held", {256});
  t.copy_from_host(filled(256, 7.0f));
  auto h = regs.client.get<float>("held");
  const auto gen = h.generation();
  {
    auto p = topo.primary().connect();
    CHECK(p.command({"HDEL", "memcuda:tensor:held", "holder:" + regs.client.session_id()}).integer() == 1);
    p.command({"HINCRBY", "memcuda:tensor:held", "refcount", -1});
  }
  const auto undone = regs.leader.stats().process.frees_undone;
  t.release();  // the last reference the primary knows of: the block is freed, and held
  REQUIRE(test::eventually([&] { return regs.leader.stats().process.frees_held == 1; }, 10s));
  const int old = topo.primary_port();
  topo.sentinel(0).connect().command({"SENTINEL", "FAILOVER", SentinelTopology::kService});
  SentinelTopology::wait_until("the sentinels name a new primary", 30s, [&] { return topo.primary_port() != old; });
  CHECK(test::eventually([&] { return regs.leader.stats().process.frees_undone == undone + 1; }, 20s));
  auto p = topo.primary().connect();
  const auto removed = "memcuda:removed:" + std::to_string(gen);
  CHECK(test::eventually([&] {
    auto rc = p.command({"HGET", removed, "refcount"});
    return !rc.is_nil() && rc.str() == "1";
  }, 20s));
  CHECK(p.command({"EXISTS", "memcuda:claim:" + std::to_string(gen)}).integer() == 0);
  // the block was not reused: new tensors of its size land elsewhere
  std::vector<SharedTensor<float>> fresh;
  for (int i = 0; i < 8; ++i) {
    fresh.push_back(regs.leader.create<float>("fresh" + std::to_string(i), {256}));
    fresh.back().copy_from_host(filled(256, 1.0f));
  }
  std::vector<float> back(256);
  h.copy_to_host(back);
  CHECK(back == filled(256, 7.0f));
  // Now the last one. The release runs off this thread: its unlinked
  // record goes, and the block is freed for good once a replica has the
  // write and the grace is over (frees_held was 0 already: the undo kept it).
  h.release();
  CHECK(test::eventually([&] { return p.command({"EXISTS", removed}).integer() == 0; }, 20s));
  CHECK(test::eventually([&] { return regs.leader.stats().process.frees_held == 0; }, 40s));
}

// While a failover spreads the sentinels name different primaries, and
// processes that follow the slower ones still take references on the old
// primary, where the allocator of record cannot see them: a block freed
// meanwhile stays held until they agree (HeldFrees::watch_sentinels). A
// sentinel that monitors another server under the service's name makes
// the split here; stopped, the sentinels agree and the block goes.
TEST_CASE("a freed block stays held while the sentinels name different primaries", "[sentinel]") {
  if (auto why = no_sentinel_support()) MEMCUDA_SKIP(*why);
  SentinelTopology topo;
  test::RedisServer other;
  test::RedisServer stray(test::RedisServerOptions{.requirepass = {},
      .config_lines = {"sentinel monitor " + std::string(SentinelTopology::kService) + " 127.0.0.1 " +
                       std::to_string(other.port()) + " 1"},
      .sentinel = true});
  auto o = sentinel_options(topo);
  auto url = topo.url();
  url.insert(url.rfind('/'), ",127.0.0.1:" + std::to_string(stray.port()));  // last: connections never ask it
  o.redis = redis::parse_url(url);
  o.redis.reconnect_timeout = 5s;
  {
    redis::SentinelCensus census(o.redis);
    const auto a = census.ask();
    CHECK(a.answered == 4);
    CHECK_FALSE(a.agreed.has_value());
  }
  TensorRegistry reg(o);
  REQUIRE(reg.is_leader());
  auto t = reg.create<float>("split", {64});
  t.release();
  REQUIRE(test::eventually([&] { return reg.stats().process.frees_held == 1; }, 10s));
  // Agreeing sentinels let it go after the heartbeat's notice and the
  // grace (about 3 s with this heartbeat of 500 ms); split, it stays.
  std::this_thread::sleep_for(5s);
  CHECK(reg.stats().process.frees_held == 1);
  stray.kill(SIGKILL);
  CHECK(test::eventually([&] { return reg.stats().process.frees_held == 0; }, 20s));
  {
    redis::SentinelCensus census(o.redis);
    const auto a = census.ask();
    CHECK(a.answered == 3);
    CHECK(a.agreed == "127.0.0.1:" + std::to_string(topo.primary_port()));
  }
}

// After a switch each process re-registers what it holds on its own loop,
// which a busy machine, or a connection still waiting out the dead primary,
// can hold up past the grace. So a block freed then stays held while a live
// session's value still names another server as the one it registered on,
// and goes once it names the new primary.
TEST_CASE("after a failover a freed block stays held until every live session re-registered", "[sentinel]") {
  if (auto why = no_sentinel_support()) MEMCUDA_SKIP(*why);
  SentinelTopology topo;
  SentinelRegistries regs(topo);
  REQUIRE(regs.leader.is_leader());
  const std::string was = "127.0.0.1:" + std::to_string(topo.primary_port());
  topo.sentinel(0).connect().command({"SENTINEL", "FAILOVER", SentinelTopology::kService});
  SentinelTopology::wait_until("the sentinels name a new primary", 30s,
                               [&] { return "127.0.0.1:" + std::to_string(topo.primary_port()) != was; });
  const std::string now = "127.0.0.1:" + std::to_string(topo.primary_port());
  auto p = topo.primary().connect();
  auto registered = [&](const std::string& sid) {
    auto v = p.command({"GET", "memcuda:session:" + sid});
    return v.is_nil() ? std::string() : protocol::decode_session(v.str()).registered;
  };
  // both registries re-register there and say so
  CHECK(test::eventually([&] {
    return registered(regs.leader.session_id()) == now && registered(regs.client.session_id()) == now;
  }, 20s));
  // a live process (of another node: only its key's expiry would end it) that has not yet
  const std::string behind = "4242-00000000000000aa";
  auto say = [&](const std::string& server) {
    p.command({"SET", "memcuda:session:" + behind,
               protocol::encode_session({4242, "elsewhere/0a1b2c3d", 1, false, {}, {}, server}), "PX", "60000"});
  };
  say(was);
  p.command({"SADD", "memcuda:sessions", behind});
  regs.leader.create<float>("late", {64}).release();
  REQUIRE(test::eventually([&] { return regs.leader.stats().process.frees_held == 1; }, 10s));
  std::this_thread::sleep_for(4s);  // past the notice (1 s) and the grace (2.25 s)
  CHECK(regs.leader.stats().process.frees_held == 1);
  say(now);
  CHECK(test::eventually([&] { return regs.leader.stats().process.frees_held == 0; }, 10s));
}

TEST_CASE("a claim key of the wrong type or with bad counts does not keep a freed block held", "[sentinel]") {
  if (auto why = no_sentinel_support()) MEMCUDA_SKIP(*why);
  SentinelTopology topo;
  SentinelRegistries regs(topo);
  REQUIRE(regs.leader.is_leader());
  auto a = regs.leader.create<float>("wrongtype", {64});
  auto b = regs.leader.create<float>("badcount", {64});
  {
    auto p = topo.primary().connect();
    p.command({"SET", "memcuda:claim:" + std::to_string(a.generation()), "not a hash"});
    p.command({"HSET", "memcuda:claim:" + std::to_string(b.generation()), "s1", "x", "s2", "-3"});
  }
  const auto undone = regs.leader.stats().process.frees_undone;
  a.release();
  b.release();
  // settled as plain frees: neither a claim nor a record names them
  CHECK(test::eventually([&] { return regs.leader.stats().process.frees_held == 0; }, 20s));
  CHECK(regs.leader.stats().process.frees_undone == undone);
}

namespace {

// A SENTINEL FAILOVER under load, from `sentinel`; the milliseconds until
// the sentinels name another primary and until creates work again.
void sentinel_failover_under_load(SentinelTopology& topo, SentinelRegistries& regs, test::RedisLoad& load,
                                  std::size_t sentinel, const char* what) {
  const int old = topo.primary_port();
  const auto t0 = test::Clock::now();
  topo.sentinel(sentinel).connect().command({"SENTINEL", "FAILOVER", SentinelTopology::kService});
  const auto works = test::until_creates_work(regs.client, t0);
  SentinelTopology::wait_until("the sentinels name a new primary", 30s, [&] { return topo.primary_port() != old; });
  const auto switched = test::ms_since(t0);
  CHECK(load.progresses());
  WARN(what << ": new primary named after " << switched << " ms, creates and gets work again after " << works
            << " ms");
}

}  // namespace

TEST_CASE("kill -9 of the primary under load: nothing persistent lost, creates back within failover + 1 s",
          "[sentinel][load]") {
  if (auto why = no_sentinel_support()) MEMCUDA_SKIP(*why);
  SentinelTopology topo;
  SentinelRegistries regs(topo);
  REQUIRE(regs.leader.is_leader());
  test::RedisLoad load(topo.url());
  REQUIRE(load.progresses());
  const int old = topo.primary_port();
  std::atomic<long long> switched{-1};
  const auto t0 = test::Clock::now();
  topo.primary().kill(SIGKILL);
  std::thread watch([&] {
    SentinelTopology::wait_until("the sentinels name a new primary", 30s, [&] { return topo.primary_port() != old; });
    switched = test::ms_since(t0);
  });
  const auto works = test::until_creates_work(regs.client, t0);
  watch.join();
  CHECK(load.progresses());
  load.stop();
  test::check_after_fault(topo.url(), regs.leader, regs.client);
  // The goal: down-after-milliseconds + the election (both in `switched`,
  // counted from the kill) + 1 s.
  const long long goal = switched.load() + 1000;
  WARN("kill -9 of the primary under load: down-after-milliseconds " << SentinelTopology::kDownAfterMs
       << " ms, new primary named after " << switched.load() << " ms, creates and gets work again after " << works
       << " ms (goal: within " << goal << " ms, " << (works <= goal ? "met" : "MISSED")
       << "); creates no replica acknowledged in time: " << regs.leader.stats().process.replica_wait_misses);
}

TEST_CASE("a SENTINEL FAILOVER under load loses nothing and leaks nothing", "[sentinel][load]") {
  if (auto why = no_sentinel_support()) MEMCUDA_SKIP(*why);
  SentinelTopology topo;
  SentinelRegistries regs(topo);
  test::RedisLoad load(topo.url());
  REQUIRE(load.progresses());
  sentinel_failover_under_load(topo, regs, load, 0, "SENTINEL FAILOVER under load");
  load.stop();
  test::check_after_fault(topo.url(), regs.leader, regs.client);
}

TEST_CASE("a sentinel down under load: the service goes on and two sentinels still fail over", "[sentinel][load]") {
  if (auto why = no_sentinel_support()) MEMCUDA_SKIP(*why);
  SentinelTopology topo;
  SentinelRegistries regs(topo);
  test::RedisLoad load(topo.url());
  REQUIRE(load.progresses());
  topo.sentinel(0).kill(SIGKILL);  // the first one of the URL
  const auto t0 = test::Clock::now();
  const auto works = test::until_creates_work(regs.client, t0);
  CHECK(load.progresses());
  WARN("a sentinel killed under load: creates work " << works << " ms after");
  sentinel_failover_under_load(topo, regs, load, 1, "SENTINEL FAILOVER with two sentinels under load");
  load.stop();
  test::check_after_fault(topo.url(), regs.leader, regs.client);
}

// Below down-after-milliseconds the sentinels do not fail over: calls wait
// (up to the command timeout, 2 s) and go on.
TEST_CASE("the primary's writes paused (CLIENT PAUSE WRITE) under load: calls wait, nothing lost or leaked",
          "[sentinel][load]") {
  if (auto why = no_sentinel_support()) MEMCUDA_SKIP(*why);
  SentinelTopology topo;
  SentinelRegistries regs(topo);
  test::RedisLoad load(topo.url());
  REQUIRE(load.progresses());
  const int primary = topo.primary_port();
  const auto t0 = test::Clock::now();
  // shorter than down-after-milliseconds: a longer one stalls the sentinels'
  // hellos (PUBLISH is a write) and they fail over
  topo.primary().connect().command({"CLIENT", "PAUSE", 400, "WRITE"});
  const auto works = test::until_creates_work(regs.client, t0);
  CHECK(load.progresses());
  load.stop();
  CHECK(topo.primary_port() == primary);
  test::check_after_fault(topo.url(), regs.leader, regs.client);
  WARN("CLIENT PAUSE 400 WRITE of the primary under load: creates and gets work again after " << works << " ms");
}

TEST_CASE("the primary stalled (DEBUG SLEEP) under load: calls wait, nothing lost or leaked", "[sentinel][load]") {
  if (auto why = no_sentinel_support()) MEMCUDA_SKIP(*why);
  SentinelTopology topo;
  SentinelRegistries regs(topo);
  test::RedisLoad load(topo.url());
  REQUIRE(load.progresses());
  const int primary = topo.primary_port();
  const auto t0 = test::Clock::now();
  // shorter than down-after-milliseconds: a stall the sentinels ride out
  std::thread stall([&] { topo.primary().connect().command({"DEBUG", "SLEEP", "0.4"}); });
  const auto works = test::until_creates_work(regs.client, t0);
  stall.join();
  CHECK(load.progresses());
  load.stop();
  INFO("the sentinels name port " << topo.primary_port() << ", the stalled primary was " << primary);
  CHECK(topo.primary_port() == primary);
  test::check_after_fault(topo.url(), regs.leader, regs.client);
  WARN("DEBUG SLEEP 0.4 of the primary under load: creates and gets work again after " << works << " ms");
}
