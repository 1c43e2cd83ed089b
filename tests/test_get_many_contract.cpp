// The get_many contract shared by C++ (get_many / get_all), C
// (memcuda_get_many, tests/c_api_test.c) and Python (Registry.get_many,
// python/tests/test_registry.py): docs/protocol.md, "The get_many contract".
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "memcuda/redis/connection.hpp"
#include "support/redis_server.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

RegistryOptions contract_opts(const test::RedisServer& srv, bool control) {
  RegistryOptions o;
  o.redis = srv.options();
  o.control_thread = control;
  o.lease_ttl = control ? 30s : 300ms;  // no lease renewal (a script) inside a counted window
  o.default_backend = BackendKind::host;
  return o;
}

long long evalsha_calls(redis::Connection& c) {
  std::string info(c.command({"INFO", "commandstats"}).str());
  const std::string key = "cmdstat_evalsha:calls=";
  auto at = info.find(key);
  return at == std::string::npos ? 0 : std::stoll(info.substr(at + key.size()));
}

}  // namespace

TEST_CASE("the get_many contract: empty input, bad names, duplicates, the strict form's error", "[redis][batch]") {
  test::RedisServer srv;
  TensorRegistry leader(contract_opts(srv, true));
  auto a = leader.create<float>("k/a", {2});
  auto c = leader.create<float>("k/c", {2});
  TensorRegistry reader(contract_opts(srv, false));
  redis::Connection raw(srv.options());
  reader.flush();

  // No names: an empty result and no script.
  const long long before = evalsha_calls(raw);
  CHECK(reader.get_many({}).tensors.empty());
  CHECK(reader.get_all({}).empty());
  CHECK(evalsha_calls(raw) == before);

  // A malformed name anywhere: InvalidArgument before anything is taken.
  CHECK_THROWS_AS(reader.get_many({"k/a", "bad name"}), InvalidArgument);
  CHECK_THROWS_AS(reader.get_all({"k/a", ""}), InvalidArgument);
  reader.flush();
  CHECK(leader.info("k/a").refcount == 1);

  // A name given twice: one reference, one entry.
  auto twice = reader.get_many({"k/a", "k/a"});
  CHECK(twice.tensors.size() == 1);
  CHECK(leader.info("k/a").refcount == 2);
  twice = {};
  reader.flush();

  // Strict: the error of the first refused name in the order given (in name
  // order it would be k/b.missing), every reference given back.
  try {
    (void)reader.get_all({"k/c", "k/z.missing", "k/a", "k/b.missing"});
    FAIL("get_all of missing names succeeded");
  } catch (const NotFound& e) {
    CHECK(std::string(e.what()).find("k/z.missing") != std::string::npos);
  }
  // With a dtype: a TypeMismatch that comes first in the order given wins.
  auto i = leader.create<std::int32_t>("k/i", {1});
  CHECK_THROWS_AS(reader.get_all({"k/i", "k/a.missing"}, DType::f32), TypeMismatch);
  reader.flush();
  CHECK(leader.info("k/a").refcount == 1);
  CHECK(leader.info("k/c").refcount == 1);
  CHECK(leader.info("k/i").refcount == 1);

  // Lenient: the others are taken, each refused name reported.
  auto part = reader.get_many({"k/c", "k/z.missing", "k/a"});
  CHECK(part.tensors.size() == 2);
  REQUIRE(part.errors.size() == 1);
  CHECK(part.errors.at("k/z.missing").code == "not_found");
  CHECK(leader.info("k/c").refcount == 2);
}
