// Borrowed tensors (TensorRegistry::share; docs/design.md, "Borrowed
// tensors"): a buffer a process already has is registered by name without a
// copy, read by other processes through the registry, kept alive by the
// owner's registry until the last reference anywhere goes, and lost (for
// new opens) when the owner dies. Real processes (memcuda_test_worker)
// against a real redis-server.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "support/memfd_buffer.hpp"
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
using test::MemfdBuffer;
using test::field;
using test::hget;
using test::ready;
using test::starts_with;

std::unique_ptr<test::Child> worker(const test::RedisServer& srv, std::vector<std::string> extra = {}) {
  extra.insert(extra.begin(), {"--ttl", "2000", "--session-ttl", "2000", "--backend", "host"});
  return test::start_worker(srv.unix_url(), extra);
}

}  // namespace

// Fails without share(): there is no way to register this buffer but a copy.
TEST_CASE("borrow: a host buffer shared by name is read by another process, and its keep-alive goes after the last "
          "remote release",
          "[redis][multiprocess][host][borrow]") {
  test::RedisServer srv;
  auto c = srv.connect();
  auto leader = worker(srv);  // the allocator of record is another process: the free reaches us by our inbox
  REQUIRE(ready(*leader));
  TensorRegistry owner(test::host_options(srv));
  REQUIRE_FALSE(owner.is_leader());
  MemfdBuffer buf(1000, 3.0f);

  auto h = owner.share("b", buf.p, DType::f32, {1000}, buf.options());
  CHECK(h.data() == buf.p);  // no copy: the handle is the buffer itself
  const std::string k = "memcuda:tensor:b";
  CHECK(hget(c, k, "borrowed") == "1");
  CHECK(hget(c, k, "owner") == owner.session_id());
  CHECK(hget(c, k, "alloc_kind") == "host_memfd");
  CHECK(hget(c, k, "refcount") == "1");
  const auto gen = h.generation();

  auto reader = worker(srv, {"--no-control"});
  CHECK_FALSE(ready(*reader));
  auto r = reader->ask("get b", 20s);
  INFO(r);
  REQUIRE(starts_with(r, "OK"));
  CHECK(field(r, "sum") == "3000");
  REQUIRE(reader->ask("fill b 5") == "OK");
  CHECK(buf.p[999] == 5.0f);  // the reader wrote the owner's own bytes
  // A get in the owner shares its handle: the same pointer.
  CHECK(owner.get<float>("b").data() == buf.p);

  h = {};
  owner.flush();
  CHECK(hget(c, k, "refcount") == "1");  // the reader's
  CHECK_FALSE(buf.dropped->load());      // a remote holder keeps it
  REQUIRE(reader->ask("release b") == "OK");
  // reader's release -> free command -> allocator of record -> our inbox -> keep-alive dropped
  CHECK(test::eventually([&] { return buf.dropped->load(); }, 20s));
  // the record and its removed-marker go with the free, which may finish just after the keep-alive's drop
  CHECK(test::eventually([&] { return c.command({"EXISTS", k}).integer() == 0; }, 10s));
  CHECK(test::eventually([&] { return c.command({"EXISTS", "memcuda:removed:" + std::to_string(gen)}).integer() == 0; },
                         10s));
  CHECK(reader->ask("exit") == "OK");
  CHECK(leader->ask("exit") == "OK");
}

TEST_CASE("borrow: the owner's own last release drops the keep-alive at once", "[redis][host][borrow]") {
  test::RedisServer srv;
  TensorRegistry owner(test::host_options(srv));
  MemfdBuffer buf(64, 1.0f);
  {
    auto h = owner.share("own", buf.p, DType::f32, {8, 8}, buf.options());
    CHECK(owner.info("own").borrowed);
  }
  owner.flush();
  CHECK(test::eventually([&] { return buf.dropped->load(); }, 10s));
  CHECK_THROWS_AS(owner.info("own"), NotFound);
}

