// Batch operations (get_many / get_prefix / get_matching, create_many,
// remove_many, the state-dict helpers, the create_many command and the CLI)
// against a real redis-server, with real processes where a second process
// matters. Host backend; the [gpu] cases at the end run the cuda paths.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <numeric>
#include <sstream>
#include <thread>

#include "memcuda/memcuda.hpp"
#include "memcuda/protocol.hpp"
#include "memcuda/redis/connection.hpp"
#include "memcuda/state_dict.hpp"
#include "support/gpu.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

RegistryOptions batch_opts(const test::RedisServer& srv, bool control = true,
                           BackendKind backend = BackendKind::host) {
  RegistryOptions o;
  o.redis = srv.options();
  o.control_thread = control;
  // Long enough that no lease renewal (an EVALSHA) falls into a counted window.
  o.lease_ttl = control ? 30s : 300ms;
  o.request_timeout = 5s;
  o.default_backend = backend;
  return o;
}

// Calls of one Redis command so far (INFO commandstats).
long long command_calls(redis::Connection& c, const std::string& cmd) {
  std::string info(c.command({"INFO", "commandstats"}).str());
  const std::string key = "cmdstat_" + cmd + ":calls=";
  auto at = info.find(key);
  if (at == std::string::npos) return 0;
  return std::stoll(info.substr(at + key.size()));
}

std::vector<std::string> names_of(const std::string& prefix, int n) {
  std::vector<std::string> v;
  for (int i = 0; i < n; ++i) v.push_back(prefix + std::to_string(i));
  return v;
}

std::vector<float> read_floats(const SharedTensor<void>& t) {
  std::vector<float> v(t.bytes() / sizeof(float));
  SharedTensor<float>(t.handle()).copy_to_host(v);
  return v;
}

}  // namespace

TEST_CASE("get_many takes every reference in one script, and each tensor maps", "[redis][batch]") {
  test::RedisServer srv;
  TensorRegistry leader(batch_opts(srv));
  REQUIRE(leader.is_leader());
  auto names = names_of("w/", 24);
  std::vector<SharedTensor<float>> made;
  for (std::size_t i = 0; i < names.size(); ++i) {
    made.push_back(leader.create<float>(names[i], {4}));
    std::vector<float> v(4, static_cast<float>(i));
    made.back().copy_from_host(v);
  }
  TensorRegistry reader(batch_opts(srv, false));
  redis::Connection raw(srv.options());
  (void)reader.get_many({names[0]});  // loads the script (a NOSCRIPT round trip would be counted)
  reader.flush();

  const long long before = command_calls(raw, "evalsha");
  auto got = reader.get_many(names);
  const long long after = command_calls(raw, "evalsha");
  CHECK(after - before == 1);  // one script for 24 names (24 gets would be 24)
  REQUIRE(got.ok());
  REQUIRE(got.tensors.size() == names.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto& t = got.tensors.at(names[i]);
    CHECK(t.generation() == made[i].generation());
    CHECK(read_floats(t) == std::vector<float>(4, static_cast<float>(i)));
    CHECK(leader.info(names[i]).refcount == 2);
    CHECK(leader.info(names[i]).holders.at(reader.session_id()) == 1);
  }
  // Named twice: one reference, one entry.
  auto twice = reader.get_many({names[1], names[1]});
  CHECK(twice.tensors.size() == 1);
  CHECK(leader.info(names[1]).refcount == 3);
  twice = {};
  got = {};
  reader.flush();
  for (const auto& n : names) CHECK(leader.info(n).refcount == 1);
}

