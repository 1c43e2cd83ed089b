// Every key of the schema (detail/store/schema.hpp) against a real
// redis-server and real processes (memcuda_test_worker, host backend):
//  * the table lists every key Keys can build, and docs/protocol.md lists
//    the same keys;
//  * each fixed key set to another type (and each counter to a value that
//    does not parse, the generation counter also below the highest record
//    generation) while four processes create, get and release: serving goes
//    on within one GC round, the key is moved aside (`memcuda quarantine`
//    lists it) and rebuilt, nothing held is freed, no reference leaks and
//    no generation repeats.
#include <catch2/catch.hpp>

#include <signal.h>

#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/detail/store/schema.hpp"
#include "memcuda/memcuda.hpp"
#include "memcuda/redis/connection.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"
#include "support/timing.hpp"

using namespace memcuda;
using namespace std::chrono_literals;
namespace schema = memcuda::detail::schema;

namespace {

std::string read_text(const std::string& rel) {
  std::ifstream f(std::string(MEMCUDA_TEST_SOURCE_DIR) + "/../" + rel);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("schema table: every key Keys builds is in it, with a repair, and docs/protocol.md lists the same keys",
          "[schema]") {
  const std::string keys = read_text("include/memcuda/detail/store/keys.hpp");
  REQUIRE(!keys.empty());
  std::set<std::string> builders;
  std::regex member(R"(std::string (\w+)\([^)]*\) const)");
  for (std::sregex_iterator it(keys.begin(), keys.end(), member), end; it != end; ++it) builders.insert((*it)[1]);
  REQUIRE(builders.size() > 30);
  std::set<std::string> listed;
  for (const auto& e : schema::kKeys) {
    INFO(e.builder);
    CHECK(listed.insert(std::string(e.builder)).second);  // once
    CHECK(!e.rebuilt.empty());
    CHECK(!e.writers.empty());
  }
  for (auto n : schema::kNotKeys) listed.insert(std::string(n));
  for (const auto& b : builders) {
    INFO("Keys::" << b << " builds a key the schema table (detail/store/schema.hpp) does not list");
    CHECK(listed.count(b) == 1);
  }
  // Every fixed key is spelled by fixed_key() and checked by the repair.
  const detail::Keys k;
  for (const auto& f : schema::fixed(k)) {
    INFO(f.spec->builder);
    CHECK(!f.key.empty());
    CHECK(f.key == f.spec->pattern);
  }
  // docs/protocol.md's key table: the same patterns.
  const std::string doc = read_text("docs/protocol.md");
  REQUIRE(!doc.empty());
  std::set<std::string> documented;
  std::regex row(R"(\n\| `((?:tensor_lifecycle|memcuda:)[^`]*)` \|)");
  for (std::sregex_iterator it(doc.begin(), doc.end(), row), end; it != end; ++it) documented.insert((*it)[1]);
  std::set<std::string> table;
  for (const auto& e : schema::kKeys) table.insert(std::string(e.pattern));
  CHECK(documented == table);
}

namespace {

RegistryOptions opts(const test::RedisServer& srv, bool control) {
  auto o = test::host_options(srv, control);
  o.lease_ttl = 600ms;
  o.session_ttl = 1000ms;
  o.gc_interval = 100ms;
  o.request_timeout = 5s;
  o.share_references = false;
  return o;
}

std::unique_ptr<test::Child> worker(const test::RedisServer& srv) {
  return std::make_unique<test::Child>(std::vector<std::string>{
      test::sibling_program("memcuda_test_worker"), "--url", srv.unix_url(), "--ttl", "600", "--session-ttl", "1000",
      "--backend", "host", "--no-control"});
}

bool begins(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

std::string type_of(redis::Connection& c, const std::string& key) { return std::string(c.command({"TYPE", key}).str()); }

std::uint64_t gen_of(const std::string& reply) {
  auto p = reply.find("gen=");
  return p == std::string::npos ? 0 : std::stoull(reply.substr(p + 4));
}

// refcount == the sum of the holder fields of every record; the
// generations of every record, in `gens`.
std::vector<std::string> audit(redis::Connection& c, std::vector<std::uint64_t>& gens) {
  std::vector<std::string> bad;
  for (const char* pat : {"memcuda:tensor:*", "memcuda:removed:*"}) {
    auto ks = c.command({"KEYS", pat});
    for (std::size_t i = 0; i < ks.size(); ++i) {
      const std::string key(ks[i].str());
      if (type_of(c, key) != "hash") continue;
      auto h = c.command({"HGETALL", key});
      long long rc = -1, sum = 0;
      for (std::size_t j = 0; j + 1 < h.size(); j += 2) {
        const std::string f(h[j].str()), v(h[j + 1].str());
        if (f == "refcount") rc = std::stoll(v);
        if (f == "generation") gens.push_back(std::stoull(v));
        if (begins(f, "holder:")) sum += std::stoll(v);
      }
      if (rc != sum) bad.push_back(key + ": refcount " + std::to_string(rc) + ", holders " + std::to_string(sum));
    }
  }
  return bad;
}

struct Break {
  std::string key;     // the fixed key
  std::string right;   // its type
  std::string how;     // "string" | "hash" | "list" | "notanumber" | "back"
};

// Four processes (this one: the allocator of record and a client registry;
// three workers) create, get and release while `b` is broken.
void broken_key(const Break& b) {
  INFO("the key: " << b.key << ", broken as " << b.how);
  test::RedisServer srv;
  TensorRegistry leader(opts(srv, true));
  REQUIRE(leader.is_leader());
  TensorRegistry client(opts(srv, false));
  auto admin = srv.connect();
  std::vector<std::unique_ptr<test::Child>> ws;
  for (int i = 0; i < 3; ++i) {
    ws.push_back(worker(srv));
    auto ready = ws.back()->read_line(10s);
    REQUIRE(ready);
    REQUIRE(begins(*ready, "READY"));
  }
  { auto k = leader.create<float>("keep", {8}, test::persistent()); }
  std::vector<float> data(16, 2.0f);
  PublishOptions po;
  po.create.persistent = true;
  publish_state_dict(leader, "m/", {{"w", DType::f32, {16}, data.data()}}, po).clear();
  const std::string dict_id(admin.command({"GET", "memcuda:dictlink:m/"}).str());
  REQUIRE(!dict_id.empty());
  for (auto& w : ws) REQUIRE(begins(w->ask("get keep"), "OK"));
  REQUIRE(begins(ws[2]->ask("opensd m/"), "OK count=1"));  // the dict record's reference, of a process killed below
  REQUIRE(admin.command({"HGET", "memcuda:dict:" + dict_id, "refcount"}).str() == "1");
  std::vector<std::uint64_t> before;
  REQUIRE(audit(admin, before).empty());
  const std::uint64_t top = *std::max_element(before.begin(), before.end());

  if (b.how == "string") admin.command({"DEL", b.key}), admin.command({"SET", b.key, "oops"});
  else if (b.how == "hash") admin.command({"DEL", b.key}), admin.command({"HSET", b.key, "oops", "1"});
  else if (b.how == "list") admin.command({"DEL", b.key}), admin.command({"LPUSH", b.key, "oops"});
  else if (b.how == "notanumber") admin.command({"SET", b.key, "notanumber"});
  else if (b.how == "back") admin.command({"SET", b.key, std::to_string(top - 5)});
  const std::string seen = type_of(admin, b.key);

  // Serving goes on: every process creates, gets and releases; a first
  // attempt may wait for the repair, none fails.
  std::vector<std::uint64_t> made;
  for (int round = 0; round < 3; ++round) {
    for (std::size_t i = 0; i < ws.size(); ++i) {
      const std::string n = "w" + std::to_string(i) + "_" + std::to_string(round);
      const auto r = ws[i]->ask("create " + n + " 4 " + std::to_string(i + 1));
      INFO(r);
      CHECK(begins(r, "OK gen="));
      made.push_back(gen_of(r));
      CHECK(begins(ws[i]->ask("get " + n), "OK"));
      CHECK(begins(ws[i]->ask("release " + n), "OK"));
      CHECK(begins(ws[i]->ask("release " + n), "OK"));  // freed: its last reference
    }
    std::optional<SharedTensor<float>> t;
    CHECK_NOTHROW(t.emplace(client.create<float>("c_" + std::to_string(round), {4})));
    if (t) made.push_back(t->generation());
    CHECK_NOTHROW((void)client.get<float>("keep"));
    std::this_thread::sleep_for(100ms);  // a GC round between the rounds
  }
  client.flush();

  // Moved aside, listed, and the key of its type (or absent until written).
  if (b.how != "back") {
    const std::string id = b.key.substr(std::string("memcuda:").size());
    CHECK(test::eventually([&] {
      for (const auto& q : client.quarantined())
        if (q.id == (b.key == "tensor_lifecycle" ? "tensor_lifecycle" : id)) return true;
      return false;
    }, 5s));
  }
  CHECK(test::eventually([&] {
    const auto t = type_of(admin, b.key);
    if (b.how == "notanumber" || b.how == "back") {
      auto v = admin.command({"GET", b.key});
      return !v.is_nil() && std::string(v.str()).find_first_not_of("0123456789") == std::string::npos;
    }
    return t == b.right || t == "none";
  }, 5s));
  if (b.key == "memcuda:dicts")  // rebuilt from the links
    CHECK(test::eventually([&] { return admin.command({"SISMEMBER", b.key, "m/"}).integer() == 1; }, 5s));
  if (b.key == "memcuda:dict_ids")
    CHECK(test::eventually([&] { return admin.command({"SISMEMBER", b.key, dict_id}).integer() == 1; }, 5s));

  // Nothing held is freed: every worker still reads what "keep" holds.
  for (auto& w : ws) CHECK(begins(w->ask("sum keep"), "OK sum=0"));
  // A killed holder's references are collected (the dict record's too).
  ws[2]->kill(SIGKILL);
  ws[2]->wait();
  CHECK(test::eventually([&] {
    return leader.info("keep").refcount == 3 &&
           admin.command({"HGET", "memcuda:dict:" + dict_id, "refcount"}).str() == "0";
  }, 10s));
  // No reference leaks, no generation repeats, and none below what was there.
  std::vector<std::uint64_t> gens;
  CHECK(audit(admin, gens) == std::vector<std::string>{});
  gens.insert(gens.end(), made.begin(), made.end());
  std::set<std::uint64_t> distinct(gens.begin(), gens.end());
  CHECK(distinct.size() == gens.size());
  for (auto g : made) CHECK(g > top);
  // and serving goes on
  auto again = client.create<float>("after", {2});
  CHECK(again.generation() > top);
}

}  // namespace

TEST_CASE("schema: memcuda:dicts of the wrong type: creates go on, the index is rebuilt from the links",
          "[redis][schema]") {
  broken_key({"memcuda:dicts", "set", "string"});
}
TEST_CASE("schema: memcuda:dict_ids of the wrong type: GC goes on, a killed holder's dict reference is collected",
          "[redis][schema]") {
  broken_key({"memcuda:dict_ids", "set", "string"});
}
TEST_CASE("schema: tensor_lifecycle of the wrong type: commands wait for the repair", "[redis][schema]") {
  broken_key({"tensor_lifecycle", "list", "string"});
}
TEST_CASE("schema: memcuda:generation that is not a number", "[redis][schema]") {
  broken_key({"memcuda:generation", "string", "notanumber"});
}
TEST_CASE("schema: memcuda:generation set back below a live generation: none repeats", "[redis][schema]") {
  broken_key({"memcuda:generation", "string", "back"});
}
TEST_CASE("schema: memcuda:generation of the wrong type", "[redis][schema]") {
  broken_key({"memcuda:generation", "string", "hash"});
}
TEST_CASE("schema: memcuda:allocations of the wrong type", "[redis][schema]") {
  broken_key({"memcuda:allocations", "hash", "string"});
}
TEST_CASE("schema: memcuda:processing_lists of the wrong type", "[redis][schema]") {
  broken_key({"memcuda:processing_lists", "set", "string"});
}
TEST_CASE("schema: memcuda:epoch that is not a number", "[redis][schema]") {
  broken_key({"memcuda:epoch", "string", "notanumber"});
}
TEST_CASE("schema: memcuda:leader of the wrong type: the lease is taken again", "[redis][schema]") {
  broken_key({"memcuda:leader", "string", "hash"});
}
TEST_CASE("schema: memcuda:owner_uid of the wrong type", "[redis][schema]") {
  broken_key({"memcuda:owner_uid", "string", "list"});
}
TEST_CASE("schema: a waiters set of the wrong type: the create of its name moves it aside", "[redis][schema]") {
  test::RedisServer srv;
  TensorRegistry leader(opts(srv, true));
  auto admin = srv.connect();
  admin.command({"SET", "memcuda:waiters:x", "oops"});
  auto t = leader.create<float>("x", {4});
  CHECK(t.generation() > 0);
  CHECK(type_of(admin, "memcuda:waiters:x") == "none");
  CHECK(type_of(admin, "memcuda:quarantine:waiters:x") == "string");
  bool listed = false;
  for (const auto& q : leader.quarantined()) listed = listed || q.id == "waiters:x";
  CHECK(listed);
}

// Keys one process alone uses: no other process repairs them, so their
// owner does when its command meets WRONGTYPE. Before, the allocator of
// record's BLMOVE into its processing list failed every pass (no create
// was served) and a session's heartbeat failed until the key was deleted.
TEST_CASE("schema: the allocator of record's processing list of the wrong type: moved aside, serving goes on",
          "[redis][schema]") {
  test::RedisServer srv;
  TensorRegistry leader(opts(srv, true));
  REQUIRE(leader.is_leader());
  auto admin = srv.connect();
  auto w = worker(srv);
  auto ready = w->read_line(10s);
  REQUIRE(ready);
  REQUIRE(begins(*ready, "READY"));
  REQUIRE(begins(w->ask("create a 4 1"), "OK gen="));
  const std::string epoch(admin.command({"GET", "memcuda:epoch"}).str());
  const std::string key = "memcuda:processing:" + epoch;
  admin.command({"DEL", key});
  admin.command({"SET", key, "oops"});
  const auto r = w->ask("create b 4 2");
  INFO(r);
  CHECK(begins(r, "OK gen="));
  CHECK(type_of(admin, key) != "string");
  CHECK(type_of(admin, "memcuda:quarantine:processing:" + epoch) == "string");
  bool listed = false;
  for (const auto& q : leader.quarantined()) listed = listed || q.id == "processing:" + epoch;
  CHECK(listed);
}

TEST_CASE("schema: a live session's key of the wrong type: its owner writes it again, nothing it holds is freed",
          "[redis][schema]") {
  test::RedisServer srv;
  TensorRegistry leader(opts(srv, true));
  REQUIRE(leader.is_leader());
  auto admin = srv.connect();
  auto w = worker(srv);
  auto ready = w->read_line(10s);
  REQUIRE(ready);
  REQUIRE(begins(*ready, "READY"));
  auto held = leader.create<float>("held", {4});
  REQUIRE(begins(w->ask("get held"), "OK"));
  const std::string key = "memcuda:session:" + leader.session_id();
  REQUIRE(type_of(admin, key) == "string");
  admin.command({"DEL", key});
  admin.command({"HSET", key, "oops", "1"});
  CHECK(test::eventually([&] { return type_of(admin, key) == "string"; }, 5s));
  CHECK(type_of(admin, "memcuda:quarantine:session:" + leader.session_id()) == "hash");
  std::this_thread::sleep_for(300ms);  // GC rounds: the session is alive, its reference stays
  CHECK(leader.info("held").refcount == 2);
  CHECK(held.valid());
}
