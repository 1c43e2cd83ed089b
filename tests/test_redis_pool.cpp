// redis::ConnectionPool against a private redis-server per test: many
// threads at once, a blocked lease not delaying others, waiting for a free
// connection and timing out, broken connections replaced, bad options.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/redis/connection_pool.hpp"
#include "support/redis_server.hpp"

using namespace memcuda;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

long long ms_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

redis::Options short_timeouts(redis::Options o) {
  o.connect_timeout = 500ms;
  o.command_timeout = 2000ms;
  o.reconnect_timeout = 300ms;
  return o;
}

// Waits until the server reports `n` clients blocked in a BLPOP or the like.
void wait_blocked_clients(redis::Connection& admin, int n) {
  const auto t0 = Clock::now();
  for (;;) {
    std::string info(admin.command({"INFO", "clients"}).str());
    if (contains(info, "blocked_clients:" + std::to_string(n) + "\r")) return;
    REQUIRE(ms_since(t0) < 5000);
    std::this_thread::sleep_for(2ms);
  }
}

}  // namespace

TEST_CASE("pool: threads share the pool without exceeding its size", "[redis][redis_pool]") {
  test::RedisServer srv;
  redis::ConnectionPool pool(srv.options(), {.size = 3, .wait_timeout = 10s});
  CHECK(pool.capacity() == 3);
  CHECK(pool.open() == 1);  // the first connection is made eagerly
  CHECK(pool.idle() == 1);

  constexpr int kThreads = 8, kRounds = 150;
  std::atomic<int> leased{0}, most{0}, failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      try {
        for (int i = 0; i < kRounds; ++i) {
          auto c = pool.acquire();
          int now = ++leased;
          int seen = most.load();
          while (now > seen && !most.compare_exchange_weak(seen, now)) {
          }
          c->command({"INCR", "total"});
          const std::string key = "t" + std::to_string(t);
          c->command({"SET", key, i});
          if (c->command({"GET", key}).str() != std::to_string(i)) ++failures;
          --leased;
        }
      } catch (...) {
        ++failures;
      }
    });
  for (auto& th : ts) th.join();
  CHECK(failures == 0);
  CHECK(most.load() <= 3);
  CHECK(most.load() >= 2);  // the threads really overlapped
  CHECK(pool.open() <= 3);
  CHECK(pool.idle() == pool.open());
  auto c = pool.acquire();
  CHECK(c->command({"GET", "total"}).str() == std::to_string(kThreads * kRounds));
}

TEST_CASE("pool: a lease blocked in BLPOP does not delay another thread's PING", "[redis][redis_pool]") {
  test::RedisServer srv;
  redis::ConnectionPool pool(srv.options(), {.size = 2, .wait_timeout = 5s});
  auto admin = srv.connect();

  std::string popped;
  std::thread blocker([&] {
    auto c = pool.acquire();
    auto r = c->blocking(10s, {"BLPOP", "q", "10"});
    if (r.is_array()) popped = std::string(r[1].str());
  });
  wait_blocked_clients(admin, 1);

  const auto t0 = Clock::now();
  {
    auto c = pool.acquire();
    CHECK(c->command({"PING"}).str() == "PONG");
    CHECK(c->command({"RPUSH", "q", "wake"}).integer() == 1);
  }
  CHECK(ms_since(t0) < 500);
  blocker.join();
  CHECK(popped == "wake");
  CHECK(pool.open() == 2);
  CHECK(pool.idle() == 2);
}

TEST_CASE("pool: acquire() beyond capacity waits, then times out", "[redis][redis_pool]") {
  test::RedisServer srv;
  redis::ConnectionPool pool(srv.options(), {.size = 1, .wait_timeout = 300ms});
  auto held = pool.acquire();
  CHECK(pool.idle() == 0);

  SECTION("nobody gives it back: TimeoutError saying why and what to do") {
    const auto t0 = Clock::now();
    try {
      (void)pool.acquire();
      FAIL("acquire() beyond capacity returned");
    } catch (const TimeoutError& e) {
      CHECK(contains(e.what(), "300 ms"));
      CHECK(contains(e.what(), "all 1 of the pool are leased"));
      CHECK(contains(e.what(), "PoolOptions::size"));
    }
    CHECK(ms_since(t0) >= 290);
    CHECK(ms_since(t0) < 2000);
    CHECK(held->command({"PING"}).str() == "PONG");  // the held one is untouched
  }

  SECTION("another thread gives it back in time: the waiter gets that connection") {
    const auto id = held->command({"CLIENT", "ID"}).integer();
    std::thread giver([&] {
      std::this_thread::sleep_for(100ms);
      held = redis::ConnectionPool::Lease();  // returns the connection
    });
    const auto t0 = Clock::now();
    auto got = pool.acquire();
    CHECK(ms_since(t0) >= 90);
    CHECK(ms_since(t0) < 300);
    giver.join();
    CHECK(got->command({"CLIENT", "ID"}).integer() == id);
    CHECK(pool.open() == 1);
  }
}

