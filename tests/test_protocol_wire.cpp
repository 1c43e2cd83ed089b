// memcuda/protocol/inbox.hpp, session.hpp and pool_stats.hpp: the JSON the
// registries exchange besides commands and replies (inbox messages, migrate
// answers, the session value, the pool statistics). Needs neither Redis nor
// a GPU.
#include <catch2/catch.hpp>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "memcuda/error.hpp"
#include "memcuda/protocol/inbox.hpp"
#include "memcuda/protocol/pool_stats.hpp"
#include "memcuda/protocol/session.hpp"

using namespace memcuda;
using E = ProtocolErrc;
using namespace std::string_literals;

namespace {

// The ProtocolErrc name `f` throws, "no error", or the other exception.
template <class F>
std::string outcome(F&& f) {
  try {
    f();
    return "no error";
  } catch (const ProtocolError& e) {
    return to_string(e.errc());
  } catch (const std::exception& e) {
    return std::string("other exception: ") + e.what();
  }
}

struct Case {
  std::string json;
  E errc;
};

protocol::MigrateMessage sample_migrate() {
  protocol::MigrateMessage m;
  m.id = 7;
  m.reply_to = "memcuda:reply:1-ab:migrate";
  m.name = "layer.0/w";
  m.backend = BackendKind::cuda;
  m.bytes = 4096;
  m.from_owner = "11-00ff";
  m.from_alloc_id = 3;
  m.from_offset = 512;
  m.to_owner = "12-abcd";
  m.to_owner_pid = 12;
  m.to_alloc_id = 9;
  m.to_offset = 0;
  m.to_alloc_bytes = 1 << 20;
  m.to_handle = std::string(64, '\0');
  for (int i = 0; i < 64; ++i) m.to_handle[i] = static_cast<char>(i * 4);  // every nibble
  m.to_device = 1;
  m.to_device_uuid = "GPU-0c1d2e3f";
  return m;
}

// The migrate message as the registry wrote it before the codec, with one
// field replaced (or removed when value is empty).
std::string migrate_with(const std::string& field, const std::string& value) {
  std::vector<std::pair<std::string, std::string>> f = {
      {"op", R"("migrate")"},        {"id", "7"},
      {"reply_to", R"("r:1")"},      {"name", R"("x")"},
      {"backend", R"("host")"},      {"bytes", "8"},
      {"from_owner", R"("1-aa")"},   {"from_alloc_id", "1"},
      {"from_offset", "0"},          {"to_owner", R"("2-bb")"},
      {"to_owner_pid", "2"},         {"to_alloc_id", "2"},
      {"to_offset", "0"},            {"to_alloc_bytes", "8"},
      {"to_handle", R"("2f6d")"},    {"to_device", "-1"},
      {"to_device_uuid", R"("")"},
  };
  std::string out = "{";
  for (const auto& [k, v] : f) {
    std::string val = k == field ? value : v;
    if (k == field && value.empty()) continue;
    if (out.size() > 1) out += ",";
    out += "\"" + k + "\":" + val;
  }
  return out + "}";
}

}  // namespace

// ---------------------------------------------------------------- inbox
TEST_CASE("inbox messages of every op round-trip", "[protocol]") {
  const protocol::InboxMessage msgs[] = {
      protocol::ForgetMessage{"123-00aa"},
      protocol::UnmapMessage{"123-00aa", {}},
      protocol::UnmapMessage{"123-00aa", {0, 1, 18446744073709551615ull}},
      protocol::FreeMessage{42},
      protocol::FreeMessage{18446744073709551615ull},
      sample_migrate(),
  };
  for (const auto& m : msgs) {
    std::string json = protocol::encode_inbox(m);
    INFO(json);
    CHECK(protocol::decode_inbox(json) == m);
    CHECK(protocol::encode_inbox(protocol::decode_inbox(json)) == json);
  }
  CHECK(protocol::encode_inbox(protocol::FreeMessage{5}) == R"({"op":"free","generation":5})");
  CHECK(protocol::encode_inbox(protocol::UnmapMessage{"s", {4, 5}}) ==
        R"({"op":"unmap","owner":"s","alloc_ids":[4,5]})");
  // The handle travels as lower-case hex.
  CHECK(protocol::encode_inbox(sample_migrate()).find(R"("to_handle":"0004080c1014)") !=
        std::string::npos);
}

