// Lingering releases (RegistryOptions::release_linger; holdings.hpp,
// "Lingering"), against a real redis-server and real worker processes: the
// last local handle of a shared reference lingers for the window, a get
// within it takes the handle back with no round trip, and after it the
// reference goes back to Redis by itself (refcounts return to baseline);
// flush() ends the window, a remove + re-create in another process ends it
// within one invalidation message, and a killed process's lingering
// references are collected by the garbage collector.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <iostream>
#include <thread>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "memcuda/detail/registry/core.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"
#include "support/timing.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

RegistryOptions lg_opts(const test::RedisServer& srv, bool control, std::chrono::milliseconds linger) {
  auto o = test::host_options(srv, control);
  o.lease_ttl = 1s;
  o.request_timeout = 5s;
  o.share_references = true;
  o.release_linger = linger;
  return o;
}

using test::eventually;

detail::Holdings& cache_of(TensorRegistry& reg) { return detail::RegistryAccess::core(reg).holdings; }

// Until the invalidation connection is subscribed, gets go to Redis.
bool cache_live(TensorRegistry& reg) {
  return eventually([&] { return cache_of(reg).live(); });
}

std::unique_ptr<test::Child> worker(const test::RedisServer& srv, std::vector<std::string> extra = {}) {
  std::vector<std::string> argv{test::sibling_program("memcuda_test_worker"), "--url", srv.unix_url(), "--no-control",
                                "--backend", "host"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto w = std::make_unique<test::Child>(argv);
  auto l = w->read_line(10s);
  REQUIRE(l);
  REQUIRE(l->rfind("READY", 0) == 0);
  return w;
}

using test::persistent;

}  // namespace

TEST_CASE("a released last handle lingers for the window, is taken back by a get within it, then released",
          "[redis][ref-cache][linger]") {
  test::RedisServer srv;
  TensorRegistry leader(lg_opts(srv, true, 0ms));
  { auto t = leader.create<float>("lg", {16}, persistent()); }  // the name holds it: refcount 1
  leader.flush();
  REQUIRE(leader.info("lg").refcount == 1);

  // Long enough that the checks below run inside it on a loaded machine.
  constexpr auto kWindow = 2000ms;
  TensorRegistry reader(lg_opts(srv, false, kWindow));
  REQUIRE(cache_live(reader));
  const std::string sid = reader.session_id();
  const void* data = nullptr;
  {
    auto a = reader.get<float>("lg");
    data = a.data();
    CHECK(leader.info("lg").holders.at(sid) == 1);
  }  // the last local handle: lingers, its reference stays in Redis
  CHECK(cache_of(reader).lingering() == 1);
  auto info = leader.info("lg");  // the leader's call sends the queued releases of the process: none
  CHECK(info.refcount == 2);
  CHECK(info.holders.count(sid) == 1);

  // Taken back: the same mapping, no second reference, counted as revived.
  const auto revived = cache_of(reader).stats().revived;
  std::chrono::steady_clock::time_point before_last_drop;
  for (int i = 0; i < 100; ++i) {
    auto b = reader.get<float>("lg");
    REQUIRE(b.data() == data);
    before_last_drop = std::chrono::steady_clock::now();
  }  // b's drop: the window starts again
  CHECK(cache_of(reader).stats().revived == revived + 100);
  CHECK(leader.info("lg").holders.at(sid) == 1);

  // After the window, with no call of the reader: back to the baseline.
  CHECK(eventually([&] { return leader.info("lg").refcount == 1; }, 15s));
  // Not before the window: the release can only follow the last drop, which
  // followed before_last_drop, by the whole window (a loaded machine only
  // makes the gap larger).
  const auto took = test::ms_since(before_last_drop);
  test::print_ms(__FILE__, __LINE__, "last drop to the release seen in Redis", took);
  CHECK(took >= kWindow.count());
  CHECK(leader.info("lg").holders.count(sid) == 0);
  CHECK(cache_of(reader).lingering() == 0);

  // A get after the window goes to Redis again (a new reference).
  const auto misses = cache_of(reader).stats().misses;
  auto c = reader.get<float>("lg");
  CHECK(cache_of(reader).stats().misses == misses + 1);
  CHECK(leader.info("lg").refcount == 2);
  // Released before the server goes: a window still open when a registry
  // goes ends then, and its release would be sent to a server already gone.
  c.release();
  reader.flush();
  CHECK(leader.info("lg").refcount == 1);
}

