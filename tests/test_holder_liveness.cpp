// Liveness of holders that are not registry sessions, and of the runtime
// directory's marks: a JSON client's "pid:<n>" holder is judged by its pid
// only in the pid namespace it names; ".dead" marks of dead processes are
// swept by running processes, kDeadKeep after the death was seen. Real
// redis-server, real processes.
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <string>

#include "memcuda/detail/base/holder_id.hpp"
#include "memcuda/detail/fd/fd_access.hpp"
#include "memcuda/detail/fd/live_lock.hpp"
#include "memcuda/memcuda.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"
#include "support/text.hpp"
#include "support/timing.hpp"

using namespace memcuda;
using namespace std::chrono_literals;
using detail::HolderId;
using detail::LiveLock;

namespace {

// A pid no process of this namespace has: a child's, once reaped.
pid_t reaped_pid() {
  test::Child c({"/bin/true"});
  const pid_t p = c.pid();
  c.wait();
  return p;
}

// A file `name` in `dir` whose mtime is `age` seconds ago.
void aged_file(const std::string& dir, const std::string& name, std::time_t age) {
  const std::string p = dir + "/" + name;
  std::FILE* f = std::fopen(p.c_str(), "w");
  REQUIRE(f);
  std::fclose(f);
  timeval tv[2] = {{std::time(nullptr) - age, 0}, {std::time(nullptr) - age, 0}};
  REQUIRE(::utimes(p.c_str(), tv) == 0);
}

bool exists(const std::string& p) {
  struct stat st{};
  return ::lstat(p.c_str(), &st) == 0;
}

}  // namespace

TEST_CASE("pid holders: the grammar of a pid tagged with its namespace", "[live]") {
  CHECK(HolderId::classify("pid:7@4026532123") == HolderId::Kind::pid);
  CHECK(HolderId::pid_of("pid:7@4026532123") == 7);
  CHECK(HolderId::pid_namespace_of("pid:7@4026532123") == 4026532123ull);
  CHECK_FALSE(HolderId::pid_namespace_of("pid:7"));
  for (const char* bad : {"pid:7@", "pid:7@0", "pid:7@x", "pid:@5", "pid:7@5@6", "pid:7@-5"}) {
    INFO(bad);
    CHECK(HolderId::classify(bad) == HolderId::Kind::other);
  }
  const pid_t gone = reaped_pid();
  const std::uint64_t here = detail::pid_namespace_inode();
  REQUIRE(here != 0);
  const std::string dead = "pid:" + std::to_string(gone);
  CHECK_FALSE(HolderId::pid_holder_alive(dead, here));
  CHECK_FALSE(HolderId::pid_holder_alive(dead + "@" + std::to_string(here), here));
  CHECK(HolderId::pid_holder_alive(dead + "@" + std::to_string(here + 1), here));  // not ours to judge
  // nor does a live pid of ours keep another namespace's holder: it is kept for what it is
  CHECK(HolderId::pid_holder_alive("pid:" + std::to_string(::getpid()) + "@" + std::to_string(here), here));
}

