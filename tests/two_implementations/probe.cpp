// A shared library with its own copy of mem-cuda's implementation and hidden
// symbols, as a Python extension module built with pybind11 has: built twice
// (two libraries) for tests/two_implementations/host.cpp.
#include <memcuda/memcuda.hpp>

#include <cstddef>
#include <cstdio>
#include <string>

// Opens a registry on `url` and creates, reads and removes a small host
// tensor named `name`. 0: done; 1: InternalError (its message in msg);
// 2: another error (its message in msg).
extern "C" __attribute__((visibility("default"))) int memcuda_probe_open(const char* url, const char* name,
                                                                         char* msg, std::size_t n) {
  try {
    memcuda::RegistryOptions o;
    o.redis = memcuda::redis::parse_url(url);
    o.default_backend = memcuda::BackendKind::host;
    memcuda::TensorRegistry reg(o);
    auto t = reg.create<int>(name, {4});
    const int v[4] = {1, 2, 3, 4};
    t.copy_from_host(v);
    int back[4] = {};
    reg.get<int>(name).copy_to_host(back);
    reg.remove(name);
    if (back[3] != 4) {
      std::snprintf(msg, n, "read back %d, not 4", back[3]);
      return 2;
    }
    return 0;
  } catch (const memcuda::InternalError& e) {
    std::snprintf(msg, n, "%s", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::snprintf(msg, n, "%s", e.what());
    return 2;
  }
}