// Fails when the migration round treats a borrowed record like registry
// memory (adopted from held fds, or copied through a holder): the reader's
// next get would then succeed.
TEST_CASE("borrow: kill -9 of the owner gives holders Lost on their next open after GC", "[redis][multiprocess][host][borrow]") {
  test::RedisServer srv;
  auto c = srv.connect();
  TensorRegistry leader(test::host_options(srv));  // this process: the allocator of record, it runs GC
  REQUIRE(leader.is_leader());
  auto owner = worker(srv);
  CHECK_FALSE(ready(*owner));
  auto r = owner->ask("share w 256 2", 20s);
  INFO(r);
  REQUIRE(starts_with(r, "OK"));
  auto reader = worker(srv, {"--no-control"});
  CHECK_FALSE(ready(*reader));
  r = reader->ask("get w", 20s);
  INFO(r);
  REQUIRE(field(r, "sum") == "512");

  owner->kill(SIGKILL);
  owner->wait();
  // A mapping already open keeps reading (a memfd lives with its last mapping).
  CHECK(reader->ask("sum w") == "OK sum=512 valid=1");
  CHECK(test::eventually([&] {
    (void)leader.collect_garbage();
    return c.command({"EXISTS", "memcuda:tensor:w"}).integer() == 0;
  }, 20s));
  CHECK(c.command({"EXISTS", "memcuda:lost:w"}).integer() == 1);
  REQUIRE(reader->ask("release w") == "OK");  // its handle goes; its next open asks the registry
  r = reader->ask("getany w", 20s);
  INFO(r);
  CHECK(starts_with(r, "ERR lost"));
  CHECK_THROWS_AS(leader.get<float>("w"), Lost);
  CHECK(reader->ask("exit") == "OK");
}

TEST_CASE("borrow: bad input gives typed errors and leaves the registry as it was", "[redis][host][borrow]") {
  test::RedisServer srv;
  auto c = srv.connect();
  TensorRegistry reg(test::host_options(srv));
  MemfdBuffer buf(16, 1.0f);
  auto keys_before = c.command({"KEYS", "memcuda:tensor:*"}).size();

  CHECK_THROWS_AS(reg.share("n", nullptr, DType::f32, {4}), InvalidArgument);
  CHECK_THROWS_AS(reg.share("z", buf.p, DType::f32, {0}), InvalidArgument);
  CHECK_THROWS_AS(reg.share("bad name!", buf.p, DType::f32, {4}), InvalidArgument);
  // plain malloc'd memory: no file another process could map
  std::vector<float> heap(1 << 20, 1.0f);
  try {
    (void)reg.share("m", heap.data(), DType::f32, {1 << 20});
    FAIL("shared malloc'd memory");
  } catch (const NotShareable& e) {
    CHECK(contains(e.what(), "cannot be shared without a copy"));
  }
  // a private mapping
  void* priv = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE, buf.fd, 0);
  REQUIRE(priv != MAP_FAILED);
  CHECK_THROWS_AS(reg.share("p", priv, DType::f32, {16}), NotShareable);
  ::munmap(priv, 4096);
  // more bytes than the mapping has
  CHECK_THROWS_AS(reg.share("big", buf.p, DType::f32, {100000}), NotShareable);
  CHECK(c.command({"KEYS", "memcuda:tensor:*"}).size() == keys_before);

  // a name taken: refused, the first share untouched, the second buffer not kept
  auto first = reg.share("taken", buf.p, DType::f32, {16}, buf.options());
  MemfdBuffer other(16, 9.0f);
  CHECK_THROWS_AS(reg.share("taken", other.p, DType::f32, {16}, other.options()), AlreadyExists);
  CHECK(other.dropped->load());
  CHECK_FALSE(buf.dropped->load());
  CHECK(reg.info("taken").generation == first.generation());
  CHECK(reg.get<float>("taken").data()[0] == 1.0f);
  // a registry without a control thread cannot learn of remote releases
  TensorRegistry plain(test::host_options(srv, false));
  CHECK_THROWS_AS(plain.share("nc", other.p, DType::f32, {16}), InvalidArgument);
}

