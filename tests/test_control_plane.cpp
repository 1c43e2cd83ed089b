// The allocator of record's control plane under injected faults
// (detail/base/fault.hpp): a command whose execution failed on the link to
// Redis is finished at once, never stranded until an election; a script
// status the client does not know is an InternalError, not a lost lease.
#include <catch2/catch.hpp>

#include <boost/json.hpp>

#include <optional>
#include <thread>

#include "memcuda/detail/base/fault.hpp"
#include "memcuda/memcuda.hpp"
#include "memcuda/redis/connection.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"
#include "support/timing.hpp"

using namespace memcuda;
using namespace std::chrono_literals;
namespace fault = memcuda::detail::fault;

namespace {

RegistryOptions cp_opts(const test::RedisServer& srv, bool control = true) {
  auto o = test::host_options(srv, control);
  o.lease_ttl = 1s;
  o.request_timeout = 3s;
  return o;
}

struct Disarm {
  std::string name;
  ~Disarm() { fault::disarm(name); }
};

}  // namespace

TEST_CASE("fault points fire the armed number of times", "[fault]") {
  Disarm d{"test.point"};
  CHECK_FALSE(MEMCUDA_FAULT("test.point"));
  fault::arm("test.point", 2);
  CHECK(fault::pending("test.point"));
  CHECK(MEMCUDA_FAULT("test.point"));
  CHECK(MEMCUDA_FAULT("test.point"));
  CHECK_FALSE(MEMCUDA_FAULT("test.point"));
  CHECK_FALSE(fault::pending("test.point"));
  fault::Registry r;
  r.parse("a=3,b");
  CHECK(r.left.at("a") == 3);
  CHECK(r.left.at("b") == 1);
}

// Defect: the command stayed in the leader's processing list until the
// next election; the client was told NotLeader after 2 x request_timeout.
TEST_CASE("a create whose execution lost the link to Redis is retried at once", "[redis][registry][fault]") {
  test::RedisServer srv;
  TensorRegistry leader(cp_opts(srv));
  auto fo = cp_opts(srv, false);
  fo.request_timeout = 60s;  // the defect's cost; far above a loaded machine's answer
  TensorRegistry follower(fo);
  REQUIRE(leader.is_leader());
  redis::Connection probe(srv.options());
  const std::string processing = "memcuda:processing:" + std::to_string(leader.leader().epoch);

  SECTION("before it ran") {
    Disarm d{"executor.execute"};
    fault::arm("executor.execute", 1);
    auto t0 = std::chrono::steady_clock::now();
    auto t = follower.create<float>("c1", {4});
    CHECK_FALSE(fault::pending("executor.execute"));  // the fault did fire
    MEMCUDA_CHECK_MS_BELOW(test::ms_since(t0), 20000);  // answered, not the client's 60 s request_timeout
    CHECK(t.generation() > 0);
    CHECK(leader.info("c1").refcount == 1);
  }
  SECTION("after it ran: the retry is a replay, not a second tensor or reference") {
    Disarm d{"executor.after_execute"};
    fault::arm("executor.after_execute", 1);
    auto t = follower.create<float>("c2", {4});
    CHECK_FALSE(fault::pending("executor.after_execute"));
    auto info = leader.info("c2");
    CHECK(info.generation == t.generation());
    CHECK(info.refcount == 1);
    CHECK(info.holders.size() == 1);
  }
  CHECK(leader.is_leader());
  // The leader replies, then takes the command off its processing list.
  test::eventually([&] { return probe.command({"LLEN", processing}).integer() == 0; }, 15s, 5ms);
  CHECK(probe.command({"LLEN", processing}).integer() == 0);
  CHECK(probe.command({"LLEN", "tensor_lifecycle"}).integer() == 0);
}

TEST_CASE("a get whose execution lost the link is answered, not replayed", "[redis][registry][fault]") {
  test::RedisServer srv;
  TensorRegistry leader(cp_opts(srv));
  auto t = leader.create<float>("g", {4});
  redis::Connection c(srv.options());
  Disarm d{"executor.execute"};
  fault::arm("executor.execute", 1);
  c.command({"LPUSH", "tensor_lifecycle",
             R"({"op":"get","name":"g","id":"j1","reply_to":"client:reply","pid":1})"});
  auto r = c.blocking(5s, {"BLPOP", "client:reply", "5"});
  REQUIRE_FALSE(r.is_nil());
  auto rep = boost::json::parse(r[1].str()).as_object();
  CHECK(rep.at("ok").as_bool() == false);
  CHECK(rep.at("error").as_object().at("code").as_string() == "unavailable");
  CHECK(leader.info("g").refcount == 1);  // not taken twice, not taken at all
  CHECK(leader.is_leader());
}

// Defect: any status but the known ones read as a lost lease, so the
// leader stepped down.
TEST_CASE("a script status the client does not know is an InternalError, not a lost lease",
          "[redis][registry][fault]") {
  test::RedisServer srv;
  auto o = cp_opts(srv);
  o.share_references = false;  // the get must run the script, not share the creator's handle
  TensorRegistry leader(o);
  REQUIRE(leader.is_leader());
  auto t = leader.create<float>("known", {4});
  {
    Disarm d{"script.unknown_status"};
    fault::arm("script.unknown_status", 1);
    CHECK_THROWS_AS(leader.get<float>("known"), InternalError);
  }
  CHECK(leader.is_leader());
  CHECK(leader.leader().is_self);
  auto u = leader.create<float>("after", {4});  // still serves directly
  CHECK(u.generation() > t.generation());
}

