// Several nodes on one machine. A fake node is a process in its own pid,
// mount, UTS and IPC namespaces (support/pod.hpp, sharing the network):
// its own hostname and so its own node id, its own /dev/shm, reaching
// Redis through the shared socket and the other nodes over TCP loopback,
// as other machines would be reached. What crosses: the node endpoint
// records in Redis (detail/registry/fleet/node_endpoint.hpp) and bytes through
// the UCX mover (detail/transfer/ucx_mover.hpp). Where namespaces cannot be
// made, or UCX was not built, those cases are reported skipped with why.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/detail/registry/fleet/node_endpoint.hpp"
#include "memcuda/detail/transfer/ucx_mover.hpp"
#include "memcuda/memcuda.hpp"
#include "memcuda/protocol.hpp"
#include "support/fleet_proc.hpp"
#include "support/pod.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"
#include "support/skip.hpp"
#include "support/text.hpp"

using namespace memcuda;
using namespace std::chrono_literals;
using Catch::Matchers::StartsWith;
using test::FleetProc;
using test::fleet_proc;

TEST_CASE("nodes: an endpoint record is renewed, withdrawn and replaced only by its own incarnation", "[nodes]") {
  test::RedisServer srv;
  auto c = srv.connect();
  const detail::Keys k;
  detail::NodePublisher a(k, "ucx", std::string("addr\0a", 6), "s1", 2000ms, "node-a/0000");
  a.publish(c);
  auto e = detail::endpoint_of(c, k, "node-a/0000");
  CHECK(e.incarnation == a.record().incarnation);
  CHECK(e.endpoint == std::string("addr\0a", 6));  // binary-safe
  CHECK(e.mover == "ucx");
  const auto pttl = c.command({"PTTL", k.node("node-a/0000")}).integer();
  CHECK((pttl > 0 && pttl <= 2000));
  CHECK_FALSE(a.refresh(c));  // renewed, not republished

  // A restarted node: a new incarnation replaces the record, and the old
  // process can neither renew nor withdraw it (its refresh republishes, as
  // a node's newest live process should; here it stops instead).
  detail::NodePublisher a2(k, "ucx", "addr-b", "s2", 2000ms, "node-a/0000");
  a2.publish(c);
  CHECK_FALSE(detail::store::refresh_node_endpoint(c, k, "node-a/0000", a.record().incarnation, 2000ms));
  a.withdraw(c);
  CHECK(detail::endpoint_of(c, k, "node-a/0000").incarnation == a2.record().incarnation);
  CHECK_THROWS_AS(detail::endpoint_of(c, k, "node-a/0000", a.record().incarnation), StaleHandle);
  CHECK(detail::endpoint_of(c, k, "node-a/0000", a2.record().incarnation).endpoint == "addr-b");

  // Gone: withdrawn, or expired without a heartbeat.
  a2.withdraw(c);
  CHECK_THROWS_AS(detail::endpoint_of(c, k, "node-a/0000"), Unavailable);
  detail::NodePublisher b(k, "ucx", "addr-c", "s3", 150ms, "node-b/0000");
  b.publish(c);
  CHECK_NOTHROW(detail::endpoint_of(c, k, "node-b/0000"));
  std::this_thread::sleep_for(400ms);
  CHECK_THROWS_AS(detail::endpoint_of(c, k, "node-b/0000"), Unavailable);
  // A key of another type under the name: the next refresh publishes again.
  c.command({"SET", k.node("node-b/0000"), "junk"});
  CHECK(b.refresh(c));
  CHECK(detail::endpoint_of(c, k, "node-b/0000").incarnation == b.record().incarnation);

  // Exposed regions: written as they come and go, and kept by a republish.
  b.set_regions(&c, {{detail::store::region_field(1), "4096 256 ab"}, {detail::store::region_field(2), "8192 256 cd"}});
  CHECK(detail::store::read_node_region(c, k, "node-b/0000", 1) == "4096 256 ab");
  b.set_regions(&c, {{detail::store::region_field(1), ""}});
  CHECK(detail::store::read_node_region(c, k, "node-b/0000", 1).empty());
  c.command({"DEL", k.node("node-b/0000")});
  CHECK(b.refresh(c));
  CHECK(detail::store::read_node_region(c, k, "node-b/0000", 2) == "8192 256 cd");
  CHECK(detail::store::read_node_region(c, k, "node-b/0000", 1).empty());
  // Another incarnation's record is not written into: a republish replaces it.
  detail::NodePublisher b2(k, "ucx", "addr-d", "s4", 2000ms, "node-b/0000");
  b2.publish(c);
  b.set_regions(&c, {{detail::store::region_field(3), "1 1 ee"}});
  CHECK(detail::endpoint_of(c, k, "node-b/0000").incarnation == b.record().incarnation);
  CHECK(detail::store::read_node_region(c, k, "node-b/0000", 3) == "1 1 ee");
}

