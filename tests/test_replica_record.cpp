// The replica scripts (detail/store/replica_scripts.hpp) on records of a
// real registry: a source tensor and, under the reserved replica name, a
// record standing for its copy on one device, whose replica fields are set
// as the allocator of record sets them. Real redis-server, host backend.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>

#include "memcuda/detail/store/replica_scripts.hpp"
#include "memcuda/detail/store/scripts.hpp"
#include "memcuda/memcuda.hpp"
#include "memcuda/redis/connection.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"
#include "support/timing.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

constexpr const char* kUuid = "GPU-00000000-1111-2222-3333-444444444444";

struct World {
  test::RedisServer srv;
  redis::Connection c{srv.options()};
  TensorRegistry leader{test::host_options(srv, true)};
  detail::Keys k;
  std::string node(const std::string& name) {
    auto r = c.command({"HGET", k.tensor(name), "node"});
    return r.is_nil() ? std::string("nowhere") : std::string(r.str());
  }
  std::string token() { return std::string(c.command({"GET", "memcuda:leader"}).str()); }
  std::string field(const std::string& name, const char* f) {
    auto r = c.command({"HGET", k.tensor(name), f});
    return r.is_nil() ? std::string("nil") : std::string(r.str());
  }
  // A persistent record at the replica name, marked as a copy of `src`'s
  // generation `gen` (what create many writes for the allocator of record).
  SharedTensor<float> replica_record(const std::string& src, std::uint64_t gen, std::int64_t idle_ms = 0) {
    CreateOptions o;
    o.persistent = true;
    auto r = leader.create<float>(detail::replica_name(kUuid, src), {16}, o);
    c.command({"HSET", k.tensor(r.name()), "replica_of", src, "source_generation", std::to_string(gen), "idle_ms",
               std::to_string(idle_ms)});
    return r;
  }
  detail::store::Answer local(const std::string& src, bool wait, const std::string& holder = "reader-1",
                              const std::string& gen = {}, const std::string& ver = {}) {
    return detail::store::acquire_local(c, k, src, kUuid, holder, "", node(src), "", wait, gen, ver);
  }
  detail::store::Answer ready(const std::string& src, std::uint64_t gen, std::uint64_t ver) {
    std::uint64_t rgen = 0;  // the replica's own generation, as the allocator of record knows it
    try {
      const auto g = field(detail::replica_name(kUuid, src), "generation");
      if (!g.empty() && g[0] >= '0' && g[0] <= '9') rgen = std::stoull(g);
    } catch (const ReplyError&) {  // a key of another type
    }
    return detail::store::replica_ready(c, k, token(), src, gen, ver, {{kUuid, std::string(64, 'e'), "peer", rgen}});
  }
};

CreateOptions persistent() {
  CreateOptions o;
  o.persistent = true;
  return o;
}

}  // namespace

TEST_CASE("acquire local: the source when there is no replica, nothing taken while one is copied",
          "[redis][replica]") {
  World w;
  auto src = w.leader.create<float>("m/w", {16}, persistent());
  const auto gen = src.generation();
  auto a = w.local("m/w", true);
  CHECK(a.status == "noreplica");
  CHECK(w.field("m/w", "refcount") == "3");  // name, the handle, the reader
  CHECK(w.field("m/w", "holder:reader-1") == "1");

  auto rep = w.replica_record("m/w", gen);
  const std::string rname = rep.name();
  // not copied yet: a waiting reader takes nothing, another takes the source
  CHECK(w.local("m/w", true).status == "copying");
  CHECK(w.field("m/w", "refcount") == "3");
  CHECK(w.field(rname, "refcount") == "2");
  CHECK(w.local("m/w", false).status == "noreplica");
  CHECK(w.field("m/w", "holder:reader-1") == "2");
}

