// memcuda/shape.hpp, tensor_info.hpp and protocol.hpp: shape and name rules,
// lifecycle commands, replies and the tensor Hash codec. Needs neither Redis
// nor a GPU.
#include <catch2/catch.hpp>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "memcuda/error.hpp"
#include "memcuda/protocol.hpp"
#include "memcuda/shape.hpp"
#include "memcuda/tensor_info.hpp"

using namespace memcuda;
using protocol::Command;
using protocol::Op;
using protocol::Reply;
using E = ProtocolErrc;
using namespace std::string_literals;

namespace {

// The ProtocolErrc name `f` throws, "no error", or the other exception, so a
// failed CHECK shows what happened instead.
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

template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// ---------------------------------------------------------------- shapes

TEST_CASE("shapes of rank 0 to 8 are valid, rank 9 is bad_shape", "[protocol]") {
  Shape shape;
  for (std::size_t rank = 0; rank <= kMaxRank; ++rank) {
    INFO("rank " << rank);
    CHECK(outcome([&] { validate_shape(shape); }) == "no error");
    CHECK(element_count(shape) == (std::uint64_t{1} << rank));
    shape.push_back(2);
  }
  REQUIRE(shape.size() == 9);
  CHECK(outcome([&] { validate_shape(shape); }) == "bad_shape");
  CHECK(outcome([&] { (void)element_count(shape); }) == "bad_shape");
  CHECK(outcome([&] { (void)byte_size(DType::u8, shape); }) == "bad_shape");
  CHECK(outcome([&] { (void)contiguous_strides(shape); }) == "bad_shape");
  CHECK(message_of([&] { validate_shape(shape); }).find("rank 9") != std::string::npos);
}

TEST_CASE("negative and oversized dims are bad_dim", "[protocol]") {
  CHECK(outcome([] { validate_shape(Shape{2, -1}); }) == "bad_dim");
  CHECK(outcome([] { validate_shape(Shape{INT64_MIN}); }) == "bad_dim");
  CHECK(outcome([] { validate_shape(Shape{kMaxDim + 1}); }) == "bad_dim");
  CHECK(outcome([] { validate_shape(Shape{INT64_MAX}); }) == "bad_dim");
  CHECK(outcome([] { validate_shape(Shape{kMaxDim}); }) == "no error");
  CHECK(outcome([] { (void)byte_size(DType::f32, Shape{3, -2}); }) == "bad_dim");
  CHECK(message_of([] {
          validate_shape(Shape{1, 2, -3});
        }) == "shape[2]: dimension -3 is negative");
}

TEST_CASE("sizes: scalars, zero-size tensors and overflow", "[protocol]") {
  CHECK(element_count(Shape{}) == 1);
  CHECK(byte_size(DType::f64, Shape{}) == 8);
  CHECK(byte_size(DType::f32, Shape{2, 3, 4}) == 96);
  CHECK(byte_size(DType::bf16, Shape{5}) == 10);
  CHECK(element_count(Shape{3, 0, 5}) == 0);
  CHECK(byte_size(DType::f64, Shape{0}) == 0);
  // A zero dim makes the tensor empty even when the other dims alone overflow.
  CHECK(byte_size(DType::f64, Shape{kMaxDim, kMaxDim, 0}) == 0);

  CHECK(outcome([] { (void)byte_size(DType::f64, Shape{kMaxDim, kMaxDim}); }) == "size_overflow");
  CHECK(element_count(Shape{kMaxDim, std::int64_t{1} << 23}) == std::uint64_t{1} << 63);
  CHECK(element_count(Shape{kMaxDim, std::int64_t{1} << 24, 0}) == 0);
  CHECK(outcome([] {
          (void)element_count(Shape{kMaxDim, std::int64_t{1} << 24});
        }) == "size_overflow");
  CHECK(outcome([] { (void)element_count(Shape{kMaxDim, kMaxDim}); }) == "size_overflow");
  // Exactly 64 TiB is allowed, one element more is not.
  CHECK(byte_size(DType::u8, Shape{kMaxDim, 64}) == kMaxTensorBytes);
  CHECK(byte_size(DType::f32, Shape{kMaxDim, 16}) == kMaxTensorBytes);
  CHECK(outcome([] { (void)byte_size(DType::f32, Shape{kMaxDim, 16, 1, 2}); }) == "size_overflow");
  CHECK(outcome([] {
          (void)byte_size(DType::u8, Shape{kMaxDim / 2 + 1, 128});
        }) == "size_overflow");
  CHECK(byte_size(DType::u8, Shape{kMaxDim / 2, 128}) == kMaxTensorBytes);
  CHECK(outcome([] { (void)byte_size(static_cast<DType>(99), Shape{1}); }) == "bad_value");
}

TEST_CASE("contiguous strides are row-major", "[protocol]") {
  CHECK(contiguous_strides(Shape{}) == Shape{});
  CHECK(contiguous_strides(Shape{7}) == Shape{1});
  CHECK(contiguous_strides(Shape{2, 3, 4}) == Shape{12, 4, 1});
  CHECK(contiguous_strides(Shape{2, 0, 3}) == Shape{3, 3, 1});
  CHECK(contiguous_strides(Shape{1, 1, 1, 1, 1, 1, 1, 5}) == Shape{5, 5, 5, 5, 5, 5, 5, 1});
  CHECK(outcome([] { (void)contiguous_strides(Shape{2, kMaxDim, kMaxDim}); }) == "size_overflow");
  CHECK(outcome([] { (void)contiguous_strides(Shape{2, -1}); }) == "bad_dim");

  TensorInfo t;
  t.shape = {4, 5};
  CHECK(t.strides() == Shape{5, 1});
  CHECK(t.elements() == 20);
}

TEST_CASE("shape_to_string and shape_from_string are inverses", "[protocol]") {
  const Shape shapes[] = {{}, {0}, {1}, {2, 3, 4}, {kMaxDim}, {1, 2, 3, 4, 5, 6, 7, 8}};
  for (const Shape& sh : shapes) {
    std::string text = shape_to_string(sh);
    INFO(text);
    CHECK(shape_from_string(text) == sh);
  }
  CHECK(shape_to_string(Shape{}) == "[]");
  CHECK(shape_to_string(Shape{2, 3, 4}) == "[2,3,4]");
  CHECK(shape_from_string(" [ 2 , 3 ]\n") == Shape{2, 3});
}

TEST_CASE("shape_from_string rejects malformed text", "[protocol]") {
  struct Case {
    std::string text;
    E errc;
  };
  const Case cases[] = {
      {"", E::bad_json},
      {"[", E::bad_json},
      {"[2,3", E::bad_json},
      {"[2,,3]", E::bad_json},
      {"[2,3,]", E::bad_json},
      {"2,3", E::trailing_garbage},
      {"[2,3]]", E::trailing_garbage},
      {"[2] [3]", E::trailing_garbage},
      {"{\"a\":1}", E::wrong_type},
      {"\"[2,3]\"", E::wrong_type},
      {"null", E::wrong_type},
      {"[2.0,3]", E::wrong_type},
      {"[\"2\"]", E::wrong_type},
      {"[[2]]", E::wrong_type},
      {"[[[[2]]]]", E::bad_json},  // deeper than an array of scalars
      {"[true]", E::wrong_type},
      {"[-1]", E::bad_dim},
      {"[1099511627777]", E::bad_dim},
      {"[9223372036854775808]", E::bad_dim},
      {"[1,1,1,1,1,1,1,1,1]", E::bad_shape},
      {"[2]\0"s, E::trailing_garbage},
  };
  for (const Case& c : cases) {
    INFO("shape text \"" << c.text << "\"");
    CHECK(outcome([&] { (void)shape_from_string(c.text); }) == to_string(c.errc));
  }
}

// ---------------------------------------------------------------- names

TEST_CASE("valid tensor names", "[protocol]") {
  const std::string names[] = {
      "x",
      std::string(255, 'a'),
      "model/layer.0:weight_v-2",
      "._:/-",
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
      "/",
      "..",
  };
  for (const std::string& n : names) {
    INFO("name \"" << n << "\"");
    CHECK(is_valid_name(n));
    CHECK(outcome([&] { validate_name(n); }) == "no error");
  }
}

TEST_CASE("invalid tensor names are bad_name", "[protocol]") {
  const std::string names[] = {
      "",
      std::string(256, 'a'),
      "a b",
      "a\0b"s,
      "\0"s,
      "a*",
      "caf\xc3\xa9",
      "line\n",
      "tab\t",
      "quote\"",
      "back\\slash",
      "semi;colon",
      "x\x7f",
      "x\xff",
      "{json}",
      "a,b",
  };
  for (const std::string& n : names) {
    INFO("name of " << n.size() << " bytes");
    CHECK_FALSE(is_valid_name(n));
    CHECK(outcome([&] { validate_name(n); }) == "bad_name");
  }
  std::string msg = message_of([] { validate_name("ok name"); });
  CHECK(msg.find("0x20") != std::string::npos);
  CHECK(msg.find("offset 2") != std::string::npos);
  CHECK(message_of([] { validate_name("ab\0"s); }).find("offset 2") != std::string::npos);
}

// ---------------------------------------------------------------- commands

TEST_CASE("the seed example command decodes", "[protocol]") {
  Command c = protocol::decode_command(
      R"({"op":"create", "name":"X", "dtype":"f32", "shape":[2,3], "device":0, "pid":123, "node":"n1"})");
  CHECK(c.op == Op::create);
  CHECK(c.name == "X");
  REQUIRE(c.dtype);
  CHECK(*c.dtype == DType::f32);
  REQUIRE(c.shape);
  CHECK(*c.shape == Shape{2, 3});
  CHECK(c.device == 0);
  CHECK(c.pid == 123);
  CHECK(c.node == "n1");
  CHECK_FALSE(c.id);
  CHECK_FALSE(c.backend);
  CHECK_FALSE(c.reply_to);
  CHECK_FALSE(c.generation);
  CHECK_FALSE(c.holder);
}

TEST_CASE("commands of every op round-trip with every field", "[protocol]") {
  Command create;
  create.op = Op::create;
  create.name = "model/w.0";
  create.dtype = DType::bf16;
  create.shape = Shape{4, 0, 3};
  create.device = 1023;
  create.backend = BackendKind::host;
  create.persistent = true;
  create.device_uuid = "GPU-8a6b1c2d-0000-1111-2222-333344445555";
  create.pid = 2147483647;
  create.node = "node-1:gpu~box";
  create.holder = "session 7 \xe2\x9c\x93";
  create.id = "req-\"1\"";
  create.reply_to = "memcuda:reply:1234";

  Command get;
  get.op = Op::get;
  get.name = "x";
  get.pid = 1;
  get.node = "n";
  get.holder = "h";
  get.generation = 18446744073709551615ull;
  get.id = "18446744073709551615";
  get.id_is_number = true;
  get.reply_to = "r";

  Command del = get;
  del.op = Op::release;
  del.generation = 0;
  del.id = "0";

  Command free_ = get;
  free_.op = Op::free;
  free_.generation = 42;
  free_.id = std::string(protocol::kMaxIdBytes, 'i');
  free_.id_is_number = false;

  Command minimal_get;
  minimal_get.op = Op::get;
  minimal_get.name = "y";

  Command scalar;
  scalar.op = Op::create;
  scalar.name = "s";
  scalar.dtype = DType::bool_;
  scalar.shape = Shape{};
  scalar.persistent = false;

  Command del_alias = del;  // decoded from the alias "delete": encodes as it came
  del_alias.op_spelled_delete = true;

  Command pull;  // a fleet node's: its name only (and the routing fields)
  pull.op = Op::pull;
  pull.name = "llm/w";
  pull.holder = "h";
  pull.node = "node-b";
  pull.id = "p1";
  pull.reply_to = "r";

  Command pull_many = pull;  // a fleet node's batch get: several names, no name
  pull_many.name.clear();
  pull_many.names = {"llm/a", "llm/b", ".memcuda-ab/4/llm//v2/c"};

  for (const Command& c : {create, get, del, del_alias, free_, minimal_get, scalar, pull, pull_many}) {
    std::string json = protocol::encode_command(c);
    INFO(json);
    CHECK(protocol::decode_command(json) == c);
  }
  // Numeric ids stay JSON numbers, string ids strings.
  CHECK(protocol::encode_command(get).find(R"("id":18446744073709551615)") != std::string::npos);
  CHECK(protocol::encode_command(create).find(R"("id":"req-\"1\"")") != std::string::npos);
  CHECK(protocol::encode_command(del).find(R"("op":"release")") != std::string::npos);
  CHECK(protocol::encode_command(del_alias).find(R"("op":"delete")") != std::string::npos);
  CHECK(protocol::encode_command(pull).find(R"("op":"pull")") != std::string::npos);
  // A pull names its tensor: without a name it is malformed, like a get.
  CHECK_THROWS_AS(protocol::decode_command(R"({"op":"pull"})"), ProtocolError);
  CHECK(protocol::encode_command(pull_many).find("\"name\"") == std::string::npos);
  // "names": an array of 1..kMaxBatchEntries valid names, not beside "name".
  for (const char* bad : {R"({"op":"pull","names":[]})", R"({"op":"pull","names":"w"})", R"({"op":"pull","names":[7]})",
                          R"({"op":"pull","names":[""]})", R"({"op":"pull","names":["w"],"name":"w"})"}) {
    INFO(bad);
    CHECK_THROWS_AS(protocol::decode_command(bad), ProtocolError);
  }
  std::string big = R"({"op":"pull","names":[)";
  for (std::size_t i = 0; i <= protocol::kMaxBatchEntries; ++i) big += (i ? ",\"w" : "\"w") + std::to_string(i) + "\"";
  CHECK_THROWS_AS(protocol::decode_command(big + "]}"), ProtocolError);
}

TEST_CASE("a free of many generations round-trips, without a name, up to the batch limit", "[protocol]") {
  Command f;
  f.op = Op::free;
  f.generations = {1, 18446744073709551615ull, 42};
  const std::string text = protocol::encode_command(f);
  CHECK(text.find("\"name\"") == std::string::npos);
  CHECK(protocol::decode_command(text) == f);
  CHECK(protocol::decode_command(R"({"op":"free","name":"x","generations":[7]})").generations == std::vector<std::uint64_t>{7});
  std::string many = R"({"op":"free","generations":[)";
  for (std::size_t i = 0; i <= protocol::kMaxBatchEntries; ++i) many += (i ? ",1" : "1");
  many += "]}";
  CHECK_THROWS_AS(protocol::decode_command(many), ProtocolError);
}

TEST_CASE("decode_command accepts aliases, integer ids and ignores fields of other ops",
          "[protocol]") {
  Command c = protocol::decode_command(
      R"({"op":"create","name":"a","dtype":"float32","shape":[1],"id":7,"generation":"x"})");
  CHECK(c.dtype == DType::f32);
  CHECK(c.id == "7");
  CHECK(c.id_is_number);
  CHECK_FALSE(c.generation);  // not a create field: ignored, even with a bad value

  Command g = protocol::decode_command(
      R"({"op":"get","name":"a","dtype":7,"shape":"nope","device":"x","backend":null,)"
      R"("persistent":1,"device_uuid":""})");
  Command plain_get;
  plain_get.op = Op::get;
  plain_get.name = "a";
  CHECK(g == plain_get);

  Command d = protocol::decode_command(" \n{\"op\":\"delete\",\"name\":\"a\",\"id\":\"7\"}\r\n\t ");
  CHECK(d.op == Op::release);  // "delete" is the alias of "release"
  CHECK(d.op_spelled_delete);
  Command r = protocol::decode_command(R"({"op":"release","name":"a","id":"7"})");
  CHECK(r.op == Op::release);
  CHECK_FALSE(r.op_spelled_delete);
  r.op_spelled_delete = true;
  CHECK(r == d);  // the same command but for the spelling the reply echoes
  CHECK(d.id == "7");
  CHECK_FALSE(d.id_is_number);

  // encode_command drops fields the op does not use.
  Command extra = g;
  extra.dtype = DType::f64;
  extra.shape = Shape{1};
  CHECK(protocol::decode_command(protocol::encode_command(extra)) == g);
}

TEST_CASE("malformed commands fail with the right ProtocolErrc", "[protocol]") {
  const std::string create = R"({"op":"create","name":"x","dtype":"f32",)";
  const std::string get = R"({"op":"get","name":"x",)";
  std::string deep_field = get + R"("node":)" + std::string(20, '[') + std::string(20, ']') + "}";
  std::string big = get + R"("reply_to":")" + std::string(65 * 1024, 'a') + "\"}";

  struct Case {
    std::string json;
    E errc;
  };
  const Case cases[] = {
      // JSON level
      {"", E::bad_json},
      {"   ", E::bad_json},
      {"{", E::bad_json},
      {R"({"op":"get","name":"x")", E::bad_json},
      {"{'op':'get','name':'x'}", E::bad_json},
      {R"({"op":"get","name":"x",})", E::bad_json},
      {R"({"op":"get"/*c*/,"name":"x"})", E::bad_json},
      {R"({"op":"get","op":"delete","name":"x"})", E::bad_json},
      {"{\"op\":\"get\",\"name\":\"a\0b\"}"s, E::bad_json},
      {"{\"op\":\"get\",\"name\":\"\xff\"}", E::bad_json},
      {std::string(10000, '['), E::bad_json},
      {deep_field, E::bad_json},
      {R"({"op":"get","name":"x"} {})", E::trailing_garbage},
      {R"({"op":"get","name":"x"}x)", E::trailing_garbage},
      {"{\"op\":\"get\",\"name\":\"x\"}\0"s, E::trailing_garbage},
      {big, E::too_large},
      {"null", E::not_object},
      {"[]", E::not_object},
      {R"([{"op":"get","name":"x"}])", E::not_object},
      {"\"get\"", E::not_object},
      {"42", E::not_object},
      // fields
      {R"({"op":"frobnicate","name":"x"})", E::unknown_op},
      {R"({"op":"Create","name":"x"})", E::unknown_op},
      {R"({"op":"","name":"x"})", E::unknown_op},
      {R"({"name":"x"})", E::missing_field},
      {R"({"op":"get"})", E::missing_field},
      {"{}", E::missing_field},
      {R"({"op":"create","name":"x","shape":[2]})", E::missing_field},
      {create + "\"device\":0}", E::missing_field},
      {R"({"op":"free","name":"x"})", E::missing_field},
      {get + R"("color":"red"})", E::unknown_field},
      {get + R"("Name":"x"})", E::unknown_field},
      {R"({"op":1,"name":"x"})", E::wrong_type},
      {R"({"op":"get","name":7})", E::wrong_type},
      {R"({"op":"get","name":null})", E::wrong_type},
      {R"({"op":"get","name":["x"]})", E::wrong_type},
      {create + R"("shape":"[2,3]"})", E::wrong_type},
      {create + R"("shape":{"0":2}})", E::wrong_type},
      {create + R"("shape":[2.0,3]})", E::wrong_type},
      {create + R"("shape":[2,3e0]})", E::wrong_type},
      {create + R"("shape":["2",3]})", E::wrong_type},
      {create + R"("shape":[2,true]})", E::wrong_type},
      {create + R"("shape":[null]})", E::wrong_type},
      {create + R"("shape":[1e30]})", E::wrong_type},
      {create + R"("shape":[2],"device":"0"})", E::wrong_type},
      {create + R"("shape":[2],"device":true})", E::wrong_type},
      {create + R"("shape":[2],"device":0.5})", E::wrong_type},
      {create + R"("shape":[2],"backend":null})", E::wrong_type},
      {create + R"("shape":[2],"persistent":"yes"})", E::wrong_type},
      {create + R"("shape":[2],"persistent":1})", E::wrong_type},
      {create + R"("shape":[2],"device_uuid":7})", E::wrong_type},
      {R"({"op":"create","name":"x","dtype":32,"shape":[2]})", E::wrong_type},
      {get + R"("pid":1.5})", E::wrong_type},
      {get + R"("pid":null})", E::wrong_type},
      {get + R"("pid":"123"})", E::wrong_type},
      {get + R"("pid":1e30})", E::wrong_type},
      {get + R"("id":true})", E::wrong_type},
      {get + R"("id":1.5})", E::wrong_type},
      {get + R"("generation":"1"})", E::wrong_type},
      {get + R"("reply_to":5})", E::wrong_type},
      {R"({"op":"create","name":"x","dtype":"float128","shape":[2]})", E::unknown_dtype},
      {R"({"op":"create","name":"x","dtype":"F32","shape":[2]})", E::unknown_dtype},
      {R"({"op":"create","name":"x","dtype":"","shape":[2]})", E::unknown_dtype},
      {create + R"("shape":[2,-3]})", E::bad_dim},
      {create + R"("shape":[1099511627777]})", E::bad_dim},
      {create + R"("shape":[9223372036854775808]})", E::bad_dim},
      {create + R"("shape":[18446744073709551616]})", E::bad_dim},
      {create + R"("shape":[-99999999999999999999]})", E::bad_dim},
      {create + R"("shape":[1,1,1,1,1,1,1,1,1]})", E::bad_shape},
      {R"({"op":"create","name":"x","dtype":"f64","shape":[1099511627776,1099511627776]})",
       E::size_overflow},
      {create + R"("shape":[1099511627776,64]})", E::size_overflow},
      {R"({"op":"get","name":""})", E::bad_name},
      {R"({"op":"get","name":"a b"})", E::bad_name},
      {R"({"op":"get","name":"a\u0000b"})", E::bad_name},
      {R"({"op":"get","name":"caf\u00e9"})", E::bad_name},
      {R"({"op":"get","name":"x*"})", E::bad_name},
      {R"({"op":"get","name":"line\n"})", E::bad_name},
      {R"({"op":"get","name":")" + std::string(256, 'n') + "\"}", E::bad_name},
      {create + R"("shape":[2],"device":-1})", E::bad_value},
      {create + R"("shape":[2],"device":1024})", E::bad_value},
      {create + R"("shape":[2],"device":18446744073709551615})", E::bad_value},
      {create + R"("shape":[2],"backend":"tpu"})", E::bad_value},
      {create + R"("shape":[2],"device_uuid":"GPU 1"})", E::bad_value},
      {create + R"("shape":[2],"device_uuid":""})", E::bad_value},
      {get + R"("pid":0})", E::bad_value},
      {get + R"("pid":-5})", E::bad_value},
      {get + R"("pid":2147483648})", E::bad_value},
      {get + R"("pid":18446744073709551616})", E::bad_value},
      {get + R"("pid":-9223372036854775809})", E::bad_value},
      {get + R"("generation":-1})", E::bad_value},
      {R"({"op":"free","name":"x","generation":18446744073709551616})", E::bad_value},
      {R"({"op":"free","generations":[]})", E::bad_value},
      {R"({"op":"free","generations":[1],"generation":1})", E::bad_value},
      {R"({"op":"free","generations":[-1]})", E::bad_value},
      {R"({"op":"free","generations":"1"})", E::wrong_type},
      {R"({"op":"free","generations":["1"]})", E::wrong_type},
      {R"({"op":"free","generations":[1],"name":"a b"})", E::bad_name},
      {get + R"("id":""})", E::bad_value},
      {get + R"("id":-5})", E::bad_value},
      {get + R"("id":")" + std::string(129, 'i') + "\"}", E::bad_value},
      {get + R"("id":100000000000000000000000000000})", E::bad_value},
      {get + R"("reply_to":""})", E::bad_value},
      {get + R"("reply_to":"a\nb"})", E::bad_value},
      {get + R"("reply_to":")" + std::string(256, 'r') + "\"}", E::bad_value},
      {get + R"("node":"n 1"})", E::bad_value},
      {get + R"("node":""})", E::bad_value},
      {get + R"("node":"caf\u00e9"})", E::bad_value},
      {get + R"("holder":")" + std::string(256, 'h') + "\"}", E::bad_value},
      {get + R"("holder":"a\u0000"})", E::bad_value},
  };
  for (const Case& c : cases) {
    INFO("command (" << c.json.size() << " bytes): " << c.json.substr(0, 160));
    CHECK(outcome([&] { (void)protocol::decode_command(c.json); }) == to_string(c.errc));
  }
}

