// A namespace's memory belongs to the user its allocators of record run as
// (an fd server serves its own uid and root). A process of another user
// that can reach the same Redis must not lead it: it could open none of
// the tensors, and would mark every one lost at a takeover.
// Real processes (memcuda_test_worker, one of them dropped to uid 65534)
// against a real redis-server; they need root to start a peer of another
// user and are reported skipped otherwise.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/skip.hpp"
#include "support/text.hpp"
#include "support/standby_sync.hpp"
#include "support/timing.hpp"
#include "support/worker.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

constexpr int kTtlMs = 400;
constexpr int kOtherUid = 65534;

// Over TCP: the test server's unix socket is root's alone (0700).
std::unique_ptr<test::Child> worker(const test::RedisServer& srv, std::vector<std::string> extra = {}) {
  extra.insert(extra.begin(), {"--ttl", std::to_string(kTtlMs), "--backend", "host"});
  return test::start_worker(srv.tcp_url(), extra);
}

using test::contains;
using test::field;
using test::hget;
using test::ready;
using test::starts_with;

using test::memfds_of;
using test::shm_objects_of;

using test::eventually;

// Persistent tensors made by the leader `a`, each with its own pattern,
// held by their names only; returns name -> digest.
std::map<std::string, std::string> make_tensors(test::Child& a) {
  std::map<std::string, std::string> digest;
  std::uint64_t seed = 3;
  for (const auto& [name, dims] : std::vector<std::pair<std::string, std::string>>{{"u_small", "1000"},
                                                                                  {"u_big", "5000000"}}) {
    REQUIRE(starts_with(a.ask("createp " + name + " " + dims + " 0", 20s), "OK"));
    REQUIRE(a.ask("pattern " + name + " " + std::to_string(seed++)) == "OK");
    digest[name] = field(a.ask("digest " + name), "fnv");
    REQUIRE(a.ask("release " + name) == "OK");
  }
  return digest;
}

// Nothing of the dead leader `a_pid` was given up: every record still
// names it, no lost marker.
void nothing_lost(redis::Connection& c, const std::map<std::string, std::string>& digest, pid_t a_pid) {
  for (const auto& [name, d] : digest) {
    INFO(name);
    CHECK(hget(c, "memcuda:tensor:" + name, "state") == "ready");
    CHECK(hget(c, "memcuda:tensor:" + name, "owner_pid") == std::to_string(a_pid));
    CHECK(c.command({"EXISTS", "memcuda:lost:" + name}).integer() == 0);
  }
}

// A same-user standby `next` takes over: every tensor reads back intact
// from a new reader; then everything is
// removed and no memfd of `pids` is left anywhere.
void same_user_takes_over(const test::RedisServer& srv, redis::Connection& c, test::Child& next,
                          const std::map<std::string, std::string>& digest, std::vector<pid_t> pids) {
  REQUIRE(eventually([&] { return next.ask("leader") == "OK leader=1"; }));
  REQUIRE(eventually([&] {
    for (const auto& [name, d] : digest)
      if (hget(c, "memcuda:tensor:" + name, "owner_pid") != std::to_string(next.pid())) return false;
    return true;
  }));
  auto r = worker(srv, {"--no-control"});
  CHECK_FALSE(ready(*r));
  pids.push_back(r->pid());
  for (const auto& [name, d] : digest) {
    INFO(name);
    REQUIRE(starts_with(r->ask("get " + name, 20s), "OK"));
    CHECK(field(r->ask("digest " + name), "fnv") == d);
    CHECK(c.command({"EXISTS", "memcuda:lost:" + name}).integer() == 0);
  }
  for (const auto& [name, d] : digest) {
    REQUIRE(r->ask("release " + name) == "OK");
    REQUIRE(r->ask("remove " + name) == "OK");
  }
  CHECK(eventually([&] { return memfds_of(pids).empty(); }));
  CHECK(shm_objects_of(pids) == 0);
  CHECK(r->ask("exit") == "OK");
}

}  // namespace

