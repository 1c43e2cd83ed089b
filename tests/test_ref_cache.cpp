// In-process reference sharing (include/memcuda/detail/registry/get/holdings.hpp,
// invalidation.hpp; docs/design.md, "In-process reference sharing"), against
// a real redis-server and real worker processes: a second get of a held
// tensor sends nothing to Redis and shares the one reference; refcounts and
// holders stay right; a remove + re-create in another process is seen within
// one invalidation message; the cache is flushed when its invalidation
// connection drops, and gets go to Redis until it is back.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "memcuda/detail/registry/core.hpp"
#include "memcuda/memcuda.hpp"
#include "memcuda/protocol.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"
#include "support/timing.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

RegistryOptions rc_opts(const test::RedisServer& srv, bool control = true) {
  auto o = test::host_options(srv, control);
  o.lease_ttl = 1s;
  o.request_timeout = 5s;
  o.gc_interval = 3600s;  // the leader's GC reads every record: keep it out of the command counts
  o.share_references = true;
  return o;
}

using test::eventually;

// Until the registry's invalidation connection is subscribed, gets go to
// Redis; this waits until a get of `held` shares its handle.
template <class T>
bool cache_live(TensorRegistry& reg, const SharedTensor<T>& held) {
  return eventually([&] { return reg.get<T>(held.name()).handle() == held.handle(); });
}

// Every command the server executes (MONITOR), from any client, collected
// by a thread of its own; sync() waits until everything sent before it was
// seen.
class Monitor {
 public:
  explicit Monitor(const test::RedisServer& srv) : srv_(srv), conn_(srv.options()) {
    conn_.command({"MONITOR"});
    thread_ = std::thread([this] {
      try {
        for (;;) {
          auto r = conn_.receive(redis::kWaitForever);
          std::lock_guard lk(mu_);
          lines_.emplace_back(r.str());
        }
      } catch (const std::exception&) {
      }
    });
  }
  ~Monitor() {
    conn_.interrupt();
    thread_.join();
  }
  void sync() {
    const std::string mark = "monitor-mark-" + std::to_string(++marks_);
    auto c = srv_.connect();
    c.command({"ECHO", mark});
    REQUIRE(eventually([&] {
      std::lock_guard lk(mu_);
      for (auto& l : lines_)
        if (l.find(mark) != std::string::npos) return true;
      return false;
    }));
  }
  void clear() {
    sync();
    std::lock_guard lk(mu_);
    lines_.clear();
  }
  // Commands seen since clear() that mention `needle`.
  std::size_t count(const std::string& needle) {
    sync();
    std::lock_guard lk(mu_);
    std::size_t n = 0;
    for (auto& l : lines_)
      if (l.find(needle) != std::string::npos) ++n;
    return n;
  }

 private:
  const test::RedisServer& srv_;
  redis::Connection conn_;
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::string> lines_;
  int marks_ = 0;
};

std::unique_ptr<test::Child> worker(const test::RedisServer& srv) {
  std::vector<std::string> argv{test::sibling_program("memcuda_test_worker"), "--url", srv.unix_url(), "--no-control",
                                "--backend", "host"};
  auto w = std::make_unique<test::Child>(argv);
  auto l = w->read_line(10s);
  REQUIRE(l);
  REQUIRE(l->rfind("READY", 0) == 0);
  return w;
}

std::uint64_t gen_of(const std::string& reply) {
  auto p = reply.find("gen=");
  REQUIRE(p != std::string::npos);
  return std::stoull(reply.substr(p + 4));
}

// The client id of a registry's invalidation connection (CLIENT LIST, by
// the name it gives itself).
std::string invalidation_client(redis::Connection& admin, const std::string& session) {
  std::string list(admin.command({"CLIENT", "LIST"}).str());
  const std::string want = "name=memcuda-invalidate-" + session + " ";
  std::size_t at = 0;
  while (at < list.size()) {
    auto nl = list.find('\n', at);
    std::string line = list.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
    at = nl == std::string::npos ? list.size() : nl + 1;
    if (line.find(want) == std::string::npos) continue;
    auto p = line.find("id=");
    return line.substr(p + 3, line.find(' ', p) - p - 3);
  }
  return {};
}

}  // namespace

