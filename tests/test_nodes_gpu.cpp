// Device memory across fake nodes (support/fleet_proc.hpp), one GPU each
// where the host has several: a node's device tensor reaches another
// node's device through the source's staging ring and the UCX mover over
// TCP loopback (detail/registry/fleet/stager.hpp, staged_read.hpp). The
// stage messages' codec is checked everywhere; the rest needs a GPU, pods
// and UCX, and is reported skipped with the reason where one is missing.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "memcuda/protocol/stage.hpp"
#include "support/fleet_proc.hpp"
#include "support/gpu.hpp"
#include "support/pod.hpp"
#include "support/redis_server.hpp"
#include "support/skip.hpp"

using namespace memcuda;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

TEST_CASE("nodes: stage messages round-trip, and a malformed one is a typed protocol error", "[nodes][protocol]") {
  const protocol::StageRequest q{"w", 7, 16, 4096, "memcuda:reply:s:stage:1"};
  const auto m = protocol::decode_stage_message(protocol::encode_stage(q));
  REQUIRE(m.stage);
  CHECK_FALSE(m.unstage);
  CHECK((m.stage->name == "w" && m.stage->generation == 7 && m.stage->at == 16 && m.stage->bytes == 4096));
  CHECK(m.stage->reply_to == q.reply_to);
  const auto u = protocol::decode_stage_message(protocol::encode_unstage({3, 9}));
  REQUIRE(u.unstage);
  CHECK((u.unstage->slot == 3 && u.unstage->ticket == 9));
  const auto g = protocol::decode_grant(protocol::encode_grant({2, 5, 2 << 24, 10000}));
  CHECK((g.slot == 2 && g.ticket == 5 && g.offset == (2u << 24) && g.lease_ms == 10000));
  // A refusal is thrown as the class the stager threw.
  const auto refused = protocol::encode_reply(protocol::make_error_reply(nullptr, StaleHandle("moved on")));
  CHECK_THROWS_AS(protocol::decode_grant(refused), StaleHandle);
  for (const char* bad : {"not json", R"({"op":"stage","name":"w"})", R"({"op":"free","slot":1,"ticket":1})",
                          R"({"op":"unstage","slot":-1,"ticket":1})",
                          R"({"op":"stage","name":"w","generation":1,"at":0,"bytes":"16","reply_to":"r"})"}) {
    INFO(bad);
    CHECK_THROWS_AS(protocol::decode_stage_message(bad), ProtocolError);
  }
  CHECK_THROWS_AS(protocol::decode_grant(R"({"ok":true,"slot":1})"), ProtocolError);
}

#if MEMCUDA_HAS_UCX() && MEMCUDA_HAS_CUDA()

namespace {

// An ask sent by hand to a node's stager: its answer, "ok" or the error's code.
std::string stage_by_hand(redis::Connection& c, const std::string& node, const std::string& body) {
  c.command({"DEL", "memcuda:reply:t:stage:1"});
  c.command({"RPUSH", "memcuda:stage@" + node, body});
  auto r = c.blocking(2s, {"BLPOP", "memcuda:reply:t:stage:1", "2"});
  if (r.is_nil()) return "(no answer)";
  try {
    const auto g = protocol::decode_grant(r[1].str());
    c.command({"RPUSH", "memcuda:stage@" + node, protocol::encode_unstage({g.slot, g.ticket})});
    return "ok";
  } catch (const Error& e) {
    return e.code();
  }
}

std::string ask_body(const std::string& name, const std::string& gen, std::uint64_t at, std::uint64_t bytes,
                     const std::string& reply = "memcuda:reply:t:stage:1") {
  return R"({"op":"stage","name":")" + name + R"(","generation":)" + gen + R"(,"at":)" + std::to_string(at) +
         R"(,"bytes":)" + std::to_string(bytes) + R"(,"reply_to":")" + reply + R"("})";
}

}  // namespace