// Host memory lives on after its allocator of record dies only in the fds
// other processes of its user hold (an fd server serves its own uid and
// root). Here the same-user standby `s` holds every fd but is stopped
// (SIGSTOP) while `a` dies, so that the other user's standby alone sees a
// free lease, many times over: it declines each time, and nothing is given
// up. Once `s` runs again it takes over and adopts everything in place.
TEST_CASE("a standby of another user does not take the lease and loses nothing: a same-user standby takes over",
          "[security][takeover][multiprocess]") {
  if (::geteuid() != 0) MEMCUDA_SKIP("a peer of another uid can only be started by root (CI runs the tests as root)");
  test::RedisServer srv;
  auto c = srv.connect();
  auto a = worker(srv);
  REQUIRE(ready(*a));
  auto digest = make_tensors(*a);
  CHECK(std::string(c.command({"GET", "memcuda:owner_uid"}).str()) == "0");  // the leader's user
  auto s = worker(srv);
  CHECK_FALSE(ready(*s));
  REQUIRE(eventually([&] { return test::standby_synced(c, s->pid(), {"u_small", "u_big"}); }));  // s holds every fd
  auto other = worker(srv, {"--uid", std::to_string(kOtherUid)});
  CHECK_FALSE(ready(*other));
  CHECK_FALSE(test::standby_synced(c, other->pid(), {"u_small", "u_big"}));  // refused by a's fd server: another uid
  const pid_t a_pid = a->pid();
  const auto a_memfds = memfds_of({a_pid});
  CHECK(a_memfds.size() == 2);

  s->kill(SIGSTOP);
  a->kill(SIGKILL);
  a->wait();
  // The lease goes (broken by nobody, it expires); the other user's
  // standby campaigns every ttl/3 and must decline each time. Watched for
  // many of its campaigns.
  REQUIRE(eventually([&] { return c.command({"EXISTS", "memcuda:leader"}).integer() == 0; }));
  for (int i = 0; i < 20; ++i) {
    CHECK(other->ask("leader") == "OK leader=0");
    std::this_thread::sleep_for(std::chrono::milliseconds(kTtlMs / 4));
  }
  CHECK(c.command({"EXISTS", "memcuda:leader"}).integer() == 0);
  nothing_lost(c, digest, a_pid);
  CHECK(memfds_of({a_pid}) == a_memfds);  // alive in the stopped standby's fds

  s->kill(SIGCONT);
  same_user_takes_over(srv, c, *s, digest, {s->pid(), other->pid(), a_pid});
  CHECK(other->ask("leader") == "OK leader=0");
  CHECK(other->ask("exit") == "OK");
  CHECK(s->ask("exit") == "OK");
  CHECK(memfds_of({a_pid, s->pid()}).empty());
  CHECK(shm_objects_of({a_pid}) == 0);
}

// Where the owner key is missing (deleted by hand), a process of another
// user campaigns too. It holds none of the old user's fds (their fd server
// refuses it), so it leaves the vacant lease to the same-user standby that
// holds them all (takeover/succession.hpp) instead of taking over and
// finding every tensor lost; that standby adopts everything in place.
TEST_CASE("without the owner key, a standby of another user leaves the lease to a same-user standby that holds "
          "the fds",
          "[security][takeover][multiprocess]") {
  if (::geteuid() != 0) MEMCUDA_SKIP("a peer of another uid can only be started by root (CI runs the tests as root)");
  test::RedisServer srv;
  auto c = srv.connect();
  auto a = worker(srv);
  REQUIRE(ready(*a));
  auto digest = make_tensors(*a);
  auto s = worker(srv);
  CHECK_FALSE(ready(*s));
  REQUIRE(eventually([&] { return test::standby_synced(c, s->pid(), {"u_small", "u_big"}); }));
  auto other = worker(srv, {"--uid", std::to_string(kOtherUid)});
  CHECK_FALSE(ready(*other));
  CHECK_FALSE(test::standby_synced(c, other->pid(), {"u_small", "u_big"}));
  c.command({"DEL", "memcuda:owner_uid"});
  const pid_t a_pid = a->pid();
  a->kill(SIGKILL);
  a->wait();
  same_user_takes_over(srv, c, *s, digest, {s->pid(), other->pid(), a_pid});
  CHECK(other->ask("leader") == "OK leader=0");
  CHECK(std::string(c.command({"GET", "memcuda:owner_uid"}).str()) == "0");
  CHECK(other->ask("exit") == "OK");
  CHECK(s->ask("exit") == "OK");
}

// Where another user leads anyway (a namespace whose owner key was
// deleted, and no process of the old user runs), it can fetch none of the
// memory of the old user's processes.
// The documented way to hand a namespace over stops every process of the
// old user first: then nothing holds that memory any more (it went with
// its last holder, nothing is left in /dev/shm or anywhere), and the new
// leader reports those tensors lost rather than serving anything stale.
TEST_CASE("a leader of another user finds the old user's host tensors gone with their last holder",
          "[security][takeover][multiprocess]") {
  if (::geteuid() != 0) MEMCUDA_SKIP("a peer of another uid can only be started by root (CI runs the tests as root)");
  test::RedisServer srv;
  auto c = srv.connect();
  auto a = worker(srv);
  REQUIRE(ready(*a));
  auto digest = make_tensors(*a);
  const pid_t a_pid = a->pid();
  CHECK(memfds_of({a_pid}).size() == 2);
  a->kill(SIGKILL);
  a->wait();
  CHECK(memfds_of({a_pid}).empty());  // nobody held it: gone with a
  CHECK(shm_objects_of({a_pid}) == 0);
  c.command({"DEL", "memcuda:owner_uid"});

  auto other = worker(srv, {"--uid", std::to_string(kOtherUid)});
  ready(*other);
  REQUIRE(eventually([&] { return other->ask("leader") == "OK leader=1"; }));
  CHECK(std::string(c.command({"GET", "memcuda:owner_uid"}).str()) == std::to_string(kOtherUid));
  for (int i = 0; i < 3; ++i) {  // rounds of its own, after the one it ran on taking the lease
    auto gc = other->ask("gc", 20s);
    INFO(gc);
    CHECK(field(gc, "migrated") == "0");
  }
  for (const auto& [name, d] : digest) {
    INFO(name);
    CHECK(eventually([&] { return c.command({"EXISTS", "memcuda:lost:" + name}).integer() == 1; }));
    CHECK(starts_with(other->ask("get " + name, 20s), "ERR lost "));
  }
  CHECK(other->ask("exit") == "OK");
}