TEST_CASE("a get of a tensor this process holds shares its handle and sends Redis nothing", "[redis][ref-cache]") {
  test::RedisServer srv;
  TensorRegistry reg(rc_opts(srv));
  auto t = reg.create<float>("held", {64});
  REQUIRE(cache_live(reg, t));
  const std::string key = "memcuda:tensor:held";
  Monitor mon(srv);
  mon.clear();
  constexpr int kGets = 1000;
  for (int i = 0; i < kGets; ++i) {
    auto g = reg.get<float>("held");
    REQUIRE(g.data() == t.data());
    REQUIRE(g.handle() == t.handle());
  }
  auto v = reg.get<void>("held");  // untyped shares it too
  CHECK(v.handle() == t.handle());
  CHECK_THROWS_AS(reg.get<std::int32_t>("held"), TypeMismatch);  // answered locally, as Redis would
  CHECK(mon.count(key) == 0);

  // The counter counts: a fresh get asks Redis (one HGET), and still shares.
  auto f = reg.get<float>("held", GetOptions{.fresh = true});
  CHECK(f.handle() == t.handle());
  CHECK(mon.count(key) == 1);

  // And with sharing off, every get is an acquire script on the Hash.
  auto o = rc_opts(srv, false);
  o.share_references = false;
  TensorRegistry plain(o);
  mon.clear();
  auto p1 = plain.get<float>("held");
  auto p2 = plain.get<float>("held");
  CHECK(p1.handle() != p2.handle());
  CHECK(mon.count(key) >= 2);
}

TEST_CASE("many local copies hold one Redis reference, given back once all are gone", "[redis][ref-cache]") {
  test::RedisServer srv;
  TensorRegistry leader(rc_opts(srv));
  CreateOptions keep;
  keep.persistent = true;
  { auto t = leader.create<float>("shared", {16}, keep); }  // the name holds it; refcount 1
  leader.flush();
  REQUIRE(leader.info("shared").refcount == 1);

  TensorRegistry reader(rc_opts(srv, false));
  const std::string sid = reader.session_id();
  auto first = reader.get<float>("shared");
  REQUIRE(cache_live(reader, first));
  {
    std::vector<SharedTensor<float>> many;
    for (int i = 0; i < 200; ++i) many.push_back(reader.get<float>("shared"));
    std::vector<SharedTensor<float>> copies(50, first);
    auto info = leader.info("shared");
    CHECK(info.refcount == 2);  // the name's and this process's one
    REQUIRE(info.holders.count(sid) == 1);
    CHECK(info.holders.at(sid) == 1);
  }
  CHECK(leader.info("shared").holders.at(sid) == 1);  // `first` still holds it
  first.release();
  reader.flush();  // the last local copy's release was queued, not sent on this thread
  auto info = leader.info("shared");
  CHECK(info.refcount == 1);
  CHECK(info.holders.count(sid) == 0);

  // Once nothing is held, a get takes a reference again (from Redis).
  auto again = reader.get<float>("shared");
  CHECK(leader.info("shared").holders.at(sid) == 1);
  CHECK(leader.info("shared").refcount == 2);
  again.release();
  reader.flush();
  CHECK(leader.info("shared").refcount == 1);
}

TEST_CASE("a cached get after a remove and re-create in another process sees the new tensor within one message",
          "[redis][ref-cache]") {
  test::RedisServer srv;
  TensorRegistry reg(rc_opts(srv));  // the allocator of record, and the process that caches
  auto w = worker(srv);
  std::uint64_t g1 = gen_of(w->ask("create x 16 1"));
  auto old = reg.get<float>("x");
  REQUIRE(old.generation() == g1);
  REQUIRE(cache_live(reg, old));
  std::vector<float> buf(16);

  for (int round = 0; round < 5; ++round) {
    const std::uint64_t before = old.generation();
    REQUIRE(w->ask("release x").rfind("OK", 0) == 0);
    REQUIRE(w->ask("remove x") == "OK");
    const auto created = w->ask("create x 16 " + std::to_string(round + 2));
    const auto t0 = std::chrono::steady_clock::now();
    const std::uint64_t g2 = gen_of(created);
    REQUIRE(g2 != before);
    // From the worker's reply on, Redis has queued the invalidation to our
    // connection: at most its delivery separates us from the new tensor.
    SharedTensor<float> now;
    REQUIRE(eventually([&] {
      now = reg.get<float>("x");
      return now.generation() == g2;
    }, 20s, 2ms));
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0);
    std::cout << "remove + re-create in another process seen by a cached get after " << us.count() << " us\n";
    now.copy_to_host(buf);
    CHECK(buf[0] == float(round + 2));
    for (int i = 0; i < 200; ++i) REQUIRE(reg.get<float>("x").generation() == g2);  // never the old one again
    old.copy_to_host(buf);
    CHECK(buf[0] == float(round + 1));  // the old handle still maps the old memory
    CHECK_FALSE(old.valid());
    old = now;
  }
}

