// One allocation, one pool: memory that a live process adopted at a takeover
// stays that process's while it lives. A later allocator of record that
// took it into its own pool as well would hand the live tensors' bytes to
// new tensors (it zeroes and writes them). Real processes
// (memcuda_test_worker) against a real redis-server.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"
#include "support/standby_sync.hpp"
#include "support/timing.hpp"
#include "support/worker.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

constexpr std::int64_t kElems = 64;

std::vector<float> pattern(int tag) {
  std::vector<float> v(kElems);
  for (std::int64_t i = 0; i < kElems; ++i) v[i] = static_cast<float>(tag * 1000) + static_cast<float>(i);
  return v;
}

RegistryOptions opts(const test::RedisServer& srv, bool control) {
  auto o = test::host_options(srv, control);
  o.lease_ttl = 1s;
  o.request_timeout = 30s;
  return o;
}

std::unique_ptr<test::Child> worker(const test::RedisServer& srv) {
  return test::start_worker(srv.unix_url(), {"--backend", "host", "--ttl", "1000", "--timeout", "30000"});
}

}  // namespace

// The allocator of record A makes x (persistent) and y in one memfd; y is
// removed and its last reference dropped while A is stopped (alive), so the
// free goes to A's inbox and y's record stays, unlinked, without
// references. A dies: this process's standby S adopts x in place. S stops
// gracefully and hands over to the standby process B, while this process
// lives on serving x's memfd (x's record names S). B's first migration
// round finds y's record (A is dead): it must not take the memfd into its
// pool, or the tensors B creates next land on x's bytes.
TEST_CASE("takeover: memory a live ex-leader adopted is not adopted again, so new tensors never overwrite it",
          "[redis][takeover][host]") {
  test::RedisServer srv;
  auto c = srv.connect();
  auto a = worker(srv);
  REQUIRE(test::ready(*a));
  std::optional<TensorRegistry> s(std::in_place, opts(srv, true));
  TensorRegistry client(opts(srv, false));

  auto x = client.create<float>("x", {kElems}, test::persistent());
  x.copy_from_host(pattern(1));
  x.release();
  auto y = client.create<float>("y", {kElems});
  const auto ix = client.info("x"), iy = client.info("y");
  REQUIRE(ix.ipc_handle == iy.ipc_handle);  // one memfd
  const std::string removed_y = "memcuda:removed:" + std::to_string(iy.generation);
  REQUIRE(test::eventually([&] { return test::standby_synced(c, ::getpid(), {"x", "y"}); }, 30s));

  // A stops: S takes the lease at its expiry and adopts nothing (A lives).
  a->kill(SIGSTOP);
  REQUIRE(test::eventually([&] { return s->is_leader(); }, 30s));
  client.remove("y");
  y.release();
  client.flush();
  // S served the free and left it to y's live owner, A, which never reads it.
  REQUIRE(test::eventually([&] { return c.command({"LLEN", "memcuda:inbox:" + ix.owner}).integer() > 0; }, 30s));
  REQUIRE(c.command({"EXISTS", removed_y}).integer() == 1);

  a->kill(SIGKILL);
  a->wait();
  const std::string s_session = s->leader().session;
  REQUIRE(test::eventually([&] {
    (void)s->collect_garbage();
    return client.info("x").owner == s_session;
  }, 30s));
  // y's free never ran: the round that adopted x frees y (its record goes).
  CHECK(c.command({"EXISTS", removed_y}).integer() == 0);

  auto b = worker(srv);
  REQUIRE_FALSE(test::ready(*b));
  REQUIRE(test::eventually([&] { return test::standby_synced(c, b->pid(), {"x"}); }, 30s));
  s.reset();  // hands over to B; this process serves x's memfd until it exits
  const std::string b_pid = std::to_string(b->pid()) + "-";
  REQUIRE(test::eventually([&] { return client.leader().session.rfind(b_pid, 0) == 0; }, 30s));
  CHECK(client.info("x").owner == s_session);  // B adopts nothing of a live process
  const auto gc = b->ask("gc", 30s);           // B's migration round, now
  REQUIRE(test::starts_with(gc, "OK"));

  // Tensors B creates never land on x's bytes.
  for (int k = 0; k < 4; ++k) {
    auto t = client.create<float>("n" + std::to_string(k), {kElems});
    t.copy_from_host(pattern(10 + k));
  }
  std::vector<float> v(kElems);
  client.get<float>("x").copy_to_host(v);
  CHECK(v == pattern(1));
  CHECK(client.info("x").owner == s_session);
  client.remove("x");
}
