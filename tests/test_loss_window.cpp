// What a takeover can lose of host memory shared by fd (docs/design.md,
// "What is lost when"): a host tensor's memory outlives its allocator of
// record only in the fds standbys hold. Two things keep that from losing
// anything:
// - a create that made a new allocation is answered only once every live
//   standby holds its fd (Core::secure_new_allocations), so a kill -9 right
//   after the answer loses nothing: the test kills at increasing delays
//   after the answer and prints, per delay, how long the create took and
//   whether the tensor was adopted;
// - a process that lacks fds a standby holds leaves a vacant lease to that
//   standby (takeover/succession.hpp): one started right after a graceful
//   stop does not take over and find everything lost.
// Real processes (memcuda_test_worker, memcuda serve) and a real
// redis-server.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/detail/registry/core.hpp"
#include "memcuda/memcuda.hpp"
#include "memcuda/protocol.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/standby_sync.hpp"
#include "support/text.hpp"
#include "support/timing.hpp"
#include "support/worker.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

using test::contains;
using test::eventually;
using test::hget;
using test::ready;
using test::starts_with;

std::unique_ptr<test::Child> worker(const test::RedisServer& srv) {
  return test::start_worker(srv.unix_url(), {"--ttl", "400", "--backend", "host"});
}

// The pid in the lease token "<epoch> <pid>-<hex>", 0 when none holds it.
pid_t leader_pid(redis::Connection& c) {
  auto l = c.command({"GET", "memcuda:leader"});
  if (l.is_nil()) return 0;
  const std::string tok(l.str());
  const auto sp = tok.find(' ');
  return static_cast<pid_t>(std::stol(tok.substr(sp + 1, tok.find('-', sp) - sp - 1)));
}

}  // namespace

TEST_CASE("loss window: kill -9 of the allocator of record right after a create that made a new allocation "
          "loses nothing",
          "[redis][multiprocess][takeover][host]") {
  test::RedisServer srv;
  auto c = srv.connect();
  auto lead = worker(srv);
  REQUIRE(ready(*lead));
  auto standby = worker(srv);
  REQUIRE_FALSE(ready(*standby));  // true only for the allocator of record
  REQUIRE(leader_pid(c) == lead->pid());
  // 4.2 M floats (16.8 MB): over the host dedicated threshold (half a
  // 32 MiB slab), so every create makes an allocation of its own.
  constexpr std::size_t kElems = 4200000;
  const std::vector<int> delays_ms{0, 0, 1, 2, 5, 10, 20, 50, 100, 200};
  int lost = 0;
  for (std::size_t i = 0; i < delays_ms.size(); ++i) {
    const int d = delays_ms[i];
    const std::string name = "w" + std::to_string(i);
    const int value = static_cast<int>(i) + 1;
    INFO("delay " << d << " ms, tensor " << name);
    const auto t0 = std::chrono::steady_clock::now();
    REQUIRE(starts_with(lead->ask("createp " + name + " " + std::to_string(kElems) + " " + std::to_string(value), 20s),
                        "OK"));
    const auto create_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::this_thread::sleep_for(std::chrono::milliseconds(d));
    const pid_t dead = lead->pid(), heir = standby->pid();
    lead->kill(SIGKILL);
    lead->wait();
    REQUIRE(eventually([&] { return leader_pid(c) == heir; }, 15s));
    const std::string key = "memcuda:tensor:" + name;
    std::string outcome;
    REQUIRE(eventually(
        [&] {
          if (c.command({"EXISTS", "memcuda:lost:" + name}).integer() == 1) return (outcome = "lost"), true;
          if (hget(c, key, "owner_pid") == std::to_string(heir)) return (outcome = "adopted"), true;
          return false;
        },
        15s));
    if (outcome == "adopted") {
      const std::string got = standby->ask("get " + name, 20s);
      INFO(got);
      CHECK(contains(got, " sum=" + std::to_string(static_cast<long long>(kElems) * value)));
      CHECK(standby->ask("release " + name) == "OK");
    }
    lost += outcome == "lost";
    std::cout << "loss window: kill -9 " << d << " ms after the answer (create took " << create_ms
              << " ms, allocator of record pid " << dead << "): " << outcome << std::endl;
    CHECK(outcome == "adopted");
    // The heir leads now; a new process is its standby.
    lead = std::move(standby);
    standby = worker(srv);
    REQUIRE_FALSE(ready(*standby));
  }
  std::cout << "loss window: " << lost << " of " << delays_ms.size() << " tensors lost" << std::endl;
  CHECK(lead->ask("exit") == "OK");
  CHECK(standby->ask("exit") == "OK");
}

