// A program whose CMakeLists.txt only finds memcuda and links
// memcuda::memcuda: no implementation unit of its own. It publishes a tensor
// in host shared memory, opens it by name and reads it back, against the
// Redis server in MEMCUDA_TEST_REDIS_URL (tests/c_api_with_redis.sh starts
// one). A missing definition would already have failed its link.
#include <memcuda/memcuda.hpp>

#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <vector>

int main() try {
  const char* url = std::getenv("MEMCUDA_TEST_REDIS_URL");
  if (url == nullptr) {
    std::fprintf(stderr, "link-only consumer: MEMCUDA_TEST_REDIS_URL is not set\n");
    return 2;
  }
  memcuda::RegistryOptions opts;
  opts.redis = memcuda::redis::parse_url(url);
  opts.default_backend = memcuda::BackendKind::host;
  memcuda::TensorRegistry reg(opts);

  auto w = reg.create<float>("consumer/link-only", {3, 5});
  std::vector<float> host(w.size());
  std::iota(host.begin(), host.end(), 1.f);
  w.copy_from_host(host);

  auto r = reg.get<float>("consumer/link-only");
  std::vector<float> back(r.size());
  r.copy_to_host(back);
  const bool same = back == host && r.shape() == memcuda::Shape{3, 5};
  reg.remove("consumer/link-only");
  std::printf("link-only consumer: created %s %s, read back %s\n", r.name().c_str(),
              memcuda::shape_to_string(r.shape()).c_str(), same ? "identical" : "DIFFERENT");
  return same ? 0 : 1;
} catch (const memcuda::Error& e) {
  std::fprintf(stderr, "link-only consumer: %s\n", e.what());
  return 1;
}
