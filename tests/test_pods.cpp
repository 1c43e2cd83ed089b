// Processes in separate containers share tensors through one directory
// (docs/operations.md, "Containers and Kubernetes"). Each "pod" is a worker
// in its own pid, network, mount, UTS and IPC namespaces with a private
// /dev/shm (support/pod.hpp): it reaches Redis through a unix socket and
// the other pods' fd servers and liveness locks through the runtime
// directory, both in the one shared directory. Every worker is pid 1 of its
// pod, so no pid means anything outside it.
//
// Lease and session TTLs are 30 s: a takeover or a collection within the
// tests' bounds can only come from the liveness locks, never from expiry.
// Where pods cannot be made (not root, no unshare) each case is reported
// as skipped with the reason. The cuda_vmm_fd and PyTorch cases are in
// test_pods_gpu.cpp.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "memcuda/protocol.hpp"
#include "support/pod.hpp"
#include "support/redis_server.hpp"
#include "support/skip.hpp"
#include "support/text.hpp"
#include "support/worker.hpp"

using namespace memcuda;
using namespace std::chrono_literals;
using test::Child;

namespace {

const std::vector<std::string> kLong{"--ttl", "30000", "--session-ttl", "30000"};

std::vector<std::string> args(std::vector<std::string> extra) {
  extra.insert(extra.end(), kLong.begin(), kLong.end());
  return extra;
}

// Pod "pod-a", the allocator of record, then pod "pod-b", its standby
// (host backend, long TTLs).
std::pair<std::unique_ptr<Child>, std::unique_ptr<Child>> leader_and_standby(const test::RedisServer& srv,
                                                                             const test::PodVolume& vol) {
  auto a = test::start_pod_worker("pod-a", srv, vol, args({"--backend", "host"}));
  REQUIRE(test::ready(*a));
  auto b = test::start_pod_worker("pod-b", srv, vol, args({"--backend", "host"}));
  REQUIRE_FALSE(test::ready(*b));
  return {std::move(a), std::move(b)};
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

bool within(std::chrono::milliseconds limit, const std::function<bool()>& done) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!done()) {
    if (std::chrono::steady_clock::now() - t0 > limit) return done();
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

// The session of the pod named `pod` (its node id starts with the hostname).
std::string session_of_pod(redis::Connection& c, const std::string& pod) {
  auto keys = c.command({"KEYS", "memcuda:session:*"});
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto v = c.command({"GET", std::string(keys[i].str())});
    if (v.is_nil()) continue;
    if (test::starts_with(protocol::decode_session(v.str()).node, pod + "/"))
      return std::string(keys[i].str()).substr(std::string("memcuda:session:").size());
  }
  return {};
}

// The standby of pod `pod` holds the fd of every allocation published.
bool standby_synced(redis::Connection& c, const std::string& pod) {
  const std::string s = session_of_pod(c, pod);
  auto v = c.command({"GET", "memcuda:allocations_version"});
  if (s.empty() || v.is_nil()) return false;
  auto m = c.command({"GET", "memcuda:standby:" + s});
  return !m.is_nil() && m.str() == v.str();
}

std::int64_t refcount(redis::Connection& c, const std::string& name) {
  auto r = c.command({"HGET", "memcuda:tensor:" + name, "refcount"});
  return r.is_nil() ? -1 : std::stoll(std::string(r.str()));
}

std::string sum_of(const std::string& reply) { return test::field(reply, "sum"); }

}  // namespace

TEST_CASE("pods: two pods share host tensors both ways through the shared directory only", "[pods]") {
  if (auto why = test::pods_unavailable()) MEMCUDA_SKIP(*why);
  test::RedisServer srv;
  test::PodVolume vol(srv);
  auto c = srv.connect();
  auto [a, b] = leader_and_standby(srv, vol);

  REQUIRE(test::starts_with(a->ask("create x 1000 2", 20s), "OK"));
  // Memory by fd: nothing named in a /dev/shm (each pod has its own).
  CHECK(std::string(c.command({"HGET", "memcuda:tensor:x", "alloc_kind"}).str()) == "host_memfd");
  std::string r = b->ask("get x", 20s);
  INFO(r);
  CHECK(sum_of(r) == "2000");
  REQUIRE(test::starts_with(b->ask("create y 500 3", 20s), "OK"));
  CHECK(sum_of(a->ask("get y", 20s)) == "1500");
  // The same memory, written from either side.
  CHECK(b->ask("fill x 5") == "OK");
  CHECK(sum_of(a->ask("sum x")) == "5000");
  CHECK(a->ask("fill y 7") == "OK");
  CHECK(sum_of(b->ask("sum y")) == "3500");
  // Different hostnames, one machine: one node (the boot id decides).
  const auto na = protocol::decode_session(std::string(c.command({"GET", "memcuda:session:" + session_of_pod(c, "pod-a")}).str())).node;
  const auto nb = protocol::decode_session(std::string(c.command({"GET", "memcuda:session:" + session_of_pod(c, "pod-b")}).str())).node;
  CHECK(na != nb);
  CHECK(na.substr(na.rfind('/')) == nb.substr(nb.rfind('/')));
}

