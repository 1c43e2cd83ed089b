// State-dict records (detail/store/dict_scripts.hpp): a persistent
// publish_state_dict links one, open_state_dict then takes ONE reference of
// the process for the whole dict; anything that changes what get_prefix
// would answer unlinks it; a dead holder's reference and an unheld record's
// pins are collected. Real redis-server, real worker processes, host
// backend.
#include <catch2/catch.hpp>

#include <chrono>
#include <numeric>
#include <thread>

#include "memcuda/memcuda.hpp"
#include "memcuda/protocol/dict_blob.hpp"
#include "memcuda/redis/connection.hpp"
#include "memcuda/state_dict.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

RegistryOptions opts(const test::RedisServer& srv, bool control = true) {
  auto o = test::host_options(srv, control);
  o.session_ttl = 600ms;
  o.gc_interval = 100ms;
  return o;
}

std::vector<StateDictEntry> three(std::vector<float>& a) {
  a.resize(16);
  std::iota(a.begin(), a.end(), 1.0f);
  return {{"w", DType::f32, {4, 4}, a.data()}, {"b", DType::f32, {16}, a.data()}, {"n", DType::u8, {2}, nullptr}};
}

StateDict publish(TensorRegistry& reg, const std::string& prefix, std::vector<float>& data, bool persistent = true) {
  PublishOptions po;
  po.create.persistent = persistent;
  return publish_state_dict(reg, prefix, three(data), po);
}

// The id linked at a prefix, or "" (raw Redis: what the scripts keep).
std::string linked_id(redis::Connection& c, const std::string& prefix) {
  auto r = c.command({"GET", "memcuda:dictlink:" + prefix});
  return r.is_nil() ? std::string() : std::string(r.str());
}

std::int64_t record_refcount(redis::Connection& c, const std::string& id) {
  auto r = c.command({"HGET", "memcuda:dict:" + id, "refcount"});
  return r.is_nil() ? -1 : std::stoll(std::string(r.str()));
}

bool eventually(const std::function<bool()>& f, std::chrono::milliseconds within = 5s) {
  const auto end = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return f();
}

// A redis-server, a raw connection to it, the allocator of record and a
// consumer registry, and the data a published dict is filled from.
struct World {
  test::RedisServer srv;
  redis::Connection c{srv.options()};
  TensorRegistry leader{opts(srv)};
  TensorRegistry consumer{opts(srv, false)};
  std::vector<float> data;
};

}  // namespace

TEST_CASE("state dict record: one reference for the whole dict, members' refcounts unmoved", "[redis][state_dict]") {
  World w;
  auto& [srv, c, leader, consumer, data] = w;
  publish(leader, "m/", data).clear();
  leader.flush();
  const std::string id = linked_id(c, "m/");
  REQUIRE(!id.empty());
  CHECK(leader.info("m/w").refcount == 2);  // its name, and the record's pin
  CHECK(record_refcount(c, id) == 0);

  {
    auto sd = open_state_dict(consumer, "m/");
    REQUIRE(sd.size() == 3);
    std::vector<float> w(16);
    SharedTensor<float>(sd.at("w").handle()).copy_to_host(w);
    CHECK(w == data);
    CHECK(sd.at("n").bytes() == 2);
    CHECK(record_refcount(c, id) == 1);
    CHECK(leader.info("m/w").refcount == 2);  // no reference per tensor
    auto again = open_state_dict(consumer, "m/");
    CHECK(record_refcount(c, id) == 2);  // each open is one reference
    auto keep = sd.at("b");
    sd.clear();
    again.clear();
    consumer.flush();
    CHECK(record_refcount(c, id) == 1);  // a handle of the first open still holds it
    keep = {};
    consumer.flush();
    CHECK(record_refcount(c, id) == 0);
  }
  // A non-persistent dict gets no record (it would outlive its handles).
  auto tmp = publish(leader, "t/", data, false);
  CHECK(linked_id(c, "t/").empty());
}