TEST_CASE("our own remove is seen by the next get at once", "[redis][ref-cache]") {
  test::RedisServer srv;
  TensorRegistry reg(rc_opts(srv));
  auto t = reg.create<float>("mine", {4});
  REQUIRE(cache_live(reg, t));
  reg.remove("mine");
  CHECK_THROWS_AS(reg.get<float>("mine"), NotFound);
  auto n = reg.create<float>("mine", {4});
  CHECK(reg.get<float>("mine").generation() == n.generation());
}

TEST_CASE("dropping the invalidation connection flushes the cache, and gets go to Redis until it is back",
          "[redis][ref-cache]") {
  test::RedisServer srv;
  TensorRegistry reg(rc_opts(srv));
  auto t = reg.create<float>("k", {8});
  REQUIRE(cache_live(reg, t));
  auto admin = srv.connect();
  const std::string id = invalidation_client(admin, reg.session_id());
  REQUIRE_FALSE(id.empty());

  detail::fault::arm("invalidation.connect", -1);  // keep it down until disarmed
  admin.command({"CLIENT", "KILL", "ID", id});
  // Flushed: the next gets each go to Redis and take a reference of their own.
  REQUIRE(eventually([&] { return reg.get<float>("k").handle() != t.handle(); }));
  SharedTensor<float> n;
  {
    auto a = reg.get<float>("k");
    auto b = reg.get<float>("k");
    CHECK(a.handle() != t.handle());
    CHECK(a.handle() != b.handle());
    CHECK(reg.info("k").holders.at(reg.session_id()) == 3);
    // While nobody listens, a remove + re-create elsewhere is seen at once.
    TensorRegistry other(rc_opts(srv, false));
    other.remove("k");
    n = other.create<float>("k", {8});
    CHECK(reg.get<float>("k").generation() == n.generation());
  }
  CHECK(invalidation_client(admin, reg.session_id()).empty());
  detail::fault::disarm("invalidation.connect");
  // Reconnected: a get inserts its handle again, and the next one shares it.
  CHECK(eventually([&] {
    auto a = reg.get<float>("k");
    return reg.get<float>("k").handle() == a.handle();
  }));
  CHECK_FALSE(invalidation_client(admin, reg.session_id()).empty());

}