TEST_CASE("loss window: a process started right after a graceful stop leaves the lease to the standby that holds "
          "the fds",
          "[redis][cli][takeover][host]") {
  test::RedisServer srv;
  auto c = srv.connect();
  // A long lease: the standby campaigns once a period (a third of it), so
  // a process started at the stop would win the vacant lease first.
  auto serve = [&] {
    auto p = std::make_unique<test::Child>(std::vector<std::string>{
        test::cli_path(), "--url", srv.unix_url(), "serve", "--backend", "host", "--lease-ttl", "3000"});
    auto l = p->read_line(15s);
    REQUIRE(l);
    REQUIRE(starts_with(*l, "memcuda serve:"));
    return p;
  };
  auto a = serve();
  REQUIRE(eventually([&] { return leader_pid(c) == a->pid(); }, 10s));
  auto b = serve();
  const pid_t b_id = b->pid();
  {
    RegistryOptions o;
    o.redis = srv.options();
    o.control_thread = false;
    o.default_backend = BackendKind::host;
    TensorRegistry reg(o);
    for (int i = 0; i < 4; ++i) {
      CreateOptions co;
      co.persistent = true;
      auto t = reg.create<float>("p" + std::to_string(i), {1000}, co);
      std::vector<float> v(1000, static_cast<float>(i + 1));
      t.copy_from_host(v);
    }
  }  // only the names hold them now
  REQUIRE(eventually([&] { return test::standby_synced(c, b_id, {"p0", "p1", "p2", "p3"}); }, 10s));

  a->kill(SIGTERM);
  CHECK(a->wait() == 0);
  auto late = serve();  // campaigns in its constructor, right away
  REQUIRE(eventually([&] { return leader_pid(c) != 0; }, 10s));
  CHECK(leader_pid(c) == b_id);
  for (int i = 0; i < 4; ++i) {
    const std::string name = "p" + std::to_string(i);
    INFO(name);
    CHECK(eventually([&] { return hget(c, "memcuda:tensor:" + name, "owner_pid") == std::to_string(b_id); }, 10s));
    CHECK(c.command({"EXISTS", "memcuda:lost:" + name}).integer() == 0);
  }
  {
    RegistryOptions o;
    o.redis = srv.options();
    o.control_thread = false;
    o.default_backend = BackendKind::host;
    TensorRegistry reg(o);
    for (int i = 0; i < 4; ++i) {
      auto t = reg.get<float>("p" + std::to_string(i));
      std::vector<float> got(1000);
      t.copy_to_host(got);
      CHECK(got == std::vector<float>(1000, static_cast<float>(i + 1)));
    }
  }
  late->kill(SIGINT);
  CHECK(late->wait() == 0);
  b->kill(SIGINT);
  CHECK(b->wait() == 0);
}

// A standby that never holds the new allocations (stuck, or refused by the
// owner's policy) must not hold up every create for the full wait: after
// one create timed out on it, creates no longer wait for it, until its
// marker names the current version again.
TEST_CASE("loss window: a standby that does not catch up costs one create's wait, not one per create",
          "[redis][standby]") {
  test::RedisServer srv;
  auto c = srv.connect();
  RegistryOptions o;
  o.redis = srv.options();
  o.default_backend = BackendKind::host;
  TensorRegistry reg(o);
  REQUIRE(reg.is_leader());
  // A standby session of a live process of this node (our parent) that
  // never writes a progress marker.
  const std::string fake = std::to_string(::getppid()) + "-00000000deadbeef";
  const std::string value = protocol::encode_session(
      {::getppid(), detail::node_id(), 1, true, detail::pid_namespace_id(), {}, {}});
  c.command({"SET", "memcuda:session:" + fake, value, "PX", "600000"});
  c.command({"SADD", "memcuda:sessions", fake});
  auto& core = detail::RegistryAccess::core(reg);
  const std::int64_t big = 4200000;  // 16.8 MB: over the dedicated threshold, an allocation of its own each
  std::vector<SharedTensor<float>> keep;
  for (int i = 0; i < 3; ++i) keep.push_back(reg.create<float>("big" + std::to_string(i), {big}));
  CHECK(core.secure_timeouts() == 1);  // the first create waited for it, the next two did not
  // Caught up: waited for again (and, behind on the next allocation, timed out again).
  c.command({"SET", "memcuda:standby:" + fake, std::string(c.command({"GET", "memcuda:allocations_version"}).str())});
  keep.push_back(reg.create<float>("big3", {big}));
  CHECK(core.secure_timeouts() == 2);
  keep.push_back(reg.create<float>("big4", {big}));
  CHECK(core.secure_timeouts() == 2);
}