TEST_CASE("state dict record: a remove, a create under the prefix or a publish unlinks it", "[redis][state_dict]") {
  World w;
  auto& [srv, c, leader, consumer, data] = w;

  SECTION("a create under the prefix: get_prefix would name it, so the record no longer says the dict") {
    publish(leader, "m/", data).clear();
    REQUIRE(!linked_id(c, "m/").empty());
    auto held = open_state_dict(consumer, "m/");  // keeps the record (and its pins) past the unlink
    CreateOptions co;
    co.persistent = true;
    (void)leader.create<float>("m/extra", {2}, co);
    CHECK(linked_id(c, "m/").empty());
    auto sd = open_state_dict(consumer, "m/");
    CHECK(sd.size() == 4);  // per name: the new one included
    consumer.flush();
    CHECK(leader.info("m/w").refcount == 3);  // name, the held record's pin, this open's
  }
  SECTION("a remove: held opens stay valid, a new open goes per name, GC drops the pins once unheld") {
    publish(leader, "m/", data).clear();
    const std::string id = linked_id(c, "m/");
    auto held = open_state_dict(consumer, "m/");
    leader.remove("m/b");
    CHECK(linked_id(c, "m/").empty());
    CHECK(record_refcount(c, id) == 1);  // unlinked, still held
    std::vector<float> b(16);
    SharedTensor<float>(held.at("b").handle()).copy_to_host(b);  // still mapped and registered
    CHECK(b == data);
    CHECK(open_state_dict(consumer, "m/").size() == 2);
    held.clear();
    consumer.flush();
    CHECK(record_refcount(c, id) == -1);  // the last reference deleted the unlinked record
    (void)leader.collect_garbage();
    CHECK(leader.info("m/w").refcount == 1);  // pin dropped
    CHECK_THROWS_AS(leader.info("m/b"), NotFound);
  }
  SECTION("a published event on a member: the record carries the events of its link time only") {
    auto pub = publish(leader, "m/", data);
    REQUIRE(!linked_id(c, "m/").empty());
    (void)pub.at("w").publish(nullptr);
    CHECK(linked_id(c, "m/").empty());
  }
  SECTION("publishing the dict again links a new record; the old one goes with its holders") {
    publish(leader, "m/", data).clear();
    const std::string old = linked_id(c, "m/");
    auto held = open_state_dict(consumer, "m/");
    (void)leader.remove_prefix("m/");
    publish(leader, "m/", data).clear();
    const std::string now = linked_id(c, "m/");
    CHECK(!now.empty());
    CHECK(now != old);
    CHECK(record_refcount(c, old) == 1);
    held.clear();
    consumer.flush();
    CHECK(record_refcount(c, old) == -1);
  }
}

TEST_CASE("state dict record: refused when the members are not every name under the prefix", "[redis][state_dict]") {
  test::RedisServer srv;
  redis::Connection c(srv.options());
  TensorRegistry leader(opts(srv));
  std::vector<float> data;
  auto pub = publish(leader, "m/", data);
  std::vector<SharedTensor<void>> two{pub.at("w"), pub.at("b")};
  CHECK_FALSE(link_state_dict(leader, "m/", two));
  std::vector<SharedTensor<void>> all{pub.at("w"), pub.at("b"), pub.at("n")};
  CHECK(link_state_dict(leader, "m/", all));
  CHECK_FALSE(link_state_dict(leader, "x/", all));  // not under that prefix
  CHECK_THROWS_AS(link_state_dict(leader, "m/", {SharedTensor<void>()}), InvalidArgument);
  std::vector<SharedTensor<void>> twice{pub.at("w"), pub.at("w"), pub.at("b")};  // as many as the names, one twice
  CHECK_THROWS_AS(link_state_dict(leader, "m/", twice), InvalidArgument);
}