TEST_CASE("command errors name the field and what was expected", "[protocol]") {
  auto msg = [](const std::string& json) {
    return message_of([&] { (void)protocol::decode_command(json); });
  };
  CHECK(msg(R"({"op":"create","name":"x","dtype":"f32","shape":[2,1,-3]})") ==
        R"(field "shape"[2]: dimension -3 is negative)");
  CHECK(msg(R"({"op":"create","name":"x","dtype":"f32","shape":[2,1.5]})")
            .starts_with(R"(field "shape"[1]: expected an integer)"));
  CHECK(msg(R"({"op":"get","name":"x","pid":0})").starts_with(R"(field "pid": 0 is out of range)"));
  CHECK(msg(R"({"op":"get","name":"x","pid":"7"})") ==
        R"(field "pid": expected an integer, got a string)");
  CHECK(msg(R"({"op":"get"})") == R"(command: missing field "name")");
  CHECK(msg(R"({"op":"get","name":"x","bogus":1})").find(R"("bogus")") != std::string::npos);
  CHECK(msg(R"({"op":"get","name":"x","op":"get"})").find("duplicate key \"op\"") !=
        std::string::npos);
}

TEST_CASE("encode_command rejects what decode_command would reject", "[protocol]") {
  Command c;
  c.op = Op::create;
  c.name = "x";
  CHECK(outcome([&] { (void)protocol::encode_command(c); }) == "missing_field");
  c.dtype = DType::f32;
  c.shape = Shape{2, -1};
  CHECK(outcome([&] { (void)protocol::encode_command(c); }) == "bad_dim");
  c.shape = Shape{2};
  c.name = "bad name";
  CHECK(outcome([&] { (void)protocol::encode_command(c); }) == "bad_name");
  c.name = "x";
  c.id = "12a";
  c.id_is_number = true;
  CHECK(outcome([&] { (void)protocol::encode_command(c); }) == "bad_value");
  c.id = "012";
  CHECK(outcome([&] { (void)protocol::encode_command(c); }) == "bad_value");
  c.id = "12";
  CHECK(outcome([&] { (void)protocol::encode_command(c); }) == "no error");
}

