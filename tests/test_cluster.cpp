// The registry on Redis Cluster, against real servers (support/
// redis_cluster.hpp: three primaries with a replica each on loopback):
//  * the slot of a key is CRC16 of its hash tag (the vectors of the Redis
//    Cluster specification, and what the server says);
//  * keys carry the tag {namespace} only with a cluster URL, and scripts
//    differ only there (SPUBLISH);
//  * create, get, release and remove through a cluster URL, each
//    namespace's keys all on the node of its slot (a script whose keys were
//    not all in one slot would fail with CROSSSLOT);
//  * under load from real processes ([load], support/redis_load.hpp): a
//    CLUSTER FAILOVER of the namespace's primary, moving the namespace's
//    slot to another primary (ASK during the migration, MOVED after it) and
//    kill -9 of the namespace's primary (the cluster promotes its replica
//    after cluster-node-timeout). After each, every persistent tensor reads
//    back byte for byte, no reference is leaked, the allocator of record
//    serves, and the time until creates worked again is printed (WARN);
//  * the reference cache's invalidation connection follows a slot move;
//  * CLUSTERDOWN waited out, then a ConnectionError.
#include <catch2/catch.hpp>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/detail/store/batch_scripts.hpp"
#include "memcuda/detail/store/keys.hpp"
#include "memcuda/detail/store/scripts.hpp"
#include "memcuda/detail/store/share_scripts.hpp"
#include "memcuda/memcuda.hpp"
#include "memcuda/redis/connection.hpp"
#include "support/redis_cluster.hpp"
#include "support/redis_load.hpp"
#include "support/registry_options.hpp"
#include "support/skip.hpp"
#include "support/timing.hpp"
#include "support/worker.hpp"

using namespace memcuda;
using namespace std::chrono_literals;
using redis::detail::key_slot;

