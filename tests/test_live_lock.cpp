// Liveness without pids (detail/fd/live_lock.hpp): every process with a
// registry holds a lock on a file of its runtime directory and names it in
// its session value; a process that shares the directory proves the death
// by the lock's absence, whatever pid namespace either is in. Real
// processes (memcuda_test_worker, forked children) and a real redis-server.
// The cases across pid namespaces and containers are in test_pods.cpp.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <string>

#include "memcuda/detail/fd/live_lock.hpp"
#include "memcuda/detail/registry/liveness.hpp"
#include "memcuda/memcuda.hpp"
#include "memcuda/protocol.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/text.hpp"
#include "support/worker.hpp"

using namespace memcuda;
using namespace std::chrono_literals;
using detail::LiveLock;
using detail::LiveVerdict;

namespace {

// The session value a worker wrote (its session id starts with its pid).
std::string session_of(redis::Connection& c, pid_t pid) {
  auto keys = c.command({"KEYS", "memcuda:session:" + std::to_string(pid) + "-*"});
  REQUIRE(keys.size() == 1);
  return std::string(c.command({"GET", std::string(keys[0].str())}).str());
}

// Reads one line from a pipe written by a forked child.
std::string read_pipe_line(int fd) {
  std::string s;
  char ch;
  while (::read(fd, &ch, 1) == 1 && ch != '\n') s += ch;
  return s;
}

}  // namespace

TEST_CASE("live lock: names are parsed strictly", "[live]") {
  using detail::parse_live_name;
  auto n = parse_live_name(detail::live_name(42, 4026531836ull, 0xabcdef0123456789ull));
  REQUIRE(n);
  CHECK(n->pid == 42);
  CHECK(n->pid_ns == 4026531836ull);
  for (const char* bad : {"live-42-7-abcdef0123456789.lck", "live-042-7-abcdef0123456789.lock",
                          "live--42-7-abcdef0123456789.lock", "live-42-7-ABCDEF0123456789.lock",
                          "live-42-7-abcdef012345678.lock", "live-42-7-abcdef0123456789x.lock",
                          "live-0-7-abcdef0123456789.lock", "fd-42-7-abcdef0123456789.sock", "live-42-7-../x.lock"}) {
    INFO(bad);
    CHECK_FALSE(parse_live_name(bad));
  }
}

TEST_CASE("live lock: a worker's session names its lock, held while it lives and free once it is killed",
          "[redis][live]") {
  test::RedisServer srv;
  auto c = srv.connect();
  auto judge = LiveLock::acquire();
  REQUIRE(judge);
  auto w = test::start_worker(srv.unix_url(), {"--backend", "host", "--ttl", "30000", "--session-ttl", "30000"});
  REQUIRE(w->read_line(20s));
  const auto s = protocol::decode_session(session_of(c, w->pid()));
  REQUIRE_FALSE(s.live.empty());
  INFO("live: " << s.live);
  CHECK(test::starts_with(s.live, judge->field().substr(0, judge->field().find('/') + 1)));  // same directory
  const std::string file = judge->dir() + "/" + s.live.substr(s.live.find('/') + 1);
  struct stat st{};
  REQUIRE(::stat(file.c_str(), &st) == 0);
  CHECK(judge->judge(s.live) == LiveVerdict::alive);

  // The same session as seen from another pid namespace: its pid cannot be
  // judged there, its lock can.
  protocol::SessionInfo foreign = s;
  foreign.pid_ns = "pid:[1]";
  const std::string value = protocol::encode_session(foreign);
  auto watch = detail::death_watch(value, detail::node_id());
  CHECK(watch.pid == 0);
  CHECK(watch.armed());
  CHECK_FALSE(watch.proves_death());

  w->kill(SIGKILL);
  w->wait();
  CHECK(judge->judge(s.live) == LiveVerdict::dead);
  CHECK(detail::session_proves_death(value, detail::node_id()));
  // A sweep marks the file dead: still proof, by its ".dead" name.
  CHECK(LiveLock::sweep(judge->dir()) >= 1);
  CHECK(::stat(file.c_str(), &st) != 0);
  CHECK(judge->judge(s.live) == LiveVerdict::dead);
  // A missing file with no mark proves nothing (someone removed files by hand).
  const std::string dead = file.substr(0, file.size() - 5) + ".dead";
  REQUIRE(::unlink(dead.c_str()) == 0);
  CHECK(judge->judge(s.live) == LiveVerdict::unknown);
  CHECK_FALSE(detail::session_proves_death(value, detail::node_id()));
}

TEST_CASE("live lock: what a judge refuses to conclude", "[live]") {
  auto judge = LiveLock::acquire();
  REQUIRE(judge);
  const std::string& mine = judge->field();
  const std::string dir_id = mine.substr(0, mine.find('/'));
  const std::string name = mine.substr(mine.find('/') + 1);
  CHECK(judge->judge(mine) == LiveVerdict::alive);                  // this process
  CHECK(judge->judge("1:2/" + name) == LiveVerdict::unknown);        // another directory
  CHECK(judge->judge(dir_id + "/../" + name) == LiveVerdict::unknown);  // not a name of ours
  CHECK(judge->judge(dir_id + "/" + detail::live_name(999999, 1, 7)) == LiveVerdict::unknown);  // no such file
  CHECK(judge->judge("") == LiveVerdict::unknown);
  // A second registry of this process shares the one lock.
  CHECK(LiveLock::acquire() == judge);
}

TEST_CASE("live lock: a forked child that outlives its parent does not keep the parent alive", "[live]") {
  auto judge = LiveLock::acquire();
  REQUIRE(judge);
  int up[2];
  REQUIRE(::pipe(up) == 0);
  pid_t parent = ::fork();
  REQUIRE(parent >= 0);
  if (parent == 0) {
    // The inherited object is the test process's; acquire() makes this
    // process's own lock.
    auto mine = LiveLock::acquire();
    if (!mine || mine == judge) ::_exit(3);
    pid_t grandchild = ::fork();
    if (grandchild == 0) {
      ::sleep(30);
      ::_exit(0);
    }
    const std::string line = mine->field() + " " + std::to_string(grandchild) + "\n";
    (void)!::write(up[1], line.data(), line.size());
    ::_exit(0);  // no unwinding: the file stays, as after a kill
  }
  ::close(up[1]);
  const std::string line = read_pipe_line(up[0]);
  ::close(up[0]);
  int st = 0;
  ::waitpid(parent, &st, 0);
  REQUIRE(WIFEXITED(st));
  REQUIRE(WEXITSTATUS(st) == 0);
  const std::string field = line.substr(0, line.find(' '));
  const pid_t grandchild = static_cast<pid_t>(std::stol(line.substr(line.find(' ') + 1)));
  REQUIRE(::kill(grandchild, 0) == 0);  // it lives, with the parent's fd
  CHECK(judge->judge(field) == LiveVerdict::dead);
  ::kill(grandchild, SIGKILL);
  // The grandchild is not our child: reaped by init.
}