// ---------------------------------------------------------------- replies

TEST_CASE("ok and error replies round-trip", "[protocol]") {
  Reply ok;
  ok.id = "41";
  ok.id_is_number = true;
  ok.op = "create";
  ok.name = "x";
  ok.generation = 9;
  ok.refcount = 1;
  std::string json = protocol::encode_reply(ok);
  CHECK(json == R"({"id":41,"ok":true,"op":"create","name":"x","generation":9,"refcount":1})");
  CHECK(protocol::decode_reply(json) == ok);

  Reply err;
  err.id = "41";  // a string id stays a string
  err.ok = false;
  err.error = protocol::ReplyErrorInfo{"already_exists", "tensor \"x\" exists"};
  json = protocol::encode_reply(err);
  CHECK(
      json ==
      R"({"id":"41","ok":false,"error":{"code":"already_exists","message":"tensor \"x\" exists"}})");
  CHECK(protocol::decode_reply(json) == err);

  Reply bare;
  CHECK(protocol::encode_reply(bare) == R"({"ok":true})");
  CHECK(protocol::decode_reply(R"({"ok":true})") == bare);
}

TEST_CASE("decode_reply ignores unknown fields and rejects malformed replies", "[protocol]") {
  Reply r = protocol::decode_reply(
      R"({"ok":false,"future":[1,{"a":2}],"error":{"code":"lost","message":"m","hint":"h"}})");
  CHECK_FALSE(r.ok);
  REQUIRE(r.error);
  CHECK(r.error->code == "lost");
  CHECK(r.error->message == "m");

  struct Case {
    std::string json;
    E errc;
  };
  const Case cases[] = {
      {"", E::bad_json},
      {R"({"ok":true} x)", E::trailing_garbage},
      {R"({"ok":true,"ok":false})", E::bad_json},
      {"[]", E::not_object},
      {R"({"id":1})", E::missing_field},
      {R"({"ok":"true"})", E::wrong_type},
      {R"({"ok":1})", E::wrong_type},
      {R"({"ok":false})", E::missing_field},
      {R"({"ok":false,"error":"boom"})", E::wrong_type},
      {R"({"ok":false,"error":{"code":"x"}})", E::missing_field},
      {R"({"ok":false,"error":{"code":1,"message":"m"}})", E::wrong_type},
      {R"({"ok":true,"error":{"code":"x","message":"m"}})", E::bad_value},
      {R"({"ok":true,"generation":-1})", E::bad_value},
      {R"({"ok":true,"refcount":1.5})", E::wrong_type},
      {R"({"ok":true,"id":null})", E::wrong_type},
      {std::string(protocol::kMaxReplyBytes + 1, ' '), E::too_large},
  };
  for (const Case& c : cases) {
    INFO("reply: " << c.json.substr(0, 120));
    CHECK(outcome([&] { (void)protocol::decode_reply(c.json); }) == to_string(c.errc));
  }
}

