// Several nodes on one machine. A fake node is a process in its own pid,
// mount, UTS and IPC namespaces (support/pod.hpp, sharing the network):
// its own hostname and so its own node id, its own /dev/shm, reaching
// Redis through the shared socket and the other nodes over TCP loopback,
// as other machines would be reached. What crosses: the node endpoint
// records in Redis (detail/registry/node_endpoint.hpp) and bytes through
// the UCX mover (detail/transfer/ucx_mover.hpp). Where namespaces cannot be
// made, or UCX was not built, those cases are reported skipped with why.
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/detail/registry/node_endpoint.hpp"
#include "memcuda/detail/transfer/ucx_mover.hpp"
#include "support/pod.hpp"
#include "support/redis_server.hpp"
#include "support/skip.hpp"
#include "support/text.hpp"

using namespace memcuda;
using namespace std::chrono_literals;
using Catch::Matchers::StartsWith;

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
  // The peer gone: the engine's error, typed, with its status text, by the
  // deadline at the latest. (A packed key or address carries no length, so
  // a garbage one is not something a mover can check; the registry's
  // incarnation check is what keeps stale keys away: next case.)
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

#else

TEST_CASE("nodes: node B pulls 64 MiB node A exposed, and refuses A's keys once A restarted", "[nodes]") {
  MEMCUDA_SKIP("built without UCX (MEMCUDA_UCX=OFF, or libucx-dev not found)");
}

#endif