TEST_CASE("nodes: a device tensor reaches other nodes' GPUs through the staging rings: pulled once, copied again "
          "after a publish, served onward by a node that has it, and kept up against hostile stage messages",
          "[gpu][nodes][fleet][pods]") {
  MEMCUDA_REQUIRE_GPU();
  if (auto why = test::pods_unavailable()) MEMCUDA_SKIP(*why);
  test::RedisServer srv;
  test::PodVolume vol(srv);
  auto c = srv.connect();
  const int gpus = detail::device_count();
  auto on = [&](int i) { return std::vector<std::string>{"CUDA_VISIBLE_DEVICES=" + std::to_string(i % gpus)}; };
  const std::vector<std::string> cuda{"--backend", "cuda"};
  test::FleetProc a = test::fleet_proc("node-a", "node-a", srv, vol, on(0), cuda);
  test::FleetProc b = test::fleet_proc("node-b", "node-b", srv, vol, on(1), cuda);
  // 42 MB: three chunks of the ring's 16 MiB, the last one short.
  constexpr std::uint64_t kBytes = 10'500'000 * 4;
  const std::string one = std::to_string(kBytes), two = std::to_string(2 * kBytes);
  std::string got = a.ask("create w 10500000 7");
  REQUIRE_THAT(got, StartsWith("ok gen="));
  const std::string gen = got.substr(7);
  got = b.ask("get w 7");
  CHECK_THAT(got, Contains("name=.memcuda-rep/node-b/w pulls=1 pulled=" + one));
  CHECK(c.command({"HGET", "memcuda:tensor:.memcuda-rep/node-b/w", "backend"}).str() == "cuda");
  CHECK(c.command({"HGET", "memcuda:tensor:w", "replicas"}).str() == "node-b");
  CHECK(c.command({"HEXISTS", "memcuda:node:node-a", "stage"}).integer() == 1);
  // A publish in place at the source: the next get copies it again.
  REQUIRE_THAT(a.ask("rewrite w 9"), StartsWith("ok version="));
  CHECK_THAT(b.ask("get w 9"), Contains("pulls=2 pulled=" + two));

  // Hostile asks at node a's stager: each a typed refusal, or dropped.
  c.command({"LPUSH", "memcuda:stage@node-a", "not json"});
  CHECK(stage_by_hand(c, "node-a", ask_body("w", gen, 0, 4096)) == "ok");
  CHECK(stage_by_hand(c, "node-a", ask_body("w", "999999", 0, 16)) == "stale_handle");
  CHECK(stage_by_hand(c, "node-a", ask_body("w", gen, kBytes - 8, 16)) == "invalid_argument");
  CHECK(stage_by_hand(c, "node-a", ask_body("w", gen, 0, (16u << 20) + 1)) == "invalid_argument");
  CHECK(stage_by_hand(c, "node-a", ask_body("nosuch", "1", 0, 16)) == "not_found");
  CHECK(stage_by_hand(c, "node-a", ask_body("w", gen, 0, 16, "elsewhere")) == "(no answer)");
  CHECK(c.command({"EXISTS", "elsewhere"}).integer() == 0);
  // Its list replaced by a key of another type: deleted, and it serves on.
  c.command({"DEL", "memcuda:stage@node-a"});
  c.command({"SET", "memcuda:stage@node-a", "junk"});
  std::string type = "string";
  for (int i = 0; i < 50 && type == "string"; ++i) {
    std::this_thread::sleep_for(100ms);
    type = std::string(c.command({"TYPE", "memcuda:stage@node-a"}).str());
  }
  CHECK(type == "none");

  // A third node reads it from node b or node a.
  test::FleetProc d = test::fleet_proc("node-c", "node-c", srv, vol, on(0), cuda);
  CHECK_THAT(d.ask("get w 9"), Contains("name=.memcuda-rep/node-c/w pulls=1 pulled=" + one));
  // A model version of device tensors on node a reaches nodes b and c, a
  // pinned reader on each; version 2 is read where a reader advances.
  REQUIRE(a.ask("publish m/ 3 1000000 10") == "ok version=1");
  CHECK_THAT(b.ask("open m/ 10"), StartsWith("ok version=1 tensors=3 "));
  CHECK_THAT(d.ask("open m/ 10"), StartsWith("ok version=1 tensors=3 "));
  REQUIRE(a.ask("publish m/ 3 1000000 20") == "ok version=2");
  CHECK_THAT(b.ask("check m/ 10"), StartsWith("ok version=1 "));
  CHECK_THAT(d.ask("advance m/ 20"), StartsWith("ok moved=1 version=2 "));
  CHECK_THAT(b.ask("check m/ 10"), StartsWith("ok version=1 "));
  // A PyTorch module on a Python node attaches to it (A/B), on its GPU,
  // and moves to version 3 published meanwhile.
  const auto no_torch = test::python_node_unavailable("numpy, torch");
  if (!no_torch) {
    test::FleetProc py = test::python_fleet_proc("node-p", srv, vol, on(1), "numpy, torch");
    CHECK(py.ask("attach m/ 20 3 1000000") == "ok version=2 device=cuda");
    REQUIRE(a.ask("publish m/ 3 1000000 30") == "ok version=3");
    CHECK(py.ask("attach-advance m/ 30") == "ok moved=1 version=3");
  }
  // With node a gone, a fourth node gets w from the nodes that have it.
  a.proc->kill();
  a.proc->wait();
  test::FleetProc e = test::fleet_proc("node-e", "node-e", srv, vol, on(1), cuda);
  CHECK_THAT(e.ask("get w 9"), Contains("name=.memcuda-rep/node-e/w pulls=1 pulled=" + one));
  CHECK_THAT(b.ask("get w 9"), StartsWith("ok "));
  if (no_torch) MEMCUDA_SKIP("the PyTorch node's steps did not run: " << *no_torch);
}

#else

TEST_CASE("nodes: a device tensor reaches other nodes' GPUs through the staging rings: pulled once, copied again "
          "after a publish, served onward by a node that has it, and kept up against hostile stage messages",
          "[gpu][nodes][fleet][pods]") {
  MEMCUDA_SKIP("built without UCX or without CUDA");
}

#endif
