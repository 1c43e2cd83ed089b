// A command whose JSON the strict parser refuses still gets its error reply
// when its top-level reply_to can be read (protocol/reply_route.hpp): the
// sender is told what was wrong instead of waiting for its timeout.
#include <catch2/catch.hpp>

#include <boost/json.hpp>
#include <map>
#include <string>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "memcuda/protocol.hpp"
#include "support/redis_server.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

struct Malformed {
  std::string kind;
  std::string text;
  std::string names;  // what the error message must say
};

// One of each fault the strict parser refuses, each naming reply_to "r" and
// its own id.
std::vector<Malformed> malformed_commands() {
  return {
      {"duplicate key", R"({"op":"get","op":"delete","name":"a","id":"dup","reply_to":"r"})", "duplicate key \"op\""},
      {"trailing garbage", R"({"op":"get","name":"a","id":"trail","reply_to":"r"} trailing)", "after the end"},
      {"raw newline in a string", "{\"op\":\"get\",\"name\":\"a\nb\",\"id\":\"nl\",\"reply_to\":\"r\"}",
       "raw control byte 0x0a"},
      {"invalid UTF-8", "{\"op\":\"get\",\"name\":\"a\xff\",\"id\":\"utf8\",\"reply_to\":\"r\"}", "invalid UTF-8"},
      {"nesting too deep",
       R"({"op":"get","name":"a","id":"deep","reply_to":"r","x":)" + std::string(40, '[') + std::string(40, ']') + "}",
       "nesting deeper than 16"},
      {"too large", R"({"op":"get","name":"a","id":"big","reply_to":"r","pad":")" + std::string(2 << 20, 'p') + "\"}",
       "too_large"},
  };
}

std::string ids_of(const std::vector<Malformed>& ms) {
  std::string s;
  for (const auto& m : ms) s += m.kind + "; ";
  return s;
}

}  // namespace

TEST_CASE("peek_reply_route reads reply_to and id from a document the strict parser refuses", "[protocol]") {
  for (const auto& m : malformed_commands()) {
    INFO(m.kind);
    CHECK_THROWS_AS(protocol::decode_command(m.text), ProtocolError);
    auto r = protocol::peek_reply_route(m.text);
    REQUIRE(r);
    CHECK(r->reply_to == "r");
    CHECK(r->id.has_value());
  }
  // cut short after the fields
  auto cut = protocol::peek_reply_route(R"({"op":"get","name":"a","reply_to":"r","id":7,)");
  REQUIRE(cut);
  CHECK(cut->reply_to == "r");
  CHECK(cut->id == "7");
  CHECK(cut->id_is_number);
  // escapes in the key and the value are read as JSON reads them
  auto esc = protocol::peek_reply_route(R"({"re\u0070ly_to":"q\u0041","x":1,"x":2})");
  REQUIRE(esc);
  CHECK(esc->reply_to == "qA");
  // only the top level counts, strings are skipped whole
  auto nested = protocol::peek_reply_route(R"({"x":{"reply_to":"inner"},"s":"\"}{","reply_to":"top"} !)");
  REQUIRE(nested);
  CHECK(nested->reply_to == "top");
  // the same reply_to twice is fine; two different ones are not guessed between
  CHECK(protocol::peek_reply_route(R"({"reply_to":"a","reply_to":"a"})"));
  CHECK_FALSE(protocol::peek_reply_route(R"({"reply_to":"a","reply_to":"b"})"));
  // an id repeated with other values is left out, the reply still goes
  auto two_ids = protocol::peek_reply_route(R"({"reply_to":"a","id":1,"id":2})");
  REQUIRE(two_ids);
  CHECK_FALSE(two_ids->id);
  // a reply_to decode_command would refuse is refused here too
  CHECK_FALSE(protocol::peek_reply_route("{\"reply_to\":\"a\nb\",\"x\":}"));
  CHECK_FALSE(protocol::peek_reply_route(R"({"reply_to":"a\u0001","x":})"));
  CHECK_FALSE(protocol::peek_reply_route(R"({"reply_to":["a"],"x":})"));
  CHECK_FALSE(protocol::peek_reply_route(R"({"reply_to":5,"x":})"));
  CHECK_FALSE(protocol::peek_reply_route(R"({"reply_to":"","x":})"));
  CHECK_FALSE(protocol::peek_reply_route(R"({"reply_to":")" + std::string(256, 'a') + R"(","x":})"));
  CHECK_FALSE(protocol::peek_reply_route("\x01{\"reply_to\":\"r\"}"));
  CHECK_FALSE(protocol::peek_reply_route(std::string(100000, '{')));
  CHECK_FALSE(protocol::peek_reply_route(std::string(2 << 20, '[')));
  // reply_to beyond the first kMaxPeekBytes is not looked for
  CHECK_FALSE(protocol::peek_reply_route(R"({"pad":")" + std::string(protocol::kMaxPeekBytes, 'p') +
                                         R"(","reply_to":"r"})"));
}

TEST_CASE("the allocator of record answers each kind of malformed JSON command with its error",
          "[redis][protocol]") {
  test::RedisServer srv;
  RegistryOptions o;
  o.redis = srv.options();
  o.default_backend = BackendKind::host;
  TensorRegistry leader(o);
  REQUIRE(leader.is_leader());
  auto c = srv.connect();
  const auto bad = malformed_commands();
  REQUIRE(bad.size() == 6);
  for (const auto& m : bad) c.command({"LPUSH", "tensor_lifecycle", m.text});
  // a valid command behind them: its reply comes after every other one
  c.command({"LPUSH", "tensor_lifecycle", R"({"op":"get","name":"nope","id":"last","reply_to":"r"})"});
  std::map<std::string, std::string> messages;  // id -> error message
  for (;;) {
    auto r = c.blocking(10s, {"BLPOP", "r", "10"});
    REQUIRE_FALSE(r.is_nil());
    auto o = boost::json::parse(r[1].str()).as_object();
    INFO(r[1].str());
    CHECK_FALSE(o.at("ok").as_bool());
    const std::string id(o.at("id").as_string());
    if (id == "last") break;
    CHECK(o.at("error").at("code").as_string() == "protocol_error");
    messages[id] = std::string(o.at("error").at("message").as_string());
  }
  INFO("kinds: " << ids_of(bad));
  CHECK(messages.size() == 6);
  const std::map<std::string, std::string> id_of = {{"duplicate key", "dup"},     {"trailing garbage", "trail"},
                                                    {"raw newline in a string", "nl"}, {"invalid UTF-8", "utf8"},
                                                    {"nesting too deep", "deep"}, {"too large", "big"}};
  for (const auto& m : bad) {
    INFO(m.kind);
    auto it = messages.find(id_of.at(m.kind));
    REQUIRE(it != messages.end());
    CHECK_THAT(it->second, Catch::Contains(m.names));
  }
  CHECK(c.command({"LLEN", "tensor_lifecycle"}).integer() == 0);
  CHECK(leader.is_leader());
}