TEST_CASE("make_error_reply maps exceptions to wire codes and echoes the id", "[protocol]") {
  Command cmd = protocol::decode_command(R"({"op":"get","name":"w","id":77,"reply_to":"r"})");

  Reply nf = protocol::make_error_reply(&cmd, NotFound("no tensor \"w\""));
  CHECK_FALSE(nf.ok);
  REQUIRE(nf.error);
  CHECK(nf.error->code == "not_found");
  CHECK(nf.error->message == "no tensor \"w\"");
  CHECK(nf.id == "77");
  CHECK(nf.id_is_number);
  CHECK(nf.op == "get");
  CHECK(nf.name == "w");
  CHECK(protocol::encode_reply(nf).starts_with(R"({"id":77,"ok":false)"));

  Reply internal = protocol::make_error_reply(&cmd, std::runtime_error("disk on fire"));
  REQUIRE(internal.error);
  CHECK(internal.error->code == "internal");
  CHECK(internal.error->message == "disk on fire");

  Reply pe = protocol::make_error_reply(nullptr, ProtocolError(E::bad_dim, "field \"shape\"[0]"));
  REQUIRE(pe.error);
  CHECK(pe.error->code == "protocol_error");
  CHECK(pe.error->message == "bad_dim: field \"shape\"[0]");
  CHECK_FALSE(pe.id);
  CHECK_FALSE(pe.name);
  CHECK(protocol::decode_reply(protocol::encode_reply(pe)) == pe);

  Command sid = protocol::decode_command(R"({"op":"delete","name":"w","id":"abc"})");
  Reply ae = protocol::make_error_reply(&sid, AlreadyExists("x"));
  CHECK(ae.error->code == "already_exists");
  CHECK(protocol::encode_reply(ae).starts_with(R"({"id":"abc","ok":false)"));

  // Bytes that are not UTF-8 and huge messages still give an encodable reply.
  Reply weird = protocol::make_error_reply(
      &cmd, std::runtime_error("bad \xff\xfe bytes " + std::string(10000, 'm')));
  REQUIRE(weird.error);
  CHECK(weird.error->message.starts_with("bad ?? bytes"));
  CHECK(weird.error->message.size() == protocol::kMaxErrorMessageBytes);
  CHECK(protocol::decode_reply(protocol::encode_reply(weird)) == weird);
}

