// A reader in another pod (own pid namespace: no pidfd_getfd) opening many
// tensors of one owner asks its fd server once, not once per allocation
// (docs/fd-transfer.md, "Batches and prefetch"): the owner sends its other
// allocations' fds along with the first answer, and get_many fetches all of
// its fds in one request. Parked fds go when the owner frees their
// allocation (its inbox notice), so they pin no memory. Pods as in
// test_pods.cpp (support/pod.hpp); skipped where they cannot be made.
#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "support/pod.hpp"
#include "support/redis_server.hpp"
#include "support/skip.hpp"
#include "support/text.hpp"
#include "support/worker.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

// 16 MiB of floats: half a host slab, so each tensor is an allocation of its own.
constexpr long kFloats = 4194304;

std::vector<std::string> args(std::vector<std::string> extra) {
  for (const char* a : {"--backend", "host", "--ttl", "30000", "--session-ttl", "30000"}) extra.push_back(a);
  return extra;
}

bool within(std::chrono::milliseconds limit, const std::function<bool()>& done) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!done()) {
    if (std::chrono::steady_clock::now() - t0 > limit) return done();
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

std::string stat(test::Child& w, const std::string& key) { return test::field(w.ask("stats", 20s), key); }

}  // namespace

TEST_CASE("pods: the first open from another pod brings the owner's other allocations along", "[pods]") {
  if (auto why = test::pods_unavailable()) MEMCUDA_SKIP(*why);
  test::RedisServer srv;
  test::PodVolume vol(srv);
  auto a = test::start_pod_worker("pod-a", srv, vol, args({}));
  REQUIRE(test::ready(*a));
  for (int i = 0; i < 6; ++i)
    REQUIRE(test::starts_with(a->ask("create p" + std::to_string(i) + " " + std::to_string(kFloats) + " " +
                                         std::to_string(i + 1), 20s), "OK"));
  // A window far longer than the case: only the owner's notice drops a parked fd.
  auto b = test::start_pod_worker("pod-b", srv, vol, args({"--no-control"}), {"MEMCUDA_FD_PARK_MS=60000"});
  REQUIRE(b->read_line(20s));
  auto get = [&](int i) {
    return test::field(b->ask("get p" + std::to_string(i), 20s), "sum") == std::to_string(kFloats * (i + 1));
  };
  CHECK(get(0));
  CHECK(stat(*b, "fd_requests") == "1");
  CHECK(stat(*b, "fd_parked") == "5");
  for (int i = 1; i <= 3; ++i) CHECK(get(i));
  CHECK(stat(*b, "fd_requests") == "1");  // four opens, one request
  CHECK(stat(*b, "fd_parked_hits") == "3");

  // The owner frees p5's allocation: its notice drops the parked fd.
  REQUIRE(a->ask("remove p5") == "OK");
  REQUIRE(a->ask("release p5") == "OK");
  CHECK(within(15s, [&] { return stat(*b, "fd_parked") == "1"; }));
  CHECK(get(4));
  CHECK(stat(*b, "fd_requests") == "1");
  CHECK(stat(*b, "fd_parked") == "0");
}

TEST_CASE("pods: get_many from another pod fetches every allocation's fd in one request", "[pods]") {
  if (auto why = test::pods_unavailable()) MEMCUDA_SKIP(*why);
  test::RedisServer srv;
  test::PodVolume vol(srv);
  auto a = test::start_pod_worker("pod-a", srv, vol, args({}));
  REQUIRE(test::ready(*a));
  for (int i = 0; i < 5; ++i)
    REQUIRE(test::starts_with(a->ask("create q/" + std::to_string(i) + " " + std::to_string(kFloats) + " 1", 20s),
                              "OK"));
  // No fds sent along: the batch alone saves the requests.
  auto b = test::start_pod_worker("pod-b", srv, vol, args({"--no-control"}), {"MEMCUDA_FD_PREFETCH=0"});
  REQUIRE(b->read_line(20s));
  CHECK(b->ask("getprefix q/", 30s) == "OK n=5 errors=0");
  CHECK(stat(*b, "fd_requests") == "1");
  CHECK(stat(*b, "fd_parked_hits") == "5");
  CHECK(stat(*b, "fd_parked") == "0");
  CHECK(stat(*b, "import_opens") == "5");
}