// A replicate marks all its sources in one call: the first by itself, the
// others pipelined; each answer is its own source's, in order, also after
// the server's script cache was flushed.
TEST_CASE("replica ready of many sources: one answer per source, in order, after a SCRIPT FLUSH too",
          "[redis][replica]") {
  World w;
  std::vector<SharedTensor<float>> srcs, reps;
  for (int i = 0; i < 4; ++i) {
    srcs.push_back(w.leader.create<float>("m/w" + std::to_string(i), {16}, persistent()));
    reps.push_back(w.replica_record(srcs.back().name(), srcs.back().generation()));
  }
  w.c.command({"SCRIPT", "FLUSH"});
  std::vector<std::vector<detail::store::ReplicaMark>> marks;
  for (const auto& r : reps) marks.push_back({{kUuid, std::string(64, 'e'), "peer", r.generation()}});
  std::vector<std::string> names;
  for (const auto& t : srcs) names.push_back(t.name());
  std::vector<detail::store::ReadySource> ready;
  for (std::size_t i = 0; i < srcs.size(); ++i)
    ready.push_back({names[i], srcs[i].generation() + (i == 2 ? 1 : 0), 0, &marks[i]});  // the third: stale
  const auto answers = detail::store::replica_ready(w.c, w.k, w.token(), ready);
  REQUIRE(answers.size() == 4);
  for (std::size_t i = 0; i < answers.size(); ++i) {
    INFO("source " << i);
    CHECK(answers[i].status == (i == 2 ? "stale" : "ok"));
    CHECK(w.field(reps[i].name(), "copied_version") == (i == 2 ? "nil" : "0"));
  }
  CHECK(detail::store::replica_ready(w.c, w.k, w.token(), {}).empty());
}

TEST_CASE("replica ready: marks the copy, wakes its waiters, and a local get takes the replica",
          "[redis][replica]") {
  World w;
  auto src = w.leader.create<float>("m/w", {16}, persistent());
  auto rep = w.replica_record("m/w", src.generation());
  const std::string rname = rep.name();
  w.c.command({"SADD", w.k.waiters(rname), "memcuda:wake:test"});

  CHECK(w.ready("m/w", src.generation() + 1, 0).status == "stale");  // another generation
  CHECK(w.ready("m/w", src.generation(), 3).status == "stale");      // another event version
  CHECK(detail::store::replica_ready(w.c, w.k, "not-the-leader", "m/w", src.generation(), 0, {}).status ==
        "notleader");
  CHECK(w.field(rname, "copied_version") == "nil");
  // a mark for another record of that name (made by another call) marks nothing
  auto other = detail::store::replica_ready(w.c, w.k, w.token(), "m/w", src.generation(), 0,
                                            {{kUuid, std::string(64, 'o'), "peer", rep.generation() + 1}});
  REQUIRE(other.status == "ok");
  CHECK(other[1].integer() == 0);
  CHECK(w.field(rname, "copied_version") == "nil");

  auto ok = w.ready("m/w", src.generation(), 0);
  REQUIRE(ok.status == "ok");
  CHECK(w.field(rname, "copied_version") == "0");
  CHECK(w.field(rname, "replica_path") == "peer");
  CHECK(w.field(rname, "event_version") == "1");
  CHECK(w.field("m/w", "replicas") == kUuid);
  CHECK(w.c.command({"LLEN", "memcuda:wake:test"}).integer() == 1);

  auto a = w.local("m/w", true);
  REQUIRE(a.status == "replica");
  CHECK(w.field(rname, "holder:reader-1") == "1");
  CHECK(w.field("m/w", "holder:reader-1") == "nil");  // the source is not held
  CHECK(w.c.command({"SISMEMBER", "memcuda:refs:reader-1", std::to_string(rep.generation()) + ":" + rname}).integer() == 1);
  // a cached replica of the same generation and event version: 'same'
  CHECK(w.local("m/w", true, "reader-1", std::to_string(rep.generation()), "1").status == "same");
  CHECK(w.field(rname, "holder:reader-1") == "2");
  // a second mark does not list the device twice
  REQUIRE(w.ready("m/w", src.generation(), 0).status == "ok");
  CHECK(w.field("m/w", "replicas") == kUuid);
}