TEST_CASE("a batch get that partly fails reports each name and leaks no reference", "[redis][batch]") {
  test::RedisServer srv;
  TensorRegistry leader(batch_opts(srv));
  auto a = leader.create<float>("a", {2});
  auto b = leader.create<std::int32_t>("b", {2});
  auto c = leader.create<float>("c", {3});
  TensorRegistry reader(batch_opts(srv, false));

  auto r = reader.get_many({"a", "nope", "b", "c"}, DType::f32);
  CHECK_FALSE(r.ok());
  CHECK(r.tensors.size() == 2);
  CHECK(r.tensors.count("a") == 1);
  CHECK(r.tensors.count("c") == 1);
  REQUIRE(r.errors.size() == 2);
  CHECK(r.errors.at("nope").code == "not_found");
  CHECK(r.errors.at("b").code == "type_mismatch");
  CHECK(r.errors.at("b").message.find("i32") != std::string::npos);
  CHECK_THROWS_AS(r.errors.at("nope").rethrow(), NotFound);
  CHECK_THROWS_AS(r.errors.at("b").rethrow(), TypeMismatch);
  // the refused names took nothing, the others one each
  CHECK(leader.info("b").refcount == 1);
  CHECK(leader.info("a").refcount == 2);
  CHECK(leader.info("c").refcount == 2);
  r = {};
  reader.flush();
  CHECK(leader.info("a").refcount == 1);

  // strict: the first error (by name), and every reference given back
  CHECK_THROWS_AS(reader.get_all({"a", "c", "nope"}), NotFound);
  CHECK(reader.get_all({"a", "b"}).size() == 2);  // no failure: every tensor (dropped again at once)
  reader.flush();
  CHECK(leader.info("a").refcount == 1);
  CHECK(leader.info("b").refcount == 1);
  CHECK(leader.info("c").refcount == 1);
  CHECK(leader.info("a").holders.count(reader.session_id()) == 0);

  // malformed input is refused before anything is taken
  CHECK_THROWS_AS(reader.get_many({"a", "bad name"}), InvalidArgument);
  CHECK(leader.info("a").refcount == 1);
}

TEST_CASE("get_prefix and get_matching select names in the script, sorted", "[redis][batch]") {
  test::RedisServer srv;
  TensorRegistry leader(batch_opts(srv));
  std::vector<SharedTensor<float>> keep;
  for (auto n : {"m/x", "m/y", "m/sub/z", "n/x", "m.x"}) keep.push_back(leader.create<float>(n, {1}));
  TensorRegistry reader(batch_opts(srv, false));

  auto p = reader.get_prefix("m/");
  REQUIRE(p.ok());
  std::vector<std::string> got;
  for (auto& [n, t] : p.tensors) got.push_back(n);
  CHECK(got == std::vector<std::string>{"m/sub/z", "m/x", "m/y"});
  CHECK(leader.info("m/x").refcount == 2);
  CHECK(leader.info("n/x").refcount == 1);
  CHECK(leader.info("m.x").refcount == 1);  // '.' is no wildcard in a prefix

  CHECK(reader.get_matching("*/x").tensors.size() == 2);
  CHECK(reader.get_matching("m/[xy]").tensors.size() == 2);
  CHECK(reader.get_matching("m/[!x]").tensors.size() == 1);
  CHECK(reader.get_matching("m?x").tensors.size() == 2);  // m/x and m.x: '?' matches '/' too (as in list())
  CHECK(reader.get_matching("m.x").tensors.size() == 1);  // '.' is literal in a glob
  CHECK(reader.get_matching("zzz*").tensors.empty());
  CHECK(reader.get_prefix("zzz").tensors.empty());
  CHECK_THROWS_AS(reader.get_matching("m/[x"), InvalidArgument);
  CHECK_THROWS_AS(reader.get_matching("m/%x"), InvalidArgument);
  p = {};
  reader.flush();
  CHECK(leader.info("m/x").refcount == 1);
}

