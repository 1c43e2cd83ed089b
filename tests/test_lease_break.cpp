// A follower that can prove the allocator of record is dead takes over at
// once instead of waiting for the lease to expire (lease.hpp), and a
// takeover adopts a dead owner's tensors while its session key still exists
// (Context::owner_alive). The proof is a session of this node and pid
// namespace whose process has ended (no such pid, or a zombie); nothing else
// may end a lease early. Real
// processes (memcuda_test_worker) against a real redis-server; the lease and
// session TTLs are 30 s, so a takeover within the tests' bounds can only come
// from the proof, never from expiry.
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>

#include "memcuda/detail/registry/core.hpp"
#include "memcuda/detail/registry/liveness.hpp"
#include "memcuda/memcuda.hpp"
#include "memcuda/protocol.hpp"
#include "support/standby_sync.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/text.hpp"
#include "support/worker.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

constexpr const char* kLongTtl = "30000";

std::unique_ptr<test::Child> worker(const test::RedisServer& srv, std::vector<std::string> extra = {}) {
  extra.insert(extra.begin(), {"--ttl", kLongTtl, "--session-ttl", kLongTtl, "--backend", "host"});
  return test::start_worker(srv.unix_url(), extra);
}

bool ready_as_leader(test::Child& w) {
  auto l = w.read_line(10s);
  REQUIRE(l);
  INFO(*l);
  REQUIRE(l->rfind("READY", 0) == 0);
  return l->find("leader=1") != std::string::npos;
}

// Polls `done` until it holds or `limit` passes; returns its last value.
bool within(std::chrono::milliseconds limit, const std::function<bool()>& done) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!done()) {
    if (std::chrono::steady_clock::now() - t0 > limit) return done();
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

using test::field;

// A pid no process has: a child that exited and was reaped.
pid_t dead_pid() {
  pid_t p = ::fork();
  if (p == 0) ::_exit(0);
  int st = 0;
  ::waitpid(p, &st, 0);
  return p;
}

std::string session_value(std::int64_t pid, const std::string& node, const std::string& pid_ns) {
  return protocol::encode_session({pid, node, 1, true, pid_ns, {}, {}});
}

}  // namespace

TEST_CASE("lease break: a killed allocator of record is replaced at once, its tensors adopted, nothing lost",
          "[redis][lease][takeover]") {
  test::RedisServer srv;
  auto c = srv.connect();
  auto a = worker(srv);
  REQUIRE(ready_as_leader(*a));
  auto b = worker(srv);
  REQUIRE_FALSE(ready_as_leader(*b));  // its first campaign lost: it watches a's pid
  REQUIRE(a->ask("createp w 1000 0", 20s).rfind("OK", 0) == 0);
  REQUIRE(a->ask("pattern w 5") == "OK");
  const std::string digest = field(a->ask("digest w"), "fnv");
  REQUIRE_FALSE(digest.empty());
  REQUIRE(a->ask("release w") == "OK");  // only the name holds it
  const std::string lease(c.command({"GET", "memcuda:leader"}).str());  // "<epoch> <session>"
  const std::string a_session = lease.substr(lease.find(' ') + 1);
  const std::string b_pid = std::to_string(b->pid());
  // w's memory outlives a only in the fd the standby holds (docs/design.md, "What is lost when")
  REQUIRE(within(10s, [&] { return test::standby_synced(c, b->pid(), {"w"}); }));

  a->kill(SIGKILL);
  a->wait();
  // Lease and session live 30 s: only the proof of death can explain these.
  CHECK(within(10s, [&] { return b->ask("leader") == "OK leader=1"; }));
  // Its session key (30 s TTL) is pruned by the new leader's GC, not by expiry.
  CHECK(within(10s, [&] { return c.command({"EXISTS", "memcuda:session:" + a_session}).integer() == 0; }));
  CHECK(within(10s, [&] {
    auto r = c.command({"HGET", "memcuda:tensor:w", "owner_pid"});
    return !r.is_nil() && r.str() == b_pid;
  }));
  CHECK(c.command({"EXISTS", "memcuda:lost:w"}).integer() == 0);
  auto reader = worker(srv, {"--no-control"});
  REQUIRE_FALSE(ready_as_leader(*reader));
  REQUIRE(reader->ask("get w", 20s).rfind("OK", 0) == 0);
  CHECK(field(reader->ask("digest w"), "fnv") == digest);  // adopted in place, byte-identical
  CHECK(reader->ask("release w") == "OK");
  CHECK(b->ask("remove w", 20s).rfind("OK", 0) == 0);
}