TEST_CASE("peek_reply_route finds where to answer an undecodable command", "[protocol]") {
  auto r = protocol::peek_reply_route(R"({"op":"explode","name":"x","id":5,"reply_to":"q:1"})");
  REQUIRE(r);
  CHECK(r->reply_to == "q:1");
  CHECK(r->id == "5");
  CHECK(r->id_is_number);
  auto no_id = protocol::peek_reply_route(R"({"reply_to":"q","id":-1})");
  REQUIRE(no_id);
  CHECK_FALSE(no_id->id);
  CHECK_FALSE(protocol::peek_reply_route(R"({"op":"get","name":"x"})"));
  CHECK_FALSE(protocol::peek_reply_route(R"({"reply_to":""})"));
  CHECK_FALSE(protocol::peek_reply_route("not json"));
  CHECK_FALSE(protocol::peek_reply_route(std::string(100000, '[')));
}

// ---------------------------------------------------------------- records

namespace {

TensorInfo sample_record() {
  TensorInfo t;
  t.name = "model/w:0";
  t.dtype = DType::f16;
  t.shape = {3, 5};
  t.ctime_ms = 1732186800123;
  t.node = "node-a";
  t.device = 1;
  t.device_uuid = "GPU-8a6b1c2d-0000-1111-2222-333344445555";
  t.bytes = 30;
  t.backend = BackendKind::cuda;
  t.ipc_handle.assign(64, '\0');
  for (std::size_t i = 0; i < 64; i += 3) t.ipc_handle[i] = static_cast<char>(i * 7 + 1);
  t.ipc_handle[63] = '\xff';
  t.offset = 512;
  t.alloc_bytes = 1 << 20;
  t.alloc_id = 17;
  t.refcount = 3;
  t.state = TensorState::ready;
  t.generation = 18446744073709551615ull;
  t.epoch = 4;
  t.owner = "session-9";
  t.owner_pid = 4242;
  t.create_id = "c-1";
  t.event_handle = std::string(64, '\0');
  t.event_handle[5] = 'e';
  t.event_version = 2;
  t.holders = {{"pid:100", 2}, {"session with:colon", 1}};
  return t;
}

protocol::Fields without(protocol::Fields f, std::string_view key) {
  std::erase_if(f, [&](const auto& kv) { return kv.first == key; });
  return f;
}

protocol::Fields with(protocol::Fields f, std::string_view key, std::string value) {
  for (auto& kv : f)
    if (kv.first == key) kv.second = std::move(value);
  return f;
}

}  // namespace

