// One TensorRegistry shared by many threads: 8 threads mix create, get,
// release, remove, info, list and valid() on the same few names, on the
// leader (control thread, allocator of record) and on a follower (no control
// thread, served by the leader) in the same process. Every outcome is
// checked: a call either succeeds or throws the one error type its race
// allows (NotFound, AlreadyExists, StaleHandle); anything else fails the
// test. At the end every refcount is back to its baseline and the pool holds
// nothing. Public API only.
//
// The same file is built with -fsanitize=thread as memcuda_tsan_tests
// (tests/CMakeLists.txt), so a data race inside the registry fails the suite
// even when the outcomes happen to look right.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"
#include "support/thread_tally.hpp"
#include "support/timing.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

constexpr int kThreads = 8;
constexpr int kNames = 6;  // few names: threads collide on them all the time

// Operations per thread; bounded so a 2-core CI under TSan stays well
// inside the CTest timeout. MEMCUDA_TEST_THREAD_OPS overrides it.
int ops_per_thread() {
  if (const char* e = std::getenv("MEMCUDA_TEST_THREAD_OPS"); e && *e) return std::max(1, std::atoi(e));
  return 150;
}

RegistryOptions host_opts(const test::RedisServer& srv, bool control) {
  auto o = test::host_options(srv, control);
  // Long enough that a starved control thread (TSan, two busy cores) never
  // loses the lease mid-test: a leader change is not what this test is about.
  o.lease_ttl = 10s;
  // Generous: under TSan on two shared cores the leader's single control
  // thread serves eight followers' requests one after another.
  o.request_timeout = 60s;
  // The baseline checks below count Redis references once every handle is
  // gone: a release must not linger past the threads (whatever the
  // environment says; tests/main.cpp clears it too).
  o.release_linger = std::chrono::microseconds(0);
  return o;
}

std::string shared_name(int k) { return "th/n" + std::to_string(k); }

using test::outcome;
using test::Tally;

// One thread's random mix on `reg`. `follower` widens what a create may
// throw: its create is a request to the leader, and another thread's remove
// can unlink the fresh tensor before this thread opens it.
void worker(TensorRegistry& reg, bool follower, int idx, int ops, Tally& tally) {
  std::mt19937 rng(1234u + static_cast<unsigned>(idx));
  std::map<std::string, int> counts;
  std::vector<std::string> fails;
  std::vector<SharedTensor<float>> held;
  auto bump = [&](const char* op, const std::string& out) { ++counts[std::string(op) + ":" + out]; };
  auto check = [&](bool cond, const std::string& what) {
    if (!cond) fails.push_back("thread " + std::to_string(idx) + ": " + what);
  };

  for (int i = 0; i < ops; ++i) {
    const std::string name = shared_name(static_cast<int>(rng() % kNames));
    switch (rng() % 9) {
      case 0:
      case 1: {  // create (and keep the handle)
        SharedTensor<float> t;
        std::string out =
            follower ? outcome<AlreadyExists, NotFound, StaleHandle>("create", name, fails,
                                                                      [&] { t = reg.create<float>(name, {16}); })
                     : outcome<AlreadyExists>("create", name, fails, [&] { t = reg.create<float>(name, {16}); });
        bump("create", out);
        if (out == "ok") {
          check(t.name() == name && t.size() == 16 && t.data() != nullptr, "create " + name + ": bad handle");
          held.push_back(std::move(t));
        }
        break;
      }
      case 2:
      case 3: {  // get (and keep the handle)
        SharedTensor<float> t;
        std::string out = outcome<NotFound>("get", name, fails, [&] { t = reg.get<float>(name); });
        bump("get", out);
        if (out == "ok") {
          check(t.name() == name && t.shape() == Shape{16} && t.dtype() == DType::f32, "get " + name + ": bad handle");
          held.push_back(std::move(t));
        }
        break;
      }
      case 4: {  // release a held handle
        if (held.empty()) break;
        held.erase(held.begin() + static_cast<std::ptrdiff_t>(rng() % held.size()));
        bump("release", "ok");
        break;
      }
      case 5:
        bump("remove", outcome<NotFound>("remove", name, fails, [&] { reg.remove(name); }));
        break;
      case 6: {
        TensorInfo info;
        std::string out = outcome<NotFound>("info", name, fails, [&] { info = reg.info(name); });
        bump("info", out);
        if (out == "ok") check(info.name == name && info.shape == Shape{16}, "info " + name + ": bad record");
        break;
      }
      case 7: {
        std::vector<TensorInfo> all;
        bump("list", outcome<>("list", "th/*", fails, [&] { all = reg.list("th/*"); }));
        for (std::size_t j = 0; j < all.size(); ++j) {
          check(all[j].name.rfind("th/", 0) == 0, "list: foreign name " + all[j].name);
          if (j > 0) check(all[j - 1].name < all[j].name, "list: not sorted by name");
        }
        break;
      }
      case 8: {  // a held handle's validity: StaleHandle once its name moved on
        if (held.empty()) break;
        auto& t = held[rng() % held.size()];
        bump("check_valid", outcome<StaleHandle>("check_valid", t.name(), fails, [&] { t.check_valid(); }));
        break;
      }
    }
    if (held.size() > 8) held.erase(held.begin());  // bounded: old handles go
  }
  // A private tensor: what this thread writes is what it reads back through
  // a second handle, whatever the others do meanwhile.
  const std::string mine = "th/own" + std::to_string(idx);
  std::vector<float> v(64), back(64);
  for (std::size_t j = 0; j < v.size(); ++j) v[j] = static_cast<float>(idx * 1000 + static_cast<int>(j));
  std::string out = outcome<>("create", mine, fails, [&] {
    auto t = reg.create<float>(mine, {64});
    t.copy_from_host(v);
    auto r = reg.get<const float>(mine);
    r.copy_to_host(back);
  });
  bump("private", out);
  check(out != "ok" || back == v, "private tensor " + mine + ": read back other data");
  held.clear();
  tally.add(counts, fails);
}

