// The README's quickstart: publish a named tensor, open it by name, read it.
// Run two copies at once and the second opens what the first published.
#include <numeric>
#include <vector>

#include "common.hpp"

int main(int argc, char** argv) try {
  auto opts = memcuda::RegistryOptions::from_env();  // MEMCUDA_REDIS_URL, else redis://127.0.0.1:6379
  opts.default_backend = examples::backend_from_args(argc, argv);
  memcuda::TensorRegistry reg(opts);  // the first process becomes allocator of record
  std::cout << "backend " << to_string(*opts.default_backend) << ", Redis " << opts.redis.describe()
            << (reg.is_leader() ? ", allocator of record" : ", follower") << "\n";

  auto w = reg.create<float>("quickstart/weights", {4, 256});  // refcount 1: ours
  std::vector<float> host(w.size());
  std::iota(host.begin(), host.end(), 0.f);
  w.copy_from_host(host);

  auto r = reg.get<float>("quickstart/weights");  // what any other process does
  std::vector<float> back(r.size());
  r.copy_to_host(back);
  std::cout << "'" << r.name() << "' " << to_string(r.dtype()) << " " << memcuda::shape_to_string(r.shape())
            << ", " << r.bytes() << " bytes, generation " << r.generation() << ", refcount "
            << reg.info(r.name()).refcount << ", round trip " << (back == host ? "identical" : "DIFFERENT") << "\n";

  reg.remove("quickstart/weights");  // the name goes now, the memory with the last handle
  return back == host ? 0 : 1;
} catch (const memcuda::Error& e) {
  std::cerr << "quickstart: " << e.what() << "\n";
  return 1;
}
