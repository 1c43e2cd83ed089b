// The program that both consumer projects build (find-package/ and
// add-subdirectory/). It checks what a downstream project gets from the
// memcuda::headers target (the header-only opt-in): the headers, a version
// equal to the one CMake reported for the package, the CUDA choice in the
// compile definitions, and libraries that link (hiredis, and cudart with the
// CUDA backend), and the implementation unit memcuda_add_implementation
// adds. It talks
// to no Redis server: its connection attempts go to a socket path that
// cannot exist and must fail with ConnectionError.
#include <memcuda/config.hpp>
#include <memcuda/error.hpp>
#include <memcuda/redis/connection.hpp>
#include <memcuda/version.hpp>
#include <memcuda/memcuda.hpp>  // the API; memcuda_add_implementation adds its definitions
#if MEMCUDA_HAS_CUDA()
#include <cuda_runtime_api.h>
#endif

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>

// Set by the consumer's CMakeLists.txt from what CMake found.
#if !defined(MEMCUDA_CONSUMER_KIND) || !defined(MEMCUDA_CMAKE_VERSION) ||  \
    !defined(MEMCUDA_CMAKE_VERSION_MAJOR) || !defined(MEMCUDA_CMAKE_VERSION_MINOR) || \
    !defined(MEMCUDA_CMAKE_VERSION_PATCH) || !defined(MEMCUDA_CONSUMER_CUDA)
#error "build this file through tests/consumers/*/CMakeLists.txt"
#endif

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

}  // namespace

int main() {
  namespace redis = memcuda::redis;
  std::printf("memcuda consumer through %s: MEMCUDA_VERSION %d (\"%s\"), CMake package version %s\n",
              MEMCUDA_CONSUMER_KIND, MEMCUDA_VERSION, memcuda::kVersionString,
              MEMCUDA_CMAKE_VERSION);

  check(MEMCUDA_VERSION == MEMCUDA_CMAKE_VERSION_MAJOR * 10000 +
                               MEMCUDA_CMAKE_VERSION_MINOR * 100 + MEMCUDA_CMAKE_VERSION_PATCH,
        "MEMCUDA_VERSION equals the CMake package version");
  check(std::string(memcuda::kVersionString) == MEMCUDA_CMAKE_VERSION,
        "memcuda::kVersionString equals the CMake package version");

  check(MEMCUDA_HAS_CUDA() == MEMCUDA_CONSUMER_CUDA,
        std::string("MEMCUDA_HAS_CUDA() is ") + (MEMCUDA_HAS_CUDA() ? "1" : "0") +
            " as the package said");
#if MEMCUDA_HAS_CUDA()
  // Needs no driver or GPU, only a linked cudart.
  int runtime = 0;
  const bool got_runtime = cudaRuntimeGetVersion(&runtime) == cudaSuccess;
  check(got_runtime && runtime > 0, "cudart links (runtime " + std::to_string(runtime) + ")");
#endif

  try {
    redis::Options u = redis::parse_url("unix:///run/memcuda/redis.sock?db=3");
    check(u.transport == redis::Options::Transport::unix_socket &&
              u.path == "/run/memcuda/redis.sock" && u.db == 3,
          "parse_url(unix://...) fills Options: " + u.describe());
    redis::Options t = redis::parse_url("redis://alice:s3cret@localhost:6380/2");
    check(t.transport == redis::Options::Transport::tcp && t.host == "localhost" &&
              t.port == 6380 && t.db == 2 && t.user == "alice" && t.password == "s3cret",
          "parse_url(redis://...) fills Options: " + t.describe());
  } catch (const std::exception& e) {
    check(false, std::string("parse_url threw: ") + e.what());
  }
  try {
    redis::parse_url("http://localhost");
    check(false, "parse_url(\"http://localhost\") should throw InvalidArgument");
  } catch (const memcuda::InvalidArgument& e) {
    check(true, std::string("parse_url rejects http://: ") + e.what());
  }

  // Links hiredis for real: the constructor connects.
  redis::Options nowhere = redis::parse_url("unix:///nonexistent-memcuda-consumer/redis.sock");
  nowhere.connect_timeout = std::chrono::milliseconds(200);
  nowhere.reconnect_timeout = std::chrono::milliseconds(0);
  try {
    redis::Connection c(nowhere);
    check(false, "connected to " + nowhere.describe() + ", which should not exist");
  } catch (const memcuda::ConnectionError& e) {
    check(true, std::string("no server behind a missing socket: ConnectionError: ") + e.what());
  } catch (const std::exception& e) {
    check(false, std::string("expected ConnectionError, got: ") + e.what());
  }

  // The implementation unit (memcuda_add_implementation in the consumer's
  // CMakeLists.txt) is linked in: shape_from_string and the registry's
  // constructor are defined there. The constructor fails to connect.
  try {
    check(memcuda::shape_from_string("[2,3]") == memcuda::Shape{2, 3},
          "shape_from_string, from the implementation unit, parses [2,3]");
  } catch (const std::exception& e) {
    check(false, std::string("shape_from_string threw: ") + e.what());
  }
  try {
    memcuda::RegistryOptions ro;
    ro.redis = nowhere;
    memcuda::TensorRegistry reg(ro);
    check(false, "a TensorRegistry connected to " + nowhere.describe() + ", which should not exist");
  } catch (const memcuda::ConnectionError& e) {
    check(true, std::string("TensorRegistry (implementation unit) without a server: ConnectionError: ") + e.what());
  } catch (const std::exception& e) {
    check(false, std::string("TensorRegistry: expected ConnectionError, got: ") + e.what());
  }

  std::printf("%s\n", failures == 0 ? "consumer OK" : "consumer FAILED");
  return failures == 0 ? 0 : 1;
}