// Failed before: "pidns" was an unknown field, and a pid was judged in the
// allocator of record's namespace whichever namespace the client was in.
TEST_CASE("pid holders: a JSON client of another pid namespace is not judged by a pid of ours",
          "[redis][gc][live]") {
  test::RedisServer srv;
  TensorRegistry reg(test::host_options(srv));
  auto t = reg.create<float>("j", {4});
  auto c = srv.connect();
  const pid_t gone = reaped_pid();
  const std::uint64_t here = detail::pid_namespace_inode();
  REQUIRE(here != 0);
  auto send = [&](const std::string& op, std::uint64_t ns) {
    c.command({"LPUSH", "tensor_lifecycle",
               R"({"op":")" + op + R"(","name":"j","pid":)" + std::to_string(gone) + R"(,"pidns":"pid:[)" +
                   std::to_string(ns) + R"(]","reply_to":"r"})"});
    auto r = c.blocking(5s, {"BLPOP", "r", "5"});
    REQUIRE_FALSE(r.is_nil());
    return std::string(r[1].str());
  };
  const std::string foreign = "pid:" + std::to_string(gone) + "@" + std::to_string(here + 1);
  const std::string ours = "pid:" + std::to_string(gone) + "@" + std::to_string(here);
  REQUIRE(test::contains(send("get", here + 1), "\"ok\":true"));
  REQUIRE(test::contains(send("get", here), "\"ok\":true"));
  CHECK(reg.info("j").holders.count(foreign) == 1);
  CHECK(reg.info("j").refcount == 3);

  auto rep = reg.collect_garbage();
  CHECK(rep.dead_holders == 1);  // ours only: its pid is gone here
  auto info = reg.info("j");
  CHECK(info.holders.count(ours) == 0);
  CHECK(info.holders.count(foreign) == 1);  // a pid of another namespace means nothing here
  CHECK(info.refcount == 2);
  (void)reg.collect_garbage();
  CHECK(reg.info("j").refcount == 2);

  // the client releases with the same pid and namespace
  REQUIRE(test::contains(send("release", here + 1), "\"ok\":true"));
  CHECK(reg.info("j").refcount == 1);

  // a namespace that is not the kernel's spelling is refused, typed
  c.command({"LPUSH", "tensor_lifecycle", R"({"op":"get","name":"j","pid":5,"pidns":"4026531836","reply_to":"r"})"});
  auto r = c.blocking(5s, {"BLPOP", "r", "5"});
  REQUIRE_FALSE(r.is_nil());
  const std::string bad(r[1].str());
  INFO(bad);
  CHECK(test::contains(bad, "bad_value"));
  CHECK(test::contains(bad, "pidns"));
}

// Failed before: marks went st_ctime + kDeadKeep after the rename, which a
// test cannot age, and only when a process started.
TEST_CASE("live lock: a dead process's mark goes kDeadKeep after its death was seen", "[live]") {
  char tmpl[] = "/tmp/memcuda-live-XXXXXX";
  REQUIRE(::mkdtemp(tmpl));
  const std::string dir = tmpl;
  const std::time_t old = LiveLock::kDeadKeep + 100;
  const std::string gone = detail::live_name(999991, 7, 1), fresh = detail::live_name(999992, 7, 2),
                    died_now = detail::live_name(999993, 7, 3);
  auto dead_of = [](const std::string& lock) { return lock.substr(0, lock.size() - 5) + ".dead"; };
  aged_file(dir, dead_of(gone), old);
  aged_file(dir, dead_of(fresh), 5);
  aged_file(dir, died_now, old);  // an unlocked lock file of a process that started long ago
  CHECK(LiveLock::sweep(dir) == 2);  // one removed, one renamed
  CHECK_FALSE(exists(dir + "/" + dead_of(gone)));
  CHECK(exists(dir + "/" + dead_of(fresh)));
  CHECK(exists(dir + "/" + dead_of(died_now)));
  CHECK(LiveLock::sweep(dir) == 0);  // its keep runs from now
  CHECK(exists(dir + "/" + dead_of(died_now)));
  std::filesystem::remove_all(dir);
}

// Failed before: only a starting process swept; marks of processes that
// died while none started stayed.
TEST_CASE("live lock: a running registry sweeps its runtime directory's old marks", "[redis][live]") {
  test::RedisServer srv;
  TensorRegistry reg(test::host_options(srv));
  auto live = LiveLock::existing();
  REQUIRE(live);
  const std::string mark = detail::live_name(999994, 7, 4);
  const std::string dead = mark.substr(0, mark.size() - 5) + ".dead";
  aged_file(live->dir(), dead, LiveLock::kDeadKeep + 100);
  CHECK(test::eventually([&] { return !exists(live->dir() + "/" + dead); }, 30s));
}