TEST_CASE("flush() ends every lingering window of the process at once", "[redis][ref-cache][linger]") {
  test::RedisServer srv;
  TensorRegistry leader(lg_opts(srv, true, 0ms));
  { auto t = leader.create<float>("f1", {16}, persistent()); }
  { auto t = leader.create<float>("f2", {16}, persistent()); }
  TensorRegistry reader(lg_opts(srv, false, 60000ms));
  REQUIRE(cache_live(reader));
  reader.get<float>("f1").release();
  reader.get<float>("f2").release();
  CHECK(cache_of(reader).lingering() == 2);
  CHECK(leader.info("f1").refcount == 2);
  leader.flush();  // any registry's flush(): the windows are the process's
  CHECK(cache_of(reader).lingering() == 0);
  CHECK(leader.info("f1").refcount == 1);
  CHECK(leader.info("f2").refcount == 1);
}

TEST_CASE("a remove + re-create in another process ends the window within one invalidation message",
          "[redis][ref-cache][linger]") {
  test::RedisServer srv;
  TensorRegistry reg(lg_opts(srv, true, 60000ms));  // allocator of record, and the process that lingers
  REQUIRE(cache_live(reg));
  auto w = worker(srv);
  REQUIRE(w->ask("create x 16 1").rfind("OK", 0) == 0);
  const std::uint64_t g1 = reg.get<float>("x").generation();  // dropped at once: lingers (60 s)
  REQUIRE(cache_of(reg).lingering() == 1);
  REQUIRE(w->ask("release x").rfind("OK", 0) == 0);
  REQUIRE(w->ask("remove x") == "OK");
  REQUIRE(w->ask("create x 16 2").rfind("OK", 0) == 0);
  // The invalidation message drops the lingering handle (its release is
  // queued), long before the window, and a get sees the new tensor.
  CHECK(eventually([&] { return cache_of(reg).lingering() == 0; }, 20s));
  SharedTensor<float> now;
  CHECK(eventually([&] {
    now = reg.get<float>("x");
    return now.generation() != g1;
  }, 20s));
  std::vector<float> buf(16);
  now.copy_to_host(buf);
  CHECK(buf[0] == 2.f);
  reg.flush();
  CHECK(reg.info("x").refcount == 2);  // the worker's (creator) and ours: the old one's is gone
  auto c = srv.connect();
  CHECK(eventually([&] { return c.command({"EXISTS", "memcuda:removed:" + std::to_string(g1)}).integer() == 0; }));
  now.release();
  reg.flush();
  CHECK(reg.info("x").refcount == 1);
}

TEST_CASE("a killed process's lingering references are collected by the garbage collector",
          "[redis][ref-cache][linger][gc]") {
  test::RedisServer srv;
  auto o = lg_opts(srv, true, 0ms);
  o.session_ttl = 1000ms;
  o.gc_interval = 200ms;
  TensorRegistry reg(o);
  REQUIRE(reg.is_leader());
  auto held = reg.create<float>("kg", {64});
  auto w = worker(srv, {"--linger", "60000"});
  // The worker's cache goes live right after it starts; until then a get
  // is not shared (and its drop does not linger): retry until it lingers.
  REQUIRE(eventually([&] {
    REQUIRE(w->ask("get kg").rfind("OK", 0) == 0);
    REQUIRE(w->ask("drop kg") == "OK");
    std::this_thread::sleep_for(50ms);
    return reg.info("kg").refcount == 2;
  }));
  CHECK(reg.info("kg").refcount == 2);  // dropped, yet held: it lingers
  w->kill(SIGKILL);
  w->wait();
  CHECK(eventually([&] { return reg.info("kg").refcount == 1; }, 15s));
  CHECK(reg.info("kg").holders.size() == 1);
}