TEST_CASE("decode_inbox reads what the registry wrote before the codec", "[protocol]") {
  // The exact documents registry_core built by hand (field order and all).
  auto forget = protocol::decode_inbox(R"({"op":"forget","owner":"77-0123456789abcdef"})");
  CHECK(std::get<protocol::ForgetMessage>(forget).owner == "77-0123456789abcdef");
  auto m = std::get<protocol::MigrateMessage>(protocol::decode_inbox(migrate_with("", "")));
  CHECK(m.backend == BackendKind::host);
  CHECK(m.to_handle == "/m");
  CHECK(m.to_device == -1);
  CHECK(m.to_device_uuid.empty());
  // Unknown fields are ignored: a newer leader may add some.
  auto f = protocol::decode_inbox(R"({"op":"free","generation":3,"name":"x","later":[1]})");
  CHECK(std::get<protocol::FreeMessage>(f).generation == 3);
}

TEST_CASE("malformed inbox messages fail with the right ProtocolErrc", "[protocol]") {
  const Case cases[] = {
      {"", E::bad_json},
      {"{", E::bad_json},
      {R"({"op":"free","generation":1,"generation":2})", E::bad_json},
      {R"({"op":"free","generation":1} {})", E::trailing_garbage},
      {std::string(protocol::kMaxCommandBytes + 1, ' '), E::too_large},
      {"[]", E::not_object},
      {"null", E::not_object},
      {"{}", E::missing_field},
      {R"({"op":1})", E::wrong_type},
      {R"({"op":"explode"})", E::unknown_op},
      {R"({"op":"FREE","generation":1})", E::unknown_op},
      {R"({"op":"forget"})", E::missing_field},
      {R"({"op":"forget","owner":""})", E::bad_value},
      {R"({"op":"forget","owner":"a\nb"})", E::bad_value},
      {R"({"op":"forget","owner":7})", E::wrong_type},
      {R"({"op":"forget","owner":")" + std::string(256, 's') + "\"}", E::bad_value},
      {R"({"op":"unmap","owner":"s"})", E::missing_field},
      {R"({"op":"unmap","owner":"s","alloc_ids":3})", E::wrong_type},
      {R"({"op":"unmap","owner":"s","alloc_ids":[1,-1]})", E::bad_value},
      {R"({"op":"unmap","owner":"s","alloc_ids":[1,"2"]})", E::wrong_type},
      {R"({"op":"unmap","owner":"s","alloc_ids":[1.5]})", E::wrong_type},
      {R"({"op":"unmap","owner":"s","alloc_ids":[18446744073709551616]})", E::bad_value},
      {R"({"op":"unmap","owner":"s","alloc_ids":[[1]]})", E::wrong_type},
      {R"({"op":"free"})", E::missing_field},
      {R"({"op":"free","generation":-5})", E::bad_value},
      {R"({"op":"free","generation":"5"})", E::wrong_type},
      {R"({"op":"free","generation":null})", E::wrong_type},
      {R"({"op":"free","generation":1e3})", E::wrong_type},
      {migrate_with("id", ""), E::missing_field},
      {migrate_with("id", R"("7")"), E::wrong_type},
      {migrate_with("reply_to", ""), E::missing_field},
      {migrate_with("reply_to", R"("")"), E::bad_value},
      {migrate_with("name", R"("bad name")"), E::bad_name},
      {migrate_with("name", R"("")"), E::bad_name},
      {migrate_with("backend", R"("tpu")"), E::bad_value},
      {migrate_with("backend", "0"), E::wrong_type},
      {migrate_with("bytes", "-8"), E::bad_value},
      {migrate_with("from_owner", ""), E::missing_field},
      {migrate_with("from_alloc_id", "true"), E::wrong_type},
      {migrate_with("from_offset", ""), E::missing_field},
      {migrate_with("to_owner", R"("")"), E::bad_value},
      {migrate_with("to_owner_pid", "-1"), E::bad_value},
      {migrate_with("to_owner_pid", "2147483648"), E::bad_value},
      {migrate_with("to_alloc_id", ""), E::missing_field},
      {migrate_with("to_offset", "0.0"), E::wrong_type},
      {migrate_with("to_alloc_bytes", ""), E::missing_field},
      {migrate_with("to_handle", R"("abc")"), E::bad_value},
      {migrate_with("to_handle", R"("2F6D")"), E::bad_value},
      {migrate_with("to_handle", R"("zz")"), E::bad_value},
      {migrate_with("to_handle", "\"" + std::string(512, 'a') + "\""), E::bad_value},
      {migrate_with("to_handle", "[]"), E::wrong_type},
      {migrate_with("to_device", "1024"), E::bad_value},
      {migrate_with("to_device", "-2"), E::bad_value},
      {migrate_with("to_device_uuid", R"("GPU 0")"), E::bad_value},
      {migrate_with("to_device_uuid", ""), E::missing_field},
  };
  for (const Case& c : cases) {
    INFO("inbox: " << c.json.substr(0, 160));
    CHECK(outcome([&] { (void)protocol::decode_inbox(c.json); }) == to_string(c.errc));
  }
}

