// Replicas, the parts that run without a GPU: the replicate command's codec,
// the replica fields of a record, and the allocator of record's refusals
// (a JSON replicate on the lifecycle list, answered by a real registry).
// The copies themselves are in test_gpu_replicas.cpp.
#include <catch2/catch.hpp>

#include <string>

#include "memcuda/memcuda.hpp"
#include "memcuda/protocol.hpp"
#include "memcuda/protocol/record_desc.hpp"
#include "memcuda/redis/connection.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"

using namespace memcuda;
using namespace std::chrono_literals;
namespace p = memcuda::protocol;

namespace {

std::string errc_of(const std::string& json) {
  try {
    (void)p::decode_command(json);
    return "no error";
  } catch (const ProtocolError& e) {
    return std::string(to_string(e.errc())) + ": " + e.what();
  }
}

constexpr const char* kUuid = "GPU-00000000-1111-2222-3333-444444444444";

}  // namespace

TEST_CASE("the replicate command round-trips and refuses bad devices, prefix and idle time", "[protocol][replica]") {
  p::Command c;
  c.op = p::Op::replicate;
  c.name = "llm/";
  c.devices = {kUuid, "GPU-2"};
  c.replicate_prefix = true;
  c.idle_ms = 250;
  c.id = "r1";
  const std::string text = p::encode_command(c);
  CHECK(text.find(R"("op":"replicate")") != std::string::npos);
  CHECK(p::decode_command(text) == c);
  c.replicate_prefix = false;
  c.idle_ms.reset();
  CHECK(p::encode_command(c).find("prefix") == std::string::npos);
  CHECK(p::encode_command(c).find("refresh") == std::string::npos);
  CHECK(p::decode_command(p::encode_command(c)) == c);
  c.replicate_refresh = true;  // a publish's: refresh what is there, make nothing
  CHECK(p::encode_command(c).find(R"("refresh":true)") != std::string::npos);
  CHECK(p::decode_command(p::encode_command(c)) == c);

  CHECK_THAT(errc_of(R"({"op":"replicate","name":"a"})"), Catch::StartsWith("missing_field"));
  CHECK_THAT(errc_of(R"({"op":"replicate","name":"a","devices":[]})"), Catch::StartsWith("bad_value"));
  CHECK_THAT(errc_of(R"({"op":"replicate","name":"a","devices":"GPU-1"})"), Catch::StartsWith("wrong_type"));
  CHECK_THAT(errc_of(R"({"op":"replicate","name":"a","devices":[1]})"), Catch::StartsWith("wrong_type"));
  CHECK_THAT(errc_of(R"({"op":"replicate","name":"a","devices":["GPU-1","GPU-1"]})"),
             Catch::Contains("appears twice"));
  CHECK_THAT(errc_of(R"({"op":"replicate","name":"a","devices":["GPU 1"]})"), Catch::StartsWith("bad_value"));
  CHECK_THAT(errc_of(R"({"op":"replicate","name":"a","devices":["G"],"prefix":1})"), Catch::StartsWith("wrong_type"));
  CHECK_THAT(errc_of(R"({"op":"replicate","name":"a","devices":["G"],"idle_ms":-1})"), Catch::StartsWith("bad_value"));
  CHECK_THAT(errc_of(R"({"op":"replicate","name":"a","devices":["G"],"refresh":"yes"})"),
             Catch::StartsWith("wrong_type"));
  CHECK_THAT(errc_of(R"({"op":"replicate","devices":["G"]})"), Catch::StartsWith("missing_field"));
  std::string many = R"({"op":"replicate","name":"a","devices":[)";
  for (std::size_t i = 0; i <= p::kMaxReplicaDevices; ++i) many += (i ? ",\"G" : "\"G") + std::to_string(i) + "\"";
  CHECK_THAT(errc_of(many + "]}"), Catch::StartsWith("bad_value"));
}

