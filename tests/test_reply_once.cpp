// Each command taken from the lifecycle list is answered at most once: the
// allocator of record replies and takes the command off its processing list
// in one script (kFinish), so neither its own retry after a lost link nor a
// successor re-queuing the list of a leader killed right after replying
// sends the reply again (docs/protocol.md, "Delivery").
#include <catch2/catch.hpp>

#include <boost/json.hpp>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "memcuda/detail/base/fault.hpp"
#include "memcuda/memcuda.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"

using namespace memcuda;
using namespace std::chrono_literals;
namespace fault = memcuda::detail::fault;

namespace {

// Pushes a command on `list` whose reply comes after every reply to what was
// pushed before it, then counts, by id, every reply on `list` up to it.
std::map<std::string, int> replies_until_sentinel(redis::Connection& c, const std::string& list) {
  c.command({"LPUSH", "tensor_lifecycle",
             R"({"op":"get","name":"no-such-tensor","id":"sentinel","reply_to":")" + list + R"("})"});
  std::map<std::string, int> seen;
  for (;;) {
    auto r = c.blocking(10s, {"BLPOP", list, "10"});
    REQUIRE_FALSE(r.is_nil());
    auto o = boost::json::parse(r[1].str()).as_object();
    const std::string id(o.at("id").as_string());
    if (id == "sentinel") return seen;
    ++seen[id];
  }
}

struct Disarm {
  std::string name;
  ~Disarm() { fault::disarm(name); }
};

}  // namespace

// Defect: the reply went out, the link dropped before the command left the
// processing list, and the retry replied a second time.
TEST_CASE("a reply whose finishing step lost the link is not sent again", "[redis][registry][fault]") {
  test::RedisServer srv;
  RegistryOptions o;
  o.redis = srv.options();
  o.default_backend = BackendKind::host;
  TensorRegistry leader(o);
  REQUIRE(leader.is_leader());
  auto t = leader.create<float>("g", {4});
  auto c = srv.connect();
  Disarm d{"control.after_reply"};
  fault::arm("control.after_reply", 1);
  c.command({"LPUSH", "tensor_lifecycle", R"({"op":"get","name":"g","id":"j1","reply_to":"client:r","pid":1})"});
  auto seen = replies_until_sentinel(c, "client:r");
  CHECK_FALSE(fault::pending("control.after_reply"));  // the fault did fire
  CHECK(seen["j1"] == 1);
  CHECK(leader.info("g").refcount == 2);  // executed once
  CHECK(c.command({"LLEN", "memcuda:processing:" + std::to_string(leader.leader().epoch)}).integer() == 0);
}

// Defect: the leader was killed after replying but before taking the
// command off its processing list; the successor re-queued and executed it
// again, and the client got a second reply.
TEST_CASE("a leader killed right after replying: its successor does not answer the command again",
          "[redis][multiprocess][fault]") {
  test::RedisServer srv;
  auto worker = [&](bool dies) {
    (void)fault::pending("");  // this process reads MEMCUDA_FAULTS before it is set for the child
    if (dies) ::setenv("MEMCUDA_FAULTS", "control.after_reply=die", 1);
    auto w = std::make_unique<test::Child>(std::vector<std::string>{
        test::sibling_program("memcuda_test_worker"), "--url", srv.unix_url(), "--ttl", "400", "--backend", "host"});
    ::unsetenv("MEMCUDA_FAULTS");
    auto l = w->read_line(10s);
    REQUIRE(l);
    INFO(*l);
    REQUIRE(l->rfind("READY", 0) == 0);
    return std::make_pair(std::move(w), l->find("leader=1") != std::string::npos);
  };
  auto [a, a_leads] = worker(true);
  REQUIRE(a_leads);
  auto [b, b_leads] = worker(false);
  REQUIRE_FALSE(b_leads);

  auto c = srv.connect();
  c.command({"LPUSH", "tensor_lifecycle",
             R"({"op":"create","name":"w","dtype":"f32","shape":[4],"backend":"host","id":"c1","reply_to":"r"})"});
  auto first = c.blocking(10s, {"BLPOP", "r", "10"});
  REQUIRE_FALSE(first.is_nil());
  CHECK(boost::json::parse(first[1].str()).at("ok").as_bool());
  CHECK(a->wait() == 128 + SIGKILL);  // died at the fault point, right after replying

  bool took_over = false;
  for (auto until = std::chrono::steady_clock::now() + 10s; !took_over && std::chrono::steady_clock::now() < until;)
    took_over = b->ask("leader") == "OK leader=1";
  REQUIRE(took_over);
  // The successor re-queued the dead leader's processing list when it took
  // the lease, so anything there is served before the sentinel.
  auto seen = replies_until_sentinel(c, "r");
  CHECK(seen["c1"] == 0);
  // w was made moments before its allocator of record died: its create was
  // answered only once the standby held its new allocation's fd
  // (docs/design.md, "What is lost when"), so the standby adopted it.
  const auto got = b->ask("get w");
  INFO(got);
  CHECK(got.rfind("OK", 0) == 0);
}
