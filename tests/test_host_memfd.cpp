// Host tensors are memfds shared by file descriptor (docs/fd-transfer.md,
// docs/protocol.md "Host allocations"): the maker serves the fd, the record
// says where (fd_source), a reader fetches it, checks it and maps it.
// Nothing is ever named in /dev/shm, so a SIGKILL leaves nothing there, and
// the memory goes with the last process that holds an fd or a mapping of
// it. A record's fd source is used only when it names the owner's own fd
// server and the file it published. Real processes (memcuda_test_worker)
// against a real redis-server.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"
#include "support/text.hpp"
#include "support/timing.hpp"
#include "support/worker.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

using test::contains;
using test::field;
using test::hget;
using test::ready;
using test::starts_with;

std::unique_ptr<test::Child> worker(const test::RedisServer& srv, std::vector<std::string> extra = {}) {
  extra.insert(extra.begin(), {"--ttl", "2000", "--backend", "host"});
  return test::start_worker(srv.unix_url(), extra);
}

// Every /dev/shm entry of the registry's old naming ("memcuda.*"), whoever made it.
std::set<std::string> dev_shm_memcuda() {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string f = e.path().filename().string();
    if (starts_with(f, "memcuda.")) out.insert(f);
  }
  return out;
}

// Whether process `pid` maps the memfd `label` ("memcuda.<session>.<alloc id>").
bool maps_memfd(pid_t pid, const std::string& label) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  for (std::string line; std::getline(maps, line);)
    if (contains(line, "/memfd:" + label + " ")) return true;
  return false;
}

// The memfd label of a record: "memcuda.<creator session>.<alloc id>" (its
// ipc_handle is "host:<creator session>:<alloc id>").
std::string label_of(const std::string& ipc_handle) {
  REQUIRE(starts_with(ipc_handle, "host:"));
  auto rest = ipc_handle.substr(5);
  auto colon = rest.rfind(':');
  REQUIRE(colon != std::string::npos);
  return "memcuda." + rest.substr(0, colon) + "." + rest.substr(colon + 1);
}

// The record's fd source with some of its parts replaced: "v1;<id>;<pid>;<fd>;<dev>;<ino>;<address>".
std::string source_with(const std::string& src, std::vector<std::pair<int, std::string>> changes) {
  std::vector<std::string> p;
  std::size_t at = 0;
  for (int i = 0; i < 6; ++i) {
    auto semi = src.find(';', at);
    REQUIRE(semi != std::string::npos);
    p.push_back(src.substr(at, semi - at));
    at = semi + 1;
  }
  p.push_back(src.substr(at));
  for (auto& [i, v] : changes) p.at(i) = v;
  std::string out = p[0];
  for (std::size_t i = 1; i < p.size(); ++i) out += ";" + p[i];
  return out;
}

}  // namespace

TEST_CASE("host tensors: one process makes a tensor, another reads and writes it through the fd its maker serves",
          "[redis][multiprocess][host][fd]") {
  test::RedisServer srv;
  auto c = srv.connect();
  const auto shm_before = dev_shm_memcuda();
  auto a = worker(srv);
  REQUIRE(ready(*a));
  auto b = worker(srv, {"--no-control"});
  CHECK_FALSE(ready(*b));

  REQUIRE(starts_with(a->ask("create x 1000 2", 20s), "OK"));
  const std::string k = "memcuda:tensor:x";
  CHECK(hget(c, k, "alloc_kind") == "host_memfd");
  const std::string handle = hget(c, k, "ipc_handle");
  CHECK(starts_with(handle, "host:" + std::to_string(a->pid()) + "-"));
  const std::string source = hget(c, k, "fd_source");
  CHECK(starts_with(source, "v1;"));
  CHECK(contains(source, ";" + std::to_string(a->pid()) + ";"));
  CHECK(contains(source, "/fd-" + std::to_string(a->pid()) + "-"));  // its server's socket in the runtime directory
  CHECK(source.ends_with(".sock"));
  const std::string label = label_of(handle);
  CHECK(maps_memfd(a->pid(), label));
  CHECK_FALSE(maps_memfd(b->pid(), label));

  auto r = b->ask("get x", 20s);
  INFO(r);
  REQUIRE(starts_with(r, "OK"));
  CHECK(field(r, "sum") == "2000");
  CHECK(maps_memfd(b->pid(), label));  // the maker's memfd, received over the fd server
  REQUIRE(b->ask("fill x 5") == "OK");
  CHECK(a->ask("sum x") == "OK sum=5000 valid=1");  // one memory: the reader's writes are the maker's bytes
  REQUIRE(a->ask("fill x 7") == "OK");
  CHECK(b->ask("sum x") == "OK sum=7000 valid=1");

  CHECK(dev_shm_memcuda() == shm_before);  // nothing named in /dev/shm
  CHECK(b->ask("exit") == "OK");
  CHECK(a->ask("exit") == "OK");
}