TEST_CASE("borrow: share_many registers many buffers in one call, all or nothing", "[redis][host][borrow]") {
  test::RedisServer srv;
  TensorRegistry reg(test::host_options(srv));
  MemfdBuffer a(16, 1.0f), b(16, 2.0f), c(16, 3.0f), d(16, 4.0f);
  auto req = [](const std::string& n, MemfdBuffer& m) {
    return ShareRequest{n, m.p, DType::f32, {16}, m.options()};
  };
  {
    auto made = reg.share_many({req("m/a", a), req("m/b", b)});
    REQUIRE(made.size() == 2);
    CHECK(made.at("m/a").data() == a.p);
    CHECK(made.at("m/b").data() == b.p);
    CHECK(reg.info("m/b").borrowed);
    // A taken name refuses the batch: the other member is released again.
    CHECK_THROWS_AS(reg.share_many({req("m/c", c), req("m/a", d)}), AlreadyExists);
    reg.flush();
    CHECK(test::eventually([&] { return c.dropped->load() && d.dropped->load(); }, 10s));
    CHECK_THROWS_AS(reg.info("m/c"), NotFound);
    CHECK_FALSE(a.dropped->load());  // still held by `made`
    // A name given twice, or memory that cannot be lent: nothing reaches Redis.
    CHECK_THROWS_AS(reg.share_many({req("m/d", c), req("m/d", c)}), InvalidArgument);
    std::vector<float> heap(16);
    CHECK_THROWS_AS(reg.share_many({req("m/e", c), ShareRequest{"m/f", heap.data(), DType::f32, {16}, {}}}),
                    NotShareable);
    CHECK_THROWS_AS(reg.info("m/e"), NotFound);
  }
  reg.flush();
  CHECK(test::eventually([&] { return a.dropped->load() && b.dropped->load(); }, 10s));
}

// Failed before: the owner republished the registry memory it allocated,
// not what it shares, so the name was gone while its owner ran on.
TEST_CASE("borrow: after Redis lost its data the owner republishes its borrowed tensor, and the release route "
          "still reaches it",
          "[redis][multiprocess][host][borrow]") {
  test::RedisServer srv;
  auto leader = worker(srv);  // the allocator of record is another process
  REQUIRE(ready(*leader));
  TensorRegistry owner(test::host_options(srv));
  MemfdBuffer buf(256, 2.0f);
  auto h = owner.share("bor/x", buf.p, DType::f32, {256}, buf.options());

  srv.kill(SIGKILL);
  srv.start();
  auto c = srv.connect();
  const std::string k = "memcuda:tensor:bor/x";
  CHECK(test::eventually([&] { return hget(c, k, "refcount") == "1"; }, 20s));  // republished, our reference back
  CHECK(hget(c, k, "borrowed") == "1");
  CHECK(hget(c, k, "owner") == owner.session_id());
  CHECK(c.command({"SISMEMBER", "memcuda:owners", owner.session_id()}).integer() == 1);

  auto reader = worker(srv, {"--no-control"});
  CHECK_FALSE(ready(*reader));
  auto r = reader->ask("get bor/x", 20s);
  INFO(r);
  REQUIRE(starts_with(r, "OK"));
  CHECK(field(r, "sum") == "512");
  h = {};
  owner.flush();
  CHECK_FALSE(buf.dropped->load());  // the reader holds it
  REQUIRE(reader->ask("release bor/x") == "OK");
  CHECK(test::eventually([&] { return buf.dropped->load(); }, 20s));
  CHECK(c.command({"EXISTS", k}).integer() == 0);
  CHECK(reader->ask("exit") == "OK");
  CHECK(leader->ask("exit") == "OK");
}