TEST_CASE("create_many in the allocator of record: one script, consecutive generations", "[redis][batch]") {
  test::RedisServer srv;
  TensorRegistry leader(batch_opts(srv));
  redis::Connection raw(srv.options());
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 16; ++i) specs.push_back({"l/" + std::to_string(i), DType::f32, {8}, {}});
  specs[3].options.persistent = true;
  specs[4].dtype = DType::i64;
  (void)leader.create_many({{"warm", DType::u8, {1}, {}}});  // loads the script (NOSCRIPT + SCRIPT LOAD)
  leader.flush();  // its release (a script) lands before the counted window
  const long long before = command_calls(raw, "evalsha") + command_calls(raw, "eval");
  auto made = leader.create_many(specs);
  const long long after = command_calls(raw, "evalsha") + command_calls(raw, "eval");
  CHECK(after - before == 1);  // the create_many script; 16 creates would be 16
  REQUIRE(made.size() == 16);
  std::vector<std::uint64_t> gens;
  for (const auto& s : specs) gens.push_back(made.at(s.name).generation());
  std::sort(gens.begin(), gens.end());
  CHECK(gens.back() - gens.front() == 15);
  CHECK(leader.info("l/3").refcount == 2);
  CHECK(leader.info("l/3").holders.count("@name") == 1);
  CHECK(leader.info("l/0").refcount == 1);
  CHECK(leader.info("l/4").dtype == DType::i64);
  CHECK(leader.info("l/0").owner == leader.session_id());
  leader.flush();
  CHECK(leader.stats().process.owned_allocations == 16);  // "warm" went with its handle
  // writable, and distinct memory
  std::vector<float> v(8, 2.5f);
  SharedTensor<float>(made.at("l/0").handle()).copy_from_host(v);
  CHECK(read_floats(made.at("l/0")) == v);
  CHECK(made.at("l/0").data() != made.at("l/1").data());
  // a single get sees them like any tensor
  CHECK(leader.get<float>("l/7").generation() == made.at("l/7").generation());
}

TEST_CASE("create_many is all or nothing: one taken name creates none and leaks nothing", "[redis][batch]") {
  test::RedisServer srv;
  TensorRegistry leader(batch_opts(srv));
  auto taken = leader.create<float>("t/2", {1});
  TensorRegistry follower(batch_opts(srv, false));
  const auto owned_before = leader.stats().process.owned_allocations;
  const auto in_use_before = leader.stats().process.owned_bytes;
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 4; ++i) specs.push_back({"t/" + std::to_string(i), DType::f32, {1024}, {}});

  SECTION("in the allocator of record") {
    CHECK_THROWS_AS(leader.create_many(specs), AlreadyExists);
  }
  SECTION("from another registry, through the lifecycle list") {
    try {
      follower.create_many(specs);
      FAIL("create_many of a taken name succeeded");
    } catch (const AlreadyExists& e) {
      CHECK(std::string(e.what()).find("t/2") != std::string::npos);
    }
  }
  CHECK(leader.list("t/*").size() == 1);
  CHECK_THROWS_AS(leader.info("t/0"), NotFound);
  CHECK_THROWS_AS(leader.info("t/3"), NotFound);
  CHECK(leader.info("t/2").generation == taken.generation());
  CHECK(leader.stats().process.owned_allocations == owned_before);
  CHECK(leader.stats().process.owned_bytes == in_use_before);
  // bad input: refused before anything is sent or allocated
  std::vector<TensorSpec> dup{{"d", DType::f32, {1}, {}}, {"d", DType::f32, {1}, {}}};
  CHECK_THROWS_AS(follower.create_many(dup), InvalidArgument);
  CHECK_THROWS_AS(leader.create_many(dup), InvalidArgument);
  CHECK_THROWS_AS(leader.info("d"), NotFound);
  // and the same batch without the taken name works
  specs.erase(specs.begin() + 2);
  CHECK(follower.create_many(specs).size() == 3);
}

TEST_CASE("create_many from a follower registry: one command, references belong to the creator", "[redis][batch]") {
  test::RedisServer srv;
  TensorRegistry leader(batch_opts(srv));
  TensorRegistry follower(batch_opts(srv, false));
  REQUIRE_FALSE(follower.is_leader());
  redis::Connection raw(srv.options());
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 10; ++i) specs.push_back({"f/" + std::to_string(i), DType::f32, {16}, {}});
  const long long lpush_before = command_calls(raw, "lpush");
  auto made = follower.create_many(specs);
  // one command on the list (plus one reply pushed by the leader's reply script)
  CHECK(command_calls(raw, "lpush") - lpush_before <= 2);
  REQUIRE(made.size() == 10);
  for (const auto& s : specs) {
    auto info = leader.info(s.name);
    CHECK(info.owner == leader.session_id());
    CHECK(info.refcount == 1);
    CHECK(info.holders.at(follower.session_id()) == 1);
    CHECK(made.at(s.name).generation() == info.generation);
  }
  std::vector<float> v(16, 7.0f);
  SharedTensor<float>(made.at("f/3").handle()).copy_from_host(v);
  CHECK(read_floats(leader.get<void>("f/3")) == v);
  made.clear();
  follower.flush();
  CHECK(leader.list("f/*").empty());  // not persistent: gone with the creator's references
}