TEST_CASE("pods: kill -9 of the allocator of record's pod leaves every tensor readable from a third pod",
          "[pods]") {
  if (auto why = test::pods_unavailable()) MEMCUDA_SKIP(*why);
  test::RedisServer srv;
  test::PodVolume vol(srv);
  auto c = srv.connect();
  auto [a, b] = leader_and_standby(srv, vol);
  constexpr int kTensors = 8;
  for (int i = 0; i < kTensors; ++i) {
    const std::string n = "k" + std::to_string(i);
    REQUIRE(test::starts_with(a->ask("createp " + n + " 1000 " + std::to_string(i + 1), 20s), "OK"));
    REQUIRE(a->ask("release " + n) == "OK");  // only the name holds it
  }
  REQUIRE(within(20s, [&] { return standby_synced(c, "pod-b"); }));

  const auto t0 = std::chrono::steady_clock::now();
  a->kill(SIGKILL);
  a->wait();
  auto reader = test::start_pod_worker("pod-c", srv, vol, args({"--backend", "host", "--no-control"}));
  REQUIRE(reader->read_line(20s));
  int readable = 0;
  std::string last;
  within(15s, [&] {
    readable = 0;
    for (int i = 0; i < kTensors; ++i) {
      last = reader->ask("get k" + std::to_string(i), 20s);
      if (sum_of(last) == std::to_string(1000 * (i + 1))) ++readable;
      reader->ask("release k" + std::to_string(i));
    }
    return readable == kTensors;
  });
  const double ms = ms_since(t0);
  INFO(last);
  CHECK(readable == kTensors);
  std::printf("pods: every tensor readable from a third pod %.0f ms after kill -9 of the allocator of record's pod "
              "(lease and session TTL 30000 ms)\n", ms);
  CHECK(b->ask("leader") == "OK leader=1");
  // The new allocator of record serves new tensors to the other pods too.
  REQUIRE(test::starts_with(b->ask("create after 100 4", 20s), "OK"));
  CHECK(sum_of(reader->ask("get after", 20s)) == "400");
}

TEST_CASE("pods: a killed holder in another pod is collected by its liveness lock", "[pods]") {
  if (auto why = test::pods_unavailable()) MEMCUDA_SKIP(*why);
  test::RedisServer srv;
  test::PodVolume vol(srv);
  auto c = srv.connect();
  auto a = test::start_pod_worker("pod-a", srv, vol, args({"--backend", "host"}));
  REQUIRE(test::ready(*a));
  REQUIRE(test::starts_with(a->ask("createp h 1000 1", 20s), "OK"));
  REQUIRE(a->ask("release h") == "OK");
  auto b = test::start_pod_worker("pod-b", srv, vol, args({"--backend", "host", "--no-control"}));
  REQUIRE(b->read_line(20s));
  REQUIRE(sum_of(b->ask("get h", 20s)) == "1000");
  REQUIRE(refcount(c, "h") == 2);  // the name's and the holder's
  const auto t0 = std::chrono::steady_clock::now();
  b->kill(SIGKILL);
  b->wait();
  CHECK(within(15s, [&] { return refcount(c, "h") == 1; }));
  std::printf("pods: a killed holder's reference dropped %.0f ms after kill -9 of its pod (session TTL 30000 ms)\n",
              ms_since(t0));
}

TEST_CASE("pods: a pod of another uid is refused with a clear error, an allowed one is served", "[pods]") {
  if (auto why = test::pods_unavailable()) MEMCUDA_SKIP(*why);
  test::RedisServerOptions ro;
  ro.config_lines = {"unixsocketperm 777"};  // Redis is open to every user: the fd service decides
  test::RedisServer srv(ro);
  test::PodVolume vol(srv);

  SECTION("default policy: own uid only") {
    auto a = test::start_pod_worker("pod-a", srv, vol, args({"--backend", "host"}));
    REQUIRE(test::ready(*a));
    REQUIRE(test::starts_with(a->ask("create x 1000 2", 20s), "OK"));
    auto d = test::start_pod_worker("pod-d", srv, vol, args({"--backend", "host", "--no-control", "--uid", "65534"}));
    REQUIRE(d->read_line(20s));
    const std::string r = d->ask("get x", 20s);
    INFO(r);
    CHECK(test::starts_with(r, "ERR "));
    CHECK_THAT(r, Catch::Contains("Permission denied") && Catch::Contains("MEMCUDA_ALLOWED_GIDS"));
    // The refusal cost the others nothing.
    CHECK(sum_of(a->ask("get x", 20s)) == "2000");
  }
  SECTION("uid 65534 allowed") {
    const std::vector<std::string> env{"MEMCUDA_ALLOWED_UIDS=65534"};
    auto a = test::start_pod_worker("pod-a", srv, vol, args({"--backend", "host"}), env);
    REQUIRE(test::ready(*a));
    REQUIRE(test::starts_with(a->ask("create x 1000 2", 20s), "OK"));
    auto d = test::start_pod_worker("pod-d", srv, vol,
                                    args({"--backend", "host", "--no-control", "--uid", "65534"}), env);
    REQUIRE(d->read_line(20s));
    CHECK(sum_of(d->ask("get x", 20s)) == "2000");
  }
}