TEST_CASE("nodes: a fleet scopes the allocator of record's keys to the node, and shares the rest", "[nodes][fleet]") {
  const detail::Keys one, fleet("", false, "node-a"), tagged("prod", true, "node-a");
  CHECK(one.lifecycle() == "tensor_lifecycle");  // the seed's name, unchanged outside a fleet
  CHECK(one.leader() == "memcuda:leader");
  CHECK(fleet.lifecycle() == "tensor_lifecycle@node-a");
  CHECK(fleet.leader() == "memcuda:leader@node-a");
  CHECK(fleet.epoch() == "memcuda:epoch@node-a");
  CHECK(fleet.processing(7) == "memcuda:processing@node-a:7");
  CHECK(fleet.processing_lists() == "memcuda:processing_lists@node-a");
  CHECK(fleet.pool_stats() == "memcuda:pool_stats@node-a");
  CHECK(fleet.allocations() == "memcuda:allocations@node-a");
  // What names a tensor, a session or a generation is the fleet's.
  CHECK(fleet.tensor("w") == one.tensor("w"));
  CHECK(fleet.session("s") == one.session("s"));
  CHECK(fleet.generation() == one.generation());
  CHECK(fleet.names() == one.names());
  // On a cluster the scope follows the hash tag: one slot still.
  CHECK(tagged.lifecycle() == "{prod}:tensor_lifecycle@node-a");
}

TEST_CASE("nodes: a pull sent as JSON is refused where it must be, and the allocator of record serves on",
          "[nodes][fleet]") {
  test::RedisServer srv;
  auto c = srv.connect();
  auto send = [&](const std::string& list, const std::string& name) {
    c.command({"DEL", "test:reply"});
    c.command({"LPUSH", list, R"({"op":"pull","name":")" + name + R"(","id":"p","reply_to":"test:reply"})"});
    auto r = c.command({"BLPOP", "test:reply", "20"});
    REQUIRE(!r.is_nil());
    return protocol::decode_reply(r[1].str());
  };
  {
    TensorRegistry one(test::host_options(srv));  // not a fleet
    REQUIRE(one.is_leader());
    auto r = send("tensor_lifecycle", "x");
    REQUIRE_FALSE(r.ok);
    CHECK(r.error->code == "invalid_argument");
    CHECK_THAT(r.error->message, Catch::Contains("not in a fleet"));
  }
  auto o = test::host_options(srv);
  o.fleet = true;
  o.name_space = "fl";
  o.request_timeout = 600ms;
  TensorRegistry reg(o);
  REQUIRE(reg.is_leader());
  // Scoped by the machine: the boot id of a default node id ("host/boot").
  const std::string list = "fl:tensor_lifecycle@" + detail::node_scope(reg.node_id());
  CHECK(detail::node_scope("host-a/1a2b3c4d") == "1a2b3c4d");
  CHECK(detail::node_scope("node-b") == "node-b");
  auto w = reg.create<float>("w", {16}, test::persistent());
  // This node's own tensor: nothing to pull.
  auto r = send(list, "w");
  CHECK(r.ok);
  CHECK(c.command({"EXISTS", "fl:memcuda:tensor:.memcuda-rep/" + detail::node_scope(reg.node_id()) + "/w"}).integer() == 0);
  r = send(list, "nope");
  CHECK(r.error->code == "not_found");
  r = send(list, ".memcuda-rep/n/w");
  CHECK(r.error->code == "invalid_argument");
  // A record that names a node nobody runs (hostile, or a node gone while
  // its owner's session lives): unavailable once the wait for its endpoint
  // ends; the reference the pull took is given back, nothing is made.
  (void)reg.create<float>("v", {16}, test::persistent());  // held by its name only
  reg.flush();
  c.command({"HSET", "fl:memcuda:tensor:v", "node", "nowhere"});
  r = send(list, "v");
  REQUIRE_FALSE(r.ok);
  CHECK(r.error->code == "unavailable");
  CHECK_THAT(r.error->message, Catch::Contains("nowhere"));
  reg.flush();
  CHECK(std::string(c.command({"HGET", "fl:memcuda:tensor:v", "refcount"}).str()) == "1");
  CHECK(c.command({"EXISTS", "fl:memcuda:tensor:.memcuda-rep/" + detail::node_scope(reg.node_id()) + "/v"}).integer() == 0);
  // The registry's own get of it pulls the same way, and fails the same way.
  CHECK_THROWS_AS(reg.get<float>("v"), Unavailable);
  CHECK(reg.get<float>("w").size() == 16);  // still serving
}