TEST_CASE("create_many from a follower process served by a leader process", "[redis][batch][multiprocess]") {
  test::RedisServer srv;
  test::Child w({test::sibling_program("memcuda_test_worker"), "--url", srv.unix_url(), "--ttl", "400", "--backend",
                 "host"});
  auto l = w.read_line(10s);
  REQUIRE(l);
  REQUIRE(l->find("leader=1") != std::string::npos);
  TensorRegistry follower(batch_opts(srv, false));
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 5; ++i) specs.push_back({"p/" + std::to_string(i), DType::f32, {32}, {}});
  auto made = follower.create_many(specs);
  REQUIRE(made.size() == 5);
  const auto ldr = follower.leader();
  for (int i = 0; i < 5; ++i) {
    auto& t = made.at("p/" + std::to_string(i));
    CHECK(t.info().owner == ldr.session);
    std::vector<float> v(32, static_cast<float>(i + 1));
    SharedTensor<float>(t.handle()).copy_from_host(v);
  }
  // the leader process reads what the follower wrote
  CHECK(w.ask("get p/4").rfind("OK", 0) == 0);
  auto sum = w.ask("sum p/4");
  INFO(sum);
  CHECK(sum.find(std::to_string(32 * 5)) != std::string::npos);
  w.ask("exit");
}

TEST_CASE("the create_many command from a plain Redis client gets one reply listing every tensor", "[redis][batch]") {
  test::RedisServer srv;
  TensorRegistry leader(batch_opts(srv));
  redis::Connection raw(srv.options());
  raw.command({"LPUSH", "tensor_lifecycle",
               R"({"op":"create_many","backend":"host","pid":1,"id":"b-1","reply_to":"r:1",)"
               R"("tensors":[{"name":"j/a","dtype":"f32","shape":[2,3]},{"name":"j/b","dtype":"i8","shape":[],"persistent":true}]})"});
  auto r = raw.command({"BRPOP", "r:1", "5"});
  REQUIRE(r.size() == 2);
  auto rep = protocol::decode_reply(r[1].str());
  INFO(r[1].str());
  CHECK(rep.ok);
  CHECK(rep.id == std::optional<std::string>("b-1"));
  CHECK(rep.op == std::optional<std::string>("create_many"));
  REQUIRE(rep.tensors);
  REQUIRE(rep.tensors->size() == 2);
  CHECK((*rep.tensors)[0].name == "j/a");
  CHECK((*rep.tensors)[0].refcount == 1);
  CHECK((*rep.tensors)[1].refcount == 2);
  CHECK(leader.info("j/a").generation == (*rep.tensors)[0].generation);
  CHECK(leader.info("j/a").holders.count("pid:1") == 1);
  CHECK(leader.info("j/b").dtype == DType::i8);

  // a taken name: an error reply, nothing created
  raw.command({"LPUSH", "tensor_lifecycle",
               R"({"op":"create_many","backend":"host","id":7,"reply_to":"r:1",)"
               R"("tensors":[{"name":"j/c","dtype":"f32","shape":[1]},{"name":"j/a","dtype":"f32","shape":[1]}]})"});
  r = raw.command({"BRPOP", "r:1", "5"});
  REQUIRE(r.size() == 2);
  rep = protocol::decode_reply(r[1].str());
  CHECK_FALSE(rep.ok);
  REQUIRE(rep.error);
  CHECK(rep.error->code == "already_exists");
  CHECK_THROWS_AS(leader.info("j/c"), NotFound);

  // a malformed entry: a protocol error naming it
  raw.command({"LPUSH", "tensor_lifecycle",
               R"({"op":"create_many","id":8,"reply_to":"r:1","tensors":[{"name":"j/d","dtype":"f32","shape":[-1]}]})"});
  r = raw.command({"BRPOP", "r:1", "5"});
  REQUIRE(r.size() == 2);
  rep = protocol::decode_reply(r[1].str());
  CHECK_FALSE(rep.ok);
  CHECK(rep.error->code == "protocol_error");
  CHECK(rep.error->message.find("tensors[0].shape") != std::string::npos);
}