// Defect: a create whose script ran but whose reply was lost gave its block
// back to the pool while Redis held a ready record pointing at it; the next
// create got the same memory.
TEST_CASE("a create whose reply was lost keeps its block: the next create gets other memory",
          "[redis][registry][fault]") {
  test::RedisServer srv;
  TensorRegistry leader(cp_opts(srv));
  REQUIRE(leader.is_leader());
  Disarm d{"allocator.create_reply_lost"};
  auto same_memory = [](const TensorInfo& a, const TensorInfo& b) {
    return a.ipc_handle == b.ipc_handle && a.offset == b.offset;
  };
  SECTION("through the lifecycle list (the registry thread retries: a replay)") {
    TensorRegistry follower(cp_opts(srv, false));
    fault::arm("allocator.create_reply_lost", 1);
    auto a = follower.create<float>("lost_a", {4});
    CHECK_FALSE(fault::pending("allocator.create_reply_lost"));
    auto b = follower.create<float>("lost_b", {4});
    auto ia = leader.info("lost_a"), ib = leader.info("lost_b");
    CHECK(ia.generation == a.generation());
    CHECK(ia.refcount == 1);
    CHECK_FALSE(same_memory(ia, ib));
  }
  SECTION("the leader's direct create (retried through the list with the same create_id)") {
    fault::arm("allocator.create_reply_lost", 1);
    std::optional<SharedTensor<float>> a;
    try {
      a.emplace(leader.create<float>("lost_c", {4}));
    } catch (const ConnectionError&) {
      // before the fix: the error reached the caller, the record stayed
    }
    CHECK_FALSE(fault::pending("allocator.create_reply_lost"));
    auto b = leader.create<float>("lost_d", {4});
    auto ic = leader.info("lost_c"), id = leader.info("lost_d");
    CHECK_FALSE(same_memory(ic, id));
    REQUIRE(a);
    CHECK(ic.generation == a->generation());
    CHECK(ic.refcount == 1);
  }
}

// Defect: the process-wide release queue was constructed on first use, after
// a static registry, so it was destroyed first: the registry's final flush
// and a static SharedTensor's release touched a destroyed queue.
TEST_CASE("a program with a static registry and tensor exits cleanly", "[redis][registry][multiprocess]") {
  test::RedisServer srv;
  const std::string prog = test::sibling_program("memcuda_static_registry");
  for (int i = 0; i < 3; ++i) {
    ::setenv("MEMCUDA_REDIS_URL", srv.unix_url().c_str(), 1);
    test::Child child({prog});
    ::unsetenv("MEMCUDA_REDIS_URL");
    auto line = child.read_line(20s);
    int rc = child.wait();
    INFO("run " << i << ": exit " << rc);
    CHECK(line.value_or("") == "ok");
    CHECK(rc == 0);
  }
}

// Defect: a command whose BLMOVE ran in Redis but whose reply was lost sat
// in the leader's own processing list until the next election.
TEST_CASE("a command taken by a BLMOVE whose reply was lost is served at once", "[redis][registry][fault]") {
  test::RedisServer srv;
  TensorRegistry leader(cp_opts(srv));
  auto fo = cp_opts(srv, false);
  fo.request_timeout = 60s;  // the defect's cost; far above a loaded machine's answer
  TensorRegistry follower(fo);
  REQUIRE(leader.is_leader());
  Disarm d{"control.blmove_reply_lost"};
  fault::arm("control.blmove_reply_lost", 1);
  auto t0 = std::chrono::steady_clock::now();
  auto t = follower.create<float>("stranded", {4});
  CHECK_FALSE(fault::pending("control.blmove_reply_lost"));
  MEMCUDA_CHECK_MS_BELOW(test::ms_since(t0), 20000);  // not the client's 60 s request_timeout running out
  CHECK(leader.info("stranded").refcount == 1);
  // The leader replies first and takes the command off its processing list
  // right after: wait for that state (a stranded command would stay).
  redis::Connection probe(srv.options());
  const std::string processing = "memcuda:processing:" + std::to_string(leader.leader().epoch);
  CHECK(test::eventually([&] { return probe.command({"LLEN", processing}).integer() == 0; }, 15s, 5ms));
}

// Defect: a campaign that won the lease but whose requeue then threw left
// the lease set to our token; later campaigns saw {0, our token} and lost
// until it expired (and took a new epoch).
TEST_CASE("a lease won by a campaign whose requeue threw is still ours", "[redis][registry][fault]") {
  test::RedisServer srv;
  std::uint64_t first_epoch = 0;
  std::optional<TensorRegistry> a(std::in_place, cp_opts(srv));
  TensorRegistry b(cp_opts(srv));
  REQUIRE(a->is_leader());
  REQUIRE_FALSE(b.is_leader());
  first_epoch = a->leader().epoch;
  Disarm d{"lease.requeue"};
  fault::arm("lease.requeue", 1);
  a.reset();  // gives the lease back: b campaigns, wins, its requeue throws
  test::eventually([&] { return b.is_leader(); }, 15s, 5ms);
  CHECK_FALSE(fault::pending("lease.requeue"));
  REQUIRE(b.is_leader());
  CHECK(b.leader().epoch == first_epoch + 1);  // the epoch it won, not a later one after expiry
}