TEST_CASE("state dict record: a killed holder's reference is collected, then the memory goes", "[redis][state_dict][multiprocess]") {
  test::RedisServer srv;
  redis::Connection c(srv.options());
  TensorRegistry leader(opts(srv));
  std::vector<float> data;
  publish(leader, "m/", data).clear();
  const std::string id = linked_id(c, "m/");
  test::Child w({test::sibling_program("memcuda_test_worker"), "--url", srv.unix_url(), "--no-control",
                 "--session-ttl", "600", "--backend", "host"});
  REQUIRE(w.read_line(10s).value_or("").rfind("READY", 0) == 0);
  const std::string r = w.ask("opensd m/");
  INFO(r);
  REQUIRE(r.rfind("OK count=3", 0) == 0);
  CHECK(r.find("sum=") != std::string::npos);
  CHECK(record_refcount(c, id) == 1);
  (void)leader.remove_prefix("m/");  // unlinked; the killed holder's reference alone keeps it
  CHECK(record_refcount(c, id) == 1);
  w.kill();
  w.wait();
  CHECK(eventually([&] { return record_refcount(c, id) == -1; }));  // GC dropped it, the record went
  CHECK(eventually([&] { return c.command({"KEYS", "memcuda:removed:*"}).size() == 0; }));  // then the pins
}

TEST_CASE("state dict record: the blob parser takes the canonical form only", "[protocol][state_dict]") {
  using protocol::DictBlobEntry;
  const std::vector<DictBlobEntry> two{{"m/a", "M1desc", "17", "3", "", ""}, {"m/b", "", "18", "3", "h", "2"}};
  const std::string blob = protocol::encode_dict_blob(two);
  CHECK(blob == "3:m/a6:M1desc2:171:30:0:3:m/b0:2:181:31:h1:2");
  CHECK(protocol::parse_dict_blob(blob) == two);
  CHECK(protocol::parse_dict_blob("").empty());
  for (const std::string bad : {blob.substr(0, blob.size() - 1), std::string("03:m/a") + blob.substr(5),
                                std::string("3:m/a"), std::string("x:"), std::string(":"),
                                std::string("99999999999:x"), blob + "1:z"}) {
    INFO(bad);
    CHECK_THROWS_AS(protocol::parse_dict_blob(bad), ProtocolError);
  }
}

// Redis restarts empty while a process holds a dict through its record: the
// record is gone, so the holder's recovery registers one reference per
// member instead (DictRef::per_name), and its handles then release them one
// by one: nothing is freed under it, nothing leaks after.
TEST_CASE("state dict record: after Redis lost its data a holder re-registers per member", "[redis][state_dict][multiprocess]") {
  test::RedisServer srv;
  TensorRegistry leader(opts(srv));
  std::vector<float> data;
  publish(leader, "m/", data).clear();
  test::Child w({test::sibling_program("memcuda_test_worker"), "--url", srv.unix_url(), "--no-control",
                 "--session-ttl", "600", "--backend", "host"});
  REQUIRE(w.read_line(10s).value_or("").rfind("READY", 0) == 0);
  REQUIRE(w.ask("opensd m/").rfind("OK count=3", 0) == 0);

  srv.kill(SIGKILL);
  srv.start();
  auto c = srv.connect();
  auto refcount = [&](const std::string& name) {
    auto r = c.command({"HGET", "memcuda:tensor:" + name, "refcount"});
    return r.is_nil() ? -1 : std::stoll(std::string(r.str()));
  };
  // republished by the leader (its name's reference), re-registered by the holder
  CHECK(eventually([&] { return refcount("m/w") == 2 && refcount("m/b") == 2 && refcount("m/n") == 2; }, 15s));
  CHECK(linked_id(c, "m/").empty());  // the record went with the data

  (void)leader.remove_prefix("m/");
  CHECK(w.ask("closesd m/") == "OK");  // per-member releases
  CHECK(eventually([&] { return c.command({"KEYS", "memcuda:removed:*"}).size() == 0; }));
  CHECK(c.command({"ZCARD", "memcuda:names"}).integer() == 0);
  CHECK(w.ask("exit") == "OK");
}