TEST_CASE("remove_many and remove_prefix: one script, missing names reported", "[redis][batch]") {
  test::RedisServer srv;
  TensorRegistry leader(batch_opts(srv));
  CreateOptions pers;
  pers.persistent = true;
  std::vector<TensorSpec> specs;
  for (auto n : {"r/a", "r/b", "r/c", "s/a"}) specs.push_back({n, DType::f32, {4}, pers});
  leader.create_many(specs);  // handles dropped: the names hold them
  leader.flush();
  REQUIRE(leader.stats().process.owned_allocations == 4);
  TensorRegistry other(batch_opts(srv, false));
  auto held = other.get<float>("r/b");

  auto res = other.remove_many({"r/a", "nope", "r/b"});
  CHECK(res.removed == std::vector<std::string>{"r/a", "r/b"});
  REQUIRE(res.errors.size() == 1);
  CHECK(res.errors.at("nope").code == "not_found");
  CHECK_THROWS_AS(res.errors.at("nope").rethrow(), NotFound);
  CHECK(leader.list("r/*").size() == 1);
  CHECK_FALSE(held.valid());   // unlinked, still mapped
  held.release();
  other.flush();
  auto p = leader.remove_prefix("r/");
  CHECK(p.removed == std::vector<std::string>{"r/c"});
  CHECK(leader.list("*").size() == 1);
  // every freed block is back (r/a freed on removal, r/b with its last holder, via the list)
  for (int i = 0; i < 100 && leader.stats().process.owned_allocations != 1; ++i) std::this_thread::sleep_for(20ms);
  CHECK(leader.stats().process.owned_allocations == 1);
}

TEST_CASE("state dict: publish under a prefix with data, open it in another registry", "[redis][batch][state_dict]") {
  test::RedisServer srv;
  TensorRegistry leader(batch_opts(srv));
  TensorRegistry consumer(batch_opts(srv, false));
  std::vector<float> w0(64), w1(12);
  std::iota(w0.begin(), w0.end(), 1.0f);
  std::iota(w1.begin(), w1.end(), -5.0f);
  std::vector<std::int64_t> steps{42};
  std::vector<StateDictEntry> sd{{"layers.0.weight", DType::f32, {8, 8}, w0.data()},
                                 {"layers.0.bias", DType::f32, {12}, w1.data()},
                                 {"step", DType::i64, {}, steps.data()},
                                 {"scratch", DType::u8, {3}, nullptr}};
  PublishOptions po;
  po.create.persistent = true;
  auto pub = publish_state_dict(leader, "model/", sd, po);
  CHECK(pub.size() == 4);
  CHECK(pub.count("layers.0.weight") == 1);
  pub.clear();

  auto m = open_state_dict(consumer, "model/");
  REQUIRE(m.size() == 4);
  CHECK(m.at("layers.0.weight").shape() == Shape{8, 8});
  CHECK(read_floats(m.at("layers.0.weight")) == w0);
  CHECK(read_floats(m.at("layers.0.bias")) == w1);
  std::int64_t step = 0;
  SharedTensor<std::int64_t>(m.at("step").handle()).copy_to_host(std::span<std::int64_t>(&step, 1));
  CHECK(step == 42);
  CHECK(m.at("scratch").bytes() == 3);
  CHECK(open_state_dict(consumer, "other/").empty());

  // publishing again over a taken name: nothing new is created
  CHECK_THROWS_AS(publish_state_dict(leader, "model/", {{"new", DType::f32, {1}, nullptr}, sd[1]}, po),
                  AlreadyExists);
  CHECK_THROWS_AS(leader.info("model/new"), NotFound);
}