TEST_CASE("records round-trip, binary handles and holders included", "[protocol]") {
  TensorInfo t = sample_record();
  protocol::Fields f = protocol::encode_record(t);
  CHECK(protocol::decode_record(f) == t);

  auto value = [&](std::string_view k) {
    for (const auto& kv : f)
      if (kv.first == k) return kv.second;
    return std::string("<absent>");
  };
  CHECK(value("ipc_handle").size() == 64);
  CHECK(value("ipc_handle") == t.ipc_handle);
  CHECK(value("shape") == "[3,5]");
  CHECK(value("dtype") == "f16");
  CHECK(value("generation") == "18446744073709551615");
  CHECK(value("holder:pid:100") == "2");
  CHECK(value("holder:session with:colon") == "1");
  CHECK(value("state") == "ready");
  CHECK(value("backend") == "cuda");

  TensorInfo host;
  host.name = "h";
  host.dtype = DType::u8;
  host.shape = {};
  host.bytes = 1;
  host.backend = BackendKind::host;
  host.device = -1;
  host.ipc_handle = "/memcuda.1234.7";
  host.alloc_bytes = 4096;
  host.state = TensorState::lost;
  host.generation = 1;
  CHECK(protocol::decode_record(protocol::encode_record(host)) == host);

  // Unknown fields (from a newer writer) are ignored.
  protocol::Fields newer = f;
  newer.emplace_back("shiny_new_field", "whatever");
  CHECK(protocol::decode_record(newer) == t);
}