// Frees that the last release queues to the leader's control thread land a
// moment later; under TSan on two busy cores, many moments.
using test::eventually;

std::uint64_t host_pool_in_use(TensorRegistry& leader) {
  std::uint64_t n = 0;
  for (const auto& p : leader.stats().pools)
    if (p.backend == BackendKind::host) n += p.in_use;
  return n;
}

void run_mix(TensorRegistry& leader, TensorRegistry& reg, bool follower) {
  // Baselines: one tensor a handle on the test's thread keeps alive, one
  // pinned by persistence; the threads get and release both as well.
  auto base = leader.create<float>("th/base", {16});
  CreateOptions pin;
  pin.persistent = true;
  leader.create<float>("th/pin", {16}, pin).release();
  const auto base_ref = leader.info("th/base").refcount;
  const auto pin_ref = leader.info("th/pin").refcount;

  Tally tally;
  const int ops = ops_per_thread();
  {
    std::vector<std::jthread> threads;
    for (int i = 0; i < kThreads; ++i)
      threads.emplace_back([&, i] {
        // The baselines take part in the mix: get, hold, release.
        std::vector<std::string> fails;
        std::map<std::string, int> counts;
        for (const char* n : {"th/base", "th/pin"}) {
          auto t = outcome<>("get", n, fails, [&] { auto h = reg.get<float>(n); });
          ++counts[std::string("baseline:") + t];
        }
        tally.add(counts, fails);
        worker(reg, follower, i, ops, tally);
      });
  }

  INFO("ops per thread: " << ops);
  for (const auto& f : tally.failures) FAIL_CHECK(f);
  CHECK(tally.failures.empty());
  CHECK(tally.count("baseline:ok") == 2 * kThreads);
  CHECK(tally.count("private:ok") == kThreads);
  // The mix really mixed: every operation ran and the races really happened.
  CHECK(tally.count("create:ok") > 0);
  CHECK(tally.count("create:AlreadyExists") > 0);
  CHECK(tally.count("get:ok") > 0);
  CHECK(tally.count("get:NotFound") > 0);
  CHECK(tally.count("remove:ok") > 0);
  CHECK(tally.count("remove:NotFound") > 0);
  CHECK(tally.count("info:ok") + tally.count("info:NotFound") > 0);
  CHECK(tally.count("list:ok") > 0);
  CHECK(tally.count("release:ok") > 0);
  CHECK(tally.count("check_valid:ok") + tally.count("check_valid:StaleHandle") > 0);

  // Every handle is gone: the shared names are freed (non-persistent, no
  // holder), and the baselines hold exactly what they held before.
  CHECK(eventually([&] { return leader.list("th/n*").empty() && leader.list("th/own*").empty(); }, 60s));
  CHECK(leader.list("th/n*").empty());
  CHECK(leader.list("th/own*").empty());
  CHECK(leader.info("th/base").refcount == base_ref);
  CHECK(leader.info("th/pin").refcount == pin_ref);
  CHECK(reg.info("th/base").refcount == base_ref);

  base.release();
  leader.remove("th/pin");
  CHECK(eventually([&] { return leader.list("th/*").empty(); }, 60s));
  CHECK(eventually([&] { return host_pool_in_use(leader) == 0; }, 60s));
  CHECK(host_pool_in_use(leader) == 0);
  CHECK(leader.stats().process.owned_allocations == 0);
}

}  // namespace

TEST_CASE("threads: 8 threads share one leader registry", "[redis][threads]") {
  test::RedisServer srv;
  TensorRegistry leader(host_opts(srv, true));
  REQUIRE(leader.is_leader());
  run_mix(leader, leader, false);
}

TEST_CASE("threads: 8 threads share one follower registry served by the leader", "[redis][threads]") {
  test::RedisServer srv;
  TensorRegistry leader(host_opts(srv, true));
  REQUIRE(leader.is_leader());
  TensorRegistry follower(host_opts(srv, false));
  REQUIRE_FALSE(follower.is_leader());
  run_mix(leader, follower, true);
}