TEST_CASE("create_many commands: entries take the command's defaults, and strict decoding names the entry", "[protocol][batch]") {
  auto c = protocol::decode_command(
      R"({"op":"create_many","backend":"cuda","device":1,"persistent":true,"id":"x","tensors":[)"
      R"({"name":"a","dtype":"float32","shape":[2]},{"name":"b","dtype":"i8","shape":[],"device":0,"backend":"host","persistent":false}]})");
  CHECK(c.op == protocol::Op::create_many);
  CHECK(c.name.empty());
  REQUIRE(c.tensors.size() == 2);
  CHECK(c.tensors[0].dtype == DType::f32);
  CHECK(c.tensors[0].backend == BackendKind::cuda);
  CHECK(c.tensors[0].device == 1);
  CHECK(c.tensors[0].persistent == true);
  CHECK(c.tensors[1].backend == BackendKind::host);
  CHECK(c.tensors[1].device == 0);
  CHECK(c.tensors[1].persistent == false);
  const std::string text = protocol::encode_command(c);
  CHECK(protocol::decode_command(text) == c);
  CHECK(protocol::encode_command(protocol::decode_command(text)) == text);

  auto errc = [](const std::string& json) {
    try {
      (void)protocol::decode_command(json);
    } catch (const ProtocolError& e) {
      return std::string(to_string(e.errc())) + ": " + e.what();
    }
    return std::string("accepted");
  };
  CHECK(errc(R"({"op":"create_many"})").rfind("missing_field", 0) == 0);
  CHECK(errc(R"({"op":"create_many","tensors":[]})").rfind("bad_value", 0) == 0);
  CHECK(errc(R"({"op":"create_many","tensors":{}})").rfind("wrong_type", 0) == 0);
  CHECK(errc(R"({"op":"create_many","tensors":[{"name":"a","dtype":"f32","shape":[1]},{"name":"a","dtype":"f32","shape":[1]}]})")
            .rfind("bad_value", 0) == 0);
  CHECK(errc(R"({"op":"create_many","tensors":[{"name":"a","dtype":"f32","shape":[1],"x":1}]})").rfind("unknown_field", 0) == 0);
  CHECK(errc(R"({"op":"create_many","tensors":[{"name":"a","dtype":"f99","shape":[1]}]})").rfind("unknown_dtype", 0) == 0);
  CHECK(errc(R"({"op":"create_many","tensors":[{"name":"a","dtype":"f32"}]})").find("tensors[0]") != std::string::npos);
  CHECK(errc(R"({"op":"create_many","tensors":[{"name":"a b","dtype":"f32","shape":[1]}]})").rfind("bad_name", 0) == 0);
  CHECK(errc(R"({"op":"create","tensors":[],"name":"a","dtype":"f32","shape":[1]})") == "accepted");  // unused field ignored

  protocol::Reply rep;
  rep.id = "x";
  rep.op = "create_many";
  rep.tensors = std::vector<protocol::ReplyTensor>{{"a", 5, 1}, {"b", 6, 2}};
  CHECK(protocol::decode_reply(protocol::encode_reply(rep)) == rep);
  CHECK_THROWS_AS(protocol::decode_reply(R"({"ok":true,"tensors":[{"name":"a","generation":1}]})"), ProtocolError);
  CHECK_THROWS_AS(protocol::decode_reply(R"({"ok":true,"tensors":7})"), ProtocolError);
}

// ---- the CLI: get-many, create-many, rm with several names or a prefix ----

namespace {

std::string cli_binary() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  REQUIRE(n > 0);
  buf[n] = 0;
  const auto dir = std::filesystem::path(buf).parent_path();
  for (const auto& c : {dir / "memcuda", dir / ".." / "tools" / "memcuda"})
    if (std::filesystem::exists(c)) return c.lexically_normal().string();
  FAIL("the memcuda binary is not built (target memcuda_cli)");
  return {};
}