TEST_CASE("records missing a required field are bad_record", "[protocol]") {
  protocol::Fields f = protocol::encode_record(sample_record());
  for (std::string_view field : {"name", "dtype", "shape", "bytes", "backend", "state",
                                 "generation", "refcount", "device", "ipc_handle", "alloc_bytes"}) {
    INFO("without " << field);
    CHECK(outcome([&] { (void)protocol::decode_record(without(f, field)); }) == "bad_record");
    CHECK(message_of([&] {
            (void)protocol::decode_record(without(f, field));
          }).find("\"" + std::string(field) + "\"") != std::string::npos);
  }
  // Optional fields may be absent: the defaults of TensorInfo apply.
  protocol::Fields minimal = f;
  for (std::string_view field :
       {"ctime", "node", "device_uuid", "offset", "alloc_id", "epoch", "owner",
        "owner_pid", "create_id", "event_handle", "event_version", "holder:pid:100",
        "holder:session with:colon"})
    minimal = without(minimal, field);
  TensorInfo m = protocol::decode_record(minimal);
  CHECK(m.ctime_ms == 0);
  CHECK(m.owner.empty());
  CHECK(m.holders.empty());
  CHECK(m.ipc_handle == sample_record().ipc_handle);
}

TEST_CASE("corrupt record values are bad_record", "[protocol]") {
  protocol::Fields f = protocol::encode_record(sample_record());
  struct Case {
    const char* field;
    std::string value;
  };
  const Case cases[] = {
      {"name", ""},
      {"name", "bad name"},
      {"dtype", "f128"},
      {"shape", "[3,5"},
      {"shape", "3,5"},
      {"shape", "[3,-5]"},
      {"shape", "[3.0,5]"},
      {"bytes", "31"},  // f16 [3,5] is 30 bytes
      {"bytes", "30x"},
      {"bytes", " 30"},
      {"bytes", "-30"},
      {"bytes", ""},
      {"backend", "gpu"},
      {"state", "READY"},
      {"generation", "18446744073709551616"},
      {"generation", "+1"},
      {"refcount", "-1"},
      {"refcount", "1.0"},
      {"device", "-1"},  // cuda needs 0..1023
      {"device", "1024"},
      {"device", "99999999999999999999"},
      {"ipc_handle", std::string(63, 'h')},
      {"ipc_handle", ""},
      {"ctime", "yesterday"},
      {"offset", "-1"},
      {"alloc_bytes", "541"},  // offset 512 + 30 bytes
      {"event_handle", "short"},
      {"event_version", "v2"},
      {"holder:pid:100", "-2"},
      {"holder:pid:100", "two"},
  };
  for (const Case& c : cases) {
    INFO("field " << c.field << " = \"" << c.value << "\"");
    CHECK(outcome([&] { (void)protocol::decode_record(with(f, c.field, c.value)); }) ==
          "bad_record");
  }
  CHECK(outcome([&] { (void)protocol::decode_record(with(f, "alloc_bytes", "542")); }) ==
        "no error");

  protocol::Fields dup = f;
  dup.emplace_back("refcount", "3");
  CHECK(outcome([&] { (void)protocol::decode_record(dup); }) == "bad_record");
  protocol::Fields anon = f;
  anon.emplace_back("holder:", "1");
  CHECK(outcome([&] { (void)protocol::decode_record(anon); }) == "bad_record");
  CHECK(outcome([] { (void)protocol::decode_record({}); }) == "bad_record");

  // A host tensor has device -1 and a non-empty shm name.
  TensorInfo host = sample_record();
  host.backend = BackendKind::host;
  host.device = 0;
  host.ipc_handle = "/shm";
  CHECK(outcome([&] { (void)protocol::decode_record(protocol::encode_record(host)); }) ==
        "bad_record");
  host.device = -1;
  CHECK(outcome([&] { (void)protocol::decode_record(protocol::encode_record(host)); }) ==
        "no error");
  host.ipc_handle.clear();
  CHECK(outcome([&] { (void)protocol::decode_record(protocol::encode_record(host)); }) ==
        "bad_record");
  // ...which a pending record does not have yet.
  host.state = TensorState::pending;
  CHECK(outcome([&] { (void)protocol::decode_record(protocol::encode_record(host)); }) ==
        "no error");
}