TEST_CASE("encode_inbox refuses what decode_inbox would reject", "[protocol]") {
  CHECK(outcome([] { (void)protocol::encode_inbox(protocol::ForgetMessage{""}); }) == "bad_value");
  auto m = sample_migrate();
  m.name = "no spaces allowed";
  CHECK(outcome([&] { (void)protocol::encode_inbox(m); }) == "bad_name");
  // An unmap too large for one message must be split by the sender.
  protocol::UnmapMessage big{"s", std::vector<std::uint64_t>(4000, 18446744073709551615ull)};
  CHECK(outcome([&] { (void)protocol::encode_inbox(big); }) == "too_large");
}

TEST_CASE("migrate answers round-trip and are strict", "[protocol]") {
  protocol::MigrateAnswer ok{7, true, std::nullopt};
  CHECK(protocol::encode_migrate_answer(ok) == R"({"id":7,"ok":true})");
  CHECK(protocol::decode_migrate_answer(R"({"id":7,"ok":true})") == ok);
  protocol::MigrateAnswer bad{8, false, "this process does not map 'x'"};
  std::string json = protocol::encode_migrate_answer(bad);
  CHECK(json == R"({"id":8,"ok":false,"error":"this process does not map 'x'"})");
  CHECK(protocol::decode_migrate_answer(json) == bad);
  // Any what() can be sent: made UTF-8 and cut.
  protocol::MigrateAnswer weird{9, false, "bad \xff bytes" + std::string(9000, 'm')};
  auto back = protocol::decode_migrate_answer(protocol::encode_migrate_answer(weird));
  REQUIRE(back.error);
  CHECK(back.error->starts_with("bad ? bytes"));
  CHECK(back.error->size() == protocol::kMaxErrorMessageBytes);
  CHECK(outcome([] { (void)protocol::encode_migrate_answer({1, true, "x"}); }) == "bad_value");

  const Case cases[] = {
      {"", E::bad_json},
      {R"({"id":1,"ok":true}x)", E::trailing_garbage},
      {R"({"id":1,"id":2,"ok":true})", E::bad_json},
      {"[1]", E::not_object},
      {R"({"ok":true})", E::missing_field},
      {R"({"id":1})", E::missing_field},
      {R"({"id":-1,"ok":true})", E::bad_value},
      {R"({"id":"1","ok":true})", E::wrong_type},
      {R"({"id":1,"ok":"yes"})", E::wrong_type},
      {R"({"id":1,"ok":false})", E::missing_field},
      {R"({"id":1,"ok":false,"error":{"code":"x"}})", E::wrong_type},
      {R"({"id":1,"ok":true,"error":"e"})", E::bad_value},
      {std::string(protocol::kMaxCommandBytes + 1, '{'), E::too_large},
  };
  for (const Case& c : cases) {
    INFO("answer: " << c.json.substr(0, 120));
    CHECK(outcome([&] { (void)protocol::decode_migrate_answer(c.json); }) == to_string(c.errc));
  }
}