TEST_CASE("release_linger out of range is rejected", "[redis][ref-cache][linger]") {
  test::RedisServer srv;
  CHECK_THROWS_AS(TensorRegistry(lg_opts(srv, false, -1ms)), InvalidArgument);
  CHECK_THROWS_AS(TensorRegistry(lg_opts(srv, false, 61000ms)), InvalidArgument);
}

TEST_CASE("threads getting and dropping lingering handles while names are removed and re-created",
          "[redis][ref-cache][linger][threads]") {
  test::RedisServer srv;
  TensorRegistry reg(lg_opts(srv, true, 1ms));  // short windows: many end while the threads run
  TensorRegistry other(lg_opts(srv, false, 0ms));
  REQUIRE(cache_live(reg));
  constexpr int kNames = 3;
  for (int i = 0; i < kNames; ++i) reg.create<float>("t" + std::to_string(i), {4}, persistent()).release();
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::atomic<long> gets{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      long i = r;
      while (!stop.load()) {
        const std::string name = "t" + std::to_string(i++ % kNames);
        try {
          auto t = reg.get<float>(name);
          auto copy = t;  // copies of one wrapper: the window starts with the last
          if (t.name() != name || copy.data() != t.data()) bad.fetch_add(1);
          gets.fetch_add(1);
          if (i % 7 == 0) std::this_thread::sleep_for(2ms);  // let a window pass now and then
        } catch (const NotFound&) {
        } catch (const std::exception&) {
          bad.fetch_add(1);
        }
      }
    });
  std::vector<std::uint64_t> last(kNames);
  for (int round = 0; round < 20; ++round) {
    const int i = round % kNames;
    const std::string name = "t" + std::to_string(i);
    try {
      if (round % 2) reg.remove(name);
      else other.remove(name);
      auto t = (round % 3 ? reg : other).create<float>(name, {4}, persistent());
      last[i] = t.generation();
    } catch (const std::exception&) {
      bad.fetch_add(1);
    }
    std::this_thread::sleep_for(5ms);
  }
  stop = true;
  for (auto& t : threads) t.join();
  CHECK(bad.load() == 0);
  CHECK(gets.load() > 0);
  const auto st = cache_of(reg).stats();
  std::cout << "linger threads: " << gets.load() << " gets, " << st.revived << " took a lingering handle back, "
            << st.misses << " misses\n";
  CHECK(st.revived > 0);  // the path under test ran
  for (int i = 0; i < kNames; ++i) {
    const std::string name = "t" + std::to_string(i);
    CHECK(eventually([&] { return reg.get<float>(name).generation() == last[i]; }, 20s));
  }
  // Back to the baseline: each name holds its tensor, nobody else does.
  reg.flush();
  other.flush();
  CHECK(cache_of(reg).lingering() == 0);
  for (auto& t : reg.list()) {
    CHECK(t.refcount == 1);
    CHECK(t.holders.count(reg.session_id()) == 0);
  }
}

TEST_CASE("a long window pending does not hold back other releases", "[redis][ref-cache][linger]") {
  test::RedisServer srv;
  TensorRegistry leader(lg_opts(srv, true, 0ms));
  { auto t = leader.create<float>("long", {4}, persistent()); }
  { auto t = leader.create<float>("plain", {4}, persistent()); }
  TensorRegistry lingering(lg_opts(srv, false, 60000ms));
  REQUIRE(cache_live(lingering));
  auto plain_opts = lg_opts(srv, false, 0ms);
  plain_opts.share_references = false;
  TensorRegistry plain(plain_opts);
  auto p = plain.get<float>("plain");
  lingering.get<float>("long").release();  // a 60 s window: the release thread's timer
  REQUIRE(cache_of(lingering).lingering() == 1);
  auto raw = srv.connect();
  auto refcount = [&](const std::string& n) {
    return std::stoll(std::string(raw.command({"HGET", "memcuda:tensor:" + n, "refcount"}).str()));
  };
  REQUIRE(refcount("plain") == 2);
  p.release();  // queued; no registry call follows: the release thread must send it
  CHECK(eventually([&] { return refcount("plain") == 1; }, 20s));
  CHECK(refcount("long") == 2);  // still lingering
  leader.flush();
  CHECK(refcount("long") == 1);
}