TEST_CASE("pool: try_acquire() lends what is free now and never waits or throws", "[redis][redis_pool]") {
  test::RedisServer srv;
  redis::ConnectionPool pool(srv.options(), {.size = 2, .wait_timeout = 5000ms});
  auto a = pool.acquire();
  auto b = pool.try_acquire();  // room for a second: opened
  REQUIRE(b);
  CHECK((*b)->command({"PING"}).str() == "PONG");
  CHECK(pool.open() == 2);
  const auto t0 = Clock::now();
  CHECK_FALSE(pool.try_acquire());  // all leased: nothing, at once (acquire() would wait 5 s)
  CHECK(ms_since(t0) < 1000);
  const auto id = (*b)->command({"CLIENT", "ID"}).integer();
  b.reset();  // back to the pool
  auto c = pool.try_acquire();  // the idle one again
  REQUIRE(c);
  CHECK((*c)->command({"CLIENT", "ID"}).integer() == id);
  CHECK(pool.open() == 2);

  c.reset();
  a = redis::ConnectionPool::Lease();  // both idle now

  // The server gone: the idle connections are lent as they are (their use
  // fails later, as acquire()'s would); with none idle and a connect
  // failing, nothing, no exception and no room taken.
  redis::ConnectionPool one(short_timeouts(srv.options()), {.size = 2, .wait_timeout = 100ms});
  auto first = one.acquire();
  srv.kill();
  CHECK_FALSE(one.try_acquire());
  CHECK(one.open() == 1);
}

TEST_CASE("pool: a connection that broke is closed and replaced", "[redis][redis_pool]") {
  test::RedisServer srv;
  redis::ConnectionPool pool(short_timeouts(srv.options()), {.size = 1, .wait_timeout = 2s});
  auto admin = srv.connect();

  long long first_id = 0;
  {
    auto c = pool.acquire();
    first_id = c->command({"CLIENT", "ID"}).integer();
    std::thread killer([&] {
      wait_blocked_clients(admin, 1);
      admin.command({"CLIENT", "KILL", "ID", first_id});
    });
    CHECK_THROWS_AS(c->blocking(10s, {"BLPOP", "q", "10"}), ConnectionError);
    killer.join();
    CHECK_FALSE(c->reusable());
  }
  CHECK(pool.open() == 0);  // closed, not returned
  CHECK(pool.idle() == 0);

  auto c = pool.acquire();
  const auto second_id = c->command({"CLIENT", "ID"}).integer();
  CHECK(second_id != first_id);
  CHECK(c->reconnects() == 0);  // a fresh connection, not the old one reconnected
  CHECK(pool.open() == 1);

  SECTION("an error reply does not cost the connection") {
    CHECK_THROWS_AS(c->command({"NO-SUCH-COMMAND"}), ReplyError);
    c = redis::ConnectionPool::Lease();
    CHECK(pool.idle() == 1);
    CHECK(pool.acquire()->command({"CLIENT", "ID"}).integer() == second_id);
  }
  SECTION("a pending interrupt: the connection is closed, not lent with it") {
    c->interrupt();
    c = redis::ConnectionPool::Lease();
    CHECK(pool.open() == 0);
    CHECK(pool.acquire()->command({"PING"}).str() == "PONG");
  }
  SECTION("discard() closes it at once") {
    c.discard();
    CHECK_FALSE(c);
    CHECK(pool.open() == 0);
    auto d = pool.acquire();
    CHECK(d->command({"CLIENT", "ID"}).integer() != second_id);
  }
  SECTION("a server that is gone: acquire() fails without taking room") {
    c = redis::ConnectionPool::Lease();
    c = pool.acquire();  // the idle one; the dead server is noticed by its next command
    c.discard();
    srv.kill();
    CHECK_THROWS_AS(pool.acquire(), ConnectionError);
    CHECK(pool.open() == 0);
    srv.start();
    CHECK(pool.acquire()->command({"PING"}).str() == "PONG");
  }
}

TEST_CASE("pool: bad options are refused before anything is lent", "[redis][redis_pool]") {
  test::RedisServer srv;
  CHECK_THROWS_AS(redis::ConnectionPool(srv.options(), {.size = 0}), InvalidArgument);
  try {
    redis::ConnectionPool p(srv.options(), {.size = 0});
    FAIL("size 0 accepted");
  } catch (const InvalidArgument& e) {
    CHECK(contains(e.what(), "PoolOptions::size is 0"));
  }
  CHECK_THROWS_AS(redis::ConnectionPool(srv.options(), {.size = 1, .wait_timeout = -1ms}), InvalidArgument);
  CHECK_THROWS_AS(redis::ConnectionPool(srv.options(), {.size = redis::ConnectionPool::kMaxSize + 1}),
                  InvalidArgument);

  auto wrong = srv.options();
  wrong.path = srv.socket_path() + ".absent";
  CHECK_THROWS_AS(redis::ConnectionPool(wrong), ConnectionError);  // the first connect is eager

  redis::ConnectionPool pool(srv.options());
  redis::ConnectionPool moved(std::move(pool));
  CHECK(moved.acquire()->command({"PING"}).str() == "PONG");
  CHECK(pool.capacity() == 0);  // NOLINT(bugprone-use-after-move): the documented empty state
  CHECK_THROWS_AS(pool.acquire(), ConnectionError);
}

TEST_CASE("pool: a lease that outlives its pool still closes safely", "[redis][redis_pool]") {
  test::RedisServer srv;
  redis::ConnectionPool::Lease lease;
  {
    redis::ConnectionPool pool(srv.options());
    lease = pool.acquire();
  }
  CHECK(lease->command({"PING"}).str() == "PONG");
}
