// One registry used from several threads: a call waiting in Redis blocks
// no other call, destructors never wait for Redis, flush() makes releases
// visible, and a moved-from registry refuses to be used.
#include <catch2/catch.hpp>

#include <condition_variable>
#include <future>
#include <mutex>
#include <set>
#include <iostream>
#include <thread>

#include "memcuda/memcuda.hpp"
#include "memcuda/redis/connection.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"
#include "support/timing.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

RegistryOptions conc_opts(const test::RedisServer& srv, bool control = true) {
  auto o = test::host_options(srv, control);
  o.lease_ttl = 1s;
  o.request_timeout = 3s;
  return o;
}

using test::persistent;

using test::eventually;

}  // namespace

// Defect: request() held the client mutex while it waited for the reply, so
// info()/list()/every destructor of the process waited up to
// 2 x request_timeout behind one create sent to a missing leader.
TEST_CASE("a create waiting for a missing allocator of record blocks no other call of the registry",
          "[redis][registry][threads]") {
  test::RedisServer srv;
  auto o = conc_opts(srv, false);
  o.request_timeout = 10s;  // the create must still wait while the calls below run, however loaded the machine
  TensorRegistry reg(o);  // nobody serves the lifecycle list
  redis::Connection probe(srv.options());
  auto create = std::async(std::launch::async, [&]() -> std::string {
    try {
      reg.create<float>("pending", {4});
      return "created";
    } catch (const NotLeader&) {
      return "notleader";
    }
  });
  // The create's command sits in the lifecycle list: its thread now waits.
  REQUIRE(eventually([&] { return probe.command({"LLEN", "tensor_lifecycle"}).integer() == 1; }));

  auto t0 = std::chrono::steady_clock::now();
  auto listed = reg.list();
  auto leader = reg.leader();
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "list()+leader() while another thread's create waits for a leader: " << us << " us\n";
  // Ordering, not timing: both calls returned while the create still waits
  // (its command is still queued and its future not ready).
  CHECK(probe.command({"LLEN", "tensor_lifecycle"}).integer() == 1);
  CHECK(create.wait_for(0s) == std::future_status::timeout);
  CHECK(listed.empty());
  CHECK_FALSE(leader.present);
  CHECK(create.get() == "notleader");
}

TEST_CASE("concurrent creates through one follower each get their own reply", "[redis][registry][threads]") {
  test::RedisServer srv;
  TensorRegistry leader(conc_opts(srv));
  TensorRegistry follower(conc_opts(srv, false));
  REQUIRE(leader.is_leader());
  // Catch's assertions are not thread-safe: the threads return, the test thread checks.
  std::vector<std::future<std::pair<std::string, std::uint64_t>>> fs;
  for (int i = 0; i < 6; ++i)
    fs.push_back(std::async(std::launch::async, [&, i] {
      auto t = follower.create<float>("c" + std::to_string(i), {8});
      return std::make_pair(t.name(), t.generation());
    }));
  std::set<std::uint64_t> gens;
  for (int i = 0; i < 6; ++i) {
    auto [name, gen] = fs[static_cast<std::size_t>(i)].get();
    CHECK(name == "c" + std::to_string(i));
    gens.insert(gen);
  }
  CHECK(gens.size() == 6);
  follower.flush();
  for (int i = 0; i < 6; ++i) CHECK_THROWS_AS(leader.info("c" + std::to_string(i)), NotFound);  // freed
}

TEST_CASE("dropped handles are released in the background and flush() waits for them",
          "[redis][registry][threads]") {
  test::RedisServer srv;
  TensorRegistry leader(conc_opts(srv));
  TensorRegistry other(conc_opts(srv, false));
  auto t = leader.create<float>("rel", {16}, persistent());  // refcount 2: the handle and the name
  {
    auto a = other.get<float>("rel");
    auto b = other.get<float>("rel");
    std::vector<SharedTensor<float>> copies(10, a);
    CHECK(b.handle() == a.handle());            // a get of a held name shares it (test_ref_cache.cpp)
    CHECK(leader.info("rel").refcount == 3);   // the handle, the name, `other`'s one reference
  }
  other.flush();
  CHECK(leader.info("rel").refcount == 2);
  CHECK(leader.info("rel").holders.count(other.session_id()) == 0);
}