TEST_CASE("threads mixing cached gets with removes and re-creates", "[redis][ref-cache][threads]") {
  test::RedisServer srv;
  TensorRegistry reg(rc_opts(srv));
  TensorRegistry other(rc_opts(srv, false));
  constexpr int kNames = 4;
  CreateOptions named;
  named.persistent = true;  // the name holds each tensor: dropped handles do not free it
  std::vector<SharedTensor<float>> keep;
  for (int i = 0; i < kNames; ++i) keep.push_back(reg.create<float>("n" + std::to_string(i), {4}, named));
  REQUIRE(cache_live(reg, keep[0]));

  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::atomic<long> gets{0}, notfound{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r)
    readers.emplace_back([&, r] {
      long i = r;
      while (!stop.load()) {
        const std::string name = "n" + std::to_string(i++ % kNames);
        try {
          auto t = reg.get<float>(name);
          if (t.name() != name || t.data() == nullptr) bad.fetch_add(1);
          gets.fetch_add(1);
        } catch (const NotFound&) {
          notfound.fetch_add(1);
        } catch (const std::exception&) {
          bad.fetch_add(1);
        }
      }
    });
  std::vector<std::uint64_t> last(kNames);
  std::thread churn([&] {
    for (int round = 0; round < 30; ++round) {
      const int i = round % kNames;
      const std::string name = "n" + std::to_string(i);
      try {
        // removes from this process (the cache's own) and from another session
        if (round % 2) reg.remove(name);
        else other.remove(name);
        last[i] = (round % 3 ? reg : other).create<float>(name, {4}, named).generation();
      } catch (const std::exception&) {
        bad.fetch_add(1);
      }
    }
  });
  churn.join();
  stop = true;
  for (auto& t : readers) t.join();
  CHECK(bad.load() == 0);
  CHECK(gets.load() > 0);
  std::cout << "threads: " << gets.load() << " gets, " << notfound.load() << " NotFound during the churn\n";
  // Whatever was cached, every name now means its last creation.
  for (int i = 0; i < kNames; ++i) {
    if (last[i] == 0) continue;
    const std::string name = "n" + std::to_string(i);
    CHECK(eventually([&] { return reg.get<float>(name).generation() == last[i]; }, 20s));
  }
  keep.clear();
  reg.flush();
  other.flush();
  for (auto& t : reg.list()) CHECK(t.holders.count(reg.session_id()) == 0);
}

// The holdings table: a get notes its reference and keeps the record in one
// row; the invalidation of a remove drops the share and the record together,
// and the reference stays noted (Redis still counts it) until the last
// local copy gives it back.
TEST_CASE("one holdings row per name: reference, record and share, and one invalidation path",
          "[redis][ref-cache][holdings]") {
  test::RedisServer srv;
  TensorRegistry reg(rc_opts(srv));
  auto& table = detail::RegistryAccess::core(reg).holdings;
  auto w = worker(srv);
  const std::uint64_t g1 = gen_of(w->ask("create x 16 1"));
  auto held = reg.get<float>("x");
  REQUIRE(held.generation() == g1);
  REQUIRE(cache_live(reg, held));

  auto refs_of = [&](std::uint64_t gen) {
    std::int64_t n = 0;
    for (const auto& [k, count] : table.snapshot())
      if (k.first == "x" && k.second == gen) n += count;
    return n;
  };
  CHECK(refs_of(g1) == 1);  // shared gets take no second reference
  CHECK(table.records() == 1);
  CHECK(table.held_generation("x") == g1);

  REQUIRE(w->ask("release x").rfind("OK", 0) == 0);
  REQUIRE(w->ask("remove x") == "OK");
  REQUIRE(eventually([&] { return !table.held_generation("x"); }));
  CHECK(table.records() == 0);  // the same message dropped the record
  CHECK(refs_of(g1) == 1);      // ours is still held: the removed tensor lives until we let go

  held = {};
  reg.flush();
  CHECK(refs_of(g1) == 0);
  CHECK(table.snapshot().empty());
}

TEST_CASE("the holdings table keeps a bounded number of records", "[redis][ref-cache][holdings]") {
  test::RedisServer srv;
  TensorRegistry reg(rc_opts(srv));
  auto& table = detail::RegistryAccess::core(reg).holdings;
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 4200; ++i) specs.push_back({"r/" + std::to_string(i), DType::u8, {8}, {}});
  std::vector<std::map<std::string, SharedTensor<void>>> made;  // held: a tensor goes with its last reference
  for (std::size_t at = 0; at < specs.size(); at += 2000) {      // a batch holds at most 2048
    std::vector<TensorSpec> part(specs.begin() + at, specs.begin() + std::min(specs.size(), at + 2000));
    made.push_back(reg.create_many(part));
  }
  std::size_t most = 0;
  for (const auto& s : specs) {
    (void)reg.get<std::uint8_t>(s.name);  // the handle goes at once: its record stays for the next get
    most = std::max(most, table.records());
  }
  std::cout << "records kept after 4200 gets of distinct names: " << table.records() << " (at most " << most << ")\n";
  CHECK(most <= 4096);
  CHECK(table.records() > 0);
  made.clear();
  reg.flush();
  CHECK(table.snapshot().empty());
}