TEST_CASE("lease break: a stopped allocator of record is alive, its lease stays until it expires",
          "[redis][lease]") {
  test::RedisServer srv;
  auto c = srv.connect();
  auto a = worker(srv);
  REQUIRE(ready_as_leader(*a));
  auto b = worker(srv);
  REQUIRE_FALSE(ready_as_leader(*b));
  const std::string lease = std::string(c.command({"GET", "memcuda:leader"}).str());
  a->kill(SIGSTOP);
  // 1.5 s is 30 of the follower's watch periods and two of its campaign
  // ticks: a stopped process still has its pid, so nothing is proven.
  std::this_thread::sleep_for(1500ms);
  auto now = c.command({"GET", "memcuda:leader"});
  CHECK_FALSE(now.is_nil());
  if (!now.is_nil()) CHECK(std::string(now.str()) == lease);
  CHECK(b->ask("leader") == "OK leader=0");
  a->kill(SIGCONT);
  CHECK(a->ask("leader") == "OK leader=1");
}

TEST_CASE("lease break: only a session of this node and pid namespace whose pid is gone proves a death",
          "[lease]") {
  auto judgeable_pid = [](const std::string& v, const std::string& n) { return detail::death_watch(v, n).pid; };
  using detail::session_proves_death;
  const std::string node = detail::node_id();
  const std::string ns = detail::pid_namespace_id();
  REQUIRE_FALSE(ns.empty());  // Linux with /proc: what the proof needs
  const pid_t gone = dead_pid();
  CHECK(session_proves_death(session_value(gone, node, ns), node));
  CHECK(judgeable_pid(session_value(gone, node, ns), node) == gone);
  // A zombie (exited, not yet reaped) has ended too; once reaped its pid is free.
  {
    pid_t z = ::fork();
    if (z == 0) ::_exit(0);
    REQUIRE(z > 0);
    bool zombie = false;
    for (int i = 0; i < 200 && !zombie; ++i) {  // until the child has exited (a bound, not a timing)
      zombie = detail::process_ended(z);
      if (!zombie) std::this_thread::sleep_for(5ms);
    }
    CHECK(zombie);
    CHECK(::kill(z, 0) == 0);  // its pid is still taken: ESRCH alone would not have said so
    CHECK(session_proves_death(session_value(z, node, ns), node));
    int st = 0;
    ::waitpid(z, &st, 0);
  }
  // A process whose main thread called pthread_exit shows state Z too, yet
  // lives on in its other threads: not ended.
  {
    pid_t m = ::fork();
    if (m == 0) {
      pthread_t t;
      ::pthread_create(&t, nullptr, [](void*) -> void* { ::sleep(30); return nullptr; }, nullptr);
      // The main thread alone ends, as pthread_exit would, without unwinding
      // through the test framework of this forked copy.
      ::syscall(SYS_exit, 0);
    }
    REQUIRE(m > 0);
    bool leader_gone = false;  // until its main thread has exited (a bound, not a timing)
    for (int i = 0; i < 200 && !leader_gone; ++i) {
      char path[40];
      std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(m));
      std::string stat;
      if (FILE* f = std::fopen(path, "r")) {
        char buf[512] = {};
        stat.assign(buf, std::fread(buf, 1, sizeof buf - 1, f));
        std::fclose(f);
      }
      auto close = stat.rfind(')');
      leader_gone = close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z';
      if (!leader_gone) std::this_thread::sleep_for(5ms);
    }
    CHECK(leader_gone);
    CHECK_FALSE(detail::process_ended(m));
    CHECK_FALSE(session_proves_death(session_value(m, node, ns), node));
    ::kill(m, SIGKILL);
    int st = 0;
    ::waitpid(m, &st, 0);
  }
  // A live process (our parent) is never judged dead.
  CHECK_FALSE(session_proves_death(session_value(::getppid(), node, ns), node));
  // Nor a pid of another node, another pid namespace, or a writer that did
  // not say its namespace (an older version): expiry decides those.
  CHECK_FALSE(session_proves_death(session_value(gone, node + "x", ns), node));
  // A container of this machine has a hostname of its own and this boot id:
  // the same node (detail::same_node).
  const auto slash = node.rfind('/');
  if (slash != std::string::npos)
    CHECK(session_proves_death(session_value(gone, "another-hostname" + node.substr(slash), ns), node));
  CHECK_FALSE(session_proves_death(session_value(gone, node, "pid:[1]"), node));
  CHECK_FALSE(session_proves_death(session_value(gone, node, ""), node));
  CHECK(judgeable_pid(session_value(gone, node, ""), node) == 0);
  // Nor this process itself, nor a value that does not decode.
  CHECK(judgeable_pid(session_value(::getpid(), node, ns), node) == 0);
  CHECK_FALSE(session_proves_death("{\"pid\":", node));
  // The wire: "pidns" is optional and round-trips.
  auto s = protocol::decode_session(session_value(42, node, ns));
  CHECK(s.pid_ns == ns);
  CHECK(protocol::decode_session("{\"pid\":42,\"node\":\"n\",\"started\":1,\"allocator_capable\":true}").pid_ns.empty());
}