// Defect: the last SharedTensor copy did a Redis round trip on the caller's
// thread (blocked for the whole pause, or lost the release on a timeout).
TEST_CASE("a SharedTensor destructor returns while Redis is paused, and its release lands after",
          "[redis][registry][threads]") {
  test::RedisServer srv;
  auto o = conc_opts(srv);
  o.lease_ttl = 5s;
  o.session_ttl = 10s;
  TensorRegistry leader(o);
  auto t = leader.create<float>("paused", {16}, persistent());
  auto h = leader.get<float>("paused");  // shares t's handle and reference
  t.release();                           // so that h is the last copy
  REQUIRE(leader.info("paused").refcount == 2);
  // Writes (a release is one) wait until CLIENT UNPAUSE, which this thread
  // sends after the destructor returned. A destructor that waited for Redis
  // would return only when the watchdog below ends the pause, 20 s on.
  redis::Connection admin(srv.options()), watchdog_conn(srv.options());
  admin.command({"CLIENT", "PAUSE", "60000", "WRITE"});
  std::mutex mu;
  std::condition_variable cv;
  bool returned = false, watchdog_unpaused = false;
  std::thread watchdog([&] {
    std::unique_lock lk(mu);
    if (!cv.wait_for(lk, 20s, [&] { return returned; })) {
      watchdog_unpaused = true;
      watchdog_conn.command({"CLIENT", "UNPAUSE"});
    }
  });
  auto t0 = std::chrono::steady_clock::now();
  h.release();
  {
    std::lock_guard lk(mu);
    returned = true;
  }
  cv.notify_all();
  test::print_ms(__FILE__, __LINE__, "destructor while Redis holds every write", test::ms_since(t0));
  watchdog.join();
  CHECK_FALSE(watchdog_unpaused);  // it returned while the pause held
  admin.command({"CLIENT", "UNPAUSE"});
  leader.flush(15s);
  CHECK(leader.info("paused").refcount == 1);
}

TEST_CASE("releases of tensors that outlive their registry still land", "[redis][registry][threads]") {
  test::RedisServer srv;
  auto lo = conc_opts(srv);
  lo.gc_interval = 3600s;  // the garbage collector must not be what drops the reference
  TensorRegistry leader(lo);
  auto t = leader.create<float>("orphaned", {16}, persistent());
  SharedTensor<float> keep;
  {
    TensorRegistry other(conc_opts(srv, false));
    keep = other.get<float>("orphaned");
  }
  CHECK(leader.info("orphaned").refcount == 3);
  keep.release();  // no registry left in that session: the core's release thread sends it
  CHECK(eventually([&] { return leader.info("orphaned").refcount == 2; }));
}

// Defect: the noexcept accessors of a moved-from registry dereferenced null.
TEST_CASE("a moved-from TensorRegistry throws a clear error", "[redis][registry]") {
  test::RedisServer srv;
  TensorRegistry a(conc_opts(srv));
  TensorRegistry b(std::move(a));
  CHECK(b.is_leader());
  CHECK_THROWS_WITH(a.session_id(), Catch::Contains("moved-from TensorRegistry"));
  CHECK_THROWS_AS(a.is_leader(), InvalidArgument);
  CHECK_THROWS_AS(a.options(), InvalidArgument);
  CHECK_THROWS_AS(a.info("x"), InvalidArgument);
  CHECK_THROWS_AS(a.create<float>("x", {1}), InvalidArgument);
  CHECK_THROWS_AS(a.flush(), InvalidArgument);
  CHECK_THROWS_AS(a.check(), InvalidArgument);
}