// ---------------------------------------------------------------- session
TEST_CASE("session values round-trip and are strict", "[protocol]") {
  protocol::SessionInfo s{4242, "host-1/0a1b2c3d", 1732350000000, true, {}, {}, {}};
  std::string json = protocol::encode_session(s);
  CHECK(json ==
        R"({"pid":4242,"node":"host-1/0a1b2c3d","started":1732350000000,"allocator_capable":true})");
  CHECK(protocol::decode_session(json) == s);
  CHECK(protocol::decode_session(
            R"({"allocator_capable":false,"started":0,"node":"n","pid":1,"new":{}})") ==
        protocol::SessionInfo{1, "n", 0, false, {}, {}, {}});
  CHECK(outcome([] { (void)protocol::encode_session({0, "n", 0, false, {}, {}, {}}); }) == "bad_value");
  // "live", optional, round-trips.
  protocol::SessionInfo l{7, "n/0a1b2c3d", 1, true, "pid:[4026531836]", "64769:12/live-7-4026531836-0123456789abcdef.lock",
                          {}};
  CHECK(protocol::decode_session(protocol::encode_session(l)) == l);
  // "registered", optional, round-trips, last.
  protocol::SessionInfo r{7, "n", 1, false, {}, {}, "127.0.0.1:6380"};
  CHECK(protocol::encode_session(r) ==
        R"({"pid":7,"node":"n","started":1,"allocator_capable":false,"registered":"127.0.0.1:6380"})");
  CHECK(protocol::decode_session(protocol::encode_session(r)) == r);

  const Case cases[] = {
      {"", E::bad_json},
      {R"({"pid":1,"node":"n","started":0,"allocator_capable":true} 1)", E::trailing_garbage},
      {R"({"pid":1,"pid":2,"node":"n","started":0,"allocator_capable":true})", E::bad_json},
      {R"("session")", E::not_object},
      {R"({"node":"n","started":0,"allocator_capable":true})", E::missing_field},
      {R"({"pid":1,"started":0,"allocator_capable":true})", E::missing_field},
      {R"({"pid":1,"node":"n","allocator_capable":true})", E::missing_field},
      {R"({"pid":1,"node":"n","started":0})", E::missing_field},
      {R"({"pid":0,"node":"n","started":0,"allocator_capable":true})", E::bad_value},
      {R"({"pid":2147483648,"node":"n","started":0,"allocator_capable":true})", E::bad_value},
      {R"({"pid":"1","node":"n","started":0,"allocator_capable":true})", E::wrong_type},
      {R"({"pid":1,"node":"","started":0,"allocator_capable":true})", E::bad_value},
      {R"({"pid":1,"node":"a\u0000b","started":0,"allocator_capable":true})", E::bad_value},
      {R"({"pid":1,"node":["n"],"started":0,"allocator_capable":true})", E::wrong_type},
      {R"({"pid":1,"node":"n","started":-1,"allocator_capable":true})", E::bad_value},
      {R"({"pid":1,"node":"n","started":1.5,"allocator_capable":true})", E::wrong_type},
      {R"({"pid":1,"node":"n","started":0,"allocator_capable":1})", E::wrong_type},
      {R"({"pid":1,"node":"n","started":0,"allocator_capable":true,"live":7})", E::wrong_type},
      {R"({"pid":1,"node":"n","started":0,"allocator_capable":true,"live":""})", E::bad_value},
      {R"({"pid":1,"node":"n","started":0,"allocator_capable":true,"live":")" + std::string(161, 'l') + "\"}",
       E::bad_value},
      {R"({"pid":1,"node":"n","started":0,"allocator_capable":true,"registered":6379})", E::wrong_type},
      {R"({"pid":1,"node":"n","started":0,"allocator_capable":true,"registered":""})", E::bad_value},
      {R"({"pid":1,"node":"n","started":0,"allocator_capable":true,"registered":")" + std::string(256, 'r') + "\"}",
       E::bad_value},
      {std::string(protocol::kMaxCommandBytes + 1, 'x'), E::too_large},
  };
  for (const Case& c : cases) {
    INFO("session: " << c.json.substr(0, 120));
    CHECK(outcome([&] { (void)protocol::decode_session(c.json); }) == to_string(c.errc));
  }
}