// Fails on a build that shares host memory through named /dev/shm objects:
// the killed maker's objects stay there (nobody unlinks them without a
// successor's garbage collection).
TEST_CASE("host tensors: kill -9 of the maker leaves nothing in /dev/shm, and the memory goes with its last holder",
          "[redis][multiprocess][host]") {
  test::RedisServer srv;
  auto c = srv.connect();
  const auto shm_before = dev_shm_memcuda();
  auto a = worker(srv);
  REQUIRE(ready(*a));
  auto b = worker(srv, {"--no-control"});  // a reader, never the allocator of record
  CHECK_FALSE(ready(*b));
  const pid_t a_pid = a->pid(), b_pid = b->pid();

  REQUIRE(starts_with(a->ask("createp kept 1000 3", 20s), "OK"));  // persistent, held by its name only
  REQUIRE(starts_with(a->ask("create big 5000000 1", 20s), "OK"));  // an allocation of its own
  REQUIRE(a->ask("release kept") == "OK");
  const std::string big = label_of(hget(c, "memcuda:tensor:big", "ipc_handle"));
  const std::string kept = label_of(hget(c, "memcuda:tensor:kept", "ipc_handle"));
  REQUIRE(big != kept);
  REQUIRE(starts_with(b->ask("get big", 20s), "OK"));
  CHECK(test::memfds_of({a_pid}) == std::set<std::string>{big, kept});
  CHECK(dev_shm_memcuda() == shm_before);

  a->kill(SIGKILL);
  a->wait();
  // a's memory lives on only where another process holds it: b maps big
  CHECK(dev_shm_memcuda() == shm_before);
  CHECK(test::memfds_of({a_pid}) == std::set<std::string>{big});
  CHECK(maps_memfd(b_pid, big));
  CHECK(field(b->ask("digest big"), "fnv") != "");
  CHECK(b->ask("sum big") == "OK sum=5000000 valid=1");
  // ... and goes with it
  CHECK(b->ask("exit") == "OK");
  b->wait();
  CHECK(test::memfds_of({a_pid, b_pid}).empty());
  CHECK(dev_shm_memcuda() == shm_before);
}

// A reader uses a record's fd source only when it names the fd server of
// the record's owner process and yields the file the owner published; a
// source it cannot read, or whose owner is gone, is a clear error. The
// reader is this test process; the maker is a worker.
TEST_CASE("host tensors: a forged or unusable fd_source is refused with a typed error", "[security][redis][host][fd]") {
  test::RedisServer srv;
  auto c = srv.connect();
  auto a = worker(srv);
  REQUIRE(ready(*a));
  REQUIRE(starts_with(a->ask("create t 16 1", 20s), "OK"));
  const std::string k = "memcuda:tensor:t";
  const std::string src = hget(c, k, "fd_source");
  const std::string a_pid = std::to_string(a->pid()), me = std::to_string(::getpid());
  TensorRegistry reader(test::host_options(srv, false));
  auto forge = [&](const std::string& s) { c.command({"HSET", k, "fd_source", s}); };
  auto refused = [&](const std::string& part) {
    try {
      (void)reader.get<float>("t");
      FAIL("opened a host tensor through a forged fd source");
    } catch (const ProtocolError& e) {
      CHECK(e.errc() == ProtocolErrc::bad_record);
      CHECK(contains(e.what(), part));
    }
  };

  SECTION("the genuine source opens") {
    auto t = reader.get<float>("t");
    CHECK(t.data()[15] == 1.0f);
  }
  SECTION("another process's fd server (this one's, under the registry's naming)") {
    forge(source_with(src, {{2, me}, {6, "@memcuda-fd-" + me + "-0123456789abcdef"}}));
    refused("is not the fd server of its owner (pid " + a_pid + ")");
  }
  SECTION("the owner's pid, but a server outside the registry's naming") {
    forge(source_with(src, {{6, "@not-memcuda-" + a_pid}}));
    refused("is not the fd server of its owner");
  }
  SECTION("the owner's server, but another file than the one it published") {
    // no fd number: the socket answers, with the genuine file, whose identity differs
    forge(source_with(src, {{3, "-1"}, {5, "1"}}));
    refused("is not the file its fd source names");
  }
  SECTION("unreadable") {
    forge("v2;whatever");
    refused("fd source \"v2;whatever\"");
  }
  SECTION("an id the owner does not serve (a stale record)") {
    forge(source_with(src, {{1, "987654"}, {3, "-1"}}));
    try {
      (void)reader.get<float>("t");
      FAIL("opened a host tensor through an id nobody serves");
    } catch (const Unavailable& e) {
      CHECK(contains(e.what(), "987654"));
    }
  }
  SECTION("its owner has exited and nobody holds the fd") {
    REQUIRE(a->ask("createp gone 16 4", 20s).rfind("OK", 0) == 0);
    REQUIRE(a->ask("release gone") == "OK");
    a->kill(SIGKILL);
    a->wait();
    try {
      (void)reader.get<float>("gone");
      FAIL("opened the memory of a dead owner that nobody holds");
    } catch (const Lost& e) {
      CHECK(contains(e.what(), "pid " + a_pid));
      CHECK(contains(e.what(), "has exited"));
    }
  }
}