#define START_CLUSTER(var)                      \
  std::string why_##var;                        \
  auto var = test::start_cluster(why_##var);    \
  if (!var) MEMCUDA_SKIP(why_##var)

namespace {

RegistryOptions cluster_options(test::RedisCluster& c, std::string ns = {}, bool control = true) {
  RegistryOptions o;
  o.control_thread = control;
  o.name_space = std::move(ns);
  o.redis = redis::parse_url(c.url());
  o.redis.reconnect_timeout = 5s;  // a call waits this long for the slot to be served again
  o.default_backend = BackendKind::host;
  o.share_references = true;
  o.release_linger = std::chrono::microseconds(0);
  return o;
}

std::vector<float> filled(int n, float v) { return std::vector<float>(n, v); }

void check_reads(TensorRegistry& reg, const std::string& name, float v) {
  INFO(name);
  std::vector<float> back(64);
  reg.get<float>(name).copy_to_host(back);
  CHECK(back == filled(64, v));
}

// The CLIENT LIST id of the registry `session`'s invalidation connection on
// `node`, or "".
std::string listener_on(test::RedisServer& node, const std::string& session) {
  const std::string list(node.connect().command({"CLIENT", "LIST"}).str());
  const auto at = list.find(" name=memcuda-invalidate-" + session + " ");
  if (at == std::string::npos) return {};
  const auto line = list.rfind('\n', at) + 1;  // npos + 1 is 0: the first line
  return list.substr(line, list.find(' ', line) - line);
}

}  // namespace

TEST_CASE("cluster slots: CRC16 of the hash tag, as the Redis Cluster specification says", "[cluster][url]") {
  CHECK(redis::detail::crc16("123456789") == 0x31C3);
  CHECK(key_slot("{user1000}.following") == key_slot("{user1000}.followers"));
  CHECK(key_slot("foo{}{bar}") == redis::detail::crc16("foo{}{bar}") % 16384);  // an empty tag hashes the key
  CHECK(key_slot("foo{{bar}}zap") == key_slot("{bar"));
  CHECK(key_slot("foo{bar}{zap}") == key_slot("bar"));
  CHECK(key_slot("{memcuda}:memcuda:tensor:w") == key_slot("memcuda"));
}

TEST_CASE("keys carry the {namespace} tag only on a cluster", "[cluster][url]") {
  const detail::Keys plain, prod("prod"), cplain({}, true), cprod("prod", true);
  CHECK(plain.tensor("w") == "memcuda:tensor:w");
  CHECK(plain.lifecycle() == "tensor_lifecycle");
  CHECK(prod.tensor("w") == "prod:memcuda:tensor:w");
  CHECK(prod.leader() == "prod:memcuda:leader");
  CHECK(cplain.tensor("w") == "{memcuda}:memcuda:tensor:w");
  CHECK(cplain.lifecycle() == "{memcuda}:tensor_lifecycle");
  CHECK(cprod.tensor("w") == "{prod}:memcuda:tensor:w");
  CHECK(cprod.request_reply("s", 3) == "{prod}:memcuda:reply:s:3");
  CHECK(cprod.ready_channel("w") == "{prod}:memcuda:ready:w");
  for (const auto& k : {cprod.tensor("w"), cprod.removed(7), cprod.leader(), cprod.wait_list("s", 1)})
    CHECK(key_slot(k) == key_slot("prod"));
  CHECK_THROWS_AS(detail::Keys("a{b}", true), InvalidArgument);
}

TEST_CASE("a single server runs the scripts as written, and on a cluster the ready channel is sharded", "[cluster][url]") {
  using detail::store::script;
  for (const auto* s : {&script<detail::lua::kCreate>(false), &script<detail::lua::kShare>(false),
                        &script<detail::lua::kCreateMany>(false)}) {
    CHECK(s->source().find("redis.call('PUBLISH',") != std::string::npos);
    CHECK(s->source().find("SPUBLISH") == std::string::npos);
  }
  CHECK(script<detail::lua::kCreate>(false).source() == std::string(detail::lua::kCreate));
  const auto& sharded = script<detail::lua::kCreate>(true).source();
  CHECK(sharded.find("redis.call('SPUBLISH', channel, gen)") != std::string::npos);
  CHECK(sharded.find("'PUBLISH'") == std::string::npos);
  CHECK(script<detail::lua::kAcquire>(true).sha() == script<detail::lua::kAcquire>(false).sha());  // publishes nothing
}

TEST_CASE("a registry on a cluster URL creates, gets, releases and removes on its slot's node", "[cluster]") {
  START_CLUSTER(cluster);
  const int slot = key_slot("memcuda");
  auto& node = cluster->primary_of(slot);
  CHECK(node.connect().command({"CLUSTER", "KEYSLOT", "{memcuda}:memcuda:tensor:x"}).integer() == slot);

  // a seed that is not the slot's node: the connection goes there
  redis::Connection c(redis::parse_url(cluster->url()));
  CHECK(c.command({"CONFIG", "GET", "port"})[1].str() == std::to_string(node.port()));

  TensorRegistry reg(cluster_options(*cluster));
  REQUIRE(reg.is_leader());
  auto client = std::make_unique<TensorRegistry>(cluster_options(*cluster, {}, false));
  client->create<float>("x", {64}, test::persistent()).copy_from_host(filled(64, 2.0f));
  check_reads(*client, "x", 2.0f);
  {
    auto held = client->get<float>("x");
    CHECK(test::hget(c, "{memcuda}:memcuda:tensor:x", "refcount") != "1");
  }
  client->flush();
  CHECK(test::eventually([&] { return test::hget(c, "{memcuda}:memcuda:tensor:x", "refcount") == "1"; }, 10s));
  CHECK(c.command({"ZCARD", "{memcuda}:memcuda:names"}).integer() == 1);
  client->remove("x");
  CHECK(c.command({"EXISTS", "{memcuda}:memcuda:tensor:x"}).integer() == 0);
  CHECK_THROWS_AS(client->get<float>("x"), NotFound);
  // nothing of the registry landed outside the slot's node
  for (std::size_t i = 0; i < cluster->size(); ++i)
    if (&cluster->node(i) != &node && cluster->node(i).connect().command({"ROLE"})[0].str() == "master")
      CHECK(cluster->node(i).connect().command({"DBSIZE"}).integer() == 0);
}

TEST_CASE("two namespaces of one cluster live on the nodes of their own slots", "[cluster]") {
  START_CLUSTER(cluster);
  // a namespace whose slot another primary serves than the default's
  const int home = cluster->primary_of(key_slot("memcuda")).port();
  std::string other;
  for (int i = 0; other.empty(); ++i)
    if (cluster->primary_of(key_slot("ns" + std::to_string(i))).port() != home) other = "ns" + std::to_string(i);
  TensorRegistry a(cluster_options(*cluster));
  TensorRegistry b(cluster_options(*cluster, other));
  a.create<float>("w", {64}, test::persistent()).copy_from_host(filled(64, 1.0f));
  b.create<float>("w", {64}, test::persistent()).copy_from_host(filled(64, 5.0f));
  check_reads(a, "w", 1.0f);
  check_reads(b, "w", 5.0f);
  auto on_a = cluster->primary_of(key_slot("memcuda")).connect();
  auto on_b = cluster->primary_of(key_slot(other)).connect();
  CHECK(on_a.command({"EXISTS", "{memcuda}:memcuda:tensor:w"}).integer() == 1);
  CHECK(on_b.command({"EXISTS", "{" + other + "}:memcuda:tensor:w"}).integer() == 1);
  CHECK(on_a.command({"CLUSTER", "COUNTKEYSINSLOT", key_slot(other)}).integer() == 0);
}

namespace {

// The allocator of record, and a client without the control thread, with
// the replica wait on (as the load's processes).
struct ClusterRegistries {
  explicit ClusterRegistries(test::RedisCluster& c) : leader(options(c, true)), client(options(c, false)) {}
  static RegistryOptions options(test::RedisCluster& c, bool control) {
    auto o = cluster_options(c, {}, control);
    o.redis.replica_wait = 1000ms;
    return o;
  }
  TensorRegistry leader, client;
};

// Waits until the slot's primary is another node than port `old`.
long long until_slot_moves(test::RedisCluster& c, int slot, int old, test::Clock::time_point t0) {
  test::SentinelTopology::wait_until("another node serves the slot", 30s,
                                     [&] { return c.primary_of(slot).port() != old; });
  return test::ms_since(t0);
}

}  // namespace

TEST_CASE("a CLUSTER FAILOVER of the namespace's primary under load loses nothing and leaks nothing",
          "[cluster][load]") {
  START_CLUSTER(cluster);
  const int slot = key_slot("memcuda");
  ClusterRegistries regs(*cluster);
  test::RedisLoad load(cluster->url());
  REQUIRE(load.progresses());
  const int old = cluster->primary_of(slot).port();
  const auto t0 = test::Clock::now();
  cluster->replica_of(slot).connect().command({"CLUSTER", "FAILOVER"});
  const auto works = test::until_creates_work(regs.client, t0);
  const auto switched = until_slot_moves(*cluster, slot, old, t0);
  CHECK(load.progresses());
  load.stop();
  test::check_after_fault(cluster->url(), regs.leader, regs.client);
  WARN("CLUSTER FAILOVER under load: the replica serves the slot after " << switched
       << " ms, creates and gets work again after " << works << " ms");
}

TEST_CASE("kill -9 of the namespace's primary under load: the replica takes over, nothing persistent lost",
          "[cluster][load]") {
  START_CLUSTER(cluster);
  const int slot = key_slot("memcuda");
  ClusterRegistries regs(*cluster);
  test::RedisLoad load(cluster->url());
  REQUIRE(load.progresses());
  auto& primary = cluster->primary_of(slot);
  const int old = primary.port();
  const auto t0 = test::Clock::now();
  primary.kill(SIGKILL);
  const auto works = test::until_creates_work(regs.client, t0);
  const auto switched = until_slot_moves(*cluster, slot, old, t0);
  // The promoted replica has no replica of its own: the load's writes
  // miss the replica wait once and then stop waiting (store::replicate).
  CHECK(load.progresses());
  load.stop();
  test::check_after_fault(cluster->url(), regs.leader, regs.client);
  WARN("kill -9 of the namespace's primary under load (cluster-node-timeout 1000 ms): the replica serves the slot "
       << switched << " ms after, creates and gets work again after " << works << " ms");
}

TEST_CASE("moving the namespace's slot to another primary under load: ASK, then MOVED", "[cluster][load]") {
  START_CLUSTER(cluster);
  const int slot = key_slot("memcuda");
  auto& from = cluster->primary_of(slot);
  auto& to = cluster->other_primary(slot);
  ClusterRegistries regs(*cluster);
  test::RedisLoad load(cluster->url());
  REQUIRE(load.progresses());
  redis::Connection c(redis::parse_url(cluster->url()));
  CHECK(c.command({"CONFIG", "GET", "port"})[1].str() == std::to_string(from.port()));

  auto dst = to.connect();
  const auto t0 = test::Clock::now();
  cluster->move_slot(slot, to, [&] {
    // a key the source does not have goes to the target: ASK, ASKING, the command there
    CHECK(c.command({"SET", "{memcuda}:asked", "1"}).str() == "OK");
    CHECK(dst.command({"CLUSTER", "COUNTKEYSINSLOT", slot}).integer() >= 1);
  });
  const auto migrated = test::ms_since(t0);
  // every connection follows MOVED to the new node
  CHECK(c.command({"GET", "{memcuda}:asked"}).str() == "1");
  CHECK(c.command({"CONFIG", "GET", "port"})[1].str() == std::to_string(to.port()));
  const auto works = test::until_creates_work(regs.client, t0);
  CHECK(load.progresses());
  load.stop();
  test::check_after_fault(cluster->url(), regs.leader, regs.client);
  CHECK(dst.command({"EXISTS", "{memcuda}:memcuda:tensor:load.p0"}).integer() == 1);
  WARN("slot " << slot << " moved to another primary under load: migrated in " << migrated
               << " ms, creates and gets work " << works << " ms after the migration began");
}

TEST_CASE("after the slot moves, a cached get sees a remove and re-create by another process", "[cluster]") {
  START_CLUSTER(cluster);
  const int slot = key_slot("memcuda");
  auto& to = cluster->other_primary(slot);
  TensorRegistry reg(cluster_options(*cluster));  // caches, and follows the slot on its heartbeat
  auto w = test::start_worker(cluster->url(), {"--no-control", "--backend", "host"});
  REQUIRE(w->read_line(10s).value_or("").rfind("READY", 0) == 0);
  auto gen_of = [](const std::string& reply) {
    INFO(reply);
    const auto p = reply.find("gen=");
    REQUIRE(p != std::string::npos);
    return std::stoull(reply.substr(p + 4));
  };
  REQUIRE(gen_of(w->ask("create x 16 1")) != 0);
  auto old = reg.get<float>("x");
  REQUIRE(reg.get<float>("x").handle() == old.handle());  // served from the cache

  cluster->move_slot(slot, to);
  const auto t0 = test::Clock::now();
  // The worker's remove is written on the new primary only; the registry's
  // heartbeat, following the slot, moves its invalidation connection there.
  REQUIRE(w->ask("release x").rfind("OK", 0) == 0);
  REQUIRE(w->ask("remove x") == "OK");
  const std::uint64_t g2 = gen_of(w->ask("create x 16 2"));
  REQUIRE(g2 != old.generation());
  CHECK(test::eventually([&] { return reg.get<float>("x").generation() == g2; }, 10s));
  std::vector<float> back(16);
  reg.get<float>("x").copy_to_host(back);
  CHECK(back[0] == 2.0f);
  // and it listens there, and stays (three beats later the same client):
  // the next remove and re-create is seen too
  std::string id;
  CHECK(test::eventually([&] { return !(id = listener_on(to, reg.session_id())).empty(); }, 10s));
  std::printf("the invalidation connection is on the slot's new primary %lld ms after the move (the heartbeat every 500 ms)\n",
              test::ms_since(t0));
  std::this_thread::sleep_for(1500ms);
  CHECK(listener_on(to, reg.session_id()) == id);
  auto now = reg.get<float>("x");
  REQUIRE(w->ask("release x").rfind("OK", 0) == 0);
  REQUIRE(w->ask("remove x") == "OK");
  const std::uint64_t g3 = gen_of(w->ask("create x 16 3"));
  CHECK(test::eventually([&] { return reg.get<float>("x").generation() == g3; }, 10s));
}

TEST_CASE("CLUSTERDOWN is waited out within reconnect_timeout, then a ConnectionError", "[cluster]") {
  START_CLUSTER(cluster);
  const int slot = key_slot("memcuda");
  auto& owner = cluster->primary_of(slot);
  auto o = redis::parse_url(cluster->url());
  o.reconnect_timeout = 2s;
  redis::Connection c(o);
  REQUIRE(c.command({"SET", "{memcuda}:k", "1"}).str() == "OK");
  o.reconnect_timeout = 30s;
  redis::Connection patient(o);
  REQUIRE(patient.command({"GET", "{memcuda}:k"}).str() == "1");
  // Most primaries out of reach: the one left says the cluster is down (and
  // no replica can be promoted without a majority).
  std::vector<test::RedisServer*> paused;
  for (std::size_t i = 0; i < cluster->size(); ++i)
    if (cluster->node(i).port() != owner.port() &&
        cluster->node(i).connect().command({"ROLE"})[0].str() == "master")
      paused.push_back(&cluster->node(i));
  REQUIRE(paused.size() == 2);
  for (auto* n : paused) n->pause();
  auto admin = owner.connect();
  test::SentinelTopology::wait_until("the slot's primary says the cluster is down", 30s, [&] {
    return admin.command({"CLUSTER", "INFO"}).str().find("cluster_state:fail") != std::string_view::npos;
  });

  SECTION("it lasts: a ConnectionError naming the slot, after reconnect_timeout") {
    const auto t0 = test::Clock::now();
    try {
      c.command({"GET", "{memcuda}:k"});
      FAIL("answered");
    } catch (const ConnectionError& e) {
      const std::string m = e.what();
      CHECK(m.find("CLUSTERDOWN") != std::string::npos);
      CHECK(m.find("slot " + std::to_string(slot)) != std::string::npos);
    }
    const auto ms = test::ms_since(t0);
    CHECK(ms >= 1900);
    CHECK(ms < 5000);
    for (auto* n : paused) n->resume();
    CHECK(test::eventually([&] {
      try {
        return c.command({"GET", "{memcuda}:k"}).str() == "1";
      } catch (const Error&) {
        return false;
      }
    }, 30s));
  }
  SECTION("it ends within the wait: the command is answered") {
    std::jthread later([&] {
      std::this_thread::sleep_for(300ms);
      for (auto* n : paused) n->resume();
    });
    CHECK(patient.command({"GET", "{memcuda}:k"}).str() == "1");
  }
}