TEST_CASE("a publish at the source makes its replica stale until the copy catches up", "[redis][replica]") {
  World w;
  auto src = w.leader.create<float>("m/w", {16}, persistent());
  auto rep = w.replica_record("m/w", src.generation());
  REQUIRE(w.ready("m/w", src.generation(), 0).status == "ok");
  REQUIRE(w.local("m/w", true).status == "replica");
  // an in-place publish: the source's event version moves on
  REQUIRE(detail::store::publish_event(w.c, w.k, "m/w", src.generation(), std::string(64, 'p')) == 1);
  CHECK(w.local("m/w", true).status == "copying");
  CHECK(w.local("m/w", false).status == "noreplica");
  REQUIRE(w.ready("m/w", src.generation(), 1).status == "ok");
  CHECK(w.local("m/w", true).status == "replica");
}

// What a publish of a tensor with replicas asks of the allocator of record:
// a "refresh" replicate of that tensor to the devices its record lists.
// No registry runs here, so the command stays on the list to be read.
TEST_CASE("a publish of a replicated tensor asks for a refresh in place on the lifecycle list", "[redis][replica]") {
  test::RedisServer srv;
  redis::Connection c{srv.options()};
  detail::Keys k;
  const std::string other = "GPU-99999999-1111-2222-3333-444444444444";
  const std::string name = "m/w:0.b-1_";
  c.command({"HSET", k.tensor(name), "name", name, "generation", "42"});
  REQUIRE(detail::store::publish_event(c, k, name, 42, std::string(64, 'p')) == 1);
  CHECK(c.command({"LLEN", k.lifecycle()}).integer() == 0);  // no replicas: nothing to refresh
  c.command({"HSET", k.tensor(name), "replicas", std::string(kUuid) + " " + other});
  REQUIRE(detail::store::publish_event(c, k, name, 42, std::string(64, 'q')) == 2);
  REQUIRE(c.command({"LLEN", k.lifecycle()}).integer() == 1);
  const auto cmd = protocol::decode_command(c.command({"RPOP", k.lifecycle()}).str());
  CHECK(cmd.op == protocol::Op::replicate);
  CHECK(cmd.name == name);
  CHECK(cmd.replicate_refresh);
  CHECK_FALSE(cmd.replicate_prefix);
  CHECK(cmd.devices == std::vector<std::string>{kUuid, other});
  CHECK(detail::store::publish_event(c, k, name, 41, std::string(64, 'r')) == -1);  // another generation
  CHECK(c.command({"LLEN", k.lifecycle()}).integer() == 0);
}

// A `replicas` field another client wrote badly (a device listed twice, a
// token that is no UUID, a device for a host tensor) makes the publish push
// a refresh the allocator of record refuses: the publish itself succeeds,
// the command leaves the list, and the allocator of record serves on.
TEST_CASE("a publish whose replicas field is garbage still publishes, and the allocator of record serves on",
          "[redis][replica]") {
  World w;
  TensorRegistry other{test::host_options(w.srv, false)};  // its creates go through the lifecycle list
  auto src = w.leader.create<float>("m/w", {16}, persistent());
  int n = 0;
  for (const std::string bad : {std::string(kUuid) + " " + kUuid, std::string("not a uuid!"), std::string(kUuid)}) {
    INFO(bad);
    w.c.command({"HSET", w.k.tensor("m/w"), "replicas", bad});
    const auto before = std::stoull(w.field("m/w", "event_version") == "nil" ? "0" : w.field("m/w", "event_version"));
    CHECK(detail::store::publish_event(w.c, w.k, "m/w", src.generation(), std::string(64, 'p')) == before + 1);
    CHECK(test::eventually([&] { return w.c.command({"LLEN", w.k.lifecycle()}).integer() == 0; }, 10s));
    // served by the allocator of record's control thread
    auto more = other.create<float>("m/after" + std::to_string(++n), {4});
    CHECK(more.generation() > src.generation());
  }
}