TEST_CASE("a record's replica fields round-trip, bad ones are bad_record, the changing ones stay out of its desc",
          "[protocol][replica]") {
  TensorInfo t;
  t.name = ".memcuda-rep/GPU-1/w";
  t.dtype = DType::f32;
  t.shape = {4};
  t.bytes = 16;
  t.backend = BackendKind::cuda;
  t.device = 1;
  t.device_uuid = "GPU-1";
  t.ipc_handle = std::string(64, 'h');
  t.alloc_bytes = 16;
  t.state = TensorState::ready;
  t.generation = 9;
  t.refcount = 1;
  t.replica_of = "w";
  t.source_generation = 7;
  t.idle_ms = 500;
  t.copied_version = 3;
  t.replica_path = "peer";
  CHECK(p::decode_record(p::encode_record(t)) == t);
  const auto desc = p::parse_desc(p::encode_desc(t));
  bool rep = false, copied = false;
  for (const auto& [k, v] : desc.extras) {
    rep |= k == "replica_of" && v == "w";
    copied |= k == "copied_version" || k == "replica_path";
  }
  CHECK(rep);
  CHECK_FALSE(copied);

  auto with = [&](const char* f, const char* v) {
    auto fields = p::encode_record(t);
    bool set = false;
    for (auto& [k, val] : fields)
      if (k == f) val = v, set = true;
    if (!set) fields.emplace_back(f, v);
    return fields;
  };
  CHECK_THROWS_WITH(p::decode_record(with("replica_path", "nvlink")), Catch::Contains("replica_path"));
  CHECK_THROWS_WITH(p::decode_record(with("idle_ms", "-5")), Catch::Contains("idle_ms"));
  CHECK_THROWS_WITH(p::decode_record(with("replica_of", "a b")), Catch::Contains("replica_of"));
  CHECK_THROWS_WITH(p::decode_record(with("copied_version", "x")), Catch::Contains("copied_version"));
  auto no_gen = p::encode_record(t);
  std::erase_if(no_gen, [](const auto& kv) { return kv.first == "source_generation"; });
  CHECK_THROWS_WITH(p::decode_record(no_gen), Catch::Contains("source_generation"));
}

TEST_CASE("replicate refusals: a host tensor, a replica, an unknown name or prefix, and nothing changes",
          "[redis][replica]") {
  test::RedisServer srv;
  TensorRegistry leader(test::host_options(srv, true));
  REQUIRE(leader.is_leader());
  CreateOptions o;
  o.persistent = true;
  auto h = leader.create<float>("h/w", {8}, o);
  auto c = srv.connect();
  // Sent as any Redis client would: the allocator of record answers on reply_to.
  auto send = [&](const std::string& body) {
    c.command({"DEL", "test:reply"});
    c.command({"LPUSH", "tensor_lifecycle", body});
    auto r = c.command({"BLPOP", "test:reply", "10"});
    REQUIRE(!r.is_nil());
    return p::decode_reply(r[1].str());
  };
  const std::string dev = std::string(R"(,"devices":[")") + kUuid + R"("],"reply_to":"test:reply","id":"r"})";
  auto r = send(R"({"op":"replicate","name":"h/w")" + dev);
  REQUIRE_FALSE(r.ok);
  CHECK(r.error->code == "invalid_argument");
  CHECK_THAT(r.error->message, Catch::Contains("host memory"));
  r = send(R"({"op":"replicate","name":".memcuda-rep/GPU-1/h/w")" + dev);
  CHECK(r.error->code == "invalid_argument");
  CHECK_THAT(r.error->message, Catch::Contains("is a replica"));
  r = send(R"({"op":"replicate","name":"nope")" + dev);
  CHECK(r.error->code == "not_found");
  r = send(R"({"op":"replicate","name":"none/","prefix":true)" + dev);
  CHECK(r.error->code == "not_found");
  r = send(R"({"op":"replicate","name":"h/","prefix":true)" + dev);
  CHECK(r.error->code == "invalid_argument");
  // the source's references were given back, and no replica was made
  CHECK(std::string(c.command({"HGET", "memcuda:tensor:h/w", "refcount"}).str()) == "2");
  CHECK(c.command({"ZRANGEBYLEX", "memcuda:names", "[.memcuda-rep/", "(.memcuda-rep/\xff"}).size() == 0);
  // a prefix whose names start with more replicas than one command may make:
  // the tensor after them is still found (and refused: host memory)
  auto x = leader.create<float>(".x/w", {8}, o);
  for (int i = 0; i < 1100; ++i)
    c.command({"ZADD", "memcuda:names", "0", ".memcuda-rep/GPU-1/r" + std::to_string(i)});
  r = send(R"({"op":"replicate","name":".","prefix":true)" + dev);
  CHECK(r.error->code == "invalid_argument");
  CHECK_THAT(r.error->message, Catch::Contains("host memory"));

  // the API says the same before sending anything
  ReplicateOptions prefix, negative;
  prefix.prefix = true;
  negative.idle = -1ms;
  CHECK_THROWS_AS(replicate(leader, "", prefix), InvalidArgument);
  CHECK_THROWS_AS(replicate(leader, "a b"), ProtocolError);
  CHECK_THROWS_AS(replicate(leader, "h/w", negative), InvalidArgument);
}

TEST_CASE("a get asking for a local replica of a host tensor gets the tensor", "[redis][replica]") {
  test::RedisServer srv;
  TensorRegistry reg(test::host_options(srv, true));
  auto h = reg.create<float>("h/w", {8});
  GetOptions o;
  o.replica = LocalReplica::use;
  try {
    auto g = reg.get<float>("h/w", o);
    CHECK(g.name() == "h/w");
    CHECK(g.generation() == h.generation());
  } catch (const Unavailable& e) {
    SUCCEED("no CUDA in this build: " << e.what());
  }
}
