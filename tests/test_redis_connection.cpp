#include <catch2/catch.hpp>

#include "memcuda/redis/connection.hpp"
#include "support/redis_server.hpp"

using namespace memcuda;

TEST_CASE("connection runs commands against a private server", "[redis]") {
  test::RedisServer srv;
  auto c = srv.connect();
  CHECK(c.command({"SET", "k", std::string("a\0b", 3)}).str() == "OK");
  auto r = c.command({"GET", "k"});
  CHECK(r.str() == std::string("a\0b", 3));
  CHECK(c.command({"INCRBY", "n", 41}).integer() == 41);
  CHECK(c.command({"GET", "missing"}).is_nil());
  CHECK_THROWS_AS(c.command({"LPUSH", "k", "x"}), ReplyError);
}