#if MEMCUDA_HAS_UCX()

namespace tr = memcuda::detail::transfer;

TEST_CASE("nodes: the UCX mover pulls exposed host memory between two movers, and refuses what it must", "[nodes]") {
  auto a = std::make_unique<tr::UcxMover>(tr::UcxOptions{"tcp", "lo"});
  tr::UcxMover b({"tcp", "lo"});
  CHECK(std::string(a->kind()) == "ucx");
  CHECK(!a->endpoint().empty());
  std::vector<std::uint32_t> src(1 << 20);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::uint32_t>(i * 2654435761u);
  tr::Region r = a->expose(src.data(), src.size() * 4);
  REQUIRE(r);
  tr::RemoteRegion rr{a->endpoint(), r.address(), r.size(), r.key()};
  std::vector<std::uint32_t> dst(src.size());
  const auto deadline = [] { return std::chrono::steady_clock::now() + 20s; };
  b.get(rr, 0, dst.data(), dst.size() * 4, deadline());
  CHECK(dst == src);
  // A slice at an offset.
  std::vector<std::uint32_t> part(1000);
  b.get(rr, 4 * 5000, part.data(), part.size() * 4, deadline());
  CHECK(part[0] == src[5000]);
  CHECK(part[999] == src[5999]);

  CHECK_THROWS_AS(b.get(rr, r.size() - 4, part.data(), 8, deadline()), InvalidArgument);
  CHECK_THROWS_AS(b.get(rr, 0, part.data(), 0, deadline()), InvalidArgument);
  CHECK_THROWS_AS(a->expose(nullptr, 0), InvalidArgument);
  // Device memory through a UCX without CUDA transports: refused, typed.
  CHECK_THROWS_AS(b.get(rr, 0, part.data(), 8, deadline(), tr::MemoryKind::cuda), Unavailable);
  // Movers of other lane counts read each other's stripes: 3 lanes from 1
  // and 1 from 3, a size no lane count divides.
  {
    tr::UcxMover one(tr::UcxOptions{"tcp", "lo", 1}), three(tr::UcxOptions{"tcp", "lo", 3});
    CHECK(one.lanes() == 1);
    CHECK(three.lanes() == 3);
    const std::size_t odd = src.size() * 4 - 12;
    std::vector<std::uint32_t> got(src.size(), 0);
    three.get(rr, 4, got.data(), odd, deadline());
    CHECK(std::equal(got.begin(), got.begin() + odd / 4, src.begin() + 1));
    tr::Region r3 = three.expose(src.data(), src.size() * 4);
    std::fill(got.begin(), got.end(), 0);
    one.get({three.endpoint(), r3.address(), r3.size(), r3.key()}, 0, got.data(), src.size() * 4, deadline());
    CHECK(got == src);
    CHECK_THROWS_AS(tr::UcxMover(tr::UcxOptions{"tcp", "lo", 17}), InvalidArgument);
  }
  // An endpoint that is not one (the registry stores them: a hostile write
  // could change one): refused before UCX sees it. (A packed key carries no
  // length, so a garbage one is not something a mover can check; the
  // registry's incarnation check is what keeps stale keys away: next case.)
  for (std::string bad : {std::string(), std::string("\x01\x00", 2), a->endpoint() + "x", a->endpoint().substr(0, 9),
                          std::string(1, '\0') + a->endpoint().substr(1)})
    CHECK_THROWS_AS(b.get({bad, r.address(), r.size(), r.key()}, 0, part.data(), 8, deadline()), Unavailable);
  // The peer gone: the engine's error, typed, with its status text, by the
  // deadline at the latest.
  r = tr::Region();
  a.reset();
  try {
    b.get(rr, 0, part.data(), 8, std::chrono::steady_clock::now() + 5s);
    FAIL("a get from a mover that is gone succeeded");
  } catch (const tr::TransferError& e) {
    CHECK(e.status() != 0);
    CHECK(!e.status_text().empty());
  }
}