TEST_CASE("acquire local: a replica of another source generation, a broken one, or one of the wrong type is "
          "not used, the source's refusals are a get's",
          "[redis][replica]") {
  World w;
  CHECK(w.local("nope", true).status == "notfound");
  auto src = w.leader.create<float>("m/w", {16}, persistent());
  const std::string rname = detail::replica_name(kUuid, "m/w");
  SECTION("another generation") {
    auto rep = w.replica_record("m/w", src.generation() + 7);
    w.c.command({"HSET", w.k.tensor(rname), "copied_version", "0"});
    CHECK(w.local("m/w", true).status == "noreplica");
  }
  SECTION("a generation that does not parse") {
    auto rep = w.replica_record("m/w", src.generation());
    REQUIRE(w.ready("m/w", src.generation(), 0).status == "ok");
    w.c.command({"HSET", w.k.tensor(rname), "generation", "x"});
    CHECK(w.local("m/w", true).status == "noreplica");
  }
  SECTION("a string at the replica's key") {
    w.c.command({"SET", w.k.tensor(rname), "junk"});
    CHECK(w.local("m/w", true).status == "noreplica");
    CHECK(w.ready("m/w", src.generation(), 0).status == "ok");  // marks nothing, fails nothing
    CHECK(w.c.command({"TYPE", w.k.tensor(rname)}).str() == "string");
  }
  SECTION("the source's dtype") {
    CHECK(detail::store::acquire_local(w.c, w.k, "m/w", kUuid, "r", "u8", w.node("m/w"), "", true).status ==
          "dtype");
  }
}

TEST_CASE("the replica sweep: a replica goes with its source, or after its idle time unused", "[redis][replica]") {
  World w;
  auto src = w.leader.create<float>("m/w", {16}, persistent());
  const auto gen = src.generation();
  const std::string rname = detail::replica_name(kUuid, "m/w");
  auto sweep = [&](std::int64_t now) {
    return detail::store::replica_sweep(w.c, w.k, w.token(), w.leader.session_id(), {{rname, "m/w"}}, now);
  };
  SECTION("idle") {
    w.replica_record("m/w", gen, 200).release();
    REQUIRE(test::eventually([&] { return w.field(rname, "refcount") == "1"; }, 5s));  // held by its name only
    REQUIRE(sweep(1000).status == "ok");
    CHECK(w.field(rname, "idle_since") == "1000");
    REQUIRE(sweep(1100).status == "ok");
    CHECK(w.field(rname, "state") == "ready");
    // a reader stops the clock
    w.c.command({"HINCRBY", w.k.tensor(rname), "refcount", 1});
    REQUIRE(sweep(5000).status == "ok");
    CHECK(w.field(rname, "idle_since") == "nil");
    w.c.command({"HINCRBY", w.k.tensor(rname), "refcount", -1});
    REQUIRE(sweep(6000).status == "ok");
    auto r = sweep(6300);
    REQUIRE(r.status == "ok");
    CHECK(w.field(rname, "state") == "nil");
    CHECK(w.c.command({"ZSCORE", "memcuda:names", rname}).is_nil());
  }
  SECTION("kept while its source lives, without an idle time") {
    w.replica_record("m/w", gen).release();
    REQUIRE(sweep(1000).status == "ok");
    REQUIRE(sweep(1000000).status == "ok");
    CHECK(w.field(rname, "state") == "ready");
    CHECK(w.field(rname, "idle_since") == "nil");
  }
  SECTION("the source removed") {
    w.replica_record("m/w", gen).release();
    src.release();
    w.leader.remove("m/w");
    REQUIRE(sweep(1000).status == "ok");
    CHECK(w.field(rname, "state") == "nil");
  }
  SECTION("the source of another generation") {
    w.replica_record("m/w", gen + 1).release();
    REQUIRE(sweep(1000).status == "ok");
    CHECK(w.field(rname, "state") == "nil");
  }
  SECTION("a held replica goes from its name, its memory with its reader") {
    auto held = w.replica_record("m/w", gen + 1);
    REQUIRE(sweep(1000).status == "ok");
    CHECK(w.field(rname, "state") == "nil");
    CHECK(w.c.command({"EXISTS", w.k.removed(held.generation())}).integer() == 1);
  }
  CHECK(sweep(1).status == "ok");  // nothing left to do, or a replica that is not: no error
  CHECK(detail::store::replica_sweep(w.c, w.k, "not-the-leader", "s", {{rname, "m/w"}}, 1).status == "notleader");
}