struct CliRun {
  int code;
  std::string out;
};

CliRun cli(const test::RedisServer& srv, const std::string& args) {
  const std::string cmd = cli_binary() + " --url " + srv.unix_url() + " " + args + " 2>&1";
  FILE* f = ::popen(cmd.c_str(), "r");
  REQUIRE(f);
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  int st = ::pclose(f);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

}  // namespace

TEST_CASE("memcuda create-many, get-many, rm several names and by prefix", "[cli][redis][batch]") {
  test::RedisServer srv;
  TensorRegistry leader(batch_opts(srv));

  auto r = cli(srv, "create-many --dtype f32 --shape 2,3 --backend host c/a c/b c/x=i64:4");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(leader.info("c/a").shape == Shape{2, 3});
  CHECK(leader.info("c/x").dtype == DType::i64);
  CHECK(leader.info("c/x").shape == Shape{4});
  CHECK(leader.info("c/a").refcount == 1);  // persistent: the name's reference

  r = cli(srv, "create-many --dtype f32 --shape 1 --backend host c/new c/a");
  INFO(r.out);
  CHECK(r.code == 6);
  CHECK(r.out.find("already exists") != std::string::npos);
  CHECK_THROWS_AS(leader.info("c/new"), NotFound);

  r = cli(srv, "get-many c/a c/x nope");
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(r.out.find("c/a") != std::string::npos);
  CHECK(r.out.find("nope") != std::string::npos);
  r = cli(srv, "--json get-many --prefix c/");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("\"c/b\"") != std::string::npos);
  leader.flush();
  CHECK(leader.info("c/a").refcount == 1);  // the CLI's references went with it

  r = cli(srv, "rm c/a nope");
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK_THROWS_AS(leader.info("c/a"), NotFound);
  r = cli(srv, "rm --prefix c/");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(leader.list("c/*").empty());
  CHECK(cli(srv, "rm").code == 1);
  CHECK(cli(srv, "rm --prefix c/ c/b").code == 1);
}

#if MEMCUDA_HAS_CUDA()

TEST_CASE("cuda: create_many, get_many and a state dict copied device-to-device", "[gpu][batch]") {
  MEMCUDA_REQUIRE_GPU();
  test::RedisServer srv;
  TensorRegistry leader(batch_opts(srv, true, BackendKind::cuda));
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 8; ++i) specs.push_back({"g/" + std::to_string(i), DType::f32, {1024}, {}});
  auto made = leader.create_many(specs);
  REQUIRE(made.size() == 8);
  CHECK(made.at("g/0").backend() == BackendKind::cuda);

  // a device source: copied device-to-device
  std::vector<float> host(256);
  std::iota(host.begin(), host.end(), 0.5f);
  void* dev = nullptr;
  REQUIRE(cudaMalloc(&dev, host.size() * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMemcpy(dev, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  auto pub = publish_state_dict(leader, "gm/", {{"w", DType::f32, {256}, dev}, {"h", DType::f32, {256}, host.data()}});
  cudaFree(dev);
  CHECK(pub.size() == 2);

  // another process opens the whole dict in one round trip
  test::Child w({test::sibling_program("memcuda_test_worker"), "--url", srv.unix_url(), "--ttl", "2000",
                 "--backend", "cuda", "--no-control", "--timeout", "30000"});
  REQUIRE(w.read_line(30s));
  CHECK(w.ask("get gm/w", 30s).rfind("OK", 0) == 0);
  auto sum = w.ask("sum gm/w", 30s);
  const double expect = 256 * 0.5 + 255.0 * 256 / 2;
  INFO(sum);
  CHECK(sum.find(std::to_string(static_cast<long long>(expect))) != std::string::npos);
  TensorRegistry reader(batch_opts(srv, false, BackendKind::cuda));
  auto m = reader.get_prefix("g/");
  CHECK(m.tensors.size() == 8);
  CHECK(read_floats(open_state_dict(reader, "gm/").at("h")) == host);
  w.ask("exit");
}

#endif