namespace {

struct Served {
  std::unique_ptr<test::Child> proc;
  std::string node, incarnation, address, size, key;
};

const std::uint64_t kSeed = 0x5eed;

Served serve(const std::string& host, const test::RedisServer& srv, std::size_t bytes) {
  Served s;
  s.proc = std::make_unique<test::Child>(test::pod_argv(
      host, {},
      {test::sibling_program("memcuda_node_worker"), "serve", "--url", srv.unix_url(), "--bytes",
       std::to_string(bytes), "--seed", std::to_string(kSeed), "--ttl", "3000"},
      /*share_network=*/true));
  auto line = s.proc->read_line(60s);
  while (line && test::starts_with(*line, "[")) line = s.proc->read_line(60s);
  REQUIRE(line);
  INFO(*line);
  std::istringstream in(*line);
  std::string word;
  in >> word >> s.node >> s.incarnation >> s.address >> s.size >> s.key;
  REQUIRE(word == "ready");
  REQUIRE(test::starts_with(s.node, host + "/"));
  return s;
}

// Node `host` pulls what `s` served, as a reader that took its key under `incarnation`.
std::string pull(const std::string& host, const test::RedisServer& srv, const Served& s,
                 const std::string& incarnation, const std::string& timeout_ms = "20000") {
  test::Child p(test::pod_argv(host, {},
                               {test::sibling_program("memcuda_node_worker"), "pull", "--url", srv.unix_url(),
                                "--node", s.node, "--incarnation", incarnation, "--address", s.address, "--size",
                                s.size, "--key", s.key, "--seed", std::to_string(kSeed), "--timeout-ms", timeout_ms},
                               /*share_network=*/true));
  // UCX logs its own errors to stdout, "[time] [host:pid] ...": not ours.
  auto line = p.read_line(90s);
  while (line && test::starts_with(*line, "[")) line = p.read_line(90s);
  p.wait();
  return line.value_or("(no answer)");
}

// Whether a process armed with MEMCUDA_FAULTS=<point>=wait reached its
// gate (fault.hpp) within 30 s.
bool gate_reached(const std::string& gate) {
  for (int i = 0; i < 600; ++i) {
    if (::access((gate + ".reached").c_str(), F_OK) == 0) return true;
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

}  // namespace

TEST_CASE("nodes: node B pulls 64 MiB node A exposed, and refuses A's keys once A restarted", "[nodes]") {
  if (auto why = test::pods_unavailable()) MEMCUDA_SKIP(*why);
  test::RedisServer srv;
  test::PodVolume vol(srv);
  auto c = srv.connect();

  Served a = serve("node-a", srv, 64u << 20);
  // A's record: its own node id (hostname node-a), the engine, the address.
  auto rec = detail::endpoint_of(c, detail::Keys{}, a.node, a.incarnation);
  CHECK(rec.mover == "ucx");
  CHECK(!rec.endpoint.empty());

  std::string got = pull("node-b", srv, a, a.incarnation);
  REQUIRE_THAT(got, StartsWith("ok 67108864 "));
  WARN("node-b pulled 64 MiB from node-a over UCX/TCP loopback in " << got.substr(12) << " ms");

  // A dies; its record lives on until its TTL: the pull fails in the
  // engine (the peer is gone), typed, within its deadline.
  a.proc->kill();
  a.proc->wait();
  got = pull("node-b", srv, a, a.incarnation, "5000");
  CHECK_THAT(got, StartsWith("error transfer "));

  // A restarts (same hostname, new process): a new incarnation. B's key
  // from the old one is refused by the registry before any byte moves.
  Served a2 = serve("node-a", srv, 1u << 20);
  CHECK(a2.node == a.node);
  CHECK(a2.incarnation != a.incarnation);
  got = pull("node-b", srv, a, a.incarnation);
  CHECK_THAT(got, StartsWith("error stale_handle "));
  // The new incarnation's key works.
  got = pull("node-b", srv, a2, a2.incarnation);
  CHECK_THAT(got, StartsWith("ok 1048576 "));

  // A stopping node withdraws its record: readers get Unavailable.
  a2.proc->send("quit");
  CHECK(a2.proc->read_line(20s).value_or("") == "bye");
  got = pull("node-b", srv, a2, a2.incarnation);
  CHECK_THAT(got, StartsWith("error unavailable "));
}

TEST_CASE("nodes: a fleet node pulls another node's tensor once into a replica its processes share", "[nodes][fleet]") {
  if (auto why = test::pods_unavailable()) MEMCUDA_SKIP(*why);
  test::RedisServer srv;
  test::PodVolume vol(srv);
  auto c = srv.connect();
  // Each node's first process is its own allocator of record.
  FleetProc a = fleet_proc("node-a", "node-a", srv, vol);
  FleetProc b1 = fleet_proc("node-b", "node-b", srv, vol);
  FleetProc b2 = fleet_proc("node-b2", "node-b", srv, vol);  // a second container of node b
  CHECK(a.leader);
  CHECK(b1.leader);
  CHECK_FALSE(b2.leader);
  CHECK(c.command({"EXISTS", "memcuda:leader@node-a", "memcuda:leader@node-b"}).integer() == 2);

  const std::string rep = ".memcuda-rep/node-b/w";
  REQUIRE_THAT(a.ask("create w 1048576 7"), StartsWith("ok gen="));
  // node b's first get pulls 4 MiB, its allocator of record counting them.
  std::string got = b1.ask("get w 7");
  REQUIRE_THAT(got, StartsWith("ok gen="));
  CHECK_THAT(got, Catch::Matchers::Contains("name=" + rep + " pulls=1 pulled=4194304"));
  const std::string gen = got.substr(7, got.find(' ', 7) - 7);
  // The other container of node b takes the same replica: nothing moves.
  got = b2.ask("get w 7");
  CHECK_THAT(got, StartsWith("ok gen=" + gen + " name=" + rep));
  CHECK_THAT(b1.ask("get w 7"), Catch::Matchers::Contains("pulls=1 pulled=4194304"));
  // The source's record says where its replicas are.
  CHECK(c.command({"HGET", "memcuda:tensor:w", "replicas"}).str() == "node-b");
  CHECK(c.command({"HGET", "memcuda:tensor:" + rep, "node"}).str() == "node-b");

  // A publish at the source: node b's next get copies it again, in place.
  REQUIRE_THAT(a.ask("rewrite w 9"), StartsWith("ok version="));
  CHECK_THAT(b2.ask("get w 9"), StartsWith("ok gen=" + gen + " name=" + rep));
  CHECK_THAT(b1.ask("get w 9"), Catch::Matchers::Contains("pulls=2 pulled=8388608"));

  // The other way round: node a pulls what node b made.
  REQUIRE_THAT(b2.ask("create v 1000 3"), StartsWith("ok gen="));
  CHECK_THAT(a.ask("get v 3"), Catch::Matchers::Contains("name=.memcuda-rep/node-a/v pulls=1 pulled=4000"));
  // A tensor of the reader's own node is read in place, never pulled.
  CHECK_THAT(b1.ask("get v 3"), Catch::Matchers::Contains("name=v pulls=2"));
  // A pull claims its name while it runs, and no claim outlives it.
  CHECK(c.command({"EXISTS", "memcuda:pulling:w", "memcuda:pulling:v"}).integer() == 0);
  // Another node's claim (a node gone mid-pull): the get waits for it to
  // lapse, then pulls. A key of another type there is no claim: no wait.
  REQUIRE_THAT(a.ask("create u 1000 4"), StartsWith("ok gen="));
  REQUIRE_THAT(a.ask("create t 1000 6"), StartsWith("ok gen="));
  c.command({"SET", "memcuda:pulling:u", "node-z", "PX", "1500"});
  c.command({"HSET", "memcuda:pulling:t", "f", "x"});
  CHECK_THAT(b1.ask("get u 4"), StartsWith("ok gen=") && Catch::Matchers::Contains("name=.memcuda-rep/node-b/u"));
  CHECK(c.command({"EXISTS", "memcuda:pulling:u"}).integer() == 0);
  CHECK_THAT(b1.ask("get t 6"), StartsWith("ok gen=") && Catch::Matchers::Contains("name=.memcuda-rep/node-b/t"));
  CHECK(c.command({"TYPE", "memcuda:pulling:t"}).str() == "hash");
  // Garbage is a typed error, and leaves the node serving.
  CHECK_THAT(b1.ask("get nosuch 1"), StartsWith("error not_found "));

  // A hostile region field in node a's record: a typed error for the get
  // that needs it; node b serves on.
  REQUIRE_THAT(a.ask("create x 1000 5"), StartsWith("ok gen="));
  auto rec = c.command({"HGETALL", "memcuda:node:node-a"});
  for (std::size_t i = 0; i + 1 < rec.size(); i += 2)
    if (test::starts_with(std::string(rec[i].str()), "region:"))
      c.command({"HSET", "memcuda:node:node-a", std::string(rec[i].str()), "garbage"});
  CHECK_THAT(b1.ask("get x 5"), StartsWith("error unavailable ") && Catch::Matchers::Contains("malformed"));
  CHECK(c.command({"EXISTS", "memcuda:tensor:.memcuda-rep/node-b/x"}).integer() == 0);
  CHECK_THAT(b2.ask("get w 9"), StartsWith("ok gen=" + gen));

  // Node a dies (kill -9): a node that had pulled still reads its replica,
  // and one that had not pulls it from there.
  a.proc->kill();
  a.proc->wait();
  CHECK_THAT(b2.ask("get w 9"), StartsWith("ok gen=" + gen + " name=" + rep));
  FleetProc d = fleet_proc("node-d", "node-d", srv, vol);
  CHECK_THAT(d.ask("get w 9"), StartsWith("ok gen=") && Catch::Matchers::Contains("name=.memcuda-rep/node-d/w pulls=1"));
  // Nobody left that has x: Lost (the engine found no peer, or the record
  // and session are gone), or Unavailable (a node whose record lives on
  // while its session expires); nothing of it published.
  got = d.ask("get x 5");
  CHECK_THAT(got, StartsWith("error lost ") || StartsWith("error unavailable "));
  CHECK(c.command({"EXISTS", "memcuda:tensor:.memcuda-rep/node-d/x"}).integer() == 0);
  CHECK_THAT(d.ask("leader"), StartsWith("ok leader=1"));
}

TEST_CASE("nodes: a node killed while it pulls: its reference on the source is collected, the node's next "
          "process pulls", "[nodes][fleet]") {
  if (auto why = test::pods_unavailable()) MEMCUDA_SKIP(*why);
  test::RedisServer srv;
  test::PodVolume vol(srv);
  FleetProc a = fleet_proc("node-a", "node-a", srv, vol);
  REQUIRE_THAT(a.ask("create w 1000 7"), StartsWith("ok gen="));
  CHECK(a.ask("refcount w") == "ok refcount=2");  // its name's, a's handle
  // Node b's allocator of record dies (SIGKILL) right after its pull took
  // a reference on w.
  FleetProc b = fleet_proc("node-b", "node-b", srv, vol, {"MEMCUDA_FAULTS=pull.after_acquire=die"});
  b.proc->send("get w 7");
  b.proc->wait();
  CHECK(a.ask("refcount w") == "ok refcount=3");
  // Node a's garbage collector drops it once b's session has expired.
  std::string rc;
  for (int i = 0; i < 100 && rc != "ok refcount=2"; ++i) {
    std::this_thread::sleep_for(100ms);
    (void)a.ask("gc");
    rc = a.ask("refcount w");
  }
  CHECK(rc == "ok refcount=2");
  // Node b again: its new process takes the lease over and pulls.
  FleetProc b2 = fleet_proc("node-b", "node-b", srv, vol);
  CHECK_THAT(b2.ask("get w 7"), StartsWith("ok gen=") && Catch::Matchers::Contains("pulls=1"));
  CHECK(a.ask("refcount w") == "ok refcount=2");  // the pull gave its reference back: b's readers hold the replica
}

TEST_CASE("nodes: a model version reaches three nodes with a pinned reader each, a node gone mid-pull is passed over, "
          "and a late node pulls from any node that has the version", "[nodes][fleet]") {
  if (auto why = test::pods_unavailable()) MEMCUDA_SKIP(*why);
  test::RedisServer srv;
  test::PodVolume vol(srv);
  auto c = srv.connect();
  FleetProc a = fleet_proc("node-a", "node-a", srv, vol);
  FleetProc b = fleet_proc("node-b", "node-b", srv, vol);
  FleetProc cc = fleet_proc("node-c", "node-c", srv, vol);
  FleetProc d = fleet_proc("node-d", "node-d", srv, vol);
  constexpr int kBytes = 4 * 4 * 262144;  // 4 tensors of 1 MiB
  // Version 1 on node a; each other node's first open pulls all of it,
  // once, into replicas its processes share.
  REQUIRE(a.ask("publish m/ 4 262144 10") == "ok version=1");
  for (FleetProc* p : {&b, &cc, &d}) {
    const std::string got = p->ask("open m/ 10");
    CHECK_THAT(got, StartsWith("ok version=1 tensors=4 pulls=4 pulled=" + std::to_string(kBytes)));
  }
  // Version 2: every pinned reader keeps reading version 1 where it is,
  // though node a retired it; a reader that advances reads version 2.
  REQUIRE(a.ask("publish m/ 4 262144 20") == "ok version=2");
  for (FleetProc* p : {&b, &cc, &d}) CHECK_THAT(p->ask("check m/ 10"), StartsWith("ok version=1 "));
  CHECK_THAT(b.ask("advance m/ 20"), StartsWith("ok moved=1 version=2 pulls=8 pulled=" + std::to_string(2 * kBytes)));
  CHECK_THAT(cc.ask("advance m/ 20"), StartsWith("ok moved=1 version=2 pulls=8 "));
  CHECK_THAT(d.ask("check m/ 10"), StartsWith("ok version=1 "));
  // Node b's replicas of version 1 go once its reader moved on: unlinked
  // (their source is gone) and freed by node b, which owns them.
  auto rep_keys = [&](const std::string& node) {
    return c.command({"KEYS", "memcuda:tensor:.memcuda-rep/" + node + "/*"}).size();
  };
  std::size_t left = 99, removed = 99;
  for (int i = 0; i < 100 && (left != 4 || removed > 4); ++i) {
    (void)a.ask("gc");
    left = rep_keys("node-b");
    removed = c.command({"KEYS", "memcuda:removed:*"}).size();
    if (left != 4 || removed > 4) std::this_thread::sleep_for(100ms);
  }
  CHECK(left == 4);     // version 2's only
  CHECK(removed <= 4);  // node d's pinned version 1 (unlinked, held): nothing else waits to be freed

  // Node e opens version 2 and waits right after it took the reference on
  // its first source; meanwhile the nodes that have it (b, c) are killed.
  // Its pull passes them over and reads from node a.
  const std::string gate = vol.dir + "/gate";
  FleetProc e = fleet_proc("node-e", "node-e", srv, vol,
                           {"MEMCUDA_FAULTS=pull.after_acquire=wait", "MEMCUDA_FAULT_GATE=" + gate});
  e.proc->send("open m/ 20");
  REQUIRE(gate_reached(gate));
  b.proc->kill();
  cc.proc->kill();
  b.proc->wait();
  cc.proc->wait();
  { std::ofstream go(gate + ".go"); }
  std::string got = e.answer(120s);
  CHECK_THAT(got, StartsWith("ok version=2 tensors=4 pulls=4 pulled=" + std::to_string(kBytes)));
  // The source's node goes too: a late node f pulls version 2 from node e,
  // the one live node that has it.
  a.proc->kill();
  a.proc->wait();
  FleetProc f = fleet_proc("node-f", "node-f", srv, vol);
  CHECK_THAT(f.ask("open m/ 20", 120s), StartsWith("ok version=2 tensors=4 pulls=4 "));
  // Node d's reader still reads version 1.
  CHECK_THAT(d.ask("check m/ 10"), StartsWith("ok version=1 "));
}

TEST_CASE("nodes: a pull that outlasts serve_stall_timeout keeps its node's lease", "[nodes][fleet]") {
  if (auto why = test::pods_unavailable()) MEMCUDA_SKIP(*why);
  test::RedisServer srv;
  test::PodVolume vol(srv);
  FleetProc a = fleet_proc("node-a", "node-a", srv, vol);
  REQUIRE_THAT(a.ask("create w 1000 7"), StartsWith("ok gen="));
  // Node b's pull holds (the gate) for five times its stall timeout, as a
  // slow network or a slow source would: its heartbeat must not take the
  // control thread running it for a stuck one.
  const std::string gate = vol.dir + "/gate";
  FleetProc b = fleet_proc("node-b", "node-b", srv, vol,
                           {"MEMCUDA_FAULTS=pull.after_acquire=wait", "MEMCUDA_FAULT_GATE=" + gate}, {"--stall-ms", "300"});
  b.proc->send("get w 7");
  REQUIRE(gate_reached(gate));
  std::this_thread::sleep_for(1500ms);
  { std::ofstream go(gate + ".go"); }
  CHECK_THAT(b.answer(60s), StartsWith("ok gen=") && Catch::Matchers::Contains("pulls=1"));
  CHECK(b.ask("leader") == "ok leader=1");
  // (A stall outside a pull still gives the lease up: test_resilience.cpp.)
}

TEST_CASE("nodes: a Python process of another node gets a tensor and follows model versions, libmemcuda_c loading "
          "the UCX mover plugin", "[nodes][fleet][python]") {
  if (auto why = test::pods_unavailable()) MEMCUDA_SKIP(*why);
  if (auto why = test::python_node_unavailable("numpy")) MEMCUDA_SKIP(*why);
  test::RedisServer srv;
  test::PodVolume vol(srv);
  auto c = srv.connect();
  FleetProc a = fleet_proc("node-a", "node-a", srv, vol);
  REQUIRE_THAT(a.ask("create w 100000 7"), StartsWith("ok gen="));
  REQUIRE(a.ask("publish m/ 3 4096 10") == "ok version=1");
  FleetProc py = test::python_fleet_proc("node-p", srv, vol);
  auto ask = [&](const std::string& line) { return py.ask(line); };
  CHECK(ask("get w 7") == "ok pulls=1 pulled=400000");
  CHECK(c.command({"EXISTS", "memcuda:tensor:.memcuda-rep/node-p/w"}).integer() == 1);
  CHECK(ask("open m/ 10") == "ok version=1 tensors=3");
  // Version 2 on node a: the Python reader keeps version 1 until it advances.
  REQUIRE(a.ask("publish m/ 3 4096 20") == "ok version=2");
  CHECK(ask("check m/ 10") == "ok version=1");
  CHECK(ask("advance m/ 20") == "ok moved=1 version=2");
  CHECK_THAT(ask("get nosuch 1"), StartsWith("error NotFound "));
  py.proc->send("exit");
  CHECK(py.proc->wait() == 0);
}

#else

TEST_CASE("nodes: node B pulls 64 MiB node A exposed, and refuses A's keys once A restarted", "[nodes]") {
  MEMCUDA_SKIP("built without UCX (MEMCUDA_UCX=OFF, or libucx-dev not found)");
}

TEST_CASE("nodes: a fleet node pulls another node's tensor once into a replica its processes share", "[nodes][fleet]") {
  MEMCUDA_SKIP("built without UCX (MEMCUDA_UCX=OFF, or libucx-dev not found)");
}

TEST_CASE("nodes: a node killed while it pulls: its reference on the source is collected, the node's next "
          "process pulls", "[nodes][fleet]") {
  MEMCUDA_SKIP("built without UCX (MEMCUDA_UCX=OFF, or libucx-dev not found)");
}

TEST_CASE("nodes: a model version reaches three nodes with a pinned reader each, a node gone mid-pull is passed over, "
          "and a late node pulls from any node that has the version", "[nodes][fleet]") {
  MEMCUDA_SKIP("built without UCX (MEMCUDA_UCX=OFF, or libucx-dev not found)");
}

TEST_CASE("nodes: a pull that outlasts serve_stall_timeout keeps its node's lease", "[nodes][fleet]") {
  MEMCUDA_SKIP("built without UCX (MEMCUDA_UCX=OFF, or libucx-dev not found)");
}

#endif
