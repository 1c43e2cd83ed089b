// The tests do not take mem-cuda options from the environment they are run
// in (tests/main.cpp removes every MEMCUDA_* variable but the harness's own
// MEMCUDA_TEST_*), so a developer's shell cannot make them pass or fail.
// The CTest entry tests_ignore_memcuda_env runs this case and the two
// cases of test_threads.cpp with such variables set (tests/CMakeLists.txt).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "memcuda/options.hpp"

extern char** environ;

TEST_CASE("the tests run with no MEMCUDA_* option from their environment", "[env]") {
  for (char** e = environ; e && *e; ++e) {
    const std::string kv(*e);
    INFO(kv);
    CHECK((kv.rfind("MEMCUDA_", 0) != 0 || kv.rfind("MEMCUDA_TEST_", 0) == 0));
  }
  // So the options' environment defaults are the built-in ones.
  const memcuda::RegistryOptions o;
  CHECK(o.release_linger.count() == 0);
  CHECK(o.share_references);
  CHECK_FALSE(o.cuda_allocation);
  CHECK_FALSE(o.pool.poison);
}