TEST_CASE("enum names of backends and states round-trip", "[protocol]") {
  for (BackendKind b : {BackendKind::cuda, BackendKind::host})
    CHECK(backend_from_string(to_string(b)) == b);
  for (TensorState st : {TensorState::pending, TensorState::ready, TensorState::lost})
    CHECK(state_from_string(to_string(st)) == st);
  CHECK(to_string(BackendKind::cuda) == "cuda");
  CHECK(to_string(TensorState::lost) == "lost");
  CHECK_FALSE(backend_from_string("CUDA"));
  CHECK_FALSE(state_from_string(""));
  for (Op op : {Op::create, Op::get, Op::release, Op::free, Op::create_many})
    CHECK(protocol::op_from_string(protocol::to_string(op)) == op);
  CHECK(protocol::to_string(Op::release) == "release");
  CHECK(protocol::op_from_string("delete") == Op::release);  // the accepted alias
  CHECK_FALSE(protocol::op_from_string("Release"));
  CHECK_FALSE(protocol::op_from_string("del"));
}

TEST_CASE("regressions found by fuzzing stay fixed", "[protocol]") {
  // strides of an empty tensor whose other dims overflow int64: refused at creation
  memcuda::Shape huge_empty{2, 0, 1099511627776, 4194304 * 4};
  CHECK_THROWS_AS(memcuda::byte_size(memcuda::DType::f32, huge_empty), memcuda::ProtocolError);
  // the outermost dimension scales no stride, so this fits (it overflowed before)
  memcuda::Shape s{7, 67, 767, 6667, 767, 6667, 7, 666};
  CHECK(memcuda::contiguous_strides(s).front() == 8167679920338518034LL);
  // a record that is not pending must say how large its allocation is
  memcuda::protocol::Fields f = memcuda::protocol::encode_record([] {
    memcuda::TensorInfo t;
    t.name = "r";
    t.shape = {4};
    t.bytes = 16;
    t.backend = memcuda::BackendKind::host;
    t.ipc_handle = "/memcuda.x.1";
    t.alloc_bytes = 256;
    t.state = memcuda::TensorState::ready;
    t.generation = 1;
    return t;
  }());
  std::erase_if(f, [](const auto& kv) { return kv.first == "alloc_bytes"; });
  CHECK_THROWS_AS(memcuda::protocol::decode_record(f), memcuda::ProtocolError);
  CHECK(memcuda::contiguous_strides(memcuda::Shape{3, 4}) == memcuda::Shape{4, 1});
}
