// A key under a tensor's name that is not a record of ours (a Hash written
// by hand without SADD to the name index and without a generation, or not a
// Hash at all) is reported by create, create_many and remove as what it is,
// with how to clear it, and is never overwritten.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"
#include "support/text.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

RegistryOptions stray_opts(const test::RedisServer& srv, bool control) {
  auto o = test::host_options(srv, control);
  o.request_timeout = 5s;
  return o;
}

template <class F>
std::string error_of(F&& f, bool& already_exists) {
  already_exists = false;
  try {
    f();
  } catch (const AlreadyExists& e) {
    already_exists = true;
    return e.what();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "nothing thrown";
}

using test::contains;

}  // namespace

// Defect: create failed with "expected a string reply, got nil".
TEST_CASE("create and create_many refuse a stray Hash under the name, naming it and how to clear it",
          "[redis][registry]") {
  test::RedisServer srv;
  TensorRegistry leader(stray_opts(srv, true));
  TensorRegistry follower(stray_opts(srv, false));  // its create goes through the lifecycle list
  REQUIRE(leader.is_leader());
  auto c = srv.connect();
  c.command({"HSET", "memcuda:tensor:X", "foo", "bar"});
  c.command({"SET", "memcuda:tensor:S", "not a hash"});

  for (TensorRegistry* reg : {&leader, &follower}) {
    INFO((reg == &leader ? "leader" : "follower"));
    bool ae = false;
    std::string m = error_of([&] { (void)reg->create<float>("X", {4}); }, ae);
    INFO(m);
    CHECK(ae);
    CHECK(contains(m, "'memcuda:tensor:X'"));
    CHECK(contains(m, "not a mem-cuda tensor record"));
    CHECK(contains(m, "without a 'generation' field"));
    CHECK(contains(m, "DEL 'memcuda:tensor:X'"));
    m = error_of([&] { (void)reg->create<float>("S", {4}); }, ae);
    INFO(m);
    CHECK(ae);
    CHECK(contains(m, "a string, not a Hash"));

    // all or nothing: the good entry is not created either
    std::vector<TensorSpec> specs{{"fine", DType::f32, {4}, {}}, {"X", DType::f32, {4}, {}}};
    m = error_of([&] { (void)reg->create_many(specs); }, ae);
    INFO(m);
    CHECK(ae);
    CHECK(contains(m, "cannot create 'X'"));
    CHECK(contains(m, "DEL 'memcuda:tensor:X'"));
    CHECK_THROWS_AS(leader.info("fine"), NotFound);
  }
  // left untouched
  CHECK(c.command({"HGETALL", "memcuda:tensor:X"}).size() == 2);
  CHECK(c.command({"HGET", "memcuda:tensor:X", "foo"}).str() == "bar");
  CHECK(c.command({"GET", "memcuda:tensor:S"}).str() == "not a hash");
  CHECK(c.command({"ZCARD", "memcuda:names"}).integer() == 0);

  // remove says the same instead of failing inside its script
  try {
    leader.remove("X");
    FAIL("removed a stray key");
  } catch (const NotFound& e) {
    CHECK(contains(e.what(), "not a mem-cuda tensor record"));
  }
  auto rm = leader.remove_many({"X", "S"});
  CHECK(rm.removed.empty());
  REQUIRE(rm.errors.size() == 2);
  CHECK(contains(rm.errors.at("S").message, "a string, not a Hash"));
  CHECK(c.command({"EXISTS", "memcuda:tensor:X", "memcuda:tensor:S"}).integer() == 2);

  // cleared as the message says, the name works again
  c.command({"DEL", "memcuda:tensor:X"});
  auto t = follower.create<float>("X", {4});
  CHECK(leader.info("X").generation == t.generation());
}
