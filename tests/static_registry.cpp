// A program whose TensorRegistry and SharedTensor are statics, constructed
// before anything touches the process-wide release queue (tests run it as a
// real process: tests/test_control_plane.cpp). It must exit 0: the queue
// has to outlive both (their destructors push releases and flush).
// Redis: MEMCUDA_REDIS_URL.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <optional>

#include "memcuda/memcuda.hpp"

using namespace memcuda;

namespace {

RegistryOptions opts() {
  RegistryOptions o = RegistryOptions::from_env();  // MEMCUDA_REDIS_URL
  o.redis = redis::options_from_env();
  o.default_backend = BackendKind::host;
  o.lease_ttl = std::chrono::milliseconds(1000);
  return o;
}

TensorRegistry g_registry(opts());
std::optional<SharedTensor<float>> g_tensor;  // destroyed before g_registry, after the queue of old

}  // namespace

int main() {
  ::alarm(30);  // a hang at exit is a failure (SIGALRM), not a stuck test
  g_tensor.emplace(g_registry.create<float>("static_t_" + std::to_string(::getpid()), {4}));
  {
    auto t = g_registry.create<float>("static_u_" + std::to_string(::getpid()), {4});
  }  // one release pushed while main runs
  std::printf("ok\n");
  return 0;
}