// ---------------------------------------------------------------- pool stats
TEST_CASE("pool statistics round-trip", "[protocol]") {
  PoolStats cuda;
  cuda.backend = BackendKind::cuda;
  cuda.device = 1;
  cuda.device_uuid = "GPU-1234";
  cuda.in_use = 1;
  cuda.reserved = 2;
  cuda.peak_in_use = 3;
  cuda.budget = 4;
  cuda.slabs = 5;
  cuda.allocations = 6;
  cuda.frees = 7;
  cuda.largest_free = 18446744073709551615ull;
  PoolStats host;  // backend host, device -1, no uuid, zeros
  const std::vector<PoolStats> pools{cuda, host};
  std::string json = protocol::encode_pool_stats(pools);
  CHECK(json.starts_with(R"([{"backend":"cuda","device":1,"device_uuid":"GPU-1234","in_use":1,)"
                         R"("reserved":2,"peak_in_use":3,"budget":4,"slabs":5,"allocations":6,)"
                         R"("frees":7,"largest_free":18446744073709551615},{"backend":"host",)"));
  auto back = protocol::decode_pool_stats(json);
  REQUIRE(back.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(back[i].backend == pools[i].backend);
    CHECK(back[i].device == pools[i].device);
    CHECK(back[i].device_uuid == pools[i].device_uuid);
    CHECK(back[i].in_use == pools[i].in_use);
    CHECK(back[i].reserved == pools[i].reserved);
    CHECK(back[i].peak_in_use == pools[i].peak_in_use);
    CHECK(back[i].budget == pools[i].budget);
    CHECK(back[i].slabs == pools[i].slabs);
    CHECK(back[i].allocations == pools[i].allocations);
    CHECK(back[i].frees == pools[i].frees);
    CHECK(back[i].largest_free == pools[i].largest_free);
  }
  CHECK(protocol::encode_pool_stats(back) == json);
  CHECK(protocol::encode_pool_stats({}) == "[]");
  CHECK(protocol::decode_pool_stats(" [ ] ").empty());
}

TEST_CASE("malformed pool statistics fail with the right ProtocolErrc", "[protocol]") {
  const std::string counters =
      R"("in_use":0,"reserved":0,"peak_in_use":0,"budget":0,"slabs":0,"allocations":0,"frees":0)";
  auto entry = [&](const std::string& head, const std::string& last = R"("largest_free":0)") {
    return "[{" + head + "," + counters + "," + last + "}]";
  };
  const std::string host = R"("backend":"host","device":-1,"device_uuid":"")";
  CHECK(protocol::decode_pool_stats(entry(host)).size() == 1);
  CHECK(protocol::decode_pool_stats(entry(host, R"("largest_free":0,"future":true)")).size() == 1);

  const Case cases[] = {
      {"", E::bad_json},
      {"[", E::bad_json},
      {"[] []", E::trailing_garbage},
      {"[{\"a\":1,\"a\":2}]", E::bad_json},
      {std::string(protocol::kMaxCommandBytes + 1, '['), E::too_large},
      {std::string(20, '[') + std::string(20, ']'), E::bad_json},
      {"{}", E::wrong_type},
      {"null", E::wrong_type},
      {"[1]", E::wrong_type},
      {"[[]]", E::wrong_type},
      {"[{}]", E::missing_field},
      {entry(R"("device":-1,"device_uuid":"")"), E::missing_field},
      {entry(R"("backend":"tpu","device":-1,"device_uuid":"")"), E::bad_value},
      {entry(R"("backend":null,"device":-1,"device_uuid":"")"), E::wrong_type},
      {entry(R"("backend":"host","device":0,"device_uuid":"")"), E::bad_value},
      {entry(R"("backend":"cuda","device":-1,"device_uuid":"")"), E::bad_value},
      {entry(R"("backend":"cuda","device":1024,"device_uuid":"")"), E::bad_value},
      {entry(R"("backend":"cuda","device":"0","device_uuid":"")"), E::wrong_type},
      {entry(R"("backend":"cuda","device":0,"device_uuid":"GPU 0")"), E::bad_value},
      {entry(R"("backend":"cuda","device":0,"device_uuid":0)"), E::wrong_type},
      {entry(R"("backend":"host","device":-1)"), E::missing_field},
      {entry(host, R"("largest_free":-1)"), E::bad_value},
      {entry(host, R"("largest_free":1.5)"), E::wrong_type},
      {entry(host, R"("largest_free":18446744073709551616)"), E::bad_value},
      {entry(host, R"("other":0)"), E::missing_field},
  };
  for (const Case& c : cases) {
    INFO("pool_stats: " << c.json.substr(0, 160));
    CHECK(outcome([&] { (void)protocol::decode_pool_stats(c.json); }) == to_string(c.errc));
  }
  PoolStats bad;
  bad.device = 3;  // a host pool is device -1
  CHECK(outcome([&] { (void)protocol::encode_pool_stats({bad}); }) == "bad_value");
}
